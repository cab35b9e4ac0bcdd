"""A recurrent core's sequence replay through torch's fused RNN (`nn.LSTM` / `nn.GRU`), exact
where episodes start mid-sequence.

Why: replaying [T, B] one cell call at a time builds T small autograd graphs and pays Python per
step, forward and backward; the fused RNN runs the time loop in C++ (cuDNN on a GPU), about 4x
faster on this CPU at T = B = 64. Why it is exact: a fused RNN cannot zero its state mid-sequence,
so the sequence is cut where episodes start. Each column's steps split into chunks at its starts;
every chunk is its own row of one [L, C] batch (L: the longest chunk), starting at step 0 of the
batch: a column's first chunk from its stored state (zeroed where an episode starts at its step
0), every later chunk from zeros. Steps past a chunk's end are padding whose outputs are never
read, and an RNN's output at a step does not depend on later steps, so the outputs put back in
their [T, B] places are the step loop's. The final state (the padding runs past it) is not
returned: callers that need it (acting, export) replay with `RecurrentCore.sequence_reference`,
the plain step loop this is tied to by tests/policy/test_recurrent.py.

The core's own cell weights are the RNN's (`functional_call` on a weightless template), so
state-dict keys, the numpy mirror and checkpoints do not change.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn
from torch.func import functional_call


def template(kind: str, in_dim: int, size: int) -> nn.Module:
    """The fused RNN whose forward the core's cell weights run through (its own are never used)."""
    rnn: nn.Module = {"lstm": nn.LSTM, "gru": nn.GRU}[kind](in_dim, size, device="meta")
    return rnn


def cell_weights(cell: nn.Module) -> dict[str, Tensor]:
    """An LSTMCell's / GRUCell's parameters under a one-layer fused RNN's names."""
    return {f"{name}_l0": p for name, p in cell.named_parameters()}


def chunks(starts: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """For starts [T, B] (bool): (each step's chunk [T, B], its place in that chunk [T, B], each
    chunk's column [C], whether each chunk is its column's first [C]). Chunks are numbered column
    by column, in time order."""
    T, B = starts.shape
    cut = starts.t().clone()  # [B, T]: column-major, so a column's chunks are consecutive
    cut[:, 0] = True
    flat = cut.reshape(-1)
    chunk = flat.long().cumsum(0).sub_(1)  # [B * T]
    first = torch.nonzero(flat).squeeze(1)  # each chunk's first flat index, [C]
    place = torch.arange(B * T, device=starts.device) - first[chunk]
    column = torch.div(first, T, rounding_mode="floor")
    return chunk.view(B, T).t(), place.view(B, T).t(), column, first % T == 0


# Never compiled: its shapes follow where episodes start. Under learner.compile the core traces
# its step loop instead (RecurrentCore.sequence); where dynamo runs the core's frame eagerly after
# a graph break, this runs eagerly too rather than compiling a graph per minibatch.
@torch.compiler.disable
def fused_outputs(
    rnn: nn.Module, weights: dict[str, Tensor], lstm: bool, x: Tensor, state: Tensor, starts: Tensor
) -> Tensor:
    """The cell's outputs [T, B, size] over x [T, B, in_dim] from state [B, S] (S = size, or
    2 x size for an LSTM's [h | c]), the state zeroed entering each step where starts [T, B]."""
    T, B, _ = x.shape
    chunk, place, column, opens = chunks(starts)
    rows, length = int(column.shape[0]), int(place.max()) + 1
    padded = x.new_zeros((length, rows, x.shape[-1]))
    padded[place.reshape(-1), chunk.reshape(-1)] = x.reshape(T * B, -1)
    keep = (opens & ~starts[0][column]).unsqueeze(-1).to(state.dtype)  # [C, 1]
    s0 = state[column] * keep
    size = s0.shape[1] // 2 if lstm else s0.shape[1]
    h0: Any = (
        (s0[:, :size].unsqueeze(0).contiguous(), s0[:, size:].unsqueeze(0).contiguous())
        if lstm
        else s0.unsqueeze(0).contiguous()
    )
    out, _ = functional_call(rnn, weights, (padded, h0))  # [L, C, size]
    return out[place.reshape(-1), chunk.reshape(-1)].view(T, B, -1)
