"""Real workloads, side by side in one run each: env stepping ceilings, MuJoCo against SB3 at equal
wall time, Atari throughput against RLlib and SB3, and Breakout learning.

    pip install -e ".[cpu,dev,bench]" && pip install "ray[rllib]==2.60.0"   # RLlib: gymnasium 1.2.2
    python benchmarks/workloads.py ceilings [--seconds 5]
    python benchmarks/workloads.py mujoco [--envs hopper,halfcheetah] [--seeds 0,1,2] [--steps 1000000]
    python benchmarks/workloads.py atari-throughput [--seconds 30] [--others rllib,sb3]
    python benchmarks/workloads.py atari-learning [--wall 1800] [--device cpu|cuda|npu]

Each section prints its table; every system runs alone, one after another, on this machine.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from common import machine_header, rllib_ppo_update, sampling_rate, table, train_relay

ROOT = Path(__file__).parents[1]
WINDOW = 20
MUJOCO = {
    "hopper": ("Hopper-v5", "configs/hopper_ppo.yaml"),
    "halfcheetah": ("HalfCheetah-v5", "configs/halfcheetah_ppo.yaml"),
}
# rl-baselines3-zoo's ppo.yml for these envs (tuned on their -v3 versions), with VecNormalize.
SB3_MUJOCO: dict[str, dict[str, Any]] = {
    "hopper": dict(
        batch_size=32,
        n_steps=512,
        gamma=0.999,
        learning_rate=9.80828e-05,
        ent_coef=0.00229519,
        clip_range=0.2,
        n_epochs=5,
        gae_lambda=0.99,
        max_grad_norm=0.7,
        vf_coef=0.835671,
    ),
    "halfcheetah": dict(
        batch_size=64,
        n_steps=512,
        gamma=0.98,
        learning_rate=2.0633e-05,
        ent_coef=0.000401762,
        clip_range=0.1,
        n_epochs=20,
        gae_lambda=0.92,
        max_grad_norm=0.8,
        vf_coef=0.58096,
    ),
}


# ---- 1. env stepping ceilings ------------------------------------------------------------------
def _stepper(env_id: str, backend: str, num_envs: int) -> tuple[Any, Callable[[], np.ndarray]]:
    from relay_rl.contracts.config import EnvConfig
    from relay_rl.rollout_workers.vector_backends import make_vector_env

    preprocess = "atari" if env_id.startswith("ALE/") else "none"
    env = make_vector_env(
        EnvConfig(id=env_id, num_envs=num_envs, vectorization=backend, preprocess=preprocess)
    )
    env.reset(seed=list(range(num_envs)))
    space = env.single_action_space
    rng = np.random.default_rng(0)
    if hasattr(space, "n"):
        return env, lambda: rng.integers(0, int(space.n), num_envs)
    return env, lambda: rng.uniform(space.low, space.high, (num_envs, *space.shape)).astype(np.float32)


def _steps_per_s(env: Any, actions: Callable[[], np.ndarray], num_envs: int, seconds: float) -> float:
    """Env steps/s of `env` stepped with `actions()` for `seconds`."""
    steps, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        env.step(actions())
        steps += num_envs
    return steps / (time.perf_counter() - t0)


def ceilings(seconds: float) -> None:
    rows = []
    for env_id in ("CartPole-v1", "Hopper-v5", "ALE/Breakout-v5"):
        rates = {}
        for backend in ("sync", "async", "envpool"):
            env, actions = _stepper(env_id, backend, 8)
            for _ in range(20):
                env.step(actions())
            rates[backend] = _steps_per_s(env, actions, 8, seconds)
            env.close()
        rows.append(
            [
                env_id,
                rates["sync"],
                rates["async"],
                rates["envpool"],
                f"{rates['envpool'] / rates['async']:.1f}x",
            ]
        )
    print(
        machine_header(
            "env stepping ceilings: 8 envs, random actions, agent steps/s (Breakout: atari preprocessing)"
        )
    )
    print(table(["env", "gymnasium sync", "gymnasium async", "envpool", "envpool / async"], rows))


# ---- 2. MuJoCo: relay vs SB3 at equal wall time -----------------------------------------------
def _last_mean(returns: list[float]) -> float | None:
    tail = returns[-WINDOW:]
    return sum(tail) / len(tail) if tail else None


def _sb3_mujoco(key: str, seed: int, wall: float) -> tuple[float | None, int]:
    """SB3 PPO with rl-zoo's hyperparameters for `wall` seconds: (mean of the last 20 returns, steps)."""
    import torch
    from stable_baselines3 import PPO
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.vec_env import VecNormalize

    class Budget(BaseCallback):
        def __init__(self) -> None:
            super().__init__()
            self.returns: list[float] = []
            self.t0 = time.perf_counter()

        def _on_step(self) -> bool:
            self.returns += [i["episode"]["r"] for i in self.locals["infos"] if "episode" in i]
            return time.perf_counter() - self.t0 < wall

    env = VecNormalize(make_vec_env(MUJOCO[key][0], n_envs=1, seed=seed))
    kwargs = dict(
        log_std_init=-2,
        ortho_init=False,
        activation_fn=torch.nn.ReLU,
        net_arch=dict(pi=[256, 256], vf=[256, 256]),
    )
    model = PPO("MlpPolicy", env, seed=seed, device="cpu", verbose=0, policy_kwargs=kwargs, **SB3_MUJOCO[key])
    budget = Budget()
    model.learn(total_timesteps=10**8, callback=budget)
    return _last_mean(budget.returns), model.num_timesteps


def mujoco(keys: list[str], seeds: list[int], steps: int, extra: list[str]) -> None:
    rows = []
    for key in keys:
        for seed in seeds:
            lines = train_relay(MUJOCO[key][1], [f"env.seed={seed}", f"stop.env_steps={steps}", *extra])
            wall = lines[-1]["wall_s"]
            relay_ret = lines[-1]["episode_return_mean"]
            print(
                f"... relay {key} seed {seed}: {relay_ret:.0f} in {wall:.0f}s; SB3 gets the same wall",
                file=sys.stderr,
            )
            sb3_ret, sb3_steps = _sb3_mujoco(key, seed, wall)
            rows.append(
                [
                    key,
                    seed,
                    lines[-1]["env_steps"],
                    wall,
                    wall * 1e6 / lines[-1]["env_steps"] / 60,
                    relay_ret,
                    sb3_steps,
                    sb3_ret,
                ]
            )
    print(machine_header(f"MuJoCo PPO: relay to {steps:,} env steps (T s), SB3 PPO (rl-zoo) for the same T"))
    headers = [
        "env",
        "seed",
        "relay steps",
        "T s",
        "relay min/1M",
        "relay return",
        "sb3 steps in T",
        "sb3 return",
    ]
    print(table(headers, rows))
    for key in keys:
        mine = [r for r in rows if r[0] == key]
        print(
            f"{key}: relay mean {np.mean([r[5] for r in mine]):.0f} (min {min(r[5] for r in mine):.0f}), "
            f"sb3 mean {np.mean([r[7] or 0 for r in mine]):.0f}, "
            f"relay wall per 1M {np.mean([r[4] for r in mine]):.1f} min"
        )


# ---- 3. Atari throughput -----------------------------------------------------------------------
ATARI_SETS = ["env.vectorization=envpool", "rollout.num_workers=2"]


def _relay_sampling(seconds: float, extra: list[str]) -> float:
    """RolloutWorker.sample() alone, 2 workers, CNN acting on the CPU, segments through Ray."""
    import ray

    from relay_rl.contracts.config import load_config

    cfg = load_config(ROOT / "configs/breakout_ppo.yaml", [*ATARI_SETS, *extra])
    ray.init(address="local", num_cpus=3, include_dashboard=False, log_to_driver=False)
    try:
        return sampling_rate(cfg, 2, seconds, in_flight=1, num_cpus=1)
    finally:
        ray.shutdown()


def _update_breakdown(extra: list[str]) -> tuple[float, int, dict[str, float]]:
    """One Breakout update in-process: learner samples/s, its torch threads and ms per minibatch
    by phase."""
    import torch

    from relay_rl.contracts.config import load_config
    from relay_rl.learner.algorithms import algorithm_traits
    from relay_rl.learner.learner import Learner
    from relay_rl.rollout_workers.sampler import make_sampler

    cfg = load_config(
        ROOT / "configs/breakout_ppo.yaml",
        ["env.vectorization=envpool", *extra, "rollout.num_workers=0", "learner.buffer_size=1024"],
    )
    torch.set_num_threads(cfg.learner.num_cpus)  # the learner actor's threads (learner.num_cpus)
    sampler = make_sampler(cfg, algorithm_traits(cfg))
    learner = Learner(cfg, sampler.spec)
    seg = sampler.sample()
    learner.train_round([seg])  # warm-up
    t0 = time.perf_counter()
    learner.train_round([seg])
    samples_per_s = cfg.learner.epochs * cfg.segment_steps / (time.perf_counter() - t0)
    obs = torch.from_numpy(seg["obs"][:64].reshape(-1, *sampler.spec.obs_shape)[: cfg.learner.batch_size])
    actions = torch.from_numpy(seg["actions"][:64].reshape(-1)[: cfg.learner.batch_size])
    model, opt = learner.model, learner.optimizer
    phases = {"forward (frames converted inside)": 0.0, "backward": 0.0, "optimizer": 0.0}
    reps = 5
    for _ in range(reps):
        t = time.perf_counter()
        loss = model.evaluate(obs, actions).logp.mean()
        phases["forward (frames converted inside)"] += time.perf_counter() - t
        t = time.perf_counter()
        loss.backward()
        phases["backward"] += time.perf_counter() - t
        t = time.perf_counter()
        opt.step()
        opt.zero_grad()
        phases["optimizer"] += time.perf_counter() - t
    return samples_per_s, torch.get_num_threads(), {k: v / reps * 1e3 for k, v in phases.items()}


def _worker_split(seconds: float, extra: list[str]) -> dict[str, float]:
    """One rollout worker's sampling in this process on one torch thread (as its actor has), no
    Ray: seconds per 1,000 env steps of its sample() and of stepping its envs alone with random
    actions (the rest is acting: the CNN's forward and the distribution, and recording)."""
    import torch

    from relay_rl.contracts.config import load_config
    from relay_rl.learner.algorithms import algorithm_traits
    from relay_rl.rollout_workers.sampler import make_sampler

    cfg = load_config(ROOT / "configs/breakout_ppo.yaml", [*ATARI_SETS, *extra])
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        sampler = make_sampler(cfg, algorithm_traits(cfg))
        sampler.sample()  # warm-up: envs reset, first forward
        steps, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            sampler.sample()
            steps += cfg.rollout.rollout_len * cfg.env.num_envs
        sample = (time.perf_counter() - t0) / steps * 1000
    finally:
        torch.set_num_threads(threads)
    env, actions = _stepper(cfg.env.id, "envpool", cfg.env.num_envs)
    env_s = 1000 / _steps_per_s(env, actions, cfg.env.num_envs, seconds)
    env.close()
    return {"sample": sample, "env": env_s}


def _relay_training(seconds: float, extra: list[str]) -> list[dict[str, Any]]:
    return train_relay(
        "configs/breakout_ppo.yaml",
        [*ATARI_SETS, "stop.env_steps=100000000", f"stop.wall_s={seconds}", *extra],
    )


def _relay_split(lines: list[dict[str, Any]]) -> dict[str, float]:
    """Seconds per 1,000 env steps of a relay run after its first line (the first round holds the
    first resets and, compiled, the compile): wall, and the learner's phases (contracts.metrics
    PHASES: waiting for segments, ingest, update, publish); the whole run when it has one line."""
    from relay_rl.contracts.metrics import PHASES

    first, steady = (lines[0], lines[1:]) if len(lines) > 1 else ({"env_steps": 0, "wall_s": 0.0}, lines)
    per_k = 1000 / (lines[-1]["env_steps"] - first["env_steps"])
    split = {"wall": (lines[-1]["wall_s"] - first["wall_s"]) * per_k}
    split.update({k: sum(x.get(k, 0.0) for x in steady) * per_k for k in PHASES})
    return split


def _rllib_atari(seconds: float) -> float:
    """RLlib PPO (new API stack), 2 env runners x 8 envs, its Atari stack and the Nature CNN, the
    same update as relay's (2,048 steps, minibatches of 512, 4 epochs)."""
    import gymnasium as gym
    import ray
    from ray.rllib.algorithms.ppo import PPOConfig
    from ray.rllib.env.wrappers.atari_wrappers import wrap_atari_for_new_api_stack
    from ray.tune.registry import register_env

    def make(cfg: dict) -> gym.Env:
        import ale_py

        gym.register_envs(ale_py)
        return wrap_atari_for_new_api_stack(
            gym.make("ALE/Breakout-v5", frameskip=1, repeat_action_probability=0.0), framestack=4
        )

    ray.init(address="local", num_cpus=3, include_dashboard=False, log_to_driver=False)
    try:
        register_env("breakout", make)
        cfg = (
            PPOConfig()
            .environment("breakout")
            .env_runners(num_env_runners=2, num_envs_per_env_runner=8)
            .training(**rllib_ppo_update("configs/breakout_ppo.yaml"))
            .rl_module(
                model_config={
                    "conv_filters": [[32, 8, 4], [64, 4, 2], [64, 3, 1]],
                    "head_fcnet_hiddens": [512],
                }
            )
        )
        algo = cfg.build_algo()
        t0, steps = time.perf_counter(), 0
        while time.perf_counter() - t0 < seconds:
            result = algo.train()
            steps = int(result.get("env_runners", {}).get("num_env_steps_sampled_lifetime", 0))
        return steps / (time.perf_counter() - t0)
    finally:
        ray.shutdown()


def _sb3_atari(seconds: float) -> tuple[float, list[tuple[int, float]], dict[str, float]]:
    """SB3 PPO CnnPolicy, 8 envs, rl-zoo's Atari settings; (steps/s, [(steps, mean return)],
    seconds per 1,000 env steps: rollouts and wall)."""
    import ale_py
    import gymnasium as gym
    from stable_baselines3 import PPO
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.env_util import make_atari_env
    from stable_baselines3.common.vec_env import VecFrameStack

    gym.register_envs(ale_py)
    curve: list[tuple[int, float]] = []
    rollout_s = [0.0]  # seconds in collect_rollouts (acting and env steps); the rest is the update

    class Budget(BaseCallback):
        def __init__(self) -> None:
            super().__init__()
            self.recent: deque[float] = deque(maxlen=WINDOW)
            self.t0 = time.perf_counter()

        def _on_rollout_start(self) -> None:
            self.rollout_t0 = time.perf_counter()

        def _on_rollout_end(self) -> None:
            rollout_s[0] += time.perf_counter() - self.rollout_t0

        def _on_step(self) -> bool:
            for info in self.locals["infos"]:
                if "episode" in info:
                    self.recent.append(info["episode"]["r"])
                    curve.append((self.num_timesteps, float(np.mean(self.recent))))
            return time.perf_counter() - self.t0 < seconds

    # frameskip=1: ALE v5 skips 4 frames itself and SB3's AtariWrapper skips 4 more; relay's
    # Atari stack (and the published baselines) skip 4 in all.
    env = VecFrameStack(
        make_atari_env(
            "ALE/Breakout-v5", n_envs=8, seed=0, env_kwargs={"repeat_action_probability": 0.0, "frameskip": 1}
        ),
        n_stack=4,
    )
    model = PPO(
        "CnnPolicy",
        env,
        n_steps=128,
        batch_size=256,
        n_epochs=4,
        learning_rate=2.5e-4,
        clip_range=0.1,
        ent_coef=0.01,
        vf_coef=0.5,
        device="cpu",
        seed=0,
        verbose=0,
    )
    budget = Budget()
    model.learn(total_timesteps=10**9, callback=budget)
    wall = time.perf_counter() - budget.t0
    per_k = 1000 / model.num_timesteps
    return model.num_timesteps / wall, curve, {"rollouts": rollout_s[0] * per_k, "wall": wall * per_k}


def atari_throughput(seconds: float, others: list[str], extra: list[str]) -> None:
    sampling = _relay_sampling(seconds, extra)
    worker = _worker_split(min(seconds, 10.0), extra)
    learner_sps, threads, phases = _update_breakdown(extra)
    lines = _relay_training(seconds, extra)
    training, split = lines[-1]["env_steps_per_s"], _relay_split(lines)
    rllib = _rllib_atari(seconds) if "rllib" in others else None
    sb3, _, sb3_split = _sb3_atari(seconds) if "sb3" in others else (None, [], {})
    print(machine_header(f"Breakout throughput, W = 2 x 8 envs, {seconds:.0f} s each, env (agent) steps/s"))
    rows = [
        ["relay sampling (CNN acting, envpool)", sampling],
        ["relay end to end", training],
        ["RLlib PPO", rllib],
        ["SB3 PPO CnnPolicy", sb3],
    ]
    print(table(["system", "steps/s"], [r for r in rows if r[1] is not None]))
    ratios = [f"/ {name} = {training / v:.2f}x" for name, v in (("RLlib", rllib), ("SB3", sb3)) if v]
    if ratios:
        print("relay end to end " + ", ".join(ratios))
    print(
        f"relay learner alone ({threads} torch threads, learner.num_cpus): "
        f"{learner_sps:,.0f} samples/s (4 epochs of 512-sample minibatches); "
        "ms per 512-sample minibatch: " + ", ".join(f"{k} {v:.1f}" for k, v in phases.items())
    )
    print()
    print(time_split(split, sampling, worker, sb3_split))


def time_split(
    relay: dict[str, float], sampling: float, worker: dict[str, float], sb3: dict[str, float]
) -> str:
    """Where a sync Breakout round's time goes, in seconds per 1,000 env steps: relay's run (its
    learner's phases), its sampling measured alone (through Ray; one worker in process, env
    stepping apart from acting), and SB3's rollouts apart from its update."""
    workers = int(ATARI_SETS[1].split("=")[1])
    learner = relay["ingest_s"] + relay["update_s"] + relay["publish_s"]
    acting = (worker["sample"] - worker["env"]) / workers
    rows = [
        ["relay end to end (after the first line)", relay["wall"], ""],
        ["- learner waits for the round's segments", relay["wait_s"], "workers sample, segments travel"],
        ["  - sampling alone, 2 workers through Ray", 1000 / sampling, "nobody learning"],
        ["    - env steps (envpool, random actions)", worker["env"] / workers, "1 worker in process / 2"],
        ["    - acting and recording", acting, "1 worker in process / 2"],
        ["  - the rest of the wait", relay["wait_s"] - 1000 / sampling, "transfer, workers' Ray overhead"],
        ["- learner ingest + update + publish", learner, f"update {relay['update_s']:.2f}"],
        ["- the rest (driver, metrics)", relay["wall"] - relay["wait_s"] - learner, ""],
    ]
    if sb3:
        rows += [
            ["SB3 end to end", sb3["wall"], ""],
            ["- rollouts (acting, env steps)", sb3["rollouts"], ""],
            ["- update", sb3["wall"] - sb3["rollouts"], ""],
        ]
    return "where the time goes, s per 1,000 env steps\n" + table(
        ["phase", "s / 1k steps", "how"], [[name, f"{v:.3f}", how] for name, v, how in rows]
    )


# ---- 4. Breakout learning --------------------------------------------------------------------------
def atari_learning(wall: float, device: str, extra: list[str]) -> None:
    sets = [*ATARI_SETS, f"learner.device={device}", "stop.env_steps=100000000", f"stop.wall_s={wall}"]
    sets += extra
    lines = train_relay("configs/breakout_ppo.yaml", sets)
    _, sb3_curve, _ = _sb3_atari(wall)
    print(
        machine_header(
            f"Breakout learning, {wall:.0f} s budget each (relay on {device}; SB3 on cpu), "
            "mean of the last 20 games"
        )
    )
    marks = [0.1, 0.25, 0.5, 0.75, 1.0]
    rows = []
    for frac in marks:
        rec = next((x for x in lines if x["wall_s"] >= frac * wall), lines[-1])
        sb3 = sb3_curve or [(0, None)]
        rows.append(
            [
                f"{frac * wall:.0f}",
                rec["env_steps"],
                rec["episode_return_mean"],
                sb3[min(int(frac * len(sb3)), len(sb3) - 1)][0],
                sb3[min(int(frac * len(sb3)), len(sb3) - 1)][1],
            ]
        )
    print(table(["wall s", "relay env steps", "relay return", "sb3 env steps", "sb3 return"], rows))


# The flags each section reads; a flag given to a section that does not read it is refused (a table
# printed "as if" a flag applied would be a wrong measurement).
SECTION_FLAGS = {
    "ceilings": {"seconds"},
    "mujoco": {"envs", "seeds", "steps", "relay_set"},
    "atari-throughput": {"seconds", "others", "relay_set"},
    "atari-learning": {"wall", "device", "relay_set"},
}
DEFAULTS = {
    "seconds": 30.0,
    "envs": "hopper,halfcheetah",
    "seeds": "0,1,2",
    "steps": 1_000_000,
    "wall": 1800.0,
    "device": "cpu",
    "relay_set": [],
    "others": "rllib,sb3",
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("section", choices=list(SECTION_FLAGS))
    parser.add_argument("--seconds", type=float, help="ceilings, atari-throughput: seconds per measurement")
    parser.add_argument("--envs", help="mujoco: env keys")
    parser.add_argument("--seeds", help="mujoco: seeds")
    parser.add_argument("--steps", type=int, help="mujoco: env steps per run")
    parser.add_argument("--wall", type=float, help="atari-learning: seconds per system")
    parser.add_argument("--device", help="atari-learning: relay's learner device")
    parser.add_argument("--relay-set", action="append", help="mujoco, atari-*: extra --set for relay runs")
    parser.add_argument("--others", help="atari-throughput: the other systems to run")
    args = parser.parse_args()
    unread = sorted(k for k, v in vars(args).items() if k != "section" and v is not None)
    unread = [k for k in unread if k not in SECTION_FLAGS[args.section]]
    if unread:
        flags = ", ".join("--" + k.replace("_", "-") for k in unread)
        reads = ", ".join("--" + k.replace("_", "-") for k in sorted(SECTION_FLAGS[args.section]))
        print(f"workloads.py: {flags} does not apply to {args.section} (it reads {reads})", file=sys.stderr)
        sys.exit(2)
    for key, value in DEFAULTS.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    os.environ.setdefault("PYTHONWARNINGS", "ignore")
    if args.section == "ceilings":
        ceilings(min(args.seconds, 10.0))
    elif args.section == "mujoco":
        mujoco(args.envs.split(","), [int(s) for s in args.seeds.split(",")], args.steps, args.relay_set)
    elif args.section == "atari-throughput":
        atari_throughput(args.seconds, [o for o in args.others.split(",") if o], args.relay_set)
    else:
        atari_learning(args.wall, args.device, args.relay_set)


if __name__ == "__main__":
    main()
