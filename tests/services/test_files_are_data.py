"""Nothing read from a checkpoint, an ONNX file or a run directory imports a module, calls a
factory or builds an env unless the user names it on the command line.

The hostile files carry `env.id: subprocess:run` with `env.kwargs: {args: "touch MARKER",
shell: true}`: building that env runs a shell command, so the marker file existing is proof that
code ran.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import onnx
import pytest
import torch

from relay_rl.services.cli import main
from tests.helpers import train_local

ROOT = Path(__file__).parents[2]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    run = tmp_path_factory.mktemp("cartpole")
    assert train_local("cartpole_ppo.yaml", run, "learner.buffer_size=512", "stop.env_steps=600") == 0
    return run, sorted((run / "checkpoints").glob("ckpt-*.pt"))[-1]


def _hostile_env(marker: Path) -> dict:
    return {"id": "subprocess:run", "kwargs": {"args": f"touch {marker}", "shell": True}}


def _hostile_checkpoint(ckpt: Path, tmp_path: Path, marker: Path) -> Path:
    state = torch.load(ckpt, weights_only=True)
    state["config"]["env"].update(_hostile_env(marker))
    out = tmp_path / "hostile.pt"
    torch.save(state, out)
    return out


def test_export_and_verify_of_a_hostile_checkpoint_run_nothing(trained, tmp_path, capsys):
    marker = tmp_path / "pwned"
    hostile = _hostile_checkpoint(trained[1], tmp_path, marker)
    assert main(["export", str(hostile), "--out", str(tmp_path / "p.onnx")]) == 0
    assert "checked on 2000 observations" in capsys.readouterr().out  # synthetic: no env needed
    assert main(["verify", str(hostile), "--dtypes", "float32", "--batch", "4"]) == 0
    # Naming another env on the command line builds that one; the file's kwargs stay unused.
    assert main(["export", str(hostile), "--out", str(tmp_path / "q.onnx"), "--env", "CartPole-v1"]) == 0
    assert not marker.exists()


def test_verify_of_a_hostile_onnx_runs_nothing(trained, tmp_path):
    marker = tmp_path / "pwned"
    out = tmp_path / "p.onnx"
    assert main(["export", str(trained[1]), "--out", str(out)]) == 0
    proto = onnx.load(str(out))
    for prop in proto.metadata_props:
        if prop.key == "relay_config":
            cfg = json.loads(prop.value)
            cfg["env"].update(_hostile_env(marker))
            prop.value = json.dumps(cfg)
    onnx.save(proto, str(out))
    assert main(["verify", str(out), "--dtypes", "float32", "--batch", "4"]) == 0
    assert not marker.exists()


def test_resume_of_a_run_whose_config_names_code_asks_for_it_on_the_command_line(trained, tmp_path, capsys):
    import shutil

    marker = tmp_path / "pwned"
    run = tmp_path / "run"
    shutil.copytree(trained[0], run)
    text = (run / "config.yaml").read_text().replace("id: CartPole-v1", "id: subprocess:run")
    (run / "config.yaml").write_text(
        text.replace("kwargs: {}", f"kwargs: {{args: touch {marker}, shell: true}}")
    )
    before = {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()}
    assert main(["resume", str(run)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--set env.id=subprocess:run" in err
    assert not marker.exists()
    assert {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()} == before


def test_resume_of_a_run_whose_config_maps_agents_in_code_asks_for_it_on_the_command_line(
    trained, tmp_path, capsys
):
    """multi_agent.policy_mapping names a function relay would call with each agent's id: read
    from the run's config.yaml it is data, like env.id (os:system would run the agents' names)."""
    import shutil

    import yaml

    run = tmp_path / "run"
    shutil.copytree(trained[0], run)
    data = yaml.safe_load((run / "config.yaml").read_text())
    data["multi_agent"].update(policies={"a": []}, policy_mapping="os:system")
    (run / "config.yaml").write_text(yaml.safe_dump(data))
    before = {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()}
    assert main(["resume", str(run)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--set multi_agent.policy_mapping=os:system" in err
    assert {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()} == before
    sweep = tmp_path / "sweep"
    sweep.mkdir()
    data["sweep"] = {"params": {"learner.lr": "choice(0.001)"}}
    (sweep / "sweep.yaml").write_text(yaml.safe_dump(data))
    assert main(["sweep", "--resume", str(sweep)]) == 2
    assert "--set multi_agent.policy_mapping=os:system" in capsys.readouterr().err


def test_a_pickled_payload_is_refused_in_one_line(tmp_path):
    class Evil:
        def __reduce__(self):
            return (os.system, (f"touch {tmp_path / 'pwned'}",))

    torch.save({"config": {}, "learner": Evil()}, tmp_path / "evil.pt")
    for command in (["verify", "evil.pt"], ["export", "evil.pt"]):
        proc = subprocess.run(
            [sys.executable, "-m", "relay_rl.services.cli", *command],
            cwd=tmp_path,
            capture_output=True,
            text=True,
        )
        assert proc.returncode == 2, proc.stderr
        assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
        assert "pickled objects or code, which relay never loads" in proc.stderr
    assert not (tmp_path / "pwned").exists()


def test_a_named_env_never_gets_the_files_kwargs(trained, tmp_path):
    """The run's own env id named with --env: its stored preprocessing applies, its kwargs never
    (they would reach the user's factory, which would write where the file says)."""
    marker = tmp_path / "recorded"
    state = torch.load(trained[1], weights_only=True)
    state["config"]["env"].update(id="tests.services.recording_env:make", kwargs={"record_to": str(marker)})
    crafted = tmp_path / "crafted.pt"
    torch.save(state, crafted)
    env = "tests.services.recording_env:make"
    assert main(["export", str(crafted), "--out", str(tmp_path / "p.onnx"), "--env", env]) == 0
    assert main(["verify", str(crafted), "--dtypes", "float32", "--batch", "4", "--env", env]) == 0
    assert not marker.exists()
    typed = json.dumps({"record_to": str(marker)})  # what the user types does reach it
    assert (
        main(
            [
                "verify",
                str(crafted),
                "--dtypes",
                "float32",
                "--batch",
                "4",
                "--env",
                env,
                "--env-kwargs",
                typed,
            ]
        )
        == 0
    )
    assert marker.exists()


RELAY = Path(sys.executable).parent / "relay"
# Modules relay imports late (onnx, onnxruntime) or that every actor imports (torch, pydantic):
# copies in the working folder must never be imported in their place.
SHADOWS = ("onnx", "onnxruntime", "torch", "pydantic", "numpy", "gymnasium", "yaml")


def _plant_shadows(folder: Path) -> None:
    for name in SHADOWS:
        (folder / f"{name}.py").write_text(f"open({str(folder / ('RAN_' + name))!r}, 'w').write('x')\n")
    (folder / "myenvmod.py").write_text(
        "import gymnasium as gym\n\ndef make():\n    return gym.make('CartPole-v1')\n"
    )


def _ran(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.glob("RAN_*"))


def test_the_working_folder_never_shadows_a_library(trained, tmp_path):
    """`relay` run in a folder holding onnx.py, torch.py, ...: export, verify and validate import
    the installed packages; the folder serves only the `module:factory` env named on the command
    line."""
    _plant_shadows(tmp_path)
    ckpt = str(trained[1])
    commands = [
        ["export", ckpt, "--out", "p.onnx"],
        ["verify", "p.onnx", "--dtypes", "float32", "--batch", "4"],
        ["verify", ckpt, "--dtypes", "float32", "--batch", "4", "--env", "myenvmod:make"],
        ["validate", str(ROOT / "configs/cartpole_ppo.yaml"), "--set", "env.id=myenvmod:make"],
    ]
    for command in commands:
        proc = subprocess.run([str(RELAY), *command], cwd=tmp_path, capture_output=True, text=True)
        assert proc.returncode == 0, (command, proc.stderr[-500:])
    assert _ran(tmp_path) == []
    proc = subprocess.run(
        [str(RELAY), "validate", str(ROOT / "configs/cartpole_ppo.yaml"), "--set", "env.id=nosuchmod:make"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 2 and "cannot import module 'nosuchmod'" in proc.stderr


@pytest.mark.ray
def test_ray_actors_never_import_the_working_folder(tmp_path):
    """Ray puts the folder ray.init runs in first on every worker's sys.path; relay starts Ray from
    an empty folder of its own, and the rollout workers take the user's folder back for the env
    alone (its module found there, its relative paths meaning what they mean to the user)."""
    _plant_shadows(tmp_path)
    proc = subprocess.run(
        [
            *(str(RELAY), "train", str(ROOT / "configs/cartpole_ppo.yaml"), "--run-dir", "run"),
            *("--set", "env.id=myenvmod:make", "--set", "stop.env_steps=3000"),
            *("--set", "metrics.progress=none"),
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-800:]
    assert _ran(tmp_path) == []
    assert (tmp_path / "run" / "checkpoints").is_dir()


def test_a_sweep_folder_naming_code_runs_nothing(tmp_path, capsys):
    """`relay sweep --resume` and the dashboard read a sweep's sweep.yaml: neither builds its env."""
    import yaml

    from relay_rl.services.dashboard.server import RunStore

    marker = tmp_path / "MARKER"
    sweep = tmp_path / "sweep"
    sweep.mkdir()
    data = {"env": _hostile_env(marker), "sweep": {"params": {"learner.lr": "choice(0.001)"}}}
    (sweep / "sweep.yaml").write_text(yaml.safe_dump(data))
    (sweep / "trials.jsonl").write_text('{"trial": "t000", "event": "planned", "params": {}}\n')
    assert main(["sweep", "--resume", str(sweep)]) == 2
    assert "imports and runs code" in capsys.readouterr().err
    assert RunStore(sweep).sweep()["sweep"]["params"] == []
    assert not marker.exists()
