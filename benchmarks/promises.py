"""Timings behind docs/promises.md: how fast relay refuses and stops, and what it leaves behind.

    python benchmarks/promises.py

Each row runs `relay` as a user would (a subprocess; Python start-up and `import torch`, about
1.5 s here, included) and reports exit code, wall time from the signal or the command to the exit,
and what was left: metrics lines vs the newest checkpoint, Ray processes of the run's own
RAY_TMPDIR, a run directory.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[1]))
sys.path.insert(0, str(Path(__file__).parent))
from common import machine_header, table

from tests.helpers_proc import ROOT, metrics_lines, processes_mentioning, ray_env, start_train, wait_for


def _bomb() -> Path:
    lines = ['a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    for prev, cur in zip("abcdefgh", "bcdefghi", strict=True):
        lines.append(f"{cur}: &{cur} [{','.join('*' + prev for _ in range(9))}]")
    path = Path(tempfile.mkdtemp()) / "bomb.yaml"
    path.write_text("env:\n  id: CartPole-v1\n  kwargs:\n" + "".join(f"    {x}\n" for x in lines))
    return path


def refusal(name: str, argv: list[str]) -> list[object]:
    t0 = time.perf_counter()
    p = subprocess.run(
        [sys.executable, "-m", "relay_rl.services.cli", *argv], cwd=ROOT, capture_output=True, text=True
    )
    lines = p.stderr.strip().splitlines()
    return [name, p.returncode, round(time.perf_counter() - t0, 2), len(lines), "-", "-", lines[-1][:70]]


def stop(name: str, sig: int, sets: list[str]) -> list[object]:
    tmp = tempfile.mkdtemp(prefix="rt", dir="/tmp")
    run = Path(tempfile.mkdtemp()) / "run"
    proc = start_train(run, *sets, "checkpoint.interval=1000", env=ray_env(tmp))
    wait_for(lambda: len(metrics_lines(run)) >= 5, 180, "five iterations")
    t0 = time.perf_counter()
    proc.send_signal(sig)
    proc.communicate(timeout=120)
    elapsed = time.perf_counter() - t0
    last = metrics_lines(run)[-1]["iteration"]
    newest = sorted((run / "checkpoints").glob("ckpt-*.pt"))[-1].name
    time.sleep(3)
    return [
        name,
        proc.returncode,
        round(elapsed, 2),
        "-",
        f"{last} / {newest}",
        len(processes_mentioning(tmp)),
        "-",
    ]


def interrupt_ray_start() -> list[object]:
    tmp = tempfile.mkdtemp(prefix="rt", dir="/tmp")
    run = Path(tempfile.mkdtemp()) / "run"
    proc = start_train(run, "rollout.num_workers=2", env=ray_env(tmp))
    wait_for(lambda: any(Path(tmp).rglob("session_*")), 120, "Ray to start")
    time.sleep(0.5)
    t0 = time.perf_counter()
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    elapsed = time.perf_counter() - t0
    time.sleep(3)
    relay = [x for x in err.splitlines() if x.startswith("relay")]
    left = len(processes_mentioning(tmp))
    return [
        "Ctrl-C while Ray starts",
        proc.returncode,
        round(elapsed, 2),
        len(relay),
        "no run dir" if not run.exists() else "RUN DIR",
        left,
        relay[-1],
    ]


HANG = ["env.id=tests.rollout_workers.stuck_envs:make_hanging", "rollout.rollout_len=32"]


def stop_during_hang() -> list[object]:
    """SIGTERM while one worker's env hangs and the watchdog is off: the learner waits on it."""
    tmp, folder = tempfile.mkdtemp(prefix="rt", dir="/tmp"), Path(tempfile.mkdtemp())
    run, marker = folder / "run", folder / "hung"
    sets = [*HANG, f"env.kwargs={{marker: {marker}}}", "rollout.segment_timeout_s=null"]
    proc = start_train(run, "rollout.num_workers=2", "learner.buffer_size=512", *sets, env=ray_env(tmp))
    wait_for(marker.exists, 180, "an env to hang")
    time.sleep(3)
    t0 = time.perf_counter()
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=120)
    elapsed = time.perf_counter() - t0
    newest = sorted((run / "checkpoints").glob("ckpt-*.pt"))[-1].name
    time.sleep(3)
    last = metrics_lines(run)[-1]["iteration"]
    row = ["SIGTERM while an env hangs", proc.returncode, round(elapsed, 2), "-", f"{last} / {newest}"]
    return [*row, len(processes_mentioning(tmp)), "-"]


def stuck_worker() -> list[object]:
    """A worker stuck in env.step with rollout.segment_timeout_s=3: named, killed, restarted."""
    tmp, folder = tempfile.mkdtemp(prefix="rt", dir="/tmp"), Path(tempfile.mkdtemp())
    run, marker = folder / "run", folder / "hung"
    sets = [*HANG, f"env.kwargs={{marker: {marker}}}", "rollout.segment_timeout_s=3", "stop.env_steps=12000"]
    t0 = time.perf_counter()
    proc = start_train(run, "rollout.num_workers=2", "learner.buffer_size=512", *sets, env=ray_env(tmp))
    _, err = proc.communicate(timeout=300)
    line = next((x for x in err.splitlines() if "returned no segment" in x), "none")
    last = metrics_lines(run)[-1]
    row = ["stuck worker (timeout 3 s)", proc.returncode, round(time.perf_counter() - t0, 2), 1]
    return [*row, f"stuck_workers {last['stuck_workers']}", "-", line[:70]]


def resume_while_training() -> list[object]:
    run = Path(tempfile.mkdtemp()) / "run"
    proc = start_train(run, "rollout.num_workers=0", "learner.buffer_size=512")
    wait_for(lambda: len(metrics_lines(run)) >= 3, 120, "three iterations")
    try:
        return refusal("resume while train runs", ["resume", str(run)])
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.communicate(timeout=60)


def _finished_run() -> Path:
    run = Path(tempfile.mkdtemp()) / "run"
    sets = [
        "rollout.num_workers=0",
        "learner.buffer_size=512",
        "stop.env_steps=600",
        "stop.episode_return_mean=null",
    ]
    args = [
        sys.executable,
        "-m",
        "relay_rl.services.cli",
        "train",
        "configs/cartpole_ppo.yaml",
        "--run-dir",
        str(run),
    ]
    subprocess.run(
        [*args, *(x for kv in sets for x in ("--set", kv))], cwd=ROOT, capture_output=True, check=True
    )
    return run


def file_refusals() -> list[list[object]]:
    run = _finished_run()
    ckpt = str(sorted((run / "checkpoints").glob("ckpt-*.pt"))[-1])
    victim = run.parent / "victim"
    victim.write_text("x")
    (run / "error.log").symlink_to(victim)
    return [
        refusal("export --out the checkpoint itself", ["export", ckpt, "--out", ckpt, "--force"]),
        refusal("error.log -> a file outside", ["resume", str(run)]),
    ]


def shadowing_folder() -> list[object]:
    """`relay export` and `relay verify` in a folder holding onnx.py and torch.py."""
    run = _finished_run()
    ckpt = str(sorted((run / "checkpoints").glob("ckpt-*.pt"))[-1])
    folder = Path(tempfile.mkdtemp())
    for name in ("onnx", "onnxruntime", "torch"):
        (folder / f"{name}.py").write_text(f"open('RAN_{name}', 'w')\n")
    relay = Path(sys.executable).parent / "relay"
    t0 = time.perf_counter()
    codes = [
        subprocess.run([str(relay), *cmd], cwd=folder, capture_output=True).returncode
        for cmd in (["export", ckpt, "--out", "p.onnx"], ["verify", "p.onnx", "--dtypes", "float32"])
    ]
    ran = sorted(p.name for p in folder.glob("RAN_*")) or "none"
    row = ["export + verify beside onnx.py, torch.py", max(codes), round(time.perf_counter() - t0, 2), 0]
    return [*row, f"imported from the folder: {ran}", "-", "-"]


def main() -> None:
    rows = [
        refusal("alias bomb (411-byte config)", ["validate", str(_bomb())]),
        refusal("--address 127.0.0.1:1", ["train", "configs/cartpole_ppo.yaml", "--address", "127.0.0.1:1"]),
        refusal("learner.lr=nan", ["validate", "configs/cartpole_ppo.yaml", "--set", "learner.lr=nan"]),
        stop("SIGTERM, local mode", signal.SIGTERM, ["rollout.num_workers=0", "learner.buffer_size=512"]),
        stop("SIGTERM, Ray mode (2 workers)", signal.SIGTERM, ["rollout.num_workers=2"]),
        stop("Ctrl-C, Ray mode (2 workers)", signal.SIGINT, ["rollout.num_workers=2"]),
        interrupt_ray_start(),
        stop("SIGHUP, Ray mode (2 workers)", signal.SIGHUP, ["rollout.num_workers=2"]),
        stop_during_hang(),
        stuck_worker(),
        resume_while_training(),
        *file_refusals(),
        shadowing_folder(),
    ]
    print(machine_header("what relay promises: refusals and clean stops"))
    headers = [
        "case",
        "exit",
        "seconds",
        "stderr lines",
        "last line / newest ckpt",
        "Ray procs left",
        "last stderr line",
    ]
    print(table(headers, rows))


if __name__ == "__main__":
    main()
