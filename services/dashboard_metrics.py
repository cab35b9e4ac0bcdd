"""The charts the learner metrics dashboard draws (served to the page as /api/charts); the Grafana
dashboard in deploy/grafana/ shows the same metrics, and a test keeps the two in step."""

from __future__ import annotations

CHARTS: list[dict] = [
    {
        "id": "return",
        "title": "Episode return (mean of last 20, min–max band)",
        "keys": ["episode_return_mean"],
        "band": ["episode_return_min", "episode_return_max"],
    },
    {"id": "length", "title": "Episode length", "keys": ["episode_len_mean"]},
    {"id": "loss", "title": "Policy / value loss", "keys": ["policy_loss", "value_loss"]},
    {"id": "entropy", "title": "Entropy", "keys": ["entropy"]},
    {"id": "kl", "title": "Approx KL (k3)", "keys": ["approx_kl"]},
    {"id": "clip", "title": "Clip fraction", "keys": ["clip_fraction"]},
    {"id": "ev", "title": "Explained variance", "keys": ["explained_variance"]},
    {"id": "grad", "title": "Grad norm", "keys": ["grad_norm"]},
    {"id": "lr", "title": "Learning rate", "keys": ["lr"]},
    {
        "id": "speed",
        "title": "Env steps/s and learner samples/s",
        "keys": ["env_steps_per_s", "learner_samples_per_s"],
    },
    {"id": "lag", "title": "Policy lag and weights version", "keys": ["policy_lag_mean", "weights_version"]},
    {"id": "buffer", "title": "Buffer fill", "keys": ["buffer_fill"]},
    {
        "id": "memory",
        "title": "Device memory (bytes, allocated / peak)",
        "keys": ["device_memory_bytes", "device_memory_peak_bytes"],
    },
    {
        "id": "faults",
        "title": "AMP skipped steps, worker restarts, rejected segments",
        "keys": ["amp_skipped_steps", "worker_restarts", "rejected_segments"],
    },
    {
        "id": "grpo",
        "title": "GRPO: KL to reference, group reward std",
        "keys": ["kl_ref", "group_reward_std"],
        "optional": True,
    },
]

DASHBOARD_METRICS: list[str] = [k for c in CHARTS for k in [*c["keys"], *c.get("band", [])]]
