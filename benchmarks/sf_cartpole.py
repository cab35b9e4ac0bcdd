"""Sample Factory 2.1.1 APPO on CartPole-v1 for ENV_STEPS, in its own venv (benchmarks/fleet.py builds
it: Sample Factory pins gymnasium < 1.0 and numpy < 2). Settings matched to relay's CartPole run
in the same table: 2 rollout workers x 8 envs, a 64x64 tanh MLP, no RNN, the CPU (APPO with
Sample Factory's CartPole example settings otherwise: no V-trace, reward scale 0.1).

Prints one JSON line: {"steps_per_s": ..., "seconds_to_475": ... or null, "frames": ...}, read
from Sample Factory's own log lines ("Fps is ...", "Avg episode reward: ...").

    .venv-sample-factory/bin/python benchmarks/sf_cartpole.py 500000

(A step budget, not seconds: 2.1.1's --train_for_seconds never fires, its runner never advances
the clock it compares.)
"""

from __future__ import annotations

import io
import json
import re
import sys
import tempfile
import time
from contextlib import redirect_stderr, redirect_stdout

import gymnasium as gym

FRAMES = re.compile(r"Total num frames: (\d+)")
REWARD = re.compile(r"Avg episode reward: \[\(0, '(-?[\d.]+)'\)\]")


class Watch(io.TextIOBase):
    """A stream that timestamps the log lines Sample Factory prints, for the two figures we need."""

    def __init__(self) -> None:
        self.t0 = time.perf_counter()
        self.first_475: float | None = None
        self.frames: list[tuple[float, int]] = []

    def write(self, text: str) -> int:
        now = time.perf_counter() - self.t0
        for m in FRAMES.finditer(text):
            self.frames.append((now, int(m.group(1))))
        for m in REWARD.finditer(text):
            if self.first_475 is None and float(m.group(1)) >= 475:
                self.first_475 = now
        return len(text)


def make_cartpole(name: str, cfg=None, env_config=None, render_mode=None) -> gym.Env:
    """Sample Factory's env factory (module level: its workers are spawned and unpickle it)."""
    return gym.make(name, render_mode=render_mode)


def main() -> None:
    import logging

    from sample_factory.cfg.arguments import parse_full_cfg, parse_sf_args
    from sample_factory.envs.env_utils import register_env
    from sample_factory.train import run_rl

    steps = int(sys.argv[1])
    register_env("CartPole-v1", make_cartpole)
    with tempfile.TemporaryDirectory() as tmp:
        argv = [
            "--env=CartPole-v1",
            "--algo=APPO",
            "--experiment=relay_side_by_side",
            f"--train_dir={tmp}",
            "--device=cpu",
            "--num_workers=2",
            "--num_envs_per_worker=8",
            "--worker_num_splits=2",
            "--rollout=32",
            "--batch_size=1024",
            "--use_rnn=False",
            "--encoder_mlp_layers",
            "64",
            "64",
            "--nonlinearity=tanh",
            # Sample Factory's own CartPole example runs without V-trace; with it, 2.1.1's learner
            # fails in its summaries (mb.advantages is never set on the V-trace path).
            "--with_vtrace=False",
            "--reward_scale=0.1",
            f"--train_for_env_steps={steps}",
            "--experiment_summaries_interval=2",
            "--save_every_sec=100000",
            "--keep_checkpoints=1",
        ]
        parser, _ = parse_sf_args(argv=argv)
        cfg = parse_full_cfg(parser, argv)
        watch = Watch()
        logging.getLogger("rl").addHandler(logging.StreamHandler(watch))  # Sample Factory's logger
        start = time.perf_counter()
        with redirect_stdout(io.StringIO()), redirect_stderr(io.StringIO()):
            run_rl(cfg)
        wall = time.perf_counter() - start
    # Steady-state rate between its first and last reports (startup excluded, as relay's
    # env_steps_per_s counts from the first env step); time to 475 from launch, as relay's row.
    moving = [(t, f) for t, f in watch.frames if f > 0]
    rate = (moving[-1][1] - moving[0][1]) / (moving[-1][0] - moving[0][0]) if len(moving) > 1 else 0.0
    frames = watch.frames[-1][1] if watch.frames else 0
    print(
        json.dumps({"steps_per_s": rate, "seconds_to_475": watch.first_475, "frames": frames, "wall_s": wall})
    )


if __name__ == "__main__":
    main()
