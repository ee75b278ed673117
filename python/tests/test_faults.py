"""Faults from the Python side: a consumer task cancelled while it waits and while it
holds a lease, Ctrl-C during a blocking get, a buffer closed under 50 waiting tasks, and a
durable buffer whose store turns read-only. None may leak a lease, lose a sample or leave
a waiter hanging."""

import _thread
import asyncio
import os
import subprocess
import threading

import numpy as np
import pytest

import rollout_buffer as rb


def buffer(capacity=64, n=4):
    return rb.Buffer(capacity, [rb.Rpc("train", n, inputs=["x"])])


def put(buf, prefix, n):
    buf.put_columns_blocking({"x": np.zeros((n, 2), np.int32)}, ids=[f"{prefix}{i}" for i in range(n)])


def test_a_consumer_cancelled_while_waiting_leases_nothing():
    async def go():
        buf = buffer()
        waiting = asyncio.ensure_future(buf.get_batch_for_rpc("train"))
        await asyncio.sleep(0)  # let it reach the wait
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        put(buf, "s", 4)
        batch = await asyncio.wait_for(buf.get_batch_for_rpc("train"), 10)
        assert sorted(s["id"] for s in batch.samples()) == ["s0", "s1", "s2", "s3"]
        assert buf.stats()["live_leases"] == 1

    asyncio.run(go())


def test_a_consumer_cancelled_holding_a_lease_gives_its_samples_back():
    async def go():
        buf = buffer()
        put(buf, "s", 4)
        holding = asyncio.Event()

        async def consumer():
            async with buf.lease("train"):
                holding.set()
                await asyncio.Event().wait()  # the model call that never ends

        task = asyncio.ensure_future(consumer())
        await asyncio.wait_for(holding.wait(), 10)
        assert buf.stats()["live_leases"] == 1
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        stats = buf.stats()
        assert stats["live_leases"] == 0 and stats["redelivered"] == 4
        again = await asyncio.wait_for(buf.get_batch_for_rpc("train"), 10)
        assert sorted(s["id"] for s in again.samples()) == ["s0", "s1", "s2", "s3"]

    asyncio.run(go())


def test_ctrl_c_interrupts_a_blocking_get_and_leaks_nothing(interrupt_when_waiting):
    buf = buffer()
    # SIGINT arrives while the main thread is blocked in the get.
    with pytest.raises(KeyboardInterrupt):
        interrupt_when_waiting(buf, "train", _thread.interrupt_main)
        buf.get_batch_for_rpc_blocking("train", timeout=30)
    put(buf, "s", 4)
    batch = buf.get_batch_for_rpc_blocking("train", timeout=10)
    assert len(batch) == 4 and buf.stats()["live_leases"] == 1


def test_closing_under_fifty_waiting_tasks_wakes_every_one():
    async def go():
        buf = buffer()
        waiters = [asyncio.ensure_future(buf.get_batch_for_rpc("train")) for _ in range(50)]
        await asyncio.sleep(0)
        buf.close()
        results = await asyncio.wait_for(asyncio.gather(*waiters, return_exceptions=True), 10)
        assert all(isinstance(r, rb.Closed) for r in results), {type(r).__name__ for r in results}
        with pytest.raises(rb.Closed):
            await buf.get_batch_for_rpc("train")

    asyncio.run(go())


def _read_only(path, on):
    """Makes ``path`` refuse new files (``chattr +i`` as root, who ignores modes); whether
    it worked."""

    if os.geteuid() == 0:
        done = subprocess.run(["chattr", "+i" if on else "-i", str(path)], capture_output=True)
        if done.returncode != 0:
            return False
    else:
        os.chmod(path, 0o555 if on else 0o755)
    if not on:
        return True
    try:
        (path / "probe").touch()
    except OSError:
        return True
    (path / "probe").unlink()
    _read_only(path, False)
    return False


def test_a_store_made_read_only_fails_clearly_and_recovers(tmp_path):
    store = tmp_path / "run"
    buf = rb.Buffer(8, [rb.Rpc("train", 1, inputs=["x"])], store=str(store), durability="sync")
    put(buf, "a", 2)
    wal = store / "wal"
    if not _read_only(wal, True):
        # CI's machines can (as root, by `chattr +i`): there the test must run.
        if os.environ.get("CI"):
            pytest.fail("CI must be able to make a directory read-only (chattr +i as root)")
        pytest.skip("this machine cannot make a directory read-only")
    try:
        with pytest.raises(rb.BufferError) as refused:
            put(buf, "b", 1)
        assert "wal/" in str(refused.value), str(refused.value)
        assert len(buf) == 2, "the refused put stored nothing"
    finally:
        _read_only(wal, False)
    # Writable again: the buffer works, and a reopen holds what was acknowledged.
    put(buf, "c", 1)
    buf.flush()
    del buf
    again = rb.Buffer(8, [rb.Rpc("train", 1, inputs=["x"])], store=str(store), durability="sync")
    assert len(again) == 3
    got = set()
    for _ in range(3):
        batch = again.get_batch_for_rpc_blocking("train", timeout=5)
        got.add(batch.samples()[0]["id"])
        batch.commit_blocking()
    assert got == {"a0", "a1", "c0"}


# Leases expiring (each a debug event of the library) while getters block and the main
# thread polls stats() and len(), with Python logging at DEBUG: the library logged under
# its lock, through a bridge that needs the GIL, while stats() held the GIL and waited
# for the lock; the process hung for good within two seconds.
LOG_UNDER_LOAD = r"""
import logging, sys, threading, time
import numpy as np
import rollout_buffer as rb
logging.basicConfig(level=logging.DEBUG, stream=open(__import__("os").devnull, "w"))
buf = rb.Buffer(64, [rb.Rpc("gen", 1, inputs=["x"], lease_timeout=0.002)])
stop = False
def produce():
    i = 0
    while not stop:
        try:
            buf.put_batch_blocking([{"id": f"s{i}", "x": np.zeros(1, np.int32)}])
            i += 1
        except rb.BufferError:
            pass
        time.sleep(0.0005)
held = []
def get():
    while not stop:
        try:
            held.append(buf.get_batch_for_rpc_blocking("gen", timeout=0.05))
            del held[:-20]
        except rb.Timeout:
            pass
for target in (produce, get, get):
    threading.Thread(target=target, daemon=True).start()
end = time.monotonic() + 3
while time.monotonic() < end:
    buf.stats(), len(buf)
stop = True
print("redelivered", buf.stats()["redelivered"])
"""


def test_debug_logging_under_load_never_deadlocks_with_the_gil():
    done = subprocess.run(
        [__import__("sys").executable, "-c", LOG_UNDER_LOAD], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr[-2000:]
    redelivered = int(done.stdout.split()[-1])
    assert redelivered > 0, "leases expired meanwhile (the events that deadlocked)"


# The AReaL drop-in held its slot lock across a put, with the GIL; a refused put logs a
# debug event under it, which runs Python's logging, which can hand the GIL to a thread
# that then waited for the slot lock holding the GIL: hung for good within seconds.
AREAL_LOG_UNDER_LOCK = r"""
import logging, os, threading, time
from rollout_buffer.areal import AsyncIOSequenceBuffer
logging.basicConfig(level=logging.DEBUG, stream=open(os.devnull, "w"))
class Mfc:
    name, n_seqs, input_keys, output_keys = "gen", 1, ("x",), ()
class Sample:
    def __init__(self, id):
        self.ids, self.keys, self.seqlens = [str(id)], {"x"}, {"x": [[1]]}
        self.data, self.metadata = None, {}
buf = AsyncIOSequenceBuffer([Mfc()], max_size=1 << 20)
stop = False
counts = {"refused": 0, "stored": 0}
def refused():
    while not stop:
        try:
            buf.put_batch_synced([Sample("d"), Sample("d")])
        except ValueError:
            counts["refused"] += 1
def stored():
    while not stop:
        buf.put_batch_synced([Sample(f"s{counts['stored']}")])
        counts["stored"] += 1
threads = [threading.Thread(target=f, daemon=True) for f in (refused, stored)]
for t in threads:
    t.start()
time.sleep(2)
stop = True
for t in threads:
    t.join()
print(counts["refused"], counts["stored"])
"""


def test_debug_logging_under_the_areal_slot_lock_never_deadlocks():
    done = subprocess.run(
        [__import__("sys").executable, "-c", AREAL_LOG_UNDER_LOCK], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr[-2000:]
    refused, stored = map(int, done.stdout.split())
    assert refused > 0 and stored > 0, "both threads ran: refused puts logged under the lock"


# Opening a store that accepts connections and never answers: Ctrl-C must end the wait
# (the constructor waited for the object store's own timeouts and retries, with signals
# unchecked).
OPEN_STALLED = r"""
import signal, sys, threading, time
import rollout_buffer as rb
threading.Timer(0.5, lambda: signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)).start()
start = time.monotonic()
try:
    rb.Buffer(8, [rb.Rpc("gen", 1, inputs=["x"])], store="s3://bucket/run")
    print("opened", time.monotonic() - start)
except KeyboardInterrupt:
    print("interrupted", time.monotonic() - start)
"""


def test_ctrl_c_interrupts_opening_a_store_that_never_answers():
    import socket

    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(64)
    held = []

    def accept():
        while True:
            try:
                held.append(server.accept()[0])
            except OSError:
                return

    threading.Thread(target=accept, daemon=True).start()
    port = server.getsockname()[1]
    env = dict(
        os.environ,
        AWS_ENDPOINT_URL=f"http://127.0.0.1:{port}",
        AWS_ALLOW_HTTP="true",
        AWS_ACCESS_KEY_ID="key",
        AWS_SECRET_ACCESS_KEY="secret",
        AWS_REGION="us-east-1",
    )
    try:
        done = subprocess.run(
            [__import__("sys").executable, "-c", OPEN_STALLED], capture_output=True, text=True, timeout=120, env=env
        )
    finally:
        server.close()
        for conn in held:
            conn.close()
    assert done.returncode == 0, done.stderr[-2000:]
    outcome, after = done.stdout.split()
    assert outcome == "interrupted", done.stdout
    assert float(after) < 10, f"the interrupt took {after} s"
    assert held, "the store was reached (and never answered)"
