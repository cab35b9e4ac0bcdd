"""What the nested trajectory record costs the sampler: relay's CartPole sampling rate on this
tree and on a commit before it, side by side in one run (alternating, so the machine's noise falls
on both).

    python benchmarks/record_cost.py [--before 40891b4] [--rounds 5] [--seconds 10]

Each round runs one child process per tree: a local-mode sampler (SyncVectorEnv of 8 CartPole-v1,
T=128, the numpy acting mirror) calling sample() for `--seconds`; steps/s is T x N x calls over
the time taken. The tree before is checked out with `git worktree` into a temporary folder.

Two rates per child: over wall time, and over the CPU time the child's process was given
(`time.process_time`). On a shared VM the wall rate swings with whoever else runs (+-25% between
rounds here); the CPU-time rate leaves out the time the process waited for a core, so what is
left is the work the sampler does per step, which is what the record changes.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from common import machine_header, table

ROOT = Path(__file__).parents[1]
CHILD = r"""
import json, sys, time
import torch
torch.set_num_threads(1)
from relay_rl.contracts.config import build_config
from relay_rl.rollout_workers.sampler import make_sampler
cfg = build_config({}, ["rollout.num_workers=0", "env.num_envs=8", "rollout.rollout_len=128",
                        "learner.buffer_size=1024", "learner.batch_size=256"])
try:
    from relay_rl.learner.algorithms import algorithm_traits
    sampler = make_sampler(cfg, algorithm_traits(cfg))
except ImportError:  # before the policy layer: make_sampler(cfg)
    sampler = make_sampler(cfg)
sampler.sample()
calls, t0, c0 = 0, time.perf_counter(), time.process_time()
while time.perf_counter() - t0 < float(sys.argv[1]):
    sampler.sample()
    calls += 1
steps = calls * 128 * 8
print(json.dumps({"steps_per_s": steps / (time.perf_counter() - t0),
                  "steps_per_cpu_s": steps / (time.process_time() - c0)}))
"""


def rates(tree: Path, seconds: float) -> dict[str, float]:
    """One child's {"steps_per_s", "steps_per_cpu_s"}."""
    out = subprocess.run(
        [sys.executable, "-c", CHILD, str(seconds)], cwd=tree, check=True, capture_output=True, text=True
    )
    return {k: float(v) for k, v in json.loads(out.stdout.strip().splitlines()[-1]).items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", default="40891b4")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=10.0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        before = Path(tmp) / "before"
        subprocess.run(
            ["git", "worktree", "add", "--detach", str(before), args.before],
            cwd=ROOT,
            check=True,
            capture_output=True,
        )
        try:
            now: list[dict[str, float]] = []
            then: list[dict[str, float]] = []
            for _ in range(args.rounds):
                then.append(rates(before, args.seconds))
                now.append(rates(ROOT, args.seconds))
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(before)], cwd=ROOT, check=True)
    print(
        machine_header(
            f"CartPole sampling, local sampler, {args.rounds} alternating rounds of {args.seconds:.0f} s"
        )
    )
    for key, label in (("steps_per_s", "steps/s (wall)"), ("steps_per_cpu_s", "steps per CPU-second")):
        a = [r[key] for r in then]
        b = [r[key] for r in now]
        rows = [
            [f"before ({args.before})", statistics.median(a), min(a), max(a)],
            ["this tree", statistics.median(b), min(b), max(b)],
        ]
        print(f"\n{label}")
        print(table(["tree", "median", "min", "max"], rows))
        ratios = [n / t for n, t in zip(b, a, strict=True)]
        each = ", ".join(f"{r:.3f}" for r in ratios)
        print(f"this tree / before, per round: {each}; median {statistics.median(ratios):.3f}")


if __name__ == "__main__":
    main()
