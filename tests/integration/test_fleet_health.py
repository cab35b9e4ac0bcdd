"""The fleet's health with real Ray and real stuck or dying envs (`tests/rollout_workers/
stuck_envs.py`): a worker stuck in `env.step` is named, killed and restarted and the run goes on; a
stop during such a hang ends in bounded time; a worker past max_restarts shrinks the fleet, said
once; below rollout.min_workers the run stops cleanly (checkpoint, exit 1, one line).

Each run is a subprocess with its own RAY_TMPDIR, so the Ray processes it starts are the ones
whose command lines name that folder."""

import signal
import time

import pytest

from relay_rl.services.runs.checkpoints import load_newest_valid
from tests.helpers_proc import metrics_lines, processes_mentioning, ray_env, start_train, wait_for

pytestmark = pytest.mark.ray
SMALL = ("rollout.num_workers=2", "learner.buffer_size=512", "rollout.rollout_len=32")


def _relay_lines(err: str) -> list[str]:
    return [x for x in err.splitlines() if x.startswith("relay")]


def test_a_stuck_worker_is_named_killed_restarted_and_the_run_goes_on(tmp_path, ray_tmp):
    marker = tmp_path / "hung"
    env = ["env.id=tests.rollout_workers.stuck_envs:make_hanging", f"env.kwargs={{marker: {marker}}}"]
    proc = start_train(
        tmp_path / "run",
        *SMALL,
        *env,
        "rollout.segment_timeout_s=3",
        "stop.env_steps=12000",
        env=ray_env(ray_tmp),
    )
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err[-2000:]
    assert marker.exists()  # one env did hang
    stuck = [x for x in _relay_lines(err) if "returned no segment" in x]
    assert len(stuck) == 1, err[-2000:]
    assert "rollout worker" in stuck[0] and "node " in stuck[0] and "killed, Ray restarts it" in stuck[0]
    last = metrics_lines(tmp_path / "run")[-1]
    assert last["stuck_workers"] == 1 and last["env_steps"] >= 12000 and last["num_workers"] == 2


def test_sigterm_during_a_hang_stops_in_bounded_time(tmp_path, ray_tmp):
    """Watchdog off: the learner waits on the stuck worker's segment; the stop ends the workers
    first, so the final checkpoint is written and the process exits within seconds."""
    marker = tmp_path / "hung"
    env = ["env.id=tests.rollout_workers.stuck_envs:make_hanging", f"env.kwargs={{marker: {marker}}}"]
    run = tmp_path / "run"
    proc = start_train(run, *SMALL, *env, "rollout.segment_timeout_s=null", env=ray_env(ray_tmp))
    wait_for(marker.exists, 180, "an env to hang")
    wait_for(lambda: len(metrics_lines(run)) >= 1, 60, "a metrics line")
    time.sleep(3)  # the run is stuck now
    t0 = time.perf_counter()
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    took = time.perf_counter() - t0
    assert proc.returncode == 143, err[-2000:]
    assert took < 40, took  # STOP_CHECKPOINT_S (30 s) bounds it; measured here in a few seconds
    assert load_newest_valid(run / "checkpoints")[1].counters.iteration == metrics_lines(run)[-1]["iteration"]
    wait_for(lambda: not processes_mentioning(ray_tmp), 30, "Ray's processes to end")


def _dying(tmp_path, ray_tmp, *sets: str):
    marker = tmp_path / "doomed"
    env = ["env.id=tests.rollout_workers.stuck_envs:make_dying", f"env.kwargs={{marker: {marker}}}"]
    return start_train(tmp_path / "run", *SMALL, *env, "rollout.max_restarts=1", *sets, env=ray_env(ray_tmp))


def test_a_worker_past_max_restarts_shrinks_the_fleet_said_once(tmp_path, ray_tmp):
    proc = _dying(tmp_path, ray_tmp, "rollout.min_workers=1", "stop.env_steps=15000")
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err[-2000:]
    lines = _relay_lines(err)
    shrank = [x for x in lines if "shrank" in x]
    assert len(shrank) == 1 and "shrank to 1 of 2 workers" in shrank[0], lines
    assert "rollout.max_restarts=1" in shrank[0]
    assert len([x for x in lines if "segment lost" in x]) <= 3  # aggregated, never one per segment
    assert "stopped: env_steps" in err  # the budget was reached on one worker
    assert metrics_lines(tmp_path / "run")[-1]["num_workers"] == 1


def test_below_min_workers_the_run_stops_cleanly_with_a_checkpoint(tmp_path, ray_tmp):
    proc = _dying(tmp_path, ray_tmp, "rollout.min_workers=2", "checkpoint.interval=1000")
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 1, err[-2000:]
    failed = [x for x in _relay_lines(err) if x.startswith("relay train:")]
    assert len(failed) == 1 and "fewer than rollout.min_workers=2" in failed[0], err[-2000:]
    run = tmp_path / "run"
    assert load_newest_valid(run / "checkpoints")[1].counters.iteration == metrics_lines(run)[-1]["iteration"]
    wait_for(lambda: not processes_mentioning(ray_tmp), 30, "Ray's processes to end")
