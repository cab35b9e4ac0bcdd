"""Env steps a shipped config takes to reach a mean return, on several seeds, for this tree and for
another checkout of relay beside it (an older commit: `git worktree add /tmp/old <commit>`).

    python benchmarks/steps_to_return.py [--config configs/hopper_ppo.yaml] [--threshold 2000]
        [--seeds 0,1,2] [--budget 1000000] [--old /tmp/old] [--repeat 1]

Each run is the config as shipped with `env.seed`, `stop.env_steps=BUDGET` (the learning-rate
schedule anneals over it) and `stop.episode_return_mean=THRESHOLD`; the table gives the env steps
of the first line at or over the threshold (— where the budget ran out first). `--repeat 2` runs
every seed twice, which tells a seeded run that is reproducible from one that is not: a Hopper
seed that took 289k, 473k and 977k steps on the same tree was the row that would have shown the
async learning-rate bug of 2026-12-07. A tree from before `relay_rl/` (top-level `services/`)
runs as `python -m services.train` with itself on PYTHONPATH.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from common import machine_header, read_metrics, run_training, table

ROOT = Path(__file__).parents[1]


def steps_to(tree: Path, config: str, seed: int, threshold: float, budget: int) -> int | None:
    """Env steps at which a run of `config` at `tree` first logged a mean return >= threshold."""
    module = "relay_rl.services.train" if (tree / "relay_rl").exists() else "services.train"
    env = {**os.environ, "PYTHONPATH": str(tree)}
    with tempfile.TemporaryDirectory() as tmp:
        run = Path(tmp) / "run"
        sets = [
            "metrics.progress=none",
            f"env.seed={seed}",
            f"stop.env_steps={budget}",
            f"stop.episode_return_mean={threshold}",
        ]
        cmd = [sys.executable, "-m", module, config, "--run-dir", str(run)]
        for kv in sets:
            cmd += ["--set", kv]
        run_training(cmd, tree, env)
        for line in read_metrics(run):
            ret = line.get("episode_return_mean")
            if ret is not None and ret >= threshold:
                return int(line["env_steps"])
    return None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="configs/hopper_ppo.yaml")
    ap.add_argument("--threshold", type=float, default=2000.0)
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--budget", type=int, default=1_000_000)
    ap.add_argument("--old", type=Path, default=None, help="another checkout of relay to run beside this one")
    ap.add_argument("--repeat", type=int, default=1)
    args = ap.parse_args()
    seeds = [int(s) for s in args.seeds.split(",")]
    trees = {"this tree": ROOT, **({f"old ({args.old})": args.old} if args.old else {})}
    rows, means = [], {}
    for name, tree in trees.items():
        got = []
        for seed in seeds:
            runs = [
                steps_to(tree, args.config, seed, args.threshold, args.budget) for _ in range(args.repeat)
            ]
            got += [r for r in runs if r is not None]
            rows.append([name, seed, *(r if r is not None else "—" for r in runs)])
        means[name] = statistics.mean(got) if got else None
    print(machine_header(f"{args.config}: env steps to a mean return of {args.threshold:g}"))
    print(table(["tree", "seed", *(f"run {i + 1}" for i in range(args.repeat))], rows))
    for name, mean in means.items():
        print(f"{name}: mean {mean:,.0f} steps" if mean is not None else f"{name}: never reached")


if __name__ == "__main__":
    main()
