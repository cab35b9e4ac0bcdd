"""The learner of a language run (`model.kind: causal_lm`): it generates each round's completions
on its own device (`generation.placement: learner`: weights never move, the sampler's log-probs are
the learner's) and trains on them: advantages by the run's estimator (`learner.algo`: grpo, rloo,
reinforce_pp), per-token losses by its policy loss (`learner.lm.policy_loss`). No Ray here:
`services/driver/lm_backend.py` runs it in-process or as an actor (`actor.py`).

Memory follows the Ascend tutorial: float32 master weights under bf16 autocast where the device
computes bf16, gradient checkpointing of the blocks (`learner.grad_checkpointing`), micro-batches
by token budget with gradient accumulation (`learner.lm.micro_batch_tokens`), and log-probs in
chunks of positions (`learner.lm.logprob_chunk`), so `[B, C, vocab]` logits never exist at once.
"""

from __future__ import annotations

import copy
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ...contracts.config import RelayConfig, language_seed
from ...contracts.prompts import PromptOrder, PromptSet, as_completions, load_prompts, pad_left, rewards_input
from ...learner.device import DeviceContext, resolve_device
from ...learner.lm import sharding, tokens
from ...learner.lm import shards as shards_io
from ...learner.lm.estimators import RoundRewards, estimator
from ...learner.lm.policy_losses import TokenBatch, policy_loss
from ...learner.lm.settings import amp_of, lm_settings
from ...learner.telemetry import LearnerTelemetry
from ...policy.causal_lm import (
    CausalLMPolicy,
    Completions,
    NoiseRows,
    build_language_policy,
    complete,
    completion_ids,
    folder_weights,
)
from ...policy.compiling import counting_compile
from ...policy.decoders import DecodeSetup, build_decoder
from ...policy.weight_wires import wire_for


def lm_precision(cfg: RelayConfig, dev: DeviceContext) -> tuple[bool, str]:
    """(autocast on, its dtype): `auto` is bf16 where the device computes it in hardware."""
    return amp_of(cfg.learner.use_amp, cfg.learner.amp_dtype, dev)


class LanguageLearner:
    """Generation and updates of one causal LM on one device."""

    def __init__(self, cfg: RelayConfig) -> None:
        self.cfg = cfg
        lc = cfg.learner
        self.lm = lm_settings(cfg)
        self.estimator = estimator(lc.algo)
        self.estimator_settings = self.estimator.settings_of(lc)
        self.loss = policy_loss(self.lm.policy_loss)
        self.loss_settings = self.loss.settings_of(lc, self.lm.policy_loss)
        self.dev = resolve_device(lc.device, lc.npu_ids)
        torch.manual_seed(language_seed(cfg))
        assert cfg.model.path is not None
        # A rank of a sharded learner builds the model empty and takes its shards of the weights
        # once sharded (`shard`): the whole model is read once, by rank 0, not once per rank.
        # (With LoRA the adapters are drawn as the model is built: each rank builds it whole.)
        self.deferred = lc.num_learners > 1 and cfg.model.lora is None
        self.policy, self.tokenizer = build_language_policy(cfg, empty=self.deferred)
        if not self.deferred:
            self.policy.to(self.dev.device)
        if lc.grad_checkpointing:
            self.policy.set_checkpointing(True)
        # A KL coefficient of 0 loads no reference model: half the memory, one forward pass less;
        # with LoRA the reference is the frozen base itself (the adapters switched off).
        self.reference = (
            copy.deepcopy(self.policy).eval().requires_grad_(False)
            if lc.kl_coef > 0 and not self.policy.lora
            else None
        )
        self.kl = lc.kl_coef > 0
        self.amp, self.amp_dtype = lm_precision(cfg, self.dev)
        self.telemetry = LearnerTelemetry(self.dev, lc.num_cpus)
        self.scaler = self.dev.grad_scaler(self.amp, self.amp_dtype)
        trainable = [p for p in self.policy.parameters() if p.requires_grad]
        self.optimizer = self.dev.adam(trainable, lc.lr, eps=1e-8)
        assert cfg.prompts.train is not None  # the config's rules require it of a language run
        self.prompts: PromptSet = load_prompts(
            cfg.prompts.train, self.tokenizer, cfg.prompts.max_prompt_tokens
        )
        seed = language_seed(cfg)
        self.order = PromptOrder(len(self.prompts), cfg.prompts.batch_size, seed, cfg.prompts.shuffle)
        self.buckets = cfg.generation.buckets(cfg.prompts.max_prompt_tokens)
        gen = cfg.generation
        self.noise_device = torch.device("cpu") if gen.noise == "cpu" else self.dev.device
        self.generator = torch.Generator(self.noise_device).manual_seed(language_seed(cfg))
        # generation.compile: the compiled static-cache step; else the eager loop it is tied to.
        # learner.compile: the update's log-probs (forward, and backward through AOTAutograd)
        # compiled once per prompt bucket and micro-batch size; the frozen passes stay eager.
        self.update_compiles = 0
        # The device's backend, resolved once for both (on npu it imports torchair: only if asked).
        backend = self.dev.compile_backend(lc.compile_backend) if lc.compile or gen.compile else None
        self._compile_backend = backend
        self._compiled_logp = self._compile_logp()

        # generation.backend's decoder (policy/decoders): the eager loop, the compiled static
        # one, or a vLLM engine; a compiling one takes the backend resolved above.
        def compiled_by() -> Any:
            return backend if backend is not None else self.dev.compile_backend(lc.compile_backend)

        self.decoder = build_decoder(
            DecodeSetup(self.policy, cfg, self.dev.device, compiled_by, language_seed(cfg))
        )
        self.version = 0
        self.updates = 0
        self.rounds = 0  # rounds prepared: round k's sampling noise is seeded by (seed, k)
        self.skipped_steps = 0
        # This learner's place in the learner group: rank of world, rows [lo, lo + b) of each
        # round's B (`shard`; one learner alone holds every row).
        self.rank, self.world = 0, 1
        self.sharded = False
        self._bytes: dict[str, int] | None = None  # `_param_bytes`, measured at the first update
        self._round: dict[str, torch.Tensor] | None = None
        self._pending: dict[str, Any] | None = None
        self._order_before: dict[str, int] | None = None  # the prompt order before the last prepare_round
        self._kept: list[dict[str, torch.Tensor]] = []  # groups set aside for the update (refills)
        self._eval_prompts: PromptSet | None = None
        self.wire = wire_for(cfg)
        self._packed: Any = None  # the previous version's payload, whose buffer the wire may reuse
        self._generated_by: int | None = None  # the generators' weights version, or None: here

    def shard(self, rank: int, world: int) -> None:
        """Shard the policy (and a reference model) over the learner group this rank has joined
        (`learner/lm/sharding.py`: FSDP2), an empty one given its shards of model.path's weights
        from rank 0; the optimizer is made anew over the shards. From now on
        this learner samples and trains rows [rank * B / world, (rank + 1) * B / world) of each
        round of B rows: whole groups."""
        self.rank, self.world = rank, world
        if world == 1 and not torch.distributed.is_initialized():
            return  # one learner alone; a group of one (the device check's FSDP2 row) is sharded
        mixed = self.amp and self.amp_dtype == "bfloat16"
        unhook = getattr(self.decoder, "unhook", None)  # a compiled decoder: before any hook
        if unhook is not None:
            unhook()
        sharding.shard(self.policy, self.policy.lm, self.dev.type, mixed)
        if self.reference is not None:
            sharding.shard(self.reference, self.reference.lm, self.dev.type, mixed)
        if self.deferred:
            assert self.cfg.model.path is not None
            full = folder_weights(self.cfg.model.path) if rank == 0 else {}
            for module in (self.policy, self.reference):
                if module is not None:
                    sharding.materialize(module, self.dev.device, full)
            del full
        self.scaler = self.dev.grad_scaler(self.amp, self.amp_dtype, sharded=True)
        self._compiled_logp = self._compile_logp()  # through the root unit's gather, registered now
        # Fused Adam would take the scaler's non-finite flag into its kernel, a plain [1] tensor
        # beside DTensor shards (which DTensor refuses): with a scaler it steps foreach, after
        # the scaler's own check.
        trainable = [p for p in self.policy.parameters() if p.requires_grad]
        self.optimizer = self.dev.adam(trainable, self.cfg.learner.lr, eps=1e-8, fused=self.scaler is None)
        self.sharded = True

    def _compile_logp(self) -> Any:
        """learner.compile: the policy's `completion_logp` (bound: on a sharded policy, the form
        FSDP registered, which gathers the root unit's parameters first; each unit's gather is
        a graph break, so a sharded policy's pass is a few graphs, each compiled once)."""
        if self._compile_backend is None or not self.cfg.learner.compile:
            return None
        return counting_compile(self.policy.completion_logp, self._compile_backend, self._count)

    def _rows(self, total: int) -> slice:
        """This rank's rows of a round of `total`."""
        share = total // self.world
        return slice(self.rank * share, (self.rank + 1) * share)

    # ---- generation ---------------------------------------------------------------------------
    def describe(self) -> dict[str, Any]:
        return {
            "device": str(self.dev),
            "parameters": sum(p.numel() for p in self.policy.parameters()),
            "learner_ranks": self.world,
            "precision": self.amp_dtype if self.amp else "float32",
            "threads": torch.get_num_threads(),
        }

    def prepare_round(self) -> dict[str, Any]:
        """The round's prompts: prompts.batch_size rows, each repeated learner.group_size times
        (members of a group adjacent), left-padded to their bucket: ids and mask [B, P], and
        the rows' prompts and dataset columns (what the rewards take beside the completions).
        The whole round (the generators sample it all); this rank keeps its rows for `train`
        (every rank of a group prepares each round)."""
        self._order_before = self.order.state_dict()  # where a resume takes these prompts again
        idx = [i for i in self.order.next() for _ in range(self.cfg.learner.group_size)]
        prompts, token_ids, columns = self.prompts.rows(idx)
        # the round's width, whichever rows this rank takes: the shapes one learner would have
        ids, mask = pad_left(token_ids, self.buckets, self.policy.pad_id)
        rows = self._rows(len(idx))
        whole = {"prompts": prompts, "columns": columns, "ids": ids, "mask": mask}
        self._pending = {
            "prompts": prompts[rows],
            "columns": {k: v[rows] for k, v in columns.items()},
            "ids": ids[rows],
            "mask": mask[rows],
        }
        # Round k's noise: seeded by (seed, k), every rank drawing the whole round's rows and
        # keeping its own (NoiseRows), so a round's completions are the same at any
        # learner.num_learners however many steps each rank's rows take to end.
        self.generator.manual_seed((language_seed(self.cfg) * 1_000_003 + self.rounds) % 2**63)
        self._noise = NoiseRows(self.generator, len(idx), rows.start)
        self.rounds += 1
        return whole

    def generate_round(self) -> dict[str, Any]:
        """`generation.placement: learner`: sample the round's completions here, on the device.

        Returns what the rewards need (`contracts/prompts.py` rewards_input: prompts and columns
        repeated per member, completion texts, or assistant messages for chat prompts) and the
        round's generation figures; the token tensors stay on the device for `train`."""
        self.prepare_round()
        assert self._pending is not None
        batch = dict(self._pending)  # this rank's rows: it samples those
        gen = self.cfg.generation
        ids_t = torch.from_numpy(batch["ids"]).to(self.dev.device)
        mask_t = torch.from_numpy(batch["mask"]).to(self.dev.device)
        self.policy.eval()
        self.dev.synchronize()
        t0 = time.perf_counter()
        with self.dev.autocast(self.amp, self.amp_dtype), sharding.gathered(self.policy):
            out = self._generate(ids_t, mask_t, gen.top_k, self._noise)
        self.dev.synchronize()
        gen_s = time.perf_counter() - t0
        self._accept(out.tokens, out.mask, out.logp, None)
        ids_list = completion_ids(out.tokens.cpu(), out.mask.cpu())
        texts = self.tokenizer.batch_decode(ids_list, skip_special_tokens=True)
        ended = out.ended.cpu().numpy().tolist()
        return rewards_input(
            batch["prompts"], batch["columns"], ids_list, texts, ended, gen_s, int(batch["ids"].shape[1])
        )

    def _generate(
        self, ids: torch.Tensor, mask: torch.Tensor, top_k: int, noise: torch.Generator | NoiseRows
    ) -> Completions:
        gen = self.cfg.generation
        # a decoder with its own copy of the weights (vLLM's) refreshes it by version
        self.decoder.load(self.version, self.policy.lm.state_dict)
        return self.decoder(ids, mask, gen.max_new_tokens, gen.temperature, top_k, noise)

    def accept_generated(self, *parts: dict[str, np.ndarray]) -> None:
        """`generation.placement: workers`: the generators' completions of `prepare_round`'s
        prompts, in row order ([b, C] tokens, mask, log-probs and the weights version of each
        part), this rank's rows kept for `train`. The rewards take the texts the generators
        decoded, so nothing here is waited for (the driver queues this call and goes on)."""
        dev = self.dev.device
        rows = self._rows(sum(len(p["tokens"]) for p in parts))

        def cat(key: str, dtype: torch.dtype) -> torch.Tensor:
            return torch.from_numpy(np.concatenate([p[key] for p in parts])[rows]).to(dev, dtype)

        versions = [int(p["version"]) for p in parts]
        self._accept(
            cat("tokens", torch.long), cat("mask", torch.float32), cat("logp", torch.float32), min(versions)
        )

    def _accept(
        self, tokens: torch.Tensor, mask: torch.Tensor, logp: torch.Tensor, generator_version: int | None
    ) -> None:
        """The prepared round's completions [B, C], kept on the device for `train`."""
        pending, self._pending = self._pending, None
        if pending is None:
            raise RuntimeError("completions accepted before prepare_round()")
        self._round = {
            "prompt_ids": torch.from_numpy(pending["ids"]).to(self.dev.device),
            "prompt_mask": torch.from_numpy(pending["mask"]).to(self.dev.device),
            "tokens": tokens,
            "mask": mask,
            "gen_logp": logp,
        }
        # Sampled elsewhere, with weights of this version: the learner's log-probs are the old
        # policy's, and the generator's differ from them (numerics, precision, staleness).
        self._generated_by = generator_version

    def evaluate(self, limit: int, greedy: bool) -> dict[str, Any]:
        """Completions of the first `limit` prompts of prompts.eval (one each; greedy or sampled),
        in batches of a round's rows, for the rewards to score."""
        cfg = self.cfg
        if self._eval_prompts is None:
            assert cfg.prompts.eval is not None
            self._eval_prompts = load_prompts(
                cfg.prompts.eval, self.tokenizer, cfg.prompts.max_prompt_tokens, "prompts.eval"
            )
        rows = list(range(min(limit, len(self._eval_prompts))))
        prompts, token_ids, columns = self._eval_prompts.rows(rows)
        per = cfg.prompts.batch_size * cfg.learner.group_size
        self.policy.eval()
        # the same draws each time
        noise = torch.Generator(self.noise_device).manual_seed(language_seed(cfg) + 1)

        def decode(ids: torch.Tensor, mask: torch.Tensor) -> Completions:
            with self.dev.autocast(self.amp, self.amp_dtype), sharding.gathered(self.policy):
                return self._generate(ids, mask, 1 if greedy else cfg.generation.top_k, noise)

        ids_list = complete(decode, token_ids, self.buckets, self.policy.pad_id, per, self.dev.device)
        texts = self.tokenizer.batch_decode(ids_list, skip_special_tokens=True)
        return {
            "prompts": prompts,
            "completions": as_completions(prompts, texts),
            "completion_ids": ids_list,
            "columns": columns,
            "lengths": [len(ids) for ids in ids_list],
            "version": self.version,
        }

    def acting_weights(self) -> dict[str, torch.Tensor]:
        """The current weights in float32 on the CPU (what a best.pt keeps)."""
        if self.sharded:
            return sharding.full_state(self.policy)  # every rank calls it: a collective
        return {k: v.detach().to("cpu", copy=True) for k, v in self.policy.state_dict().items()}

    def keep(self, groups: list[int]) -> None:
        """Set these groups of the round just generated (indices into the whole round) aside for
        the next update and drop the rest (learner.lm.refill_rounds); `train` then trains on
        every group set aside. A rank of a sharded learner holds only its rows of a round, and
        the groups kept are any of the round's: each rank gathers the whole round's rows first (a
        collective; they are a round's tokens, not its activations) and keeps every group set
        aside, so the update takes its share of them as of any round (`_take_kept`)."""
        if self._round is None:
            raise RuntimeError("keep() before a round was generated")
        whole = {k: sharding.gather_rows(v) for k, v in self._round.items()} if self.sharded else self._round
        g = self.cfg.learner.group_size
        rows = torch.tensor(
            [k * g + j for k in groups for j in range(g)], dtype=torch.long, device=self.dev.device
        )
        self._kept.append({k: v[rows] for k, v in whole.items()})
        self._round = None

    def _take_kept(self) -> dict[str, torch.Tensor]:
        """The groups set aside, as one round (this rank's rows of it): prompts left-padded to
        the widest bucket among them."""
        parts, self._kept = self._kept, []
        width = max(p["prompt_ids"].shape[1] for p in parts)

        def widen(t: torch.Tensor, value: int) -> torch.Tensor:
            return torch.nn.functional.pad(t, (width - t.shape[1], 0), value=value)

        whole = {
            "prompt_ids": torch.cat([widen(p["prompt_ids"], self.policy.pad_id) for p in parts]),
            "prompt_mask": torch.cat([widen(p["prompt_mask"], 0) for p in parts]),
            **{k: torch.cat([p[k] for p in parts]) for k in ("tokens", "mask", "gen_logp")},
        }
        mine = self._rows(whole["tokens"].shape[0])
        return {k: v[mine] for k, v in whole.items()}

    def weights(self) -> Any:
        """The current weights as the run's wire packs them for the generators (by default bf16
        in one buffer; the previous version's buffer is reused: Ray's put copied it into the
        object store), with their version: (version, payload), so a generator loads only the
        version it was told. A sharded learner's are gathered whole first (a collective: every
        rank calls it, rank 0 returns them, the others None): the gather is done before any
        generator reads a byte, never interleaved with the sending."""
        if self.sharded:  # every rank takes part in the gather; rank 0 alone holds and sends them
            state = sharding.full_state(self.policy)
            if self.rank != 0:
                return None
            self._packed = self.wire.pack(self.policy.acting_part(state), self._packed)
        else:
            self._packed = self.wire.pack(self.policy.acting_weights(), self._packed)
        return self.version, self._packed

    # ---- the update ---------------------------------------------------------------------------
    def _micro_batches(self, rows: int, width: int) -> list[slice]:
        per = max(1, self.lm.micro_batch_tokens // width)
        return [slice(s, min(s + per, rows)) for s in range(0, rows, per)]

    def _count(self) -> None:
        self.update_compiles += 1

    def _logp(
        self, policy: CausalLMPolicy, r: dict[str, torch.Tensor], rows: slice, with_entropy: bool
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        gen = self.cfg.generation
        trained = policy is self.policy and torch.is_grad_enabled()
        # the bound method either way: a sharded policy gathers its root unit for it
        logp = self._compiled_logp if trained and self._compiled_logp is not None else policy.completion_logp
        with self.dev.autocast(self.amp, self.amp_dtype):
            return logp(
                r["prompt_ids"][rows],
                r["prompt_mask"][rows],
                r["tokens"][rows],
                r["mask"][rows],
                gen.temperature,
                self.lm.logprob_chunk,
                with_entropy,
            )

    @torch.no_grad()
    def _frozen_logp(
        self, policy: CausalLMPolicy, r: dict[str, torch.Tensor], parts: list[slice]
    ) -> torch.Tensor:
        policy.eval()
        return torch.cat([self._logp(policy, r, s, False)[0].float() for s in parts])

    def _backward(
        self,
        r: dict[str, torch.Tensor],
        s: slice,
        adv: torch.Tensor,
        w: torch.Tensor,
        old_logp: torch.Tensor | None,
        ref_logp: torch.Tensor | None,
        is_weight: torch.Tensor | None = None,
    ) -> dict[str, float]:
        """Backward of one micro-batch's share of the batch loss (`w` [b, C]: its token weights);
        its share of the statistics."""
        lc = self.cfg.learner
        logp, entropy = self._logp(self.policy, r, s, True)
        logp = logp.float()
        # One epoch on fresh samples: the old policy is the current one (ratio 1, gradient intact).
        old = old_logp[s] if old_logp is not None else logp.detach()
        batch = TokenBatch(logp, old, adv, r["mask"][s], lc.clip_ratio)
        per_token, clip_low, clip_high = self.loss.loss(batch, self.loss_settings)
        if is_weight is not None:
            per_token = per_token * is_weight
        stats = {}
        if ref_logp is not None:
            kl = tokens.kl_per_token(logp, ref_logp[s], self.lm.kl_estimator)
            per_token = per_token + lc.kl_coef * kl
            stats["kl_ref"] = float((kl.detach() * w).sum())
        if lc.entropy_coef and entropy is not None:
            per_token = per_token - lc.entropy_coef * entropy.float()
        loss = (per_token * w).sum()
        # A rank's loss is its rows' share of the round's (`w` sums to 1 over the whole round);
        # FSDP averages the ranks' gradients, so each share counts world times to sum them.
        scaled = loss * self.world if self.world > 1 else loss
        (self.scaler.scale(scaled) if self.scaler is not None else scaled).backward()
        d = old - logp.detach()
        stats["policy_loss"] = float(loss.detach())
        stats["clip_low_fraction"] = float((clip_low * w).sum())
        stats["clip_high_fraction"] = float((clip_high * w).sum())
        stats["clip_fraction"] = stats["clip_low_fraction"] + stats["clip_high_fraction"]
        stats["approx_kl"] = float(((d.exp() - 1 - d) * w).sum())
        if entropy is not None:
            stats["entropy"] = float((entropy.detach().float() * w).sum())
        return stats

    def _step(self) -> float:
        """Clip the accumulated gradients and step; a non-finite norm skips the step. The norm."""
        if self.scaler is not None:
            self.scaler.unscale_(self.optimizer)
        norm = torch.nn.utils.clip_grad_norm_(self.policy.parameters(), self.cfg.learner.max_grad_norm)
        full_tensor = getattr(norm, "full_tensor", None)  # a sharded policy's norm is a DTensor
        norm = full_tensor() if full_tensor is not None else norm
        if self.scaler is not None:
            before = self.scaler.get_scale()
            self.scaler.step(self.optimizer)  # skips on a non-finite gradient (any rank's, sharded)
            self.scaler.update()
            self.skipped_steps += int(self.scaler.get_scale() < before)
        elif torch.isfinite(norm):
            self.optimizer.step()
        else:
            self.skipped_steps += 1
        return float(norm)

    def _baselines(
        self, r: dict[str, torch.Tensor], parts: list[slice]
    ) -> tuple[torch.Tensor | None, torch.Tensor | None, torch.Tensor | None, dict[str, float]]:
        """(old log-probs or None: the current ones detached, the reference's or None, truncated
        importance weights or None, the generator-gap metrics), each [B, C], before the update."""
        lc, gc, mask = self.cfg.learner, self.lm, r["mask"]
        # The learner generated this round with these weights: its own log-probs are the old
        # policy's. They differ from the sampler's only by the numerics of cached vs full passes.
        external = self._generated_by is not None
        t0 = time.perf_counter()
        old_logp = self._frozen_logp(self.policy, r, parts) if lc.epochs > 1 or external else None
        self.dev.synchronize()
        is_weight, gap = None, {"logprob_s": time.perf_counter() - t0}
        if external and old_logp is not None:
            level = gc.importance_correction
            diff = (old_logp - r["gen_logp"]).abs() * mask
            gap = {
                "gen_logp_gap": float(diff.sum() / mask.sum().clamp(min=1)),
                "policy_lag_mean": float(self.version - int(self._generated_by or 0)),
            }
            if level != "none":
                is_weight = tokens.truncated_is_weight(
                    old_logp, r["gen_logp"], mask, level, gc.importance_cap
                )
                gap["is_weight_mean"] = float((is_weight * mask).sum() / mask.sum().clamp(min=1))
        ref_logp = None
        t0 = time.perf_counter()
        if self.reference is not None:
            ref_logp = self._frozen_logp(self.reference, r, parts)
        elif self.kl:  # LoRA: the base model with its adapters off
            with self.policy.reference_mode():
                ref_logp = self._frozen_logp(self.policy, r, parts)
        if ref_logp is not None:
            self.dev.synchronize()
            gap["reference_s"] = time.perf_counter() - t0
        return old_logp, ref_logp, is_weight, gap

    def train(self, rewards: list[float | None]) -> dict[str, Any]:
        """One update on the round `generate_round` sampled, with one reward (or None: no
        reward, no advantage) per completion. Returns the update's metrics and the learner's
        telemetry (device and host memory, device health)."""
        return {**self._update(rewards), **self.telemetry.sample()}

    def _update(self, rewards: list[float | None]) -> dict[str, Any]:
        """The update's own statistics (`train`)."""
        if self._kept:
            r = self._take_kept()
        elif self._round is not None:
            r, self._round = self._round, None
        else:
            raise RuntimeError("train() before generate_round()")
        cfg, lc, gc = self.cfg, self.cfg.learner, self.lm
        t0 = time.perf_counter()
        self.dev.reset_peak_memory()
        dev = self.dev.device
        # The round's advantages and token weights are computed over all of it on every rank (the
        # rewards are the whole round's, the masks gathered), then each rank takes its rows: the
        # update is the one a single learner makes, at any learner.num_learners.
        mask = sharding.gather_rows(r["mask"])
        valid = torch.tensor([x is not None for x in rewards], device=dev)
        reward_t = torch.tensor([0.0 if x is None else float(x) for x in rewards], device=dev)
        outcome = RoundRewards(reward_t, valid, mask.sum(-1).float(), lc.group_size, lc.group_eps)
        adv, estimated = self.estimator.advantages(outcome, self.estimator_settings)
        std = tokens.group_std(reward_t, valid, lc.group_size)
        rows_in = valid.clone()
        if gc.drop_equal_groups:
            rows_in &= (std > 0).repeat_interleave(lc.group_size)
        weights = tokens.token_weights(mask, rows_in, gc.loss_agg, cfg.generation.max_new_tokens)
        mine = self._rows(mask.shape[0])
        adv, weights = adv[mine], weights[mine]
        parts = self._micro_batches(r["mask"].shape[0], r["prompt_ids"].shape[1] + mask.shape[1])
        old_logp, ref_logp, is_weight, gap = self._baselines(r, parts)
        self.policy.train()
        skipped_before = self.skipped_steps
        sums: dict[str, float] = {}
        grad_norms = []
        for _ in range(lc.epochs):
            self.optimizer.zero_grad(set_to_none=True)
            for s in parts:
                iw = None if is_weight is None else is_weight[s]
                for k, v in self._backward(r, s, adv[s], weights[s], old_logp, ref_logp, iw).items():
                    sums[k] = sums.get(k, 0.0) + v
            grad_norms.append(self._step())
        # Gradients are not kept past the update: generation and the round's other phases have
        # the memory instead (the estimate, `learner/lm/memory.py`, counts them in the update only).
        self.optimizer.zero_grad(set_to_none=True)
        sums = sharding.sum_across(sums, dev)  # each rank's share of the round's statistics
        self.updates += 1
        self.version += 1
        if (
            lc.ref_update_interval
            and self.reference is not None
            and self.updates % lc.ref_update_interval == 0
        ):
            if self.sharded:  # both sharded alike: each rank copies its own shards
                for ref_p, p in zip(self.reference.parameters(), self.policy.parameters(), strict=True):
                    ref_p.data.copy_(p.data)
            else:
                self.reference.load_state_dict(self.policy.state_dict())
        self.dev.synchronize()
        update_s = time.perf_counter() - t0
        n_epochs = max(lc.epochs, 1)
        counted = valid.float()
        trained_tokens = int((mask * rows_in.unsqueeze(-1)).sum()) * n_epochs
        return {
            **{k: v / n_epochs for k, v in sums.items()},
            **estimated,
            **gap,
            "amp_skipped": self.skipped_steps - skipped_before,  # the backend's RoundResult count
            "grad_norm": float(np.mean(grad_norms)),
            "lr": lc.lr,
            "group_reward_std": float(std.mean()),
            "zero_std_group_fraction": float((std == 0).float().mean()),
            "group_reward_mean": float((reward_t * counted).sum() / counted.sum().clamp(min=1)),
            "weights_version": self.version,
            "update_s": update_s,
            "trained_tokens_per_s": trained_tokens / max(update_s, 1e-9),
            # NeMo-RL's: trained tokens / step seconds / devices
            "tokens_per_s_per_device": trained_tokens / max(update_s, 1e-9) / self.world,
            **self._param_bytes(),
            "learner_samples_per_s": mask.shape[0] * n_epochs / max(update_s, 1e-9),
            **self.decoder.counts(),
            **({"update_compiles": self.update_compiles} if lc.compile else {}),
        }

    def _param_bytes(self) -> dict[str, int]:
        """The parameter bytes this rank holds and the whole model's (fixed once sharded)."""
        if self._bytes is None:
            self._bytes = {
                "learner_param_bytes": sharding.local_bytes(self.policy),
                "model_param_bytes": sharding.model_bytes(self.policy),
            }
        return self._bytes

    # ---- weights and state --------------------------------------------------------------------
    def export_hf(self, folder: str) -> None:
        """The trained model and its tokenizer as a Hugging Face folder."""
        self.policy.save_pretrained(folder)
        self.tokenizer.save_pretrained(folder)

    def state_dict(self, in_flight: bool = False, shards: str | None = None) -> dict[str, Any]:
        """The learner's state. `in_flight`: the last prepared round is out being generated and not
        trained (generation.max_staleness=1): its prompts go back to the order, so a resume
        samples them again instead of skipping them. `shards`: a folder where every rank writes
        its shards of the model, optimizer and reference (`learner/lm/shards.py`, a collective);
        the state returned then holds the rest (`sharded` names the parts written)."""
        order = (
            self._order_before if in_flight and self._order_before is not None else self.order.state_dict()
        )
        rest = {
            "version": self.version,
            "updates": self.updates,
            "rounds": self.rounds - (1 if in_flight and self._order_before is not None else 0),
            "prompt_order": dict(order),
        }
        if shards is not None:
            parts, groups = self._shard_parts()
            shards_io.save(parts, Path(shards))
            return {**rest, "optimizer": {"param_groups": groups}, "sharded": {"parts": sorted(parts)}}
        return {
            "model": self._whole(self.policy),
            "optimizer": self._optimizer_state(),
            "reference": None if self.reference is None else self._whole(self.reference),
            **rest,
        }

    def _shard_parts(self) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        """This rank's shards by part (its own where sharded, whole tensors where not), and the
        optimizer's parameter groups with parameters by their index among the trainable ones."""
        model, optim = sharding.local_state(self.policy, self.optimizer)
        parts: dict[str, Any] = {"model": model, "optimizer": optim["state"]}
        if self.reference is not None:
            parts["reference"] = sharding.local_state(self.reference)[0]
        return parts, self._by_index(optim["param_groups"])

    def _whole(self, module: torch.nn.Module) -> dict[str, torch.Tensor]:
        """A module's state, whole, on the CPU (gathered from the ranks' shards where sharded:
        a checkpoint is the same file at any learner.num_learners)."""
        if self.sharded:
            return sharding.full_state(module)
        return {k: v.detach().cpu() for k, v in module.state_dict().items()}

    def _trainable_names(self) -> list[str]:
        return [n for n, p in self.policy.named_parameters() if p.requires_grad]

    def _by_index(self, groups: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Optimizer parameter groups whose parameters go by name, renumbered as torch's plain
        state_dict numbers them: by their index among the trainable ones (what a checkpoint holds)."""
        index = {name: i for i, name in enumerate(self._trainable_names())}
        return [{**g, "params": [index[n] for n in g["params"]]} for g in groups]

    def _by_name(self, groups: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """`_by_index`'s groups named again (what torch's distributed state dicts take)."""
        names = self._trainable_names()
        return [{**g, "params": [names[int(i)] for i in g["params"]]} for g in groups]

    def _optimizer_state(self) -> dict[str, Any]:
        """torch's optimizer state_dict (parameters by their index among the trainable ones),
        whole: a sharded learner's is gathered and re-keyed from names to those indices."""
        if not self.sharded:
            return self.optimizer.state_dict()
        full = sharding.full_optimizer_state(self.policy, self.optimizer)
        if not full:  # gathered to rank 0 alone: the other ranks took part and hold nothing
            return {}
        index = {name: i for i, name in enumerate(self._trainable_names())}
        return {
            "state": {index[name]: v for name, v in full["state"].items()},
            "param_groups": self._by_index(full["param_groups"]),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """A state of `state_dict`'s, written at this learner.num_learners or another: whole
        tensors, or (`shards`: their folder) every rank's shards, read resharded to this group."""
        ref = state.get("reference") if self.reference is not None else None
        if state.get("shards") is not None:
            self._load_shards(Path(state["shards"]), state)
        elif self.sharded:  # every rank loads the whole tensors and keeps its shards
            sharding.load_full_state(self.policy, state["model"])
            names = self._trainable_names()
            opt = state["optimizer"]
            sharding.load_full_optimizer_state(
                self.policy,
                self.optimizer,
                {
                    "state": {names[int(i)]: v for i, v in opt["state"].items()},
                    "param_groups": self._by_name(opt["param_groups"]),
                },
            )
            if ref is not None and self.reference is not None:
                sharding.load_full_state(self.reference, ref)
        else:
            self.policy.load_state_dict(state["model"])
            self.optimizer.load_state_dict(state["optimizer"])
            if ref is not None and self.reference is not None:
                self.reference.load_state_dict(ref)
        self._load_counts(state)

    def _load_shards(self, folder: Path, state: dict[str, Any]) -> None:
        """Every part the checkpoint holds (a reference only where this learner keeps one)."""
        saved = set(state.get("sharded", {}).get("parts", ["model", "optimizer"]))
        parts, _ = self._shard_parts()
        parts = {k: v for k, v in parts.items() if k in saved}
        shards_io.load(parts, folder)
        groups = self._by_name(state["optimizer"]["param_groups"])
        sharding.set_local_state(self.policy, parts["model"], self.optimizer, parts["optimizer"], groups)
        if "reference" in parts and self.reference is not None:
            sharding.set_local_state(self.reference, parts["reference"])

    def _load_counts(self, state: dict[str, Any]) -> None:
        self.version = int(state["version"])
        self.updates = int(state.get("updates", self.version))
        # rounds prepared (a checkpoint from before round seeds counts its updates)
        self.rounds = int(state.get("rounds", self.updates))
        self.order.load_state_dict(state.get("prompt_order", {}))
