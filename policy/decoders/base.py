"""What a decoder of a language policy is: the protocol the learner and the generator actors
sample completions through, and a registry entry that builds one (`policy/decoders`)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import torch
from torch import Tensor

from ...contracts.config import RelayConfig
from ...policy.causal_lm import CausalLMPolicy, Completions, Noise


class Decoder(Protocol):
    """Samples completions of left-padded prompts ids/mask [B, P]: `Completions` ([B, C] tokens,
    mask, log-probs; [B] ended). `load(version, weights)`: make weights `version` the ones it
    samples with (`weights()` names the policy's tensors: asked for only when the version is new;
    a decoder that samples from the policy's own tensors has nothing to load); `counts()`: its
    figures for the metrics line (graphs compiled)."""

    def __call__(
        self,
        prompt_ids: Tensor,
        prompt_mask: Tensor,
        max_new_tokens: int,
        temperature: float = 1.0,
        top_k: int = 0,
        generator: Noise | None = None,
    ) -> Completions: ...

    def load(self, version: int, weights: Callable[[], Mapping[str, Tensor]]) -> None: ...

    def counts(self) -> dict[str, int]: ...


@dataclass(frozen=True)
class DecodeSetup:
    """What building a decoder may read: the policy it samples for, the run's config, the device
    it samples on, the compile backend (`compile_backend()`: resolved only by a decoder that
    compiles; on npu it imports torchair) and the seed of its own noise (a decoder that draws it)."""

    policy: CausalLMPolicy
    cfg: RelayConfig
    device: torch.device
    compile_backend: Callable[[], Any]
    seed: int


@dataclass(frozen=True)
class DecoderEntry:
    """One `generation.backend` decoder. build: the decoder for a setup; problem: why it cannot
    run on this host or with this config (one line, preflight), None where it can; placements:
    where it may sample (`generation.placement`)."""

    build: Callable[[DecodeSetup], Any]  # a Decoder
    problem: Callable[[RelayConfig], str | None] = lambda cfg: None
    placements: tuple[str, ...] = ("learner", "workers")
