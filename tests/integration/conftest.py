import pytest


@pytest.fixture(scope="module")
def local_ray():
    """A real local Ray cluster for one test module."""
    import ray

    ray.init(num_cpus=4, include_dashboard=False)
    yield
    ray.shutdown()
