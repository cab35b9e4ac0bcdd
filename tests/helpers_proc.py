"""Helpers for tests that run `relay` as a real process and signal it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

import psutil

from benchmarks.common import free_port

ROOT = Path(__file__).parents[1]


def start_train(run: Path, *sets: str, env: dict | None = None) -> subprocess.Popen:
    """`python -m relay_rl.services.train configs/cartpole_ppo.yaml` with a budget it will not reach."""
    args = [
        sys.executable,
        "-m",
        "relay_rl.services.train",
        "configs/cartpole_ppo.yaml",
        "--run-dir",
        str(run),
        "--set",
        "stop.env_steps=100000000",
        "--set",
        "stop.episode_return_mean=null",
        "--set",
        "metrics.progress=lines",
    ]
    for kv in sets:
        args += ["--set", kv]
    return subprocess.Popen(
        args, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
    )


def ray_env(ray_tmp: str) -> dict:
    """This process's environment with RAY_TMPDIR set to `ray_tmp`."""
    return {**os.environ, "RAY_TMPDIR": ray_tmp}


def wait_for(condition, timeout: float, what: str) -> None:
    deadline = time.time() + timeout
    while not condition():
        if time.time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def metrics_lines(run: Path) -> list[dict]:
    path = run / "metrics.jsonl"
    if not path.exists():
        return []
    return [json.loads(x) for x in path.read_bytes().splitlines(keepends=True) if x.endswith(b"\n")]


def processes_mentioning(text: str) -> list[str]:
    """Command lines of live processes that mention `text` (a Ray temp dir, say)."""
    found = []
    for p in processes_of(text):
        try:
            found.append(" ".join(p.cmdline())[:120])
        except psutil.Error:
            continue
    return found


def processes_of(text: str) -> list[psutil.Process]:
    """Live processes whose command lines mention `text` (a Ray temp dir, say)."""
    found = []
    for p in psutil.process_iter(["cmdline"]):
        try:
            if text in " ".join(p.info["cmdline"] or []):
                found.append(p)
        except psutil.Error:
            continue
    return found


def end_processes_of(text: str, grace_s: float = 30.0) -> None:
    """SIGTERM every process whose command line mentions `text`, SIGKILL those left after
    `grace_s`."""
    procs = processes_of(text)
    for p in procs:
        with suppress(psutil.Error):
            p.terminate()
    _, alive = psutil.wait_procs(procs, timeout=grace_s)
    for p in alive:
        with suppress(psutil.Error):
            p.kill()
    psutil.wait_procs(alive, timeout=10)


@contextmanager
def own_head_node(env: dict, *args: str) -> Iterator[tuple[str, int]]:
    """A Ray head node of the caller's own: `ray start --head --block` in a temp dir of its own
    (short: Ray's socket paths stay under ~100 characters) on a free port, as a child process;
    yields (the temp dir, the GCS port). Ended by a SIGTERM to its pid, on which `ray start
    --block` stops the processes it started, and then every process still naming its temp dir
    (nodes an autoscaler started, say) is ended too. Never `ray stop --force`: that ends every Ray
    process on the machine, a user's training beside the suite included."""
    ray = str(Path(sys.executable).parent / "ray")
    temp = tempfile.mkdtemp(prefix="rh", dir="/tmp")
    port = free_port()
    cmd = [ray, "start", "--head", "--block", f"--temp-dir={temp}", f"--port={port}", *args]
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        up = lambda: any("gcs_server" in cmd for cmd in processes_mentioning(temp))  # noqa: E731
        wait_for(lambda: proc.poll() is not None or up(), 120, f"the head node in {temp}")
        assert proc.poll() is None, f"ray start --head --block exited {proc.returncode}"
        yield temp, port
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
        end_processes_of(temp)
