"""Evaluation: what it costs training, how fast it plays and encodes, and whether it scores what
SB3's `evaluate_policy` scores.

    python benchmarks/evaluation.py                       # everything below
    python benchmarks/evaluation.py --only encode         # video encode time per 1,000 frames, per library
    python benchmarks/evaluation.py --only sb3            # relay eval beside SB3's evaluate_policy
    python benchmarks/evaluation.py --only cost --seconds 60 --repeats 3   # training with and without eval

encode: 1,000 real frames (CartPole's 600x400 renders, Breakout's 210x160 full-colour ALE frames)
encoded to H.264 MP4 by imageio-ffmpeg and by PyAV, alternately, best of `--repeats`.
sb3: CartPole, Pendulum, Hopper and Breakout policies trained by relay (local mode), scored by
`relay eval` (10 episodes, greedy; Breakout's sampled, `--stochastic`) and by SB3's
`evaluate_policy` on the same env seeds with the same policy (relay's, behind SB3's `predict`,
drawing relay's noise; for Breakout SB3's Monitor sits under the life-loss wrapper, where it counts
whole games), plus relay eval's episodes per second.
cost: async CartPole, W = 2, on Ray, for `--seconds` each, with `eval.every_iterations=10` and
without, alternating, `--repeats` times: env steps per second of each and their ratio (target:
with evaluation >= 95% of without).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import gymnasium as gym
import numpy as np

sys.path.insert(0, str(Path(__file__).parents[1]))
sys.path.insert(0, str(Path(__file__).parent))
from common import machine_header, read_metrics, run_training, table

ROOT = Path(__file__).parents[1]
os.environ.setdefault("SDL_VIDEODRIVER", "dummy")  # CartPole's renders need no display


def frames_of(env_id: str, n: int, **kwargs) -> list[np.ndarray]:
    env = gym.make(env_id, render_mode="rgb_array", **kwargs)
    env.reset(seed=0)
    out = []
    for _ in range(n):
        out.append(env.render())
        if any(env.step(env.action_space.sample())[2:4]):
            env.reset()
    env.close()
    return out


def encode_pyav(frames: list[np.ndarray], fps: float) -> bytes:
    import av

    with tempfile.NamedTemporaryFile(suffix=".mp4") as tmp:
        with av.open(tmp.name, "w", options={"movflags": "+faststart"}) as c:
            s = c.add_stream("libx264", rate=int(fps))
            s.height, s.width = frames[0].shape[:2]
            s.pix_fmt = "yuv420p"
            for f in frames:
                for p in s.encode(av.VideoFrame.from_ndarray(f, format="rgb24")):
                    c.mux(p)
            for p in s.encode():
                c.mux(p)
        return Path(tmp.name).read_bytes()


def bench_encode(repeats: int) -> str:
    import ale_py

    from relay_rl.rollout_workers.video import encode_mp4

    gym.register_envs(ale_py)
    sets = {
        "CartPole 600x400": frames_of("CartPole-v1", 1000),
        "Breakout 210x160": frames_of("ALE/Breakout-v5", 1000),
    }
    libs = {
        "imageio-ffmpeg (relay's)": lambda fr: encode_mp4(fr, 30, {}),
        "PyAV": lambda fr: encode_pyav(fr, 30),
    }
    rows = []
    for name, frames in sets.items():
        best: dict[str, tuple[float, int]] = {}
        for _ in range(repeats):
            for lib, fn in libs.items():
                t0 = time.perf_counter()
                data = fn(frames)
                dt = time.perf_counter() - t0
                if lib not in best or dt < best[lib][0]:
                    best[lib] = (dt, len(data))
        base = best["imageio-ffmpeg (relay's)"][0]
        rows += [[name, lib, dt, size // 1024, dt / base] for lib, (dt, size) in best.items()]
    return table(["frames", "library", "s per 1,000 frames", "KB", "time / imageio-ffmpeg"], rows)


def trained(config: str, sets: list[str], tmp: Path) -> Path:
    run = tmp / Path(config).stem
    cmd = [
        sys.executable,
        "-m",
        "relay_rl.services.train",
        config,
        "--run-dir",
        str(run),
        "--set",
        "metrics.progress=none",
        "--set",
        "rollout.num_workers=0",
    ]
    for kv in sets:
        cmd += ["--set", kv]
    run_training(cmd, ROOT)
    return run


class RelayForSB3:
    """relay's policy behind SB3's `predict` (what `evaluate_policy` calls): greedy, or sampled with
    the noise generator `relay eval --stochastic --seed S` seeds (both step every env each step,
    so the draws line up)."""

    def __init__(self, handle, space: gym.Space, stochastic: bool, seed: int) -> None:
        from relay_rl.rollout_workers.evaluation import EVAL_SEED_STREAM, model_act

        self.handle = handle
        self.space = space  # one env's action space
        self.act = model_act(handle.model, stochastic, seed + EVAL_SEED_STREAM)

    def predict(self, obs, state=None, episode_start=None, deterministic=True):
        from relay_rl.rollout_workers.envs import env_actions

        actions = self.act({"obs": np.asarray(obs)})[0]
        return env_actions(self.handle.env.action, self.space, actions), None


def monitored_env(ec):
    """One env of `ec` as relay builds it, with SB3's Monitor where it scores the whole episode:
    for Atari in place of relay's RecordEpisodeStatistics, under the life-loss and reward-clipping
    wrappers (so SB3 counts the true game, as relay does), elsewhere outermost."""
    from stable_baselines3.common.monitor import Monitor

    from relay_rl.rollout_workers.envs import make_env_fn

    env = make_env_fn(ec)()
    layer = env
    while isinstance(layer, gym.Wrapper):
        if isinstance(layer.env, gym.wrappers.RecordEpisodeStatistics):
            layer.env = Monitor(layer.env.env)
            return env
        layer = layer.env
    return Monitor(env)


def sb3_returns(run: Path, episodes: int, seed: int, stochastic: bool) -> tuple[float, float]:
    from stable_baselines3.common.evaluation import evaluate_policy
    from stable_baselines3.common.vec_env import DummyVecEnv

    from relay_rl.rollout_workers.envs import env_seeds
    from relay_rl.rollout_workers.evaluation import EVAL_SEED_STREAM, MAX_EVAL_ENVS
    from relay_rl.services.tools.evaluate import policy_file
    from relay_rl.services.tools.load import load_policy

    handle = load_policy(policy_file(run, best=False))
    n = min(episodes, MAX_EVAL_ENVS)
    ec = handle.config.env
    venv = DummyVecEnv([lambda: monitored_env(ec)] * n)
    venv._seeds = env_seeds(seed, 0, n, EVAL_SEED_STREAM)  # relay's evaluation seeds, one per env
    mean, std = evaluate_policy(
        RelayForSB3(handle, venv.action_space, stochastic, seed),
        venv,
        n_eval_episodes=episodes,
        deterministic=not stochastic,
    )
    return float(mean), float(std)


def relay_eval(run: Path, episodes: int, seed: int, stochastic: bool) -> dict:
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "relay_rl.services.cli",
            "eval",
            str(run),
            "--episodes",
            str(episodes),
            "--seed",
            str(seed),
            "--json",
            *(["--stochastic"] if stochastic else []),
        ],
        cwd=ROOT,
        check=True,
        capture_output=True,
        text=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def bench_sb3() -> str:
    runs = {
        "CartPole-v1": ("configs/cartpole_ppo.yaml", ["stop.env_steps=30000"], False),
        "Pendulum-v1": ("configs/pendulum_ppo.yaml", ["stop.env_steps=30000"], False),
        "Hopper-v5": ("configs/hopper_ppo.yaml", ["stop.env_steps=30000"], False),
        # Sampled actions and 2,000 frames (500 agent steps) a game: a briefly trained greedy
        # policy scores 0 (it never presses FIRE after a lost life) and plays out the time limit.
        "ALE/Breakout-v5": (
            "configs/breakout_ppo.yaml",
            ["stop.env_steps=20480", "env.max_episode_steps=2000"],
            True,
        ),
    }
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for env_id, (config, sets, stochastic) in runs.items():
            run = trained(config, sets, Path(tmp))
            ours = relay_eval(run, 10, 7, stochastic)
            mean, std = sb3_returns(run, 10, 7, stochastic)
            rows.append(
                [
                    env_id,
                    "sampled" if stochastic else "greedy",
                    ours["return_mean"],
                    ours["return_std"],
                    mean,
                    std,
                    "yes" if abs(mean - ours["return_mean"]) < 1e-6 else "NO",
                    ours["episodes_per_s"],
                ]
            )
    return table(
        [
            "env",
            "actions",
            "relay eval mean",
            "relay std",
            "SB3 evaluate_policy mean",
            "SB3 std",
            "same",
            "relay episodes/s",
        ],
        rows,
    )


def throughput(extra: list[str], seconds: float) -> float:
    with tempfile.TemporaryDirectory() as tmp:
        run = Path(tmp) / "run"
        cmd = [
            sys.executable,
            "-m",
            "relay_rl.services.train",
            "configs/cartpole_ppo.yaml",
            "--run-dir",
            str(run),
            "--set",
            "metrics.progress=none",
            "--set",
            "rollout.mode=async",
            "--set",
            "rollout.num_workers=2",
            "--set",
            "stop.env_steps=100000000",
            "--set",
            f"stop.wall_s={seconds}",
            "--set",
            "learner.lr_anneal=false",
        ]
        for kv in extra:
            cmd += ["--set", kv]
        run_training(cmd, ROOT)
        lines = read_metrics(run)
        evals = sum("eval_return_mean" in x for x in lines)
        # From the 10th line on: start-up and Ray's first calls are not what is compared.
        a, b = lines[min(10, len(lines) - 2)], lines[-1]
        rate = (b["env_steps"] - a["env_steps"]) / max(b["wall_s"] - a["wall_s"], 1e-9)
        print(
            f"  {'with' if extra else 'without'} evaluation: {rate:,.0f} env steps/s, {evals} evaluations",
            file=sys.stderr,
        )
        return rate


def bench_cost(seconds: float, repeats: int) -> str:
    on = ["eval.every_iterations=10", "eval.episodes=10"]
    with_eval, without = [], []
    for _ in range(repeats):
        without.append(throughput([], seconds))
        with_eval.append(throughput(on, seconds))
    ratio = statistics.median(with_eval) / statistics.median(without)
    rows = [
        ["without evaluation", statistics.median(without), 1.0, "-"],
        [
            "eval.every_iterations=10, 10 episodes",
            statistics.median(with_eval),
            ratio,
            "yes" if ratio >= 0.95 else "NO",
        ],
    ]
    return table(["async CartPole, W = 2", "env steps/s (median)", "ratio", ">= 0.95"], rows)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--only", choices=["encode", "sb3", "cost"])
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    print(machine_header("evaluation"))
    if args.only in (None, "encode"):
        print("\n" + bench_encode(args.repeats))
    if args.only in (None, "sb3"):
        print("\n" + bench_sb3())
    if args.only in (None, "cost"):
        print("\n" + bench_cost(args.seconds, args.repeats))


if __name__ == "__main__":
    main()
