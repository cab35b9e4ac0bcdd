"""The rollout worker as a Ray actor: a thin shell around a sampler (`rollout_workers/sampler.py`)."""

from __future__ import annotations

import os
import secrets
import uuid
import warnings
from typing import Any

import ray
import torch

from ..contracts.algorithm import AlgorithmTraits
from ..contracts.config import RelayConfig
from ..contracts.segment import Sampled
from ..contracts.spaces import EnvSpec
from ..policy.weight_wires import wire_for
from ..rollout_workers.sampler import make_sampler
from ..rollout_workers.user_code import allow_user_code


class RolloutWorker:
    """CPU actor owning one vector env; picks up new weights by ref, returns one Segment per call."""

    def __init__(
        self, cfg_data: dict[str, Any], traits: AlgorithmTraits, worker_index: int, workdir: str
    ) -> None:
        # One intra-op thread: a tiny MLP gains nothing from more, and workers share the cores.
        torch.set_num_threads(1)
        cfg = RelayConfig.model_validate(cfg_data)
        adopt_workdir(workdir, cfg)
        self.sampler = make_sampler(cfg, traits, worker_index)
        self.wire = wire_for(cfg)
        # A fresh id per (re)start: the learner counts restarts as changes of it.
        self.incarnation = uuid.uuid4().hex
        with warnings.catch_warnings():  # Ray's own property uses its deprecated actor_id inside
            warnings.simplefilter("ignore", DeprecationWarning)
            restarted = ray.get_runtime_context().was_current_actor_reconstructed
        if restarted:
            # Ray re-ran this constructor after a crash: fresh seeds, or the restarted worker
            # would replay the envs and noise it started the run with.
            self.sampler.reseed(1 + secrets.randbelow(2**31 - 1))

    def reseed(self, stream: int) -> None:
        self.sampler.reseed(stream)

    def seed_stream(self) -> int:
        return self.sampler.seed_stream

    def node_id(self) -> str:
        """The Ray node this worker runs on (where its segments are stored)."""
        return ray.get_runtime_context().get_node_id()

    def env_spec(self) -> EnvSpec:
        return self.sampler.spec

    @ray.method(enable_task_events=False)  # hot: no task record kept in the GCS
    def sample(self, version: int, weights_ref: list[ray.ObjectRef]) -> Sampled:
        """A Segment acted with weights `version` (fetched from the object store only when new);
        a policy-grouped env's {group: Segment}."""
        if version != self.sampler.version:
            self.sampler.set_weights(version, self.wire.unpack(ray.get(weights_ref[0])))
        sampled = self.sampler.sample()
        for segment in sampled.values() if isinstance(sampled, dict) else [sampled]:
            segment.incarnation = self.incarnation
        return sampled


def adopt_workdir(workdir: str, cfg: RelayConfig) -> None:
    """Work in the driver's folder where this node has it (an env's relative paths mean what they
    mean to the user), and let a `module:factory` env's module (and a `module:fn` group mapping's)
    come from there, after everything installed (Ray's own sys.path entry for it is an empty
    folder: see services/driver/cluster.py)."""
    if os.path.isdir(workdir):
        os.chdir(workdir)
        allow_user_code(cfg, workdir)


def worker_resources(cfg: RelayConfig) -> dict[str, float]:
    """What one rollout worker asks Ray for: CPUs only."""
    return {"CPU": cfg.rollout.num_cpus_per_worker}


def create_rollout_workers(
    cfg: RelayConfig, traits: AlgorithmTraits, indices: range | None = None
) -> list[Any]:
    """One actor per worker index (default: 0 .. num_workers - 1), CPU only; Ray restarts a dead
    one (the driver counts restarts). The index names the worker's seeds; `traits` are the
    configured algorithm's (the driver reads them from the registry)."""
    cls = ray.remote(RolloutWorker).options(
        num_cpus=worker_resources(cfg)["CPU"],
        max_restarts=cfg.rollout.max_restarts,
        max_task_retries=0,
    )
    data, workdir = cfg.model_dump(mode="json"), os.getcwd()
    return [cls.remote(data, traits, i, workdir) for i in (indices or range(cfg.rollout.num_workers))]
