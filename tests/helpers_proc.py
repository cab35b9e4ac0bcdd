"""Helpers for tests that run `relay` as a real process and signal it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import psutil

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
    for p in psutil.process_iter(["cmdline"]):
        try:
            cmd = " ".join(p.info["cmdline"] or [])
        except psutil.Error:
            continue
        if text in cmd:
            found.append(cmd[:120])
    return found
