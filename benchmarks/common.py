"""Helpers shared by the benchmark scripts: a header naming the machine, and plain tables."""

from __future__ import annotations

import contextlib
import json
import os
import platform
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def mlflow_server(folder: Path, timeout_s: float = 90.0) -> Iterator[str]:
    """`mlflow server` on a free loopback port, as a team would run one (a SQLite backend store and
    an artifact folder in `folder`); yields its URL once /health answers, ends it after."""
    port = free_port()
    cmd = [
        sys.executable,
        "-m",
        "mlflow",
        "server",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--workers",
        "1",
    ]
    cmd += [
        "--backend-store-uri",
        f"sqlite:///{folder}/db.sqlite",
        "--artifacts-destination",
        str(folder / "art"),
    ]
    server = subprocess.Popen(cmd, cwd=folder, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                if urllib.request.urlopen(f"{url}/health", timeout=1).status == 200:
                    break
            except OSError:
                if time.monotonic() > deadline or server.poll() is not None:
                    raise RuntimeError(f"the MLflow server on port {port} did not start") from None
                time.sleep(0.5)
        yield url
    finally:
        server.terminate()
        server.wait(30)


def machine_header(title: str) -> str:
    import torch

    from relay_rl.learner.device import CPU_BF16_FLAGS, cpu_flags

    cpu = platform.processor() or platform.machine()
    # The CPU model and its bf16 units: the machine this project runs on changes between sessions,
    # and whether bf16 is computed or emulated decides the pixel learner's precision.
    model = _cpu_model()
    bf16 = ",".join(f for f in CPU_BF16_FLAGS if f in cpu_flags()) or "none"
    return (
        f"# {title}\n# {time.strftime('%Y-%m-%d %H:%M')}  {cpu}  {model}  bf16 units: {bf16}  "
        f"{os.cpu_count()} cores  python {platform.python_version()}  torch {torch.__version__}"
    )


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
            return next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), "")
    except OSError:
        return ""


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    cells = [[_fmt(c) for c in row] for row in rows]
    widths = [max(len(h), *(len(r[i]) for r in cells)) if cells else len(h) for i, h in enumerate(headers)]
    line = lambda r: "| " + " | ".join(c.rjust(w) for c, w in zip(r, widths, strict=True)) + " |"  # noqa: E731
    sep = "|" + "|".join("-" * (w + 2) for w in widths) + "|"
    return "\n".join([line(list(headers)), sep, *(line(r) for r in cells)])


def failure(err: BaseException) -> str:
    """A report's cell or line for a part that raised: 'failed: Type: message' on one line."""
    return f"failed: {type(err).__name__}: {' '.join(str(err).split())[:300]}"


def _fmt(value: Any) -> str:
    if value is None:
        return "n/a"
    if isinstance(value, float):
        return f"{value:,.1f}" if abs(value) >= 10 else f"{value:.2f}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def read_metrics(run_dir: Path) -> list[dict[str, Any]]:
    path = run_dir / "metrics.jsonl"
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


def run_training(cmd: Sequence[str], cwd: Path, env: dict[str, str] | None = None) -> None:
    """`subprocess.run(cmd, cwd=cwd, env=env, check=True)` for a training that stops with this
    script. Run plainly, a SIGTERM to the script left the training running on, orphaned, into a run
    dir nobody would read. The child runs in its own session, so a terminal's Ctrl-C reaches this
    script only; a Ctrl-C, SIGTERM or SIGHUP here is handed to the child as the same signal and the
    child is waited for, so its clean stop (metrics flushed, a final checkpoint) ends before this
    script exits with 128 + the signal. As in relay, a later Ctrl-C is handed on too (it cuts the
    stop short) and a later SIGTERM or SIGHUP is not."""
    # The signals a relay training stops cleanly on, from relay's own list (imported here: the
    # other helpers serve scripts that do not import relay).
    from relay_rl.services.runs.signals import ALL_STOP_SIGNALS

    children: list[subprocess.Popen[bytes]] = []
    received: list[int] = []
    handed: list[int] = []

    def hand_on(signum: int, frame: object) -> None:
        received.append(signum)
        if children and (not handed or signum == signal.SIGINT):
            handed.append(signum)
            children[0].send_signal(signum)

    # Handlers can only be set from the main thread; elsewhere the child is waited for as before.
    # Set before the child starts, so a signal in between is handed on once it has.
    main = threading.current_thread() is threading.main_thread()
    previous = {sig: signal.signal(sig, hand_on) for sig in ALL_STOP_SIGNALS} if main else {}
    try:
        children.append(subprocess.Popen(list(cmd), cwd=cwd, env=env, start_new_session=True))
        if received and not handed:
            handed.append(received[0])
            children[0].send_signal(received[0])
        code = children[0].wait()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if received:
        raise SystemExit(128 + received[0])
    if code:
        raise subprocess.CalledProcessError(code, list(cmd))


def train_relay(
    config: str, sets: list[str], inspect: Callable[[Path], None] | None = None, run_dir: Path | None = None
) -> list[dict[str, Any]]:
    """Run `python -m relay_rl.services.train CONFIG` (quiet, in a temporary run dir, or in `run_dir`,
    which stays) and return its metrics lines; `inspect` is handed the run dir before it goes (to
    read its checkpoints)."""
    root = Path(__file__).parents[1]
    with tempfile.TemporaryDirectory() as tmp:
        run = Path(tmp) / "run" if run_dir is None else run_dir
        cmd = [
            sys.executable,
            "-m",
            "relay_rl.services.train",
            config,
            "--run-dir",
            str(run),
            "--set",
            "metrics.progress=none",
        ]
        for kv in sets:
            cmd += ["--set", kv]
        run_training(cmd, root)
        if inspect is not None:
            inspect(run)
        return read_metrics(run)


def rllib_ppo_update(config: str, train_batch: int | None = None) -> dict[str, Any]:
    """relay's PPO update in the shipped `config` as keywords of RLlib's `PPOConfig.training(...)`,
    so RLlib runs the same update: steps a round (`train_batch`, default relay's buffer),
    minibatch, epochs, lr, gamma, lambda, clip and the loss weights."""
    from relay_rl.contracts.config import load_config

    lc = load_config(Path(__file__).parents[1] / config).learner
    return dict(
        train_batch_size_per_learner=lc.buffer_size if train_batch is None else train_batch,
        minibatch_size=lc.batch_size,
        num_epochs=lc.epochs,
        lr=lc.lr,
        gamma=lc.gamma,
        lambda_=lc.gae_lambda,
        clip_param=lc.clip_ratio,
        entropy_coeff=lc.entropy_coef,
        vf_loss_coeff=lc.value_coef,
    )


def sampling_rate(
    cfg: Any, workers: int, seconds: float, in_flight: int = 1, num_cpus: float | None = None
) -> float:
    """Env steps/s of `workers` RolloutWorker actors alone (Ray running; nobody learning): each
    keeps `in_flight` samples outstanding, segments stay in the object store."""
    import os

    import ray

    from relay_rl.learner.algorithms import algorithm_traits
    from relay_rl.rollout_workers.worker import RolloutWorker

    cpus = cfg.rollout.num_cpus_per_worker if num_cpus is None else num_cpus
    cls = ray.remote(RolloutWorker).options(num_cpus=cpus)
    data, traits = cfg.model_dump(mode="json"), algorithm_traits(cfg)
    actors = [cls.remote(data, traits, i, os.getcwd()) for i in range(workers)]
    ray.get([a.sample.remote(-1, []) for a in actors])  # warm: envs built, first weights
    pending = {a.sample.remote(-1, []): a for a in actors for _ in range(in_flight)}
    calls, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        done, _ = ray.wait(list(pending), num_returns=1, fetch_local=False)
        actor = pending.pop(done[0])
        calls += 1
        pending[actor.sample.remote(-1, [])] = actor
    rate = calls * cfg.segment_steps / (time.perf_counter() - t0)
    for a in actors:
        ray.kill(a)
    return rate


# rl-baselines3-zoo's tuned settings for CartPole-v1 (PPO) and CartPoleNoVel-v1 (RecurrentPPO), the
# same numbers for both: 8 envs x 32 steps, lr and clip annealed linearly to 0 (zoo's lin_<start>).
ZOO_CARTPOLE: dict[str, Any] = {
    "n_steps": 32,
    "batch_size": 256,
    "gae_lambda": 0.8,
    "gamma": 0.98,
    "n_epochs": 20,
    "ent_coef": 0.0,
    "learning_rate": lambda remaining: 1e-3 * remaining,
    "clip_range": lambda remaining: 0.2 * remaining,
}

WINDOW = 20  # the mean return of the last 20 episodes: what relay's episode_return_mean reads


def sb3_learn_until(
    model: Any, target: float, max_wall: float, max_steps: int
) -> tuple[bool, float, int, Any]:
    """`model.learn` (an SB3 algorithm) until the mean return of its last 20 episodes reaches
    `target`, or `max_wall` seconds from the first env step, or `max_steps`:
    (solved, wall s, env steps, final mean return)."""
    from collections import deque

    from stable_baselines3.common.callbacks import BaseCallback

    class StopAtTarget(BaseCallback):
        def __init__(self) -> None:
            super().__init__()
            self.returns: deque[float] = deque(maxlen=WINDOW)
            self.t0: float | None = None
            self.solved_at: tuple[float, int] | None = None

        def _on_training_start(self) -> None:
            self.t0 = time.perf_counter()

        def _on_step(self) -> bool:
            for info in self.locals["infos"]:
                if "episode" in info:
                    self.returns.append(info["episode"]["r"])
            wall = time.perf_counter() - (self.t0 or 0.0)
            if len(self.returns) == WINDOW and sum(self.returns) / WINDOW >= target:
                self.solved_at = (wall, self.num_timesteps)
                return False
            return wall < max_wall

    cb = StopAtTarget()
    t_start = time.perf_counter()
    model.learn(total_timesteps=max_steps, callback=cb)
    final = sum(cb.returns) / len(cb.returns) if cb.returns else None
    if cb.solved_at:
        return True, cb.solved_at[0], cb.solved_at[1], final
    return False, time.perf_counter() - (cb.t0 or t_start), model.num_timesteps, final
