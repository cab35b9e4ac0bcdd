"""What each copy's own fault guard costs a vector env: `RebuildOnRaise` (rollout_workers/env_guard.py)
around every copy of a SyncVectorEnv, against the bare copies, side by side in one run.

The guard lets a copy whose step raises rebuild itself alone (it used to cost every copy's episode).
Its price is one more Python call per copy per step, largest for the cheapest envs. Rounds
alternate bare and guarded, and the table gives each one's median env steps/s and their ratio.

    python benchmarks/env_guard.py [--envs CartPole-v1,Acrobot-v1] [--copies 16] [--steps 2000] [--rounds 15]
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time
from functools import partial

import gymnasium as gym

from relay_rl.rollout_workers.env_guard import RebuildOnRaise


def vector(env_id: str, copies: int, guarded: bool) -> gym.vector.VectorEnv:
    make = partial(gym.make, env_id)
    fns = [partial(RebuildOnRaise, make) if guarded else make for _ in range(copies)]
    return gym.vector.SyncVectorEnv(fns, autoreset_mode=gym.vector.AutoresetMode.SAME_STEP, copy=False)


def steps_per_s(env: gym.vector.VectorEnv, steps: int) -> float:
    env.reset(seed=0)
    space = env.action_space
    space.seed(0)
    actions = [space.sample() for _ in range(steps)]
    t0 = time.perf_counter()
    for a in actions:
        env.step(a)
    return steps * env.num_envs / (time.perf_counter() - t0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--envs", default="CartPole-v1,Acrobot-v1")
    parser.add_argument("--copies", type=int, default=16)
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args()
    print(
        f"# env guard cost  {platform.processor() or platform.machine()}  {time.strftime('%Y-%m-%d %H:%M')}"
    )
    print(
        f"# {args.copies} copies, {args.steps} vector steps a round, {args.rounds} rounds each, alternating"
    )
    header = f"| {'env':>12} | {'bare steps/s':>12} | {'guarded steps/s':>15} | {'guarded / bare':>14} |"
    print(header)
    print("|" + "|".join("-" * (len(c)) for c in header.split("|")[1:-1]) + "|")
    for env_id in args.envs.split(","):
        bare, guarded = vector(env_id, args.copies, False), vector(env_id, args.copies, True)
        rates: dict[bool, list[float]] = {False: [], True: []}
        for _ in range(args.rounds):
            for which, env in ((False, bare), (True, guarded)):
                rates[which].append(steps_per_s(env, args.steps))
        b, g = statistics.median(rates[False]), statistics.median(rates[True])
        print(f"| {env_id:>12} | {b:12,.0f} | {g:15,.0f} | {g / b:14.3f} |")
        bare.close()
        guarded.close()


if __name__ == "__main__":
    main()
