"""`learner.compile`: one compile at the first update, none after it, for every shipped config.

The recompile check traces with the aot_eager backend: dynamo's guards and graph breaks are the
backend's business only after tracing, so a recompile under aot_eager is one under inductor or
torchair too, and the check costs seconds per config instead of minutes of C++ compilation.
One test runs inductor itself (CartPole) and ties its update to the eager one.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import yaml

from relay_rl.contracts.config import MODEL_FAMILIES, load_config
from relay_rl.learner.compiled import CompiledLoss
from relay_rl.services.cli import main
from tests.helpers import ROOT, train_local

# Env configs: a language run's compiles are tested with its own (tests/llm), a reward model's
# update is not compiled.
CONFIGS = sorted(
    p.name
    for p in (ROOT / "configs").glob("*.yaml")
    if (yaml.safe_load(p.read_text()).get("model") or {}).get("kind") not in MODEL_FAMILIES
)

# Each config shrunk to a few small updates on 2 cores; what makes its shapes (model kind, spaces,
# masks, cores, layout, minibatch kind, AMP, annealing, V-trace) is kept as shipped.
PIXELS = ["env.num_envs=2", "rollout.rollout_len=32", "learner.buffer_size=64", "learner.batch_size=32"]
SMALL = {
    "breakout_ppo.yaml": PIXELS,
    "pong_ppo.yaml": PIXELS,
    "cartpole_grpo.yaml": [
        "env.num_envs=4",
        "rollout.rollout_len=100",
        "learner.buffer_size=400",
        "learner.batch_size=200",
    ],
    "halfcheetah_ppo.yaml": ["env.num_envs=2", "rollout.rollout_len=64", "learner.buffer_size=128"],
    "hopper_ppo.yaml": ["env.num_envs=2", "rollout.rollout_len=64", "learner.buffer_size=128"],
    "minigrid_doorkey_ppo.yaml": ["env.num_envs=4", "rollout.rollout_len=64"],
    "minigrid_doorkey8_ppo.yaml": ["env.num_envs=4", "rollout.rollout_len=64"],
    # dynamo unrolls the core over T: T=16 keeps the LSTM, Dict obs and sequence minibatches at a
    # quarter of T=64's tracing time
    "minigrid_memory_lstm_ppo.yaml": [
        "env.num_envs=4",
        "rollout.rollout_len=16",
        "learner.buffer_size=128",
        "learner.batch_size=64",
    ],
    "pendulum_ppo.yaml": ["learner.buffer_size=1024"],
    # one env copy of 20 pistons (columns come in whole copies)
    "pistonball_mappo.yaml": [
        "env.num_envs=20",
        "rollout.rollout_len=16",
        "learner.buffer_size=320",
        "learner.batch_size=160",
    ],
    "taxi_ppo.yaml": ["rollout.rollout_len=32", "learner.buffer_size=512"],
}
UPDATES = 4


def _lines(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def _train(config: str, run: Path, *sets: str) -> list[dict]:
    small = SMALL.get(config, [])
    buffer = load_config(ROOT / "configs" / config, ["rollout.num_workers=0", *small]).learner.buffer_size
    rc = train_local(
        config,
        run,
        *small,
        "learner.compile=true",
        "learner.compile_backend=aot_eager",
        "learner.epochs=2",
        "stop.episode_return_mean=null",
        f"stop.env_steps={UPDATES * buffer}",
        "checkpoint.interval=2",
        *sets,
    )
    assert rc == 0
    return [line for line in _lines(run) if "compiles" in line]


@pytest.mark.slow
@pytest.mark.parametrize("config", CONFIGS)
def test_every_shipped_config_compiles_once_and_never_again(config, tmp_path, capsys):
    lines = _train(config, tmp_path / "run")
    assert len(lines) >= UPDATES - 1
    counts = [line["compiles"] for line in lines]
    assert counts[0] >= 1, "the first update compiles the loss"
    assert counts == [counts[0]] * len(counts), f"recompiled after warm-up: {counts}"
    assert [line["graph_breaks"] for line in lines] == [0] * len(lines)
    assert "recompiled" not in capsys.readouterr().err


@pytest.mark.slow
def test_a_resumed_run_compiles_once_more_and_never_again(tmp_path):
    """A resumed learner is a new learner: one warm-up compile of its own (the count restarts),
    then none, with episode ends, annealed lr and V-trace's chunked passes in between."""
    run = tmp_path / "run"
    first = _train("cartpole_ppo.yaml", run, "learner.off_policy_correction=vtrace", "learner.lr_anneal=true")
    assert main(["resume", str(run), "--set", f"stop.env_steps={2 * UPDATES * 1024}"]) == 0
    resumed = [line for line in _lines(run) if "compiles" in line][len(first) :]
    assert len(resumed) >= UPDATES - 1
    assert [line["compiles"] for line in resumed] == [first[0]["compiles"]] * len(resumed)


def test_compiled_loss_counts_a_recompile_and_says_so(capsys):
    """A minibatch of another shape (what relay's padding exists to prevent) is a second compile,
    counted and reported once on stderr."""

    def loss(model, batch):
        x = batch["x"]
        return (x * x).sum(), {"m": x.mean().detach()}

    compiled = CompiledLoss(loss, torch._dynamo.lookup_backend("aot_eager"))
    for rows in (8, 8, 8):
        compiled(None, {"x": torch.ones(rows, 3, requires_grad=True)})
    assert compiled.counts() == {"compiles": 1, "graph_breaks": 0}
    assert not compiled.recompiled
    compiled(None, {"x": torch.ones(5, 3, requires_grad=True)})
    compiled(None, {"x": torch.ones(6, 3, requires_grad=True)})
    assert compiled.compiles == 3 and compiled.recompiled
    assert capsys.readouterr().err.count("recompiled") == 1


def test_compiled_loss_counts_graph_breaks():
    def loss(model, batch):
        x = batch["x"].sum()
        print("side effect")  # dynamo cannot trace a print: a graph break
        return x * 2, {}

    compiled = CompiledLoss(loss, torch._dynamo.lookup_backend("aot_eager"))
    compiled(None, {"x": torch.ones(4)})
    assert compiled.graph_breaks >= 1


@pytest.mark.slow
def test_inductor_updates_as_eager_does():
    """The real compiler (inductor, C++ on this CPU): the same segments and seed give the same
    weights as the eager update, within float reassociation, and one compile for three updates."""
    from relay_rl.contracts.config import build_config
    from relay_rl.learner.algorithms import algorithm_traits
    from relay_rl.learner.learner import Learner
    from relay_rl.rollout_workers.sampler import make_sampler

    sections = {
        "rollout": {"num_workers": 1, "rollout_len": 16},
        "env": {"num_envs": 4},
        "learner": {"buffer_size": 64, "batch_size": 32, "epochs": 2},
    }
    eager_cfg = build_config(sections, [])
    sampler = make_sampler(eager_cfg, algorithm_traits(eager_cfg))
    segments = [sampler.sample() for _ in range(3)]
    eager = Learner(eager_cfg, sampler.spec)
    compiled = Learner(build_config(sections, ["learner.compile=true"]), sampler.spec)
    for segment in segments:
        expect = eager.train_round([segment]).metrics
        got = compiled.train_round([segment]).metrics
        assert got["compiles"] == 1 and got["graph_breaks"] == 0
        assert got["policy_loss"] == pytest.approx(expect["policy_loss"], rel=1e-4, abs=1e-6)
    for name, weight in eager.model.state_dict().items():
        torch.testing.assert_close(compiled.model.state_dict()[name], weight, rtol=1e-4, atol=1e-5)
