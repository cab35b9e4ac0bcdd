"""Generator actors (`generation.placement: workers`): copies of the language policy on their own
CPUs that sample completions with the weights the learner published, by version.

A generator samples only with the version it is asked for: weights of another version are
refused, in one line, rather than used (TRL #5312: a generator silently left on stale weights gave
importance ratios of 1e-17). Weights travel in bf16 (half the bytes); the learner corrects for the
gap between the generator's log-probs and its own (`learner/lm/tokens.py` truncated_is_weight).
"""

from __future__ import annotations

import os
import time
from typing import Any

import numpy as np
import ray
import torch

from ...contracts.config import RelayConfig, language_seed
from ...policy.causal_lm import build_language_policy, completion_ids
from ...policy.compiling import torch_backend
from ...policy.decoders import DecodeSetup, build_decoder
from ...policy.weight_wires import load_weights, wire_for
from ..worker import adopt_workdir


class StaleWeightsError(RuntimeError):
    """A generator asked to sample with a version it does not hold."""


class Generator:
    """One generator: the model of model.path, weights loaded by version, sampling on its CPUs."""

    def __init__(self, cfg_data: dict[str, Any], index: int, workdir: str | None = None) -> None:
        cfg = RelayConfig.model_validate(cfg_data)
        self.index = index
        if workdir is not None:
            adopt_workdir(workdir, cfg)
        torch.set_num_threads(max(1, int(cfg.rollout.num_cpus_per_worker)))
        assert cfg.model.path is not None
        policy, self.tokenizer = build_language_policy(cfg)
        self.policy = policy.eval()
        self.cfg = cfg
        self.wire = wire_for(cfg)
        self.version = -1
        self.generator = torch.Generator().manual_seed(language_seed(cfg) * 1000 + index + 1)
        # generation.backend's decoder on these CPUs; a compiling one with torch's backend of
        # that name (the learner's device graph mode is not this actor's).
        self.decode = build_decoder(
            DecodeSetup(
                self.policy,
                cfg,
                torch.device("cpu"),
                lambda: torch_backend(cfg.learner.compile_backend),
                language_seed(cfg) * 1000 + index + 1,
            )
        )

    def set_weights(self, version: int, weights: list[Any]) -> tuple[float, int]:
        """Load weights `version` ([object ref of the learner's (version, payload)]); returns the
        seconds it took to receive and load them (what `weight_sync_s` reports when the sync
        overlaps generation) and the bytes received (`weight_sync_bytes`). A payload of another
        version is refused (StaleWeightsError), before anything is loaded."""
        t0 = time.perf_counter()
        sent = weights[0]
        if isinstance(sent, ray.ObjectRef):
            sent = ray.get(sent)
        sent_version, packed = sent
        if int(sent_version) != version:
            raise StaleWeightsError(
                f"generator {self.index} was sent weights version {sent_version} as version {version}"
            )
        # With LoRA only the adapters come: the base is the one model.path holds.
        load_weights(self.policy, self.wire.unpack(packed), strict=not self.policy.lora)
        self.version = version
        return time.perf_counter() - t0, int(self.wire.nbytes(packed))

    def generate(self, version: int, ids: np.ndarray, mask: np.ndarray) -> dict[str, Any]:
        """Completions of left-padded prompts ids/mask [b, P] with weights `version`: tokens,
        mask and log-probs [b, C] and ended [b] (for the learner), and each row's completion
        token ids through its end token and its text (for the rewards, which then need not wait
        for the learner)."""
        if version != self.version:
            raise StaleWeightsError(
                f"generator holds weights version {self.version}, was asked to sample with {version}"
            )
        gen = self.cfg.generation
        t0 = time.perf_counter()
        out = self.decode(
            torch.from_numpy(np.array(ids)),  # a copy: arrays from the object store are read-only
            torch.from_numpy(np.array(mask)),
            gen.max_new_tokens,
            gen.temperature,
            gen.top_k,
            self.generator,
        )
        seconds = time.perf_counter() - t0
        ids_list = completion_ids(out.tokens, out.mask)
        return {
            "tokens": out.tokens.numpy(),
            "mask": out.mask.numpy(),
            "logp": out.logp.numpy(),
            "ended": out.ended.numpy(),
            "version": np.asarray(version),
            "seconds": np.asarray(seconds),
            "completion_ids": ids_list,
            "texts": self.tokenizer.batch_decode(ids_list, skip_special_tokens=True),
        }

    def generate_rows(self, version: int, batch: dict[str, Any], lo: int, hi: int) -> dict[str, Any]:
        """`generate` of rows [lo, hi) of a prepared round (the learner's `prepare_round`, handed
        over as its object ref: this call starts once the learner has prepared it, without a
        round trip through the driver)."""
        return self.generate(version, batch["ids"][lo:hi], batch["mask"][lo:hi])


def generator_count(cfg: RelayConfig) -> int:
    """Generator actors the run has: one beside each reward actor (rollout.num_workers) where a
    language run generates on workers (generation.placement=workers), else none."""
    return cfg.rollout.num_workers if cfg.generation.placement == "workers" else 0


def create_generators(cfg: RelayConfig) -> list[Any]:
    """`generator_count` generator actors, rollout.num_cpus_per_worker CPUs each."""
    cls = ray.remote(Generator).options(num_cpus=cfg.rollout.num_cpus_per_worker, max_restarts=0)
    data = cfg.model_dump(mode="json")
    return [cls.remote(data, i, os.getcwd()) for i in range(generator_count(cfg))]
