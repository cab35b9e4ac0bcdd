"""Decoders of a language policy, a registry: `eager` (the policy's own loop), `static` (today's
compiled static-cache decoder) and `vllm` (an engine in the learner's process). The learner and
the generator actors choose theirs with `decoder_name` and build it with `build_decoder`.

A new decoder (SGLang, say) is one module with a `DecoderEntry` and one line in DECODERS; the
run names it with `generation.backend`.
"""

from __future__ import annotations

from ...contracts.config import RelayConfig
from ...policy.decoders import eager, static, vllm
from ...policy.decoders.base import Decoder, DecoderEntry, DecodeSetup

DECODERS: dict[str, DecoderEntry] = {
    "eager": eager.ENTRY,
    "static": static.ENTRY,
    "vllm": vllm.ENTRY,
}
RELAY = "relay"  # generation.backend's default: relay's own decoders, eager or static


def decoder_name(cfg: RelayConfig) -> str:
    """The run's decoder: generation.backend names one, or is `relay`: the compiled static-cache
    decoder where generation.compile, else the eager loop."""
    gen = cfg.generation
    if gen.backend != RELAY:
        return gen.backend
    return "static" if gen.compile else "eager"


def decoder_entry(cfg: RelayConfig) -> DecoderEntry:
    """The run's decoder entry; ValueError naming the registered ones otherwise."""
    name = decoder_name(cfg)
    if name not in DECODERS:
        raise ValueError(
            f"generation.backend={name!r} is not a decoder: choose {', '.join([RELAY, *DECODERS])}"
        )
    return DECODERS[name]


def build_decoder(setup: DecodeSetup) -> Decoder:
    """The run's decoder for `setup`."""
    return decoder_entry(setup.cfg).build(setup)


__all__ = [
    "DECODERS",
    "DecodeSetup",
    "Decoder",
    "DecoderEntry",
    "build_decoder",
    "decoder_entry",
    "decoder_name",
]
