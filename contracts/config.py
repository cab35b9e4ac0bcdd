"""The one config model: YAML in, `--set a.b=v` overrides, cross-field rules checked up front.

Every field has a default and a description (`relay validate --help-config` prints them all).
Derived values are properties, never fields rewritten after parsing. Names that resolve through a
registry (`learner.algo`, `model.kind`, `env.vectorization`) are plain strings here; the layer that
owns each registry checks them, with the rules particular to each entry (see
`services/driver/preflight.py`), so adding an algorithm, a model or an env backend never edits
this file. An entry's own settings (`learner.<algorithm>`, `model.<kind>`, `metrics.<tracker>`) are an
`EntrySection` declared beside the entry; here they are plain mappings (`_EntrySections`), which
`services/runs/config_sections.py` validates by the entry's class before a run starts.

Everything read here is data: YAML is parsed with the safe loader (no tags that build objects),
the expanded size of a document is capped (a YAML alias bomb stops at the cap instead of eating
memory), and non-finite floats are refused.
"""

from __future__ import annotations

import copy
import dataclasses
import re
import types
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar, Union, cast, get_args, get_origin

import yaml
from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError, PydanticUndefined

from ..contracts.spaces import MAX_POLICY_GROUPS, POLICY_NAME

# A config is a few hundred values; a document that expands to more is a mistake or an attack.
MAX_CONFIG_NODES = 20_000
MAX_CONFIG_BYTES = 1 << 20
# Sections are 3 levels deep; env.kwargs may nest further, but never this far (YAML, JSON and the
# run directory's writer would all fail on a document nested hundreds of levels deep).
MAX_CONFIG_DEPTH = 32
# The vector env backend that steps plain gymnasium envs one after another in the worker's own
# process: the default, and what evaluation with video, a policy's own env and PettingZoo envs
# use (rollout_workers/vector_backends.py registers it under this name).
IN_PROCESS = "sync"
RUN_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,199}$")


class ConfigError(ValueError):
    """A config that cannot run; the message is one line a person can act on."""


def _admits_bool(tp: Any) -> bool:
    """Whether a field typed `tp` takes true/false as itself (bool, Any, a Literal of bools)."""
    if tp is bool or tp is Any:
        return True
    origin, args = get_origin(tp), get_args(tp)
    if origin is Annotated:
        return _admits_bool(args[0])
    if origin is Literal:
        return any(isinstance(a, bool) for a in args)
    if origin in (Union, types.UnionType):
        return any(_admits_bool(a) for a in args)
    return False


def _misread_bool(value: Any, tp: Any) -> bool:
    """Whether `value` holds a true/false where `tp` wants something else. Pydantic's lax mode
    reads true as 1 and false as 0 for a number (`env.num_envs: true` would run one env), so a
    bool is refused wherever the field, or the list or mapping item it sits in, is not a bool."""
    if isinstance(value, bool):
        return not _admits_bool(tp)
    origin, args = get_origin(tp), get_args(tp)
    if origin is Annotated:
        return _misread_bool(value, args[0])
    members = args if origin in (Union, types.UnionType) else (tp,)
    if isinstance(value, list | tuple):
        items = [
            a for m in members if get_origin(m) in (list, tuple) for a in get_args(m) if a is not Ellipsis
        ]
        return bool(items) and any(all(_misread_bool(v, a) for a in items) for v in value)
    if isinstance(value, dict):
        values = [get_args(m)[1] for m in members if get_origin(m) is dict and len(get_args(m)) == 2]
        return bool(values) and any(all(_misread_bool(v, a) for a in values) for v in value.values())
    return False


class _Section(BaseModel):
    # A typo must never be silently ignored; NaN or inf is never a setting.
    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)

    @field_validator("*", mode="before")
    @classmethod
    def _no_bool_as_number(cls, value: Any, info: ValidationInfo) -> Any:
        field = cls.model_fields.get(info.field_name or "")
        if field is not None and _misread_bool(value, field.annotation):
            raise PydanticCustomError("bool_misread", "true/false is not a value of this setting")
        return value


class EntrySection(_Section):
    """The settings a registry entry declares beside its own code: an algorithm's under
    `learner.<name>` (`Algorithm.settings`), a model kind's under `model.<name>`
    (`ModelKind.settings`), a tracker's under `metrics.<name>` (its module's `Settings`).
    Subclass it there; nothing here names the entries."""


def _entry_section_data(value: Any) -> Any:
    if value is None or isinstance(value, dict):
        return value
    # a scalar or list where no field of the section is: a misspelt leaf, never a section
    raise PydanticCustomError("extra_forbidden", "unknown key")


# An entry section as this contract carries it: a mapping, or null (off). Only the entry's own
# class gives it types and rules (`entry_section`), so the config means the same in every process
# whatever that process imported: a rollout worker, a checkpoint reader or a user's script.
EntrySectionData = Annotated[dict[str, Any] | None, BeforeValidator(_entry_section_data)]


class _EntrySections(_Section):
    """A section that also holds registry entries' own sections, by entry name. Which names exist
    and what they hold is checked by the entries' registries before a run starts
    (`services/runs/config_sections.py`, run by `relay validate`, `train`, `resume` and sweeps)."""

    model_config = ConfigDict(extra="allow", validate_assignment=True, allow_inf_nan=False)
    __pydantic_extra__: dict[str, EntrySectionData] = Field(init=False)

    def entry_data(self, name: str) -> dict[str, Any] | None:
        """The raw section of entry `name`, or None where the config has none (or null)."""
        return (self.model_extra or {}).get(name)

    def set_entry_data(self, name: str, data: dict[str, Any] | None) -> None:
        """Store entry `name`'s section as its entry resolved it (services/runs/config_sections.py)."""
        assert self.__pydantic_extra__ is not None
        self.__pydantic_extra__[name] = data


SettingsT = TypeVar("SettingsT", bound=EntrySection)


def entry_section(parent: _EntrySections, where: str, name: str, settings: type[SettingsT]) -> SettingsT:
    """Entry `name`'s section of `parent` (found at `where`, e.g. "learner") validated by its own
    class, an absent or null section as its defaults (a tracker, whose null means off, asks
    `entry_data` first). ConfigError naming the leaves otherwise."""
    try:
        return settings.model_validate(parent.entry_data(name) or {})
    except ValidationError as err:
        raise ConfigError(_format_validation_error(err, f"{where}.{name}")) from None


class EnvConfig(_Section):
    id: str = Field(
        "CartPole-v1",
        min_length=1,
        max_length=300,
        description="Gymnasium env id, or 'module:factory' for your own env.",
    )
    num_envs: int = Field(
        8, ge=1, le=65_536, description="Envs per rollout worker (the N of a [T, N] segment)."
    )
    vectorization: str = Field(
        IN_PROCESS,
        description="Vector env backend: sync (SyncVectorEnv, for cheap envs), async (AsyncVectorEnv, "
        "a process per env, for costly ones) or envpool (EnvPool's batched C++ envs).",
    )
    seed: int = Field(
        0, ge=0, lt=2**63, description="Run seed: env seeds, exploration noise and init all derive from it."
    )
    max_episode_steps: int | None = Field(
        None, ge=1, le=2**31, description="Override the env's time limit (episodes are truncated there)."
    )
    kwargs: dict[str, Any] = Field(default_factory=dict, description="Extra keyword arguments for gym.make.")
    preprocess: str = Field(
        "none",
        description="Env preprocessing: none, or atari (no-op reset, max-and-skip 4, 84x84 grey, fire "
        "reset, episodic life and sign-clipped rewards for learning with the true game reported, "
        "4-frame stack; observations uint8 [4, 84, 84]), or pixels for PettingZoo pixel envs "
        "(SuperSuit: blue channel, 84x84, 3-frame stack; uint8 [3, 84, 84]).",
    )
    normalize_reward: bool = Field(
        False,
        description="Scale rewards for learning by the running std of the discounted return (statistics "
        "gathered on the workers, merged on the learner, checkpointed, shipped with the weights); "
        "episode returns are reported unscaled.",
    )
    obs_keys: list[str] | None = Field(
        None,
        max_length=256,
        description="Keys of a Dict observation the policy reads (default: all but Text ones, which "
        "are skipped with one line saying so).",
    )
    actions: list[int] | None = Field(
        None,
        min_length=1,
        max_length=1024,
        description="Keep only these of a Discrete action space's choices, in this order (MiniGrid's "
        "turns and forward: [0, 1, 2]): the policy chooses among them, and acting, exports and serving "
        "give the env's own action. Not with an env action mask.",
    )
    action_mask: str = Field(
        "auto",
        max_length=300,
        description="Where action masks come from: auto (an observation key 'action_mask', else "
        "info['action_mask'] where the env's reset info has it), none, obs:<key> or info:<key>. "
        "Masked choices are never sampled and never reach the env.",
    )

    @field_validator("obs_keys")
    @classmethod
    def _keys(cls, keys: list[str] | None) -> list[str] | None:
        if keys is not None and (not keys or len(set(keys)) != len(keys) or not all(keys)):
            raise ValueError("env.obs_keys must name at least one key, each once, none empty")
        return keys

    @field_validator("action_mask")
    @classmethod
    def _mask_source(cls, source: str) -> str:
        kind, _, key = source.partition(":")
        if source in ("auto", "none") or (kind in ("obs", "info") and key):
            return source
        raise ValueError(f"env.action_mask must be auto, none, obs:<key> or info:<key>, got {source!r}")


class RolloutConfig(_Section):
    num_workers: int = Field(
        2,
        ge=0,
        le=4096,
        description="Rollout worker actors; 0 samples in the driver process (local mode). A language "
        "run's are its reward workers (each with a generator actor beside it where "
        "generation.placement=workers).",
    )
    rollout_len: int = Field(
        128, ge=1, le=1_000_000, description="Steps per segment (the T of a [T, N] segment)."
    )
    num_cpus_per_worker: float = Field(
        1.0, gt=0, le=1024, description="CPUs Ray reserves for each rollout worker."
    )
    mode: Literal["sync", "async"] = Field(
        "sync",
        description="sync: every segment of an update comes from the current weights (lag 0); "
        "async: workers keep sampling while the learner updates.",
    )
    max_segments_in_flight: int = Field(
        1,
        ge=1,
        le=1024,
        description="Async mode: sample calls outstanding per worker (bounds object-store use); "
        "the policy lag of a segment is at most this. 1 keeps PPO stable; more trades stability "
        "for throughput.",
    )
    max_restarts: int = Field(
        3, ge=0, le=1_000_000, description="How often Ray restarts a rollout worker that died."
    )
    autoscale: bool = Field(
        False,
        description="Elastic fleet (async mode): add rollout workers while the learner starves (busy "
        "under half the time, nothing queued), retire them while it is saturated and segments queue; "
        "asks Ray's autoscaler for the CPUs, so nodes come and go with demand. rollout.num_workers is "
        "the size it starts at.",
    )
    min_workers: int = Field(1, ge=1, le=4096, description="Elastic fleet: the fewest rollout workers.")
    max_workers: int = Field(16, ge=1, le=4096, description="Elastic fleet: the most rollout workers.")
    segment_timeout_s: float | Literal["auto"] | None = Field(
        "auto",
        description="The stuck-worker watchdog: a rollout worker that returns no segment for this "
        "many seconds is named, killed and restarted (counted as stuck_workers); auto: 10x the "
        "slowest segment measured so far, at least 60 s (300 s before the first one); null: off.",
    )
    placement_timeout_s: float | None = Field(
        300.0,
        gt=0,
        description="Give up (exit 2, naming the missing resources) when actors cannot be placed for "
        "this long; null waits forever (for autoscaling clusters that add nodes on demand).",
    )

    @field_validator("segment_timeout_s")
    @classmethod
    def _positive_timeout(cls, value: float | str | None) -> float | str | None:
        if isinstance(value, float) and not 0 < value <= 1e7:
            raise ValueError("must be a number of seconds in (0, 1e7], auto or null")
        return value


# Families of runs: an env family (an env's steps, a policy under relay's heads), a language
# family (prompts and completions, a causal LM) and a preference family (preference pairs, a
# reward model: a causal LM's body under a scalar score head). A model kind belongs to one; every kind not
# named here is the env family's. What differs by family in the config contract is the family's
# learner defaults, its moved keys and its cross-field rules (CONFIG_FAMILIES below); everything
# else a family decides lives in its entry above this layer (services/driver/families/).
ENV_FAMILY = "env"
LANGUAGE_FAMILY = "language"
PREFERENCE_FAMILY = "preference"
MODEL_FAMILIES: dict[str, str] = {"causal_lm": LANGUAGE_FAMILY, "reward_model": PREFERENCE_FAMILY}


def family_of_kind(kind: Any) -> str:
    """The family of runs a model kind trains in (an unknown kind: the env family's, whose
    registry then names the known kinds)."""
    return MODEL_FAMILIES.get(kind, ENV_FAMILY) if isinstance(kind, str) else ENV_FAMILY


# learner.* defaults of a language run (TRL's GRPOConfig): what the user does not set.
LANGUAGE_LEARNER_DEFAULTS: dict[str, Any] = {
    "algo": "grpo",
    "group_size": 8,
    "lr": 1e-6,
    "epochs": 1,
    "max_grad_norm": 1.0,
    "entropy_coef": 0.0,
}
# learner.* defaults of a reward model's run (TRL's RewardConfig: a learning rate for a pretrained
# body, not an env policy's 3e-4).
PREFERENCE_LEARNER_DEFAULTS: dict[str, Any] = {"algo": "bradley_terry", "lr": 1e-5, "max_grad_norm": 1.0}
# learner.grpo keys of a language run written before the update's settings became their own
# sections (2026-12): each moves to the section that owns it now, so those configs keep loading.
LANGUAGE_MOVED_KEYS: dict[str, str] = {
    "clip_ratio_high": "clip",
    **dict.fromkeys(
        (
            "loss_agg",
            "kl_estimator",
            "drop_equal_groups",
            "refill_rounds",
            "micro_batch_tokens",
            "logprob_chunk",
            "importance_correction",
            "importance_cap",
        ),
        "lm",
    ),
}


class LoraConfig(_Section):
    """Low-rank adapters (peft's LoRA) on a causal LM: only they train, and only they travel to
    generators; the frozen base with the adapters off is the KL reference (no second model)."""

    r: int = Field(16, ge=1, le=4096, description="Adapter rank.")
    alpha: float = Field(32.0, gt=0, le=1e6, description="Scaling numerator (the update is alpha / r x BA).")
    dropout: float = Field(0.0, ge=0, lt=1, description="Dropout on the adapters' input.")
    target_modules: list[str] | str = Field(
        "all-linear",
        description="Modules that get adapters: names (q_proj, v_proj, ...) or all-linear (every "
        "linear layer but the output head).",
    )


class PromptsConfig(_Section):
    train: str | None = Field(
        None,
        max_length=4096,
        description="model.kind=causal_lm: a local JSONL or Parquet file with a `prompt` column (text "
        "or chat messages); every other column reaches the rewards by name.",
    )
    eval: str | None = Field(
        None, max_length=4096, description="Prompts scored by evaluations (may be null)."
    )
    rewards: list[str] = Field(
        default_factory=list,
        max_length=32,
        description="Reward registry names (exact_match, numeric_match, regex:<pattern>, "
        "length_at_most:<n>, model:<folder> (a sequence-classification reward model's score)) or "
        "module:fn with TRL's signature fn(prompts, completions, **columns) -> list[float].",
    )
    reward_weights: list[float] | None = Field(
        None, description="A weight per reward (null: 1 each); the reward is their weighted sum."
    )
    reward_timeout_s: float = Field(
        30.0, gt=0, le=86_400, description="Seconds a reward function may take for one batch."
    )
    reward_norm: Literal["none", "running"] = Field(
        "none",
        description="What the update trains on: the rewards as scored (none), or less their running "
        "mean over every reward so far, over its running std (running; a reward model's scale stops "
        "mattering). The metrics' reward_mean is the rewards as scored either way.",
    )
    reward_clip: float | None = Field(
        None,
        gt=0,
        le=1e6,
        description="Clip what the update trains on to [-c, c], after reward_norm (null: no clipping).",
    )
    batch_size: int = Field(
        4, ge=1, le=65_536, description="Prompts per round; each gets learner.group_size completions."
    )
    max_prompt_tokens: int = Field(
        256, ge=1, le=1_000_000, description="The longest prompt (after the chat template) accepted."
    )
    shuffle: bool = Field(True, description="Visit prompts in a seeded random order per epoch.")
    seed: int | None = Field(
        None,
        ge=0,
        lt=2**63,
        description="A language run's seed: the prompt order, the sampling noise of generation, and "
        "parameters the run initialises (LoRA adapters). null: env.seed, which seeded language runs "
        "configured before 2026-12-07.",
    )


def language_seed(cfg: RelayConfig) -> int:
    """The seed of a language run: prompts.seed, else env.seed (what configs before it set)."""
    return cfg.prompts.seed if cfg.prompts.seed is not None else cfg.env.seed


class GenerationConfig(_Section):
    max_new_tokens: int = Field(64, ge=1, le=1_000_000, description="Completion budget in tokens.")
    temperature: float = Field(1.0, gt=0, le=100, description="Sampling temperature.")
    top_k: int = Field(0, ge=0, le=1_000_000, description="Sample among the k likeliest tokens (0: all).")
    placement: Literal["learner", "workers"] = Field(
        "learner",
        description="learner: the learner generates on its device between updates (weights never move); "
        "workers: rollout.num_workers generator actors (rollout.num_cpus_per_worker CPUs each, beside "
        "as many reward actors), weights sent by version in bf16.",
    )
    compile: bool = Field(
        False,
        description="Decode with one compiled fixed-shape step over a static KV cache (learner."
        "compile_backend's backend: inductor on cpu/cuda, torchair's graph mode on npu): compiled "
        "once, in the first round, never again whatever the prompts' lengths (metric compiles); "
        "needs transformers >= 5.",
    )
    max_staleness: int = Field(
        0,
        ge=0,
        le=1,
        description="Versions a round's completions may lag the weights they train: 0 generates each "
        "round with the newest weights, then trains; 1 (one-step off-policy, placement=workers) "
        "generates round k+1 on the generators while the learner trains round k, corrected by "
        "learner.grpo.importance_correction.",
    )
    backend: str = Field(
        "relay",
        min_length=1,
        max_length=64,
        description="What samples the completions, a name from the decoder registry: relay (relay's "
        "own: the eager KV-cache loop, or the compiled static-cache decoder where generation.compile), "
        "eager, static, or vllm: a vLLM engine in the learner's process on its GPU or NPU "
        "(vllm-ascend), the learner's weights loaded into it once per version "
        "(placement=learner; needs the vllm package on the learner's host).",
    )
    vllm_memory_fraction: float = Field(
        0.3,
        gt=0,
        lt=1,
        description="generation.backend=vllm: the share of the device's memory vLLM takes for its "
        "weights and KV cache (the rest is the update's).",
    )
    noise: Literal["device", "cpu"] = Field(
        "device",
        description="Where sampling noise is drawn: device (fast), or cpu: the same draws on any "
        "device, for runs that must match bit for bit across hosts (a host draw of rows x vocab "
        "numbers every token: 34 ms at 64 x 151,936 on 2 cores, more than a GPU's decode step).",
    )
    prompt_buckets: list[int] | None = Field(
        None,
        max_length=64,
        description="Prompt lengths prompts are left-padded to (the smallest that fits), so generation "
        "sees a few fixed shapes; null: powers of two up to prompts.max_prompt_tokens.",
    )

    def buckets(self, max_prompt_tokens: int) -> list[int]:
        """The prompt-length buckets in increasing order, the last one >= max_prompt_tokens."""
        if self.prompt_buckets:
            out = sorted(set(self.prompt_buckets))
        else:
            out, b = [], 16
            while b < max_prompt_tokens:
                out.append(b)
                b *= 2
        if not out or out[-1] < max_prompt_tokens:
            out.append(max_prompt_tokens)
        return out


class LearnerConfig(_EntrySections):
    algo: str = Field(
        "ppo",
        description="Update rule, a name from the model kind's family's registry: an env policy's ppo "
        "(actor-critic) or grpo (critic-free, group-relative advantages); a causal LM's advantage "
        "estimator (grpo, rloo, reinforce_pp); a reward model's loss (bradley_terry).",
    )
    device: str = Field(
        "auto", max_length=32, description="auto (npu, then cuda, then cpu), cpu, cuda[:i] or npu[:i]."
    )
    num_learners: int = Field(
        1,
        ge=1,
        le=1024,
        description="Learner ranks: Ray actors, one device each, joined in one process group (gloo on "
        "CPUs, cpu:gloo,cuda:nccl on GPUs, cpu:gloo,npu:hccl on NPUs).",
    )
    collective_timeout_s: float = Field(
        1800.0,
        gt=0,
        le=86_400,
        description="Seconds a learner rank waits in one collective for its peers before it fails: a "
        "peer that died or raised surfaces as an error (and a learner restart), never a hang.",
    )
    device_memory_gb: float | None = Field(
        None,
        gt=0,
        le=1_000_000,
        description="Memory of one learner device in GiB, for the language runs' fit check where "
        "relay cannot read it (a CPU, an NPU, a GPU on another host): a run whose estimate "
        "per device is larger is refused before it starts. null: read it where it can be (a CUDA "
        "device on this host), else no check.",
    )
    parallel: Literal["auto", "ddp", "fsdp"] = Field(
        "auto",
        description="How learner.num_learners ranks share the model: fsdp shards a causal LM's "
        "parameters, gradients and optimizer state with torch's FSDP2; ddp keeps a replica on each "
        "(env policies); auto is fsdp for causal LMs and ddp for env policies.",
    )
    num_cpus: int = Field(
        1,
        ge=1,
        le=1024,
        description="CPUs Ray reserves for each learner actor, which are also its torch threads: "
        "1 suits an accelerator learner or a small MLP; a CNN learned on the CPU wants the cores.",
    )
    npu_ids: list[int] = Field(
        default_factory=list,
        max_length=1024,
        description="Accelerator ids the learner may use; empty lets Ray assign them (the normal case).",
    )
    ray_resources: dict[str, float] = Field(
        default_factory=dict,
        description="Extra Ray resources the learner actor asks for (e.g. {NPU: 1} to pin a node type).",
    )

    @field_validator("ray_resources")
    @classmethod
    def _resources(cls, resources: dict[str, float]) -> dict[str, float]:
        for name, amount in resources.items():
            if name == "CPU":
                raise ValueError("CPUs are learner.num_cpus, not a ray_resources entry")
            if not 0 < amount <= 1e6:
                raise ValueError(f"{name}: {amount} is not an amount Ray can reserve (0 < amount <= 1e6)")
        return resources

    buffer_size: int = Field(
        4096, ge=1, le=2**34, description="Ring buffer capacity in env steps (a whole number of segments)."
    )
    batch_size: int = Field(512, ge=1, le=2**34, description="Minibatch size in env steps.")
    epochs: int = Field(4, ge=1, le=10_000, description="Passes over the update's data.")
    lr: float = Field(3e-4, gt=0, le=10, description="Adam learning rate.")
    lr_anneal: bool = Field(False, description="Anneal lr linearly to 0 over stop.env_steps.")
    gamma: float = Field(0.99, ge=0, le=1, description="Discount factor.")
    gae_lambda: float = Field(0.95, ge=0, le=1, description="GAE lambda.")
    clip_ratio: float = Field(0.2, gt=0, le=10, description="PPO/GRPO ratio clip epsilon.")
    value_coef: float = Field(0.5, ge=0, le=1e6, description="Value loss weight.")
    value_clip: float | None = Field(None, gt=0, description="Clip value updates to this range (None: off).")
    entropy_coef: float = Field(0.0, ge=0, le=1e6, description="Entropy bonus weight.")
    max_grad_norm: float = Field(0.5, gt=0, description="Global gradient-norm clip.")
    target_kl: float | None = Field(
        None, gt=0, description="Stop the update's epochs early once approx_kl exceeds 1.5x this."
    )
    normalize_advantages: bool = Field(True, description="Normalize advantages per minibatch (PPO).")
    off_policy_correction: Literal["none", "vtrace", "decoupled"] = Field(
        "none",
        description="PPO's targets for segments acted by older weights (async lag): none (GAE on the "
        "behaviour critic's values), vtrace (IMPALA's V-trace targets from the current policy and "
        "critic, with PPO's clipped surrogate on V-trace advantages, as APPO) or decoupled (GAE, "
        "with the clip centred on the weights the update starts from and the samples weighted by "
        "their probability under those over the behaviour's: Hilton et al. 2022's decoupled PPO).",
    )
    vtrace_rho_bar: float = Field(
        1.0, gt=0, le=1e6, description="V-trace: truncation of the TD importance weights."
    )
    vtrace_c_bar: float = Field(
        1.0, gt=0, le=1e6, description="V-trace: truncation of the trace-cutting weights."
    )
    grad_accum_steps: int = Field(
        1, ge=1, le=65_536, description="Micro-batches accumulated per optimizer step."
    )
    minibatch: Literal["steps", "sequences"] = Field(
        "steps",
        description="What minibatches are drawn over: steps (flat, shuffled env steps) or sequences "
        "(whole [T] columns of env steps, time-major, for policies that read a sequence; "
        "learner.batch_size / grad_accum_steps must then be a multiple of rollout.rollout_len).",
    )
    grad_checkpointing: bool = Field(False, description="Recompute the MLP trunk in backward to save memory.")
    compile: bool = Field(
        False,
        description="Compile the update's loss (forward and backward) with torch.compile for the "
        "fixed minibatch shape; the metrics count compiles and graph breaks (after the first "
        "update no compile may follow). A causal_lm run compiles its micro-batches' log-probs "
        "once per prompt bucket and micro-batch size it meets (metric update_compiles).",
    )
    compile_backend: Literal["auto", "inductor", "aot_eager", "eager"] = Field(
        "auto",
        description="torch.compile backend: auto (torchair's NPU backend on npu, inductor "
        "elsewhere), inductor, or aot_eager / eager (trace and guard without generating code: "
        "for checking recompiles).",
    )
    use_amp: bool | Literal["auto"] = Field(
        "auto",
        description="Autocast the forward/backward on the learner device. auto: bf16 autocast for "
        "a convolutional policy (pixels) where the device computes bf16 in hardware (a CPU with "
        "avx512_bf16/amx_bf16, CUDA 8.0+, the NPU), float32 otherwise and for MLPs (too small to "
        "gain); `relay validate` prints the choice.",
    )
    amp_dtype: Literal["bfloat16", "float16"] = Field(
        "bfloat16", description="Autocast dtype; float16 adds a GradScaler on npu/cuda."
    )
    channels_last: bool | Literal["auto"] = Field(
        "auto",
        description="Keep a convolutional policy's weights and frames channels-last (NHWC) on the "
        "learner, the layout oneDNN and cuDNN convolve fastest. auto: on for cpu and cuda, off "
        "on npu (which keeps its own layouts).",
    )
    weight_wire: str = Field(
        "auto",
        description="How weights travel to the actors, a name from the wire registry "
        "(policy/weight_wires.py): arrays (float32 numpy arrays), packed_bf16 (one buffer, bf16), "
        "packed_f32 (one buffer, exact); auto: arrays for env policies, packed_bf16 for language "
        "models. An env policy needs an exact wire.",
    )
    broadcast_interval: int = Field(
        1, ge=1, le=1_000_000, description="Publish new weights every this many updates."
    )
    group_size: int = Field(
        1, ge=1, le=65_536, description="GRPO: members per group sharing a prompt/start state."
    )
    kl_coef: float = Field(
        0.0, ge=0, le=1e6, description="GRPO: weight of the KL penalty to the reference policy."
    )
    ref_update_interval: int = Field(
        0, ge=0, description="GRPO: refresh the reference policy every this many updates (0: never)."
    )
    group_eps: float = Field(1e-6, gt=0, le=1, description="GRPO: epsilon in (r - mean) / (std + eps).")


class ModelConfig(_EntrySections):
    kind: str = Field(
        "mlp",
        description="Policy network, a name from the model registry: mlp (MLP trunks over the "
        "normalized observation), transformer (a tiny causal transformer over an observation of "
        "token ids: prompt + tokens emitted so far, -1 = empty) or cnn (the Nature CNN over uint8 "
        "frames) or causal_lm (a Hugging Face causal language model from model.path, trained by "
        "GRPO on prompts).",
    )
    path: str | None = Field(
        None,
        max_length=4096,
        description="model.kind=causal_lm: a local Hugging Face folder (config.json, *.safetensors, "
        "the tokenizer's files). Read as data: remote code (auto_map) and pickled weights are refused.",
    )
    lora: LoraConfig | None = Field(
        None, description="model.kind=causal_lm: train LoRA adapters instead of every weight (null: full)."
    )
    hidden_sizes: list[int] = Field(
        default_factory=lambda: [64, 64], max_length=64, description="MLP layer widths."
    )
    activation: Literal["silu", "tanh", "relu"] = Field("tanh", description="MLP activation.")
    shared_trunk: bool = Field(
        False, description="One trunk (and recurrent core) for policy and value heads."
    )
    recurrent: str = Field(
        "none",
        description="Recurrent core between the trunk and the heads, a name from the core registry: "
        "none, lstm or gru. Its state is carried through segments; needs learner.minibatch=sequences.",
    )
    recurrent_size: int = Field(64, ge=1, le=4096, description="Units of the recurrent core.")
    post_core_size: int = Field(
        0,
        ge=0,
        le=4096,
        description="Units of a tanh layer between the recurrent core and the heads (0: the heads read "
        "the core's output): lets a head act on what the memory holds and what the step shows together.",
    )
    burn_in: int = Field(
        0,
        ge=0,
        description="Steps at the start of each sequence that only warm the recurrent state (no loss, "
        "no gradient; R2D2): for states grown stale in async mode.",
    )
    init_log_std: float = Field(
        0.0, ge=-20, le=20, description="Initial log-std of the Gaussian head (Box actions)."
    )
    normalize_obs: bool = Field(True, description="Running observation normalizer (float32 statistics).")
    encoders: dict[str, str] = Field(
        default_factory=dict,
        max_length=256,
        description="Observation encoder per leaf path of a Dict/Tuple observation ('image', "
        "'pos/0'; '' for a lone one), a name from the encoder registry, overriding the rule "
        "(a uint8 [C, H, W] Box of at least 36x36: nature_cnn; Discrete and MultiDiscrete: one_hot; "
        "MultiBinary: binary; any other Box: flat, normalized).",
    )

    @field_validator("hidden_sizes")
    @classmethod
    def _widths(cls, sizes: list[int]) -> list[int]:
        bad = [w for w in sizes if not 1 <= w <= 65_536]
        if bad:
            raise ValueError(f"every width must be in [1, 65536], got {bad[0]}")
        return sizes


class StopConfig(_Section):
    env_steps: int | None = Field(
        100_000,
        ge=1,
        description="Stop at the first update that brings the run to this many valid env steps (a "
        "language run: completion tokens).",
    )
    iterations: int | None = Field(
        None,
        ge=1,
        le=10**9,
        description="Stop after this many learner iterations (updates), whatever the family: a language "
        "run's rounds, an env run's updates.",
    )
    episode_return_mean: float | None = Field(
        None, description="Stop once the mean return of the last 20 episodes reaches this."
    )
    wall_s: float | None = Field(None, gt=0, description="Stop after this many seconds of training.")
    eval_return_mean: float | None = Field(
        None, description="Stop once an evaluation's mean return reaches this (needs eval.every_iterations)."
    )


class CheckpointConfig(_Section):
    interval: int = Field(10, ge=1, description="Write a checkpoint every this many iterations.")
    keep: int = Field(3, ge=1, le=100_000, description="Checkpoints kept (oldest removed first).")
    keep_best: bool = Field(
        False,
        description="Keep the policy with the best evaluation return as checkpoints/best.pt (never "
        "pruned; needs eval.every_iterations).",
    )
    format: Literal["auto", "whole", "sharded"] = Field(
        "auto",
        description="whole: one file, the learner's state gathered to one place; sharded: a folder "
        "where every learner rank writes its own shards (torch.distributed.checkpoint; a causal LM's "
        "learner; the run folder must be on storage every learner node sees); auto: sharded for a "
        "causal LM over learner.num_learners > 1 ranks, whole otherwise.",
    )


class EvalConfig(_Section):
    every_iterations: int = Field(
        0, ge=0, description="Evaluate the newest weights every this many iterations (0: never)."
    )
    episodes: int = Field(10, ge=1, le=10_000, description="Whole episodes each evaluation plays.")
    deterministic: bool = Field(True, description="Act with the mode of the policy (false: sample).")
    video_every: int = Field(
        0, ge=0, description="Record a video of one episode every this many evaluations (0: never)."
    )
    num_cpus: float = Field(
        0.0,
        ge=0,
        description="CPUs the evaluation actor reserves (0: it runs on whatever is free, between "
        "evaluations it idles).",
    )


class MetricsConfig(_EntrySections):
    runs_dir: str = Field("runs", min_length=1, description="Folder holding run directories.")
    run_name: str | None = Field(
        None, description="Run directory name (default: <env>-<algo>-<time>-<random suffix>)."
    )
    tensorboard: bool = Field(True, description="Also write TensorBoard event files under events/.")
    progress: Literal["auto", "bar", "lines", "none"] = Field(
        "auto", description="Terminal progress: a bar on a TTY, plain lines otherwise."
    )

    @field_validator("run_name")
    @classmethod
    def _plain_name(cls, name: str | None) -> str | None:
        # A name is one folder under runs_dir: no separators, no '..', nothing hidden.
        if name is not None and not RUN_NAME.match(name):
            raise ValueError("a run name is letters, digits, '.', '_' and '-' (not starting with '.' or '-')")
        return name


class SelfPlayConfig(_Section):
    snapshot_every: int = Field(
        10,
        ge=1,
        le=1_000_000,
        description="Weights versions between snapshots of the learning policy into the opponent pool.",
    )
    pool_size: int = Field(
        5, ge=1, le=1_000, description="Snapshots kept (the oldest leaves first); each game draws one."
    )
    random_opponent: float = Field(
        0.1,
        ge=0.0,
        le=1.0,
        description="Fraction of games played against a uniformly random (mask-respecting) player, "
        "scored apart as win_rate_random.",
    )


class MultiAgentConfig(_Section):
    agents: list[str] = Field(
        default_factory=lambda: ["*"],
        min_length=1,
        max_length=256,
        description="PettingZoo envs: the agents the shared policy plays (fnmatch patterns, e.g. "
        "'prey_*'); every agent of a parallel env must match. Each matched agent of each env copy is "
        "a segment column, so env.num_envs counts columns (env copies x agents).",
    )
    self_play: SelfPlayConfig | None = Field(
        None,
        description="Turn-based (AEC) games: the policy plays one seat (alternating each game) against "
        "frozen snapshots of itself drawn from a pool, and a random player; null: against its "
        "current weights.",
    )
    policies: dict[str, list[str]] | None = Field(
        None,
        description="Parallel envs: policy groups, {name: [agent patterns]} (fnmatch, e.g. "
        "{predator: ['adversary_*'], prey: ['agent_*']}); an agent plays for the first group a pattern "
        "of which it matches, every agent must match one, and the agents of a group share weights "
        "(their spaces must agree; groups may differ). Each group has its own learner state: ring "
        "buffer, optimizer, metrics (policy/<name>/...), weights. null: one policy for every agent.",
    )
    policy_mapping: str | None = Field(
        None,
        pattern=r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*:[A-Za-z_][A-Za-z0-9_]*$",
        max_length=200,
        description="'module:fn' choosing each agent's policy group in code instead of patterns: "
        "fn(agent_id) returns a name of multi_agent.policies (give those groups no patterns, []). It "
        "imports and runs code, so a resume runs it only when named again with --set.",
    )
    central_critic: bool = Field(
        False,
        description="Parallel envs with a global state (PettingZoo's state()): each value trunk "
        "also reads the env copy's state beside its agent's observation (MAPPO's centralized "
        "critic); model.kind=cnn's reads the state alone, a screen state (pistonball's) as a 64x64 "
        "grey image through a CNN of its own. The acting path, exports and serving never read it. "
        "Needs model.shared_trunk=false and an algorithm with a critic.",
    )

    @field_validator("policies")
    @classmethod
    def _policy_names(cls, groups: dict[str, list[str]] | None) -> dict[str, list[str]] | None:
        if groups is None:
            return None
        if not 1 <= len(groups) <= MAX_POLICY_GROUPS:
            raise ValueError(f"multi_agent.policies names 1 to {MAX_POLICY_GROUPS} groups")
        for name, patterns in groups.items():
            if not POLICY_NAME.match(name):
                raise ValueError(
                    f"multi_agent.policies: {name[:40]!r} is not a group name (a letter, then letters, "
                    "digits, '_' or '-'; at most 40)"
                )
            if len(patterns) > 256 or not all(0 < len(p) <= 200 for p in patterns):
                raise ValueError(
                    f"multi_agent.policies.{name}: at most 256 agent patterns of 1-200 characters"
                )
        return groups


class SweepConfig(_Section):
    params: dict[str, str] = Field(
        default_factory=dict,
        description="`relay sweep`: config leaf -> uniform(a,b), loguniform(a,b), randint(a,b), "
        "choice(v1,v2,...) or grid(v1,v2,...) (--param adds to these; `relay train` ignores the section).",
    )
    samples: int | None = Field(
        None,
        ge=1,
        le=10_000,
        description="Trials of a random or optuna search (null: 8); a grid runs each point this many "
        "times (null: once).",
    )
    search: Literal["random", "grid", "optuna"] = Field(
        "random", description="How trials' values are chosen."
    )
    scheduler: Literal["fifo", "asha", "pbt"] = Field(
        "fifo",
        description="fifo: every trial runs to its stop; asha: poor trials stop early; pbt: "
        "population-based training (exploit the best trials' checkpoints, perturb the params).",
    )
    metric: str = Field(
        "episode_return_mean", min_length=1, description="The metrics key trials are ranked by."
    )
    mode: Literal["max", "min"] = Field("max", description="Whether a higher or lower metric is better.")
    max_concurrent: int | None = Field(
        None, ge=1, le=10_000, description="Trials running at once (null: as many as the cluster holds)."
    )
    dir: str | None = Field(
        None,
        description="The sweep's folder (default: <metrics.runs_dir>/sweep-<env>-<time>); one run "
        "directory per trial inside.",
    )
    grace_iterations: int = Field(
        10, ge=1, le=1_000_000, description="asha: iterations every trial runs before it may be stopped."
    )
    perturbation_interval: int = Field(
        10, ge=1, le=1_000_000, description="pbt: iterations between exploit/explore decisions."
    )


class RelayConfig(_Section):
    env: EnvConfig = Field(default_factory=EnvConfig, description="The environment.")
    rollout: RolloutConfig = Field(default_factory=RolloutConfig, description="Rollout workers.")
    learner: LearnerConfig = Field(default_factory=LearnerConfig, description="The learner.")
    model: ModelConfig = Field(default_factory=ModelConfig, description="The policy network.")
    stop: StopConfig = Field(default_factory=StopConfig, description="Stop criteria (first one met wins).")
    checkpoint: CheckpointConfig = Field(default_factory=CheckpointConfig, description="Checkpoints.")
    eval: EvalConfig = Field(default_factory=EvalConfig, description="Evaluation during training.")
    metrics: MetricsConfig = Field(default_factory=MetricsConfig, description="Metrics and progress.")
    sweep: SweepConfig = Field(default_factory=SweepConfig, description="`relay sweep` (Ray Tune).")
    multi_agent: MultiAgentConfig = Field(
        default_factory=MultiAgentConfig, description="PettingZoo envs: agents, self-play."
    )
    prompts: PromptsConfig = Field(
        default_factory=PromptsConfig, description="model.kind=causal_lm: prompts and rewards."
    )
    generation: GenerationConfig = Field(
        default_factory=GenerationConfig, description="model.kind=causal_lm: how completions are sampled."
    )

    @property
    def family(self) -> str:
        """The family of runs this config trains in (`MODEL_FAMILIES`): env or language."""
        return family_of_kind(self.model.kind)

    @model_validator(mode="before")
    @classmethod
    def _family_learner(cls, data: Any) -> Any:
        """The family's learner defaults where the user set none, and its moved keys moved."""
        if not isinstance(data, dict):
            return data
        model = data.get("model")
        family = CONFIG_FAMILIES[family_of_kind(model.get("kind") if isinstance(model, dict) else None)]
        learner = data.get("learner")
        if learner is not None and not isinstance(learner, dict):
            return data
        out = {**data, "learner": family.learner(learner or {})}
        for section, defaults in family.defaults.items():
            given = data.get(section)
            if given is None or isinstance(given, dict):
                out[section] = {**defaults, **(given or {})}
        return out

    @property
    def segment_steps(self) -> int:
        """Env steps in one [T, N] segment."""
        return self.rollout.rollout_len * self.env.num_envs

    @property
    def segments_per_update(self) -> int:
        """Segments one update trains on: one from each worker (one in local mode)."""
        return max(self.rollout.num_workers, 1)

    @property
    def update_steps(self) -> int:
        """Env steps (padding included) one update trains on."""
        return self.segments_per_update * self.segment_steps

    @property
    def buffer_segments(self) -> int:
        """Ring buffer capacity in segments."""
        return self.learner.buffer_size // self.segment_steps

    @model_validator(mode="after")
    def _cross_field_rules(self) -> RelayConfig:
        problems = CONFIG_FAMILIES[self.family].problems(self)
        if problems:
            raise ValueError("; ".join(problems))
        return self


def _round_desc(cfg: RelayConfig) -> str:
    if cfg.rollout.num_workers == 0:
        return "1 segment in local mode (rollout.num_workers=0)"
    return f"rollout.num_workers={cfg.rollout.num_workers}"


def _eval_problems(cfg: RelayConfig) -> list[str]:
    off = cfg.eval.every_iterations == 0
    needs = [
        ("checkpoint.keep_best=true", cfg.checkpoint.keep_best),
        (f"stop.eval_return_mean={cfg.stop.eval_return_mean}", cfg.stop.eval_return_mean is not None),
        (f"eval.video_every={cfg.eval.video_every}", cfg.eval.video_every > 0),
    ]
    return [f"{what} needs evaluations (eval.every_iterations > 0)" for what, on in needs if on and off]


def _no_stop(cfg: RelayConfig) -> bool:
    s = cfg.stop
    return s.env_steps is None and s.iterations is None and s.episode_return_mean is None and s.wall_s is None


def _cross_field_problems(cfg: RelayConfig) -> list[str]:
    """Every cross-field rule that fails, each naming fields and numbers."""
    problems: list[str] = _eval_problems(cfg)
    seg, lrn = cfg.segment_steps, cfg.learner
    shape = f"rollout.rollout_len={cfg.rollout.rollout_len} x env.num_envs={cfg.env.num_envs}"
    if lrn.buffer_size % seg:
        problems.append(
            f"learner.buffer_size={lrn.buffer_size} is not a whole number of segments ({shape} = {seg})"
        )
    if lrn.buffer_size < cfg.update_steps:
        problems.append(
            f"learner.buffer_size={lrn.buffer_size} holds fewer than one round of segments "
            f"({_round_desc(cfg)} x {shape} = {cfg.update_steps} steps)"
        )
    per_learner = cfg.update_steps // lrn.num_learners
    if per_learner % lrn.batch_size:
        who = "" if lrn.num_learners == 1 else f" each of learner.num_learners={lrn.num_learners} gets"
        problems.append(
            f"learner.batch_size={lrn.batch_size} does not divide the {per_learner} steps{who} of an update "
            f"({_round_desc(cfg)} x {shape})"
        )
    elif lrn.batch_size % lrn.grad_accum_steps:
        problems.append(
            f"learner.batch_size={lrn.batch_size} is not divisible by "
            f"learner.grad_accum_steps={lrn.grad_accum_steps}"
        )
    elif lrn.minibatch == "sequences" and (lrn.batch_size // lrn.grad_accum_steps) % cfg.rollout.rollout_len:
        problems.append(
            f"learner.minibatch=sequences draws whole [T={cfg.rollout.rollout_len}] sequences: "
            f"learner.batch_size={lrn.batch_size} / learner.grad_accum_steps={lrn.grad_accum_steps} "
            f"must be a multiple of rollout.rollout_len={cfg.rollout.rollout_len}"
        )
    if lrn.num_learners > 1 and (cfg.rollout.num_workers == 0 or cfg.rollout.num_workers % lrn.num_learners):
        problems.append(
            f"learner.num_learners={lrn.num_learners} must divide "
            f"rollout.num_workers={cfg.rollout.num_workers} (each learner takes the same share of a round)"
        )
    if cfg.env.num_envs % lrn.group_size:
        problems.append(
            f"env.num_envs={cfg.env.num_envs} is not divisible by learner.group_size={lrn.group_size}"
        )
    if _no_stop(cfg):
        problems.append(
            "no stop criterion: set stop.env_steps, stop.iterations, stop.episode_return_mean or stop.wall_s"
        )
    if lrn.lr_anneal and cfg.stop.env_steps is None:
        problems.append("learner.lr_anneal=true needs stop.env_steps to anneal over")
    return (
        problems
        + _fleet_problems(cfg)
        + _policy_group_problems(cfg)
        + _central_critic_problems(cfg)
        + _env_parallel_problems(cfg)
    )


def _sharded_language_problems(cfg: RelayConfig) -> list[str]:
    """What a causal LM sharded over learner.num_learners > 1 ranks (FSDP2) needs, and what it
    does not do yet (each a line naming the setting to change)."""
    lrn, gen, n = cfg.learner, cfg.generation, cfg.learner.num_learners
    if n == 1:
        return []
    if lrn.parallel == "ddp":
        return [f"learner.parallel=ddp: a causal LM is sharded (fsdp) over learner.num_learners={n} ranks"]
    problems = []
    if cfg.rollout.num_workers == 0:
        problems.append(f"learner.num_learners={n} ranks are Ray actors: set rollout.num_workers >= 1")
    if cfg.prompts.batch_size % n:
        problems.append(
            f"prompts.batch_size={cfg.prompts.batch_size} must be a multiple of learner.num_learners={n} "
            "(each rank samples and trains whole groups)"
        )
    later = [
        (gen.backend not in ("relay", "eager"), f"generation.backend={gen.backend}"),
    ]
    problems += [
        f"{what} with learner.num_learners={n} (FSDP2) is not built yet: set learner.num_learners=1"
        for bad, what in later
        if bad
    ]
    return problems


def _env_parallel_problems(cfg: RelayConfig) -> list[str]:
    problems = []
    if cfg.learner.parallel == "fsdp":
        problems.append(
            "learner.parallel=fsdp shards causal LMs; env policies train as ddp replicas (or auto)"
        )
    if cfg.checkpoint.format == "sharded":
        problems.append(
            "checkpoint.format=sharded is a causal LM learner's; an env run's checkpoints are whole"
        )
    return problems


def _language_problems(cfg: RelayConfig) -> list[str]:
    """Rules of a causal-LM run (its env, buffer and segment settings are unused)."""
    problems = _language_input_problems(cfg)
    lrn, gen = cfg.learner, cfg.generation
    if lrn.group_size < 2:
        problems.append(f"model.kind=causal_lm needs learner.group_size >= 2 (got {lrn.group_size})")
    problems += _sharded_language_problems(cfg)
    if _no_stop(cfg):
        problems.append(
            "no stop criterion: set stop.iterations, stop.env_steps (completion tokens), stop.wall_s or "
            "stop.episode_return_mean"
        )
    if cfg.eval.every_iterations and cfg.prompts.eval is None:
        problems.append("eval.every_iterations > 0 needs prompts.eval for a causal_lm run")
    if cfg.eval.video_every:
        problems.append("eval.video_every: a causal_lm run has no frames to film (set it to 0)")
    lora = cfg.model.lora is not None
    return problems + _generation_problems(gen, cfg.rollout.num_workers, lora) + _eval_problems(cfg)


def _preference_problems(cfg: RelayConfig) -> list[str]:
    """Rules of a reward model's run (model.kind=reward_model): a model folder and a pairs file;
    its learner trains in the driver's process on one device (its env, buffer, segment,
    generation and reward settings are unused)."""
    problems: list[str] = []
    kind = "model.kind=reward_model"
    if cfg.model.path is None:
        problems.append(f"{kind} needs model.path (a local Hugging Face folder)")
    if cfg.prompts.train is None:
        problems.append(f"{kind} needs prompts.train (a JSONL or Parquet file of preference pairs)")
    if cfg.prompts.rewards:
        problems.append(f"{kind} learns its reward from preference pairs: set prompts.rewards=[]")
    if cfg.rollout.num_workers:
        problems.append(
            f"{kind} has no rollout workers (its learner trains in the driver's process): set "
            "rollout.num_workers=0"
        )
    if cfg.learner.num_learners != 1:
        problems.append(f"{kind} trains on one learner device for now: set learner.num_learners=1")
    if _no_stop(cfg):
        problems.append(
            "no stop criterion: set stop.iterations, stop.env_steps (trained tokens), stop.wall_s or "
            "stop.episode_return_mean (train pair accuracy)"
        )
    if cfg.eval.every_iterations and cfg.prompts.eval is None:
        problems.append(f"eval.every_iterations > 0 needs prompts.eval (held-out pairs) for a {kind} run")
    if cfg.eval.video_every:
        problems.append(f"eval.video_every: a {kind} run has no frames to film (set it to 0)")
    return problems + _eval_problems(cfg)


def _generation_problems(gen: GenerationConfig, num_workers: int, lora: bool) -> list[str]:
    """Where a language run's completions are sampled, and how stale they may be."""
    problems: list[str] = []
    if gen.max_staleness and gen.placement != "workers":
        problems.append(
            "generation.max_staleness=1 overlaps generator actors with the update: it needs "
            "generation.placement=workers"
        )
    if gen.placement == "workers" and num_workers < 1:
        problems.append("generation.placement=workers needs rollout.num_workers >= 1 generator actors")
    if gen.backend == "vllm":
        for wrong, why in (
            (gen.placement != "learner", "runs in the learner's process: set generation.placement=learner"),
            (gen.compile, "captures its own graphs: set generation.compile=false"),
            (gen.noise == "cpu", "draws its own noise on the device: set generation.noise=device"),
            (lora, "loads whole weights, not LoRA adapters: set model.lora=null or generation.backend=relay"),
        ):
            if wrong:
                problems.append(f"generation.backend=vllm {why}")
    return problems


def _language_input_problems(cfg: RelayConfig) -> list[str]:
    """What a language run reads: a model folder, prompts, rewards (weighted one each)."""
    problems: list[str] = []
    pr = cfg.prompts
    if cfg.model.path is None:
        problems.append("model.kind=causal_lm needs model.path (a local Hugging Face folder)")
    if pr.train is None:
        problems.append("model.kind=causal_lm needs prompts.train (a JSONL or Parquet file)")
    if not pr.rewards:
        problems.append("model.kind=causal_lm needs prompts.rewards (at least one reward)")
    if pr.reward_weights is not None and len(pr.reward_weights) != len(pr.rewards):
        problems.append(
            f"prompts.reward_weights has {len(pr.reward_weights)} weights for {len(pr.rewards)} rewards"
        )
    return problems


def _central_critic_problems(cfg: RelayConfig) -> list[str]:
    if not cfg.multi_agent.central_critic:
        return []
    if cfg.model.shared_trunk:
        return [
            "multi_agent.central_critic: the value trunk reads the global state, which the policy must "
            "not: set model.shared_trunk=false"
        ]
    return []


def _policy_group_problems(cfg: RelayConfig) -> list[str]:
    ma = cfg.multi_agent
    if ma.policies is None:
        if ma.policy_mapping is not None:
            return [
                f"multi_agent.policy_mapping={ma.policy_mapping} needs the groups it names in "
                "multi_agent.policies"
            ]
        return []
    problems = []
    patterned = [name for name, patterns in ma.policies.items() if patterns]
    if ma.policy_mapping is not None and patterned:
        problems.append(
            f"multi_agent.policy_mapping chooses the groups: give multi_agent.policies.{patterned[0]} no "
            "patterns ([])"
        )
    elif ma.policy_mapping is None and len(patterned) < len(ma.policies):
        empty = next(name for name in ma.policies if name not in patterned)
        problems.append(
            f"multi_agent.policies.{empty} has no agent patterns: name some, or choose groups in code "
            "with multi_agent.policy_mapping=module:fn"
        )
    if ma.agents != ["*"]:
        problems.append(
            "multi_agent.agents and multi_agent.policies both choose agents: name them in policies"
        )
    if ma.self_play is not None:
        problems.append(
            "multi_agent.self_play plays one seat of a turn-based game: not with multi_agent.policies"
        )
    if cfg.learner.num_learners > 1:
        problems.append(
            f"learner.num_learners={cfg.learner.num_learners}: policy groups train on one learner actor"
        )
    return problems


def _fleet_problems(cfg: RelayConfig) -> list[str]:
    problems: list[str] = []
    ro = cfg.rollout
    if ro.autoscale and ro.mode != "async":
        problems.append(
            "rollout.autoscale=true needs rollout.mode=async (a sync round is one segment per worker)"
        )
    if ro.autoscale and not ro.min_workers <= ro.num_workers <= ro.max_workers:
        problems.append(
            f"rollout.num_workers={ro.num_workers} must lie in [rollout.min_workers={ro.min_workers}, "
            f"rollout.max_workers={ro.max_workers}]"
        )
    return problems


# ---- reading YAML safely ------------------------------------------------------------------------
def _check_expanded_size(data: Any, where: str) -> None:
    """Refuse documents that expand past MAX_CONFIG_NODES values (aliases count every time they
    are used: a 400-byte alias bomb expands to billions). Stops walking at the cap, so it is cheap."""
    budget = MAX_CONFIG_NODES
    stack = [(data, 0)]
    while stack:
        node, depth = stack.pop()
        budget -= 1
        if budget < 0:
            raise ConfigError(f"{where}: expands to more than {MAX_CONFIG_NODES} values (YAML aliases?)")
        if depth > MAX_CONFIG_DEPTH:
            raise ConfigError(f"{where}: nested more than {MAX_CONFIG_DEPTH} levels deep")
        if isinstance(node, dict):
            stack.extend((child, depth + 1) for child in [*node.keys(), *node.values()])
        elif isinstance(node, list | tuple):
            stack.extend((child, depth + 1) for child in node)


def parse_yaml(text: str, where: str) -> Any:
    """yaml.safe_load with one-line errors and the expansion cap."""
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as err:
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise ConfigError(f"{where}: not valid YAML ({first})") from None
    except RecursionError:
        raise ConfigError(f"{where}: nested too deeply") from None
    except ValueError as err:  # an integer past Python's 4,300-digit conversion limit
        raise ConfigError(f"{where}: not a usable value ({' '.join(str(err).split())[:120]})") from None
    _check_expanded_size(data, where)
    return data


def _parse_override(item: str) -> tuple[list[str], Any]:
    if "=" not in item:
        raise ConfigError(f"--set {item!r}: expected key.path=value")
    key, raw = item.split("=", 1)
    path = [p for p in key.strip().split(".") if p]
    if not path:
        raise ConfigError(f"--set {item!r}: empty key")
    # YAML parsing turns "3e-4" into a float, "[64, 64]" into a list, "null" into None.
    return path, parse_yaml(raw, f"--set {key.strip()}") if raw.strip() else ""


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Set each `a.b.c=value` leaf in a nested dict (values parsed as YAML)."""
    for item in overrides:
        path, value = _parse_override(item)
        node = data
        for part in path[:-1]:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise ConfigError(f"--set {item!r}: {part!r} is not a section")
            node = child
        node[path[-1]] = value
    return data


def _format_validation_error(err: ValidationError, where: str = "") -> str:
    parts = []
    for e in err.errors():
        loc = ".".join(str(p) for p in ((where,) if where else ()) + tuple(e["loc"]))
        msg = e["msg"].removeprefix("Value error, ")
        if e["type"] == "extra_forbidden":
            msg = "unknown key (check the spelling)"
        elif e["type"] == "finite_number":
            msg = "must be a finite number (not nan or inf)"
        parts.append(f"{loc}: {msg}" if loc else msg)
    return "invalid config: " + "; ".join(p.replace("\n", " ") for p in parts)


def build_config(data: Any, overrides: list[str] | None = None) -> RelayConfig:
    """Validate a nested dict plus overrides; raises ConfigError with one line naming every problem."""
    if not isinstance(data, dict):
        raise ConfigError("invalid config: expected a mapping of sections at the top level")
    data = apply_overrides(copy.deepcopy(data), overrides or [])
    _check_expanded_size(data, "config")
    try:
        return RelayConfig.model_validate(data)
    except ValidationError as err:
        raise ConfigError(_format_validation_error(err)) from None


def load_config(path: str | Path | None, overrides: list[str] | None = None) -> RelayConfig:
    """Read a YAML config (None: all defaults) and apply `--set` overrides."""
    data: Any = {}
    if path is not None:
        p = Path(path)
        if not p.is_file():
            raise ConfigError(f"config file not found: {p}")
        with p.open("rb") as f:  # at most the cap is ever read, whatever the file's size
            raw = f.read(MAX_CONFIG_BYTES + 1)
        if len(raw) > MAX_CONFIG_BYTES:
            raise ConfigError(f"{p}: larger than {MAX_CONFIG_BYTES} bytes; not a relay config")
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as err:
            raise ConfigError(f"{p}: not UTF-8 text (byte {err.start})") from None
        data = parse_yaml(text, str(p))
        if data is None:
            data = {}
        if not isinstance(data, dict):
            raise ConfigError(f"{p}: expected a mapping of sections at the top level")
    return build_config(data, overrides)


# A URI's password (`http://user:pw@host`), and leaves whose names say they hold a secret.
_URI_SECRET = re.compile(r"(?P<head>[A-Za-z][A-Za-z0-9+.-]*://[^/\s:@]*):(?P<secret>[^/\s@]*)@")
_SECRET_KEY = re.compile(r"(^|_)(password|passwd|secret|token|api_?key|access_?key)$", re.IGNORECASE)
REDACTED = "***"


def redact_text(text: str) -> str:
    """`text` with every URI password replaced by ***: for lines printed, logged or stored."""
    return _URI_SECRET.sub(lambda m: f"{m.group('head')}:{REDACTED}@", text)


def redact(data: Any, key: str = "") -> Any:
    """A config's data (or any JSON tree) with secrets replaced: URI passwords in every string,
    and the whole value of a leaf named like a secret (`api_key`, `token`, `password`...)."""
    if isinstance(data, dict):
        return {k: redact(v, str(k)) for k, v in data.items()}
    if isinstance(data, list):
        return [redact(v, key) for v in data]
    if isinstance(data, str):
        return REDACTED if data and _SECRET_KEY.search(key) else redact_text(data)
    return data


def config_data(cfg: RelayConfig) -> dict[str, Any]:
    """The resolved config as JSON data with its secrets redacted: what is written (config.yaml,
    checkpoints, exports) or sent (trackers) anywhere. The live config keeps them, in memory only."""
    return cast(dict[str, Any], redact(cfg.model_dump(mode="json")))


def dump_config(cfg: RelayConfig) -> str:
    """The resolved config as YAML (what `relay validate` prints and a run directory keeps), its
    secrets redacted."""
    return yaml.safe_dump(config_data(cfg), sort_keys=False)


def config_leaves(
    model: type[BaseModel] = RelayConfig,
    prefix: str = "",
    sections: Mapping[str, type[BaseModel]] | None = None,
) -> list[tuple[str, Any, str]]:
    """(dotted path, default, description) of every leaf, in declaration order; `sections` (dotted
    path -> the entry's class, e.g. "learner.grpo") adds the leaves of registry entries' sections
    after those of the section holding them. A leaf with no default has REQUIRED as its default."""
    out: list[tuple[str, Any, str]] = []
    for name, field in model.model_fields.items():
        ann = field.annotation
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            out += config_leaves(ann, f"{prefix}{name}.", sections)
            continue
        default = field.get_default(call_default_factory=True)
        out.append(
            (
                f"{prefix}{name}",
                REQUIRED if default is PydanticUndefined else default,
                field.description or "",
            )
        )
    for path, section in (sections or {}).items():
        if path.rpartition(".")[0] + "." == prefix:
            out += config_leaves(section, f"{path}.")
    return out


REQUIRED = "(required)"


def config_help(
    choices: dict[str, list[str]] | None = None, sections: Mapping[str, type[BaseModel]] | None = None
) -> str:
    """Every leaf with its default and description; `choices` adds registry names per leaf, and
    each entry section in `sections` is introduced by its class's first docstring line."""
    lines = []
    introduced: set[str] = set()
    for path, default, description in config_leaves(sections=sections):
        section = next((s for s in (sections or {}) if path.startswith(f"{s}.")), None)
        if section is not None and section not in introduced:
            introduced.add(section)
            doc = ((sections or {})[section].__doc__ or "").strip().splitlines()
            lines.append(f"{section}:")
            lines.append(f"    {doc[0] if doc else ''}")
        extra = f" Choices: {', '.join(choices[path])}." if choices and path in choices else ""
        lines.append(
            f"{path} = {yaml.safe_dump(default, default_flow_style=True).strip().removesuffix('...').strip()}"
        )
        lines.append(f"    {description}{extra}")
    return "\n".join(lines)


# Leaves whose `module:attr` values import and run the user's code.
CODE_LEAVES = ("env.id", "multi_agent.policy_mapping", "prompts.rewards")
# Reward registry entries written `name:argument` (rollout_workers/lm/rewards.py; a test keeps the two
# in step): any other `a:b` in prompts.rewards names the user's function `module:fn`.
REWARDS_WITH_ARGUMENT = ("regex", "length_at_most", "model")


def is_code_reward(spec: object) -> bool:
    """Whether a prompts.rewards entry names the user's code (`module:fn`)."""
    return isinstance(spec, str) and ":" in spec and spec.partition(":")[0] not in REWARDS_WITH_ARGUMENT


def is_code_value(leaf: str, value: object) -> bool:
    """Whether `value` at `leaf` names code (`module:attr`) rather than data."""
    if leaf == "prompts.rewards":
        values = value if isinstance(value, list | tuple) else [value]
        return any(is_code_reward(v) for v in values)
    return leaf in CODE_LEAVES and isinstance(value, str) and ":" in value


def code_settings(cfg: RelayConfig) -> list[tuple[str, str]]:
    """(leaf, value) of each setting that imports and runs the user's code: a `module:factory`
    env.id, a `module:fn` multi_agent.policy_mapping. Read from a run or sweep folder these are
    data; a resume runs them only when the user names each again with --set."""
    leaves = (("env.id", cfg.env.id), ("multi_agent.policy_mapping", cfg.multi_agent.policy_mapping))
    out = [(leaf, value) for leaf, value in leaves if value is not None and is_code_value(leaf, value)]
    if is_code_value("prompts.rewards", cfg.prompts.rewards):
        out.append(("prompts.rewards", "[" + ",".join(cfg.prompts.rewards) + "]"))
    return out


def unconfirmed_code(cfg: RelayConfig, confirmed: set[str], source: str, command: str) -> str | None:
    """The one-line refusal when code settings read from `source` (a stored config) are not all in
    `confirmed` (leaves the user named again on the command line), else None. Every missing one is
    named at once: a user naming them one resume at a time would be sent back again."""
    missing = [(leaf, value) for leaf, value in code_settings(cfg) if leaf not in confirmed]
    if not missing:
        return None
    names = ", ".join(f"{leaf}={value}" for leaf, value in missing)
    sets = " ".join(f"--set {leaf}={value}" for leaf, value in missing)
    return (
        f"{source} names {names}, which imports and runs code; run it only after naming it "
        f"yourself: {command} {sets}"
    )


def _language_learner(learner: dict[str, Any]) -> dict[str, Any]:
    """A language run's learner section: TRL's GRPO defaults under what the user set (a causal
    LM's settings differ from an env policy's by orders of magnitude: a 3e-4 learning rate wrecks
    a pretrained model in a few steps), and learner.grpo's moved keys in their sections now."""
    out = {**LANGUAGE_LEARNER_DEFAULTS, **learner}
    grpo = out.get("grpo")
    if not isinstance(grpo, dict) or not set(grpo) & set(LANGUAGE_MOVED_KEYS):
        return out
    grpo = dict(grpo)
    for key in [k for k in grpo if k in LANGUAGE_MOVED_KEYS]:
        section = LANGUAGE_MOVED_KEYS[key]
        target = out.get(section)
        target = dict(target) if isinstance(target, dict) else {}
        if key in target:
            raise ValueError(
                f"learner.grpo.{key} is learner.{section}.{key} now: set it once, as learner.{section}.{key}"
            )
        target[key] = grpo.pop(key)
        out[section] = target
    out["grpo"] = grpo or None
    return out


# The learner.grpo section every env GRPO run's config.yaml stated until 2026-12, when the env
# GRPO entry declared the language update's settings (and read none of them). Such a section is
# dropped as it loads (it never changed anything); one that sets another value is refused by the
# env family's sections, naming it, rather than kept doing nothing.
ENV_GRPO_STATED: dict[str, Any] = {
    "clip_ratio_high": None,
    "loss_agg": "token_mean",
    "scale_rewards": "group",
    "kl_estimator": "k3",
    "drop_equal_groups": False,
    "refill_rounds": 0,
    "micro_batch_tokens": 4096,
    "logprob_chunk": 128,
    "importance_correction": "token",
    "importance_cap": 2.0,
}


def _env_learner(learner: dict[str, Any]) -> dict[str, Any]:
    """An env run's learner section, the inert learner.grpo of its earlier config.yaml dropped."""
    grpo = learner.get("grpo")
    if isinstance(grpo, dict) and grpo and all(ENV_GRPO_STATED.get(k, ...) == v for k, v in grpo.items()):
        return {k: v for k, v in learner.items() if k != "grpo"}
    return learner


@dataclass(frozen=True)
class ConfigFamily:
    """A family's part of the config contract: its learner section as the user's becomes it
    (defaults, moved keys), its cross-field rules, the words its progress lines use for
    env_steps and the episode return (a language run counts tokens and scores rewards), and other
    sections' defaults where the family's differ."""

    learner: Callable[[dict[str, Any]], dict[str, Any]]
    problems: Callable[[RelayConfig], list[str]]
    steps_word: str = "steps"
    steps_phrase: str = "env steps"
    return_word: str = "return"
    # other sections' defaults where they differ for the family (under what the user set)
    defaults: dict[str, dict[str, Any]] = dataclasses.field(default_factory=dict)


CONFIG_FAMILIES: dict[str, ConfigFamily] = {
    ENV_FAMILY: ConfigFamily(_env_learner, _cross_field_problems),
    LANGUAGE_FAMILY: ConfigFamily(_language_learner, _language_problems, "tokens", "tokens", "reward"),
    PREFERENCE_FAMILY: ConfigFamily(
        lambda learner: {**PREFERENCE_LEARNER_DEFAULTS, **learner},
        _preference_problems,
        "tokens",
        "tokens",
        "pair accuracy",
        {"rollout": {"num_workers": 0}},  # its learner trains in the driver's process
    ),
}
