"""Every check a config passes before anything starts: `relay validate` and `relay train` (and
`relay resume`) run exactly these, so they accept and refuse the same configs with the same line.

1. the sections entries declare (learner.grpo, metrics.mlflow, ...), registry names and each
   entry's own rules (algorithm, model kind, vector backend), and the packages of the trackers it
   names;
2. the env: it builds, its spaces are supported, the model kind can read its observations;
3. the learner device: it parses, and where the learner runs on this machine, it exists here;
4. memory: what the config implies (ring buffer, segments in flight) fits this machine.

Nothing here writes a file or starts Ray.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass

import torch

from ...contracts.config import ConfigError, RelayConfig
from ...contracts.policy_groups import PolicyGroupError, group_config
from ...contracts.prompts import PromptError, load_prompts
from ...contracts.spaces import EnvSpec
from ...learner.algorithms import ALGORITHMS, algorithm_class, segment_layout
from ...learner.device import DeviceContext, check_device, parse_device_spec
from ...learner.lm_learner import lm_precision
from ...learner.precision import is_convolutional, resolve_precision
from ...policy import cores, weight_wires
from ...policy.causal_lm import ModelFolderError, check_model_folder, load_tokenizer
from ...policy.encoders import ENCODERS, encoder_plan
from ...policy.lm_decoding import decoding_problem
from ...policy.models import MODEL_KINDS, build_policy, global_state_problem, model_kind
from ...policy.vllm_decoding import vllm_problem
from ...rollout_workers.envs import EnvSpecError, probe_env_spec
from ...rollout_workers.multi_agent import MULTI_AGENT_APIS
from ...rollout_workers.multi_agent.common import columns_problem
from ...rollout_workers.preprocess import PREPROCESSORS, preprocessor
from ...rollout_workers.rewards import resolve_rewards
from ...rollout_workers.vector_backends import VECTOR_BACKENDS, vector_backend
from ...services.config_sections import resolve_sections
from ...services.driver.lm_backend import language_spec
from ...services.tracking import missing_tracker

# Registry-backed leaves and their names, for `relay validate --help-config`.
CHOICES = {
    "learner.algo": list(ALGORITHMS),
    "model.kind": list(MODEL_KINDS),
    "env.vectorization": list(VECTOR_BACKENDS),
    "env.preprocess": list(PREPROCESSORS),
    "model.encoders": list(ENCODERS),
    "model.recurrent": [cores.NO_CORE, *cores.CORES],
    "learner.weight_wire": [weight_wires.AUTO, *weight_wires.WIRES],
}
GB = 1 << 30


class PreflightError(ValueError):
    """The config is valid but cannot run here (one line, exit 2)."""


def check_config(cfg: RelayConfig) -> None:
    """Registry names, then the rules of the chosen entries, all reported together (ConfigError);
    the entries' own sections are checked first and stored resolved (services/config_sections.py)."""
    resolve_sections(cfg)
    problems = []
    for lookup, name in (
        (algorithm_class, cfg.learner.algo),
        (model_kind, cfg.model.kind),
        (vector_backend, cfg.env.vectorization),
        (preprocessor, cfg.env.preprocess),
        (cores.core_class, cfg.model.recurrent),
    ):
        try:
            lookup(name)
        except ValueError as err:
            problems.append(str(err))
    problems += _wire_problems(cfg)
    if not problems:
        problems += algorithm_class(cfg.learner.algo).config_problems(cfg)
        problems += model_kind(cfg.model.kind).config_problems(cfg)
        problems += vector_backend(cfg.env.vectorization).config_problems(cfg)
        problems += cores.config_problems(cfg)
    if problems:
        raise ConfigError("invalid config: " + "; ".join(problems))


def _wire_problems(cfg: RelayConfig) -> list[str]:
    """The weight wire is registered, and exact where the policy acts from float32 weights."""
    try:
        wire = weight_wires.wire_for(cfg)
    except ValueError as err:
        return [str(err)]
    if wire.exact or cfg.language:
        return []
    exact = ", ".join(name for name, w in weight_wires.WIRES.items() if w.exact)
    return [
        f"learner.weight_wire={weight_wires.wire_name(cfg)} rounds the weights: an env policy acts "
        f"from float32 weights (its numpy mirror, its normalizer statistics); choose {exact}"
    ]


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


def _compile_problem(cfg: RelayConfig) -> str | None:
    """Why generation.compile or learner.compile cannot work here: the model's architecture or
    transformers' version (lm_decoding.decoding_problem, for the decoder), or inductor on a host
    without the C++ compiler it builds with."""
    from transformers import AutoConfig

    if cfg.generation.compile:
        config = AutoConfig.from_pretrained(
            str(cfg.model.path), local_files_only=True, trust_remote_code=False
        )
        problem = decoding_problem(config)
        if problem:
            return problem
    setting = "generation.compile" if cfg.generation.compile else "learner.compile"
    npu = cfg.learner.device.startswith("npu") and cfg.generation.placement == "learner"
    if cfg.learner.compile_backend in ("auto", "inductor") and not npu:
        from torch._inductor.cpp_builder import get_cpp_compiler

        try:
            get_cpp_compiler()
        except Exception as err:  # torch raises its own error types for a missing compiler
            return (
                f"{setting}: inductor needs a C++ compiler on this host ({type(err).__name__}); "
                f"install g++, or set {setting}=false"
            )
    return None


def check_language(cfg: RelayConfig) -> EnvSpec:
    """A language run's inputs, all read as data before anything starts: the model folder, its
    tokenizer, every prompt file (each prompt within prompts.max_prompt_tokens) and the rewards
    (PreflightError, one line, on the first problem)."""

    assert cfg.model.path is not None and cfg.prompts.train is not None
    try:
        config = check_model_folder(cfg.model.path)
        tokenizer = load_tokenizer(cfg.model.path)
        for label, path in (("prompts.train", cfg.prompts.train), ("prompts.eval", cfg.prompts.eval)):
            if path is not None:
                load_prompts(path, tokenizer, cfg.prompts.max_prompt_tokens, label)
        resolve_rewards(cfg.prompts.rewards)
        if cfg.generation.backend == "vllm":
            problem = vllm_problem()
            if problem:
                raise PreflightError(problem)
            if cfg.learner.device == "cpu":
                raise PreflightError(
                    "generation.backend=vllm samples on a GPU or an NPU, not learner.device=cpu"
                )
        if cfg.generation.compile or cfg.learner.compile:
            problem = _compile_problem(cfg)
            if problem:
                raise PreflightError(problem)
    except (ModelFolderError, PromptError, ValueError) as err:
        raise PreflightError(str(err)) from None
    except ImportError as err:
        raise PreflightError(
            f"model.kind=causal_lm needs the llm extra: pip install 'relay-rl[llm]' ({err})"
        ) from None
    vocab = config.get("vocab_size") or len(tokenizer)
    return language_spec(cfg, int(vocab))


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


def learner_precision(cfg: RelayConfig, env: EnvSpec, address: str | None = None) -> str:
    """What the learner will compute in (`learner/precision.py`), for `relay validate`: decided
    here when the learner runs on this machine, else said to be the learner host's decision."""
    lc = cfg.learner
    here = runs_here(cfg, address)
    if cfg.language:
        if not here and lc.use_amp == "auto":
            return "decided on the learner's host: bfloat16 autocast where its device computes bf16"
        dev = DeviceContext(check_device(lc.device, lc.npu_ids) if here else torch.device("cpu"))
        amp, dtype = lm_precision(cfg, dev)
        return f"{dtype} autocast, float32 master weights" if amp else "float32 (no bf16 units on the device)"
    if not here and "auto" in (lc.use_amp, lc.channels_last):
        return "decided on the learner's host by its device's bf16 units (learner.use_amp=auto)"
    # Set explicitly, neither reads the device: a remote learner's is not looked up here.
    dev = DeviceContext(check_device(lc.device, lc.npu_ids) if here else torch.device("cpu"))
    cfg, env = policies(cfg, env)[0]  # policy groups share the learner's device and settings
    model = build_policy(cfg, env, critic=algorithm_class(cfg.learner.algo).critic)
    return resolve_precision(lc, dev, is_convolutional(model)).describe()


def runs_here(cfg: RelayConfig, address: str | None) -> bool:
    """True when the learner runs on this machine: local mode, or a local Ray this command starts."""
    return cfg.rollout.num_workers == 0 or not (address or os.environ.get("RAY_ADDRESS"))


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


def preflight(cfg: RelayConfig, address: str | None = None) -> EnvSpec:
    """All checks, in order; returns the env spec. ConfigError, PreflightError or DeviceError."""
    check_config(cfg)
    missing = missing_tracker(cfg)
    if missing:
        raise PreflightError(missing)
    parse_device_spec(cfg.learner.device)
    if cfg.language:
        env = check_language(cfg)
        if runs_here(cfg, address):
            check_device(cfg.learner.device, cfg.learner.npu_ids)
        return env
    env = check_env(cfg)
    if runs_here(cfg, address):
        on_cpu = check_device(cfg.learner.device, cfg.learner.npu_ids).type == "cpu"
        check_memory(cfg, env, on_cpu)
    return env
