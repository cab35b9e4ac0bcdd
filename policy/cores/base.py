"""What a recurrent core is: memory between the trunk and the heads.

A core maps trunk features [B, in_dim] and its state [B, state_size] to features [B, out_dim] and
the next state, one step at a time (`step`), or over a time-major sequence [T, B, in_dim] from a
stored initial state with the state zeroed where an episode starts (`sequence`: masks, never a
Python loop over episodes). The state is one flat float32 row per env so a segment stores it as
one per-env field (`initial_state`, contracts/segment.py) whatever the core keeps inside.

A core may end in a tanh layer of `out_size` units (`model.post_core_size`): the heads then read
a nonlinear function of the memory and the step's input together. A linear head on the cell's
output alone cannot compute "what I remember agrees with what I see" (an XOR of the two), which
memory tasks such as MiniGrid's Memory ask for; torch-ac's and the recurrent-PPO baselines'
actors put a hidden layer there for the same reason.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

import numpy as np
import torch
from torch import Tensor, nn

from ...contracts.metrics import MetricKeys
from ...policy.cores.fused import cell_weights, fused_outputs, template


def sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


class RecurrentCore(nn.Module):
    """Subclasses take (in_dim, size, out_size), declare `state_per_unit` (floats of state per unit
    of `model.recurrent_size`) and implement `cell_step` (x, state -> the cell's output [B, size],
    next state), and its numpy mirror for rollout workers: `np_cell_prepare` (the cell's weights,
    from its state-dict entries, laid out for x @ W) and `np_cell_step` (tied to `cell_step` by
    tests/policy/test_recurrent.py). The optional output layer is this class's, on both sides."""

    state_per_unit: ClassVar[int] = 1
    # A core whose cell is torch's LSTMCell / GRUCell names the fused RNN of the same cell
    # ("lstm", "gru"): its sequences replay through it (policy/cores/fused.py).
    fused: ClassVar[str | None] = None
    # what the learner writes of a recurrent policy's rounds (learner/learner.py state_stats)
    metrics: ClassVar[MetricKeys] = MetricKeys(
        {
            "state_abs_mean": "mean |value| of the recurrent state the round's segments start from (a "
            "diverging core shows here; recurrent policies)",
            "state_resets_per_segment": "recurrent states zeroed at episode starts inside a segment, per "
            "segment (recurrent policies)",
        },
        (
            {
                "id": "recurrent",
                "title": "Recurrent state: mean |state| at segment starts, resets per segment",
                "keys": ["state_abs_mean", "state_resets_per_segment"],
            },
        ),
    )
    cell: nn.Module  # the subclass's torch cell (LSTMCell, GRUCell, ...)

    def __init__(self, in_dim: int, size: int, out_size: int = 0) -> None:
        super().__init__()
        self.in_dim = in_dim
        self.size = size
        self.state_size = self.state_per_unit * size
        # Only present when asked for, so a core without one keeps its state-dict keys.
        self.out: nn.Linear | None = nn.Linear(size, out_size) if out_size else None
        self.out_dim = out_size or size
        # Not a submodule: weightless (on the meta device), it lends the fused RNN's forward.
        self._rnn = [template(self.fused, in_dim, size)] if self.fused else []

    def cell_step(self, x: Tensor, state: Tensor) -> tuple[Tensor, Tensor]:
        """x [B, in_dim], state [B, state_size] -> (the cell's output [B, size], next state)."""
        raise NotImplementedError

    def step(self, x: Tensor, state: Tensor) -> tuple[Tensor, Tensor]:
        """x [B, in_dim], state [B, state_size] -> (features [B, out_dim], next state [B, state_size])."""
        h, state = self.cell_step(x, state)
        return (h if self.out is None else torch.tanh(self.out(h))), state

    def sequence(
        self, x: Tensor, state: Tensor, starts: Tensor, detach_before: int = 0, final_state: bool = True
    ) -> tuple[Tensor, Tensor | None]:
        """x [T, B, in_dim] from `state` [B, state_size]; starts [T, B] bool: an episode starts at
        step t, so the state entering it is zeroed. Gradients do not reach back past step
        `detach_before` (burn-in). Returns (features [T, B, out_dim], the state after step T-1, or
        None where `final_state` is False).

        Without the final state (an eager update's replay) a core with a fused RNN replays
        through it (policy/cores/fused.py, exact); otherwise `sequence_reference`'s step loop."""
        # Under torch.compile (learner.compile) the step loop: the chunks' count and length
        # depend on where episodes start, a new shape for every minibatch; unrolled in the
        # graph, the loop's shapes are fixed and it compiles once.
        # (is_compiling first: dynamo breaks the graph on merely touching the RNN template.)
        if torch.compiler.is_compiling() or final_state or not self._rnn or x.shape[0] == 1:
            return self.sequence_reference(x, state, starts, detach_before)
        weights = cell_weights(self.cell)
        lstm = self.fused == "lstm"
        cut = detach_before if 0 < detach_before < x.shape[0] else 0
        parts = []
        if cut:
            # Burn-in: its steps (a few) by the step loop, which gives the state after them;
            # the rest replays from that state, detached, as the loop does at step `cut`.
            head, state = self.sequence_reference_cells(x[:cut], state, starts[:cut])
            parts.append(head)
            state = state.detach()
        parts.append(fused_outputs(self._rnn[0], weights, lstm, x[cut:], state, starts[cut:]))
        seq = parts[0] if len(parts) == 1 else torch.cat(parts)
        return (seq if self.out is None else torch.tanh(self.out(seq))), None

    def sequence_reference(
        self, x: Tensor, state: Tensor, starts: Tensor, detach_before: int = 0
    ) -> tuple[Tensor, Tensor]:
        """`sequence` one cell call at a time: the plain reference of the fused replay."""
        seq, state = self.sequence_reference_cells(x, state, starts, detach_before)
        # The output layer once over the whole [T, B, size] sequence: one matmul, not T.
        return (seq if self.out is None else torch.tanh(self.out(seq))), state

    def sequence_reference_cells(
        self, x: Tensor, state: Tensor, starts: Tensor, detach_before: int = 0
    ) -> tuple[Tensor, Tensor]:
        """The cell's outputs [T, B, size] one step at a time (before the output layer), and the
        state after step T-1."""
        keep = (~starts).unsqueeze(-1).to(state.dtype)  # [T, B, 1]
        outs = []
        for t in range(x.shape[0]):  # T is the segment's fixed length: one graph shape
            if t == detach_before and t > 0:
                state = state.detach()
            h, state = self.cell_step(x[t], state * keep[t])
            outs.append(h)
        return torch.stack(outs), state

    @classmethod
    def np_width(cls, weights: Mapping[str, np.ndarray]) -> int:
        """Hidden units of the cell whose state dict is `weights` (its recurrent matrix's)."""
        return int(weights["cell.weight_hh"].shape[1])

    @classmethod
    def np_prepare(cls, weights: Mapping[str, np.ndarray]) -> Any:
        """The core's float32 arrays (`weights` keyed as in its state dict: "cell.weight_ih", ...,
        "out.weight") arranged for `np_step`."""
        out = None
        if "out.weight" in weights:
            out = (np.ascontiguousarray(weights["out.weight"].T), weights["out.bias"])
        return cls.np_cell_prepare(weights), out

    @classmethod
    def np_step(cls, prepared: Any, x: np.ndarray, state: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """`step` in float32 numpy: x [B, in_dim], state [B, state_size] -> (features, next state)."""
        cell, out = prepared
        h, state = cls.np_cell_step(cell, x, state)
        return (h if out is None else np.tanh(h @ out[0] + out[1])), state

    @staticmethod
    def np_cell_prepare(weights: Mapping[str, np.ndarray]) -> Any:
        raise NotImplementedError

    @staticmethod
    def np_cell_step(prepared: Any, x: np.ndarray, state: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """`cell_step` in float32 numpy."""
        raise NotImplementedError
