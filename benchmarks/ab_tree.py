"""Env steps/s of this tree against an older commit of relay, in one run, alternating.

    python benchmarks/ab_tree.py [--base ac3f926] [--seconds 40] [--rounds 2] [--only cartpole|breakout|lm]

The older commit is checked out into a temporary git worktree and run from there with its own
module layout (before `relay_rl` it was `services.train`); both run the same shipped configs with
the same settings: CartPole in async mode (4 rollout workers), Breakout in sync mode (the
shipped config) and the tiny LM task (configs/tiny_lm_grpo.yaml as shipped, its learner and reward
actor on a local Ray; its env steps are completion tokens; `python benchmarks/tiny_lm.py` writes
its model and prompts first), each for `--seconds` of wall, A B A B ... so a noisy neighbour hits both. The
figure is the median over the second half of each run's metrics lines (after start-up), the best
of the rounds.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from common import machine_header, run_training, table

ROOT = Path(__file__).parents[1]
WORKLOADS = {
    "CartPole async, W=4": ("configs/cartpole_ppo.yaml", ["rollout.mode=async", "rollout.num_workers=4"]),
    "Breakout sync (shipped)": ("configs/breakout_ppo.yaml", []),
    # the model and prompts this tree's benchmarks/tiny_lm.py wrote, for both trees
    "tiny LM task (shipped, tokens/s)": (
        "configs/tiny_lm_grpo.yaml",
        [f"model.path={ROOT / 'models' / 'tiny-llama'}", f"prompts.train={ROOT / 'data' / 'sums.jsonl'}"],
    ),
}


def _module(tree: Path) -> str:
    return "relay_rl.services.train" if (tree / "relay_rl").is_dir() else "services.train"


def run(tree: Path, config: str, sets: list[str], seconds: float) -> float:
    """Median env steps/s over the second half of one run's metrics lines."""
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, "-m", _module(tree), config, "--run-dir", f"{tmp}/run"]
        for kv in [*sets, "metrics.progress=none", "stop.env_steps=1000000000", f"stop.wall_s={seconds}"]:
            cmd += ["--set", kv]
        env = {**os.environ, "PYTHONPATH": str(tree)}  # the tree's own packages first
        run_training(cmd, tree, env)
        lines = [json.loads(x) for x in Path(f"{tmp}/run/metrics.jsonl").read_text().splitlines()]
    rates = [x["env_steps_per_s"] for x in lines[len(lines) // 2 :] if x.get("env_steps_per_s")]
    return statistics.median(rates)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", default="ac3f926", help="the older commit (A)")
    parser.add_argument("--seconds", type=float, default=40.0)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--only", choices=["cartpole", "breakout", "lm"], help="one workload")
    args = parser.parse_args()
    workloads = {k: v for k, v in WORKLOADS.items() if args.only is None or args.only in k.lower()}
    if any("tiny LM" in k for k in workloads) and not (ROOT / "models" / "tiny-llama").is_dir():
        sys.exit(
            "ab_tree.py: the tiny LM task needs models/tiny-llama: run python benchmarks/tiny_lm.py first"
        )
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp) / "base"
        subprocess.run(["git", "worktree", "add", "--detach", str(base), args.base], cwd=ROOT, check=True)
        try:
            rows = []
            for name, (config, sets) in workloads.items():
                got: dict[str, list[float]] = {"base": [], "here": []}
                for _ in range(args.rounds):
                    got["base"].append(run(base, config, sets, args.seconds))
                    got["here"].append(run(ROOT, config, sets, args.seconds))
                a, b = max(got["base"]), max(got["here"])
                every = " / ".join(
                    f"{x:,.0f}-{y:,.0f}" for x, y in zip(got["base"], got["here"], strict=True)
                )
                rows.append([name, f"{a:,.0f}", f"{b:,.0f}", f"{b / a:.2f}x", every])
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(base)], cwd=ROOT, check=False)
    print(machine_header(f"env steps/s: {args.base} (A) against this tree (B), {args.seconds:.0f} s a run"))
    print(table(["workload", f"{args.base}", "this tree", "B / A", "each round (A-B)"], rows))


if __name__ == "__main__":
    main()
