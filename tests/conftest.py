"""Test-wide settings."""

import faulthandler
import os
import sys

import pytest
from hypothesis import settings

# Timing is not what the property tests assert, and CI runs on a shared, noisy 2-core machine:
# hypothesis's default 200 ms per-example deadline would fail correct code that was merely slow.
settings.register_profile("relay", deadline=None)
settings.load_profile("relay")


@pytest.fixture(scope="session")
def mlflow_server(tmp_path_factory):
    """A real MLflow tracking server on a free loopback port (benchmarks/common.py starts it)."""
    from benchmarks.common import mlflow_server as server

    with server(tmp_path_factory.mktemp("mlflow")) as url:
        yield url


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session, exitstatus):
    session.config.stash[_EXIT_STATUS] = int(exitstatus)


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config):
    """End the test process with pytest's status once its report is written, skipping the
    interpreter's teardown. This process has loaded torch (with inductor's compiled kernels),
    onnxruntime, EnvPool, MuJoCo and Ray's core worker; their native destructors then run in no
    set order, and one of them crashed (exit 139, a segfault) after all 877 tests had passed in
    CI. Nothing of the tests' is left to run or to write by then: the run's outcome is the
    status. A crash during the tests themselves still shows, with a traceback from faulthandler."""
    if _EXIT_STATUS not in config.stash or os.environ.get("RELAY_TEST_TEARDOWN") == "1":
        return  # a run that did not finish its session, or one asking for the full teardown
    sys.stdout.flush()
    sys.stderr.flush()
    faulthandler.disable()
    os._exit(config.stash[_EXIT_STATUS])


_EXIT_STATUS = pytest.StashKey[int]()
