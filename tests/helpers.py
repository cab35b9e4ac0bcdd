"""Shared test helpers."""

from pathlib import Path

from services.cli import main

ROOT = Path(__file__).parents[1]


def train_local(config: str, run: Path, *sets: str) -> int:
    """`relay train configs/<config>` in local mode (no Ray), quiet, with extra `--set`s."""
    args = [
        "train",
        str(ROOT / "configs" / config),
        "--run-dir",
        str(run),
        "--set",
        "rollout.num_workers=0",
        "--set",
        "metrics.progress=none",
    ]
    for kv in sets:
        args += ["--set", kv]
    return main(args)
