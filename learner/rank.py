"""What every learner actor is as a member of the learner group (`services/driver/learner_group.py`):
rank 0 hosts the rendezvous, every rank joins one torch process group on its device's backend
(gloo on CPUs, NCCL on GPUs, HCCL on NPUs: `learner/device.py`)."""

from __future__ import annotations

import socket
from pathlib import Path

import ray

from ..learner.device import DeviceContext
from ..learner.distributed import init_group, world_size


class LearnerRank:
    """The group calls of a learner actor; the actor sets `dev` (the device its learner trains on)."""

    dev: DeviceContext
    rank = 0  # in the learner group: rank 0 publishes weights and reports the run-wide metrics

    def rendezvous(self) -> tuple[str, int]:
        """Address and a free port on this node for the learners' process group (rank 0 hosts it)."""
        with socket.socket() as s:
            s.bind(("", 0))
            port = s.getsockname()[1]
        return ray.util.get_node_ip_address(), port

    def join_group(self, rank: int, world: int, address: str, port: int, timeout_s: float = 1800.0) -> int:
        """Join the group as `rank` of `world` (blocks until every rank has joined); a collective
        waiting `timeout_s` for its peers fails."""
        init_group(self.dev, rank, world, address, port, timeout_s)
        self.rank = rank
        return rank

    def world(self) -> int:
        """Ranks in this rank's process group (1 where it trains alone)."""
        return world_size()

    def node(self) -> str:
        """The Ray node this rank runs on."""
        return str(ray.get_runtime_context().get_node_id())

    def sees(self, path: str, token: str) -> bool:
        """Whether this rank reads the file the driver wrote at `path` with `token` in it: the
        storage a sharded checkpoint's ranks write to is the driver's."""
        try:
            return Path(path).read_text() == token
        except OSError:
            return False
