"""Device ring buffer: preallocated, no allocation after construction, strict validation."""

import numpy as np
import pytest
import torch

from relay_rl.contracts.segment import Segment, SegmentLayout, SegmentRejected
from relay_rl.contracts.spaces import ActionSpec, EnvSpec
from relay_rl.learner.buffer import SegmentRingBuffer

SPEC = SegmentLayout(rollout_len=5, num_envs=3, env=EnvSpec((4,), ActionSpec("discrete", 2)))


def make_segment(fill: float = 0.0) -> Segment:
    seg = SPEC.allocate()
    for arr in seg.arrays.values():
        arr[...] = fill if arr.dtype.kind == "f" else 0
    seg["mask"][...] = 1.0
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
        (lambda s: s.arrays.update(obs=np.zeros((5, 3, 5), np.float32)), "shape"),
        (lambda s: s.arrays.update(rewards=np.zeros((5, 3), np.float64)), "dtype"),
        (lambda s: s["rewards"].__setitem__((0, 0), np.nan), "non-finite"),
        (lambda s: s["obs"].__setitem__((1, 1, 1), np.inf), "non-finite"),
        (lambda s: s.arrays.pop("mask"), "lacks field"),
    ],
)
def test_rejects_bad_segments_without_touching_storage(mutate, message):
    buf = SegmentRingBuffer(SPEC, capacity=2)
    buf.add(make_segment(1.0))
    seg = make_segment(2.0)
    mutate(seg)
    with pytest.raises(SegmentRejected, match=message):
        buf.add(seg)
    assert buf.pointer == 1 and buf.size == 1
    assert buf.storage["rewards"][1].abs().sum().item() == 0.0


def test_latest_slots_rejects_more_than_held():
    buf = SegmentRingBuffer(SPEC, capacity=2)
    buf.add(make_segment())
    with pytest.raises(ValueError, match="holds 1"):
        buf.latest_slots(2)


def test_uint8_observations_stay_uint8_in_the_buffer():
    """Image frames keep their dtype end to end: a quarter of float32's bytes."""
    layout = SegmentLayout(2, 3, EnvSpec((4, 8, 8), ActionSpec("discrete", 4), obs_dtype="uint8"))
    buf = SegmentRingBuffer(layout, capacity=2)
    assert buf.storage["obs"].dtype == torch.uint8
    seg = layout.allocate()
    seg["obs"][...] = 255
    seg["mask"][...] = 1.0
    buf.add(seg)
    assert int(buf.storage["obs"][0].max()) == 255
    assert layout.nbytes() == 2 * 3 * 4 * 8 * 8 + 2 * 3 * 8 + 2 * 3 * 4 * 7 + 3 * 4
