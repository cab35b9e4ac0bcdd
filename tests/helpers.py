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


def ray_loop(cfg, run: Path):
    """A TrainingLoop on a RayBackend for `cfg` in a new run directory (Ray must be running)."""
    from services.driver.backends import RayBackend
    from services.driver.loop import TrainingLoop
    from services.driver.preflight import check_env
    from services.driver.run_dir import RunDir

    backend = RayBackend(cfg, check_env(cfg))
    return TrainingLoop(cfg, RunDir.claim(run, cfg), backend), backend
