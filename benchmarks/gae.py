"""Vectorized GAE vs the loop over T, side by side in one run: wall time and dispatched torch ops.

    python benchmarks/gae.py [--device cpu] [--repeats 5]

On an NPU or GPU every dispatched op is a kernel launch, and launches, not arithmetic, dominate;
so the op count (counted with a TorchDispatchMode) matters as much as the CPU time.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time
from collections.abc import Callable

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from relay_rl.learner.device import resolve_device
from relay_rl.learner.gae import EpisodeEnds, compute_gae, compute_gae_reference, next_values

SHAPES = [(128, 64), (512, 256), (2048, 1024)]


class OpCounter(TorchDispatchMode):
    """Counts the aten ops a call dispatches."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        self.count += 1
        return func(*args, **(kwargs or {}))


def segment(T: int, N: int, device: torch.device) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    term = torch.rand(T, N, generator=g) < 0.01
    trunc = (torch.rand(T, N, generator=g) < 0.005) & ~term
    data = {
        "rewards": torch.randn(T, N, generator=g),
        "values": torch.randn(T, N, generator=g),
        "terminated": term.float(),
        "truncated": trunc.float(),
        "bootstrap_value": torch.randn(T, N, generator=g),
        "last_value": torch.randn(N, generator=g),
        "mask": (torch.rand(T, N, generator=g) > 0.02).float(),
    }
    return {k: v.to(device) for k, v in data.items()}


def lean_loop_gae(
    seg: dict[str, torch.Tensor], gamma: float, lam: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """The strongest loop baseline: TD errors vectorized, only the recurrence looped over T."""
    ends = EpisodeEnds.of(seg)
    after, coef = next_values(seg["values"], ends)
    deltas = (after * gamma + seg["rewards"] - seg["values"]) * ends.mask
    coef = coef * (gamma * lam)
    adv = torch.empty_like(deltas)
    running = torch.zeros_like(deltas[0])
    for t in range(deltas.shape[0] - 1, -1, -1):
        running = torch.addcmul(deltas[t], coef[t], running)
        adv[t] = running
    valid = seg["mask"] > 0
    return adv.masked_fill_(~valid, 0.0), torch.where(valid, adv + seg["values"], 0.0)


def time_call(fn: Callable[[], object], sync: Callable[[], None], repeats: int) -> float:
    fn()
    sync()
    samples = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        sync()
        samples.append(time.perf_counter() - t0)
    return statistics.median(samples)


def count_ops(fn: Callable[[], object]) -> int:
    with OpCounter() as counter:
        fn()
    return counter.count


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    dev = resolve_device(args.device)
    print(f"# GAE benchmark  device={dev}  torch={torch.__version__}  threads={torch.get_num_threads()}")
    print(f"# {platform.processor() or platform.machine()}  {time.strftime('%Y-%m-%d')}")
    print("# loop = compute_gae_reference (the obvious per-step loop, vectorized over N);")
    print("# lean = TD errors vectorized, only the recurrence looped (the strongest loop baseline)")
    header = (
        f"{'T x N':>12} | {'scan ms':>8} | {'loop ms':>8} | {'lean ms':>8} | "
        f"{'vs loop':>7} | {'vs lean':>7} | {'scan ops':>8} | {'loop ops':>8} | {'lean ops':>8} | "
        f"{'max |diff|':>10}"
    )
    print(header)
    print("-" * len(header))
    for T, N in SHAPES:
        seg = segment(T, N, dev.device)

        def scan(seg: dict[str, torch.Tensor] = seg) -> tuple[torch.Tensor, torch.Tensor]:
            return compute_gae(seg["rewards"], seg["values"], EpisodeEnds.of(seg), gamma=0.99, lam=0.95)

        def loop(seg: dict[str, torch.Tensor] = seg) -> tuple[torch.Tensor, torch.Tensor]:
            return compute_gae_reference(
                seg["rewards"], seg["values"], EpisodeEnds.of(seg), gamma=0.99, lam=0.95
            )

        def lean(seg: dict[str, torch.Tensor] = seg) -> tuple[torch.Tensor, torch.Tensor]:
            return lean_loop_gae(seg, gamma=0.99, lam=0.95)

        t_scan = time_call(scan, dev.synchronize, args.repeats)
        t_loop = time_call(loop, dev.synchronize, max(1, args.repeats // 2))
        t_lean = time_call(lean, dev.synchronize, args.repeats)
        ops = [count_ops(f) for f in (scan, loop, lean)]
        diff = max((scan()[0] - loop()[0]).abs().max().item(), (scan()[0] - lean()[0]).abs().max().item())
        print(
            f"{f'{T} x {N}':>12} | {t_scan * 1e3:8.2f} | {t_loop * 1e3:8.2f} | {t_lean * 1e3:8.2f} | "
            f"{t_loop / t_scan:6.1f}x | {t_lean / t_scan:6.1f}x | {ops[0]:8d} | {ops[1]:8d} | {ops[2]:8d} | "
            f"{diff:10.2e}"
        )


if __name__ == "__main__":
    main()
