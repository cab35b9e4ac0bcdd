"""The benchmark scripts as a user runs them: benchmarks/device_check.sh's CPU path on a machine
without an accelerator (the device tests on the CPU, every report section printed or skipped with
its reason, the log kept), the refusal of a flag a benchmark section does not read, and a
benchmark that a signal stops taking its training with it."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from tests.helpers import ROOT, benchmark_module


@pytest.mark.slow
def test_the_device_check_runs_on_a_cpu_and_says_what_it_skipped(tmp_path):
    env = {**os.environ, "PYTHON": sys.executable, "OUT": str(tmp_path)}
    proc = subprocess.run(
        ["bash", "benchmarks/device_check.sh", "--quick"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=480,
    )
    out = proc.stdout
    assert proc.returncode == 0, out[-3000:] + proc.stderr[-2000:]
    assert "device: cpu" in out and "no accelerator here" in out
    assert "8 passed, 1 skipped" in out and "two accelerators" in out  # the data-parallel test's reason
    sections = (
        "1. The learner alone",
        "2. Breakout end to end",
        "3. relay verify",
        "4. Serving latency",
        "5. A short soak",
        "6. GRPO on a causal LM",
        "7. CartPoleNoVel: the LSTM's wall",
    )
    for section in sections:
        assert f"## {section}" in out
    assert "| cartpole_ppo |  eager |" in out and "compiled skipped (--quick on cpu" in out
    assert "skipped: --quick" in out and "failed:" not in out
    assert "learner on cpu: LSTM / no core wall" in out  # section 7, both runs to the same env steps
    assert "bfloat16 |" in out and "pass" in out  # verify's precision table
    assert "MiB per 1,000 rounds" in out and "(cpu: the device layer keeps no allocator statistics" in out
    assert "## 4. Serving latency" in (tmp_path / "device_check.log").read_text()
    # The language section's code path: every sampler, both learner rows compiling once over three
    # prompt widths, TRL beside them.
    assert " relay compiled (aot_eager) |" in out and " transformers generate |" in out
    assert out.count("|             1 1 1 |        4 8 16 |") == 2
    assert "| fsdp2, 1 rank |" in out  # the sharded learner's path on the one device
    assert "| TRL GRPOTrainer |" in out and "1 1 1 |" in out


def test_a_benchmark_flag_a_section_does_not_read_is_refused():
    """`workloads.py atari-throughput --relay-set ...` once printed a table as if the flag applied;
    every section now reads each flag it is given, or refuses it in one line, exit 2."""
    script = str(ROOT / "benchmarks" / "workloads.py")
    proc = subprocess.run(
        [sys.executable, script, "ceilings", "--relay-set", "learner.use_amp=true"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.strip().splitlines() == [
        "workloads.py: --relay-set does not apply to ceilings (it reads --seconds)"
    ]


@pytest.mark.parametrize(
    "script, args, says",
    [
        ("fleet.py", ["wide", "--rounds", "2"], "fleet.py: --rounds does not apply to wide (only to nodes)"),
        ("serve.py", ["--wait-ms", "2,-1"], "serve.py: --wait-ms '2,-1': comma-separated milliseconds >= 0"),
        ("serve.py", ["--wait-ms", "soon"], "serve.py: --wait-ms 'soon': comma-separated milliseconds >= 0"),
        (
            "retention.py",
            ["--configs", "cartpole_ppo,atlantis"],
            "retention.py: --configs 'cartpole_ppo,atlantis': choose from cartpole_ppo, cartpole_grpo, "
            "cartpole_novel_lstm_ppo, taxi_ppo, pendulum_ppo, minigrid_doorkey_ppo, "
            "minigrid_memory_lstm_ppo, simple_spread_ppo, simple_spread_mappo, "
            "pistonball_mappo, hopper_ppo, halfcheetah_ppo",
        ),
        (
            "retention.py",
            ["--seeds", "0,one"],
            "retention.py: --seeds '0,one' --scale 1.0: whole seeds, comma-separated, "
            "and a scale in (0, 100]",
        ),
        (
            "retention.py",
            ["--runs-dir", str(ROOT / "README.md")],
            f"retention.py: --runs-dir {ROOT / 'README.md'}: not a folder",
        ),
        (
            "llm_grpo.py",
            ["overlap", "--pairs", "0"],
            "llm_grpo.py overlap: --pairs 0 --seconds 60.0: 1 to 50 pairs, seconds > 0",
        ),
        (
            "device_report.py",
            ["--only", "1,8"],
            "device_report.py: --only '1,8': section numbers 1-7, comma-separated",
        ),
        (
            "device_report.py",
            ["--only", "six"],
            "device_report.py: --only 'six': section numbers 1-7, comma-separated",
        ),
        (
            "device_report.py",
            ["--only", "2", "--e2e-s", "0"],
            "device_report.py: --e2e-s 0 --soak-s 60: seconds > 0",
        ),
    ],
)
def test_bad_benchmark_flags_are_one_line_and_exit_2(script, args, says):
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / script), *args],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.strip().splitlines() == [says]


def test_the_learner_memory_harness_reads_the_heap_after_every_round():
    """benchmarks/learner_memory.py on CartPole: a row per series, the heap in use below the
    private resident memory, the fixed threshold said in the header."""
    script = str(ROOT / "benchmarks" / "learner_memory.py")
    args = ["--config", "cartpole_ppo", "--rounds", "8", "--warmup", "2", "--mmap-threshold", "1048576"]
    proc = subprocess.run(
        [sys.executable, script, *args], capture_output=True, text=True, timeout=300, cwd=ROOT
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "mmap threshold fixed at 1,048,576 B" in proc.stdout
    rows = {
        cells[0]: [float(c.replace(",", "")) for c in cells[1:]]
        for line in proc.stdout.splitlines()
        if line.startswith("|") and not line.startswith("|--") and "series" not in line
        for cells in [[c.strip() for c in line.strip("|").split("|")]]
    }
    assert set(rows) == {"RssAnon", "heap in use", "heap free"}
    assert 1 < rows["heap in use"][1] < rows["RssAnon"][1]  # MB at the end
    assert rows["heap free"][2] <= rows["heap free"][3]  # min <= max


def test_the_learner_memory_harness_refuses_too_few_rounds():
    script = str(ROOT / "benchmarks" / "learner_memory.py")
    proc = subprocess.run(
        [sys.executable, script, "--rounds", "5"], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.strip().splitlines() == [
        "learner_memory.py: --rounds must exceed --warmup (20) by at least 3"
    ]


def test_the_sweep_benchmark_refuses_no_repeats():
    script = str(ROOT / "benchmarks" / "sweeps.py")
    proc = subprocess.run(
        [sys.executable, script, "--repeats", "0"], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.strip().splitlines() == ["sweeps.py: --repeats must be at least 1"]


def test_retention_is_the_share_of_the_gain_a_run_still_holds():
    """benchmarks/retention.py's summary of one run's curve, on returns of either sign."""
    retention = benchmark_module("retention")

    def lines(returns):
        return [{"env_steps": 1000 * (i + 1), "episode_return_mean": r} for i, r in enumerate(returns)]

    held = retention.curve_summary(lines([None, 10, 200, 500, 480, 500, 490, 500, 495]))
    assert held["first"] == 10 and held["peak"] == 500 and held["peak_steps"] == 4000
    assert held["last_third"] == (500 + 490 + 500 + 495) / 4 and held["kept"] > 0.97
    forgot = retention.curve_summary(lines([-1500, -400, -200, -900, -1300, -1400]))  # Pendulum-like
    # the last third: the steps from 4,000 of 6,000 on
    assert forgot["peak"] == -200 and forgot["kept"] == pytest.approx((-1200 + 1500) / 1300)
    assert retention.curve_summary(lines([None, None])) is None
    # A flat curve with one lucky line: by its highest line it "forgot" most of its gain; over
    # windows of a tenth of its lines (two here) the peak is the lucky line's neighbourhood.
    noisy = retention.curve_summary(lines([0.4] * 5 + [0.9] + [0.5] * 14))
    assert noisy["kept"] == pytest.approx(0.2)
    assert noisy["smooth_peak"] == pytest.approx(0.7) and noisy["smoothed"] == pytest.approx(
        (0.5 - 0.4) / 0.3
    )
    # A run still rising at its budget fails `kept` and `smoothed` (its last third averages the
    # rise) and holds all of its gain at the end; one that rose and fell back holds little there.
    rising = retention.curve_summary(lines([float(x * x) for x in range(20)]))
    assert rising["kept"] < 0.8 and rising["smoothed"] < 0.8 and rising["at_end"] == pytest.approx(1.0)
    fell = retention.curve_summary(lines([0.0] * 4 + [10.0] * 4 + [2.0] * 12))
    assert fell["smooth_peak"] == 10.0 and fell["at_end"] == pytest.approx(0.2)
    assert held["at_end"] == pytest.approx((495 - 10) / (500 - 10))  # 8 lines: windows of one line
    # A multi-agent run's curve is its team return (100 episodes), not its agents' 20 episodes.
    team = [{**line, "team_return_mean": 20 * (i + 1)} for i, line in enumerate(lines([3.0] * 6))]
    team[0]["team_return_mean"] = None
    assert retention.return_key(team) == "team_return_mean"
    assert retention.curve_summary(team)["first"] == 40 and retention.curve_summary(team)["peak"] == 120


def test_retention_reads_a_kept_run_only_when_it_is_finished_with_the_same_settings(tmp_path):
    """`retention.py --runs-dir`: a folder holding a finished run of the config's settings is read
    (whatever its metrics or checkpoint sections say); an unfinished one, one of other learning
    settings or one with no config is refused in one line naming why; a missing one is trained."""
    import yaml

    from relay_rl.contracts.config import config_data, load_config

    retention = benchmark_module("retention")

    sets = [
        "env.seed=1",
        "stop.episode_return_mean=null",
        "stop.env_steps=3000",
        "checkpoint.interval=1000000",
    ]
    stored = config_data(load_config(ROOT / "configs" / "cartpole_ppo.yaml", sets))

    def folder(name, config, steps):
        f = tmp_path / name
        f.mkdir()
        (f / "config.yaml").write_text(yaml.safe_dump(config))
        (f / "metrics.jsonl").write_text(
            "".join(json.dumps({"env_steps": s, "episode_return_mean": 1.0}) + "\n" for s in steps)
        )
        return f

    assert retention.kept_run(tmp_path / "new", "cartpole_ppo", sets, 3000) is None
    other_metrics = {
        **stored,
        "metrics": {**stored["metrics"], "progress": "none"},
        "checkpoint": {"interval": 20},
    }
    done = folder("done", other_metrics, [1000, 2000, 3000])
    assert [line["env_steps"] for line in retention.kept_run(done, "cartpole_ppo", sets, 3000)] == [
        1000,
        2000,
        3000,
    ]
    short = folder("short", stored, [1000, 2000])
    with pytest.raises(retention.RunsDirError, match="stopped at 2,000 of 3,000 env steps"):
        retention.kept_run(short, "cartpole_ppo", sets, 3000)
    lr = folder("lr", {**stored, "learner": {**stored["learner"], "lr": 0.5}}, [3000])
    with pytest.raises(retention.RunsDirError, match=r"other settings \(learner.lr\)"):
        retention.kept_run(lr, "cartpole_ppo", sets, 3000)
    seed = folder("seed", {**stored, "env": {**stored["env"], "seed": 2}}, [3000])
    with pytest.raises(retention.RunsDirError, match=r"other settings \(env.seed\)"):
        retention.kept_run(seed, "cartpole_ppo", sets, 3000)
    (tmp_path / "empty").mkdir()
    with pytest.raises(retention.RunsDirError, match="not a finished run"):
        retention.kept_run(tmp_path / "empty", "cartpole_ppo", sets, 3000)


# A stand-in training for `run_training`: it records the signal it stops on, takes a moment over its
# clean stop, says it finished, and exits as relay does (128 + the signal).
_CHILD = """
import os, signal, sys, time
log = sys.argv[1]
def stop(signum, frame):
    with open(log, "a") as f:
        f.write(f"got {signum}\\n")
    time.sleep(0.5)
    with open(log, "a") as f:
        f.write("stopped cleanly\\n")
    sys.exit(128 + signum)
for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
    signal.signal(sig, stop)
with open(log, "a") as f:
    f.write(f"ready {os.getpid()}\\n")
time.sleep(60)
"""


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP])
def test_a_benchmark_stopped_by_a_signal_stops_its_training_and_waits_for_it(tmp_path, sig):
    """benchmarks/common.run_training: a SIGTERM to `retention.py` once left its training running on,
    orphaned. The signal is now handed to the training, whose clean stop ends before the script exits
    with 128 + the signal."""
    log = tmp_path / "child.log"
    driver = (
        f"import sys; sys.path.insert(0, {str(ROOT / 'benchmarks')!r}); from pathlib import Path; "
        f"from common import run_training; "
        f"run_training([sys.executable, '-c', {_CHILD!r}, {str(log)!r}], Path({str(tmp_path)!r}))"
    )
    proc = subprocess.Popen([sys.executable, "-c", driver])
    deadline = time.monotonic() + 60
    while "ready" not in (log.read_text() if log.exists() else ""):
        assert time.monotonic() < deadline and proc.poll() is None
        time.sleep(0.05)
    child = int(log.read_text().split()[1])
    proc.send_signal(sig)
    assert proc.wait(timeout=60) == 128 + sig
    assert log.read_text().splitlines()[1:] == [f"got {int(sig)}", "stopped cleanly"]
    with pytest.raises(ProcessLookupError):  # gone, not orphaned
        os.kill(child, 0)


def test_a_failed_training_is_an_error_as_before(tmp_path):
    run_training = benchmark_module("common").run_training
    with pytest.raises(subprocess.CalledProcessError):
        run_training([sys.executable, "-c", "raise SystemExit(3)"], tmp_path)
    run_training([sys.executable, "-c", "pass"], tmp_path)


def test_the_language_report_keeps_its_other_samplers_when_one_fails(tmp_path, monkeypatch):
    """The device report runs once on a lent device: a compiled sampler that fails there (a backend,
    CUDA graphs) is a row saying why, and the other samplers still have their tokens/s."""
    device_llm = benchmark_module("device_llm")

    def broken(gm, example_inputs):
        raise RuntimeError("no graph today")

    monkeypatch.setattr(
        device_llm, "_backends", lambda device, quick: {"aot_eager": "aot_eager", "broken": broken}
    )
    folder = device_llm.model_folder(tmp_path, quick=True)
    text = device_llm.generation(folder, "cpu", 4, 3, quick=True)
    rows = {line.split("|")[1].strip(): line for line in text.splitlines()[3:]}
    assert (
        "failed: " in rows["relay compiled (broken)"] and "no graph today" in rows["relay compiled (broken)"]
    )
    for name in ("transformers generate", "relay eager (KV cache)", "relay compiled (aot_eager)"):
        tokens_per_s = rows[name].split("|")[4].strip()
        assert float(tokens_per_s.replace(",", "")) > 0, rows[name]


@pytest.mark.parametrize("cores", [2, 3, 4, 16, 64])
def test_the_fleet_section_runs_a_valid_config_with_a_worker_per_core(cores):
    """The end-to-end section once asked for 8 workers with the shipped 2,048-step buffer, a
    config relay refuses; it had never run (no Ray on the device machine). Its sets now build
    a config on any host: the cores shared out, the round grown with the fleet."""
    from relay_rl.contracts.config import load_config

    report = benchmark_module("device_report")
    sets = report.fleet_sets("cuda", cores, "envpool", 90.0)
    cfg = load_config(ROOT / "configs" / "breakout_ppo.yaml", sets)
    workers, learner_cpus = report.fleet_shape(cores)
    assert cfg.rollout.num_workers == workers >= 1 and cfg.learner.num_cpus == learner_cpus
    assert workers + learner_cpus == cores  # every core busy, none asked twice
    assert cfg.learner.buffer_size == workers * 8 * 128 == cfg.segments_per_update * cfg.segment_steps
    assert cfg.learner.buffer_size // cfg.learner.batch_size == 4 and cfg.learner.epochs == 4
    assert cfg.env.vectorization == "envpool" and cfg.stop.wall_s == 90.0


def test_the_fleet_and_recurrent_sections_keep_one_learners_row_when_the_other_fails(monkeypatch):
    """Sections 2 and 7 run twice, learner on the device and then on the CPU, within one scarce
    device call: a run that fails (here the device's) is a row saying why, the other keeps its
    numbers. train_relay is replaced (no training in the unit loop); the rows are the report's."""
    report = benchmark_module("device_report")

    def train(config, sets):
        if "learner.device=cuda" in sets:
            raise RuntimeError("CUDA error: no kernel image")
        return [{"env_steps": 49_152, "wall_s": 10.0, "env_steps_per_s": 900.0, "learner_busy": 0.5}] * 4

    monkeypatch.setattr(report, "train_relay", train)
    monkeypatch.setattr(report.recurrent, "train_relay", train)
    monkeypatch.setattr(report, "_missing", lambda *modules: None)
    fleet = report.breakout_end_to_end("cuda", quick=False, wall_s=5.0)
    rows = {
        cells[0]: cells
        for line in fleet.splitlines()[2:]
        if line.startswith("|")
        for cells in [[c.strip() for c in line.split("|")[1:-1]]]
    }
    assert rows["cuda"][5] == "failed: RuntimeError: CUDA error: no kernel image"
    assert rows["cpu"][4:7] == ["4", "900", "0.50"]  # lines, env steps/s, learner_busy
    assert "/ on cpu" not in fleet  # no ratio from a failed run
    lstm = report.recurrent_wall("cuda", quick=True)
    assert "failed: RuntimeError: CUDA error" in lstm
    assert "learner on cpu: LSTM / no core wall 1.00" in lstm and "learner on cuda" not in lstm
