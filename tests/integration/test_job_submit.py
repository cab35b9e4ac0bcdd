"""`ray job submit` against a real local head node of this test's own.

Everything goes through the `ray` command line in subprocesses, as a user would type it. Ray
>= 2.59 starts clusters with token authentication; the token is the default one in
~/.ray/auth_token (`ray get-auth-token --generate`), and RAY_AUTH_MODE=token is set for the
commands only, never in this test process (Ray caches its auth settings per process).

The head node is `ray start --head --block` in a temp dir of its own, a child process stopped by
its pid: `ray stop --force` would end every Ray process on the machine, a user's training beside
the suite included (it once killed two).
"""

import json
import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.helpers_proc import free_port, own_head_node

pytestmark = pytest.mark.ray

ROOT = Path(__file__).parents[2]
RAY = str(Path(sys.executable).parent / "ray")


def _ray(*args: str, env: dict, check: bool = True) -> str:
    proc = subprocess.run([RAY, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    if check and proc.returncode:
        raise AssertionError(f"ray {' '.join(args)} failed:\n{proc.stdout}\n{proc.stderr}")
    return proc.stdout + proc.stderr


def _ray_env() -> dict:
    return {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
        "RAY_AUTH_MODE": "token",
    }


@contextmanager
def _job_head_node() -> Iterator[tuple[str, dict]]:
    """A real head node with its dashboard (the job server), of this test's own: its job-server
    address and the environment for `ray` commands."""
    env = _ray_env()
    _ray("get-auth-token", "--generate", env=env)
    dash = free_port()
    dashboard = ("--include-dashboard=true", "--dashboard-host=127.0.0.1", f"--dashboard-port={dash}")
    with own_head_node(env, "--num-cpus=4", *dashboard):
        address = f"http://127.0.0.1:{dash}"
        deadline = time.time() + 60
        while not _job_server_answers(address, env):  # the job server starts after the GCS
            if time.time() > deadline:
                break  # submit will tell
            time.sleep(1)
        yield address, env


@pytest.fixture(scope="module")
def head_node():
    with _job_head_node() as node:
        yield node


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


# A user's training beside the suite: a driver on a local Ray of its own, calling its actor until
# its stdin closes; it exits 0 only if every call answered.
BYSTANDER = """
import sys, threading, time, ray
ray.init(address="local", num_cpus=1, include_dashboard=False)
@ray.remote
class Counter:
    def __init__(self): self.n = 0
    def add(self): self.n += 1; return self.n
c = Counter.remote()
ray.get(c.add.remote())
print("ready", flush=True)
done = threading.Event()
threading.Thread(target=lambda: (sys.stdin.read(), done.set()), daemon=True).start()
n = 1
while not done.is_set():
    n = ray.get(c.add.remote(), timeout=30)
    time.sleep(0.2)
print("calls", n, flush=True)
"""


def test_the_job_submit_head_node_leaves_a_training_beside_it_alive(tmp_path):
    """A Ray instance started beside the suite (a user's training, another CI job's) outlives the
    job-submit tests' head node, started and stopped as the tests do it: by its own pid, never by
    `ray stop --force`, which ended every Ray process on the machine."""
    env = {**os.environ, "RAY_TMPDIR": tempfile.mkdtemp(prefix="rb", dir="/tmp")}
    user = subprocess.Popen(
        [sys.executable, "-c", BYSTANDER], env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert user.stdout.readline().strip() == "ready"
        with _job_head_node() as (address, ray_env):
            assert _job_server_answers(address, ray_env)
        time.sleep(3)  # the user's driver makes calls after the head node is gone
        out, _ = user.communicate("", timeout=120)
    finally:
        user.kill()
    assert user.returncode == 0, out
    assert int(out.split()[-1]) > 3
