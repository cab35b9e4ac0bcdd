import tempfile

import pytest

from tests.helpers_proc import processes_mentioning, wait_for


@pytest.fixture(scope="module")
def local_ray():
    """A real local Ray cluster for one test module: a new one (`address="local"`), never one
    a `ray start` on this machine named in Ray's current-cluster file (a user's, or one a test
    left), which ray.init would otherwise join."""
    import ray

    ray.init(address="local", num_cpus=4, include_dashboard=False)
    yield
    ray.shutdown()


@pytest.fixture
def ray_tmp():
    """A short RAY_TMPDIR of a subprocess's own (Ray's socket paths must stay under ~100
    characters): the Ray processes it starts are the ones whose command lines name it."""
    folder = tempfile.mkdtemp(prefix="rt", dir="/tmp")
    yield folder
    wait_for(lambda: not processes_mentioning(folder), 30, f"Ray processes of {folder} to end")
