"""The metric catalog: the run-wide keys plus what each registry entry declares beside its code."""

from __future__ import annotations

import pytest

from relay_rl.contracts.metrics import RUN, RUN_METRICS, MetricCatalog, MetricKeys
from relay_rl.learner.algorithms import ALGORITHMS, PPO
from relay_rl.learner.lm.estimators import ESTIMATORS
from relay_rl.policy.cores import CORES
from relay_rl.policy.models import MODEL_KINDS
from relay_rl.services.runs.metric_keys import catalog


def test_each_entry_owns_its_keys_and_the_catalog_holds_them_all():
    owned = {
        "ppo": ALGORITHMS["ppo"].metrics,
        "grpo": ALGORITHMS["grpo"].metrics,
        "causal_lm": MODEL_KINDS["causal_lm"].metrics,
        "lstm": CORES["lstm"].metrics,
        "reinforce_pp": ESTIMATORS["reinforce_pp"].metrics,
    }
    assert {"value_loss", "explained_variance"} <= set(owned["ppo"].keys)
    assert {"group_reward_std", "zero_std_group_fraction"} <= set(owned["grpo"].keys)
    assert "kl_ref" in RUN_METRICS  # both families' GRPO write it: a run-wide key
    assert "return_token_std" in ESTIMATORS["reinforce_pp"].metrics.keys
    assert {"reward_mean", "completions", "reward_31_mean"} <= set(owned["causal_lm"].keys)
    assert "state_abs_mean" in owned["lstm"].keys
    for part in owned.values():
        assert not set(part.keys) & set(RUN_METRICS)  # written once, beside the code that emits them
        assert set(part.keys) <= set(catalog().keys)
        assert all(c in catalog().charts for c in part.charts)
    assert set(RUN_METRICS) <= set(catalog().keys)
    gauges = {k for k in catalog().charted_keys if not k.startswith("group_")}
    assert gauges <= set(catalog().keys)


def test_a_new_algorithms_keys_arrive_with_its_registry_line(monkeypatch):
    """The whole of a new algorithm's metric plumbing: its class declares, the registry lists it."""

    class Reinforce(PPO):
        metrics = MetricKeys(
            {"baseline_loss": "loss of the baseline"},
            ({"id": "baseline", "title": "Baseline", "keys": ["baseline_loss", "entropy"]},),
        )

    assert "baseline_loss" not in catalog().keys
    monkeypatch.setitem(ALGORITHMS, "reinforce", Reinforce)
    found = catalog()  # registered after import: the catalog follows the registry
    assert found.keys["baseline_loss"] == "loss of the baseline"
    assert "baseline" in [c["id"] for c in found.charts]
    assert dict(found.numeric({"baseline_loss": 0.5, "unknown": 1.0, "entropy": float("nan")})) == {
        "baseline_loss": 0.5
    }


@pytest.mark.parametrize(
    "part, message",
    [
        (MetricKeys({"entropy": "something else"}), "declared twice with different meanings"),
        (MetricKeys({}, ({"id": "x", "title": "X", "keys": ["not_declared"]},)), "draws undeclared keys"),
        (
            MetricKeys({}, ({"id": "loss", "title": "Other", "keys": ["entropy"]},)),
            "declared twice, differently",
        ),
        (
            MetricKeys({}, ({"id": "x", "title": "X", "keys": ["value_loss"]},)),
            "draws undeclared keys",  # another entry's key: a chart draws its own and the run's
        ),
    ],
)
def test_an_entry_cannot_change_what_another_declared(part, message):
    with pytest.raises(ValueError, match=message):
        MetricCatalog([ALGORITHMS["ppo"].metrics, part], base=RUN)


def test_a_shared_declaration_is_taken_once():
    """Cores share their base class's declaration: the same keys and charts twice are one."""
    catalog = MetricCatalog([CORES["lstm"].metrics, CORES["gru"].metrics])
    assert [c["id"] for c in catalog.charts].count("recurrent") == 1
