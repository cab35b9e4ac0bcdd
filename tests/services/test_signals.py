"""SIGTERM (Kubernetes, `ray job stop`, `timeout`) stops a run like Ctrl-C: metrics flushed, a
final checkpoint at the last metrics line, exit 143 (Ctrl-C: 130). Local mode here; the Ray
mode, with its actors, is in tests/integration/test_clusters.py."""

import signal

import pytest

from services.driver.checkpoints import list_checkpoints, load_newest_valid
from tests.helpers_proc import metrics_lines, start_train, wait_for

LOCAL = ("rollout.num_workers=0", "learner.buffer_size=512", "checkpoint.interval=1000")


@pytest.mark.parametrize(
    "sig, code, word", [(signal.SIGTERM, 143, "terminated"), (signal.SIGINT, 130, "interrupted")]
)
def test_a_signal_stops_the_run_cleanly_with_a_final_checkpoint(tmp_path, sig, code, word):
    run = tmp_path / "run"
    proc = start_train(run, *LOCAL)
    wait_for(lambda: len(metrics_lines(run)) >= 3, 120, "three iterations")
    assert not list_checkpoints(run / "checkpoints")  # the interval is far away
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == code, err
    assert f"stopped: {word}" in err and "Traceback" not in err
    lines = metrics_lines(run)
    path, ckpt = load_newest_valid(run / "checkpoints")
    assert ckpt.counters.iteration == lines[-1]["iteration"] == len(lines)
    assert path.name == f"ckpt-{len(lines):08d}.pt"
