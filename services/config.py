"""The one config model: YAML in, `--set a.b=v` overrides, cross-field rules checked up front.

Every field has a default and a description (the description is what `relay validate --help-config`
prints). Derived values are properties, never fields rewritten after parsing.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator


class ConfigError(ValueError):
    """A config that cannot run; the message is one line a person can act on."""


class _Section(BaseModel):
    # A typo must never be silently ignored.
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class EnvConfig(_Section):
    id: str = Field("CartPole-v1", description="Gymnasium env id, or 'module:factory' for your own env.")
    num_envs: int = Field(8, ge=1, description="Envs per rollout worker (the N of a [T, N] segment).")
    vectorization: Literal["sync", "async"] = Field(
        "sync",
        description="SyncVectorEnv for cheap envs, AsyncVectorEnv (a process per env) for costly ones.",
    )
    seed: int = Field(
        0, ge=0, description="Run seed: env seeds, exploration noise and init all derive from it."
    )
    max_episode_steps: int | None = Field(
        None, ge=1, description="Override the env's time limit (episodes are truncated there)."
    )
    kwargs: dict[str, Any] = Field(default_factory=dict, description="Extra keyword arguments for gym.make.")


class RolloutConfig(_Section):
    num_workers: int = Field(
        2, ge=0, description="Rollout worker actors; 0 samples in the driver process (local mode)."
    )
    rollout_len: int = Field(128, ge=1, description="Steps per segment (the T of a [T, N] segment).")
    num_cpus_per_worker: float = Field(1.0, gt=0, description="CPUs Ray reserves for each rollout worker.")
    mode: Literal["sync", "async"] = Field(
        "sync",
        description="sync: every segment of an update comes from the current weights (lag 0); "
        "async: workers keep sampling while the learner updates.",
    )
    max_segments_in_flight: int = Field(
        1,
        ge=1,
        description="Async mode: sample calls outstanding per worker (bounds object-store use); "
        "the policy lag of a segment is at most this. 1 keeps PPO stable; more trades stability "
        "for throughput.",
    )
    max_restarts: int = Field(3, ge=0, description="How often Ray restarts a rollout worker that died.")


class LearnerConfig(_Section):
    algo: Literal["ppo", "grpo"] = Field("ppo", description="Update rule: PPO (actor-critic) or GRPO.")
    device: str = Field("auto", description="auto (npu, then cuda, then cpu), cpu, cuda[:i] or npu[:i].")
    num_learners: int = Field(
        1, ge=1, description="Data-parallel learner actors, one accelerator each (HCCL on npu, NCCL on cuda)."
    )
    npu_ids: list[int] = Field(
        default_factory=list,
        description="Accelerator ids the learner may use; empty lets Ray assign them (the normal case).",
    )
    ray_resources: dict[str, float] = Field(
        default_factory=dict,
        description="Extra Ray resources the learner actor asks for (e.g. {NPU: 1} to pin a node type).",
    )
    buffer_size: int = Field(
        4096, ge=1, description="Ring buffer capacity in env steps (a whole number of segments)."
    )
    batch_size: int = Field(512, ge=1, description="Minibatch size in env steps.")
    epochs: int = Field(4, ge=1, description="Passes over the update's data.")
    lr: float = Field(3e-4, gt=0, description="Adam learning rate.")
    lr_anneal: bool = Field(False, description="Anneal lr linearly to 0 over stop.env_steps.")
    gamma: float = Field(0.99, ge=0, le=1, description="Discount factor.")
    gae_lambda: float = Field(0.95, ge=0, le=1, description="GAE lambda.")
    clip_ratio: float = Field(0.2, gt=0, description="PPO/GRPO ratio clip epsilon.")
    value_coef: float = Field(0.5, ge=0, description="Value loss weight.")
    value_clip: float | None = Field(None, gt=0, description="Clip value updates to this range (None: off).")
    entropy_coef: float = Field(0.0, ge=0, description="Entropy bonus weight.")
    max_grad_norm: float = Field(0.5, gt=0, description="Global gradient-norm clip.")
    target_kl: float | None = Field(
        None, gt=0, description="Stop the update's epochs early once approx_kl exceeds 1.5x this."
    )
    normalize_advantages: bool = Field(True, description="Normalize advantages per minibatch (PPO).")
    grad_accum_steps: int = Field(1, ge=1, description="Micro-batches accumulated per optimizer step.")
    grad_checkpointing: bool = Field(False, description="Recompute the MLP trunk in backward to save memory.")
    use_amp: bool = Field(False, description="Autocast the forward/backward on the learner device.")
    amp_dtype: Literal["bfloat16", "float16"] = Field(
        "bfloat16", description="Autocast dtype; float16 adds a GradScaler on npu/cuda."
    )
    broadcast_interval: int = Field(1, ge=1, description="Publish new weights every this many updates.")
    group_size: int = Field(1, ge=1, description="GRPO: members per group sharing a prompt/start state.")
    kl_coef: float = Field(0.0, ge=0, description="GRPO: weight of the KL penalty to the reference policy.")
    ref_update_interval: int = Field(
        0, ge=0, description="GRPO: refresh the reference policy every this many updates (0: never)."
    )
    group_eps: float = Field(1e-6, gt=0, description="GRPO: epsilon in (r - mean) / (std + eps).")


class TransformerConfig(_Section):
    vocab_size: int | None = Field(
        None,
        ge=1,
        description="Token ids the policy reads are 0..vocab_size-1 (-1 marks an empty slot); "
        "None: the number of discrete actions (the policy reads the vocabulary it writes).",
    )
    d_model: int = Field(64, ge=4, description="Embedding width.")
    heads: int = Field(4, ge=1, description="Attention heads (must divide d_model).")
    layers: int = Field(2, ge=1, description="Transformer blocks.")
    ff_mult: int = Field(2, ge=1, description="Feed-forward width as a multiple of d_model.")


class ModelConfig(_Section):
    kind: Literal["mlp", "transformer"] = Field(
        "mlp",
        description="mlp: MLP trunks over the (normalized) observation; transformer: a tiny causal "
        "transformer over an observation of token ids (prompt + tokens emitted so far, -1 = empty).",
    )
    transformer: TransformerConfig = Field(
        default_factory=TransformerConfig, description="The token transformer (model.kind=transformer)."
    )
    hidden_sizes: list[int] = Field(default_factory=lambda: [64, 64], description="MLP layer widths.")
    activation: Literal["silu", "tanh", "relu"] = Field("tanh", description="MLP activation.")
    shared_trunk: bool = Field(False, description="One trunk for policy and value heads.")
    init_log_std: float = Field(0.0, description="Initial log-std of the Gaussian head (Box actions).")
    normalize_obs: bool = Field(True, description="Running observation normalizer (float32 statistics).")


class StopConfig(_Section):
    env_steps: int | None = Field(100_000, ge=1, description="Stop after this many valid env steps.")
    episode_return_mean: float | None = Field(
        None, description="Stop once the mean return of the last 20 episodes reaches this."
    )
    wall_s: float | None = Field(None, gt=0, description="Stop after this many seconds of training.")


class CheckpointConfig(_Section):
    interval: int = Field(10, ge=1, description="Write a checkpoint every this many iterations.")
    keep: int = Field(3, ge=1, description="Checkpoints kept (oldest removed first).")


class MetricsConfig(_Section):
    runs_dir: str = Field("runs", description="Folder holding run directories.")
    run_name: str | None = Field(None, description="Run directory name (default: <env>-<algo>-<time>).")
    tensorboard: bool = Field(True, description="Also write TensorBoard event files under events/.")
    progress: Literal["auto", "bar", "lines", "none"] = Field(
        "auto", description="Terminal progress: a bar on a TTY, plain lines otherwise."
    )


class RelayConfig(_Section):
    env: EnvConfig = Field(default_factory=EnvConfig, description="The environment.")
    rollout: RolloutConfig = Field(default_factory=RolloutConfig, description="Rollout workers.")
    learner: LearnerConfig = Field(default_factory=LearnerConfig, description="The learner.")
    model: ModelConfig = Field(default_factory=ModelConfig, description="The policy network.")
    stop: StopConfig = Field(default_factory=StopConfig, description="Stop criteria (first one met wins).")
    checkpoint: CheckpointConfig = Field(default_factory=CheckpointConfig, description="Checkpoints.")
    metrics: MetricsConfig = Field(default_factory=MetricsConfig, description="Metrics and progress.")

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
        problems = _cross_field_problems(self)
        if problems:
            raise ValueError("; ".join(problems))
        return self


def _round_desc(cfg: RelayConfig) -> str:
    if cfg.rollout.num_workers == 0:
        return "1 segment in local mode (rollout.num_workers=0)"
    return f"rollout.num_workers={cfg.rollout.num_workers}"


def _cross_field_problems(cfg: RelayConfig) -> list[str]:
    """Every cross-field rule that fails, each naming fields and numbers."""
    problems: list[str] = []
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
    if lrn.num_learners > 1 and (cfg.rollout.num_workers == 0 or cfg.rollout.num_workers % lrn.num_learners):
        problems.append(
            f"learner.num_learners={lrn.num_learners} must divide "
            f"rollout.num_workers={cfg.rollout.num_workers} (each learner takes the same share of a round)"
        )
    if cfg.env.num_envs % lrn.group_size:
        problems.append(
            f"env.num_envs={cfg.env.num_envs} is not divisible by learner.group_size={lrn.group_size}"
        )
    if lrn.algo == "grpo" and lrn.group_size < 2:
        problems.append(f"learner.algo=grpo needs learner.group_size >= 2 (got {lrn.group_size})")
    if cfg.stop.env_steps is None and cfg.stop.episode_return_mean is None and cfg.stop.wall_s is None:
        problems.append("no stop criterion: set stop.env_steps, stop.episode_return_mean or stop.wall_s")
    if lrn.lr_anneal and cfg.stop.env_steps is None:
        problems.append("learner.lr_anneal=true needs stop.env_steps to anneal over")
    return problems + _model_problems(cfg.model)


def _model_problems(model: ModelConfig) -> list[str]:
    if model.kind != "transformer":
        return []
    problems = []
    tc = model.transformer
    if tc.d_model % tc.heads:
        problems.append(
            f"model.transformer.d_model={tc.d_model} is not divisible by model.transformer.heads={tc.heads}"
        )
    if model.normalize_obs:
        problems.append("model.kind=transformer reads token ids: set model.normalize_obs=false")
    return problems


def _parse_override(item: str) -> tuple[list[str], Any]:
    if "=" not in item:
        raise ConfigError(f"--set {item!r}: expected key.path=value")
    key, raw = item.split("=", 1)
    path = [p for p in key.strip().split(".") if p]
    if not path:
        raise ConfigError(f"--set {item!r}: empty key")
    # YAML parsing turns "3e-4" into a float, "[64, 64]" into a list, "null" into None.
    return path, yaml.safe_load(raw) if raw.strip() else ""


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


def _format_validation_error(err: ValidationError) -> str:
    parts = []
    for e in err.errors():
        loc = ".".join(str(p) for p in e["loc"])
        msg = e["msg"].removeprefix("Value error, ")
        if e["type"] == "extra_forbidden":
            msg = "unknown key (check the spelling)"
        parts.append(f"{loc}: {msg}" if loc else msg)
    return "invalid config: " + "; ".join(parts)


def build_config(data: dict[str, Any], overrides: list[str] | None = None) -> RelayConfig:
    """Validate a nested dict plus overrides; raises ConfigError with one line naming every problem."""
    data = apply_overrides(copy.deepcopy(data), overrides or [])
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
        try:
            data = yaml.safe_load(p.read_text()) or {}
        except yaml.YAMLError as err:
            raise ConfigError(f"{p}: not valid YAML ({str(err).splitlines()[0]})") from None
        if not isinstance(data, dict):
            raise ConfigError(f"{p}: expected a mapping of sections at the top level")
    return build_config(data, overrides)


def dump_config(cfg: RelayConfig) -> str:
    """The resolved config as YAML (what `relay validate` prints and a run directory keeps)."""
    return yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False)
