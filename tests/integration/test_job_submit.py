"""`ray job submit` against a real local head node (`ray start --head`, stopped afterwards).

Everything goes through the `ray` command line in subprocesses, as a user would type it. Ray
>= 2.59 starts clusters with token authentication; the token is the default one in
~/.ray/auth_token (`ray get-auth-token --generate`), and RAY_AUTH_MODE=token is set for the
commands only, never in this test process (Ray caches its auth settings per process).
"""

import json
import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.ray

ROOT = Path(__file__).parents[2]
RAY = str(Path(sys.executable).parent / "ray")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _ray(*args: str, env: dict, check: bool = True) -> str:
    proc = subprocess.run([RAY, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    if check and proc.returncode:
        raise AssertionError(f"ray {' '.join(args)} failed:\n{proc.stdout}\n{proc.stderr}")
    return proc.stdout + proc.stderr


@pytest.fixture(scope="module")
def head_node():
    """A real head node with its dashboard (the job server), stopped at the end."""
    env = {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
        "RAY_AUTH_MODE": "token",
    }
    _ray("get-auth-token", "--generate", env=env)
    port, dash = _free_port(), _free_port()
    _ray(
        "start",
        "--head",
        f"--port={port}",
        "--dashboard-host=127.0.0.1",
        f"--dashboard-port={dash}",
        "--num-cpus=4",
        "--include-dashboard=true",
        env=env,
    )
    address = f"http://127.0.0.1:{dash}"
    deadline = time.time() + 60
    while not _job_server_answers(address, env):  # the dashboard's job server starts after `ray start`
        if time.time() > deadline:
            break  # submit will tell
        time.sleep(1)
    yield address, env
    _ray("stop", "--force", env=env, check=False)


def _job_server_answers(address: str, env: dict) -> bool:
    cmd = [RAY, "job", "list", "--address", address]
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, timeout=300).returncode == 0


def _submit_train(address: str, env: dict, *args: str) -> str:
    """Submit the README's job (`python -m relay_rl.services.train configs/cartpole_ppo.yaml`) plus `args`."""
    entrypoint = ["python", "-m", "relay_rl.services.train", "configs/cartpole_ppo.yaml", *args]
    out = _ray(
        "job", "submit", "--address", address, "--working-dir", ".", "--no-wait", "--", *entrypoint, env=env
    )
    return re.search(r"raysubmit_[A-Za-z0-9]+", out).group(0)


def _wait(address: str, env: dict, job_id: str, timeout: float = 300.0) -> str:
    deadline = time.time() + timeout
    while True:
        out = _ray("job", "status", job_id, "--address", address, env=env)
        found = re.search(r"\b(succeeded|failed|stopped)\b", out, re.IGNORECASE)
        if found:
            return found.group(1).upper()
        assert time.time() < deadline, out
        time.sleep(1)


def test_job_submit_trains_and_writes_metrics(head_node, tmp_path):
    address, env = head_node
    run = tmp_path / "run"
    # The README's command, but for the stop budget and the run directory.
    job_id = _submit_train(address, env, "--set", "stop.env_steps=4000", "--run-dir", str(run))
    status = _wait(address, env, job_id)
    assert status == "SUCCEEDED", _ray("job", "logs", job_id, "--address", address, env=env)
    lines = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert lines[-1]["env_steps"] >= 4000


def test_job_with_an_invalid_config_fails_with_the_one_line_message(head_node):
    address, env = head_node
    job_id = _submit_train(address, env, "--set", "learner.batch_size=1000")
    assert _wait(address, env, job_id) == "FAILED"
    logs = _ray("job", "logs", job_id, "--address", address, env=env)
    assert "relay train: invalid config: learner.batch_size=1000 does not divide" in logs
    assert "Traceback" not in logs
