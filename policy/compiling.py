"""torch.compile with every compile counted, and torch's own backends by name: what the compiled
update (learner/compiled.py) and the compiled decoding step (policy/lm_decoding.py) share.

Fixed shapes are relay's promise, so everything compiles with `dynamic=False`: a shape that
changes anyway is a recompile, and the counting backend sees it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch._dynamo

Backend = Callable[..., Any]


def torch_backend(name: str) -> Backend:
    """A backend torch names (`learner.compile_backend`): auto is inductor, the rest by their own
    name (aot_eager and eager compile nothing: they trace, guard and count). A device with a
    graph mode of its own (torchair on npu) is the learner's DeviceContext's to choose."""
    return torch._dynamo.lookup_backend("inductor" if name == "auto" else name)


def counting_compile(
    fn: Callable[..., Any], backend: Backend, counter: Callable[[], None], fullgraph: bool = False
) -> Any:
    """`fn` under torch.compile (fixed shapes) with a backend that calls `counter` per graph it
    compiles. `fullgraph`: a graph break is an error instead of a second graph."""

    def counting(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Any:
        counter()
        return backend(gm, example_inputs)

    return torch.compile(fn, backend=counting, fullgraph=fullgraph, dynamic=False)
