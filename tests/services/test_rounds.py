"""RoundResult.merge assembles the round the driver sees from the learners' parts, the weights rank
0 published and the driver's watchdog count: no layer edits another's result."""

from relay_rl.contracts.rounds import Publication, RoundResult


def part(**kw) -> RoundResult:
    base = {"env_steps": 100, "phases": {"wait_s": 0.1, "ingest_s": 0.2, "update_s": 0.3}}
    return RoundResult(**{**base, **kw})


def test_merge_adds_counts_keeps_rank_zero_metrics_and_the_slowest_phase():
    a = part(metrics={"loss": 1.0}, lost_segments=1, episode_returns=[1.0], amp_skipped_steps=2)
    b = part(metrics={"loss": 9.0}, rejected_segments=1, reject_reason="shape", episode_returns=[2.0])
    b.phases["update_s"] = 0.5
    out = RoundResult.merge([a, b])
    assert out.env_steps == 200 and out.lost_segments == 1 and out.rejected_segments == 1
    assert out.metrics == {"loss": 1.0} and out.amp_skipped_steps == 2 and out.reject_reason == "shape"
    assert out.episode_returns == [1.0, 2.0] and out.phases["update_s"] == 0.5
    assert out.published is None and out.stuck_workers == 0 and "publish_s" not in out.phases


def test_merge_carries_the_publication_and_the_stuck_workers():
    published = Publication(7, ["ref"], seconds=0.004)
    out = RoundResult.merge([part(metrics={"loss": 1.0})], published=published, stuck_workers=2)
    assert out.published is published and out.stuck_workers == 2
    assert out.phases["publish_s"] == 0.004
