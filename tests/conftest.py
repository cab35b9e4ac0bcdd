"""Test-wide settings."""

import faulthandler
import inspect
import os
import signal
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


# What makes a test end-to-end (`e2e`): it starts a training, a subprocess, a browser or a server,
# itself, through a fixture, or through a helper of its module. Marked by reading the sources, so a
# new test lands in the right tier without a list to keep: the unit loop
# (`-m "not ray and not slow and not e2e"`) stays minutes long.
E2E_SIGNS = (
    "train_local(",
    "start_train(",
    "subprocess.",
    "Popen(",
    "page_at(",
    "Dashboard(",
    "mlflow_server",
    "serve_policy(",
    'main(["train"',
    'main(["resume"',
    'main(["sweep"',
    "TrainingLoop(",
)


def _source(obj) -> str:
    try:
        return inspect.getsource(obj)
    except (OSError, TypeError):
        return ""


def _e2e_helpers(module) -> set[str]:
    """Names of the module's own functions whose source shows an e2e sign."""
    return {
        name
        for name, fn in vars(module).items()
        if inspect.isfunction(fn)
        and fn.__module__ == module.__name__
        and not name.startswith("test_")
        and any(sign in _source(fn) for sign in E2E_SIGNS)
    }


def pytest_collection_modifyitems(config, items):
    helpers: dict[str, set[str]] = {}
    for item in items:
        if (
            not isinstance(item, pytest.Function)
            or item.get_closest_marker("ray")
            or item.get_closest_marker("e2e")
        ):
            continue
        module = item.module
        if module.__name__ not in helpers:
            helpers[module.__name__] = _e2e_helpers(module)
        fixtures = [
            fd.func for name in item.fixturenames for fd in item._fixtureinfo.name2fixturedefs.get(name, ())
        ]
        sources = [_source(item.function), *(_source(f) for f in fixtures)]
        signs = (*E2E_SIGNS, *(f"{name}(" for name in helpers[module.__name__]))
        if any(sign in src for src in sources for sign in signs):
            item.add_marker(pytest.mark.e2e)


# The signals that stop the suite as Ctrl-C does: `timeout`, a CI runner and `kill` send SIGTERM, a
# closed terminal SIGHUP. pytest then runs the fixtures' teardowns (Ray shut down, head nodes and
# servers stopped), reports, and exits 2 ("interrupted").
SUITE_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def _stop_the_suite(signum, frame):
    raise KeyboardInterrupt(f"the test suite got {signal.Signals(signum).name}")


def pytest_configure(config):
    for sig in (signal.SIGTERM, signal.SIGHUP):
        if signal.getsignal(sig) in (signal.SIG_DFL, None):
            signal.signal(sig, _stop_the_suite)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """Every test (its fixtures' set-up and teardown included) leaves the stop signals' handlers as
    it found them. `ray.init` installs a SIGTERM handler that raises SystemExit, which pytest
    records as one test's failure and goes on: left installed by a test, it made the whole suite
    shrug off `timeout`'s SIGTERM and run to its end."""
    handlers = {sig: signal.getsignal(sig) for sig in SUITE_STOP_SIGNALS}
    try:
        return (yield)
    finally:
        for sig, handler in handlers.items():
            if handler is not None:
                signal.signal(sig, handler)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    """A SIGTERM that met a handler a test installed (Ray's, `sys.exit(SIGTERM)`) stops the suite
    after this test, as one that met the suite's handler does."""
    report = yield
    exc = call.excinfo.value if call.excinfo is not None else None
    if isinstance(exc, SystemExit) and exc.code == signal.SIGTERM:
        item.session.shouldstop = "a test's SIGTERM handler raised SystemExit(15): the suite was terminated"
    return report


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
