"""MLflow: the resolved config as parameters, each metrics line as metrics at its env steps, the
run's files as artifacts, its status at the end; in a sweep, each trial a child of the sweep's run.

Talks to the tracking server through `mlflow.MlflowClient` (no global active run: several trials may
share a process). MLflow's own HTTP retries (7 tries, 120 s timeouts) would hold one batch for
minutes; relay retries itself, so a request here is tried twice and waits at most 10 s unless the
user set MLFLOW_HTTP_REQUEST_* themselves (and MLflow's "View run at" lines are not printed).
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from pydantic import Field

from ...services.tracking import RunInfo, TrackerSettings, flatten, import_tracker_package

PARAMS_PER_CALL = 100  # MLflow's cap on params in one log_batch
METRICS_PER_CALL = 1000  # and on metrics
PARAM_CHARS = 6000  # and on a param value


def _quick_requests() -> None:
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "1")
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "10")
    os.environ.setdefault("MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT", "true")  # relay prints its own lines


def experiment_id(client: Any, name: str) -> str:
    """The experiment's id, created if it does not exist yet (two trials racing: one creates it)."""
    found = client.get_experiment_by_name(name)
    if found is not None:
        return str(found.experiment_id)
    try:
        return str(client.create_experiment(name))
    except Exception:
        found = client.get_experiment_by_name(name)
        if found is None:
            raise
        return str(found.experiment_id)


class Settings(TrackerSettings):
    """`metrics.mlflow`: track the run in MLflow (extra mlflow); absent or null: off."""

    tracking_uri: str = Field(
        ...,
        min_length=1,
        description="MLflow tracking server (http://host:5000), or a local store (sqlite:///mlflow.db).",
    )
    experiment: str = Field("relay", min_length=1, description="MLflow experiment the run is logged in.")


class Client:
    def __init__(self, settings: Settings, info: RunInfo) -> None:
        _quick_requests()
        self._mlflow = import_tracker_package("mlflow", "mlflow", "mlflow")
        self.settings = settings
        self.info = info
        self.client: Any = None
        self.run_id: str | None = None
        # A tracking server (a file store too: not told apart; its start takes milliseconds)
        self.local = False

    def start(self) -> None:
        if self.run_id is not None:
            return
        self.client = self._mlflow.MlflowClient(tracking_uri=self.settings.tracking_uri)
        exp = experiment_id(self.client, self.settings.experiment)
        tags = {**self.info.tags, "relay.run_dir": str(self.info.root)}
        run = self.client.create_run(exp, run_name=self.info.root.name, tags=tags)
        self.run_id = run.info.run_id
        Param = self._mlflow.entities.Param
        params = [Param(k, v[:PARAM_CHARS]) for k, v in flatten(self.info.config).items()]
        for i in range(0, len(params), PARAMS_PER_CALL):
            self.client.log_batch(self.run_id, params=params[i : i + PARAMS_PER_CALL], synchronous=True)

    def log(self, lines: list[dict[str, Any]]) -> None:
        Metric = self._mlflow.entities.Metric
        now = int(time.time() * 1000)
        metrics = [
            Metric(key, float(value), now, int(line["env_steps"]))
            for line in lines
            for key, value in line.items()
            if key != "env_steps"
        ]
        for i in range(0, len(metrics), METRICS_PER_CALL):
            self.client.log_batch(self.run_id, metrics=metrics[i : i + METRICS_PER_CALL], synchronous=True)

    def log_files(self, files: list[tuple[Path, str]]) -> None:
        for path, folder in files:
            self.client.log_artifact(self.run_id, str(path), artifact_path=folder)

    def finish(self, status: str) -> None:
        self.client.set_terminated(self.run_id, status=status)


def start_parent(settings: Settings, name: str, params: dict[str, str]) -> str:
    """A sweep's own run, parent of its trials' runs; returns its id."""
    _quick_requests()
    mlflow = import_tracker_package("mlflow", "mlflow", "mlflow")
    client = mlflow.MlflowClient(tracking_uri=settings.tracking_uri)
    run = client.create_run(experiment_id(client, settings.experiment), run_name=name)
    Param = mlflow.entities.Param
    items = [Param(k, v[:PARAM_CHARS]) for k, v in params.items()]
    for i in range(0, len(items), PARAMS_PER_CALL):
        client.log_batch(run.info.run_id, params=items[i : i + PARAMS_PER_CALL], synchronous=True)
    return str(run.info.run_id)


def finish_parent(settings: Settings, run_id: str, status: str) -> None:
    mlflow = import_tracker_package("mlflow", "mlflow", "mlflow")
    mlflow.MlflowClient(tracking_uri=settings.tracking_uri).set_terminated(run_id, status=status)
