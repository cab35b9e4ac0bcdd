"""GRPO results: the token task and CartPole, and GRPO's memory/parameters next to PPO's.

    python benchmarks/grpo.py [--max-wall 600]

Runs (seed 0, through Ray actors, 2 rollout workers):
  reverse_digits_grpo  until the mean verifier reward of an update's episodes reaches 0.9;
  cartpole_grpo        until episode_return_mean (last 20 episodes) reaches 475;
  cartpole_ppo         the same target, for the memory and parameter comparison.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
from common import machine_header, table, train_relay

ROOT = Path(__file__).parents[1]


def first(lines: list[dict[str, Any]], key: str, target: float) -> dict[str, Any] | None:
    return next((x for x in lines if (x.get(key) or -1e9) >= target), None)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-wall", type=float, default=600.0)
    args = parser.parse_args()
    wall = f"stop.wall_s={args.max_wall}"
    token = train_relay(
        "configs/reverse_digits_grpo.yaml", [wall, "stop.episode_return_mean=null", "stop.env_steps=100000"]
    )
    token_hit = first(token, "group_reward_mean", 0.9)
    grpo = train_relay("configs/cartpole_grpo.yaml", [wall])
    ppo = train_relay("configs/cartpole_ppo.yaml", [wall])

    print(machine_header("GRPO (seed 0, 2 rollout workers, learner on cpu)"))
    print("\n## ReverseDigits (length 5, vocab 5): mean verifier reward per update, random policy = 0.2")
    rows = []
    for x in token:
        if x["iteration"] in (1, 10, 25, 50, 100, 150, 200, 300) or x is token_hit:
            rows.append([x["iteration"], x["env_steps"], x["wall_s"], x["group_reward_mean"], x["kl_ref"]])
    print(table(["iteration", "env steps", "wall s", "reward mean", "kl_ref"], rows))
    print(
        f"reached 0.9: {'yes' if token_hit else 'NO'}"
        + (f" at {token_hit['env_steps']:,} env steps, {token_hit['wall_s']:.1f} s" if token_hit else "")
    )

    print("\n## CartPole-v1 to episode_return_mean >= 475: GRPO vs PPO")
    rows = []
    for name, lines in (("grpo", grpo), ("ppo", ppo)):
        hit = first(lines, "episode_return_mean", 475.0)
        last = lines[-1]
        rows.append(
            [
                name,
                "yes" if hit else "NO",
                (hit or last)["env_steps"],
                (hit or last)["wall_s"],
                last["parameters"],
                last["learner_state_bytes"] / 1024,
                max(x["host_memory_peak_bytes"] for x in lines) / 2**20,
                max(x["device_memory_peak_bytes"] for x in lines) / 2**20,
            ]
        )
    print(
        table(
            [
                "algo",
                "solved",
                "env steps",
                "wall s",
                "parameters",
                "learner state KiB",
                "learner peak RSS MiB",
                "device peak MiB",
            ],
            rows,
        )
    )


if __name__ == "__main__":
    main()
