"""Test-wide settings."""

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
