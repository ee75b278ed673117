"""What several test modules share: a local Ray cluster, and an interrupter of a wait."""

import threading
import time

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


@pytest.fixture
def interrupt_when_waiting():
    """``start(buf, rpc, send)``: calls ``send()`` (a Ctrl-C) on another thread once a getter
    of ``rpc`` waits in ``buf``, so the signal lands during the wait however the machine
    schedules the test (a timer could fire before the call, or before ``pytest.raises``).
    If no getter is seen waiting within 30 s, nothing is sent (the test then fails on its
    own), and the test's end stops the watch, so a stray signal never ends the session."""
    threads = []
    done = threading.Event()

    def start(buf, rpc, send):
        def run():
            deadline = time.monotonic() + 30
            while not done.is_set() and time.monotonic() < deadline:
                if buf.stats()["rpcs"][rpc]["waiting"] > 0:
                    send()
                    return
                time.sleep(0.001)

        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        threads.append(thread)

    yield start
    done.set()
    for thread in threads:
        thread.join(timeout=60)
