"""Policy groups on one learner: a `Learner` per group (multi_agent.policies), each with its own
model, optimizer, ring buffer and versions, built from its group's config and spec
(contracts/policy_groups.py). No Ray here; `learner/actor.py` holds either kind (`make_learner`).

A worker sends {group: Segment}; each group's segment goes to its group's learner, and a segment
one group rejects is rejected for all (every group trains on the same rounds of env steps). The
round the driver sees is the groups' merged: steps, episodes and phases add up, the update's
metrics line carries the groups' means for the algorithm's statistics and each group's own under
`policy/<group>/` (contracts.metrics.POLICY_KEYS); each group's episode returns are an episode
statistic (`policy_return_mean/<group>`). The groups' weights leave as one joined mapping with
their versions (`with_versions`); the published version is their sum, which moves whenever any
group's weights do.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from ..contracts.config import RelayConfig
from ..contracts.metrics import POLICY_KEYS, POLICY_PREFIX, POLICY_RETURN_PREFIX
from ..contracts.policy_groups import group_configs, joined, part_of, with_versions
from ..contracts.rounds import RoundResult, add_faults, add_stats
from ..contracts.segment import Sampled, Segment
from ..contracts.spaces import EnvSpec
from ..learner.device import DeviceContext, resolve_device
from ..learner.learner import Arrival, Arrivals, Learner, learner_state_problem
from ..policy.protocol import EnvPolicy

# Metrics that are totals over the groups (sizes); the others of the shared line are the first
# updated group's (the device, the process) or the groups' mean (the algorithm's statistics).
SUMMED = ("parameters", "buffer_bytes", "segment_bytes", "learner_state_bytes", "epochs_run")
PROCESS_WIDE = ("device", "precision", "lr", "buffer_fill")


@dataclass(frozen=True)
class GroupArrival:
    """One worker's {group: Segment} as it reached the learner: each group's Arrival, or why
    none can be used (`rejected`; then `parts` is None)."""

    parts: dict[str, Arrival] | None
    rejected: str | None = None


class PolicyGroupsLearner:
    """The learners of every policy group, with `Learner`'s interface over joined weights."""

    def __init__(self, cfg: RelayConfig, env: EnvSpec, dev: DeviceContext | None = None) -> None:
        self.cfg = cfg
        self.env = env
        self.dev = dev or resolve_device(cfg.learner.device, cfg.learner.npu_ids)
        self.learners = {
            name: Learner(group_cfg, env.policy(name), self.dev)
            for name, group_cfg in group_configs(cfg, env).items()
        }

    # ---- sizes and versions ----------------------------------------------------------------------
    @property
    def version(self) -> int:
        """The sum of the groups' versions: it moves whenever any group's weights do."""
        return sum(lrn.version for lrn in self.learners.values())

    @property
    def parameter_count(self) -> int:
        return sum(lrn.parameter_count for lrn in self.learners.values())

    def buffer_bytes(self) -> int:
        return sum(lrn.buffer_bytes() for lrn in self.learners.values())

    # ---- data in -------------------------------------------------------------------------------
    def stage(self, sampled: Sampled) -> GroupArrival:
        """Each group's segment staged by its learner; all rejected where one is (or where the
        worker did not send one segment for each group)."""
        names = list(self.learners)
        if not isinstance(sampled, dict) or sorted(sampled) != sorted(names):
            return GroupArrival(None, f"not one segment for each policy group ({', '.join(names)})")
        if not all(isinstance(seg, Segment) for seg in sampled.values()):
            return GroupArrival(None, "a policy group's part is not a segment")
        parts = {name: self.learners[name].stage(sampled[name]) for name in names}
        refused = next(
            (f"policy group {n}: {a.rejected}" for n, a in parts.items() if a.fields is None), None
        )
        if refused is not None:
            parts = {name: Arrival(a.segment, None, refused) for name, a in parts.items()}
        return GroupArrival(parts)

    def train_round(
        self, sampled: Sequence[Sampled], progress: float = 0.0, lockstep: bool = False, wait_s: float = 0.0
    ) -> RoundResult:
        """`train_arrivals` for {group: Segment}s at hand (local mode, tests)."""
        return self.train_arrivals(
            Arrivals([self.stage(s) for s in sampled], wait_s=wait_s), progress, lockstep
        )

    def train_arrivals(
        self, arrivals: Arrivals, progress: float = 0.0, lockstep: bool = False
    ) -> RoundResult:
        """Each group's learner ingests its segments and updates once its round is in."""
        staged: list[GroupArrival] = list(arrivals.staged)
        usable = [a.parts for a in staged if a.parts is not None]
        unusable = [a.rejected for a in staged if a.parts is None]
        parts = {}
        for k, (name, lrn) in enumerate(self.learners.items()):
            own = Arrivals(
                [p[name] for p in usable], lost=arrivals.lost if k == 0 else 0, wait_s=arrivals.wait_s
            )
            parts[name] = lrn.train_arrivals(own, progress, lockstep)
        out = self._merge(parts)
        out.rejected_segments += len(unusable)
        out.reject_reason = out.reject_reason or next(iter(unusable), None)
        return out

    def _merge(self, parts: dict[str, RoundResult]) -> RoundResult:
        """The groups' round as one: a worker's segments of one call count once (lost, rejected,
        restarts and env faults are the first group's: every group saw the same), steps and
        episodes add up, phases add up (the groups update one after another)."""
        first = next(iter(parts.values()))
        out = RoundResult(
            lost_segments=first.lost_segments,
            rejected_segments=first.rejected_segments,
            reject_reason=first.reject_reason,
            worker_restarts=first.worker_restarts,
            env_faults=add_faults({}, first.env_faults),
        )
        for name, part in parts.items():
            out.env_steps += part.env_steps
            out.episode_returns += part.episode_returns
            out.episode_lengths += part.episode_lengths
            out.episode_stats = add_stats(out.episode_stats, part.episode_stats)
            out.episode_stats = add_stats(
                out.episode_stats, {POLICY_RETURN_PREFIX + name: part.episode_returns}
            )
            out.amp_skipped_steps += part.amp_skipped_steps
        out.phases = {k: sum(p.phases.get(k, 0.0) for p in parts.values()) for k in first.phases}
        out.phases["wait_s"] = first.phases.get("wait_s", 0.0)
        updated = {name: p for name, p in parts.items() if p.metrics is not None}
        if updated:
            out.metrics = self._metrics(updated)
        return out

    def _metrics(self, updated: dict[str, RoundResult]) -> dict[str, Any]:
        lines = {name: p.metrics or {} for name, p in updated.items()}
        line = dict(next(iter(lines.values())))
        for key, value in list(line.items()):
            if key in PROCESS_WIDE or not isinstance(value, int | float) or isinstance(value, bool):
                continue
            values = [m[key] for m in lines.values() if isinstance(m.get(key), int | float)]
            line[key] = sum(values) if key in SUMMED else float(np.mean(values))
        # The groups update one after another: samples over their summed update seconds.
        seconds = {name: p.phases.get("update_s", 0.0) for name, p in updated.items()}
        samples = sum(lines[n].get("learner_samples_per_s", 0.0) * seconds[n] for n in lines)
        line["learner_samples_per_s"] = samples / max(sum(seconds.values()), 1e-9)
        line["weights_version"] = self.version
        for name, metrics in lines.items():
            for key in POLICY_KEYS:
                if key in metrics:
                    line[f"{POLICY_PREFIX}{name}/{key}"] = metrics[key]
        return line

    # ---- weights and state -----------------------------------------------------------------------
    def weights(self) -> dict[str, torch.Tensor]:
        """Every group's weights, joined, with each group's version (contracts/policy_groups.py)."""
        parts = {name: lrn.weights() for name, lrn in self.learners.items()}
        versions = {name: lrn.version for name, lrn in self.learners.items()}
        return {k: torch.as_tensor(v) for k, v in with_versions(joined(parts), versions).items()}

    def state_dict(self) -> dict[str, Any]:
        """`model`: the joined weights (what export and serving read); `groups`: each group's
        learner state without its weights; `version`/`updates`: the sums."""
        states = {name: lrn.state_dict() for name, lrn in self.learners.items()}
        return {
            "model": joined({name: state["model"] for name, state in states.items()}),
            "groups": {
                name: {k: v for k, v in state.items() if k != "model"} for name, state in states.items()
            },
            "version": self.version,
            "updates": sum(lrn.updates for lrn in self.learners.values()),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for name, lrn in self.learners.items():
            lrn.load_state_dict(group_state(state, name))


def group_state(state: dict[str, Any], name: str) -> dict[str, Any]:
    """Group `name`'s learner state out of a grouped learner's (`state_dict`)."""
    return {**state["groups"][name], "model": part_of(state["model"], name)}


def groups_state_problem(models: dict[str, EnvPolicy], state: dict[str, Any]) -> str | None:
    """The first reason a grouped learner `state` would not restore learners of these models
    ({group: model}), or None (`learner_state_problem` for each group)."""
    groups = state.get("groups")
    if not isinstance(groups, dict) or sorted(groups) != sorted(models):
        return f"its policy groups are not {', '.join(models)}"
    for name, model in models.items():
        if not isinstance(groups[name], dict):
            return f"policy group {name}: its learner state is not a mapping"
        problem = learner_state_problem(model, group_state(state, name))
        if problem:
            return f"policy group {name}: {problem}"
    return None


def make_learner(
    cfg: RelayConfig, env: EnvSpec, dev: DeviceContext | None = None
) -> Learner | PolicyGroupsLearner:
    """The learner for a run: one per policy group where the env is split into groups."""
    return PolicyGroupsLearner(cfg, env, dev) if env.groups else Learner(cfg, env, dev)
