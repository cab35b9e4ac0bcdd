"""What an algorithm (`learner.algo`) provides to the learner: its traits, its config rules, the
batch it trains on, its loss and its own state. The update loop around it (`learner/update.py`)
and the learner (`learner/learner.py`) are shared by all of them.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch
from torch import Tensor

from ...contracts.algorithm import AlgorithmTraits
from ...contracts.config import EntrySection, LearnerConfig, RelayConfig, entry_section
from ...contracts.metrics import MetricKeys
from ...contracts.segment import is_policy_input, state_resets
from ...learner.device import DeviceContext
from ...learner.precision import amp_enabled
from ...learner.update import column_rows
from ...policy.actor_critic import STARTS, STATE
from ...policy.protocol import EnvPolicy

Batch = dict[str, Tensor]


def policy_inputs(data: dict[str, Tensor]) -> dict[str, Tensor]:
    """The fields a policy reads (observation leaves, the action mask) of time-major round data
    [T, E = K*N, ...], flattened to [B = T*E, ...]; for a recurrent policy also the state entering
    each column, STATE [E, S], and STARTS [B] (an episode starts at the step: the state the worker
    carried into it was zeroed, by the rule it applied, `contracts.segment.state_resets`)."""
    out = {k: v.flatten(0, 1) for k, v in data.items() if is_policy_input(k)}
    if "initial_state" in data:
        resets = state_resets(data["terminated"], data["truncated"], data["mask"])
        starts = torch.zeros_like(resets)
        starts[1:] = resets[:-1]
        out[STATE] = data["initial_state"]
        out[STARTS] = starts.flatten(0, 1)
    return out


@torch.no_grad()
def evaluate_in_chunks(
    model: EnvPolicy, inputs: dict[str, Tensor], actions: Tensor, cfg: LearnerConfig, dev: DeviceContext
) -> tuple[Tensor, Tensor | None]:
    """(log-probs [B], values [B] or None) of `model` over a whole batch of input fields [B, ...],
    in minibatch-sized chunks (memory stays that of a minibatch), under the same autocast as the
    update's forward passes. A recurrent policy's time-major batch is replayed in whole columns
    from their stored states, and its results put back in the batch's row order."""
    size = actions.shape[0]
    state = inputs.get(STATE)
    columns = 1 if state is None else state.shape[0]
    steps = size // columns
    per_chunk = cfg.batch_size if state is None else max(1, cfg.batch_size // steps)
    order = None
    if state is not None:  # the E columns one after another, as a recurrent policy reads them
        order = column_rows(steps, columns, torch.arange(columns, device=actions.device))
    logps, values = [], []
    with dev.autocast(amp_enabled(cfg), cfg.amp_dtype):
        for start in range(0, size if state is None else columns, per_chunk):
            if order is None:
                rows = slice(start, start + per_chunk)
                chunk = {k: v[rows] for k, v in inputs.items()}
                out = model.evaluate(chunk, actions[rows])
            else:
                idx = order[start * steps : (start + per_chunk) * steps]
                chunk = {k: v[start : start + per_chunk] if k == STATE else v[idx] for k, v in inputs.items()}
                out = model.evaluate(chunk, actions[idx])
            logps.append(out.logp)
            if out.value is not None:
                values.append(out.value.float())
    logp, value = torch.cat(logps), (torch.cat(values) if values else None)
    if order is not None:  # back from column order to the batch's rows
        logp = torch.empty_like(logp).index_copy_(0, order, logp)
        value = None if value is None else torch.empty_like(value).index_copy_(0, order, value)
    return logp, value


class Algorithm:
    """One update rule over time-major round data.

    critic: the policy has a value network. grouped: segments use the grouped layout (each env
    plays one episode per segment, members of a group share a start, `outcome` [N] holds each
    member's return); otherwise envs run on across segments.
    """

    critic: ClassVar[bool] = True
    grouped: ClassVar[bool] = False
    # the keys its `batch` and `loss` statistics add to the metrics line (services/runs/metric_keys.py)
    metrics: ClassVar[MetricKeys] = MetricKeys({})
    # its own settings, under `learner.<its registry name>` (None: it has none beyond learner's)
    settings: ClassVar[type[EntrySection] | None] = None

    @classmethod
    def settings_of(cls, cfg: LearnerConfig) -> EntrySection:
        """This algorithm's section of a learner config that runs it (`learner.<learner.algo>`),
        validated, its defaults filled (ConfigError naming the leaf otherwise)."""
        name = cfg.algo
        assert cls.settings is not None, f"learner.algo={name} declares no settings"
        return entry_section(cfg, "learner", name, cls.settings)

    @classmethod
    def traits(cls) -> AlgorithmTraits:
        """What the rollout workers must know of this algorithm."""
        return AlgorithmTraits(critic=cls.critic, grouped=cls.grouped)

    @staticmethod
    def config_problems(cfg: RelayConfig) -> list[str]:
        """Rules particular to this algorithm, each naming fields and numbers."""
        return []

    def __init__(self, cfg: LearnerConfig, model: EnvPolicy, dev: DeviceContext) -> None:
        self.cfg = cfg
        self.model = model
        self.dev = dev

    def batch(self, data: dict[str, Tensor]) -> tuple[Batch, dict[str, float]]:
        """A flat batch of [B, ...] fields for `loss`, and algorithm statistics for the metrics line.

        data: the round's segment fields, time-major: [T, K*N, ...] per step, [K*N] per env.
        """
        raise NotImplementedError

    def loss(self, model: EnvPolicy, b: Batch) -> tuple[Tensor, dict[str, Tensor]]:
        """Loss of a minibatch and its statistics (detached scalars)."""
        raise NotImplementedError

    def after_update(self, model: EnvPolicy, updates: int) -> None:
        """Called once per update, after the optimizer steps (`updates` counts them, from 1)."""

    def extra_tensors(self) -> list[Tensor]:
        """Device tensors the algorithm keeps besides the model (for the learner's byte count)."""
        return []

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass
