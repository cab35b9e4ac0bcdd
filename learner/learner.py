"""The learner: ring buffer on the device, the configured algorithm's updates, versioned weights.
No Ray here: `learner/actor.py` wraps this class as a Ray actor; local mode and tests use it
in-process.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, cast

import numpy as np
import torch

from ..contracts.config import RelayConfig
from ..contracts.rounds import RoundResult, add_faults, add_stats
from ..contracts.segment import PER_ENV_FIELDS, Segment, SegmentRejected, state_resets
from ..contracts.spaces import EnvSpec
from ..learner.algorithms import algorithm_class, segment_layout
from ..learner.buffer import SegmentRingBuffer
from ..learner.compiled import CompiledLoss
from ..learner.device import DeviceContext, resolve_device
from ..learner.distributed import data_parallel, gather_moments, world_size
from ..learner.precision import is_convolutional, resolve_precision
from ..learner.telemetry import LearnerTelemetry
from ..learner.update import run_update
from ..policy.models import build_policy, weights_mismatch
from ..policy.normalizer import Moments
from ..policy.protocol import EnvPolicy, Policy

# Seconds the learner spends, by phase: copying segments in, updating. (Waiting for segments
# arrives with them; publishing weights is the actor's; `contracts/metrics.py` names them all.)
LEARNER_PHASES = ("ingest_s", "update_s")


@dataclass(frozen=True)
class Arrival:
    """A segment as it reached the learner: its fields staged for the ring buffer, or why the
    buffer refuses it (`rejected`; then `fields` is None)."""

    segment: Segment
    fields: dict[str, torch.Tensor] | None
    rejected: str | None = None


@dataclass
class Arrivals:
    """One round's input: the segments that arrived (staged), how many were lost on the way
    (their rollout worker died) and the seconds spent waiting for them."""

    staged: list[Any]  # Arrival; a policy-grouped learner's GroupArrival (learner/policy_groups.py)
    lost: int = 0
    wait_s: float = 0.0


def time_major(fields: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """[k, T, N, ...] segment stacks -> [T, k*N, ...] (k segments side by side as more envs);
    per-env fields [k, N, ...] -> [k*N, ...]."""
    out = {}
    for name, t in fields.items():
        if name in PER_ENV_FIELDS:
            out[name] = t.reshape(-1, *t.shape[2:])
        else:
            out[name] = t.transpose(0, 1).reshape(t.shape[1], -1, *t.shape[3:])
    return out


def recurrent_state_stats(data: dict[str, torch.Tensor], segments: int) -> dict[str, float]:
    """A recurrent policy's state in a round of `segments` segments as time-major data [T, E, ...]:
    the mean |value| of the states its columns start from, and the states zeroed inside them (an
    episode starting at step t > 0) per segment; {} without a core."""
    state = data.get("initial_state")
    if state is None:
        return {}
    resets = state_resets(data["terminated"][:-1], data["truncated"][:-1], data["mask"][:-1])
    return {
        "state_abs_mean": float(state.abs().mean()),
        "state_resets_per_segment": float(resets.sum()) / max(segments, 1),
    }


@dataclass
class UpdateOutcome:
    """An update's metrics line fields (catalog keys, services/runs/metric_keys.py) and its count of
    skipped optimizer steps."""

    metrics: dict[str, Any]
    skipped_steps: int


class Learner:
    """Holds model, optimizer, algorithm, ring buffer and versions; `train_round` segments in,
    `weights` out."""

    def __init__(self, cfg: RelayConfig, env: EnvSpec, dev: DeviceContext | None = None) -> None:
        self.env = env
        self.dev = dev or resolve_device(cfg.learner.device, cfg.learner.npu_ids)
        self.telemetry = LearnerTelemetry(self.dev, cfg.learner.num_cpus)
        torch.manual_seed(cfg.env.seed)
        algo_cls = algorithm_class(cfg.learner.algo)
        self.model: EnvPolicy = build_policy(cfg, env, critic=algo_cls.critic).to(self.dev.device)
        self.model.set_checkpointing(cfg.learner.grad_checkpointing)
        # `auto` precision and layout made concrete once: everything below reads plain values.
        self.precision = resolve_precision(cfg.learner, self.dev, is_convolutional(self.model))
        cfg = cfg.model_copy(update={"learner": self.precision.applied(cfg.learner)})
        self.cfg = cfg
        if self.precision.channels_last:
            # 4-D kernels only (torch's stubs omit the argument); frames follow them
            self.model.to(memory_format=torch.channels_last)  # type: ignore[call-overload]
        self.algo = algo_cls(cfg.learner, self.model, self.dev)
        self.optimizer = self.dev.adam(self.model.parameters(), lr=cfg.learner.lr, eps=1e-5)
        self.loss = (
            CompiledLoss(self.algo.loss, self.dev.compile_backend(cfg.learner.compile_backend))
            if cfg.learner.compile
            else None
        )
        self.scaler = self.dev.grad_scaler(self.precision.use_amp, cfg.learner.amp_dtype)
        self.buffer = SegmentRingBuffer(segment_layout(cfg, env), cfg.buffer_segments, self.dev.device)
        self.generator = torch.Generator(device=self.dev.device)
        self.generator.manual_seed(cfg.env.seed)
        self.version = 0
        self.updates = 0
        self._pending: list[Moments] = []  # observation moments since the last update
        self._pending_returns: list[Moments] = []  # discounted-return moments (reward scaling)
        self._pending_global: list[Moments] = []  # global-state moments (a centralized critic)
        self._fresh_segments = 0
        self._fresh_steps = 0  # valid steps in the fresh segments
        self._behaviour_versions: list[int] = []
        self._incarnations: dict[int, str] = {}
        self.phases = dict.fromkeys(LEARNER_PHASES, 0.0)  # seconds by phase since the last round
        self._ddp: torch.nn.Module | None = None  # `_replicas`

    # ---- data in -------------------------------------------------------------------------------
    def stage(self, segment: Segment) -> Arrival:
        """Validate a segment and stage its fields for the buffer (page-locked on an accelerator).
        Touches no learner state: safe on a prefetch thread while an update runs."""
        try:
            return Arrival(segment, self.buffer.stage(segment))
        except SegmentRejected as err:
            return Arrival(segment, None, str(err))

    def ingest(self, arrival: Arrival) -> str | None:
        """Copy a staged segment into the ring buffer; returns why it was rejected, else None."""
        if arrival.fields is None:
            return arrival.rejected
        t0 = time.perf_counter()
        self.buffer.put(arrival.fields)
        self.phases["ingest_s"] += time.perf_counter() - t0
        segment = arrival.segment
        for pending, moments in (
            (self._pending, segment.obs_moments),
            (self._pending_returns, segment.return_moments),
            (self._pending_global, segment.global_moments),
        ):
            if moments.get("count", 0) > 0:
                pending.append(Moments.from_numpy(moments))
        self._fresh_segments += 1
        self._fresh_steps += int(segment.env_steps)
        self._behaviour_versions.append(int(segment.weights_version))
        return None

    def _discard_fresh(self) -> None:
        self._pending.clear()
        self._pending_returns.clear()
        self._pending_global.clear()
        self._fresh_segments = self._fresh_steps = 0
        self._behaviour_versions.clear()

    def train_round(
        self, segments: Sequence[Segment], progress: float = 0.0, lockstep: bool = False, wait_s: float = 0.0
    ) -> RoundResult:
        """`train_arrivals` for segments at hand (local mode, tests): staged here, the staging
        counted as ingest time."""
        t0 = time.perf_counter()
        staged = [self.stage(seg) for seg in segments]
        self.phases["ingest_s"] += time.perf_counter() - t0
        return self.train_arrivals(Arrivals(staged, wait_s=wait_s), progress, lockstep)

    def train_arrivals(
        self, arrivals: Arrivals, progress: float = 0.0, lockstep: bool = False
    ) -> RoundResult:
        """Ingest a round's staged segments and, once a full round is in, update. The round's
        seconds by phase ride along in `phases`."""
        out = RoundResult(lost_segments=arrivals.lost)
        for arrival in arrivals.staged:
            seg = arrival.segment
            out.worker_restarts += self._note_incarnation(seg)
            # Faults happened whether or not the segment is usable: count them first.
            out.env_faults = add_faults(out.env_faults, seg.env_faults)
            reason = self.ingest(arrival)
            if reason is not None:
                out.rejected_segments += 1
                out.reject_reason = reason
                continue
            out.episode_returns += list(seg.episode_returns)
            out.episode_lengths += list(seg.episode_lengths)
            out.episode_stats = add_stats(out.episode_stats, seg.episode_stats)
            out.env_steps += int(seg.env_steps)
        if self.ready and self._fresh_steps == 0 and not lockstep:
            # Every step was lost (env faults): an update on all-padding data would still move the
            # weights (Adam's momentum), so the round is dropped.
            self._discard_fresh()
            out.reject_reason = "every step of the round was lost to env faults"
        # Data-parallel replicas must all take part in every update (their gradients are averaged):
        # in lockstep a replica that lost a segment trains on its newest ones again.
        elif self.ready or (lockstep and self.buffer.size >= self.segments_per_update):
            update = self.update(progress)
            out.metrics = {**update.metrics, **self.telemetry.sample()}
            out.amp_skipped_steps = update.skipped_steps
        out.phases = {**self.phases, "wait_s": arrivals.wait_s}
        self.phases = dict.fromkeys(LEARNER_PHASES, 0.0)
        return out

    def _note_incarnation(self, segment: Segment) -> bool:
        """True when a worker's segment comes from a new incarnation (the worker was restarted)."""
        if not segment.incarnation:
            return False
        previous = self._incarnations.get(segment.worker_index)
        self._incarnations[segment.worker_index] = segment.incarnation
        return previous is not None and previous != segment.incarnation

    @property
    def segments_per_update(self) -> int:
        """This learner's share of a round (all of it without data parallelism)."""
        return self.cfg.segments_per_update // world_size()

    @property
    def ready(self) -> bool:
        """Enough fresh segments for one update."""
        return self._fresh_segments >= self.segments_per_update

    # ---- the update ----------------------------------------------------------------------------
    def _set_lr(self, progress: float) -> float:
        lr = self.cfg.learner.lr * (max(0.0, 1.0 - progress) if self.cfg.learner.lr_anneal else 1.0)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        return lr

    def _learned_steps(self, rows: int) -> torch.Tensor:
        """[B] 1 for the rows of a time-major [T, E] batch past model.burn_in, 0 for the steps that
        only warm a recurrent state (row t * E + e)."""
        columns = rows // self.cfg.rollout.rollout_len
        t = torch.arange(rows, device=self.dev.device) // columns
        return (t >= self.cfg.model.burn_in).float()

    def update(self, progress: float = 0.0) -> UpdateOutcome:
        """One update on the newest round of segments.

        progress in [0, 1] (env steps done / budget) drives lr annealing.
        """
        timings: dict[str, float] = {}
        lr = self._set_lr(progress)
        with self.dev.timed(timings, "update_s"):
            slots = self.buffer.latest_slots(self.segments_per_update)
            data = time_major(self.buffer.gather(slots))
            state_stats = recurrent_state_stats(data, self.segments_per_update)
            batch, algo_stats = self.algo.batch(data)
            if self.cfg.model.burn_in:
                batch["mask"] = batch["mask"] * self._learned_steps(batch["mask"].shape[0])
            result = run_update(
                self.model,
                self.optimizer,
                batch,
                self.loss or self.algo.loss,
                self.cfg.learner,
                self.dev,
                self.scaler,
                self.generator,
                self.cfg.rollout.rollout_len if self.cfg.learner.minibatch == "sequences" else None,
                self._replicas(),
            )
        self.phases["update_s"] += timings["update_s"]
        # Normalizer statistics change only between updates, so the stats that ship with version v
        # are exactly the ones the learner trains version v's data with.
        for moments in gather_moments(self._pending):
            self.model.normalizer.update(moments)
        for stats, pending in (
            (self.model.return_stats, self._pending_returns),
            (self.model.global_normalizer, self._pending_global),
        ):
            if stats is not None:
                for moments in gather_moments(pending):
                    stats.update(moments)
        lag = [self.version - v for v in self._behaviour_versions]
        self._discard_fresh()
        self.updates += 1
        self.algo.after_update(self.model, self.updates)
        if self.updates % self.cfg.learner.broadcast_interval == 0:
            self.version += 1
        metrics = {
            **result.stats,
            **algo_stats,
            **state_stats,
            **(self.loss.counts() if self.loss else {}),
            "lr": lr,
            "learner_samples_per_s": result.samples / max(timings["update_s"], 1e-9),
            "epochs_run": result.epochs_run,
            "weights_version": self.version,
            "policy_lag_mean": float(np.mean(lag)) if lag else 0.0,
            "buffer_fill": self.buffer.fill,
            "buffer_bytes": self.buffer.nbytes(),
            "segment_bytes": self.buffer.layout.nbytes(),
            "precision": self.precision.name,
            "parameters": self.parameter_count,
            "learner_state_bytes": self.state_bytes(),
        }
        return UpdateOutcome(metrics, result.skipped_steps)

    def _replicas(self) -> torch.nn.Module | None:
        """The model as torch's DDP replicates it over the learner group (None alone), wrapped at
        the first update: the rank has joined the group by then."""
        if world_size() == 1:
            return None
        if self._ddp is None:
            self._ddp = data_parallel(cast(torch.nn.Module, self.model))
        return self._ddp

    def state_bytes(self) -> int:
        """Bytes the learner keeps on its device: weights, Adam moments, the algorithm's own
        tensors (GRPO's reference policy), ring buffer."""
        tensors = list(self.model.parameters()) + self.algo.extra_tensors()
        tensors += [t for st in self.optimizer.state.values() for t in st.values() if torch.is_tensor(t)]
        return sum(t.numel() * t.element_size() for t in tensors) + self.buffer.nbytes()

    def buffer_bytes(self) -> int:
        """Bytes the ring buffer holds on the device."""
        return self.buffer.nbytes()

    @property
    def parameter_count(self) -> int:
        """Trainable parameters (GRPO builds no value network, so it has fewer)."""
        return sum(p.numel() for p in self.model.parameters())

    # ---- weights and state -----------------------------------------------------------------------
    def weights(self) -> dict[str, torch.Tensor]:
        """Policy state (normalizer statistics included) as CPU tensors, for the rollout workers."""
        return self.model.acting_weights()

    def state_dict(self) -> dict[str, Any]:
        """Everything a checkpoint needs to continue this learner exactly: a snapshot (torch's
        optimizer state_dict holds live tensors; a learner loading those would share Adam's step
        counters with this one)."""
        return {
            "model": self.weights(),
            "algorithm": copy.deepcopy(self.algo.state_dict()),
            "optimizer": copy.deepcopy(self.optimizer.state_dict()),
            "scaler": None if self.scaler is None else self.scaler.state_dict(),
            "version": self.version,
            "updates": self.updates,
            "generator": self.generator.get_state(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.model.load_state_dict(state["model"])
        # Format-1 checkpoints kept GRPO's reference at the top level.
        self.algo.load_state_dict(state.get("algorithm") or {"reference": state.get("reference")})
        self.optimizer.load_state_dict(state["optimizer"])
        if self.scaler is not None and state.get("scaler") is not None:
            self.scaler.load_state_dict(state["scaler"])
        self.version = int(state["version"])
        self.updates = int(state["updates"])
        self.generator.set_state(state["generator"])


def learner_state_problem(model: Policy, state: dict[str, Any]) -> str | None:
    """The first reason a checkpoint's learner `state` would not restore `model`'s learner, or None:
    weights that do not fit or are not finite, GRPO's reference weights that do not fit, an
    optimizer state of another structure (groups, parameter count, moment shapes), a generator
    state that is not one. Checked on the CPU before a resume changes anything, so a malformed
    checkpoint is skipped for the previous one."""
    want = model.state_dict()
    weights = state.get("model")
    reference = (state.get("algorithm") or {}).get("reference")
    for what, saved in (("weights", weights), ("the algorithm's reference weights", reference)):
        if saved is None and what != "weights":
            continue
        if not isinstance(saved, dict):
            return f"{what} are not a mapping"
        problem = weights_mismatch(want, saved)
        if problem:
            return f"{what} do not fit ({problem})"
        finite = {k: not t.is_floating_point() or bool(torch.isfinite(t).all()) for k, t in saved.items()}
        bad = next((k for k, ok in finite.items() if not ok), None)
        if bad is not None:
            return f"{what}: {bad} is not finite"
    generator = state.get("generator")
    if not (torch.is_tensor(generator) and generator.dtype == torch.uint8):
        return "generator state is not a byte tensor"
    return _optimizer_problem(model, state.get("optimizer"))


def _optimizer_problem(model: Policy, saved: Any) -> str | None:
    """Why Adam's saved state would not load into an optimizer over `model`'s parameters, or None."""
    try:
        optimizer = torch.optim.Adam(model.parameters())
        optimizer.load_state_dict(saved)
    except (KeyError, TypeError, ValueError, IndexError, AttributeError) as err:
        return f"optimizer state does not fit ({' '.join(str(err).split())[:120]})"
    params = [p for group in optimizer.param_groups for p in group["params"]]
    for param, moments in ((p, optimizer.state.get(p, {})) for p in params):
        for name, t in moments.items():
            if not torch.is_tensor(t) or (t.dim() and t.shape != param.shape) or not torch.isfinite(t).all():
                return f"optimizer state {name!r} does not fit a parameter of shape {tuple(param.shape)}"
    return None
