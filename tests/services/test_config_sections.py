"""Settings that travel with their registry entry: an algorithm declares `learner.<name>` beside its
code (`Algorithm.settings`), a tracker `metrics.<name>` (its module's `Settings`);
services/runs/config_sections.py assembles them for preflight, `--help-config` and sweeps."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
import torch
import yaml
from hypothesis import given
from hypothesis import settings as hyp_settings
from hypothesis import strategies as st
from pydantic import Field

from relay_rl.contracts.config import (
    ConfigError,
    EntrySection,
    RelayConfig,
    build_config,
    config_data,
    load_config,
)
from relay_rl.contracts.metrics import MetricKeys
from relay_rl.learner.algorithms import ALGORITHMS, PPO
from relay_rl.learner.lm.settings import lm_settings
from relay_rl.services.cli import main
from relay_rl.services.runs import metric_keys
from relay_rl.services.runs.config_sections import all_leaves, resolve_sections
from relay_rl.services.sweep.plan import parse_params
from relay_rl.services.tracking import TRACKERS, RunInfo, Tracking, tracker_settings
from tests.helpers import train_local

ROOT = Path(__file__).parents[2]
CARTPOLE = str(ROOT / "configs/cartpole_ppo.yaml")
NAMES = st.text(alphabet="abcdefghijklmnopqrstuvwxyz_", min_size=1, max_size=12)


class ScaleSettings(EntrySection):
    """`learner.scaled_ppo`: PPO with its whole loss scaled (an algorithm of this test)."""

    loss_scale: float = Field(1.0, gt=0, le=100, description="Multiplies PPO's loss.")


class ScaledPPO(PPO):
    """A new algorithm with settings and a metric key of its own: this class and one registry line
    are all it takes (the registry line is the monkeypatch below)."""

    settings = ScaleSettings
    metrics = MetricKeys({"loss_scale": "the loss multiplier of scaled_ppo (a test algorithm)"})

    def __init__(self, cfg, model, dev):
        super().__init__(cfg, model, dev)
        self.scale = self.settings_of(cfg).loss_scale

    def loss(self, model, b):
        loss, stats = super().loss(model, b)
        return loss * self.scale, {**stats, "loss_scale": torch.tensor(self.scale)}


@pytest.fixture
def scaled_ppo(monkeypatch):
    monkeypatch.setitem(ALGORITHMS, "scaled_ppo", ScaledPPO)
    assert "loss_scale" in metric_keys.catalog().keys  # the catalog follows the registry


def _validate(capsys, *sets: str) -> tuple[int, str, str]:
    argv = ["validate", CARTPOLE]
    for kv in sets:
        argv += ["--set", kv]
    code = main(argv)
    out, err = capsys.readouterr()
    return code, out, err


def test_a_new_algorithms_settings_are_checked_listed_swept_and_stored_resolved(scaled_ppo, capsys):
    code, out, _ = _validate(capsys, "learner.algo=scaled_ppo", "learner.scaled_ppo.loss_scale=0.5")
    assert code == 0
    assert yaml.safe_load(out)["learner"]["scaled_ppo"] == {"loss_scale": 0.5}
    # absent: its defaults are written out, so the stored config states every setting
    code, out, _ = _validate(capsys, "learner.algo=scaled_ppo")
    assert code == 0 and yaml.safe_load(out)["learner"]["scaled_ppo"] == {"loss_scale": 1.0}

    code, _, err = _validate(capsys, "learner.algo=scaled_ppo", "learner.scaled_ppo.loss_scale=-1")
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert "learner.scaled_ppo.loss_scale: Input should be greater than 0" in err
    code, _, err = _validate(capsys, "learner.algo=scaled_ppo", "learner.scaled_ppo.loss_scal=2")
    assert code == 2 and "learner.scaled_ppo.loss_scal: unknown key (check the spelling)" in err

    assert main(["validate", "--help-config"]) == 0
    assert "learner.scaled_ppo.loss_scale = 1.0\n    Multiplies PPO's loss." in capsys.readouterr().out
    assert "learner.scaled_ppo.loss_scale" in {path for path, _, _ in all_leaves()}
    assert [p.key for p in parse_params({"learner.scaled_ppo.loss_scale": "uniform(0.5, 2)"})] == [
        "learner.scaled_ppo.loss_scale"
    ]


def test_a_new_algorithm_trains_with_its_own_settings_and_metric(scaled_ppo, tmp_path):
    """End to end: the registered algorithm reads its section in the learner, its metric reaches
    the metrics lines, and the run's config.yaml holds the section resolved."""
    run = tmp_path / "run"
    sets = ["learner.algo=scaled_ppo", "learner.scaled_ppo.loss_scale=0.25", "stop.env_steps=1024"]
    assert train_local("cartpole_ppo.yaml", run, *sets) == 0
    lines = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert {line["loss_scale"] for line in lines if "loss_scale" in line} == {0.25}
    stored = yaml.safe_load((run / "config.yaml").read_text())
    assert stored["learner"]["algo"] == "scaled_ppo" and stored["learner"]["scaled_ppo"] == {
        "loss_scale": 0.25
    }


@pytest.mark.parametrize(
    "sets, needle",
    [
        (["metrics.mlfow.tracking_uri=http://h:5000"], "metrics.mlfow: unknown key (check the spelling)"),
        (["learner.ppo.beta=1"], "learner.ppo: the ppo algorithm has no settings of its own"),
        (["learner.nope.x=1"], "learner.nope: unknown key (check the spelling)"),
        (["learner.grpo.loss_agg=sum"], "learner.grpo: runs of model.kind=mlp have no such section"),
        (["learner.lm.loss_agg=token_mean"], "learner.lm: runs of model.kind=mlp have no such section"),
        (["metrics.mlflow.experiment=x"], "metrics.mlflow.tracking_uri: Field required"),
        (["learner.clip_ration=0.3"], "learner.clip_ration: unknown key (check the spelling)"),
        (["model.mlp.width=3"], "model.mlp: the mlp model kind has no settings of its own"),
        (
            ["model.transformer.heads=0"],
            "model.transformer.heads: Input should be greater than or equal to 1",
        ),
    ],
)
def test_a_wrong_section_is_one_line_and_exit_2(capsys, sets, needle):
    code, out, err = _validate(capsys, *sets)
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1
    assert needle in err, err


def test_every_problem_of_the_sections_is_named_at_once():
    cfg = build_config({}, ["metrics.mlfow.x=1", "learner.ppo.x=1"])
    with pytest.raises(ConfigError) as err:
        resolve_sections(cfg)
    assert "metrics.mlfow: unknown key" in str(err.value) and "learner.ppo:" in str(err.value)


def test_a_config_means_the_same_in_every_process():
    """The contract carries entry sections as plain data: a rollout worker or checkpoint reader that
    never imported the learner's registry validates the resolved config to the same object, and a
    config stored before sections moved (a PPO run's learner.grpo, a tracker's null) still loads."""
    language = {
        "model": {"kind": "causal_lm", "path": "m"},
        "prompts": {"train": "p.jsonl", "rewards": ["exact_match"]},
    }
    cfg = build_config(language, ["learner.lm.loss_agg=seq_mean"])
    resolve_sections(cfg)
    data = config_data(cfg)
    assert data["learner"]["lm"]["loss_agg"] == "seq_mean" and data["learner"]["lm"]["importance_cap"] == 2.0
    assert data["learner"]["grpo"] == {"scale_rewards": "group"} and data["learner"]["clip"] == {
        "clip_ratio_high": None
    }
    assert RelayConfig.model_validate(data) == cfg
    assert lm_settings(RelayConfig.model_validate(data)).loss_agg == "seq_mean"

    token = load_config(str(ROOT / "configs/reverse_digits_grpo.yaml"))
    resolve_sections(token)  # a model kind's section is stored resolved too
    assert config_data(token)["model"]["transformer"]["ff_mult"] == 2

    old = build_config(
        {"learner": {"algo": "ppo", "grpo": {"loss_agg": "token_mean"}}, "metrics": {"mlflow": None}}
    )
    resolve_sections(old)  # an env run's learner.grpo of before 2026-12 did nothing: dropped
    assert tracker_settings(old, "mlflow") is None and old.learner.entry_data("grpo") is None


TRACKER_MODULE = '''
"""A tracker of this test: each metrics line appended to a JSONL file, then the status."""
import json
from pathlib import Path

from pydantic import Field

from relay_rl.services.tracking import TrackerSettings


class Settings(TrackerSettings):
    """`metrics.jsonl_copy`: copy the metrics lines into a file."""

    path: str = Field(..., min_length=1, description="File the lines are appended to.")


class Client:
    local = True

    def __init__(self, settings, info):
        self.file = Path(settings.path)

    def start(self):
        self.file.write_text("")

    def log(self, lines):
        with self.file.open("a") as f:
            f.writelines(json.dumps(line) + "\\n" for line in lines)

    def log_files(self, files):
        pass

    def finish(self, status):
        with self.file.open("a") as f:
            f.write(json.dumps({"status": status}) + "\\n")
'''


def test_a_new_tracker_is_its_module_and_one_registry_line(monkeypatch, tmp_path, capsys):
    (tmp_path / "jsonl_copy_tracker.py").write_text(textwrap.dedent(TRACKER_MODULE))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(TRACKERS, "jsonl_copy", ("jsonl_copy_tracker", "json"))

    out_file = tmp_path / "copy.jsonl"
    code, out, _ = _validate(capsys, f"metrics.jsonl_copy.path={out_file}")
    assert code == 0
    assert yaml.safe_load(out)["metrics"]["jsonl_copy"] == {"min_interval_s": 1.0, "path": str(out_file)}
    code, _, err = _validate(capsys, "metrics.jsonl_copy.min_interval_s=1")
    assert code == 2 and "metrics.jsonl_copy.path: Field required" in err
    assert main(["validate", "--help-config"]) == 0
    assert "metrics.jsonl_copy.path = (required)" in capsys.readouterr().out
    with pytest.raises(Exception, match="set by the sweep itself"):
        parse_params({"metrics.jsonl_copy.path": "choice(a, b)"})

    cfg = load_config(None, [f"metrics.jsonl_copy.path={out_file}", "metrics.jsonl_copy.min_interval_s=0"])
    resolve_sections(cfg)
    tracking = Tracking.from_config(cfg, RunInfo(tmp_path, config_data(cfg)))
    assert [t.name for t in tracking.trackers] == ["jsonl_copy"]
    for step in (100, 200):
        tracking.write({"env_steps": step, "iteration": step // 100, "loss": 0.5})
    tracking.close("FINISHED", [])
    got = [json.loads(line) for line in out_file.read_text().splitlines()]
    assert [g.get("env_steps") for g in got[:-1]] == [100, 200] and got[-1] == {"status": "FINISHED"}


@hyp_settings(max_examples=150, deadline=None)
@given(
    where=st.sampled_from(["learner", "model", "metrics"]),
    name=st.one_of(st.sampled_from(["grpo", "transformer", "mlflow", "wandb", "ppo", "lr", "kind"]), NAMES),
    leaf=st.one_of(st.sampled_from(["loss_agg", "d_model", "tracking_uri", "min_interval_s"]), NAMES),
    raw=st.text(max_size=20),
)
def test_any_section_given_resolves_or_is_one_line(where, name, leaf, raw):
    """Whatever section and leaf a --set names, build and resolve give a config whose sections are
    all their entries' (resolved), or one ConfigError line."""
    try:
        cfg = build_config({}, [f"{where}.{name}.{leaf}={raw}"])
        resolve_sections(cfg)
    except ConfigError as err:
        assert "\n" not in str(err) and len(str(err)) < 2000
    else:
        for part in ("learner", "model", "metrics"):
            for key, data in (getattr(cfg, part).model_extra or {}).items():
                assert data is None or f"{part}.{key}" in {p.rpartition(".")[0] for p, _, _ in all_leaves()}
