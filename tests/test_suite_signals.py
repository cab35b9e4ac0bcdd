"""The test suite itself stops when it is told to: a CI runner, `timeout` and a person send SIGTERM.

`ray.init` installs a SIGTERM handler of its own (`sys.exit(15)`); pytest takes the SystemExit it
raises as one test's failure and goes on, so a suite in which a test had called `ray.init` ran on
to its end after `timeout`'s SIGTERM (exit 124 a minute later). The suite's conftest puts the
handlers back after every test, and a SystemExit(15) that met Ray's handler stops the suite.
"""

import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]

# A small suite run with relay's conftest as a plugin: a module-scoped Ray (as tests/integration's
# `local_ray`), a test that may be signalled while Ray's handler is the live one, one after it.
SUITE = """
import os, pathlib, time
import pytest

MARKS = pathlib.Path(os.environ["MARKS"])


@pytest.fixture(scope="module")
def local_ray():
    import ray

    ray.init(address="local", num_cpus=1, include_dashboard=False)
    yield
    ray.shutdown()
    (MARKS / "shut_down").touch()


def test_a(local_ray):
    (MARKS / "a").touch()
    if os.environ["WAIT_IN"] == "a":
        time.sleep(300)


def test_b(local_ray):
    (MARKS / "b").touch()
    time.sleep(300)


def test_c():
    (MARKS / "c").touch()
"""


@pytest.mark.parametrize("wait_in", ["a", "b"])
def test_sigterm_stops_the_suite_after_a_test_called_ray_init(tmp_path, wait_in):
    """SIGTERM while the test that started Ray runs ('a': Ray's handler is live), and in the test
    after it ('b': Ray's handler was left installed). Either way the suite stops at once: Ray is
    shut down by its fixture, no later test runs, the exit status is pytest's 'interrupted'."""
    (tmp_path / "test_small_suite.py").write_text(SUITE)
    marks = tmp_path / "marks"
    marks.mkdir()
    env = {
        **os.environ,
        "MARKS": str(marks),
        "WAIT_IN": wait_in,
        "RAY_TMPDIR": tempfile.mkdtemp(prefix="rs", dir="/tmp"),
    }
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "tests.conftest", "-p", "no:cacheprovider"]
    cmd += ["--rootdir", str(tmp_path), "-c", os.devnull, str(tmp_path / "test_small_suite.py")]
    proc = subprocess.Popen(
        cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    try:
        deadline = time.time() + 180
        while not (marks / wait_in).exists():
            assert proc.poll() is None and time.time() < deadline, proc.communicate()[0]
            time.sleep(0.1)
        time.sleep(1)  # inside the test's sleep
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=90)
    finally:
        proc.kill()
    assert not (marks / "c").exists(), f"the suite ran on after SIGTERM:\n{out}"
    assert (marks / "shut_down").exists(), out
    assert proc.returncode == pytest.ExitCode.INTERRUPTED, out
