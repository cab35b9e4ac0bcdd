"""`static`: one compiled fixed-shape decode step over a static KV cache (`policy/lm_decoding.py`
StaticDecoder), compiled once in the first round whatever the prompts' lengths; what
`generation.compile: true` chooses."""

from __future__ import annotations

from ...policy.decoders.base import DecoderEntry, DecodeSetup
from ...policy.lm_decoding import StaticDecoder


def build(setup: DecodeSetup) -> StaticDecoder:
    gen = setup.cfg.generation
    widest = gen.buckets(setup.cfg.prompts.max_prompt_tokens)[-1]
    return StaticDecoder(setup.policy, setup.compile_backend(), widest, gen.temperature, gen.top_k)


ENTRY = DecoderEntry(build)
