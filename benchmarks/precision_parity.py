"""Learning parity of the pixel learner's precisions: Breakout with the shipped config, float32 and
bf16 autocast (both channels-last, as `auto` lays a CNN out), the same seed, to the same number
of env steps; the mean return of the last 20 games read at equal env steps.

    python benchmarks/precision_parity.py [--steps 150000] [--variants float32,bfloat16]

Breakout because it is the pixel task relay ships whose return leaves a random policy's within
minutes on this CPU (~1.3 -> 3.5 in 113k steps, docs/benchmarks.md "Atari learning"); Pong's
first points come after millions of steps. Equal env steps, not equal wall time: a CPU without
bf16 units emulates bf16, so its run is slower, and parity is about what is learned per step.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from common import machine_header, table, train_relay

VARIANTS = {
    "float32": ["learner.use_amp=false", "learner.channels_last=true"],
    "bfloat16": ["learner.use_amp=true", "learner.amp_dtype=bfloat16", "learner.channels_last=true"],
}
MARKS = 6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=150_000)
    parser.add_argument("--variants", default="float32,bfloat16")
    args = parser.parse_args()
    names = [v for v in args.variants.split(",") if v]
    unknown = [v for v in names if v not in VARIANTS]
    if unknown or not names:
        print(f"precision_parity.py: --variants: choose from {', '.join(VARIANTS)}", file=sys.stderr)
        sys.exit(2)
    sets = ["env.vectorization=envpool", f"stop.env_steps={args.steps}"]
    curves = {name: train_relay("configs/breakout_ppo.yaml", [*sets, *VARIANTS[name]]) for name in names}
    rows = []
    for k in range(1, MARKS + 1):
        at = args.steps * k // MARKS
        row: list[object] = [f"{at:,}"]
        for name in names:
            line = next((x for x in curves[name] if x["env_steps"] >= at), curves[name][-1])
            row += [line["episode_return_mean"], f"{line['wall_s']:.0f}"]
        rows.append(row)
    print(
        machine_header(
            f"Breakout, shipped config, seed 0, {args.steps:,} env steps: mean return of the last 20 games"
        )
    )
    head = ["env steps"] + [f"{n} {col}" for n in names for col in ("return", "wall s")]
    print(table(head, rows))
    print("precision per run: " + ", ".join(f"{n} {curves[n][-1].get('precision')}" for n in names))


if __name__ == "__main__":
    main()
