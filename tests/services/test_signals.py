"""SIGTERM (Kubernetes, `ray job stop`, `timeout`) stops a run like Ctrl-C: metrics flushed, a
final checkpoint at the last metrics line, exit 143 (Ctrl-C: 130). Local mode here; the Ray
mode, with its actors, is in tests/integration/test_clusters.py."""

import os
import signal
import subprocess
import sys
import threading

import pytest

from relay_rl.services.runs.checkpoints import list_checkpoints, load_newest_valid
from relay_rl.services.runs.signals import (
    Terminated,
    raise_pending,
    signals_held,
    sigterm_raises,
    stop_reason,
)
from tests.helpers_proc import ROOT, metrics_lines, start_train, wait_for

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


# A signal that lands in an at-fork callback (as when Ray starts its processes) has its exception
# dropped by Python ("Exception ignored in: ..."); the stop must survive that.
DROPPED_AT_FORK = """
import os, signal, sys, time
from relay_rl.services.runs.signals import raise_pending, sigterm_raises, stop_reason

def land_here():  # the signal arrives while Python runs an at-fork callback
    os.kill(os.getpid(), signal.{sig})
    time.sleep(0.2)

os.register_at_fork(after_in_parent=land_here)
with sigterm_raises():
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)
    print("survived the fork", flush=True)
    try:
        raise_pending()
    except KeyboardInterrupt as err:
        print("raised", type(err).__name__, stop_reason(err), flush=True)
    raise_pending()  # taken: nothing left to raise
    print("taken", flush=True)
"""


@pytest.mark.parametrize(
    "sig, kind, word",
    [("SIGINT", "KeyboardInterrupt", "interrupted"), ("SIGTERM", "Terminated", "terminated")],
)
def test_a_stop_whose_exception_python_dropped_is_raised_later(sig, kind, word):
    proc = subprocess.run(
        [sys.executable, "-c", DROPPED_AT_FORK.format(sig=sig)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    # The signal's exception was dropped (the failure this guards against), and quietly: Python's
    # "Exception ignored in ..." traceback is not printed, the stop is raised instead.
    assert proc.stderr == ""
    assert proc.stdout.splitlines() == ["survived the fork", f"raised {kind} {word}", "taken"]


def test_later_sigterms_are_ignored_once_one_was_taken():
    with sigterm_raises():
        with pytest.raises(Terminated) as caught:
            os.kill(os.getpid(), signal.SIGTERM)  # the handler runs before kill returns to Python
        assert stop_reason(caught.value) == "terminated"
        os.kill(os.getpid(), signal.SIGTERM)  # the clean stop is under way: not cut short
        raise_pending()  # and nothing is left pending


def _signal_on_another_thread(sig: int) -> None:
    """The kernel hands a process-wide signal to any thread that does not block it (Ray and Tune
    run several): here a helper thread takes it, and Python runs the handler in the main thread."""
    helper = threading.Thread(target=lambda: signal.pthread_kill(threading.get_ident(), sig))
    helper.start()
    helper.join()


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP])
def test_a_held_stop_taken_by_another_thread_arrives_once_after_the_block(sig):
    """The hold once blocked the main thread's mask only, and a second Ctrl-C taken by one of
    Ray's threads cut a sweep's cleanup short (exit 1). Each of the three stop signals waits."""
    seen: list[str] = []
    previous = signal.signal(sig, lambda *_: seen.append("handled"))
    try:
        with signals_held():
            _signal_on_another_thread(sig)
            for _ in range(10_000):  # bytecode boundaries, where Python runs pending handlers
                pass
            os.kill(os.getpid(), sig)  # and one the main thread may take itself
            seen.append("cleanup done")
        assert seen == ["cleanup done", "handled", "handled"]
    finally:
        signal.signal(sig, previous)


def test_a_held_ctrl_c_raises_after_the_cleanup_as_it_would_have_without_the_hold():
    done = []
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(KeyboardInterrupt), signals_held():
            _signal_on_another_thread(signal.SIGINT)
            for _ in range(10_000):
                pass
            done.append(True)
        assert done == [True]
    finally:
        signal.signal(signal.SIGINT, previous)


def test_a_ctrl_c_during_a_local_update_waits_for_the_update_and_counts_its_round(tmp_path, monkeypatch):
    """Local mode learns in the driver's own thread, so a Ctrl-C there used to land between two
    optimizer steps: the final checkpoint held weights halfway through round k under iteration
    k - 1. Now the update finishes, its round is counted, and the checkpoint is the one an
    uninterrupted run of k rounds writes, bit for bit (a seed fixes a local run)."""
    import torch

    from relay_rl.learner.learner import Learner
    from relay_rl.services.runs.checkpoints import load_checkpoint
    from tests.helpers import interrupt_during_update, train_local

    sets = (
        "learner.buffer_size=512",
        "learner.lr_anneal=false",  # the budget would set the learning rate
        "checkpoint.interval=1000",
        "stop.episode_return_mean=null",
    )
    assert train_local("cartpole_ppo.yaml", tmp_path / "whole", *sets, "stop.env_steps=1024") == 0

    interrupt_during_update(monkeypatch, Learner, "train_round", update=4)
    assert train_local("cartpole_ppo.yaml", tmp_path / "cut", *sets, "stop.env_steps=1000000") == 130
    assert len(metrics_lines(tmp_path / "cut")) == 4
    whole = load_checkpoint(list_checkpoints(tmp_path / "whole" / "checkpoints")[-1])
    cut = load_checkpoint(list_checkpoints(tmp_path / "cut" / "checkpoints")[-1])
    assert cut.counters.iteration == whole.counters.iteration == cut.learner["version"] == 4
    for name, tensor in whole.learner["model"].items():
        assert torch.equal(cut.learner["model"][name], tensor), name


def test_a_stop_signal_waits_until_every_learner_rank_has_the_call():
    """The learner group submits a call to every rank as one (`LearnerGroup.each`): a SIGTERM
    between two ranks' submissions arrives after the last, so no rank is left without a call its
    peers make collectives in (the stop's final checkpoint would meet them out of step). The
    ranks are stand-ins: what is checked is the submission, not Ray."""
    import signal

    from relay_rl.services.driver.learner_group import LearnerGroup

    class Stop(Exception):
        pass

    def stop(signum: int, frame: object) -> None:
        raise Stop

    group = LearnerGroup.__new__(LearnerGroup)  # its submissions only: no cluster
    group.ranks = [0, 1, 2]
    given: list[int] = []

    def call(rank: int) -> int:
        given.append(rank)
        if rank == 0:
            signal.raise_signal(signal.SIGTERM)  # between rank 0's submission and rank 1's
        return rank

    old = signal.signal(signal.SIGTERM, stop)
    try:
        with pytest.raises(Stop):
            group.each(call)
    finally:
        signal.signal(signal.SIGTERM, old)
    assert given == [0, 1, 2]
