"""Device ring buffer: preallocated, no allocation after construction, strict validation."""

import numpy as np
import pytest
import torch

from learner.buffer import SegmentRejected, SegmentRingBuffer, SegmentSpec

SPEC = SegmentSpec(rollout_len=5, num_envs=3, obs_shape=(4,), action_shape=(), action_dtype=torch.int64)


def make_segment(fill: float = 0.0) -> dict:
    T, N = SPEC.rollout_len, SPEC.num_envs
    seg = {
        k: np.full((T, N), fill, dtype=np.float32)
        for k in ("logp", "values", "rewards", "terminated", "truncated", "bootstrap_value")
    }
    seg["mask"] = np.ones((T, N), dtype=np.float32)
    seg["obs"] = np.full((T, N, 4), fill, dtype=np.float32)
    seg["actions"] = np.zeros((T, N), dtype=np.int64)
    seg["last_value"] = np.full((N,), fill, dtype=np.float32)
    return seg


def test_ring_pointer_wraps_and_latest_slots_are_newest():
    buf = SegmentRingBuffer(SPEC, capacity=3)
    for i in range(5):
        assert buf.add(make_segment(float(i))) == i % 3
    assert buf.size == 3 and buf.fill == 1.0
    slots = buf.latest_slots(2)
    data = buf.gather(slots)
    assert data["rewards"].shape == (2, 5, 3)
    assert data["rewards"][:, 0, 0].tolist() == [3.0, 4.0]


def test_no_allocation_over_1000_adds():
    buf = SegmentRingBuffer(SPEC, capacity=4)
    pointers = {k: t.data_ptr() for k, t in buf.storage.items()}
    nbytes = buf.nbytes()
    for i in range(1000):
        buf.add(make_segment(float(i % 7)))
    assert {k: t.data_ptr() for k, t in buf.storage.items()} == pointers
    assert buf.nbytes() == nbytes
    assert buf.added == 1000


@pytest.mark.parametrize(
    "mutate, message",
    [
        (lambda s: s.update(obs=np.zeros((5, 3, 5), np.float32)), "shape"),
        (lambda s: s.update(rewards=np.zeros((5, 3), np.float64)), "dtype"),
        (lambda s: s["rewards"].__setitem__((0, 0), np.nan), "non-finite"),
        (lambda s: s["obs"].__setitem__((1, 1, 1), np.inf), "non-finite"),
        (lambda s: s.pop("mask"), "lacks field"),
    ],
)
def test_rejects_bad_segments_without_touching_storage(mutate, message):
    buf = SegmentRingBuffer(SPEC, capacity=2)
    buf.add(make_segment(1.0))
    seg = make_segment(2.0)
    mutate(seg)
    with pytest.raises(SegmentRejected, match=message):
        buf.add(seg)
    assert buf.rejected == 1
    assert buf.pointer == 1 and buf.size == 1
    assert buf.storage["rewards"][1].abs().sum().item() == 0.0


def test_latest_slots_rejects_more_than_held():
    buf = SegmentRingBuffer(SPEC, capacity=2)
    buf.add(make_segment())
    with pytest.raises(ValueError, match="holds 1"):
        buf.latest_slots(2)
