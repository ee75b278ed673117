"""The Python package: round trips of every dtype, ragged fields, asyncio and blocking
calls, errors as exceptions, the lease context manager, persistence."""

import asyncio
import math
import time

import numpy as np
import pytest

import rollout_buffer as rb


def pipeline(capacity=16, n=2):
    return rb.Buffer(
        capacity,
        [
            rb.Rpc("gen", n, inputs=["prompt"], outputs=["tokens"]),
            rb.Rpc("train", n, inputs=["prompt", "tokens"]),
        ],
    )


DTYPES = [np.int32, np.int64, np.float32, np.float64, np.uint8, np.bool_]


@pytest.mark.parametrize("dtype", DTYPES)
def test_every_dtype_round_trips(dtype):
    buf = rb.Buffer(4, [rb.Rpc("r", 1, inputs=["x"])])
    x = (np.arange(12).reshape(3, 4) % 2 == 0) if dtype is np.bool_ else np.arange(12, dtype=dtype).reshape(3, 4)
    buf.put_batch_blocking([{"id": "a", "x": x}])
    got = buf.get_batch_for_rpc_blocking("r").samples()[0]["x"]
    assert got.dtype == x.dtype and got.shape == x.shape
    np.testing.assert_array_equal(got, x)


def test_scalars_strings_ragged_meta_and_non_contiguous_arrays():
    buf = rb.Buffer(4, [rb.Rpc("r", 1, inputs=["s", "f", "t", "rag", "names", "view"])])
    base = np.arange(20, dtype=np.int32).reshape(4, 5)
    buf.put_batch_blocking([{
        "id": "a", "birth": 7, "meta": {"environment": "math", "policy_version": 3},
        "s": 5, "f": 0.25, "t": "text", "names": ["x", "y"],
        "rag": [np.array([1, 2, 3], np.int32), np.array([4], np.int32)],
        "view": base[:, 1],  # a strided view
    }])
    s = buf.get_batch_for_rpc_blocking("r").samples()[0]
    assert (s["id"], s["birth"], s["s"], s["f"], s["t"], s["names"]) == ("a", 7, 5, 0.25, "text", ["x", "y"])
    assert s["meta"] == {"environment": "math", "policy_version": 3}
    assert [list(r) for r in s["rag"]] == [[1, 2, 3], [4]]
    np.testing.assert_array_equal(s["view"], base[:, 1])


def test_pipeline_with_asyncio_and_many_tasks():
    async def main():
        buf = pipeline(capacity=32, n=2)
        done = []

        async def producer(p):
            for i in range(10):
                await buf.put_batch([{"id": f"{p}-{i}", "prompt": np.array([i], np.int32)}])

        async def gen():
            for _ in range(20):
                batch = await buf.get_batch_for_rpc("gen", timeout=10)
                outs = [{"tokens": np.array([7, 8], np.int32)} for _ in batch.samples()]
                await batch.complete(outs)

        async def train():
            for _ in range(20):
                async with buf.lease("train", timeout=10) as batch:
                    done.extend(s["id"] for s in batch.samples())

        await asyncio.gather(*(producer(p) for p in range(4)), gen(), train())
        return buf, done

    buf, done = asyncio.run(main())
    assert sorted(done) == sorted(f"{p}-{i}" for p in range(4) for i in range(10))
    assert len(buf) == 0
    assert buf.stats()["freed"] == 40


def test_errors_are_python_exceptions():
    buf = pipeline(capacity=2, n=1)
    with pytest.raises(ValueError, match="lacks dataset key"):
        buf.put_batch_blocking([{"id": "a"}])
    buf.put_batch_blocking([{"id": "a", "prompt": np.array([1], np.int32)}])
    with pytest.raises(ValueError, match="already in the buffer"):
        buf.put_batch_blocking([{"id": "a", "prompt": np.array([1], np.int32)}])
    with pytest.raises(rb.Timeout):
        buf.get_batch_for_rpc_blocking("train", timeout=0.05)
    assert issubclass(rb.Timeout, TimeoutError)
    with pytest.raises(ValueError, match="unsupported"):
        buf.put_batch_blocking([{"id": "b", "prompt": np.array([1 + 2j])}])
    batch = buf.get_batch_for_rpc_blocking("gen")
    with pytest.raises(ValueError, match="does not declare output"):
        batch.complete_blocking([{"nope": np.array([1], np.int32)}])
    buf.close()
    with pytest.raises(rb.Closed):
        buf.get_batch_for_rpc_blocking("gen")
    # A configuration refused is a ValueError too.
    with pytest.raises(ValueError, match="capacity"):
        rb.Buffer(0, [rb.Rpc("train", 1, inputs=["x"])])
    with pytest.raises(ValueError, match="train"):
        rb.Buffer(4, [rb.Rpc("train", 1, inputs=["x"]), rb.Rpc("train", 1, inputs=["x"])])
    with pytest.raises(ValueError, match="n_seqs"):
        rb.Buffer(4, [rb.Rpc("train", 8, inputs=["x"])])


def test_a_lease_released_on_exception_is_redelivered():
    async def main():
        buf = pipeline(capacity=4, n=1)
        await buf.put_batch([{"id": "a", "prompt": np.array([1], np.int32)}])
        with pytest.raises(RuntimeError):
            async with buf.lease("gen") as batch:
                raise RuntimeError("trainer died")
        again = await buf.get_batch_for_rpc("gen", timeout=1)
        assert [s["id"] for s in again.samples()] == ["a"]
        assert buf.stats()["rpcs"]["gen"]["redelivered"] == 1

    asyncio.run(main())


def test_a_lease_block_whose_closing_commit_is_refused_gives_the_batch_back():
    # `gen` outputs `tokens`: a block that ends without completing it cannot be
    # committed. The commit's error comes out of the block, and the batch goes back to
    # `gen`, though the block's name for it lives on: kept leased, it would wait for a
    # commit nothing makes.
    async def main():
        buf = pipeline(capacity=4, n=2)
        await buf.put_columns({"prompt": np.ones((2, 2), np.int32)}, ids=["a", "b"])
        with pytest.raises(ValueError, match="tokens"):
            async with buf.lease("gen") as batch:
                pass
        assert buf.stats()["live_leases"] == 0
        with pytest.raises(rb.BufferError, match="already finished"):
            batch.release()
        again = await buf.get_batch_for_rpc("gen", timeout=5)
        assert sorted(s["id"] for s in again.samples()) == ["a", "b"]
        assert buf.stats()["rpcs"]["gen"]["redelivered"] == 2

    asyncio.run(main())


def test_a_rejected_completion_or_commit_keeps_the_lease_for_a_corrected_one():
    buf = rb.Buffer(8, [rb.Rpc("gen", 2, inputs=["x"], outputs=["y"]), rb.Rpc("train", 2, inputs=["x", "y"])])
    buf.put_columns_blocking({"x": np.arange(2, dtype=np.int32)}, ids=["a", "b"])
    batch = buf.get_batch_for_rpc_blocking("gen", timeout=1)
    bad_outputs = [
        lambda: batch.complete_blocking([{"y": np.float32(1)}]),  # one output for two samples
        lambda: batch.complete_blocking([{"y": np.float32(1)}, {}]),  # `b` lacks `y`
        lambda: batch.complete_columns_blocking({}),  # no output at all
        batch.commit_blocking,  # no outputs, where `train` reads `y`
    ]
    for bad in bad_outputs:
        with pytest.raises(ValueError):
            bad()
        assert buf.stats()["live_leases"] == 1, "the lease is kept"
    batch.complete_columns_blocking({"y": np.array([1.0, 2.0], np.float32)})
    assert buf.stats()["rpcs"]["gen"]["redelivered"] == 0
    train = buf.get_batch_for_rpc_blocking("train", timeout=1)
    np.testing.assert_array_equal(train.columns()["y"], [1.0, 2.0])


def test_an_empty_store_url_is_refused(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError, match="empty URL"):
        rb.Buffer(4, [rb.Rpc("train", 1, inputs=["x"])], store="")
    assert list(tmp_path.iterdir()) == [], "nothing written in the working directory"


def test_a_persistent_buffer_comes_back(tmp_path):
    rpcs = lambda: [rb.Rpc("train", 1, inputs=["x"])]
    buf = rb.Buffer(8, rpcs(), store=str(tmp_path))
    buf.put_batch_blocking([{"id": "a", "x": np.array([1.5], np.float32)}])
    buf.flush()
    del buf
    again = rb.Buffer(8, rpcs(), store=str(tmp_path))
    assert len(again) == 1
    np.testing.assert_array_equal(again.get_batch_for_rpc_blocking("train").samples()[0]["x"], [1.5])
    again.flush()


def test_rollouts_are_grouped_then_packed_for_training():
    async def main():
        buf = rb.Buffer(64, [rb.Rpc("train", 1, inputs=rb.GROUP_INPUTS, selection="lifo")])
        ingest = rb.Ingest(buf, group_size=4)
        outcomes = []
        for ex in range(6):
            for k in range(4):
                outcomes.append(await ingest.add_rollout({
                    "environment": "math", "example_id": f"ex{ex}", "policy_version": 0,
                    "rollout_uid": f"{ex}-{k}", "replica_id": f"r{k % 2}",
                    "prompt_tokens": np.arange(8, dtype=np.int32),
                    "output_tokens": np.full(6 + k, 3, np.int32),
                    "logprobs": np.full(6 + k, -0.5, np.float32),
                    "reward": float(k % 2),
                }))
        assert outcomes.count("sealed") == 6 and outcomes.count("pending") == 18
        assert await ingest.add_rollout({
            "environment": "math", "example_id": "ex0", "policy_version": 0,
            "rollout_uid": "0-1", "prompt_tokens": np.zeros(1, np.int32),
            "output_tokens": np.zeros(1, np.int32), "logprobs": np.zeros(1, np.float32),
        }) == "duplicate"
        batcher = rb.Batcher([("math", buf, "train", 1.0)], seq_len=128, rows=4, group_size=4)
        batch = await batcher.next_batch()
        arrays = batch.arrays()
        assert arrays["input_ids"].shape == (4, 128)
        assert arrays["loss_mask"].dtype == np.bool_
        groups = len(arrays["group_ids"])
        # Each group: outputs of 6 + 7 + 8 + 9 = 30 tokens under the loss mask.
        assert int(arrays["loss_mask"].sum()) == 30 * groups
        assert int((arrays["segment_ids"] > 0).sum()) == (4 * 8 + 30) * groups
        # Read-only views of the packed arrays: the same memory on every call, no copy.
        again = batch.arrays()
        for name in ("input_ids", "advantages", "loss_mask"):
            a, b = arrays[name], again[name]
            assert a.__array_interface__["data"][0] == b.__array_interface__["data"][0]
            assert not a.flags.writeable and not a.flags.owndata
        await batch.complete()
        return buf, ingest, groups

    buf, ingest, groups = asyncio.run(main())
    assert groups >= 1 and len(buf) == 6 - groups
    # The same from synchronous code: the blocking twins, on one more group.
    for k in range(4):
        ingest.add_rollout_blocking({
            "environment": "math", "example_id": "ex6", "policy_version": 0,
            "rollout_uid": f"6-{k}", "prompt_tokens": np.arange(8, dtype=np.int32),
            "output_tokens": np.full(6, 3, np.int32), "logprobs": np.full(6, -0.5, np.float32),
            "reward": float(k % 2),
        })
    groups -= 1
    # A source that cannot lease one group per call, or names no RPC of its buffer, is
    # refused when the batcher is made (its getter would wait for a second group).
    pairs = rb.Buffer(8, [rb.Rpc("train", 2, inputs=rb.GROUP_INPUTS)])
    with pytest.raises(ValueError, match="leases 2 groups per call"):
        rb.Batcher([("math", pairs, "train", 1.0)], seq_len=128, rows=4, group_size=4)
    with pytest.raises(ValueError, match="trian"):
        rb.Batcher([("math", buf, "trian", 1.0)], seq_len=128, rows=4, group_size=4)
    # One whose RPC does not read every group input: each group would be discarded.
    partial = rb.Buffer(8, [rb.Rpc("train", 1, inputs=["prompt_tokens", "reward"])])
    with pytest.raises(ValueError, match="does not read .*output_tokens"):
        rb.Batcher([("math", partial, "train", 1.0)], seq_len=128, rows=4, group_size=4)
    batcher = rb.Batcher([("math", buf, "train", 1.0)], seq_len=128, rows=4, group_size=4)
    batch = batcher.next_batch_blocking()
    more = len(batch.arrays()["group_ids"])
    batch.complete_blocking()
    assert more >= 1 and len(buf) == 6 - groups - more
    with pytest.raises(rb.BufferError, match="already completed"):
        batch.complete_blocking()


def test_cancelling_an_awaited_get_leaves_nothing_behind():
    async def main():
        buf = pipeline(capacity=4, n=1)
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(buf.get_batch_for_rpc("gen"), 0.05)
        # The cancelled getter holds nothing and waits no more; the next one is served.
        await buf.put_batch([{"id": "a", "prompt": np.array([1], np.int32)}])
        batch = await buf.get_batch_for_rpc("gen", timeout=1)
        assert [s["id"] for s in batch.samples()] == ["a"]
        # The cancellation reaches the runtime's task a thread hop after asyncio sees it;
        # within a bound, the cancelled getter has left the waiters.
        deadline = asyncio.get_running_loop().time() + 2
        while buf.stats()["rpcs"]["gen"]["waiting"] and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.01)
        assert buf.stats()["rpcs"]["gen"]["waiting"] == 0

    asyncio.run(main())


def test_ctrl_c_interrupts_a_blocking_wait(interrupt_when_waiting):
    import os
    import signal

    buf = pipeline(capacity=4, n=1)
    with pytest.raises(KeyboardInterrupt):
        interrupt_when_waiting(buf, "gen", lambda: os.kill(os.getpid(), signal.SIGINT))
        buf.get_batch_for_rpc_blocking("gen", timeout=60)  # fails, not hangs, if never sent
    stats = buf.stats()
    assert stats["rpcs"]["gen"]["waiting"] == 0 and stats["live_leases"] == 0
    buf.put_batch_blocking([{"id": "a", "prompt": np.array([1], np.int32)}])
    assert len(buf.get_batch_for_rpc_blocking("gen", timeout=1)) == 1


def test_many_concurrent_tasks_share_one_buffer():
    async def main():
        buf = rb.Buffer(64, [rb.Rpc("train", 4, inputs=["x"])])
        seen = []

        async def put(p):
            for i in range(25):
                await buf.put_batch([{"id": f"{p}-{i}", "x": np.full(16, p, np.int64)}])

        async def take():
            for _ in range(25):
                batch = await buf.get_batch_for_rpc("train", timeout=10)
                seen.extend(s["id"] for s in batch.samples())
                await batch.commit()

        await asyncio.gather(*(put(p) for p in range(16)), *(take() for _ in range(4)))
        return seen, len(buf)

    seen, left = asyncio.run(main())
    assert len(seen) == len(set(seen)) == 400 and left == 0


def test_amends_by_handle_and_a_stale_handle_is_refused(tmp_path):
    buf = rb.Buffer(
        4,
        [rb.Rpc("train", 1, inputs=["prompt", "score"])],
        store=str(tmp_path),
        external_keys=["score"],
        durability="interval:10",
    )
    (handle,) = buf.put_batch_blocking([{"id": "a", "prompt": np.array([1], np.int32)}])
    with pytest.raises(rb.Timeout):
        buf.get_batch_for_rpc_blocking("train", timeout=0.05)  # no score yet
    assert buf.try_get_batch_for_rpc("train") is None  # no score yet
    asyncio.run(buf.amend_batch([handle], [{"score": 0.5}]))
    batch = buf.try_get_batch_for_rpc("train")
    assert batch.samples()[0]["score"] == 0.5 and batch.handles() == [tuple(handle)]
    assert batch.slots().dtype == np.int64 and batch.slots().tolist() == [handle[0]]
    assert buf.try_get_batch_for_rpc("train") is None, "the one sample is leased"
    with pytest.raises(ValueError):
        buf.try_get_batch_for_rpc("nope")
    batch.commit_blocking()
    with pytest.raises(rb.StaleHandle):
        buf.amend_batch_blocking([handle], [{"score": 1.0}])
    with pytest.raises(ValueError, match="durability"):
        rb.Buffer(4, [rb.Rpc("r", 1, inputs=["x"])], store=str(tmp_path / "b"), durability="often")
    buf.flush()


@pytest.mark.parametrize(
    "kwargs",
    [
        {"selection": "uniform", "seed": 3},
        {"selection": "recency", "alpha": 3.0, "seed": 3},
        {"selection": "prioritized", "priority_key": "p", "exponent": 1.0, "seed": 3},
    ],
)
def test_randomised_selections_are_reproducible(kwargs):
    def run():
        buf = rb.Buffer(32, [rb.Rpc("r", 4, inputs=["x"], reads=100, **kwargs)])
        # The priority only where the selection reads it: a field no RPC names is refused.
        p = lambda i: {"p": float(i % 3)} if "priority_key" in kwargs else {}
        buf.put_batch_blocking([{"id": f"s{i}", "birth": i + 1, "x": i, **p(i)} for i in range(32)])
        out = []
        for _ in range(5):
            batch = buf.get_batch_for_rpc_blocking("r")
            out.append([s["id"] for s in batch.samples()])
            batch.release()
        return out

    first = run()
    assert first == run()
    assert all(len(set(b)) == 4 for b in first)


def test_unknown_selection_is_a_value_error():
    with pytest.raises(ValueError, match="selection"):
        rb.Rpc("r", 1, selection="best")
    with pytest.raises(ValueError, match="priority_key"):
        rb.Rpc("r", 1, selection="prioritized")


def test_a_negative_or_oversized_count_is_a_value_error_naming_its_argument():
    # pyo3's own conversion raised an OverflowError naming nothing ("can't convert
    # negative int to unsigned").
    rpc = lambda **kw: rb.Rpc("r", kw.pop("n_seqs", 1), inputs=["x"], **kw)
    trainer = rb.Buffer(8, [rb.Rpc("train", 1, inputs=rb.GROUP_INPUTS)])
    for make, name in [
        (lambda: rb.Buffer(-1, [rpc()]), "capacity"),
        (lambda: rb.Buffer(4, [rpc()], memory_budget=-1), "memory_budget"),
        (lambda: rpc(n_seqs=-1), "n_seqs"),
        (lambda: rpc(reads=-1), "reads"),
        (lambda: rpc(reads=2**32), "reads"),
        (lambda: rpc(seed=-1), "seed"),
        (lambda: rpc(max_staleness=-1), "max_staleness"),
        (lambda: rpc(min_size_to_sample=-1), "min_size_to_sample"),
        (lambda: rb.Ingest(trainer, -2), "group_size"),
        (lambda: rb.Ingest(trainer, 2, min_size=-1), "min_size"),
        (lambda: rb.Ingest(trainer, 2, max_per_replica=-1), "max_per_replica"),
        (lambda: rb.Batcher([("m", trainer, "train", 1.0)], -1, 4, 2), "seq_len"),
        (lambda: rb.Batcher([("m", trainer, "train", 1.0)], 16, -4, 2), "rows"),
        (lambda: rb.Batcher([("m", trainer, "train", 1.0)], 16, 4, -2), "group_size"),
    ]:
        with pytest.raises(ValueError, match=rf"^{name}: -?\d+ is out of range"):
            make()
    assert rb.Buffer(4, [rpc(seed=2**64 - 1, max_staleness=0)]).stats()["capacity"] == 4


def test_a_dict_field_no_rpc_declares_is_refused_as_a_column_is():
    """A misspelt key was stored silently from a dict (the column path refused it), and the
    RPC reading the right key waited for it forever. A priority key is declared by its
    selection: taken by both paths."""
    buf = rb.Buffer(8, [rb.Rpc("train", 1, inputs=["x"], selection="prioritized", priority_key="p")])
    with pytest.raises(ValueError, match=r'sample 1 \(id "b"\): field "rewrad" is not a key'):
        buf.put_batch_blocking([{"id": "a", "x": 1.0}, {"id": "b", "x": 1.0, "rewrad": 1.0}])
    handles = buf.put_batch_blocking([{"id": "a", "x": 1.0, "p": 2.0, "meta": {"env": "m"}}])
    buf.put_columns_blocking({"x": np.ones(2), "p": np.ones(2)}, ids=["b", "c"])
    with pytest.raises(ValueError, match=r'patch 0: field "rewrad" is not a key'):
        buf.amend_batch_blocking(handles, [{"rewrad": 1.0}])
    assert len(buf) == 3


def test_a_memory_budget_spills_and_every_sample_comes_back(tmp_path):
    n, size = 64, 2048
    buf = rb.Buffer(
        n,
        [rb.Rpc("train", 8, inputs=["tokens", "reward"])],
        store=str(tmp_path),
        memory_budget=8 * size * 4,
    )
    for i in range(0, n, 8):
        buf.put_batch_blocking(
            [
                {"id": f"s{j}", "tokens": np.arange(size, dtype=np.int32) + j, "reward": float(j)}
                for j in range(i, i + 8)
            ]
        )
    stats = buf.stats()
    assert stats["resident_bytes"] <= 16 * size * 4
    assert stats["spill"]["spilled_samples"] > 0
    seen = set()
    for _ in range(n // 8):
        batch = buf.get_batch_for_rpc_blocking("train")
        for s in batch.samples():
            j = int(s["id"][1:])
            assert np.array_equal(s["tokens"], np.arange(size, dtype=np.int32) + j)
            assert s["reward"] == float(j)
            seen.add(j)
        batch.commit_blocking()
    assert seen == set(range(n))
    buf.flush()
    assert buf.stats()["spill"]["live_segments"] == 0


def test_polling_a_spilled_buffer_with_try_get_gets_every_batch(tmp_path):
    """`try_get_batch_for_rpc` ran outside the runtime: the loads of spilled inputs it
    registered never started, so it answered `None` forever and every later get waited
    for those loads."""
    n, size = 32, 4000
    buf = rb.Buffer(
        64, [rb.Rpc("train", 8, inputs=["x"])], store=str(tmp_path), memory_budget=4 * size * 4
    )
    for i in range(n):
        buf.put_batch_blocking([{"id": f"s{i}", "x": np.full(size, i, dtype=np.float32)}])
    assert buf.stats()["spill"]["spilled_now"] > 0
    seen = set()
    deadline = time.monotonic() + 60
    while len(seen) < n:
        assert time.monotonic() < deadline, f"polled for a minute; got {sorted(seen)}"
        batch = buf.try_get_batch_for_rpc("train")
        if batch is None:
            # The loads it started run on the runtime; a blocking get with a timeout waits
            # for a wake-up instead of spinning.
            batch = buf.get_batch_for_rpc_blocking("train", timeout=30)
        for s in batch.samples():
            j = int(s["id"][1:])
            assert np.array_equal(s["x"], np.full(size, j, dtype=np.float32))
            seen.add(j)
        batch.commit_blocking()
    assert seen == set(range(n))


def test_an_awaitable_completion_outside_an_event_loop_keeps_the_lease():
    # The awaitable needs a running loop; finding that out after taking the batch gave the
    # lease up, and the corrected blocking call then said "already finished".
    buf = rb.Buffer(8, [rb.Rpc("gen", 2, inputs=["x"], outputs=["y"]), rb.Rpc("train", 2, inputs=["x", "y"])])
    buf.put_columns_blocking({"x": np.arange(2, dtype=np.int32)}, ids=["a", "b"])
    batch = buf.get_batch_for_rpc_blocking("gen", timeout=1)
    outputs = [{"y": np.float32(1)}, {"y": np.float32(2)}]
    for call in (lambda: batch.complete(outputs), batch.commit,
                 lambda: batch.complete_columns({"y": np.array([1.0, 2.0], np.float32)})):
        with pytest.raises(RuntimeError, match="no running event loop"):
            call()
        assert buf.stats()["live_leases"] == 1, "the lease is kept"
    batch.complete_blocking(outputs)
    assert buf.stats()["rpcs"]["gen"]["redelivered"] == 0


def test_infinity_is_taken_wherever_a_duration_is():
    # lease_timeout, seal_timeout and the Batcher's wait refused it ("cannot convert float
    # infinity") while every timeout and wait_warning took it.
    buf = rb.Buffer(4, [rb.Rpc("train", 1, inputs=rb.GROUP_INPUTS, lease_timeout=math.inf)])
    ingest = rb.Ingest(buf, group_size=2, seal_timeout=math.inf)
    # One row of 14 tokens: the group's two rollouts of 4 + 3 fill it, so the batch is
    # whole without waiting for more.
    batcher = rb.Batcher([("math", buf, "train", 1.0)], seq_len=14, rows=1, group_size=2, wait=math.inf)
    outcomes = [
        ingest.add_rollout_blocking({
            "environment": "math", "example_id": "ex0", "policy_version": 0,
            "rollout_uid": f"0-{k}", "prompt_tokens": np.arange(4, dtype=np.int32),
            "output_tokens": np.full(3, 1, np.int32), "logprobs": np.full(3, -0.5, np.float32),
            "reward": float(k),
        })
        for k in range(2)
    ]
    assert outcomes == ["pending", "sealed"]
    batch = batcher.next_batch_blocking(timeout=10)
    assert len(batch.arrays()["group_ids"]) == 1
    batch.complete_blocking()
    assert len(buf) == 0


def test_every_waiting_call_takes_a_timeout():
    rpcs = lambda: [rb.Rpc("train", 1, inputs=["x"])]
    buf = rb.Buffer(2, [rb.Rpc("train", 1, inputs=rb.GROUP_INPUTS)])
    full = rb.Buffer(1, rpcs())
    full.put_batch_blocking([{"id": "a", "x": np.zeros(1, np.float32)}])
    one = {"id": "b", "x": np.zeros(1, np.float32)}
    batcher = rb.Batcher([("math", buf, "train", 1.0)], seq_len=16, rows=1, group_size=2, wait=60.0)

    with pytest.raises(rb.Timeout, match="put_batch"):
        full.put_batch_blocking([one], timeout=0.05)
    with pytest.raises(rb.Timeout, match="put_columns"):  # the call made, not put_batch
        full.put_columns_blocking({"x": np.zeros((1, 1), np.float32)}, ids=["c"], timeout=0.05)
    with pytest.raises(rb.Timeout, match="next_batch"):
        batcher.next_batch_blocking(timeout=0.05)

    async def main():
        with pytest.raises(rb.Timeout, match="put_batch"):
            await full.put_batch([one], timeout=0.05)
        with pytest.raises(rb.Timeout, match="put_columns"):
            await full.put_columns({"x": np.zeros((1, 1), np.float32)}, ids=["c"], timeout=0.05)
        with pytest.raises(rb.Timeout, match="next_batch"):
            await batcher.next_batch(timeout=0.05)

    asyncio.run(main())
    # Nothing was stored by the refused puts, and the full buffer still serves its sample.
    assert len(full) == 1 and full.stats()["put"] == 1
    assert full.get_batch_for_rpc_blocking("train", timeout=5).samples()[0]["id"] == "a"
    full.flush(timeout=5)
    with pytest.raises(ValueError, match="timeout"):
        full.flush(timeout=-1)
    with pytest.raises(ValueError, match="wait_warning"):
        rb.Buffer(1, rpcs(), wait_warning=-1)
    # Past the clock's range is no deadline (it panicked: adding it to now overflowed).
    endless = rb.Buffer(2, rpcs(), wait_warning=math.inf)
    assert len(endless.put_batch_blocking([one], timeout=math.inf)) == 1
    with pytest.raises(rb.Timeout):
        rb.Buffer(1, rpcs(), wait_warning=1e15).get_batch_for_rpc_blocking("train", timeout=0.05)
    assert endless.get_batch_for_rpc_blocking("train", timeout=math.inf).samples()[0]["id"] == "b"


def test_a_rollout_without_a_reward_the_trainer_reads_is_refused_alone():
    # Answered "pending", then its whole group refused when it sealed: the rollout
    # before it lost too, and under a seal timeout with no error raised to anyone.
    buf = rb.Buffer(64, [rb.Rpc("train", 1, inputs=rb.GROUP_INPUTS)])
    ingest = rb.Ingest(buf, group_size=2)
    base = dict(environment="math", example_id="q", policy_version=0,
                prompt_tokens=np.array([1, 2], np.int32), output_tokens=np.array([3, 4], np.int32),
                logprobs=np.array([-1, -1], np.float32))
    assert ingest.add_rollout_blocking(dict(base, rollout_uid="a", reward=1.0)) == "pending"
    with pytest.raises(ValueError, match="rollout `b`.*no `reward`"):
        ingest.add_rollout_blocking(dict(base, rollout_uid="b"))
    assert ingest.add_rollout_blocking(dict(base, rollout_uid="b", reward=0.0)) == "sealed"
    assert len(buf) == 1 and ingest.counters()["refused_groups"] == 0


@pytest.mark.parametrize("version", [-1, 2**64, 1.0, True, "3", None])
def test_a_policy_version_that_is_no_int_from_0_is_named(version):
    # -1 was an OverflowError ("can't convert negative int to unsigned"), and True was
    # taken as version 1, by the buffer and by a rollout given to an Ingest.
    buf = rb.Buffer(8, [rb.Rpc("train", 1, inputs=rb.GROUP_INPUTS)])
    with pytest.raises(ValueError, match="version must be an int from 0"):
        buf.set_policy_version(version)
    buf.set_policy_version(np.int64(2))
    assert buf.stats()["policy_version"] == 2
    rollout = dict(environment="math", example_id="q", rollout_uid="a", policy_version=version,
                   reward=1.0, output_tokens=np.array([3], np.int32), logprobs=np.array([-1], np.float32))
    with pytest.raises(ValueError, match="rollout \"a\".*`policy_version`"):
        rb.Ingest(buf, group_size=2).add_rollout_blocking(rollout)
