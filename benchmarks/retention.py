"""Do the shipped configs keep what they learn? Each config trained past the point it solves, on
several seeds: its peak, the mean over the last third of the run, and the share of the gain kept.

    python benchmarks/retention.py [--configs cartpole_ppo,taxi_ppo] [--seeds 0,1,2] [--scale 1.0]
                                   [--runs-dir DIR]

Each run is `relay train configs/<name>.yaml` with its return stop lifted (a config that stops
when solved never shows what comes after) and a fixed budget of env steps (BUDGETS, times
`--scale`). From its metrics lines (`episode_return_mean`, the mean of the last 20 finished
episodes; a multi-agent run's `team_return_mean`, the mean team return of its last 100 env-copy
episodes, where it reports one: its agents' 20 episodes are one or a few copies' episodes, and on
pistonball all 20 pistons of one): `first` the first value, `peak` the highest, `last third`
the mean of the values in the last third of the run's env steps. `kept` = (last third - first)
/ (peak - first): the share of what the run gained that it still holds at the end, whatever the
sign of the returns (Pendulum's are negative). A config keeps what it learns where every seed keeps >= 0.8.

`--runs-dir DIR` keeps each run in `DIR/<config>-seed<S>`, with its config's checkpoints, and
reads, instead of training again, a run already there that reached its budget with the same
settings (every section but metrics, checkpoint, eval and the run's name): pistonball's three
seeds are three hours here, more than one sitting. A folder holding anything else is refused in
one line: an unfinished run (finish it with `relay resume`), other settings.

A line's return is the mean of the last 20 episodes, so on a task whose episodes vary a lot
(simple_spread, MiniGrid-Memory's right-or-wrong fork) the highest line is partly that noise, and
`kept` reads noise as forgetting. `smoothed` is the same share with the first value and the peak
taken as means over windows of a tenth of the run's lines (the last third is a mean already).
A run still rising at its budget fails both, with nothing forgotten: its last third averages the
rise. `at end` is the share of the smoothed gain its last window (a tenth of its lines) holds:
1.00 where the run ends at its best, low where it rose and fell back.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path
from typing import Any

import yaml

sys.path.insert(0, str(Path(__file__).parent))
from common import machine_header, read_metrics, table, train_relay

from relay_rl.contracts.config import config_data, load_config
from relay_rl.services.tracking import flatten

# Env steps per run: about twice what each needs to solve on these two cores (docs/benchmarks.md).
# pistonball's is the 1.5M agent steps (about half an hour a run here).
BUDGETS: dict[str, int] = {
    "cartpole_ppo": 200_000,
    "cartpole_grpo": 300_000,
    "cartpole_novel_lstm_ppo": 200_000,
    "taxi_ppo": 300_000,
    "pendulum_ppo": 300_000,
    "minigrid_doorkey_ppo": 300_000,
    # MiniGrid-MemoryS7: its memory step came at 0.8-1.3M env steps on seeds 0-2 (docs/benchmarks.md).
    "minigrid_memory_lstm_ppo": 2_000_000,
    # simple_spread has no solve point here, and its curves still rise at the shipped configs'
    # 2M agent steps: 2.4M, past that stop (docs/benchmarks.md, "simple_spread at 2.4M").
    "simple_spread_ppo": 2_400_000,
    "simple_spread_mappo": 2_400_000,
    "pistonball_mappo": 1_500_000,
    # MuJoCo: the shipped configs stop at 1M (their lr anneals to 0 over stop.env_steps, so over
    # the budget here); twice that.
    "hopper_ppo": 2_000_000,
    "halfcheetah_ppo": 2_000_000,
}
DEFAULT_CONFIGS = ("cartpole_ppo", "cartpole_grpo", "taxi_ppo", "pendulum_ppo")
KEEPS = 0.8
# The shares a config is judged by (curve_summary's keys), each with the name its verdict gives.
SHARES = {"kept": "kept", "smoothed": "smoothed", "at_end": "at end"}
HEADERS = [
    "config",
    "seed",
    "env steps",
    "first",
    "peak (at steps)",
    "last third",
    "kept",
    ">= 0.8",
    "smoothed peak",
    "smoothed",
    "at end",
]


def return_key(lines: list[dict[str, Any]]) -> str:
    """The return a run's curve is read from: the team's where the run reports one."""
    team = any(line.get("team_return_mean") is not None for line in lines)
    return "team_return_mean" if team else "episode_return_mean"


def curve_summary(lines: list[dict[str, Any]]) -> dict[str, float] | None:
    """first, peak (and its env steps), the last third's mean and `kept` of one run's metrics
    lines (`return_key`'s return); None where no episode finished or the run never rose above its
    first value."""
    key = return_key(lines)
    points = [(line["env_steps"], line.get(key)) for line in lines]
    points = [(s, r) for s, r in points if r is not None]
    if not points:
        return None
    first = points[0][1]
    peak_steps, peak = max(points, key=lambda p: p[1])
    end = points[-1][0]
    last = [r for s, r in points if s >= end * 2 / 3]
    last_mean = statistics.fmean(last)
    gain = peak - first
    window = max(1, len(points) // 10)
    smooth = [statistics.fmean(r for _, r in points[i : i + window]) for i in range(len(points) - window + 1)]
    smooth_gain = max(smooth) - smooth[0]
    return {
        "first": first,
        "peak": peak,
        "peak_steps": peak_steps,
        "last_third": last_mean,
        "kept": (last_mean - first) / gain if gain > 0 else float("nan"),
        "smooth_peak": max(smooth),
        "smoothed": (last_mean - smooth[0]) / smooth_gain if smooth_gain > 0 else float("nan"),
        "at_end": (smooth[-1] - smooth[0]) / smooth_gain if smooth_gain > 0 else float("nan"),
        "env_steps": end,
    }


def _verdict(shares: list[float], name: str) -> str:
    """Whether every seed holds >= KEEPS of its gain by this measure (a NaN never holds)."""
    finite = [k for k in shares if k == k] or [float("nan")]
    holds = all(k >= KEEPS for k in shares)
    span = f"{min(finite):.2f} to {max(finite):.2f}"
    return f"{'keeps' if holds else 'does not keep'} what it learns by {name} ({span})"


# Sections that change what a run is, not what it learns: a kept run is read whatever they say.
NOT_LEARNING = ("metrics", "checkpoint", "eval", "name")


class RunsDirError(Exception):
    pass


def settings_differ(stored: dict[str, Any], config: str, sets: list[str]) -> list[str]:
    """The dotted settings on which a kept run's stored config (its config.yaml) differs from
    `configs/<config>.yaml` with `sets`, leaving out NOT_LEARNING's sections."""
    want = config_data(load_config(Path(__file__).parents[1] / "configs" / f"{config}.yaml", sets))
    a = flatten({k: v for k, v in stored.items() if k not in NOT_LEARNING})
    b = flatten({k: v for k, v in want.items() if k not in NOT_LEARNING})
    return sorted(k for k in a.keys() | b.keys() if a.get(k, "<absent>") != b.get(k, "<absent>"))


def kept_run(folder: Path, config: str, sets: list[str], env_steps: int) -> list[dict[str, Any]] | None:
    """The metrics lines of a finished run of these settings in `folder`; None where the folder is
    new; RunsDirError where it holds anything else."""
    if not folder.exists():
        return None
    lines = read_metrics(folder)
    stored_path = folder / "config.yaml"
    if not lines or not stored_path.is_file():
        raise RunsDirError(f"{folder}: not a finished run (remove it, or finish it with relay resume)")
    if lines[-1]["env_steps"] < env_steps:
        raise RunsDirError(
            f"{folder}: stopped at {lines[-1]['env_steps']:,} of {env_steps:,} env steps "
            "(finish it with relay resume, or remove it)"
        )
    differ = settings_differ(yaml.safe_load(stored_path.read_text()) or {}, config, sets)
    if differ:
        raise RunsDirError(f"{folder}: trained with other settings ({', '.join(differ[:5])}); remove it")
    return lines


def run(config: str, seed: int, env_steps: int, runs_dir: Path | None = None) -> dict[str, float] | None:
    sets = [f"env.seed={seed}", "stop.episode_return_mean=null", f"stop.env_steps={env_steps}"]
    if runs_dir is None:  # a temporary run: no checkpoints to write
        return curve_summary(train_relay(f"configs/{config}.yaml", [*sets, "checkpoint.interval=1000000"]))
    # A kept run keeps the config's checkpoints: one cut short is finished with `relay resume`.
    folder = runs_dir / f"{config}-seed{seed}"
    lines = kept_run(folder, config, sets, env_steps)
    return curve_summary(
        lines if lines is not None else train_relay(f"configs/{config}.yaml", sets, run_dir=folder)
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--configs", default=",".join(DEFAULT_CONFIGS))
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--scale", type=float, default=1.0, help="multiply every budget by this")
    parser.add_argument("--runs-dir", type=Path, help="keep the runs here, and read those already done")
    args = parser.parse_args(argv)
    configs = [c for c in args.configs.split(",") if c]
    unknown = [c for c in configs if c not in BUDGETS]
    if unknown or not configs:
        print(
            f"retention.py: --configs {args.configs!r}: choose from {', '.join(BUDGETS)}",
            file=sys.stderr,
        )
        return 2
    try:
        seeds = [int(s) for s in args.seeds.split(",")]
    except ValueError:
        seeds = []
    if not seeds or not 0 < args.scale <= 100:
        print(
            f"retention.py: --seeds {args.seeds!r} --scale {args.scale}: whole seeds, comma-separated, "
            "and a scale in (0, 100]",
            file=sys.stderr,
        )
        return 2
    if args.runs_dir is not None and args.runs_dir.exists() and not args.runs_dir.is_dir():
        print(f"retention.py: --runs-dir {args.runs_dir}: not a folder", file=sys.stderr)
        return 2
    rows, verdicts = [], []
    for config in configs:
        budget = int(BUDGETS[config] * args.scale)
        shares: dict[str, list[float]] = {key: [] for key in SHARES}
        for seed in seeds:
            try:
                s = run(config, seed, budget, args.runs_dir)
            except RunsDirError as err:
                print(f"retention.py: {err}", file=sys.stderr)
                return 2
            for key, values in shares.items():
                values.append(float("nan") if s is None else s[key])
            if s is None:
                rows.append([config, seed, budget, "no episode", *[""] * (len(HEADERS) - 4)])
                continue
            rows.append(
                [
                    config,
                    seed,
                    int(s["env_steps"]),
                    f"{s['first']:.1f}",
                    f"{s['peak']:.1f} ({int(s['peak_steps']):,})",
                    f"{s['last_third']:.1f}",
                    f"{s['kept']:.2f}",
                    "yes" if s["kept"] >= KEEPS else "no",
                    f"{s['smooth_peak']:.1f}",
                    f"{s['smoothed']:.2f}",
                    f"{s['at_end']:.2f}",
                ]
            )
        judged = "; ".join(_verdict(shares[key], name) for key, name in SHARES.items())
        verdicts.append(f"{config}: {judged} (seeds {args.seeds})")
    print(
        machine_header(
            f"Retention: shipped configs past their solve point, stop.episode_return_mean lifted, "
            f"seeds {args.seeds} (multi-agent runs: team_return_mean)"
        )
    )
    print(table(HEADERS, rows))
    print("\n".join(verdicts))
    return 0


if __name__ == "__main__":
    sys.exit(main())
