"""The learner alone over many rounds: does its memory grow, and if it does, is it the process's
(a leak) or glibc's allocator keeping freed memory (a swing bounded by the largest working set)?

    python benchmarks/learner_memory.py [--config breakout_ppo] [--rounds 200] [--set KEY=VALUE ...]

One round of the config's own segments is sampled once (local mode, shipped shapes); the learner
then trains on it `--rounds` times in this process, with `learner.num_cpus` torch threads and
the learner actor's heap trim once a minute (learner/heap.py), no Ray. After every round it
reads the process's private resident memory (RssAnon), what glibc holds allocated
(`heap_in_use_bytes`) and freed-but-kept (`heap_free_bytes`), and prints each one's growth per
1,000 rounds (least squares after the first `--warmup` rounds), its range, and the growth per
hour at this machine's round rate. `--mmap-threshold BYTES` fixes glibc's mmap threshold first
(`mallopt(M_MMAP_THRESHOLD)`: chunks that large are mapped and unmapped on their own instead of
kept in a heap; glibc otherwise raises the threshold to the largest chunk freed, up to 32 MB).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[1]))
sys.path.insert(0, str(Path(__file__).parent))
from common import machine_header, table
from learner_speed import one_round
from soak import slope_per_hour

MB = 2**20


def rss_anon_bytes() -> int:
    """This process's private resident memory (/proc/self/status RssAnon)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no RssAnon in /proc/self/status")


M_MMAP_THRESHOLD = -3  # glibc's malloc.h


def fix_mmap_threshold(nbytes: int) -> None:
    import ctypes
    import ctypes.util

    if not ctypes.CDLL(ctypes.util.find_library("c")).mallopt(M_MMAP_THRESHOLD, nbytes):
        raise SystemExit(f"mallopt(M_MMAP_THRESHOLD, {nbytes}) refused")


def run(config: str, sets: list[str], rounds: int) -> tuple[list[float], dict[str, list[float]], int]:
    """(seconds since the first round, {series: bytes after each round}, trims)."""
    import torch

    from relay_rl.learner.heap import HeapTrimmer, heap_stats
    from relay_rl.learner.learner import Learner

    cfg, spec, segments = one_round(config, sets)
    torch.set_num_threads(cfg.learner.num_cpus)
    learner = Learner(cfg, spec)
    trimmer = HeapTrimmer()  # as the learner actor: at most once a minute
    times: list[float] = []
    series: dict[str, list[float]] = {"RssAnon": [], "heap in use": [], "heap free": []}
    t0 = time.perf_counter()
    for _ in range(rounds):
        learner.train_round(segments)
        trimmer.maybe_trim()
        heap = heap_stats()
        times.append(time.perf_counter() - t0)
        series["RssAnon"].append(rss_anon_bytes())
        series["heap in use"].append(heap.get("heap_in_use_bytes", 0))
        series["heap free"].append(heap.get("heap_free_bytes", 0))
    return times, series, trimmer.trims


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="breakout_ppo")
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--warmup", type=int, default=20, help="rounds before the fit starts")
    parser.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--mmap-threshold", type=int, default=None, metavar="BYTES")
    args = parser.parse_args()
    if args.mmap_threshold is not None:
        fix_mmap_threshold(args.mmap_threshold)
    if args.rounds < args.warmup + 3:
        print(
            f"learner_memory.py: --rounds must exceed --warmup ({args.warmup}) by at least 3", file=sys.stderr
        )
        raise SystemExit(2)
    sets = ["env.vectorization=envpool", *args.sets] if args.config == "breakout_ppo" else args.sets
    times, series, trims = run(args.config, sets, args.rounds)
    w = args.warmup
    hours_per_round = (times[-1] - times[w]) / (len(times) - 1 - w) / 3600
    rows = []
    for name, ys in series.items():
        per_hour = slope_per_hour(times[w:], [y / MB for y in ys[w:]])
        tail = ys[w:]
        row = [name, ys[w] / MB, ys[-1] / MB, min(tail) / MB, max(tail) / MB]
        rows.append([*row, per_hour * hours_per_round * 1000, per_hour])
    print(
        machine_header(
            f"learner memory, {' '.join([args.config, *sets])}: {args.rounds} rounds in this process, no Ray"
        )
    )
    fixed = f"mmap threshold fixed at {args.mmap_threshold:,} B" if args.mmap_threshold else "glibc defaults"
    print(
        f"# {fixed}; {times[-1] / len(times):.2f} s a round, {trims} heap trims; "
        f"fitted after round {w}, growth per hour at this round rate"
    )
    print(
        table(
            ["series", "MB at warm-up", "MB at the end", "min", "max", "MB per 1,000 rounds", "MB/h"],
            rows,
        )
    )


if __name__ == "__main__":
    main()
