"""The objectives of a language run as registries (`learner/lm/estimators`, `learner/lm/
policy_losses`): each entry tied to a hand-computed case and to TRL's or verl's formula, written
here as those libraries write it; a new estimator is one module-level entry and one registry line
(here a monkeypatched line), with its settings checked, listed, swept and stored, and its metric
keys in the catalog; RLOO and REINFORCE++ (one with GSPO's sequence loss) train the tiny task."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import yaml
from pydantic import Field

from relay_rl.contracts.config import EntrySection
from relay_rl.contracts.metrics import MetricKeys
from relay_rl.learner.lm import tokens
from relay_rl.learner.lm.estimators import (
    ESTIMATORS,
    AdvantageEstimator,
    RoundRewards,
    grpo,
    reinforce_pp,
    rloo,
)
from relay_rl.learner.lm.policy_losses import POLICY_LOSSES, TokenBatch, gspo
from relay_rl.services.cli import main
from relay_rl.services.runs import metric_keys
from relay_rl.services.runs.config_sections import all_leaves
from relay_rl.services.sweep.plan import parse_params
from tests.lm_helpers import sevens_run


def _round(rewards, group_size, valid=None, lengths=None, eps=0.0) -> RoundRewards:
    r = torch.tensor(rewards, dtype=torch.float32)
    v = torch.ones_like(r, dtype=torch.bool) if valid is None else torch.tensor(valid)
    n = torch.ones_like(r) if lengths is None else torch.tensor(lengths, dtype=torch.float32)
    return RoundRewards(r, v, n, group_size, eps)


# ---- hand-computed cases -----------------------------------------------------------------------
def test_grpo_rloo_and_reinforce_pp_by_hand():
    group = grpo.GrpoEstimatorSettings()
    adv, _ = grpo.group_relative(_round([1, 0, 0, 1], 4), group)
    assert torch.allclose(adv, torch.tensor([1.0, -1.0, -1.0, 1.0]))
    adv, _ = rloo.leave_one_out(_round([1, 0, 0, 1], 4), None)
    assert torch.allclose(adv, torch.tensor([2 / 3, -2 / 3, -2 / 3, 2 / 3]))
    adv, stats = reinforce_pp.batch_whitened(_round([1, 0], 2, lengths=[1, 3]), None)
    assert torch.allclose(adv, torch.tensor([1.5, -0.5]), atol=1e-6) and stats["return_token_std"] == 0.5


def test_estimators_give_nothing_to_what_carries_no_signal():
    """A faulted member gets 0 and is nobody's baseline; a group (GRPO, RLOO) or a batch
    (REINFORCE++) whose valid rewards are all equal gets 0 everywhere, as does RLOO's group with
    one valid member (no mates to compare with)."""
    r = _round([1, 0, 5, 2, 2, 2, 2, 9], 4, valid=[True, True, False, True, True, True, True, False])
    adv, _ = rloo.leave_one_out(r, None)
    assert adv[2] == 0 and bool((adv[4:] == 0).all())
    assert torch.allclose(adv[[0, 1, 3]], torch.tensor([1 - 1.0, 0 - 1.5, 2 - 0.5]))  # mates' means
    one = _round([4, 1], 2, valid=[True, False])
    assert rloo.leave_one_out(one, None)[0].tolist() == [0.0, 0.0]
    equal = _round([2, 2, 2, 2], 2, lengths=[1, 2, 3, 4])
    assert reinforce_pp.batch_whitened(equal, None)[0].tolist() == [0.0] * 4
    assert grpo.group_relative(equal, grpo.GrpoEstimatorSettings())[0].tolist() == [0.0] * 4


# ---- the libraries' formulas --------------------------------------------------------------------
def test_rloo_is_trls_and_reinforce_pp_is_verls():
    g = torch.Generator().manual_seed(0)
    rewards = torch.rand(6 * 4, generator=g)
    lengths = torch.randint(1, 9, (24,), generator=g).float()
    # TRL's RLOOTrainer: rlhf_reward [k, batch]; baseline = (sum - reward) / (k - 1)
    k = 4
    grouped = rewards.view(-1, k).T
    trl = (grouped - (grouped.sum(0) - grouped) / (k - 1)).T.reshape(-1)
    assert torch.allclose(rloo.leave_one_out(_round(rewards.tolist(), k), None)[0], trl, atol=1e-6)
    # verl: token-level returns (an outcome reward at every token), masked_whiten over the batch
    mask = (torch.arange(8).unsqueeze(0) < lengths.unsqueeze(-1)).float()
    returns = rewards.unsqueeze(-1) * mask
    mean = (returns * mask).sum() / mask.sum()
    var = (((returns - mean) ** 2) * mask).sum() / mask.sum() * (mask.sum() / (mask.sum() - 1))
    verl = ((returns - mean) * torch.rsqrt(var + 1e-8)) * mask
    ours = reinforce_pp.batch_whitened(_round(rewards.tolist(), k, lengths=lengths.tolist()), None)[0]
    assert torch.allclose(ours.unsqueeze(-1) * mask, verl, atol=1e-5)


def test_gspo_clips_the_sequence_ratio_and_has_gspos_gradient():
    """Token log-ratios [0.2, 0]: s = exp(0.1), past 1 + 4e-4, so both tokens are clipped above.
    With a range that never clips, the per-token loss under the sequence mean has the gradient of
    -A * s, the sequence objective itself (GSPO-token equals GSPO for one advantage per sequence)."""
    logp = torch.tensor([[0.2, 0.0]], requires_grad=True)
    batch = TokenBatch(logp, torch.zeros(1, 2), torch.tensor([1.0]), torch.ones(1, 2), 0.2)
    loss, low, high = gspo.sequence_clipped(batch, gspo.GspoSettings())
    assert torch.allclose(loss, torch.full((1, 2), -(1 + 4e-4))) and high.tolist() == [[1.0, 1.0]]
    assert low.tolist() == [[0.0, 0.0]]

    logp = torch.tensor([[-0.3, -1.2, -0.5], [-2.0, -0.1, 0.0]], requires_grad=True)
    old = torch.tensor([[-0.4, -1.0, -0.5], [-1.5, -0.3, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    adv = torch.tensor([0.7, -1.3])
    wide = gspo.GspoSettings(clip_ratio_low=0.99, clip_ratio_high=10)
    per_token = gspo.sequence_clipped(TokenBatch(logp, old, adv, mask, 0.2), wide)[0]
    w = tokens.token_weights(mask, torch.tensor([True, True]), "seq_mean", 3)
    (grad,) = torch.autograd.grad((per_token * w).sum(), logp)
    logp2 = logp.detach().clone().requires_grad_(True)
    s = (((logp2 - old) * mask).sum(-1) / mask.sum(-1)).exp()
    (want,) = torch.autograd.grad((-adv * s).mean(), logp2)
    assert torch.allclose(grad * mask, want * mask, atol=1e-6)


def test_the_registries_hold_the_shipped_entries():
    assert list(ESTIMATORS) == ["grpo", "rloo", "reinforce_pp"]
    assert list(POLICY_LOSSES) == ["clip", "gspo"]


# ---- a new estimator: one entry, one line ---------------------------------------------------------
class MedianSettings(EntrySection):
    """`learner.median`: an estimator of this test (the group median as the baseline)."""

    scale: float = Field(1.0, gt=0, le=10, description="Multiplies the advantages (median estimator).")


def _median(r: RoundRewards, settings: MedianSettings):
    grouped = r.rewards.view(-1, r.group_size)
    adv = (grouped - grouped.median(-1, keepdim=True).values).reshape(-1) * settings.scale
    return torch.where(r.valid, adv, torch.zeros_like(adv)), {"median_scale": settings.scale}


MEDIAN = AdvantageEstimator(
    _median, MedianSettings, MetricKeys({"median_scale": "the median estimator's scale (a test estimator)"})
)


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    return sevens_run(tmp_path_factory.mktemp("objectives"), checkpoint_interval=50)


@pytest.fixture
def median(monkeypatch):
    monkeypatch.setitem(ESTIMATORS, "median", MEDIAN)  # the one registry line
    assert "median_scale" in metric_keys.catalog().keys


def test_a_new_estimators_settings_are_checked_listed_swept_and_stored(median, workdir, monkeypatch, capsys):
    monkeypatch.chdir(workdir)
    assert (
        main(["validate", "run.yaml", "--set", "learner.algo=median", "--set", "learner.median.scale=2"]) == 0
    )
    stored = yaml.safe_load(capsys.readouterr().out)
    assert stored["learner"]["median"] == {"scale": 2.0} and stored["learner"]["lm"]["policy_loss"] == "clip"
    assert (
        main(["validate", "run.yaml", "--set", "learner.algo=median", "--set", "learner.median.scale=0"]) == 2
    )
    err = capsys.readouterr().err.strip()
    assert "learner.median.scale: Input should be greater than 0" in err and len(err.splitlines()) == 1
    assert main(["validate", "--help-config"]) == 0
    out = capsys.readouterr().out
    assert (
        "learner.median.scale = 1.0\n    Multiplies the advantages" in out and "reinforce_pp, median" in out
    )
    assert "learner.median.scale" in {path for path, _, _ in all_leaves()}
    assert [p.key for p in parse_params({"learner.median.scale": "uniform(0.5, 2)"})] == [
        "learner.median.scale"
    ]


def _lines(run: Path) -> list[dict]:
    return [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]


def test_a_new_estimator_trains_with_its_settings_and_metric(median, workdir, monkeypatch):
    monkeypatch.chdir(workdir)
    run = workdir / "runs" / "median"
    sets = ["learner.algo=median", "learner.median.scale=0.5", "stop.env_steps=600"]
    args = ["train", "run.yaml", "--run-dir", str(run)]
    for s in sets:
        args += ["--set", s]
    assert main(args) == 0
    lines = _lines(run)
    assert lines and {x["median_scale"] for x in lines} == {0.5}
    assert set(lines[-1]) <= set(metric_keys.catalog().keys)


@pytest.mark.parametrize(
    "sets",
    [
        ["learner.algo=rloo"],
        ["learner.algo=reinforce_pp", "learner.lm.policy_loss=gspo", "learner.lm.loss_agg=seq_mean"],
    ],
    ids=["rloo", "reinforce_pp-gspo"],
)
def test_rloo_and_reinforce_pp_learn_the_tiny_task(workdir, monkeypatch, sets):
    """The fixture's task (a completion with a 7 scores 1): the mean reward of the last five
    rounds beats the first five's by a margin the untrained model never reaches by chance."""
    monkeypatch.chdir(workdir)
    run = workdir / "runs" / sets[0].split("=")[1]
    args = ["train", "run.yaml", "--run-dir", str(run)]
    for s in sets:
        args += ["--set", s]
    assert main(args) == 0
    lines = _lines(run)
    first = sum(x["reward_mean"] for x in lines[:5]) / 5
    last = sum(x["reward_mean"] for x in lines[-5:]) / 5
    assert last > first + 0.3, (first, last)
    stored = yaml.safe_load((run / "config.yaml").read_text())["learner"]
    assert stored["algo"] == sets[0].split("=")[1] and stored["lm"]["policy_loss"] in ("clip", "gspo")
    assert set(lines[-1]) <= set(metric_keys.catalog().keys)


def test_stop_iterations_ends_a_language_run_and_an_env_run_after_that_many_updates(
    workdir, monkeypatch, tmp_path
):
    """stop.iterations is every family's: a language run's rounds, an env run's updates; with no
    other budget it is a stop criterion on its own."""
    from tests.helpers import train_local

    monkeypatch.chdir(workdir)
    run = workdir / "runs" / "three"
    assert main(["train", "run.yaml", "--run-dir", str(run), "--set", "stop.iterations=3"]) == 0
    assert [x["iteration"] for x in _lines(run)] == [1, 2, 3]
    env_run = tmp_path / "env"
    sets = ("stop.env_steps=null", "stop.iterations=2", "learner.lr_anneal=false")
    assert train_local("cartpole_ppo.yaml", env_run, *sets) == 0
    assert [x["iteration"] for x in _lines(env_run)] == [1, 2]
