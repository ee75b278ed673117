"""The package across the process's life: interpreter exit with results still on their way,
many awaited results at once, fork, exceptions that cross process boundaries by pickle,
and awaiting the same awaitable twice."""

import asyncio
import multiprocessing
import os
import pickle
import subprocess
import sys

import numpy as np
import pytest

import rollout_buffer as rb


def buffer(capacity=16, n=1):
    return rb.Buffer(capacity, [rb.Rpc("gen", n, inputs=["x"])])


def sample(i):
    return {"id": f"s{i}", "x": np.array([i], np.int32)}


def run_many(script, times, parallel=4):
    """Runs `script` `times` times, `parallel` at once; the (returncode, stderr) of each."""
    outcomes = []
    for start in range(0, times, parallel):
        procs = [
            subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
            for _ in range(min(parallel, times - start))
        ]
        for proc in procs:
            _, err = proc.communicate(timeout=60)
            outcomes.append((proc.returncode, err))
    return outcomes


# The last awaited get had to wait (a put from another task served it), then the program
# ends at once. Its result came back on a thread the runtime started, which was still
# attached to the interpreter (dropping its references) while Python finalized: SIGSEGV
# or an abort in PyGILState_Release in about half the runs.
EXIT_AFTER_WAIT = r"""
import asyncio
import numpy as np
import rollout_buffer as rb
async def main():
    buf = rb.Buffer(16, [rb.Rpc("gen", 1, inputs=["x"])])
    async def producer():
        await asyncio.sleep(0.02)
        await buf.put_batch([{"id": "a", "x": np.array([1], np.int32)}])
    task = asyncio.ensure_future(producer())
    batch = await buf.get_batch_for_rpc("gen")
    await batch.commit()
    await task
asyncio.run(main())
"""

# Two hundred getters released by close() while the loop is being torn down: results reach
# a loop that closes meanwhile, and the interpreter exits right after.
EXIT_UNDER_CLOSE = r"""
import asyncio
import rollout_buffer as rb
async def main():
    bufs = [rb.Buffer(16, [rb.Rpc("gen", 1, inputs=["x"])]) for _ in range(4)]
    tasks = [asyncio.ensure_future(bufs[i % 4].get_batch_for_rpc("gen")) for i in range(200)]
    await asyncio.sleep(0.1)
    for buf in bufs:
        buf.close()
asyncio.run(main())
"""


@pytest.mark.parametrize("script", [EXIT_AFTER_WAIT, EXIT_UNDER_CLOSE], ids=["after_wait", "under_close"])
def test_the_interpreter_exits_cleanly_with_results_on_their_way(script):
    outcomes = run_many(script, 32)
    failed = [(code, err[-400:]) for code, err in outcomes if code != 0]
    assert not failed, f"{len(failed)} of {len(outcomes)} runs crashed at exit: {failed[:3]}"


def thread_count():
    return len(os.listdir("/proc/self/task"))


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="counts threads through /proc")
def test_five_hundred_getters_released_at_once_need_no_thread_each():
    async def main():
        buf = buffer()
        tasks = [asyncio.ensure_future(buf.get_batch_for_rpc("gen")) for _ in range(500)]
        await asyncio.sleep(0.05)
        before = thread_count()
        buf.close()
        outcomes = await asyncio.gather(*tasks, return_exceptions=True)
        return before, thread_count(), outcomes

    before, after, outcomes = asyncio.run(main())
    assert all(isinstance(o, rb.Closed) for o in outcomes)
    # One delivery thread serves them all (it was one pool thread per result, ~400 here).
    assert after - before <= 2, (before, after)


def test_a_finished_awaitable_awaited_twice_gives_its_result_twice():
    # The native awaitables (the package's coroutines wrap them; a batch's methods return
    # them as they are), as a done asyncio future answers.
    async def main():
        buf = buffer()._native
        handles = buf.put_batch([sample(0)])
        first, second = await handles, await handles
        missing = buffer()._native.get_batch_for_rpc("gen", timeout=0)
        errors = []
        for _ in range(2):
            try:
                await missing
            except rb.Timeout as e:
                errors.append(e)
        return first, second, errors

    first, second, errors = asyncio.run(main())
    assert first == second and len(first) == 1
    assert len(errors) == 2


def test_a_waited_awaitable_cancelled_gives_the_batch_back():
    async def main():
        buf = buffer()
        waiting = asyncio.ensure_future(buf.get_batch_for_rpc("gen"))
        await asyncio.sleep(0.01)
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        await buf.put_batch([sample(1)])
        batch = await buf.get_batch_for_rpc("gen", timeout=5)
        return [s["id"] for s in batch.samples()]

    assert asyncio.run(main()) == ["s1"]


def test_a_get_left_waiting_on_a_closed_loop_gives_its_batch_back():
    buf = buffer(n=2)
    loop = asyncio.new_event_loop()
    orphan = loop.create_task(get_awaited(buf, timeout=None))
    loop.run_until_complete(asyncio.sleep(0.05))  # the get is waiting now
    loop.close()  # without cancelling it: its batch has nowhere to go
    buf.put_batch_blocking([sample(0), sample(1)])
    # The orphan may lease the batch first; it gives it back as its result is dropped.
    batch = buf.get_batch_for_rpc_blocking("gen", timeout=10)
    assert sorted(s["id"] for s in batch.samples()) == ["s0", "s1"]
    assert not orphan.done()


@pytest.mark.parametrize("exc", [rb.BufferError, rb.BufferFull, rb.Closed, rb.StaleHandle, rb.Timeout])
def test_exceptions_survive_pickling_as_themselves(exc):
    again = pickle.loads(pickle.dumps(exc("what went wrong")))
    assert type(again) is exc and str(again) == "what went wrong"
    assert exc.__module__ == "rollout_buffer"


def wait_in_worker(_):
    buf = buffer()
    return buf.get_batch_for_rpc_blocking("gen", timeout=0.05)


def test_a_timeout_in_a_spawned_worker_is_caught_as_timeout_by_the_parent():
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        with pytest.raises(rb.Timeout):
            pool.apply_async(wait_in_worker, (0,)).get(timeout=60)


async def get_awaited(buf, timeout=0.5):
    return await buf.get_batch_for_rpc("gen", timeout=timeout)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_forked_child_is_refused_instead_of_hanging_or_serving_again():
    buf = buffer()
    buf.put_batch_blocking([sample(i) for i in range(4)])
    buf.get_batch_for_rpc_blocking("gen", timeout=5).commit_blocking()
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report what each call did, then leave without cleanup
        lines = []
        for name, call in [
            ("blocking get", lambda: buf.get_batch_for_rpc_blocking("gen", timeout=0.5)),
            ("try get", lambda: buf.try_get_batch_for_rpc("gen")),
            ("new buffer", lambda: buffer().get_batch_for_rpc_blocking("gen", timeout=0.5)),
            ("asyncio", lambda: asyncio.run(get_awaited(buf))),
        ]:
            try:
                call()
                lines.append(f"{name}: served")
            except rb.BufferError as e:
                lines.append(f"{name}: refused: {'forked' in str(e)}")
            except BaseException as e:  # noqa: BLE001 (the child reports anything)
                lines.append(f"{name}: {type(e).__name__}")
        os.write(write, "\n".join(lines).encode())
        os._exit(0)
    os.close(write)
    with os.fdopen(read) as pipe:
        report = pipe.read().splitlines()
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert report == [
        "blocking get: refused: True",
        "try get: refused: True",
        "new buffer: refused: True",
        "asyncio: refused: True",
    ]
    # The parent is untouched: the three samples it left are still there for it.
    assert len(buf) == 3
    assert len(buf.get_batch_for_rpc_blocking("gen", timeout=5)) == 1
