"""The elastic fleet's decisions, from metrics lines alone: grow while the learner starves and
nothing waits for it, shrink while it is saturated and segments queue, within bounds, and only
after PATIENCE lines in a row agree."""

from relay_rl.services.driver.fleet import PATIENCE, FleetScaler


def _run(scaler: FleetScaler, lines: list[tuple[float, int]], workers: int) -> list[int]:
    sizes = []
    for busy, backlog in lines:
        workers = scaler.decide(busy, backlog, workers)
        sizes.append(workers)
    return sizes


def test_a_starving_learner_grows_the_fleet_one_worker_per_patience_lines_up_to_the_max():
    sizes = _run(FleetScaler(1, 3), [(0.2, 0)] * (4 * PATIENCE), workers=1)
    assert sizes[PATIENCE - 2] == 1 and sizes[PATIENCE - 1] == 2
    assert sizes[2 * PATIENCE - 1] == 3 and sizes[-1] == 3  # never past max_workers


def test_a_saturated_learner_with_a_queue_shrinks_it_down_to_the_min():
    sizes = _run(FleetScaler(2, 8), [(0.97, 5)] * (5 * PATIENCE), workers=4)
    assert sizes[PATIENCE - 1] == 3 and sizes[-1] == 2


def test_a_queue_seen_in_one_of_the_lines_is_enough_to_shrink():
    """How many segments wait at the instant a line is written swings with timing."""
    sizes = _run(FleetScaler(1, 8), [(0.95, 0), (0.95, 3), (0.95, 0)], workers=4)
    assert sizes == [4, 4, 3]


def test_no_change_without_a_queue_or_with_one_waiting_and_noisy_lines_reset_the_count():
    scaler = FleetScaler(1, 8)
    assert _run(scaler, [(0.97, 0)] * 10, workers=4) == [4] * 10  # busy but nothing queued: fine
    assert _run(scaler, [(0.2, 3)] * 10, workers=4) == [4] * 10  # idle but segments wait: fine
    noisy = [(0.2, 0), (0.2, 0), (0.7, 0)] * 5  # never PATIENCE starving lines in a row
    assert _run(scaler, noisy, workers=4) == [4] * 15
