"""`generation.backend: vllm`: a causal LM's completions sampled by vLLM (vllm-ascend on an Ascend
host) inside the learner's process, on its device, behind the same call as relay's own decoders.

Why colocated, and why this shape: it is TRL's `vllm_mode="colocate"` (trl/generation/
vllm_generation.py): one `vllm.LLM` built from model.path in the learner's process
(`distributed_executor_backend="external_launcher"`, so the engine runs in this process and its
model's parameters can be written directly), holding `generation.vllm_memory_fraction` of the
device for its weights and KV cache; after every update the learner's weights are loaded into
it by name (`load_weights`, what vLLM's model classes take from a checkpoint), once per version,
and its prefix cache dropped (cached prompt states were computed by the old weights).

The completions come back as relay's `Completions` [B, max_new_tokens]: tokens padded after the
end, the mask 1 through the end token, vLLM's log-prob of each sampled token (processed: after
temperature and top-k, as relay's own sampler reports its own), and whether the row ended by an
end token. vLLM draws its own noise on the device, so generation.noise=cpu and bit-exact runs are
not on offer with it, and it captures its own graphs (generation.compile is relay's decoder only).
vLLM cannot run on this project's CPU-only hosts; tests/llm/test_vllm_backend.py ties this
adapter to a stand-in package that follows the calls used here.
"""

from __future__ import annotations

import importlib.util
import os
import socket
from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import Tensor

from .causal_lm import CausalLMPolicy, Completions


class VllmUnavailable(RuntimeError):
    """vLLM cannot sample here (not installed, or no GPU/NPU), in one line."""


def vllm_problem() -> str | None:
    """Why generation.backend=vllm cannot start in this environment, or None. Imports nothing."""
    if importlib.util.find_spec("vllm") is None:
        return (
            "generation.backend=vllm needs the vllm package on the learner's host (pip install vllm; "
            "vllm-ascend on an Ascend host); it is not installed here: use generation.backend=relay"
        )
    return None


def device_problem(device: torch.device) -> str | None:
    """Why vLLM cannot sample on the learner's `device`, or None (it needs a GPU or an NPU)."""
    if device.type in ("cuda", "npu"):
        return None
    return (
        f"generation.backend=vllm samples on a GPU or an NPU; the learner's device is {device.type}: "
        "use generation.backend=relay"
    )


def _single_process_rendezvous() -> None:
    """The torch.distributed variables vLLM's external launcher reads, for a world of one
    (kept where the caller set them, as TRL does for its ranks)."""
    if "MASTER_PORT" not in os.environ:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            os.environ["MASTER_PORT"] = str(s.getsockname()[1])
    for key, value in (("RANK", "0"), ("LOCAL_RANK", "0"), ("WORLD_SIZE", "1"), ("MASTER_ADDR", "127.0.0.1")):
        os.environ.setdefault(key, value)


class VllmDecoder:
    """`decode(ids [B, P], mask [B, P], max_new_tokens, temperature, top_k, generator)` through
    one colocated `vllm.LLM` (the `generator` is unused: vLLM draws its own noise)."""

    def __init__(self, policy: CausalLMPolicy, model_path: str, memory_fraction: float, seed: int) -> None:
        problem = vllm_problem()
        if problem:
            raise VllmUnavailable(problem)
        import vllm

        _single_process_rendezvous()
        self.policy = policy
        self._sampling = vllm.SamplingParams
        self.llm = vllm.LLM(
            model=model_path,
            dtype="auto",
            seed=seed,
            gpu_memory_utilization=memory_fraction,
            distributed_executor_backend="external_launcher",
            logprobs_mode="processed_logprobs",
        )
        self.version = -1
        self.loads = 0

    def load(self, version: int, weights: Callable[[], Mapping[str, Tensor]]) -> None:
        """Write weights (`weights()`: Hugging Face names to the learner's tensors, asked for only
        when `version` is new) into vLLM's model, once per version."""
        if version == self.version:
            return
        model: Any = self.llm.llm_engine.model_executor.driver_worker.model_runner.model
        model.load_weights(weights().items())
        self.llm.reset_prefix_cache()
        self.version = version
        self.loads += 1

    def counts(self) -> dict[str, int]:
        return {}  # vLLM keeps its own graph captures; relay counts its decoder's

    def __call__(
        self,
        prompt_ids: Tensor,
        prompt_mask: Tensor,
        max_new_tokens: int,
        temperature: float = 1.0,
        top_k: int = 0,
        generator: torch.Generator | None = None,
    ) -> Completions:
        rows = [
            {"prompt_token_ids": ids[keep.bool()].tolist()}
            for ids, keep in zip(prompt_ids.cpu(), prompt_mask.cpu(), strict=True)
        ]
        params = self._sampling(
            n=1,
            temperature=temperature,
            top_k=top_k,  # 0: every token, as TRL passes it
            max_tokens=max_new_tokens,
            logprobs=0,  # the sampled token's own log-prob
            stop_token_ids=list(self.policy.eos_ids),
        )
        outputs = self.llm.generate(rows, sampling_params=params, use_tqdm=False)
        return completions_of(
            [out.outputs[0] for out in outputs], max_new_tokens, self.policy.pad_id, prompt_ids.device
        )


def completions_of(outputs: list[Any], width: int, pad_id: int, device: torch.device) -> Completions:
    """vLLM's `CompletionOutput`s (token_ids, logprobs: one {token id: Logprob} per token,
    finish_reason) as `Completions` [B, width]."""
    batch = len(outputs)
    tokens = torch.full((batch, width), pad_id, dtype=torch.long)
    mask = torch.zeros((batch, width), dtype=torch.float32)
    logp = torch.zeros((batch, width), dtype=torch.float32)
    ended = torch.zeros(batch, dtype=torch.bool)
    for row, out in enumerate(outputs):
        ids = list(out.token_ids)[:width]
        n = len(ids)
        tokens[row, :n] = torch.tensor(ids, dtype=torch.long)
        mask[row, :n] = 1.0
        if out.logprobs is not None:
            logp[row, :n] = torch.tensor(
                [step[tok].logprob for step, tok in zip(list(out.logprobs)[:n], ids, strict=True)],
                dtype=torch.float32,
            )
        ended[row] = out.finish_reason == "stop"
    return Completions(tokens.to(device), mask.to(device), logp.to(device), ended.to(device))
