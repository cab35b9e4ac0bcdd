"""Metric keys: what the driver writes, the sinks export and the dashboards chart.

The keys every run may write are RUN_METRICS, drawn by RUN_CHARTS. A registry entry that adds its
own keys (an algorithm, a model kind, a recurrent core) declares them beside its code as a
`MetricKeys`, with the charts that draw them; `services/runs/metric_keys.py` assembles the run-wide
keys and every entry's into one `MetricCatalog`, the catalog the sinks, sweeps and dashboards read.
Every `metrics.jsonl` line carries catalog keys (an entry's only where that entry runs).
TensorBoard and Prometheus (`ray_relay_<key>`) export exactly these keys; the learner dashboard
and the Grafana dashboard draw the catalog's charts, and a test keeps Grafana in step.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..contracts.segment import ENV_FAULT_KINDS

# Reward functions a language run may name (prompts.rewards), and how they fail.
MAX_REWARDS = 32
REWARD_FAULT_KINDS: tuple[str, ...] = ("raised", "timeout", "nonfinite", "length")

RUN_METRICS: dict[str, str] = {
    # the run (driver)
    "iteration": "learner iterations (updates) so far",
    "env_steps": "valid (unmasked) env steps across all workers",
    "wall_s": "seconds from the run's first env step",
    "startup_s": "seconds from the command to the first env step (first line only)",
    "episodes": "finished episodes",
    "episode_return_mean": "mean return of the last 20 finished episodes (null before any)",
    "episode_return_min": "min return of the last 20 episodes",
    "episode_return_max": "max return of the last 20 episodes",
    "episode_len_mean": "mean length of the last 20 episodes",
    # episode statistics (contracts.segment.Segment.episode_stats): the mean of each one's last 100
    "team_return_mean": "multi-agent: mean over finished env episodes of the sum of every agent's return",
    "win_rate_pool": "self-play: the learning seat's score (win 1, draw 0.5, loss 0) against snapshots",
    "win_rate_random": "self-play: the learning seat's score against a uniformly random player",
    "env_steps_per_s": "env_steps / wall_s",
    "worker_restarts": "rollout workers Ray restarted",
    "stuck_workers": "rollout workers killed (and restarted) for owing a segment past "
    "rollout.segment_timeout_s",
    "learner_restarts": "learners recreated from the newest checkpoint",
    "lost_segments": "segments whose worker died before the learner fetched them",
    "rejected_segments": "segments the learner refused (wrong shape or dtype, non-finite values)",
    "amp_skipped_steps": "optimizer steps skipped on non-finite gradients",
    "env_faults": "env faults: a step raised or was NaN/inf (lost), a mask allowed nothing, an "
    "agent went unacted",
    **{f"env_faults_{k}": f"env faults of kind {k}" for k in ENV_FAULT_KINDS},
    # the update (learner)
    "policy_loss": "clipped surrogate loss",
    "entropy": "policy entropy",
    "approx_kl": "KL(old || new), k3 estimator",
    "kl_ref": "KL to the frozen reference policy (GRPO; a language run with learner.kl_coef > 0)",
    "clip_fraction": "fraction of samples whose ratio left the clip range",
    "grad_norm": "global gradient norm before clipping",
    "lr": "learning rate of the update",
    "learner_samples_per_s": "samples the update processed per second",
    "update_s": "seconds the learner updated since the previous line",
    "wait_s": "seconds the learner waited for segments since the previous line",
    "ingest_s": "seconds the learner copied segments into its ring buffer since the previous line",
    "publish_s": "seconds the learner published weights since the previous line",
    "learner_busy": "fraction of the wall time since the previous line the learner computed "
    "(ingest + update + publish)",
    "num_workers": "live rollout workers",
    "epochs_run": "epochs the update ran (target_kl may stop it early)",
    "weights_version": "version of the newest published weights",
    "policy_lag_mean": "mean versions between a segment's weights and the learner's",
    "buffer_fill": "fraction of ring-buffer slots holding a segment",
    "buffer_bytes": "bytes of the ring buffer on the learner's device (observations in their own dtype)",
    "segment_bytes": "bytes of one segment's arrays (what one sample call sends through the object store)",
    "device": "the learner's device",
    "device_memory_bytes": "device memory allocated",
    "device_memory_peak_bytes": "peak device memory allocated",
    "parameters": "trainable parameters",
    "learner_state_bytes": "bytes the learner keeps on its device",
    "host_memory_peak_bytes": "peak resident memory of the learner process",
    "learner_rss_bytes": "resident memory of the learner process now",
    "learner_heap_in_use_bytes": "bytes the learner process has allocated and not freed (glibc, every arena; "
    "read at most every 10 s): growth here is a leak",
    "learner_heap_free_bytes": "freed bytes glibc keeps in the learner process for reuse (a trim once a "
    "minute returns their pages): growth here is the allocator's, bounded by the largest working set",
    "driver_rss_bytes": "resident memory of the driver process now",
    "driver_heap_in_use_bytes": "bytes the driver has allocated and not freed (glibc; a leak grows here)",
    "driver_heap_free_bytes": "freed bytes glibc keeps in the driver for reuse (the allocator's part)",
    "rollout_rss_bytes": "resident memory of the largest rollout worker process on the driver's node",
    "precision": "what the learner computes in: float32, bfloat16 or float16 autocast, +channels_last "
    "(learner.use_amp, learner.channels_last; auto decides by the device's bf16 units)",
    "compiles": "graphs torch.compile has compiled since the learner started: the update's "
    "(learner.compile) or a language run's decoding step (generation.compile); flat after the first "
    "round: fixed shapes never recompile",
    "graph_breaks": "graph breaks dynamo took in the compiled update (learner.compile)",
    # the learner's device, where it can tell (learner/device_health.py)
    "device_utilization": "fraction of time the device computed (NVML, pyACL's AI Core use; not "
    "reported on the CPU, where torch's threads fill every core they may: learner_busy says it)",
    "device_memory_used_bytes": "device memory in use (NVML, torch_npu; on the CPU the learner's RSS)",
    "device_memory_total_bytes": "device memory in all (on the CPU the host's)",
    "device_temperature_c": "device temperature in degrees C (NVML, npu-smi; the hottest CPU sensor)",
    "device_power_w": "device power draw in watts (NVML, npu-smi)",
    # tracking and sweeps
    "tracking_errors": "failed calls to the tracking servers (metrics.mlflow, metrics.wandb) and lines "
    "dropped while one was away; training never waits for them",
    "pbt_exploits": "times a PBT sweep replaced this trial's learner with a better trial's checkpoint",
    # evaluation during training (eval.every_iterations; on the line where one finished)
    "eval_return_mean": "mean return of the evaluation's episodes (the policy's mode, unless "
    "eval.deterministic=false)",
    "eval_return_std": "std of the evaluation's returns",
    "eval_return_min": "min return of the evaluation's episodes",
    "eval_return_max": "max return of the evaluation's episodes",
    "eval_len_mean": "mean length of the evaluation's episodes",
    "eval_episodes": "episodes the evaluation played",
    "eval_iteration": "the iteration whose weights the evaluation played",
    "eval_weights_version": "the weights version the evaluation played",
    "eval_s": "seconds the evaluation took (on its own actor or thread)",
}

# Policy groups (multi_agent.policies): each group's mean episode return (over its agents'
# episodes) is the episode statistic "policy_return_mean/<group>", and each group's own values of
# POLICY_KEYS ride on the line as "policy/<group>/<key>" (the plain keys hold the groups' means).
GROUP_RETURN = "policy_return_mean"
POLICY_RETURN_PREFIX = GROUP_RETURN + "/"
POLICY_PREFIX = "policy/"
POLICY_KEYS: tuple[str, ...] = (
    "policy_loss",
    "value_loss",
    "entropy",
    "approx_kl",
    "clip_fraction",
    "explained_variance",
    "grad_norm",
    "weights_version",
    "policy_lag_mean",
    "learner_samples_per_s",
    "parameters",
    "eval_return_mean",  # evaluation during training: each group's in its scene
)

# Episode statistics whose names carry an id: "agent_return_mean/<agent>" (each agent's mean
# return), "policy_return_mean/<group>".
STAT_PREFIXES: tuple[str, ...] = ("agent_return_mean/", POLICY_RETURN_PREFIX)


def stat_means(stats: dict[str, list[float]]) -> dict[str, float]:
    """Each episode statistic's mean over its window (names in RUN_METRICS or under STAT_PREFIXES)."""
    return {
        name: float(sum(values) / len(values))
        for name, values in sorted(stats.items())
        if values and (name in RUN_METRICS or name.startswith(STAT_PREFIXES))
    }


# What DESIGN.md promises on every line (algorithm-specific keys are added by each algorithm).
REQUIRED_KEYS: tuple[str, ...] = (
    "iteration",
    "env_steps",
    "wall_s",
    "episodes",
    "episode_return_mean",
    "episode_len_mean",
    "env_steps_per_s",
    "learner_samples_per_s",
    "policy_loss",
    "entropy",
    "approx_kl",
    "clip_fraction",
    "grad_norm",
    "lr",
    "weights_version",
    "policy_lag_mean",
    "buffer_fill",
    "device",
    "device_memory_bytes",
    "worker_restarts",
    "rejected_segments",
    "amp_skipped_steps",
    "env_faults",
    "learner_busy",
    "num_workers",
)

# Seconds by phase behind learner_busy, in the order a round goes through them.
PHASES: tuple[str, ...] = ("wait_s", "ingest_s", "update_s", "publish_s")
# learner_busy at or above this: the learner is the bottleneck ("learner-bound"), else the samplers.
LEARNER_BOUND = 0.7


def bottleneck(learner_busy: float) -> str:
    return "learner-bound" if learner_busy >= LEARNER_BOUND else "sampler-bound"


# What a dashboard draws: {"id", "title", "keys"} plus optional "band" (min/max keys), "unit",
# "smooth" (a moving mean over that many lines), "optional" (drawn only where the run wrote its
# first key) and "per_policy" (one line per policy group).
Chart = dict[str, Any]

RUN_CHARTS: list[Chart] = [
    {
        "id": "return",
        "title": "Episode return (mean of last 20, min–max band)",
        "keys": ["episode_return_mean"],
        "band": ["episode_return_min", "episode_return_max"],
    },
    {
        "id": "eval",
        "title": "Evaluation return (mean, min–max band) beside the training return",
        "keys": ["eval_return_mean", "episode_return_mean"],
        "band": ["eval_return_min", "eval_return_max"],
        "optional": True,
    },
    {"id": "length", "title": "Episode length", "keys": ["episode_len_mean"]},
    {"id": "loss", "title": "Policy loss", "keys": ["policy_loss"]},
    {"id": "entropy", "title": "Entropy", "keys": ["entropy"]},
    {"id": "kl", "title": "Approx KL (k3)", "keys": ["approx_kl"]},
    {"id": "clip", "title": "Clip fraction", "keys": ["clip_fraction"]},
    {"id": "grad", "title": "Grad norm", "keys": ["grad_norm"]},
    {"id": "lr", "title": "Learning rate", "keys": ["lr"]},
    {
        "id": "speed",
        "title": "Env steps/s and learner samples/s (mean of the last 10 iterations)",
        "keys": ["env_steps_per_s", "learner_samples_per_s"],
        "smooth": 10,
    },
    {"id": "lag", "title": "Policy lag and weights version", "keys": ["policy_lag_mean", "weights_version"]},
    {"id": "buffer", "title": "Buffer fill", "keys": ["buffer_fill"]},
    {
        "id": "busy",
        "title": "Learner busy and device utilization (fractions of wall time)",
        "keys": ["learner_busy", "device_utilization"],
    },
    {
        "id": "device_health",
        "title": "Device temperature (C) and power (W)",
        "keys": ["device_temperature_c", "device_power_w"],
        "optional": True,
    },
    {
        "id": "phases",
        "title": "Learner seconds by phase (wait, ingest, update, publish)",
        "keys": list(PHASES),
    },
    {"id": "workers", "title": "Rollout workers", "keys": ["num_workers"]},
    {
        "id": "memory",
        "title": "Device memory (allocated / peak by torch, used / total by the device)",
        "unit": "bytes",
        "keys": [
            "device_memory_bytes",
            "device_memory_peak_bytes",
            "device_memory_used_bytes",
            "device_memory_total_bytes",
        ],
    },
    {
        "id": "host_memory",
        "title": "Host memory by process (learner, driver, largest rollout worker; the learner's "
        "and the driver's heap in use and freed-but-kept)",
        "unit": "bytes",
        "keys": [
            "learner_rss_bytes",
            "driver_rss_bytes",
            "rollout_rss_bytes",
            "learner_heap_in_use_bytes",
            "learner_heap_free_bytes",
            "driver_heap_in_use_bytes",
            "driver_heap_free_bytes",
        ],
    },
    {
        "id": "faults",
        "title": "AMP skipped steps, worker restarts, rejected segments",
        "keys": ["amp_skipped_steps", "worker_restarts", "rejected_segments"],
    },
    {
        "id": "env_faults",
        "title": "Env faults (raised, non-finite observation or reward, empty mask, unacted agent)",
        "keys": ["env_faults", *(f"env_faults_{k}" for k in ENV_FAULT_KINDS)],
    },
    {
        "id": "multi_agent",
        "title": "Multi-agent: team return (sum over agents); self-play score against the pool and a "
        "random player",
        "keys": ["team_return_mean", "win_rate_pool", "win_rate_random"],
        "optional": True,
    },
    {
        "id": "policy_groups",
        "title": "Policy groups: each group's mean return (over its agents' episodes)",
        "keys": ["policy_return_mean"],
        "per_policy": True,
        "optional": True,
    },
    {
        "id": "policy_groups_eval",
        "title": "Policy groups: each group's evaluation return (its agents, in the whole scene)",
        "keys": ["eval_return_mean"],
        "per_policy": True,
        "optional": True,
    },
    {
        "id": "policy_groups_learning",
        "title": "Policy groups: each group's entropy and approx KL",
        "keys": ["entropy", "approx_kl"],
        "per_policy": True,
        "optional": True,
    },
]

# A "per_policy" chart draws each of its keys once per policy group: "policy_return_mean/<group>"
# and "policy/<group>/<key>" on the lines; in Prometheus, the gauge "group_<key>" by its policy tag.
GROUP_GAUGE_PREFIX = "group_"


def chart_keys(chart: Chart) -> list[str]:
    """The keys a chart draws (its band's included); "group_<key>" for a per-policy chart's."""
    keys = [*chart["keys"], *chart.get("band", [])]
    return [GROUP_GAUGE_PREFIX + k for k in keys] if chart.get("per_policy") else keys


@dataclass(frozen=True)
class MetricKeys:
    """What one registry entry adds to the metrics lines of the runs it takes part in: its keys
    with their meaning, and the charts that draw them (keys of its own or RUN_METRICS)."""

    keys: Mapping[str, str]
    charts: tuple[Chart, ...] = field(default=())


RUN = MetricKeys(RUN_METRICS, tuple(RUN_CHARTS))


class MetricCatalog:
    """Every key a run may write: the run-wide ones, then each entry's, in the order given.

    ValueError where two parts give one key different meanings, two charts share an id, or a
    chart draws a key that neither its own part nor the run-wide keys declare: an entry can add
    keys, never change one another entry owns."""

    def __init__(self, entries: Iterable[MetricKeys], base: MetricKeys = RUN) -> None:
        self.keys: dict[str, str] = {}
        self.charts: list[Chart] = []
        for part in (base, *entries):
            for key, meaning in part.keys.items():
                if self.keys.setdefault(key, meaning) != meaning:
                    raise ValueError(f"metric {key!r} is declared twice with different meanings")
            known = {*base.keys, *part.keys}
            for chart in part.charts:
                same = [c for c in self.charts if c["id"] == chart["id"]]
                if same and same[0] != chart:
                    raise ValueError(f"chart {chart['id']!r} is declared twice, differently")
                # a per-policy chart draws group keys: POLICY_KEYS and each group's return
                drawable = {*POLICY_KEYS, GROUP_RETURN} if chart.get("per_policy") else known
                plain = [*chart["keys"], *chart.get("band", [])]
                if unknown := [k for k in plain if k not in drawable]:
                    raise ValueError(f"chart {chart['id']!r} draws undeclared keys: {', '.join(unknown)}")
                if not same:
                    self.charts.append(chart)

    @property
    def charted_keys(self) -> list[str]:
        """Every key the charts draw, in chart order (per-policy ones as their gauge names)."""
        return [k for c in self.charts for k in chart_keys(c)]

    def numeric(self, record: dict[str, Any]) -> list[tuple[str, float]]:
        """(key, value) of the record's finite numeric metrics that the catalog names, for the sinks."""
        return [(k, float(v)) for k, v in record.items() if k in self.keys and _finite_number(v)]

    def lines(self, record: dict[str, Any]) -> list[tuple[str, float]]:
        """(name, value) of every finite numeric metric a sink with free-form names (TensorBoard,
        MLflow, W&B) takes: catalog keys, then each policy group's as "policy/<group>/<key>"."""
        groups = [(f"{POLICY_PREFIX}{g}/{k}", v) for g, k, v in group_metrics(record)]
        return self.numeric(record) + groups


def _finite_number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)


def group_metrics(record: dict[str, Any]) -> list[tuple[str, str, float]]:
    """(group, key, value) of the record's per-policy-group metrics: "policy/<group>/<key>" for
    POLICY_KEYS and "policy_return_mean/<group>" (as key policy_return_mean), for the sinks."""
    out = []
    for k, v in record.items():
        if not _finite_number(v):
            continue
        if k.startswith(POLICY_PREFIX) and k.count("/") == 2 and k.rsplit("/", 1)[1] in POLICY_KEYS:
            out.append((k.split("/")[1], k.rsplit("/", 1)[1], float(v)))
        elif k.startswith(POLICY_RETURN_PREFIX):
            out.append((k[len(POLICY_RETURN_PREFIX) :], "policy_return_mean", float(v)))
    return out
