"""Shared test helpers."""

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

from relay_rl.services.cli import main

ROOT = Path(__file__).parents[1]


def benchmark_module(name: str) -> ModuleType:
    """benchmarks/<name>.py as a module, its own `from common import ...` resolved."""
    spec = importlib.util.spec_from_file_location(f"benchmark_{name}", ROOT / "benchmarks" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(ROOT / "benchmarks"))
    spec.loader.exec_module(module)
    return module


# An elastic CartPole fleet small enough to grow and shrink within seconds on 2 cores (the
# elastic-fleet tests and `benchmarks/fleet.py elastic` share it).
ELASTIC_CARTPOLE = [
    "rollout.mode=async",
    "rollout.autoscale=true",
    "rollout.num_cpus_per_worker=0.25",
    "env.num_envs=4",
    "rollout.rollout_len=16",
    "learner.buffer_size=256",
    "learner.batch_size=64",
    "stop.episode_return_mean=null",
]
# An env whose step sleeps 4 ms (no CPU): the learner starves, the fleet grows from 1 to 4.
ELASTIC_STARVING = [
    "env.id=tests.rollout_workers.slow_envs:make",
    "env.kwargs={delay: 0.004}",
    "rollout.num_workers=1",
    "rollout.min_workers=1",
    "rollout.max_workers=4",
    "learner.epochs=1",
]
# A heavy update (60 epochs) with segments queueing: the learner is saturated, the fleet shrinks.
ELASTIC_SATURATED = [
    "rollout.num_workers=3",
    "rollout.min_workers=1",
    "rollout.max_workers=3",
    "rollout.max_segments_in_flight=2",
    "learner.buffer_size=192",
    "learner.epochs=60",
]


def local_config(env_id: str, *overrides: str, T: int = 32, N: int = 4):
    """A local-mode config of `env_id` whose update is one [T, N] segment (a sampler's tests)."""
    from relay_rl.contracts.config import build_config

    return build_config(
        {},
        [
            f"env.id={env_id}",
            "rollout.num_workers=0",
            f"env.num_envs={N}",
            f"rollout.rollout_len={T}",
            f"learner.buffer_size={T * N}",
            f"learner.batch_size={T * N}",
            *overrides,
        ],
    )


def sampled_twice(cfg, samples: int = 2) -> tuple[list, list]:
    """Two fresh samplers of `cfg`, `samples` calls each: what a reproducible run gives twice."""
    from relay_rl.learner.algorithms import algorithm_traits
    from relay_rl.rollout_workers.sampler import make_sampler

    runs = []
    for _ in range(2):
        sampler = make_sampler(cfg, algorithm_traits(cfg))
        runs.append([sampler.sample() for _ in range(samples)])
        sampler.close()
    return runs[0], runs[1]


def train_in_process(config: str, run: Path, *sets: str) -> int:
    """`relay train configs/<config>` in this process, quiet, with extra `--set`s."""
    args = ["train", str(ROOT / "configs" / config), "--run-dir", str(run), "--set", "metrics.progress=none"]
    for kv in sets:
        args += ["--set", kv]
    return main(args)


def train_local(config: str, run: Path, *sets: str) -> int:
    """`relay train configs/<config>` in local mode (no Ray), quiet, with extra `--set`s."""
    return train_in_process(config, run, "rollout.num_workers=0", *sets)


def ray_loop(cfg, run: Path):
    """A TrainingLoop on a RayBackend for `cfg` in a new run directory (Ray must be running)."""
    from relay_rl.services.driver.backends import RayBackend
    from relay_rl.services.driver.loop import TrainingLoop
    from relay_rl.services.driver.preflight import check_env
    from relay_rl.services.runs.run_dir import RunDir

    backend = RayBackend(cfg, check_env(cfg))
    return TrainingLoop(cfg, RunDir.claim(run, cfg), backend), backend


def hold_back_checkpoints(run: Path, held: Path, keep: int = 1) -> None:
    """Move every checkpoint of `run` but its oldest `keep` into `held` (created): checkpoints the
    run "has not written yet", to land later while a `--follow` server runs."""
    from relay_rl.services.runs.checkpoints import list_checkpoints

    held.mkdir()
    for path in list_checkpoints(run / "checkpoints")[keep:]:
        path.rename(held / path.name)


def gae_of(fn, *, gamma: float, lam: float, **seg):
    """`fn` (compute_gae or its reference) on a segment's fields given by name."""
    from relay_rl.learner.gae import EpisodeEnds

    return fn(seg["rewards"], seg["values"], EpisodeEnds.of(seg), gamma=gamma, lam=lam)


def vtrace_of(fn, *, gamma: float, lam: float = 1.0, rho_bar: float = 1.0, c_bar: float = 1.0, **seg):
    """`fn` (compute_vtrace or its reference) on a segment's fields given by name."""
    from relay_rl.learner.gae import EpisodeEnds
    from relay_rl.learner.vtrace import Clipping

    args = (seg["target_logp"], seg["behaviour_logp"], seg["rewards"], seg["values"], EpisodeEnds.of(seg))
    return fn(*args, gamma=gamma, clip=Clipping(lam, rho_bar, c_bar))


def interrupt_during_update(monkeypatch, learner_class: type, method: str, update: int) -> None:
    """A Ctrl-C raised inside the `update`-th call of `learner_class.method`, right after its
    first optimizer step (Adam's): where a stop lands when the learner runs in the driver's
    own thread (local mode), halfway through an update."""
    import signal

    import torch

    calls: list[int] = []
    plain_update, plain_step = getattr(learner_class, method), torch.optim.Adam.step

    def counting(self, *args, **kwargs):
        calls.append(1)
        return plain_update(self, *args, **kwargs)

    def interrupting(self, *args, **kwargs):
        out = plain_step(self, *args, **kwargs)
        if len(calls) == update:
            calls.append(1)  # once
            signal.raise_signal(signal.SIGINT)
        return out

    monkeypatch.setattr(learner_class, method, counting)
    monkeypatch.setattr(torch.optim.Adam, "step", interrupting)
