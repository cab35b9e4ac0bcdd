"""Weights & Biases: the resolved config, each metrics line (charted against env_steps), the run's
files and its exit status; in a sweep, the trials of one sweep share a group.

The run's files go under the run directory's `wandb/` folder (offline mode keeps everything there
for `wandb sync`). W&B wants its step to rise, which env_steps may not do after a PBT exploit, so
its own step counts lines and the charts use env_steps as their x axis.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import Field

from ...services.tracking import (
    PARENT_TAG,
    SWEEP_TAG,
    RunInfo,
    TrackerSettings,
    flatten,
    import_tracker_package,
)

EXIT_CODES = {"FINISHED": 0, "KILLED": 130}


class Settings(TrackerSettings):
    """`metrics.wandb`: track the run in Weights & Biases (extra wandb); absent or null: off."""

    project: str = Field("relay", min_length=1, description="W&B project the run is logged in.")
    mode: Literal["online", "offline"] = Field(
        "online", description="online: sent to W&B as it runs; offline: kept under the run's wandb/."
    )


class Client:
    def __init__(self, settings: Settings, info: RunInfo) -> None:
        self._wandb = import_tracker_package("wandb", "wandb", "wandb")
        self.settings = settings
        self.info = info
        self.run: Any = None
        self.local = settings.mode == "offline"  # no server to wait on

    def start(self) -> None:
        if self.run is not None:
            return
        self.run = self._wandb.init(
            project=self.settings.project,
            mode=self.settings.mode,
            dir=str(self.info.root),
            name=self.info.root.name,
            group=self.info.tags.get(SWEEP_TAG),
            config=flatten(self.info.config),
            tags=[f"{k}={v}"[:64] for k, v in self.info.tags.items() if k != PARENT_TAG],
            reinit="create_new",  # trials of a sweep may share a process
            # relay prints its own lines; W&B's banners and summaries would bury them
            settings=self._wandb.Settings(console="off", silent=True, x_disable_stats=True),
        )
        self.run.define_metric("env_steps")
        self.run.define_metric("*", step_metric="env_steps")

    def log(self, lines: list[dict[str, Any]]) -> None:
        for line in lines:
            self.run.log(line)

    def log_files(self, files: list[tuple[Path, str]]) -> None:
        for path, _folder in files:  # kept under the run's own relative path (checkpoints/...)
            self.run.save(str(path), base_path=str(self.info.root), policy="now")

    def finish(self, status: str) -> None:
        self.run.finish(exit_code=EXIT_CODES.get(status, 1))
