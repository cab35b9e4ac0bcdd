"""`learner.compile`: the update's loss compiled once for its fixed minibatch shape, and every
compile counted.

What is compiled: the algorithm's loss over one minibatch (the policy's forward, the loss terms;
AOTAutograd compiles the backward beside it). The optimizer step stays eager: Adam is one fused
kernel on cpu/cuda already (`DeviceContext.adam`), so compiling it wins nothing measurable here.

Fixed shapes are relay's promise (every minibatch is `learner.batch_size / grad_accum_steps`
rows, padding masked), so `dynamic=False`: a shape that changes anyway is a recompile, which the
counting backend sees. `compiles` counts graphs handed to the backend (one per graph-break-free
region of the loss); after the first update it must not move, and the learner says so on stderr
once if it does.
"""

from __future__ import annotations

import sys
from collections.abc import Callable

import torch
import torch._dynamo
from torch import Tensor

from ..policy.compiling import Backend, counting_compile
from ..policy.protocol import EnvPolicy

Batch = dict[str, Tensor]
LossFn = Callable[[EnvPolicy, Batch], tuple[Tensor, dict[str, Tensor]]]


def graph_breaks_so_far() -> int:
    """Graph breaks dynamo has taken in this process (its counters are process-wide)."""
    return int(sum(torch._dynamo.utils.counters["graph_break"].values()))


class CompiledLoss:
    """`loss_fn(model, batch)` under torch.compile with a backend that counts its compiles.

    `compiles`: graphs compiled so far; `graph_breaks`: breaks taken since this was built;
    `warm_compiles`: the count after the first call (the warm-up); `recompiled`: a compile came
    after it.
    """

    def __init__(self, loss_fn: LossFn, backend: Backend) -> None:
        # Dynamo caches compiled frames on the loss's code object, shared by every learner of the
        # process; a learner starts from an empty cache so its count is its own (one learner per
        # actor process in a run; tests build many).
        torch._dynamo.reset()
        self.compiles = 0
        self.warm_compiles: int | None = None
        self._breaks_before = graph_breaks_so_far()
        self._warned = False

        self._fn = counting_compile(loss_fn, backend, self._count)

    def _count(self) -> None:
        self.compiles += 1

    @property
    def graph_breaks(self) -> int:
        return graph_breaks_so_far() - self._breaks_before

    @property
    def recompiled(self) -> bool:
        return self.warm_compiles is not None and self.compiles > self.warm_compiles

    def __call__(self, model: EnvPolicy, batch: Batch) -> tuple[Tensor, dict[str, Tensor]]:
        out = self._fn(model, batch)
        if self.warm_compiles is None:
            self.warm_compiles = self.compiles
        elif self.recompiled and not self._warned:
            self._warned = True
            shapes = {k: tuple(v.shape) for k, v in batch.items()}
            print(
                f"relay learner: the compiled update recompiled ({self.compiles} graphs, "
                f"{self.warm_compiles} after warm-up) on a minibatch of shapes {shapes}",
                file=sys.stderr,
                flush=True,
            )
        return out

    def counts(self) -> dict[str, int]:
        """The metrics line's `compiles` and `graph_breaks`."""
        return {"compiles": self.compiles, "graph_breaks": self.graph_breaks}
