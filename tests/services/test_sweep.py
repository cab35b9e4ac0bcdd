"""`relay sweep` without a cluster: parameter expressions read as data, the plan's checks (every
bad input one line, exit 2, nothing created), the draws, the outcome table and best.yaml.

The sweeps that run trials on Ray are in tests/integration/test_sweep_ray.py.
"""

import json
import math
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from relay_rl.contracts.config import load_config
from relay_rl.services.cli import main
from relay_rl.services.runs.sweep_records import (
    BEST_FILE,
    SUMMARY_FILE,
    TRIALS_FILE,
    TrialLog,
    read_exploits,
    summarize,
)
from relay_rl.services.sweep.params import Param, SweepError, draw_trials, parse_param, split_args
from relay_rl.services.sweep.plan import build_plan, trial_config, trial_resources
from relay_rl.services.sweep.runner import clip_to_ranges, format_table, write_outcome
from relay_rl.services.sweep.trial import ORIGIN_FILE, read_origin, report

ROOT = Path(__file__).parents[2]
CARTPOLE = str(ROOT / "configs/cartpole_ppo.yaml")


# ---- expressions --------------------------------------------------------------------------------
def test_each_kind_reads_its_values_as_data():
    assert parse_param("learner.lr", "loguniform(1e-4, 3e-3)") == Param(
        "learner.lr", "loguniform", (1e-4, 3e-3)
    )
    assert parse_param("learner.lr", "uniform(0.1,0.3)").values == (0.1, 0.3)
    assert parse_param("learner.epochs", "randint(1, 10)").values == (1, 10)
    assert parse_param("model.hidden_sizes", "choice([64, 64], [128])").values == ([64, 64], [128])
    assert parse_param("model.activation", "grid(tanh, relu)").values == ("tanh", "relu")
    assert parse_param("learner.lr_anneal", "choice(true, false)").values == (True, False)
    assert split_args("[1, 2], 'a,b', {x: 1}") == ["[1, 2]", "'a,b'", "{x: 1}"]


@pytest.mark.parametrize(
    ("key", "expression", "needle"),
    [
        ("learner.lr", "__import__('os').system('true')", "expected one of"),
        ("learner.lr", "eval(1)", "expected one of"),
        ("learner.lr", "loguniform(0, 1)", "above 0"),
        ("learner.lr", "uniform(0.3, 0.1)", "low must be below high"),
        ("learner.lr", "uniform(0.1)", "takes 2 values"),
        ("learner.lr", "uniform(a, b)", "not a finite number"),
        ("learner.lr", "uniform(.nan, 1)", "not a finite number"),
        ("learner.epochs", "randint(1.5, 3)", "not a whole number"),
        ("learner.epochs", "randint(5, 3)", "at most high"),
        ("learner.lr", "choice()", "no values"),
        ("learner.lr", "choice(1,,2)", "empty value"),
        ("learner.lr", "choice({a: 1})", "a mapping"),
        ("learner.lr", "choice([1, 2)", "not valid YAML"),
        ("lr", "choice(1)", "config leaf"),
        ("learner.lr;rm", "choice(1)", "config leaf"),
    ],
)
def test_bad_expressions_are_one_line(key, expression, needle):
    with pytest.raises(SweepError) as err:
        parse_param(key, expression)
    assert needle in str(err.value) and "\n" not in str(err.value)


@settings(max_examples=60, deadline=None)
@given(
    lo=st.floats(1e-6, 1e3, allow_nan=False),
    span=st.floats(1e-3, 1e3, allow_nan=False),
    seed=st.integers(0, 2**32 - 1),
)
def test_draws_stay_in_their_range(lo, span, seed):
    hi = lo + span
    rng = np.random.default_rng(seed)
    for kind in ("uniform", "loguniform"):
        v = Param("learner.lr", kind, (lo, hi)).sample(rng)
        assert lo * (1 - 1e-12) <= v <= hi * (1 + 1e-12)
    ints = {Param("learner.epochs", "randint", (2, 4)).sample(rng) for _ in range(60)}
    assert ints == {2, 3, 4}  # both ends included


def test_draws_are_fixed_by_the_seed_and_grids_cross():
    params = [
        parse_param("learner.lr", "loguniform(1e-4,1e-2)"),
        parse_param("learner.epochs", "grid(1,2,3)"),
    ]
    first = draw_trials(params, 2, "random", seed=7)
    assert first == draw_trials(params, 2, "random", seed=7)
    assert first != draw_trials(params, 2, "random", seed=8)
    assert len(first) == 6 and [t["learner.epochs"] for t in first] == [1, 2, 3, 1, 2, 3]
    grid = draw_trials([parse_param("learner.lr", "choice(1e-3, 2e-3)"), params[1]], 1, "grid", seed=0)
    assert len(grid) == 6 and len({tuple(t.items()) for t in grid}) == 6


# ---- the plan -----------------------------------------------------------------------------------
def _plan(tmp_path, sets, *, root=None):
    cfg = load_config(CARTPOLE, sets)
    return build_plan(cfg, root or tmp_path / "sw", None)


def test_a_plan_draws_checked_trials_and_names_them(tmp_path):
    plan = _plan(tmp_path, ["sweep.params={learner.lr: 'uniform(0.001, 0.002)'}", "sweep.samples=3"])
    assert [t.id for t in plan.trials] == ["t000", "t001", "t002"]
    cfg = trial_config(plan.base, plan.trials[0].params)
    assert 0.001 <= cfg.learner.lr <= 0.002
    assert cfg.sweep.params == {} and cfg.metrics.run_name is None  # a trial is a plain run
    # the trial's placement group: nothing for its driver, the learner, each worker
    assert trial_resources(cfg) == [{}, {"CPU": 1.0}, {"CPU": 1.0}, {"CPU": 1.0}]


def test_a_language_trial_reserves_a_bundle_for_each_generator(tmp_path):
    """A language run with generation.placement=workers brings a generator beside each reward
    actor; its trial's placement group holds both, or the generators could never be placed."""
    path = tmp_path / "lm.yaml"
    path.write_text("model: {kind: causal_lm, path: m}\nprompts: {train: p.jsonl, rewards: [exact_match]}\n")
    learner_only = load_config(path, ["rollout.num_workers=2"])
    on_workers = load_config(path, ["rollout.num_workers=2", "generation.placement=workers"])
    assert len(trial_resources(learner_only)) == 1 + 1 + 2
    assert len(trial_resources(on_workers)) == 1 + 1 + 2 * 2


@pytest.mark.parametrize(
    ("sets", "needle"),
    [
        (["sweep.params={learner.lr: 'loguniform(1e-4, 20)'}"], "learner.lr=20"),
        (["sweep.params={learner.epochs: 'grid(0, 1)'}"], "learner.epochs=0"),
        (["sweep.params={learner.nope: 'choice(1)'}"], "no such config leaf"),
        (["sweep.params={metrics.runs_dir: 'choice(a, b)'}"], "set by the sweep itself"),
        (["sweep.params={metrics.wandb.mode: 'choice(online, offline)'}"], "set by the sweep itself"),
        (["sweep.params={learner.lr: 'uniform(1e-4,1e-3)'}", "sweep.search=grid"], "is a range"),
        (["sweep.params={learner.lr: 'grid(1e-4,1e-3)'}", "sweep.search=optuna"], "is a grid"),
        (
            ["sweep.params={learner.lr: 'uniform(1e-4,1e-3)'}", "sweep.search=optuna", "sweep.scheduler=pbt"],
            "use --search random or grid",
        ),
        (["sweep.params={model.hidden_sizes: 'choice([8], [16])'}", "sweep.scheduler=pbt"], "cannot perturb"),
        (
            ["sweep.params={learner.device: 'choice(cpu)'}", "sweep.scheduler=pbt"],
            "cannot perturb learner.device",
        ),
        (["sweep.params={learner.lr: 'choice(1e-3)'}", "sweep.metric=device"], "not a numeric metrics key"),
        (["sweep.params={learner.lr: 'choice(1e-3)'}", "sweep.metric=nope"], "not a numeric metrics key"),
        (
            ["sweep.params={learner.lr: 'choice(1e-3)'}", "rollout.autoscale=true", "rollout.mode=async"],
            "fixed fleets",
        ),
        ([], "nothing to sweep"),
    ],
)
def test_bad_plans_are_refused_before_anything_exists(tmp_path, sets, needle):
    with pytest.raises(SweepError) as err:
        _plan(tmp_path, sets)
    assert needle in str(err.value), str(err.value)
    assert not (tmp_path / "sw").exists()


def _refused(capsys, argv, needle):
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and needle in err, err


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        (["--param", "learner.lr=exec(1)"], "expected one of"),
        (["--param", "learner.lr"], "expected key=expression"),
        (["--param", "learner.lr=choice(1e-3)", "--search", "bayes"], "sweep.search"),
        (["--param", "learner.lr=choice(1e-3)", "--scheduler", "hyperband"], "sweep.scheduler"),
        (["--param", "learner.lr=choice(1e-3)", "--samples", "0"], "sweep.samples"),
        (["--param", "learner.lr=choice(1e-3)", "--max-concurrent", "0"], "--max-concurrent"),
        (["--param", "learner.lr=choice(1e-3)", "--set", "env.id=NoSuchEnv-v0"], "NoSuchEnv"),
    ],
)
def test_bad_command_lines_create_nothing(capsys, tmp_path, extra, needle):
    _refused(capsys, ["sweep", CARTPOLE, "--dir", str(tmp_path / "sw"), *extra], needle)
    assert not (tmp_path / "sw").exists()


def test_a_folder_in_use_or_not_a_sweep_is_refused(capsys, tmp_path):
    taken = tmp_path / "taken"
    taken.mkdir()
    (taken / "keep.txt").write_text("mine")
    _refused(
        capsys, ["sweep", CARTPOLE, "--param", "learner.lr=choice(1e-3)", "--dir", str(taken)], "not empty"
    )
    assert sorted(p.name for p in taken.iterdir()) == ["keep.txt"]
    _refused(capsys, ["sweep", "--resume", str(taken)], "not a sweep folder")
    _refused(capsys, ["sweep", "--resume", str(taken), "--param", "learner.lr=choice(1)"], "as planned")
    (taken / "sweep.yaml").write_text(
        "env:\n  id: mymod:make\nsweep:\n  params:\n    learner.lr: choice(1e-3)\n"
    )
    _refused(capsys, ["sweep", "--resume", str(taken)], "imports and runs code")
    _refused(capsys, ["sweep", "--resume", str(taken), "--set", "learner.lr=1"], "would change it")


# ---- trials and the outcome ---------------------------------------------------------------------
def test_a_result_always_carries_the_ranked_metric():
    assert report({"episode_return_mean": None, "env_steps": 5}, "episode_return_mean", "max") == {
        "env_steps": 5.0,
        "episode_return_mean": -math.inf,
    }
    assert report({}, "value_loss", "min")["value_loss"] == math.inf


def test_an_origin_file_is_checked_data(tmp_path):
    assert read_origin(tmp_path) == ("?", -1)
    for bad in ("[1]", '{"trial": 3, "iteration": 1}', '{"trial": "t1", "iteration": true}', "{"):
        (tmp_path / ORIGIN_FILE).write_text(bad)
        assert read_origin(tmp_path) == ("?", -1)
    (tmp_path / ORIGIN_FILE).write_text('{"trial": "t001", "iteration": 40}')
    assert read_origin(tmp_path) == ("t001", 40)


def test_pbt_perturbations_stay_in_their_ranges():
    params = [
        parse_param("learner.lr", "loguniform(1e-4, 1e-3)"),
        parse_param("learner.epochs", "randint(1, 4)"),
    ]
    explore = clip_to_ranges(params)
    out = explore({"trial": {"params": {"learner.lr": 5e-3, "learner.epochs": 4.8}}})
    assert out["trial"]["params"] == {"learner.lr": 1e-3, "learner.epochs": 4}


def _fake_trial(root: Path, trial: str, returns: list[float | None], lr: float) -> None:
    run = root / trial
    run.mkdir(parents=True)
    cfg = load_config(CARTPOLE, [f"learner.lr={lr}", "metrics.progress=none"])
    (run / "config.yaml").write_text(json.dumps(cfg.model_dump(mode="json")))
    lines = [
        {"iteration": i + 1, "env_steps": 100 * (i + 1), "wall_s": i, "episode_return_mean": r}
        for i, r in enumerate(returns)
    ]
    (run / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines) + '{"torn')


def test_the_table_and_best_yaml_come_from_the_trials_files(tmp_path):
    plan = _plan(tmp_path, ["sweep.params={learner.lr: 'choice(0.001, 0.002, 0.003)'}", "sweep.samples=3"])
    plan.root.mkdir()
    log = TrialLog(plan.root)
    _fake_trial(plan.root, "t000", [None, 10.0, 30.0, 20.0], 0.001)
    _fake_trial(plan.root, "t001", [5.0, 50.0], 0.002)
    _fake_trial(plan.root, "t002", [None], 0.003)
    for t, lr in (("t000", 0.001), ("t001", 0.002), ("t002", 0.003)):
        log.append(trial=t, event="planned", params={"learner.lr": lr})
        log.append(trial=t, event="started", params={"learner.lr": lr})
    log.append(trial="t000", event="ended", status="done", why="its stop criterion")
    log.append(trial="t001", event="ended", status="stopped early", why="asha stopped it")
    (plan.root / TRIALS_FILE).open("a").write("not json\n[1, 2]\n")
    rows = summarize(plan.root, "episode_return_mean", "max")
    assert [(r["trial"], r["best"], r["status"]) for r in rows] == [
        ("t000", 30.0, "done"),
        ("t001", 50.0, "stopped early"),
        ("t002", None, "interrupted"),
    ]
    assert rows[0]["env_steps"] == 400
    table = format_table(rows, "episode_return_mean")
    assert "t001  0.002" in table.replace("   ", "  ") or "0.002" in table.splitlines()[2]
    best = write_outcome(plan, rows)
    assert best == plan.root / BEST_FILE
    assert load_config(best).learner.lr == 0.002  # ready for relay train
    assert json.loads((plan.root / SUMMARY_FILE).read_text())["trials"][1]["best"] == 50.0


def test_exploit_records_are_checked_data(tmp_path):
    good = {"iteration": 20, "from_trial": "t002", "from_iteration": 18, "params": {"learner.lr": 1e-3}}
    bad = ['{"iteration": true, "from_trial": "t1", "from_iteration": 1}', '{"iteration": 1}', "[]", "{"]
    (tmp_path / "exploits.jsonl").write_text("\n".join([*bad, json.dumps(good)]) + "\n")
    assert read_exploits(tmp_path) == [{"iteration": 20, "from_trial": "t002", "from_iteration": 18}]


def test_a_signal_asks_tune_to_stop_once_then_stops_at_once():
    """Tune listens on SIGUSR1 while it runs (a stand-in handler here: it is Tune's own only inside
    Tuner.fit); before that, or on a second signal, the sweep stops at once."""
    import os
    import signal

    from relay_rl.services.runs.signals import Terminated
    from relay_rl.services.sweep.runner import graceful_signals

    asked: list[int] = []
    previous = signal.getsignal(signal.SIGUSR1)
    interrupt = signal.getsignal(signal.SIGINT)  # pytest's own (ignored where it runs in the background)
    try:
        signal.signal(signal.SIGUSR1, signal.SIG_DFL)
        with graceful_signals() as seen, pytest.raises(Terminated):
            os.kill(os.getpid(), signal.SIGTERM)  # Tune not running: at once, as SIGTERM
        assert seen == {"code": 143}
        signal.signal(signal.SIGUSR1, lambda signum, frame: asked.append(signum))
        with graceful_signals() as seen:
            os.kill(os.getpid(), signal.SIGINT)
            assert asked == [signal.SIGUSR1] and seen == {"code": 130}
            with pytest.raises(KeyboardInterrupt):
                os.kill(os.getpid(), signal.SIGINT)
        assert signal.getsignal(signal.SIGINT) is interrupt  # handlers put back
    finally:
        signal.signal(signal.SIGUSR1, previous)


# ---- a sweep folder is data (trust, third pass) -------------------------------------------------
def _planted_sweep(folder: Path, params: str, env_extra: str = "") -> None:
    folder.mkdir()
    (folder / "sweep.yaml").write_text(
        f"env:\n  id: CartPole-v1\n{env_extra}sweep:\n  params:\n{params}metrics:\n  progress: none\n"
    )


def test_a_stored_sweep_cannot_sweep_code_into_a_resume(capsys, tmp_path):
    """A sweep.yaml drawing env.id from `subprocess:run` (its kwargs a shell command) is refused on
    --resume before any trial is planned or built: the command never runs."""
    marker = tmp_path / "ran"
    folder = tmp_path / "sw"
    _planted_sweep(
        folder,
        "    env.id: choice(subprocess:run, CartPole-v1)\n",
        f"  kwargs:\n    args: touch {marker}\n    shell: true\n",
    )
    _refused(capsys, ["sweep", "--resume", str(folder)], "names code, which a sweep never draws")
    assert not marker.exists()
    assert sorted(p.name for p in folder.iterdir()) == ["sweep.yaml"]
    # ... and the command line cannot start one either (it would be stored, then resumed)
    _refused(
        capsys,
        ["sweep", CARTPOLE, "--dir", str(tmp_path / "new"), "--param", "env.id=grid(CartPole-v1, os:system)"],
        "os:system names code",
    )
    assert not (tmp_path / "new").exists() and not marker.exists()


def test_trial_names_from_the_log_never_leave_the_sweep_folder(tmp_path):
    """trials.jsonl is data: a trial named `../outside`, or lines of the wrong types, are skipped
    and counted; the table and best.yaml read only the sweep's own trials."""
    plan = _plan(tmp_path, ["sweep.params={learner.lr: 'choice(0.001, 0.002)'}", "sweep.samples=2"])
    plan.root.mkdir()
    outside = tmp_path / "outside"
    _fake_trial(tmp_path, "outside", [900.0], 0.002)  # a better "trial" outside the folder
    _fake_trial(plan.root, "t000", [10.0], 0.001)
    log = TrialLog(plan.root)
    log.append(trial="t000", event="started", params={"learner.lr": 0.001})
    bad = [
        {"trial": "../outside", "event": "started", "params": {"learner.lr": 0.002}},
        {"trial": "/etc", "event": "started", "params": {}},
        {"trial": "t001", "event": "started", "params": 5},
        {"trial": "t001", "event": "ended", "status": ["done"]},
        {"trial": "t001", "event": "exploded"},
        {"trial": 7, "event": "started"},
    ]
    with (plan.root / TRIALS_FILE).open("a") as f:
        f.write("".join(json.dumps(x) + "\n" for x in bad))
    states = log.read()
    assert set(states) == {"t000"} and log.skipped == len(bad)
    rows = summarize(plan.root, "episode_return_mean", "max")
    assert [r["trial"] for r in rows] == ["t000"]
    best = write_outcome(plan, rows)
    assert load_config(best).learner.lr == 0.001
    assert (outside / "config.yaml").exists()  # read by nobody


def test_best_yaml_never_carries_code_the_sweep_did_not_run(tmp_path, capsys):
    plan = _plan(tmp_path, ["sweep.params={learner.lr: 'choice(0.001, 0.002)'}", "sweep.samples=2"])
    plan.root.mkdir()
    _fake_trial(plan.root, "t000", [10.0], 0.001)
    planted = load_config(CARTPOLE).model_dump(mode="json")
    planted["env"]["id"] = "subprocess:run"
    (plan.root / "t000" / "config.yaml").write_text(json.dumps(planted))
    TrialLog(plan.root).append(trial="t000", event="started", params={"learner.lr": 0.001})
    rows = summarize(plan.root, "episode_return_mean", "max")
    assert write_outcome(plan, rows) is None
    assert not (plan.root / BEST_FILE).exists()
    assert "env.id=subprocess:run, which the sweep never ran" in capsys.readouterr().err


def test_a_grid_is_bounded_by_its_product(tmp_path):
    grids = {
        f"learner.{k}": "grid(" + ", ".join(str(v) for v in vals) + ")"
        for k, vals in [
            ("lr", [1e-4 * (i + 1) for i in range(10)]),
            ("gamma", [0.9 + 0.009 * i for i in range(10)]),
            ("gae_lambda", [0.9 + 0.009 * i for i in range(10)]),
            ("clip_ratio", [0.1 + 0.01 * i for i in range(10)]),
            ("entropy_coef", [0.001 * i for i in range(10)]),
            ("value_coef", [0.1 * (i + 1) for i in range(10)]),
        ]
    }
    params = [parse_param(k, v) for k, v in grids.items()]
    with pytest.raises(SweepError, match="plans 1000000 trials"):
        draw_trials(params, 1, "grid", 0)
    with pytest.raises(SweepError, match="plans 20000 trials"):
        draw_trials(params[:4], 2, "random", 0)
    assert len(draw_trials(params[:2], 3, "grid", 0)) == 300


def test_a_linked_sweep_or_trial_folder_is_refused(capsys, tmp_path):
    """A sweep folder, or a trial's run folder, that is a symbolic link is never written through."""
    from relay_rl.services.runs.run_dir import RunDir, RunDirError

    real = tmp_path / "real"
    _planted_sweep(real, "    learner.lr: choice(0.001)\n")
    link = tmp_path / "link"
    link.symlink_to(real)
    _refused(capsys, ["sweep", "--resume", str(link)], "is a symbolic link")
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "config.yaml").write_text("keep")
    (tmp_path / "trial").symlink_to(victim)
    with pytest.raises(RunDirError, match="symbolic link"):
        RunDir(tmp_path / "trial").lock()
    with pytest.raises(RunDirError, match="symbolic link"):
        RunDir.check_new(tmp_path / "trial")
    assert sorted(p.name for p in victim.iterdir()) == ["config.yaml"]
