"""Config: defaults, overrides, unknown keys, cross-field rules with numbers, shipped configs."""

from pathlib import Path

import pytest
import yaml

from relay_rl.contracts.config import ConfigError, RelayConfig, build_config, dump_config, load_config
from relay_rl.services.driver.preflight import check_config

CONFIGS = sorted((Path(__file__).parents[2] / "configs").glob("*.yaml"))
# what the benchmarks train that is not shipped (a baseline a shipped config is measured against)
BENCHMARK_CONFIGS = sorted((Path(__file__).parents[2] / "benchmarks" / "configs").glob("*.yaml"))


def test_defaults_are_valid_and_every_field_is_documented():
    cfg = RelayConfig()
    assert cfg.learner.algo == "ppo"

    def walk(model_cls):
        for name, field in model_cls.model_fields.items():
            assert field.description, f"{model_cls.__name__}.{name} has no description"
            ann = field.annotation
            if isinstance(ann, type) and hasattr(ann, "model_fields"):
                walk(ann)

    walk(RelayConfig)


def test_overrides_parse_yaml_values():
    cfg = build_config(
        {}, ["learner.lr=1e-3", "model.hidden_sizes=[32, 32]", "stop.wall_s=null", "learner.use_amp=true"]
    )
    assert cfg.learner.lr == 1e-3 and cfg.model.hidden_sizes == [32, 32]
    assert cfg.stop.wall_s is None and cfg.learner.use_amp is True


def test_unknown_keys_are_errors():
    with pytest.raises(ConfigError, match=r"learner.lrr: unknown key"):
        build_config({"learner": {"lrr": 1}})
    with pytest.raises(ConfigError, match="unknown key"):
        build_config({}, ["nosuchsection.x=1"])


def test_cross_field_messages_name_fields_and_numbers():
    with pytest.raises(ConfigError) as err:
        build_config(
            {},
            [
                "learner.buffer_size=1024",
                "rollout.num_workers=2",
                "rollout.rollout_len=128",
                "env.num_envs=8",
            ],
        )
    msg = str(err.value)
    assert "learner.buffer_size=1024 holds fewer than one round of segments" in msg
    assert "rollout.num_workers=2 x rollout.rollout_len=128 x env.num_envs=8 = 2048 steps" in msg
    assert "\n" not in msg


def test_all_cross_field_problems_are_reported_together():
    with pytest.raises(ConfigError) as err:
        build_config({}, ["env.num_envs=10", "learner.group_size=4", "learner.batch_size=3000"])
    msg = str(err.value)
    assert "env.num_envs=10 is not divisible by learner.group_size=4" in msg
    assert "learner.batch_size=3000" in msg


def test_grpo_needs_groups_and_no_stop_criterion_is_an_error():
    with pytest.raises(ConfigError, match="group_size >= 2"):
        check_config(build_config({}, ["learner.algo=grpo"]))
    with pytest.raises(ConfigError, match="no stop criterion"):
        build_config({}, ["stop.env_steps=null", "learner.lr_anneal=false"])


def test_bad_yaml_and_missing_file(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        load_config(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("env: [unclosed\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(bad)


@pytest.mark.parametrize("path", CONFIGS + BENCHMARK_CONFIGS, ids=lambda p: p.name)
def test_shipped_configs_validate_and_round_trip(path):
    cfg = load_config(path)
    again = build_config(yaml.safe_load(dump_config(cfg)))
    assert again == cfg


def test_required_configs_are_shipped():
    names = {p.name for p in CONFIGS}
    assert {"cartpole_ppo.yaml", "pendulum_ppo.yaml", "cartpole_grpo.yaml"} <= names


def test_secrets_are_redacted_wherever_a_config_is_written():
    """URI passwords in any string, and leaves named like secrets, are *** in what relay writes or
    sends (config.yaml, checkpoints, exports, trackers); the live config keeps them."""
    from relay_rl.contracts.config import config_data, dump_config, redact_text
    from relay_rl.services.tracking import tracker_settings

    cfg = load_config(
        str(Path(__file__).parents[2] / "configs/cartpole_ppo.yaml"),
        [
            "metrics.mlflow.tracking_uri=https://alice:s3cr%40t@mlflow.example:5000/x",
            "env.kwargs={api_key: abc123, max_new_tokens: 4, note: 'see http://bob:pw@h/ and ftp://h/'}",
        ],
    )
    data = config_data(cfg)
    assert data["metrics"]["mlflow"]["tracking_uri"] == "https://alice:***@mlflow.example:5000/x"
    assert data["env"]["kwargs"] == {
        "api_key": "***",
        "max_new_tokens": 4,
        "note": "see http://bob:***@h/ and ftp://h/",
    }
    text = dump_config(cfg)
    assert "s3cr" not in text and "abc123" not in text and "bob:pw" not in text
    assert tracker_settings(cfg, "mlflow").tracking_uri.startswith("https://alice:s3cr")  # in memory only
    assert (
        redact_text("failed: http://u:p@127.0.0.1:1/api (refused)")
        == "failed: http://u:***@127.0.0.1:1/api (refused)"
    )
    assert redact_text("http://127.0.0.1:5000 a:b@c") == "http://127.0.0.1:5000 a:b@c"


LANGUAGE_RUN = {
    "model": {"kind": "causal_lm", "path": "m"},
    "prompts": {"train": "p.jsonl", "rewards": ["exact_match"]},
}


PREFERENCE_RUN = {"model": {"kind": "reward_model", "path": "m"}, "prompts": {"train": "pairs.jsonl"}}


def _validate_all(overrides: list[str]) -> None:
    """Resolve the sections of a config with `overrides`: an env run's, or a language or reward
    model's run's where they set a learner section only such runs have."""
    from relay_rl.services.runs.config_sections import entry_sections, resolve_sections

    base: dict = {}
    for family, run in (("language", LANGUAGE_RUN), ("preference", PREFERENCE_RUN)):
        only = set(entry_sections(family)) - set(entry_sections("env"))
        if any(".".join(kv.split(".")[:2]) in only for kv in overrides):
            base = run
    resolve_sections(build_config(base, overrides))


def test_true_or_false_is_never_read_as_a_number():
    """Pydantic's lax mode reads true as 1: `env.num_envs: true` ran one env. Every numeric leaf,
    the registry entries' own sections included, refuses a bool in one line naming it; every
    yes/no leaf still takes one."""
    from relay_rl.services.runs.config_sections import all_leaves

    numeric = bools = 0
    for path, default, _ in all_leaves():
        if isinstance(default, bool):
            try:  # a yes/no leaf may need others set with it (autoscale needs async): not this rule
                _validate_all([f"{path}=true"])
            except ConfigError as err:
                assert "true/false" not in str(err)
            bools += 1
        elif isinstance(default, int | float):
            with pytest.raises(ConfigError, match=rf"{path}: true/false is not a value of this setting"):
                _validate_all([f"{path}=true"])
            numeric += 1
    assert numeric > 40 and bools > 10
    # inside lists and mappings of numbers too, and whatever else the leaf holds
    for bad in ("env.actions=[0, true]", "model.hidden_sizes=[64, false]", "learner.ray_resources={x: true}"):
        with pytest.raises(ConfigError, match=r": true/false is not a value of this setting$"):
            _validate_all([bad])
    # where a bool is one of the leaf's values, or the leaf holds anything, it stays one
    cfg = build_config({}, ["learner.use_amp=false", "env.kwargs={render: true, size: [1, true]}"])
    assert cfg.learner.use_amp is False and cfg.env.kwargs == {"render": True, "size": [1, True]}
