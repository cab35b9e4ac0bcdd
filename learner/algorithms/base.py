"""What an algorithm (`learner.algo`) provides to the learner: its traits, its config rules, the
batch it trains on, its loss and its own state. The update loop around it (`learner/update.py`)
and the learner (`learner/learner.py`) are shared by all of them.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch
from torch import Tensor

from contracts.algorithm import AlgorithmTraits
from contracts.config import LearnerConfig, RelayConfig
from contracts.segment import is_policy_input
from learner.device import DeviceContext
from policy.actor_critic import ActorCritic

Batch = dict[str, Tensor]


def policy_inputs(data: dict[str, Tensor]) -> dict[str, Tensor]:
    """The fields a policy reads (observation leaves, the action mask) of time-major round data
    [T, K*N, ...], flattened to [B = T*K*N, ...]."""
    return {k: v.flatten(0, 1) for k, v in data.items() if is_policy_input(k)}


@torch.no_grad()
def evaluate_in_chunks(
    model: ActorCritic, inputs: dict[str, Tensor], actions: Tensor, cfg: LearnerConfig, dev: DeviceContext
) -> tuple[Tensor, Tensor | None]:
    """(log-probs [B], values [B] or None) of `model` over a whole batch of input fields [B, ...],
    in minibatch-sized chunks (memory stays that of a minibatch), under the same autocast as the
    update's forward passes."""
    logps, values = [], []
    with dev.autocast(cfg.use_amp, cfg.amp_dtype):
        for start in range(0, actions.shape[0], cfg.batch_size):
            chunk = {k: v[start : start + cfg.batch_size] for k, v in inputs.items()}
            out = model.evaluate(chunk, actions[start : start + cfg.batch_size])
            logps.append(out.logp)
            if out.value is not None:
                values.append(out.value.float())
    return torch.cat(logps), (torch.cat(values) if values else None)


class Algorithm:
    """One update rule over time-major round data.

    critic: the policy has a value network. grouped: segments use the grouped layout (each env
    plays one episode per segment, members of a group share a start, `outcome` [N] holds each
    member's return); otherwise envs run on across segments.
    """

    critic: ClassVar[bool] = True
    grouped: ClassVar[bool] = False

    @classmethod
    def traits(cls) -> AlgorithmTraits:
        """What the rollout workers must know of this algorithm."""
        return AlgorithmTraits(critic=cls.critic, grouped=cls.grouped)

    @staticmethod
    def config_problems(cfg: RelayConfig) -> list[str]:
        """Rules particular to this algorithm, each naming fields and numbers."""
        return []

    def __init__(self, cfg: LearnerConfig, model: ActorCritic, dev: DeviceContext) -> None:
        self.cfg = cfg
        self.model = model
        self.dev = dev

    def batch(self, data: dict[str, Tensor]) -> tuple[Batch, dict[str, float]]:
        """A flat batch of [B, ...] fields for `loss`, and algorithm statistics for the metrics line.

        data: the round's segment fields, time-major: [T, K*N, ...] per step, [K*N] per env.
        """
        raise NotImplementedError

    def loss(self, model: ActorCritic, b: Batch) -> tuple[Tensor, dict[str, Tensor]]:
        """Loss of a minibatch and its statistics (detached scalars)."""
        raise NotImplementedError

    def after_update(self, model: ActorCritic, updates: int) -> None:
        """Called once per update, after the optimizer steps (`updates` counts them, from 1)."""

    def extra_tensors(self) -> list[Tensor]:
        """Device tensors the algorithm keeps besides the model (for the learner's byte count)."""
        return []

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass
