"""`eager`: the policy's own KV-cache loop (`CausalLMPolicy.generate`), step by step in Python:
any shape, nothing compiled; the plain reference the compiled `static` decoder is tied to."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from torch import Tensor

from ...policy.causal_lm import CausalLMPolicy, Completions
from ...policy.decoders.base import DecoderEntry, DecodeSetup


class EagerDecoder:
    def __init__(self, policy: CausalLMPolicy) -> None:
        self.policy = policy

    def __call__(self, *args: Any, **kwargs: Any) -> Completions:
        return self.policy.generate(*args, **kwargs)

    def load(self, version: int, weights: Callable[[], Mapping[str, Tensor]]) -> None:
        pass  # it samples from the policy's own tensors

    def counts(self) -> dict[str, int]:
        return {}


def build(setup: DecodeSetup) -> EagerDecoder:
    return EagerDecoder(setup.policy)


ENTRY = DecoderEntry(build)
