"""The learner: ring buffer on the device, GAE, PPO/GRPO updates, versioned weights. No Ray here.

`learner/actor.py` wraps this class as a Ray actor; local mode and tests use it in-process.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from learner.buffer import SegmentRejected, SegmentRingBuffer, SegmentSpec
from learner.device import DeviceContext, resolve_device
from learner.distributed import gather_moments, world_size
from learner.gae import compute_gae
from learner.losses import explained_variance, group_relative_advantages
from learner.models import ActionSpec, ActorCritic
from learner.normalizer import Moments
from learner.sequence import TokenTransformer
from learner.update import grpo_loss, ppo_loss, run_update
from services.config import RelayConfig


@dataclass(frozen=True)
class EnvSpec:
    """What the learner must know of the env: observation shape and action space."""

    obs_shape: tuple[int, ...]
    action: ActionSpec

    @property
    def obs_dim(self) -> int:
        return int(np.prod(self.obs_shape))


def build_policy(cfg: RelayConfig, env: EnvSpec) -> ActorCritic:
    """The policy network the config describes (critic-free for GRPO)."""
    make_trunk = None
    if cfg.model.kind == "transformer":
        tc = cfg.model.transformer

        def make_trunk() -> TokenTransformer:
            return TokenTransformer(
                env.obs_dim, token_vocab(cfg, env.action), tc.d_model, tc.heads, tc.layers, tc.ff_mult
            )

    return ActorCritic(
        obs_dim=env.obs_dim,
        action=env.action,
        hidden=list(cfg.model.hidden_sizes),
        activation=cfg.model.activation,
        shared_trunk=cfg.model.shared_trunk,
        critic=cfg.learner.algo == "ppo",
        init_log_std=cfg.model.init_log_std,
        normalize_obs=cfg.model.normalize_obs,
        make_trunk=make_trunk,
    )


def token_vocab(cfg: RelayConfig, action: ActionSpec) -> int:
    """The token ids a transformer policy reads: configured, else the discrete actions it writes."""
    vocab = cfg.model.transformer.vocab_size
    if vocab is not None:
        return vocab
    if action.kind != "discrete":
        raise ValueError("model.transformer.vocab_size must be set for an env with continuous actions")
    return action.size


def segment_spec(cfg: RelayConfig, env: EnvSpec) -> SegmentSpec:
    return SegmentSpec(
        rollout_len=cfg.rollout.rollout_len,
        num_envs=cfg.env.num_envs,
        obs_shape=env.obs_shape,
        action_shape=env.action.shape,
        action_dtype=env.action.dtype,
        grouped=cfg.learner.algo == "grpo",
    )


def _peak_rss_bytes() -> int:
    """Peak resident memory of this process (Linux reports ru_maxrss in KiB)."""
    import resource

    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


def _time_major(fields: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """[k, T, N, ...] segment stacks -> [T, k*N, ...] (k segments side by side as more envs)."""
    out = {}
    for name, t in fields.items():
        if name in ("last_value", "outcome"):
            out[name] = t.reshape(-1)
        else:
            out[name] = t.transpose(0, 1).reshape(t.shape[1], -1, *t.shape[3:])
    return out


class Learner:
    """Holds model, optimizer, ring buffer and counters; `ingest` segments, `update`, `weights`."""

    def __init__(self, cfg: RelayConfig, env: EnvSpec, dev: DeviceContext | None = None) -> None:
        self.cfg = cfg
        self.env = env
        self.dev = dev or resolve_device(cfg.learner.device, cfg.learner.npu_ids)
        torch.manual_seed(cfg.env.seed)
        self.model = build_policy(cfg, env).to(self.dev.device)
        self.model.set_checkpointing(cfg.learner.grad_checkpointing)
        self.reference: ActorCritic | None = None
        if cfg.learner.algo == "grpo":
            self.reference = copy.deepcopy(self.model).eval().requires_grad_(False)
        self.optimizer = torch.optim.Adam(
            self.model.parameters(), lr=cfg.learner.lr, eps=1e-5, **self.dev.optimizer_options()
        )
        self.scaler = self.dev.grad_scaler(cfg.learner.use_amp, cfg.learner.amp_dtype)
        self.buffer = SegmentRingBuffer(segment_spec(cfg, env), cfg.buffer_segments, self.dev.device)
        self.generator = self._device_generator(cfg.env.seed)
        self.version = 0
        self.updates = 0
        self.amp_skipped_steps = 0
        self._pending: list[Moments] = []
        self._fresh_segments = 0
        self._behaviour_versions: list[int] = []
        self._incarnations: dict[int, str] = {}

    def _device_generator(self, seed: int) -> torch.Generator:
        gen = torch.Generator(device=self.dev.device)
        gen.manual_seed(seed)
        return gen

    # ---- data in -------------------------------------------------------------------------------
    def ingest(self, segment: Mapping[str, Any]) -> str | None:
        """Copy a segment into the ring buffer; returns why it was rejected (counted), else None."""
        try:
            self.buffer.add(segment)
        except SegmentRejected as err:
            return str(err)
        moments = segment.get("obs_moments")
        if moments is not None and moments["count"] > 0:
            self._pending.append(Moments.from_numpy(moments))
        self._fresh_segments += 1
        self._behaviour_versions.append(int(segment.get("weights_version", self.version)))
        return None

    def train_round(
        self, segments: list[Mapping[str, Any]], progress: float = 0.0, lockstep: bool = False
    ) -> dict[str, Any]:
        """Ingest segments and, once a full round is in, update. Returns what the driver logs.

        {"episode_returns", "episode_lengths", "env_steps", "rejected", "reject_reason",
        "metrics" (None if no update)}.
        """
        out: dict[str, Any] = {"episode_returns": [], "episode_lengths": [], "env_steps": 0, "rejected": 0}
        out["worker_restarts"] = sum(self._note_incarnation(seg) for seg in segments)
        for seg in segments:
            reason = self.ingest(seg)
            if reason is not None:
                out["rejected"] += 1
                out["reject_reason"] = reason
                continue
            out["episode_returns"] += list(seg.get("episode_returns", []))
            out["episode_lengths"] += list(seg.get("episode_lengths", []))
            out["env_steps"] += int(seg.get("env_steps", 0))
        # Data-parallel replicas must all take part in every update (their gradients are averaged):
        # in lockstep a replica that lost a segment trains on its newest ones again.
        can_update = self.ready or (lockstep and self.buffer.size >= self.segments_per_update)
        out["metrics"] = self.update(progress) if can_update else None
        return out

    def _note_incarnation(self, segment: Mapping[str, Any]) -> bool:
        """True when a worker's segment comes from a new incarnation (the worker was restarted)."""
        worker, incarnation = segment.get("worker_index"), segment.get("incarnation")
        if worker is None or incarnation is None:
            return False
        previous = self._incarnations.get(worker)
        self._incarnations[worker] = incarnation
        return previous is not None and previous != incarnation

    @property
    def segments_per_update(self) -> int:
        """This learner's share of a round (all of it without data parallelism)."""
        return self.cfg.segments_per_update // world_size()

    @property
    def ready(self) -> bool:
        """Enough fresh segments for one update."""
        return self._fresh_segments >= self.segments_per_update

    # ---- the update ----------------------------------------------------------------------------
    def _ppo_batch(self, data: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        lc = self.cfg.learner
        adv, ret = compute_gae(
            data["rewards"],
            data["values"],
            data["terminated"],
            data["truncated"],
            data["bootstrap_value"],
            data["last_value"],
            data["mask"],
            lc.gamma,
            lc.gae_lambda,
        )
        return {
            "obs": data["obs"].flatten(0, 1),
            "actions": data["actions"].flatten(0, 1),
            "logp": data["logp"].flatten(),
            "values": data["values"].flatten(),
            "advantages": adv.flatten(),
            "returns": ret.flatten(),
            "mask": data["mask"].flatten(),
        }

    def _grpo_batch(self, data: dict[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], dict[str, float]]:
        """Group-relative advantages from each member's outcome, given to every valid step of it."""
        lc = self.cfg.learner
        outcome = data["outcome"].view(-1, lc.group_size)  # [groups, G]; groups never span segments
        adv, std = group_relative_advantages(outcome, lc.group_eps)
        mask = data["mask"]
        batch = {
            "obs": data["obs"].flatten(0, 1),
            "actions": data["actions"].flatten(0, 1),
            "logp": data["logp"].flatten(),
            "advantages": (adv.reshape(1, -1) * mask).flatten(),
            "mask": mask.flatten(),
        }
        batch["ref_logp"] = self._reference_logp(batch["obs"], batch["actions"])
        stats = {
            "group_reward_std": float(std.mean()),
            "zero_std_group_fraction": float((std == 0).float().mean()),
            "group_reward_mean": float(outcome.mean()),
        }
        return batch, stats

    @torch.no_grad()
    def _reference_logp(self, obs: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        """The frozen reference's log-probs [B], once per update rather than once per epoch.

        Computed in minibatch-sized chunks (memory stays that of a minibatch), under the same
        autocast as the update's forward passes.
        """
        assert self.reference is not None
        lc = self.cfg.learner
        chunks = []
        with self.dev.autocast(lc.use_amp, lc.amp_dtype):
            for start in range(0, obs.shape[0], lc.batch_size):
                end = start + lc.batch_size
                chunks.append(self.reference.evaluate(obs[start:end], actions[start:end]).logp)
        return torch.cat(chunks)

    def _batch_and_loss(
        self, data: dict[str, torch.Tensor]
    ) -> tuple[dict[str, torch.Tensor], Any, dict[str, float]]:
        if self.reference is None:
            return self._ppo_batch(data), ppo_loss(self.cfg.learner), {}
        batch, stats = self._grpo_batch(data)
        return batch, grpo_loss(self.cfg.learner), stats

    def _set_lr(self, progress: float) -> float:
        lr = self.cfg.learner.lr * (max(0.0, 1.0 - progress) if self.cfg.learner.lr_anneal else 1.0)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        return lr

    def update(self, progress: float = 0.0) -> dict[str, Any]:
        """One update on the newest round of segments; returns DESIGN.md-named metrics.

        progress in [0, 1] (env steps done / budget) drives lr annealing.
        """
        timings: dict[str, float] = {}
        lr = self._set_lr(progress)
        with self.dev.timed(timings, "update_s"):
            slots = self.buffer.latest_slots(self.segments_per_update)
            data = _time_major(self.buffer.gather(slots))
            batch, loss_fn, algo_stats = self._batch_and_loss(data)
            result = run_update(
                self.model,
                self.optimizer,
                batch,
                loss_fn,
                self.cfg.learner,
                self.dev,
                self.scaler,
                self.generator,
            )
            if "returns" in batch:
                algo_stats["explained_variance"] = float(
                    explained_variance(batch["values"], batch["returns"], batch["mask"])
                )
        # Normalizer statistics change only between updates, so the stats that ship with version v
        # are exactly the ones the learner trains version v's data with.
        for moments in gather_moments(self._pending):
            self.model.normalizer.update(moments)
        self._pending.clear()
        lag = [self.version - v for v in self._behaviour_versions]
        self._fresh_segments = 0
        self._behaviour_versions.clear()
        self.updates += 1
        self._maybe_refresh_reference()
        self.amp_skipped_steps += result.skipped_steps
        if self.updates % self.cfg.learner.broadcast_interval == 0:
            self.version += 1
        mem = self.dev.memory_stats()
        return {
            **result.stats,
            **algo_stats,
            "lr": lr,
            "learner_samples_per_s": result.samples / max(timings["update_s"], 1e-9),
            "update_s": timings["update_s"],
            "epochs_run": result.epochs_run,
            "weights_version": self.version,
            "policy_lag_mean": float(np.mean(lag)) if lag else 0.0,
            "buffer_fill": self.buffer.fill,
            "device": str(self.dev),
            "device_memory_bytes": mem["allocated"],
            "device_memory_peak_bytes": mem["peak"],
            "amp_skipped_steps": self.amp_skipped_steps,
            "rejected_segments": self.buffer.rejected,
            "parameters": self.parameter_count,
            "learner_state_bytes": self.state_bytes(),
            "host_memory_peak_bytes": _peak_rss_bytes(),
        }

    def _maybe_refresh_reference(self) -> None:
        interval = self.cfg.learner.ref_update_interval
        if self.reference is not None and interval and self.updates % interval == 0:
            self.reference.load_state_dict(self.model.state_dict())

    def state_bytes(self) -> int:
        """Bytes the learner keeps on its device: weights, Adam moments, reference policy, ring buffer."""
        tensors = list(self.model.parameters())
        tensors += [t for st in self.optimizer.state.values() for t in st.values() if torch.is_tensor(t)]
        if self.reference is not None:
            tensors += list(self.reference.parameters())
        return sum(t.numel() * t.element_size() for t in tensors) + self.buffer.nbytes()

    @property
    def parameter_count(self) -> int:
        """Trainable parameters (GRPO builds no value network, so it has fewer)."""
        return sum(p.numel() for p in self.model.parameters())

    # ---- weights and state -----------------------------------------------------------------------
    def weights(self) -> dict[str, torch.Tensor]:
        """Policy state (normalizer statistics included) as CPU tensors, for the rollout workers."""
        return {k: v.detach().to("cpu", copy=True) for k, v in self.model.state_dict().items()}

    def state_dict(self) -> dict[str, Any]:
        """Everything a checkpoint needs to continue this learner exactly."""
        return {
            "model": self.weights(),
            "reference": None if self.reference is None else self.reference.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scaler": None if self.scaler is None else self.scaler.state_dict(),
            "version": self.version,
            "updates": self.updates,
            "amp_skipped_steps": self.amp_skipped_steps,
            "rejected_segments": self.buffer.rejected,
            "generator": self.generator.get_state(),
            "saved_at": time.time(),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.model.load_state_dict(state["model"])
        if self.reference is not None and state.get("reference") is not None:
            self.reference.load_state_dict(state["reference"])
        self.optimizer.load_state_dict(state["optimizer"])
        if self.scaler is not None and state.get("scaler") is not None:
            self.scaler.load_state_dict(state["scaler"])
        self.version = int(state["version"])
        self.updates = int(state["updates"])
        self.amp_skipped_steps = int(state["amp_skipped_steps"])
        self.buffer.rejected = int(state["rejected_segments"])
        self.generator.set_state(state["generator"])
