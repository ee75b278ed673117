"""What several test modules share: a local Ray cluster."""

import pytest


@pytest.fixture(scope="module")
def cluster(request):
    """A local Ray cluster of two CPUs for one test module. The module, and the modules it
    names in ``RAY_BY_VALUE``, are pickled by value: Ray's workers cannot import test
    modules, whose functions and classes the tests send them."""
    ray = pytest.importorskip("ray")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    for module in (request.module, *getattr(request.module, "RAY_BY_VALUE", ())):
        ray.cloudpickle.register_pickle_by_value(module)
    try:
        yield
    finally:
        ray.shutdown()
