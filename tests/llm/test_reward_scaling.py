"""Reward normalization and clipping of a language run (`prompts.reward_norm`, `reward_clip`):
the running moments merged round by round are the plain moments of every reward at once, the
update trains on the scaled rewards while the metrics keep the scored ones, and a resumed run
goes on from its checkpoint's moments."""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from relay_rl.rollout_workers.lm.reward_scaling import RewardMoments, RewardScaling, plain_moments

finite = st.floats(min_value=-1e6, max_value=1e6, allow_nan=False)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.lists(finite, max_size=20), min_size=1, max_size=8))
def test_running_moments_merged_by_round_are_the_plain_moments(rounds):
    moments = RewardMoments()
    for values in rounds:
        moments.merge(values)
    seen = [v for values in rounds for v in values]
    assert moments.count == len(seen)
    if seen:
        mean, std = plain_moments(seen)
        assert moments.mean == pytest.approx(mean, rel=1e-9, abs=1e-6)
        assert moments.std == pytest.approx(std, rel=1e-6, abs=1e-6)


@settings(max_examples=100, deadline=None)
@given(
    st.lists(st.one_of(st.none(), finite), min_size=1, max_size=16),
    st.sampled_from(["none", "running"]),
    st.one_of(st.none(), st.floats(min_value=0.1, max_value=10)),
)
def test_scaled_rewards_keep_faults_and_stay_within_the_clip(rewards, norm, clip):
    scaling = RewardScaling(norm, clip)
    out = scaling(rewards)
    assert [r is None for r in out] == [r is None for r in rewards]  # a fault stays a fault
    got = [v for v in rewards if v is not None]
    for r, v in zip(rewards, out, strict=True):
        if r is None or v is None:
            continue
        if norm == "running":  # this round's own rewards are in the moments it is scaled by
            mean, std = plain_moments(got)
            want = (r - mean) / (std + 1e-8)
        else:
            want = r
        if clip is not None:
            want = min(max(want, -clip), clip)
            assert -clip <= v <= clip
        assert v == pytest.approx(want, rel=1e-6, abs=1e-6)


def test_a_checkpoints_moments_are_numbers_and_come_back():
    scaling = RewardScaling("running", None)
    scaling([1.0, 2.0, None, 4.0])
    again = RewardScaling("running", None)
    again.load_state_dict(json.loads(json.dumps(scaling.state_dict())))
    assert again.moments == scaling.moments
    again.load_state_dict(None)  # a checkpoint from before reward scaling existed
    assert again.moments.count == 0
    with pytest.raises(ValueError, match=r"prompts\.reward_norm='zscore': none or running"):
        RewardScaling("zscore", None)


def test_a_run_trains_on_normalized_rewards_and_resumes_its_moments(tmp_path, monkeypatch):
    """A local run with prompts.reward_norm=running and reward_clip: every update is handed the
    round's rewards less the running mean over the running std (all rewards so far), clipped;
    the metrics' reward_mean stays the scored rewards; a resume continues the moments."""
    from relay_rl.services.cli import main
    from relay_rl.services.driver.lm_backend import LanguageBackend
    from tests.lm_helpers import sevens_run

    folder = sevens_run(tmp_path)
    monkeypatch.chdir(folder)
    handed: list[list[float | None]] = []
    scale = LanguageBackend.step

    def spied(self, *args, **kwargs):
        train = self._learner.train

        def recording(rewards):
            handed.append(list(rewards))
            return train(rewards)

        self._learner.train = recording
        try:
            return scale(self, *args, **kwargs)
        finally:
            self._learner.train = train

    monkeypatch.setattr(LanguageBackend, "step", spied)
    run = folder / "runs" / "normed"
    sets = ["prompts.reward_norm=running", "prompts.reward_clip=2.5"]
    sets += ["stop.iterations=3", "stop.env_steps=null"]
    args = ["train", "run.yaml", "--run-dir", str(run)]
    for kv in sets:
        args += ["--set", kv]
    assert main(args) == 0
    lines = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert len(lines) == len(handed) == 3
    # regex:7 scores 0 or 1: the rewards so far are the lines' reward_means, each of 32 completions
    for k, line in enumerate(lines):
        p = sum(x["reward_mean"] for x in lines[: k + 1]) / (k + 1)
        assert line["reward_norm_mean"] == pytest.approx(p)
        assert line["reward_norm_std"] == pytest.approx(math.sqrt(p * (1 - p)))
        # what the update took: each scored 0 or 1, scaled by the moments so far and clipped
        scaled = [min(max((r - p) / (math.sqrt(p * (1 - p)) + 1e-8), -2.5), 2.5) for r in (0.0, 1.0)]
        assert all(min(abs(v - s) for s in scaled) < 1e-6 for v in handed[k] if v is not None)
        assert sum(v == pytest.approx(scaled[1]) for v in handed[k]) == round(line["reward_mean"] * 32)
    assert main(["resume", str(run), "--set", "stop.iterations=4"]) == 0
    more = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    p = sum(x["reward_mean"] for x in more) / 4
    assert more[-1]["reward_norm_mean"] == pytest.approx(p)  # the first 3 rounds' moments came back
