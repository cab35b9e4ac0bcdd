"""What a policy family gives the rest of relay, as protocols: the learner, the algorithms, the
tools and the rollout side are typed on these, so a new family (the causal language model beside
the env actor-critic) is one more implementation, not a branch in every caller.

Two families share `Policy` (weights in and out, what the acting side needs); `EnvPolicy` acts on
an env's observations step by step with a recurrent state, `LanguagePolicy` samples whole
completions for prompts with a KV cache.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any, Protocol, runtime_checkable

import torch
from torch import Tensor

from ..contracts.spaces import ActionSpec


@runtime_checkable
class Policy(Protocol):
    """Weights in and out, and its parameters for the optimizer."""

    def state_dict(self, *args: Any, **kwargs: Any) -> dict[str, Any]: ...
    def load_state_dict(
        self, state_dict: Mapping[str, Any], strict: bool = True, assign: bool = False
    ) -> Any: ...
    def parameters(self, recurse: bool = True) -> Iterator[torch.nn.Parameter]: ...
    def train(self, mode: bool = True) -> Any: ...
    def eval(self) -> Any: ...
    def acting_weights(self) -> dict[str, Tensor]:
        """The weights the acting side (rollout workers, generators) needs, by state-dict key."""
        ...


@runtime_checkable
class EnvPolicy(Policy, Protocol):
    """An env policy: observations [B, ...] (a tree of fields) to actions, log-probs and values.

    `noise` is drawn by the caller (CPU-drawn for bit-exact runs); a recurrent policy carries a
    state [B, S] from `initial_state`."""

    # Running statistics of the discounted return (env.normalize_reward), or None; of the
    # observations (the learner folds the workers' moments into them between updates); of a
    # centralized critic's global state, or None.
    return_stats: Any
    normalizer: Any
    global_normalizer: Any
    # The action space it acts in (contracts/spaces.py ActionSpec: kind, shape, choices).
    action: ActionSpec

    @property
    def has_critic(self) -> bool: ...
    @property
    def recurrent(self) -> bool: ...
    def initial_state(self, batch: int) -> Tensor | None: ...
    def act_with_state(self, inputs: Any, noise: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor | None]: ...
    def evaluate(self, inputs: Any, actions: Tensor) -> Any: ...
    def value(self, inputs: Any) -> Tensor: ...
    @property
    def acting_state_size(self) -> int:
        """Floats of recurrent state acting alone carries per env (0 without a core)."""
        ...

    def choose(self, inputs: Any, noise: Tensor | None = None) -> tuple[Tensor, Tensor | None]:
        """Actions [B, *act] (greedy without `noise`, sampled with it) and the state after the
        step [B, S] (None without a core): acting alone, as evaluation and scenes do."""
        ...

    def policy_step(self, inputs: Any) -> tuple[Tensor, Tensor | None]:
        """The acting path alone: action params [B, param_size] and a recurrent policy's state
        after the step (what exported graphs, serving and `relay verify` run)."""
        ...

    def sample_actions(self, params: Tensor, noise: Tensor, mask: Tensor | None = None) -> Tensor:
        """Actions [B, *act] from `policy_step`'s params and caller noise."""
        ...

    def action_summary(self, inputs: Any) -> Tensor:
        """What precision checks compare, float32 [B, param_size]: the probabilities of every
        choice (0 where masked) or bit, or the Gaussian's mean (before any action transform)."""
        ...

    def to(self, *args: Any, **kwargs: Any) -> Any: ...


@runtime_checkable
class LanguagePolicy(Policy, Protocol):
    """A causal language model: completions sampled for left-padded prompts [B, P] with a KV cache,
    and the log-probabilities of given completions [B, C], computed in chunks of positions."""

    def generate(
        self,
        prompt_ids: Tensor,
        prompt_mask: Tensor,
        max_new_tokens: int,
        temperature: float,
        top_k: int,
        generator: Any,  # a torch.Generator or causal_lm.NoiseRows
    ) -> Any: ...
    def completion_logp(
        self,
        prompt_ids: Tensor,
        prompt_mask: Tensor,
        completion: Tensor,
        completion_mask: Tensor,
        temperature: float,
        chunk: int,
        with_entropy: bool,
    ) -> tuple[Tensor, Tensor | None]: ...
