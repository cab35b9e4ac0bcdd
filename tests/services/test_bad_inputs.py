"""Every bad input: one line on stderr, exit 2, nothing created.

Most cases run `relay` in-process (the same `main` the console script calls); a few run it as a
subprocess, where a traceback would reach the terminal. Property tests throw random `--set`
values and random YAML documents at the config loader: it answers with a config or one line,
never anything else.
"""

import string
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from relay_rl.contracts.config import ConfigError, RelayConfig, build_config, load_config
from relay_rl.services.cli import main
from relay_rl.services.runs.config_sections import all_leaves

STRUCTURED = "tests.rollout_workers.structured_envs"
ROOT = Path(__file__).parents[2]
CARTPOLE = str(ROOT / "configs/cartpole_ppo.yaml")


def _refused(capsys, argv: list[str], *needles: str) -> str:
    assert main(argv) == 2, argv
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    for needle in needles:
        assert needle in err, (needle, err)
    return err


@pytest.mark.parametrize(
    "leaf",
    [
        "learner.lr",
        "learner.clip_ratio",
        "learner.max_grad_norm",
        "stop.wall_s",
        "stop.episode_return_mean",
        "model.init_log_std",
    ],
)
@pytest.mark.parametrize("value", ["inf", "nan", "1e999", "-.inf", ".nan"])
def test_non_finite_floats_are_refused(capsys, tmp_path, leaf, value):
    run = tmp_path / "run"
    _refused(capsys, ["train", CARTPOLE, "--run-dir", str(run), "--set", f"{leaf}={value}"], leaf)
    assert not run.exists()


@pytest.mark.parametrize(
    "sets, needle",
    [
        (["env.num_envs=100000000"], "env.num_envs"),
        (["rollout.rollout_len=1000000000"], "rollout.rollout_len"),
        (["model.hidden_sizes=[0]"], "model.hidden_sizes"),
        (["metrics.run_name=../../escape"], "metrics.run_name"),
        # Valid sizes whose product is far beyond this machine: checked before anything starts.
        (
            [
                "env.num_envs=65536",
                "rollout.rollout_len=100000",
                "learner.buffer_size=13107200000",
                "learner.batch_size=6553600000",
            ],
            "GB of memory",
        ),
        (["learner.device=cuda"], "no cuda device is available on this host"),
        (["learner.device=npu:0"], "torch_npu is not installed"),
        (["env.kwargs={no_such_argument: 1}"], "cannot be built (TypeError"),
    ],
)
def test_sizes_and_devices_this_machine_cannot_run(capsys, tmp_path, sets, needle):
    run = tmp_path / "run"
    args = [x for kv in sets for x in ("--set", kv)]
    _refused(
        capsys, ["train", CARTPOLE, "--run-dir", str(run), "--set", "rollout.num_workers=0", *args], needle
    )
    assert not run.exists()


def test_config_files_that_are_not_configs(capsys, tmp_path):
    (tmp_path / "latin1.yaml").write_bytes("env:\n  id: Cart\xe9Pole\n".encode("latin-1"))
    _refused(capsys, ["validate", str(tmp_path / "latin1.yaml")], "not UTF-8 text")
    (tmp_path / "list.yaml").write_text("- 1\n- 2\n")
    _refused(capsys, ["validate", str(tmp_path / "list.yaml")], "mapping of sections")
    (tmp_path / "tag.yaml").write_text("env: !!python/object/apply:os.system ['echo pwned']\n")
    _refused(capsys, ["validate", str(tmp_path / "tag.yaml")], "not valid YAML")
    _refused(capsys, ["validate", str(tmp_path)], "config file not found")


def test_alias_bomb_is_refused_fast_and_in_one_line(capsys, tmp_path):
    """377 bytes that expand to 9^9 values: refused at the expansion cap, in well under a second."""
    lines = ['a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    for prev, cur in zip("abcdefgh", "bcdefghi", strict=True):
        lines.append(f"{cur}: &{cur} [{','.join('*' + prev for _ in range(9))}]")
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text("env:\n  id: CartPole-v1\n  kwargs:\n" + "".join(f"    {x}\n" for x in lines))
    t0 = time.perf_counter()
    err = _refused(capsys, ["validate", str(bomb)], "expands to more than")
    assert time.perf_counter() - t0 < 2.0 and len(err) < 300
    t0 = time.perf_counter()
    _refused(capsys, ["validate", CARTPOLE, "--set", "env.kwargs=" + "{" + ", ".join(lines) + "}"], "YAML")
    assert time.perf_counter() - t0 < 2.0


@pytest.mark.parametrize(
    "value, needle",
    [
        ("[1, 2", "not valid YAML"),
        ("!!python/object/apply:os.system ['touch pwned']", "not valid YAML"),
        ("{a: b", "not valid YAML"),
        ("'unclosed", "not valid YAML"),
    ],
)
def test_bad_yaml_in_set_is_one_line_and_runs_nothing(capsys, tmp_path, monkeypatch, value, needle):
    monkeypatch.chdir(tmp_path)
    _refused(capsys, ["validate", CARTPOLE, "--set", f"learner.lr={value}"], needle)
    assert not (tmp_path / "pwned").exists()


ENV_MODULES = {
    "raises_on_import": ("raise RuntimeError('no licence server')\n", "no licence server"),
    "syntax_error": ("def broken(:\n", "SyntaxError"),
    "factory_raises": ("def make(**kw):\n    raise ValueError('bad seed file')\n", "bad seed file"),
    "not_an_env": ("def make(**kw):\n    return 42\n", "cannot be built"),
}


@pytest.mark.parametrize("module", list(ENV_MODULES))
def test_user_env_modules_that_fail_are_one_line(capsys, tmp_path, monkeypatch, module):
    source, needle = ENV_MODULES[module]
    (tmp_path / f"{module}.py").write_text(source)
    monkeypatch.chdir(tmp_path)
    run = tmp_path / "run"
    _refused(capsys, ["train", CARTPOLE, "--run-dir", str(run), "--set", f"env.id={module}:make"], needle)
    assert not run.exists()


@pytest.mark.parametrize(
    "argv, needle",
    [
        (["dashboard", ".", "--port", "99999"], "99999 is not a port number"),
        (["train", CARTPOLE, "--dashboard-port", "-1"], "not a port number"),
        (["train", CARTPOLE, "--no-such-flag"], "unrecognized arguments"),
        (["verify", "x.onnx", "--batch", "0"], "--batch 0"),
        ([], "the following arguments are required"),
    ],
)
def test_command_line_errors_are_one_line(argv, needle):
    proc = subprocess.run(
        [sys.executable, "-m", "relay_rl.services.cli", *argv],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2, proc
    assert len(proc.stderr.strip().splitlines()) == 1 and needle in proc.stderr, proc.stderr


# ---- properties --------------------------------------------------------------------------------
LEAVES = [path for path, _, _ in all_leaves()]
yaml_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(alphabet=string.printable, max_size=20),
)
yaml_values = st.recursive(
    yaml_scalars,
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=12,
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    leaf=st.one_of(st.sampled_from(LEAVES), st.text(alphabet=string.ascii_lowercase + "._", max_size=25)),
    raw=st.one_of(
        st.text(max_size=40), yaml_values.map(lambda v: yaml.safe_dump(v, default_flow_style=True))
    ),
)
def test_any_set_value_gives_a_config_or_one_line(leaf, raw):
    try:
        cfg = build_config({}, [f"{leaf}={raw}"])
    except ConfigError as err:
        assert "\n" not in str(err) and len(str(err)) < 2000
    else:
        assert isinstance(cfg, RelayConfig)


@settings(max_examples=150, deadline=None)
@given(doc=st.dictionaries(st.sampled_from(["env", "rollout", "learner", "model", "stop", "x"]), yaml_values))
def test_any_yaml_document_gives_a_config_or_one_line(tmp_path_factory, doc):
    path = tmp_path_factory.mktemp("cfg") / "c.yaml"
    path.write_text(yaml.safe_dump(doc))
    try:
        load_config(path)
    except ConfigError as err:
        assert "\n" not in str(err)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(leaf=st.sampled_from(LEAVES), raw=st.text(alphabet=string.printable, max_size=12))
def test_validate_of_any_set_exits_0_or_2_with_one_line(capsys, leaf, raw):
    """The whole command, preflight included (it builds the env): never a traceback."""
    code = main(["validate", CARTPOLE, "--set", f"{leaf}={raw}"])
    captured = capsys.readouterr()
    assert code in (0, 2)
    if code == 2:
        assert len(captured.err.strip().splitlines()) == 1, captured.err


def test_a_dashboard_port_in_use_is_refused_before_anything_is_created(capsys, tmp_path):
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        run = tmp_path / "run"
        argv = ["train", CARTPOLE, "--run-dir", str(run), "--dashboard", "--dashboard-port", str(port)]
        _refused(
            capsys, [*argv, "--set", "rollout.num_workers=0"], f"dashboard cannot listen on 127.0.0.1:{port}"
        )
    assert not run.exists()


def test_export_and_verify_options_nobody_listed(capsys, tmp_path):
    ckpt = tmp_path / "c.pt"
    ckpt.write_bytes(b"not a checkpoint")
    _refused(capsys, ["export", str(ckpt), "--out", str(tmp_path)], "exists and is not a regular file")
    _refused(capsys, ["export", str(ckpt), "--out", str(tmp_path / "no" / "x.onnx")], "writable folder")
    _refused(capsys, ["export", str(ckpt)], "c.pt cannot be read as data (not torch's zip format")
    _refused(capsys, ["verify", str(ckpt), "--min-cosine", "nan"], "--min-cosine")
    _refused(capsys, ["verify", str(ckpt), "--device", "cuda"], "no cuda device")
    _refused(capsys, ["verify", str(tmp_path / "missing.onnx")], "no such file")
    (tmp_path / "x.onnx").write_bytes(b"\x00garbage")
    _refused(capsys, ["verify", str(tmp_path / "x.onnx")], "not an ONNX model")
    _refused(capsys, ["dashboard", str(ckpt)], "no such folder")


# ---- the inputs nobody listed, second pass --------------------------------------------------------
def _nested(depth: int) -> str:
    return "{a: " * depth + "1" + "}" * depth


@pytest.mark.parametrize(
    "sets, needle",
    [
        ([f"env.kwargs={_nested(300)}"], "nested more than 32 levels"),
        (["learner.lr=" + "9" * 5001], "not a usable value"),
        (["learner.ray_resources={CPU: -5}"], "CPUs are learner.num_cpus"),
        (["learner.ray_resources={NPU: -1}"], "not an amount Ray can reserve"),
        (["learner.ray_resources={NPU: 0}"], "not an amount Ray can reserve"),
        (["env.id=tests.rollout_workers.stuck_envs:make_empty_box"], "holds no numbers"),
        ([f"env.id={STRUCTURED}:make_sequence_obs"], "unsupported space for the observation: Sequence"),
        ([f"env.id={STRUCTURED}:make_graph_obs"], "unsupported space for the observation: Graph"),
        ([f"env.id={STRUCTURED}:make_text_obs"], "does not read text observations"),
        ([f"env.id={STRUCTURED}:make_unbounded_action"], "these are infinite"),
        ([f"env.id={STRUCTURED}:make_dict_action"], "unsupported action space Dict"),
        ([f"env.id={STRUCTURED}:make_slash_key"], "keys may not be empty or hold '/'"),
        (["env.id=MiniGrid-DoorKey-5x5-v0", "env.obs_keys=[nope]"], "has no key 'nope'"),
        (
            ["env.id=MiniGrid-DoorKey-5x5-v0", "model.encoders={image: nature_cnn}"],
            "nature_cnn reads uint8 images",
        ),
        (
            ["env.id=MiniGrid-DoorKey-5x5-v0", "model.encoders={mission: flat}"],
            "not a leaf of the observation",
        ),
        (["model.encoders={'': one_hot}"], "model.encoders chooses encoders for the leaves"),
        (["env.id=Taxi-v4", "env.action_mask=obs:action_mask"], "the observation has no key 'action_mask'"),
        (["env.action_mask=maybe"], "env.action_mask must be auto, none, obs:<key> or info:<key>"),
        (["env.actions=[0, 5]"], "env.actions=[0, 5]: 5 is not one of the env's choices 0..1"),
        (["env.actions=[]"], "env.actions"),
        (["env.id=Pendulum-v1", "env.actions=[0]"], "keeps choices of a Discrete action space"),
        (
            ["env.id=Pendulum-v1", "env.action_mask=info:action_mask"],
            "masks apply to Discrete and MultiDiscrete",
        ),
        (
            [
                "rollout.num_workers=4096",
                "rollout.rollout_len=1",
                "env.num_envs=1",
                "learner.buffer_size=4096",
                "learner.batch_size=512",
            ],
            "actor processes",
        ),
    ],
)
def test_more_bad_configs_are_one_line_and_no_run_dir(capsys, tmp_path, sets, needle):
    run = tmp_path / "run"
    argv = ["train", CARTPOLE, "--run-dir", str(run)]
    for kv in sets:
        argv += ["--set", kv]
    _refused(capsys, argv, needle)
    assert not run.exists()
    _refused(capsys, ["validate", CARTPOLE, *argv[4:]], needle)


def test_a_huge_config_file_is_refused_without_reading_it_whole(capsys, tmp_path):
    big = tmp_path / "big.yaml"
    with big.open("wb") as f:
        f.truncate(3 << 30)  # 3 GB, sparse: reading it whole would take seconds and 3 GB
    t0 = time.perf_counter()
    _refused(capsys, ["validate", str(big)], "larger than 1048576 bytes")
    assert time.perf_counter() - t0 < 2.0


def test_verify_with_a_batch_past_memory_is_refused_before_allocating(capsys, tmp_path):
    run = tmp_path / "run"
    from tests.helpers import train_local

    assert train_local("cartpole_ppo.yaml", run, "learner.buffer_size=512", "stop.env_steps=600") == 0
    ckpt = sorted((run / "checkpoints").glob("*.pt"))[-1]
    capsys.readouterr()
    _refused(capsys, ["verify", str(ckpt), "--batch", "100000000000"], "need about", "GB free")


def _onnx_with(tmp_path: Path, spec_shape: list[int] | None = None, dims: list[int] | None = None) -> Path:
    """A tiny relay-looking ONNX file whose metadata or initializer names sizes it does not hold."""
    import json

    import onnx
    from onnx import TensorProto, helper

    w = TensorProto(name="model.pi_trunk.0.weight", data_type=TensorProto.FLOAT, dims=dims or [64, 4])
    w.raw_data = b"\x00" * 16 if dims else b"\x00" * (64 * 4 * 4)
    graph = helper.make_graph(
        [helper.make_node("Identity", ["obs"], ["action"])],
        "g",
        [helper.make_tensor_value_info("obs", TensorProto.FLOAT, [None, 4])],
        [helper.make_tensor_value_info("action", TensorProto.FLOAT, [None, 4])],
        [w],
    )
    model = helper.make_model(graph)
    env = {"obs_shape": spec_shape or [4], "action": {"kind": "discrete", "size": 2}}
    helper.set_model_props(model, {"relay_config": json.dumps({}), "relay_env": json.dumps(env)})
    path = tmp_path / "crafted.onnx"
    path.write_bytes(model.SerializeToString())
    assert onnx.load(str(path)) is not None
    return path


@pytest.mark.parametrize(
    "kind, needle",
    [("spec", "do not fit"), ("dims", "declares [1048576, 1048576] (1099511627776 values) but holds 4")],
)
def test_sizes_read_from_an_onnx_file_are_checked_before_anything_is_allocated(tmp_path, kind, needle):
    """Run as a process, so its peak memory is measured: the refusal costs no more than start-up."""

    path = _onnx_with(
        tmp_path,
        spec_shape=[4194304] if kind == "spec" else None,
        dims=[1 << 20, 1 << 20] if kind == "dims" else None,
    )
    # The peak is read in a fresh process whose only child is the command: this process's
    # RUSAGE_CHILDREN is the largest of every child any earlier test waited for (a training run).
    measure = (
        "import resource, subprocess, sys; p = subprocess.run(sys.argv[1:]); "
        "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss); sys.exit(p.returncode)"
    )
    proc = subprocess.run(
        [sys.executable, "-c", measure, sys.executable, "-m", "relay_rl.services.cli", "verify", str(path)],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 2, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and needle in proc.stderr, proc.stderr
    peak_gb = int(proc.stdout.strip().splitlines()[-1]) / 2**20
    assert peak_gb < 1.5, peak_gb
