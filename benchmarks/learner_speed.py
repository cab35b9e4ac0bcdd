"""The learner alone, per shipped config: samples/s of its update eager vs `learner.compile`, the
compile's cost at start and its compile count, and for pixel configs the precisions and layouts.

    python benchmarks/learner_speed.py [--configs cartpole_ppo,breakout_ppo] [--updates 3] [--rounds 2]

Each config's learner runs in this process on one round of its own segments (sampled once, in
local mode, with its shipped shapes), with `learner.num_cpus` torch threads as its actor would
have. A variant is timed over `--updates` updates after a warm-up update (the compile, when there
is one: `compile s` is the warm-up's time less a steady update's); the variants of a config
alternate over `--rounds` rounds so the machine's noise falls on all of them, and the table
holds each variant's best round. Compiles start from an empty inductor cache (cold: the first
round) and hit it in later rounds (cached: a restarted learner on the same host).
samples/s = epochs x round steps / update seconds (the update: GAE, the epochs of minibatches,
the optimizer steps).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
from common import machine_header, table

ROOT = Path(__file__).parents[1]
DEFAULT_CONFIGS = (
    "cartpole_ppo,pendulum_ppo,hopper_ppo,taxi_ppo,cartpole_novel_lstm_ppo,reverse_digits_grpo,breakout_ppo"
)
EAGER = ["learner.use_amp=false", "learner.channels_last=false"]  # float32 NCHW, as relay learned until now
# Variants: every config gets eager and compiled; convolutional ones also each precision/layout.
MLP_VARIANTS = {"eager": EAGER, "compiled": [*EAGER, "learner.compile=true"]}
PIXEL_VARIANTS = {
    **MLP_VARIANTS,
    "channels_last": ["learner.use_amp=false", "learner.channels_last=true"],
    "bf16": ["learner.use_amp=true", "learner.channels_last=false"],
    "bf16+channels_last": ["learner.use_amp=true", "learner.channels_last=true"],
    "bf16+compiled": ["learner.use_amp=true", "learner.channels_last=false", "learner.compile=true"],
    "auto (shipped)": [],
    "auto+compiled": ["learner.compile=true"],
}
CONFIG_SETS = {"breakout_ppo": ["env.vectorization=envpool"]}


def one_round(config: str, sets: Sequence[str] = ()) -> tuple[Any, Any, list[Any]]:
    """The config's env spec and one round of its segments (the learner's input for an update)."""
    from relay_rl.learner.algorithms import algorithm_traits
    from relay_rl.rollout_workers.sampler import make_sampler

    cfg = shipped_config(config, list(sets))
    sampler = make_sampler(cfg, algorithm_traits(cfg))
    return cfg, sampler.spec, [sampler.sample() for _ in range(cfg.segments_per_update)]


def shipped_config(config: str, sets: list[str]) -> Any:
    from relay_rl.contracts.config import load_config

    return load_config(
        ROOT / "configs" / f"{config}.yaml", ["rollout.num_workers=0", *CONFIG_SETS.get(config, []), *sets]
    )


def _time_variant(config: str, spec: Any, segments: list[Any], sets: list[str], updates: int) -> dict:
    import torch

    from relay_rl.learner.learner import Learner

    cfg = shipped_config(config, sets)
    torch.set_num_threads(cfg.learner.num_cpus)
    learner = Learner(cfg, spec)
    t0 = time.perf_counter()
    first = learner.train_round(segments).metrics
    warm_s = time.perf_counter() - t0
    times = []
    last = first
    for _ in range(updates):
        t0 = time.perf_counter()
        last = learner.train_round(segments).metrics
        times.append(time.perf_counter() - t0)
    steady = min(times)
    samples = cfg.learner.epochs * cfg.segments_per_update * cfg.segment_steps
    return {
        "samples_per_s": samples / steady,
        "compile_s": max(warm_s - steady, 0.0) if cfg.learner.compile else None,
        "compiles": (last or {}).get("compiles"),
        "precision": (last or {}).get("precision"),
        "recompiled": bool(first and last and first.get("compiles") != last.get("compiles")),
    }


def _compiles(got: dict[str, Any]) -> str:
    if got["compiles"] is None:
        return ""
    return f"{got['compiles']}" + (" (recompiled)" if got["recompiled"] else "")


def main() -> None:
    # A cache of its own, empty at the start: the first compile of each variant is a cold one, as on
    # a new host; later rounds show what a restarted learner on the same host pays.
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp(prefix="relay-inductor-")
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--configs", default=DEFAULT_CONFIGS)
    parser.add_argument("--updates", type=int, default=3, help="timed updates per variant and round")
    parser.add_argument("--rounds", type=int, default=2, help="rounds the variants alternate over")
    args = parser.parse_args()
    rows = []
    for config in args.configs.split(","):
        cfg, spec, segments = one_round(config)
        pixels = cfg.model.kind == "cnn"
        variants = PIXEL_VARIANTS if pixels else MLP_VARIANTS
        best: dict[str, dict[str, Any]] = {}
        cold: dict[str, float | None] = {}
        for _ in range(args.rounds):
            for name, sets in variants.items():
                got = _time_variant(config, spec, segments, sets, args.updates)
                cold.setdefault(name, got["compile_s"])  # the first round compiles from nothing
                if name not in best or got["samples_per_s"] > best[name]["samples_per_s"]:
                    best[name] = {**got, "compile_s": cold[name]}
                best[name]["cached_s"] = got["compile_s"]  # later rounds hit inductor's disk cache
        base = best["eager"]["samples_per_s"]
        for name, got in best.items():
            rows.append(
                [
                    config,
                    name,
                    got["precision"],
                    f"{got['samples_per_s']:,.0f}",
                    f"{got['samples_per_s'] / base:.2f}x",
                    "" if got["compile_s"] is None else f"{got['compile_s']:.1f} / {got['cached_s']:.1f}",
                    _compiles(got),
                ]
            )
    print(
        machine_header(
            f"The learner alone: samples/s of an update, best of {args.rounds} alternating rounds of "
            f"{args.updates} updates"
        )
    )
    head = ["config", "variant", "precision", "samples/s", "/ eager", "compile s (cold / cached)", "compiles"]
    print(table(head, rows))


if __name__ == "__main__":
    main()
