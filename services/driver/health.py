"""The rollout fleet's health: stuck workers found and restarted, dead ones dropped, said once.

A worker stuck in `env.step` never returns its segment; in sync mode the learner waits for it
forever. The watchdog (`services/driver/watchdog.py`) says when a worker is overdue; this kills it
(Ray restarts it, as after a crash), names it in one line and counts it. A worker Ray will not
restart any more (past `rollout.max_restarts`) leaves the fleet, said once; below
`rollout.min_workers` the run stops cleanly (FleetLost: final checkpoint, exit 1).

Who a worker is and where it runs come from Ray's actor table in the GCS (`ray._private.state`;
Ray's public state API needs the dashboard, which relay's local Ray does not start), never from a
call to the worker, which would queue behind the segment it owes.
"""

from __future__ import annotations

from typing import Any

import ray

from ...contracts.config import RelayConfig
from ...services.driver.notices import Notices
from ...services.driver.watchdog import SegmentWatchdog


class FleetLost(RuntimeError):
    """Fewer live rollout workers than rollout.min_workers: the run cannot go on."""


def actor_record(actor: Any) -> dict[str, Any]:
    """Ray's record of an actor: State (ALIVE, RESTARTING, DEAD, ...), Address.NodeID, Pid,
    NumRestarts; {} where Ray cannot say."""
    try:
        from ray._private import state

        record = state.actors(actor_id=actor._actor_id.hex())
    except Exception:  # a private API: if it moves, relay only loses detail in a message
        return {}
    return record if isinstance(record, dict) else {}


class FleetHealth:
    """The watchdog's verdicts carried out on the fleet's actors."""

    def __init__(self, cfg: RelayConfig, workers: list[Any]) -> None:
        self.cfg = cfg
        self.watchdog = SegmentWatchdog(cfg.rollout.segment_timeout_s)
        self.notices = Notices()
        self._index: dict[Any, int] = {}
        self._stuck = 0
        self.add(workers, 0)

    def add(self, workers: list[Any], first_index: int) -> None:
        for i, worker in enumerate(workers):
            self._index[worker] = first_index + i

    def _where(self, worker: Any) -> str:
        record = actor_record(worker)
        node = str((record.get("Address") or {}).get("NodeID") or "?")[:12]
        return f"rollout worker {self._index.get(worker, '?')} (node {node}, pid {record.get('Pid', '?')})"

    def kill_stuck(self) -> None:
        """Kill (Ray restarts it) every worker past its deadline; one line each, counted."""
        for worker, seconds in self.watchdog.overdue():
            self.notices.say(
                "stuck",
                f"{self._where(worker)} returned no segment for {seconds:.0f} s "
                f"(rollout.segment_timeout_s={self.cfg.rollout.segment_timeout_s}: "
                f"{self.watchdog.timeout_s():.0f} s); killed, Ray restarts it",
            )
            self.watchdog.forget(worker)
            ray.kill(worker, no_restart=False)  # type: ignore[arg-type]  # the watchdog keys are actors
            self._stuck += 1

    def take_stuck(self) -> int:
        """Workers killed as stuck since the last call (a round's count)."""
        n, self._stuck = self._stuck, 0
        return n

    def watch(self, calls: list[Any], sampling: dict[Any, Any]) -> None:
        """Wait for the learner's `calls` while the segments they fetch ({ref: worker}) come in,
        killing any worker that owes one past its deadline (which frees the learner's fetch)."""
        pending = dict(sampling)
        while pending and self.watchdog.enabled:
            done, _ = ray.wait(calls, num_returns=len(calls), timeout=self.watchdog.wait_s())
            if len(done) == len(calls):
                break
            finished, _ = ray.wait(list(pending), num_returns=len(pending), timeout=0, fetch_local=False)
            for ref in finished:
                self.watchdog.finished(pending.pop(ref), more=False)
            self.kill_stuck()
        for worker in pending.values():
            self.watchdog.finished(worker, more=False)

    def dead(self, workers: list[Any]) -> list[Any]:
        """The workers Ray has given up on."""
        return [w for w in workers if actor_record(w).get("State") == "DEAD"]

    def shrank(self, gone: int, left: int) -> None:
        """Say once that the fleet shrank and why; stop below rollout.min_workers."""
        ro = self.cfg.rollout
        self.notices.say(
            "shrank",
            f"{gone} rollout worker(s) died past rollout.max_restarts={ro.max_restarts}; the fleet "
            f"shrank to {left} of {ro.num_workers} workers",
        )
        if left < ro.min_workers:
            raise FleetLost(
                f"{left} live rollout workers, fewer than rollout.min_workers={ro.min_workers} "
                f"(workers died past rollout.max_restarts={ro.max_restarts})"
            )
