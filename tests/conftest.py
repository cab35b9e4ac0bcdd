"""Test-wide settings."""

import socket
import subprocess
import sys

import pytest
from hypothesis import settings

from tests.helpers_proc import wait_for

# Timing is not what the property tests assert, and CI runs on a shared, noisy 2-core machine:
# hypothesis's default 200 ms per-example deadline would fail correct code that was merely slow.
settings.register_profile("relay", deadline=None)
settings.load_profile("relay")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def mlflow_server(tmp_path_factory):
    """`mlflow server` on a free loopback port, as a team would run one (SQLite backend store)."""
    import urllib.request

    folder = tmp_path_factory.mktemp("mlflow")
    port = free_port()
    cmd = [
        sys.executable,
        "-m",
        "mlflow",
        "server",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--workers",
        "1",
    ]
    cmd += [
        "--backend-store-uri",
        f"sqlite:///{folder}/db.sqlite",
        "--artifacts-destination",
        str(folder / "art"),
    ]
    server = subprocess.Popen(cmd, cwd=folder, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"

    def up() -> bool:
        try:
            return urllib.request.urlopen(f"{url}/health", timeout=1).status == 200
        except OSError:
            return False

    try:
        wait_for(up, 90, "the MLflow server")
        yield url
    finally:
        server.terminate()
        server.wait(30)
