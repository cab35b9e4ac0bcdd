"""Structured spaces, side by side in one run: relay vs Stable-Baselines3 on MiniGrid (Dict
observations) and Taxi (action masks), env steps and wall to a target.

    pip install -e ".[cpu,bench,minigrid]"
    python benchmarks/spaces.py [--only minigrid5,minigrid8,taxi] [--max-wall 900] [--sb3 zoo,image]

MiniGrid-DoorKey-5x5-v0 and -8x8-v0 to a mean return of 0.9: relay on the Dict observation as the
env gives it (configs/minigrid_doorkey_ppo.yaml, configs/minigrid_doorkey8_ppo.yaml); SB3 PPO the
way rl-baselines3-zoo runs MiniGrid (FlatObsWrapper, MlpPolicy, its settings) and on the image
alone (ImgObsWrapper) with relay's settings.
Taxi-v4 to a mean return >= 0 (random play is about -770): relay with the env's masks
(configs/taxi_ppo.yaml, env.action_mask=auto), relay without them (env.action_mask=none), and
sb3-contrib's MaskablePPO with the same masks. Every system runs in this process's machine one
after another, seed 0, local mode for relay (one process, as SB3); wall counts from the first env
step.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
from common import machine_header, sb3_learn_until, table, train_relay


@dataclass(frozen=True)
class Task:
    key: str
    env_id: str
    target: float
    max_steps: int


TASKS = {
    "minigrid5": Task("minigrid5", "MiniGrid-DoorKey-5x5-v0", 0.9, 1_000_000),
    "minigrid8": Task("minigrid8", "MiniGrid-DoorKey-8x8-v0", 0.9, 3_000_000),
    "taxi": Task("taxi", "Taxi-v4", 0.0, 1_000_000),
}


@dataclass
class Outcome:
    task: str
    system: str
    solved: bool
    wall_s: float
    env_steps: int
    final_return: float | None


def run_relay(task: Task, config: str, max_wall: float, extra: list[str], name: str) -> Outcome:
    sets = [
        "rollout.num_workers=0",
        f"stop.episode_return_mean={task.target}",
        f"stop.env_steps={task.max_steps}",
        f"stop.wall_s={max_wall}",
        *extra,
    ]
    lines = train_relay(config, sets)
    hit = next((x for x in lines if (x["episode_return_mean"] or -1e9) >= task.target), None)
    last = hit or lines[-1]
    return Outcome(
        task.key, name, hit is not None, last["wall_s"], last["env_steps"], last["episode_return_mean"]
    )


def run_sb3_minigrid_image(task: Task, max_wall: float) -> Outcome:
    """SB3 PPO on the image alone (ImgObsWrapper, MlpPolicy: the 7x7x3 view flattened) with relay's
    settings of the shipped config: 16 envs x 128 steps, 4 epochs of 256, lr 5e-4, entropy 0.01,
    [128, 128] trunks. No VecNormalize: on these images (mostly constant pixels) it stalls SB3 at
    a mean return of 0.00 (measured: 59,408 steps in 60 s, 0.00; without it 0.13 at 47,120)."""
    import gymnasium as gym
    import minigrid
    from minigrid.wrappers import ImgObsWrapper
    from stable_baselines3 import PPO
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.vec_env import VecNormalize

    gym.register_envs(minigrid)
    env = VecNormalize(
        make_vec_env(task.env_id, n_envs=16, seed=0, wrapper_class=ImgObsWrapper), norm_reward=False
    )
    model = PPO(
        "MlpPolicy",
        env,
        n_steps=128,
        batch_size=256,
        n_epochs=4,
        learning_rate=5e-4,
        gamma=0.99,
        gae_lambda=0.95,
        ent_coef=0.01,
        policy_kwargs={"net_arch": [128, 128]},
        seed=0,
        device="cpu",
        verbose=0,
    )
    solved, wall, steps, final = sb3_learn_until(model, task.target, max_wall, task.max_steps)
    return Outcome(task.key, "sb3 PPO (ImgObsWrapper, relay's settings)", solved, wall, steps, final)


def run_sb3_minigrid(task: Task, max_wall: float) -> Outcome:
    import gymnasium as gym
    import minigrid
    from minigrid.wrappers import FlatObsWrapper
    from stable_baselines3 import PPO
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.vec_env import VecNormalize

    gym.register_envs(minigrid)
    # rl-baselines3-zoo's MiniGrid settings (hyperparams/ppo.yml): FlatObsWrapper (the view and
    # the mission one-hot per character), VecNormalize, 8 envs x 128 steps, 10 epochs of 64.
    env = make_vec_env(task.env_id, n_envs=8, seed=0, wrapper_class=FlatObsWrapper)
    env = VecNormalize(env, norm_reward=False)
    model = PPO(
        "MlpPolicy",
        env,
        n_steps=128,
        batch_size=64,
        gae_lambda=0.95,
        gamma=0.99,
        n_epochs=10,
        ent_coef=0.0,
        learning_rate=2.5e-4,
        clip_range=0.2,
        seed=0,
        device="cpu",
        verbose=0,
    )
    solved, wall, steps, final = sb3_learn_until(model, task.target, max_wall, task.max_steps)
    return Outcome(task.key, "sb3 PPO (FlatObsWrapper)", solved, wall, steps, final)


def run_maskable_ppo(task: Task, max_wall: float) -> Outcome:
    import gymnasium as gym
    from sb3_contrib import MaskablePPO
    from sb3_contrib.common.wrappers import ActionMasker
    from stable_baselines3.common.env_util import make_vec_env

    def masks(env: Any) -> Any:
        base = env.unwrapped
        return base.action_mask(base.s)

    def wrap(env: gym.Env) -> gym.Env:
        return ActionMasker(env, masks)

    env = make_vec_env(task.env_id, n_envs=16, seed=0, wrapper_class=wrap)
    # relay's Taxi settings (configs/taxi_ppo.yaml): 16 envs x 64 steps, 4 epochs of 256.
    model = MaskablePPO(
        "MlpPolicy",
        env,
        n_steps=64,
        batch_size=256,
        n_epochs=4,
        learning_rate=1e-3,
        gamma=0.99,
        gae_lambda=0.95,
        ent_coef=0.01,
        policy_kwargs={"net_arch": [64, 64]},
        seed=0,
        device="cpu",
        verbose=0,
    )
    solved, wall, steps, final = sb3_learn_until(model, task.target, max_wall, task.max_steps)
    return Outcome(task.key, "sb3-contrib MaskablePPO", solved, wall, steps, final)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="minigrid5,minigrid8,taxi")
    parser.add_argument("--max-wall", type=float, default=900.0)
    parser.add_argument("--sb3", default="zoo,image", help="MiniGrid's SB3 setups: zoo, image")
    args = parser.parse_args()
    outcomes: list[Outcome] = []
    for key in args.only.split(","):
        task = TASKS[key]
        print(f"... {task.env_id}", file=sys.stderr, flush=True)
        t0 = time.perf_counter()
        if key.startswith("minigrid"):
            config = (
                "configs/minigrid_doorkey_ppo.yaml"
                if key == "minigrid5"
                else "configs/minigrid_doorkey8_ppo.yaml"
            )
            outcomes.append(run_relay(task, config, args.max_wall, [], "relay (Dict observation)"))
            if "zoo" in args.sb3:
                outcomes.append(run_sb3_minigrid(task, args.max_wall))
            if "image" in args.sb3:
                outcomes.append(run_sb3_minigrid_image(task, args.max_wall))
        else:
            outcomes.append(
                run_relay(task, "configs/taxi_ppo.yaml", args.max_wall, [], "relay, masks (auto)")
            )
            outcomes.append(
                run_relay(
                    task, "configs/taxi_ppo.yaml", args.max_wall, ["env.action_mask=none"], "relay, no masks"
                )
            )
            outcomes.append(run_maskable_ppo(task, args.max_wall))
        print(f"    {time.perf_counter() - t0:.0f} s", file=sys.stderr, flush=True)
    print(machine_header("structured spaces: env steps and wall to the target (seed 0)"))
    rows = []
    for o in outcomes:
        relay = next(r for r in outcomes if r.task == o.task)
        ratio = relay.wall_s / o.wall_s if relay.solved and o.solved and o is not relay else None
        rows.append(
            [
                TASKS[o.task].env_id,
                o.system,
                "yes" if o.solved else "NO",
                o.env_steps,
                o.wall_s,
                o.final_return,
                ratio,
            ]
        )
    print(table(["env", "system", "reached", "env steps", "wall s", "return", "relay wall / this"], rows))


if __name__ == "__main__":
    main()
