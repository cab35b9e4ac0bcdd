"""The driver loop against a scripted backend (no sampling, no learning): stop criteria, counters
owned by the driver, checkpoints on the interval and at the end, a lost learner restored through
the same path as a resume, Ctrl-C and SIGTERM, and giving up when no round updates."""

import json
import time
from collections.abc import Callable

import pytest
import torch

from relay_rl.contracts.config import build_config
from relay_rl.contracts.rounds import RoundResult
from relay_rl.contracts.spaces import ActionSpec, EnvSpec
from relay_rl.services.driver.loop import LearnerLost, NoProgressError, TrainingLoop
from relay_rl.services.runs.checkpoints import list_checkpoints, load_newest_valid
from relay_rl.services.runs.run_dir import RunDir
from relay_rl.services.runs.signals import Terminated


class FakeBackend:
    """Rounds from a script: `rounds(i)` gives round i's result, or raises."""

    env_spec = EnvSpec((4,), ActionSpec("discrete", 2))
    sharded_checkpoints = False
    num_workers = 3

    def __init__(self, rounds: Callable[[int], RoundResult]) -> None:
        self.rounds = rounds
        self.calls = 0
        self.version = 0
        self.loaded: list[int] = []
        self.restarts = 0
        self.reseeded: list[int] = []

    def describe(self) -> dict:
        return {"mode": "fake"}

    def step(self, progress: float, ahead: bool = False, state_after: bool = False) -> RoundResult:
        self.calls += 1
        out = self.rounds(self.calls)
        out.phases = {"wait_s": 0.0, "ingest_s": 0.0, "update_s": 0.0, "publish_s": 0.0}
        if out.metrics is not None:
            self.version += 1
        return out

    def state_dict(self, timeout_s: float | None = None) -> dict:
        return {"model": {"w": torch.tensor([float(self.version)])}, "version": self.version}

    def drain(self, timeout_s: float | None = None) -> RoundResult | None:
        return None  # its rounds never run ahead

    def taken(self) -> None:
        pass

    def stop_sampling(self) -> None:
        self.stopped_sampling = True

    def worker_pids(self) -> list[int]:
        return []

    def load_state_dict(self, state: dict) -> None:
        self.version = int(state["version"])
        self.loaded.append(self.version)

    def restart_learner(self) -> None:
        self.restarts += 1
        self.version = 0

    def reseed_workers(self, stream: int) -> None:
        self.reseeded.append(stream)

    def close(self) -> None:
        pass


def updated(steps: int = 100, returns=(10.0,), **extra) -> RoundResult:
    return RoundResult(
        env_steps=steps,
        episode_returns=list(returns),
        episode_lengths=[10] * len(returns),
        metrics={"lr": 1e-3},
        **extra,
    )


def _loop(tmp_path, rounds, *sets: str) -> TrainingLoop:
    cfg = build_config(
        {}, ["metrics.progress=none", "metrics.tensorboard=false", "rollout.num_workers=0", *sets]
    )
    return TrainingLoop(cfg, RunDir.claim(tmp_path / "run", cfg), FakeBackend(rounds))


def _lines(loop) -> list[dict]:
    return [json.loads(x) for x in loop.run.metrics_path.read_text().splitlines()]


def test_stops_on_the_step_budget_with_checkpoints_on_the_interval_and_at_the_end(tmp_path):
    loop = _loop(
        tmp_path, lambda i: updated(), "stop.env_steps=1050", "checkpoint.interval=4", "checkpoint.keep=5"
    )
    assert loop.run_until_stop() == "env_steps"
    lines = _lines(loop)
    assert [x["iteration"] for x in lines] == list(range(1, 12))
    assert lines[-1]["env_steps"] == 1100 and lines[-1]["episodes"] == 11
    names = [p.name for p in list_checkpoints(loop.run.checkpoints)]
    assert names == ["ckpt-00000004.pt", "ckpt-00000008.pt", "ckpt-00000011.pt"]
    ckpt = load_newest_valid(loop.run.checkpoints)[1]
    assert ckpt.counters.iteration == 11 and ckpt.env == FakeBackend.env_spec


def test_the_step_budget_ends_on_a_round_that_updated(tmp_path):
    """A round that did not update (a segment lost: the learner's buffer is not full) still counts
    its steps; the budget met by it waits for the next update, so the last line counts the budget
    (before, it said 900 of a 1,000-step budget: seen under load in the stuck-worker test)."""
    loop = _loop(
        tmp_path, lambda i: RoundResult(env_steps=100) if i == 10 else updated(), "stop.env_steps=1000"
    )
    assert loop.run_until_stop() == "env_steps"
    lines = _lines(loop)
    assert len(lines) == 10 and lines[-1]["env_steps"] == 1100


def test_the_return_target_needs_a_full_window(tmp_path):
    loop = _loop(tmp_path, lambda i: updated(returns=(500.0,) * 3), "stop.episode_return_mean=475")
    assert loop.run_until_stop() == "episode_return_mean"
    assert loop.c.iteration == 7  # 21 episodes: the first time 20 are in the window


def test_the_driver_owns_the_run_counters_and_sums_round_deltas(tmp_path):
    def rounds(i):
        extra = {"rejected_segments": 1, "env_faults": {"raised": 1, "nonfinite_obs": 2}} if i % 2 else {}
        return updated(amp_skipped_steps=1, worker_restarts=int(i == 3), lost_segments=int(i == 4), **extra)

    loop = _loop(tmp_path, rounds, "stop.env_steps=400")
    loop.run_until_stop()
    last = _lines(loop)[-1]
    assert last["rejected_segments"] == 2 and last["amp_skipped_steps"] == 4
    assert last["worker_restarts"] == 1 and last["lost_segments"] == 1
    assert (
        last["env_faults_raised"] == 2 and last["env_faults_nonfinite_obs"] == 4 and last["env_faults"] == 6
    )


def test_a_lost_learner_is_restored_from_the_newest_checkpoint_and_counters_go_on(tmp_path):
    def rounds(i):
        if i == 6:
            raise LearnerLost("actor died")
        return updated()

    loop = _loop(tmp_path, rounds, "stop.env_steps=800", "checkpoint.interval=2")
    assert loop.run_until_stop() == "env_steps"
    assert loop.backend.restarts == 1 and loop.backend.loaded == [4]  # the newest checkpoint's version
    lines = _lines(loop)
    assert [x["iteration"] for x in lines] == list(range(1, 9)) and lines[-1]["learner_restarts"] == 1
    assert loop.backend.reseeded == []  # a recovery keeps the workers' streams (a resume does not)


def test_a_learner_that_keeps_dying_ends_the_run(tmp_path):
    def rounds(i):
        raise LearnerLost("actor died")

    loop = _loop(tmp_path, rounds)
    with pytest.raises(RuntimeError, match="learner died 4 times"):
        loop.run_until_stop()


def test_rounds_that_never_update_give_up_with_the_reason(tmp_path):
    loop = _loop(
        tmp_path, lambda i: RoundResult(rejected_segments=1, reject_reason="segment field 'obs' has shape")
    )
    with pytest.raises(NoProgressError, match="no update in 20 rounds in a row: segment field 'obs'"):
        loop.run_until_stop()


@pytest.mark.parametrize("signal, reason", [(KeyboardInterrupt, "interrupted"), (Terminated, "terminated")])
def test_ctrl_c_and_sigterm_stop_cleanly_with_a_final_checkpoint(tmp_path, signal, reason):
    def rounds(i):
        if i == 4:
            raise signal()
        return updated()

    loop = _loop(tmp_path, rounds, "checkpoint.interval=100")
    assert loop.run_until_stop() == reason
    assert [p.name for p in list_checkpoints(loop.run.checkpoints)] == ["ckpt-00000003.pt"]
    assert len(_lines(loop)) == 3


def test_restore_with_counters_continues_the_run(tmp_path):
    loop = _loop(tmp_path, lambda i: updated(), "stop.env_steps=500", "checkpoint.interval=2")
    loop.run_until_stop()
    with loop.run.metrics_path.open("a") as f:  # a line past the checkpoint, from a crash
        f.write(json.dumps({"iteration": 6}) + "\n")
    again = TrainingLoop(loop.cfg.model_copy(), loop.run, FakeBackend(lambda i: updated()))
    again.restore(load_newest_valid(loop.run.checkpoints)[1], counters=True)
    assert again.c.iteration == 5 and again.c.env_steps == 500 and again.backend.reseeded == [5]
    assert [x["iteration"] for x in _lines(loop)] == [1, 2, 3, 4, 5]


def test_each_line_says_where_the_time_went(tmp_path):
    """Seconds by phase, summed over the rounds behind a line, and the learner's busy fraction."""

    def rounds(i):
        out = updated() if i % 2 == 0 else RoundResult(env_steps=50)
        return out

    class Timed(FakeBackend):
        def step(self, progress, ahead=False, state_after=False):
            out = super().step(progress, ahead, state_after)
            time.sleep(0.02)
            out.phases = {"wait_s": 0.01, "ingest_s": 0.001, "update_s": 0.004, "publish_s": 0.0}
            return out

    cfg = build_config({}, ["metrics.progress=none", "metrics.tensorboard=false", "rollout.num_workers=0"])
    loop = TrainingLoop(
        cfg.model_copy(update={"stop": cfg.stop.model_copy(update={"env_steps": 600})}),
        RunDir.claim(tmp_path / "run", cfg),
        Timed(rounds),
    )
    loop.run_until_stop()
    lines = _lines(loop)
    assert all(x["num_workers"] == 3 for x in lines)
    # Two rounds per line (one without an update): their phases add up.
    assert all(abs(x["wait_s"] - 0.02) < 1e-9 and abs(x["update_s"] - 0.008) < 1e-9 for x in lines[1:])
    assert all(0.1 < x["learner_busy"] < 0.5 for x in lines[1:])  # 10 ms of ~40 ms
