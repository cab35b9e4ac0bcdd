"""The env family: runs whose policy acts in an env (gymnasium, EnvPool, PettingZoo) and learns
from its [T, N] segments. Its preflight builds one env, checks the model can read it and the
memory the ring buffer and the segments take; its algorithms are `learner/algorithms`, its
backends the local and the Ray ones (`services/driver/backends.py`)."""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass

import torch

from ....contracts.config import RelayConfig
from ....contracts.policy_groups import PolicyGroupError, group_config
from ....contracts.spaces import EnvSpec
from ....learner.algorithms import ALGORITHMS, algorithm_class, segment_layout
from ....learner.device import DeviceContext, check_device
from ....learner.precision import is_convolutional, resolve_precision
from ....policy import cores
from ....policy.encoders import encoder_plan
from ....policy.models import build_policy, global_state_problem, model_kind
from ....rollout_workers.envs import EnvSpecError, probe_env_spec
from ....rollout_workers.multi_agent import MULTI_AGENT_APIS
from ....rollout_workers.multi_agent.common import columns_problem
from ....rollout_workers.preprocess import preprocessor
from ....rollout_workers.vector_backends import vector_backend
from ....services.driver.backends import LocalBackend, RayBackend
from ....services.driver.checks import GB, PreflightError, registry_problems, runs_here
from ....services.driver.families.base import Family
from ....services.runs.checkpoints import check_env_resumable


def config_problems(cfg: RelayConfig) -> list[str]:
    """The env family's registry names (algorithm, vector backend, preprocessing, recurrent core),
    then the chosen entries' own rules."""
    problems = registry_problems(
        [
            (algorithm_class, cfg.learner.algo),
            (vector_backend, cfg.env.vectorization),
            (preprocessor, cfg.env.preprocess),
            (cores.core_class, cfg.model.recurrent),
        ]
    )
    if problems:
        return problems
    return (
        algorithm_class(cfg.learner.algo).config_problems(cfg)
        + vector_backend(cfg.env.vectorization).config_problems(cfg)
        + cores.config_problems(cfg)
    )


def _multi_agent_run_problem(cfg: RelayConfig, env: EnvSpec) -> str | None:
    """What a PettingZoo env's columns and seats cannot do with this run's learner and model, or
    None (rollout_workers.envs.multi_agent_problem checks the env section itself)."""
    if env.multi_agent is None:
        return None
    problem = columns_problem(cfg.env.num_envs, env.columns, cfg.env.id)
    if problem:
        return problem
    if algorithm_class(cfg.learner.algo).grouped:
        return (
            f"learner.algo={cfg.learner.algo} samples groups of whole episodes: not a PettingZoo env's agents"
        )
    if MULTI_AGENT_APIS[env.multi_agent].one_seat and cfg.model.recurrent != cores.NO_CORE:
        return "model.recurrent: a turn-based game's opponents play without a recurrent state"
    return None


def check_env(cfg: RelayConfig) -> EnvSpec:
    """Build one env and check the model can read it; returns its spec (PreflightError otherwise)."""
    notes: list[str] = []
    try:
        env = probe_env_spec(cfg.env, notes, cfg.multi_agent)
    except EnvSpecError as err:
        raise PreflightError(str(err)) from None
    problem = _multi_agent_run_problem(cfg, env)
    if problem:
        raise PreflightError(problem)
    for policy_cfg, spec in policies(cfg, env):
        _check_policy(policy_cfg, spec)
    for note in dict.fromkeys(notes):  # policy groups of one env may note the same thing
        print(f"relay: {note}", file=sys.stderr)
    return env


def policies(cfg: RelayConfig, env: EnvSpec) -> list[tuple[RelayConfig, EnvSpec]]:
    """(config, spec) of each policy the run trains: its own, or each policy group's
    (contracts/policy_groups.py). PreflightError where the groups cannot be split or evaluated."""
    if not env.groups:
        return [(cfg, env)]
    try:
        return [(group_config(cfg, env, name), env.policy(name)) for name in env.policy_names]
    except PolicyGroupError as err:
        raise PreflightError(str(err)) from None


def _check_policy(cfg: RelayConfig, env: EnvSpec) -> None:
    """The model can read the env (a policy group's, for each group)."""
    problem = model_kind(cfg.model.kind).env_problem(cfg, env) or global_state_problem(cfg, env)
    if problem:
        raise PreflightError(problem)
    if cfg.model.encoders and not env.structured:
        raise PreflightError(
            f"model.encoders chooses encoders for the leaves of a Dict/Tuple (or Discrete) observation; "
            f"{cfg.env.id} observes {env.describe_obs()}"
        )
    if env.structured:
        try:
            encoder_plan(env, cfg.model.encoders)
        except ValueError as err:
            raise PreflightError(str(err)) from None


def env_precision(cfg: RelayConfig, env: EnvSpec | None, address: str | None = None) -> str:
    """What the learner will compute in (`learner/precision.py`), for `relay validate`: decided
    here when the learner runs on this machine, else said to be the learner host's decision."""
    assert env is not None
    lc = cfg.learner
    if not runs_here(cfg, address) and "auto" in (lc.use_amp, lc.channels_last):
        return "decided on the learner's host by its device's bf16 units (learner.use_amp=auto)"
    # Set explicitly, neither reads the device: a remote learner's is not looked up here.
    dev = DeviceContext(
        check_device(lc.device, lc.npu_ids) if runs_here(cfg, address) else torch.device("cpu")
    )
    cfg, env = policies(cfg, env)[0]  # policy groups share the learner's device and settings
    model = build_policy(cfg, env, critic=algorithm_class(cfg.learner.algo).critic)
    return resolve_precision(lc, dev, is_convolutional(model)).describe()


# Resident memory of one actor process, measured (docs/benchmarks.md, the wide fleet): mostly an
# interpreter with torch and gymnasium imported. A lower bound: envs add their own.
ACTOR_PROCESS_BYTES = int(0.3 * GB)


@dataclass(frozen=True)
class MemoryEstimate:
    """Bytes the config implies on the host: the learner's ring buffer (when it is on the CPU),
    segments being filled or waiting in the object store, and the actor processes themselves."""

    buffer: int
    segments: int
    processes: int = 0

    @property
    def total(self) -> int:
        return self.buffer + self.segments + self.processes


def estimate_memory(cfg: RelayConfig, env: EnvSpec, learner_on_cpu: bool) -> MemoryEstimate:
    # a worker's call makes one segment per policy group, each group's buffer the same segments
    seg = sum(segment_layout(c, e).nbytes() for c, e in policies(cfg, env))
    buffer = cfg.buffer_segments * seg * cfg.learner.num_learners if learner_on_cpu else 0
    # Per worker: the segment it fills, plus those outstanding or waiting (sync keeps the next
    # round in flight); the learner's gather of a round copies it once more.
    per_worker = 1 + max(2, cfg.rollout.max_segments_in_flight)
    segments = (max(cfg.rollout.num_workers, 1) * per_worker + cfg.segments_per_update) * seg
    actors = cfg.rollout.num_workers + cfg.learner.num_learners if cfg.rollout.num_workers else 0
    return MemoryEstimate(buffer, segments, actors * ACTOR_PROCESS_BYTES)


def host_memory_bytes() -> int:
    return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))


def check_memory(cfg: RelayConfig, env: EnvSpec, learner_on_cpu: bool) -> None:
    need, have = estimate_memory(cfg, env, learner_on_cpu), host_memory_bytes()
    if need.total > have:
        raise PreflightError(
            f"the config needs about {need.total / GB:.1f} GB of memory (ring buffer "
            f"{need.buffer / GB:.1f} GB: learner.buffer_size={cfg.learner.buffer_size}; segments "
            f"{need.segments / GB:.1f} GB: env.num_envs={cfg.env.num_envs} x "
            f"rollout.rollout_len={cfg.rollout.rollout_len} per segment; actor processes "
            f"{need.processes / GB:.1f} GB: rollout.num_workers={cfg.rollout.num_workers} x "
            f"~{ACTOR_PROCESS_BYTES / GB:.1f} GB), more than this machine's {have / GB:.1f} GB"
        )


def check(cfg: RelayConfig, address: str | None) -> EnvSpec:
    """The env builds and the model reads it; where the learner runs here, its device exists and
    the memory the config implies fits."""
    env = check_env(cfg)
    if runs_here(cfg, address):
        on_cpu = check_device(cfg.learner.device, cfg.learner.npu_ids).type == "cpu"
        check_memory(cfg, env, on_cpu)
    return env


def backend_class(cfg: RelayConfig) -> type[LocalBackend] | type[RayBackend]:
    """Local mode without workers, else Ray actors."""
    return LocalBackend if cfg.rollout.num_workers == 0 else RayBackend


FAMILY = Family(
    algorithms=lambda: list(ALGORITHMS),
    config_problems=config_problems,
    check=check,
    precision=env_precision,
    backend=backend_class,
    check_resumable=check_env_resumable,
    export_formats=("onnx",),
)
