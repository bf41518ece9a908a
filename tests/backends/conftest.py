import pytest


@pytest.fixture(scope="session")
def ray_session():
    """One local Ray instance for the session, with a declared (fake) GPU.

    The machine has 2 cores and no GPU: Ray schedules the declared resources, torch
    sees no CUDA, which is exactly what the placement tests need.
    """
    ray = pytest.importorskip("ray")
    started = not ray.is_initialized()
    if started:
        ray.init(num_cpus=4, num_gpus=1, include_dashboard=False, logging_level="WARNING")
    yield ray
    if started:
        ray.shutdown()
