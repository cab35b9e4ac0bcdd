"""The stuck-worker watchdog's arithmetic on a fake clock, local mode's report of a stuck env, and
the aggregation of repeated warnings."""

import io
import time

import pytest

from relay_rl.services.driver.notices import Notices
from relay_rl.services.driver.watchdog import AUTO_FIRST_S, AUTO_FLOOR_S, LocalStuckReporter, SegmentWatchdog


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def test_auto_timeout_waits_long_before_the_first_segment_then_follows_the_slowest():
    clock = Clock()
    dog = SegmentWatchdog("auto", clock)
    assert dog.timeout_s() == AUTO_FIRST_S
    dog.started("w0")
    clock.t += 2.0
    dog.finished("w0", more=True)
    assert dog.timeout_s() == AUTO_FLOOR_S  # 10 x 2 s is under the floor
    clock.t += 9.0
    dog.finished("w0", more=False)
    assert dog.timeout_s() == 90.0  # 10 x the slowest (9 s)
    assert dog.overdue() == [] and dog.wait_s() is None  # nobody owes a segment


def test_a_worker_past_its_deadline_is_overdue_and_the_wait_never_oversleeps_it():
    clock = Clock()
    dog = SegmentWatchdog(3.0, clock)
    dog.started("w0")
    clock.t += 1.0
    dog.started("w1")
    assert 0 < dog.wait_s() <= 2.0 + 1e-9  # w0's deadline comes first
    clock.t += 2.5
    assert dog.overdue() == [("w0", pytest.approx(3.5))]
    dog.forget("w0")
    clock.t += 1.0
    assert [w for w, _ in dog.overdue()] == ["w1"]


def test_off_means_no_deadline():
    dog = SegmentWatchdog(None, Clock())
    dog.started("w0")
    assert not dog.enabled and dog.overdue() == [] and dog.wait_s() is None


def test_local_mode_names_where_a_stuck_sample_is():
    out = io.StringIO()
    reporter = LocalStuckReporter(SegmentWatchdog(0.2), out)
    with reporter:
        time.sleep(0.6)  # the "env" that does not return
    lines = out.getvalue().strip().splitlines()
    assert len(lines) == 1 and reporter.reports == 1
    assert "local mode cannot restart it" in lines[0] and "test_watchdog.py" in lines[0]
    with reporter:
        pass  # a sample in time says nothing
    assert len(out.getvalue().strip().splitlines()) == 1


def test_repeated_warnings_are_one_line_then_a_count_per_interval():
    clock, out = Clock(), io.StringIO()
    notices = Notices(30.0, out, clock)
    for _ in range(2306):  # what a dead worker's segments used to print, one line each
        notices.say("lost", "segment lost: its rollout worker failed")
        clock.t += 0.01
    notices.say("other", "something else")
    notices.close()
    lines = out.getvalue().strip().splitlines()
    assert lines[0] == "relay: segment lost: its rollout worker failed"
    assert len(lines) == 3  # the first, the other kind, and one count for the ~23 s since
    counted = sum(int(x.split("(x")[1].split(" ")[0]) for x in lines if "(x" in x)
    assert counted == 2305
