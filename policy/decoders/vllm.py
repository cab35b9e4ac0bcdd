"""`vllm`: a vLLM engine in the learner's process on its GPU or NPU (vllm-ascend), the learner's
weights loaded into it once per version (`policy/vllm_decoding.py` VllmDecoder)."""

from __future__ import annotations

from ...contracts.config import RelayConfig
from ...policy.decoders.base import DecoderEntry, DecodeSetup
from ...policy.vllm_decoding import VllmDecoder, VllmUnavailable, device_problem, vllm_problem


def build(setup: DecodeSetup) -> VllmDecoder:
    problem = device_problem(setup.device)
    if problem:
        raise VllmUnavailable(problem)
    cfg = setup.cfg
    assert cfg.model.path is not None
    return VllmDecoder(setup.policy, str(cfg.model.path), cfg.generation.vllm_memory_fraction, setup.seed)


def problem(cfg: RelayConfig) -> str | None:
    """The vllm package on this host, and a learner device it samples on."""
    missing = vllm_problem()
    if missing:
        return missing
    if cfg.learner.device == "cpu":
        return "generation.backend=vllm samples on a GPU or an NPU, not learner.device=cpu"
    return None


ENTRY = DecoderEntry(build, problem, placements=("learner",))
