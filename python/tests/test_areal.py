"""rollout_buffer.areal against AReaL's behaviour, call by call: the acceptance list of
``research/areal.md`` §4.4, with plain stand-ins for AReaL's ``SequenceSample`` and
``MFCDef`` written here (AReaL itself is not installed), and the module's own stand-ins."""

import asyncio
import threading
import time

import numpy as np
import pytest

from rollout_buffer.areal import (
    AsyncIOSequenceBuffer,
    BufferFull,
    MFCDef,
    SequenceSample,
    StaleHandle,
    Timeout,
    build_graph,
)


class Mfc:
    """AReaL's MFCDef as the buffer sees it: a name, n_seqs and keys."""

    def __init__(self, name, n_seqs, inputs=(), outputs=()):
        self.name, self.n_seqs = name, n_seqs
        self.input_keys, self.output_keys = tuple(inputs), tuple(outputs)


class Sample:
    """A duck-typed SequenceSample of one piece: ids, keys, seqlens, data, metadata, with
    AReaL's update_ and gather."""

    gathered = []

    def __init__(self, id, keys, seqlen=3):
        self.ids = [str(id)]
        self.keys = set(keys)
        self.seqlens = {k: [[seqlen]] for k in keys}
        self.data = None
        self.metadata = {}

    def update_(self, other):
        assert self.ids == other.ids
        self.keys |= other.keys
        self.seqlens.update(other.seqlens)

    @classmethod
    def gather(cls, samples, keys=None):
        out = cls.__new__(cls)
        out.ids = [i for s in samples for i in s.ids]
        out.keys = set(keys)
        out.seqlens = {k: [x for s in samples for x in s.seqlens[k]] for k in keys}
        out.data, out.metadata = None, {}
        cls.gathered.append(out)
        return out


def run(coro):
    return asyncio.run(coro)


def pipeline_rpcs():
    return [Mfc("gen", 2, ["p"], ["x"]), Mfc("rew", 2, ["x"], ["r"]), Mfc("train", 2, ["x", "r"])]


def test_put_empty_batch():
    async def go():
        buf = AsyncIOSequenceBuffer(pipeline_rpcs(), 4)
        out = await buf.put_batch([])
        assert out.dtype == np.int64 and len(out) == 0 and buf.size == 0

    run(go())


def test_the_reference_walk_through():
    """§3.3's walk-through and §4.4 items 2-7: lowest free slots, births order the reads,
    BufferFull is atomic, only input keys come back, amends make entries ready downstream,
    the last reader frees, and a get waits for n_seqs entries."""

    async def go():
        gen, rew, train = pipeline_rpcs()
        buf = AsyncIOSequenceBuffer([gen, rew, train], 4)
        slots = await buf.put_batch([Sample(i, ["p"]) for i in range(3)], birth_times=[30, 20, 10])
        assert slots.tolist() == [0, 1, 2]
        with pytest.raises(BufferFull):
            await buf.put_batch([Sample(7, ["p"]), Sample(8, ["p"])])
        assert buf.size == 3
        idx, got = await buf.get_batch_for_rpc(gen)
        assert idx.tolist() == [2, 1] and got.ids == ["2", "1"] and got.keys == {"p"}
        await buf.amend_batch(idx, [Sample(2, ["x"]), Sample(1, ["x"])])
        # gen read them already; rew now may.
        idx, got = await buf.get_batch_for_rpc(rew)
        assert idx.tolist() == [2, 1] and got.keys == {"x"}
        await buf.amend_batch(idx, [Sample(2, ["r"]), Sample(1, ["r"])])
        idx, got = await buf.get_batch_for_rpc(train)
        assert idx.tolist() == [2, 1] and got.keys == {"x", "r"}
        assert buf.size == 1
        # gen has one unread entry (slot 0): it waits for a second.
        waiting = asyncio.ensure_future(buf.get_batch_for_rpc(gen))
        await asyncio.sleep(0)
        assert not waiting.done()
        # Slot numbers are handles: a freed slot is reused first (AReaL took the lowest).
        (again,) = (await buf.put_batch([Sample(9, ["p"])])).tolist()
        assert again in (1, 2)
        idx, got = await asyncio.wait_for(waiting, 5)
        assert sorted(got.ids) == ["0", "9"] and sorted(idx.tolist()) == sorted([0, again])

    run(go())


def test_mfcs_sharing_input_keys_read_independently():
    async def go():
        a, b, c = Mfc("a", 2, ["x"], ["ya"]), Mfc("b", 3, ["x"], ["yb"]), Mfc("c", 2, ["ya", "yb"])
        buf = AsyncIOSequenceBuffer([a, b, c], 8)
        await buf.put_batch([Sample(i, ["x"]) for i in range(4)])
        assert (await buf.get_batch_for_rpc(a))[0].tolist() == [0, 1]
        assert (await buf.get_batch_for_rpc(b))[0].tolist() == [0, 1, 2]
        assert (await buf.get_batch_for_rpc(a))[0].tolist() == [2, 3]

    run(go())


def test_waiting_getters_wake_on_amend_and_on_a_put_from_another_thread():
    """A getter waiting for a key is woken by the amend that adds it, and a getter waiting
    in an event loop is woken by a put made on another thread (AReaL's synced put)."""

    async def go():
        e, x = Mfc("e", 1, ["p"]), Mfc("x", 2, ["k"])
        buf = AsyncIOSequenceBuffer([e, x], 4)
        waiting_x = asyncio.ensure_future(buf.get_batch_for_rpc(x))
        waiting_e = asyncio.ensure_future(buf.get_batch_for_rpc(e))
        await asyncio.sleep(0)
        # A plain thread: nothing but the buffer's own wake-up rouses the idle loop.
        put = {}
        thread = threading.Thread(target=lambda: put.update(idx=buf.put_batch_synced([Sample("a", ["p"]), Sample("b", ["p"])])))
        thread.start()
        got_e, _ = await asyncio.wait_for(waiting_e, 5)
        thread.join()
        idx = put["idx"]
        assert got_e.tolist()[0] in idx.tolist()
        assert not waiting_x.done()
        await buf.amend_batch(idx[:1], [Sample("a", ["k"])])
        await asyncio.sleep(0)
        assert not waiting_x.done(), "one entry holds k; x takes two"
        await buf.amend_batch(idx[1:], [Sample("b", ["k"])])
        got_x, gathered = await asyncio.wait_for(waiting_x, 5)
        assert sorted(got_x.tolist()) == sorted(idx.tolist()) and gathered.ids == ["a", "b"]

    run(go())


def test_a_put_or_amend_wakes_only_the_getters_it_may_serve():
    """AReaL's one condition woke every getter of every MFC at each put: fifty getters
    of an MFC waiting for a key no put brings each asked the buffer again at every put.
    Now a put wakes the getters of the MFCs its entries are ready for, and an amend
    those of the MFCs whose inputs it adds; the amend that brings the key still wakes
    them all, and each is served."""

    async def go():
        a, b = Mfc("a", 1, ["p"]), Mfc("b", 1, ["p", "k"])
        buf = AsyncIOSequenceBuffer([a, b], 128)
        asks = [0, 0]
        try_get = buf._try_get

        def counted(r, keys, served):
            asks[r] += 1
            return try_get(r, keys, served)

        buf._try_get = counted
        waiting = [asyncio.ensure_future(buf.get_batch_for_rpc(b, timeout=30)) for _ in range(50)]
        await asyncio.sleep(0)
        asked = asks[1]
        assert asked >= 50, "each getter asked before waiting"
        idx = []
        for i in range(20):
            idx += (await buf.put_batch([Sample(i, ["p"])])).tolist()
            got, _ = await buf.get_batch_for_rpc(a)
            assert got.tolist() == idx[-1:]
            await asyncio.sleep(0)
        assert asks[1] == asked, f"b's getters asked {asks[1] - asked} times for puts of no use to b"
        await buf.amend_batch(idx, [Sample(i, ["k"]) for i in range(20)])
        deadline = time.monotonic() + 10
        while sum(t.done() for t in waiting) < 20:
            assert time.monotonic() < deadline, "the amend's getters were not all served"
            await asyncio.wait(waiting, timeout=1, return_when=asyncio.FIRST_COMPLETED)
        served = sorted(i for t in waiting if t.done() for i in t.result()[0].tolist())
        assert served == sorted(idx), "every entry served once"
        for t in waiting:
            t.cancel()

    run(go())


def test_getters_in_two_event_loops_are_both_woken():
    """Each waiting getter is woken whatever event loop (and thread) it waits in."""
    e, x = Mfc("e", 1, ["p"]), Mfc("x", 1, ["p"])
    buf = AsyncIOSequenceBuffer([e, x], 4)
    results, waiting = {}, threading.Barrier(3)

    def getter(rpc):
        async def go():
            task = asyncio.ensure_future(buf.get_batch_for_rpc(rpc, timeout=30))
            await asyncio.sleep(0)  # the getter is waiting before the put is let go
            waiting.wait()
            idx, _ = await task
            results[rpc.name] = idx.tolist()

        asyncio.run(go())

    threads = [threading.Thread(target=getter, args=(m,)) for m in (e, x)]
    for t in threads:
        t.start()
    waiting.wait()
    idx = buf.put_batch_synced([Sample("a", ["p"])])
    for t in threads:
        t.join()
    assert results == {"e": idx.tolist(), "x": idx.tolist()}
    assert buf.size == 0


def test_mfc_without_inputs_and_unknown_keys():
    """§4.4 items 9, 10, 12: an MFC with no inputs is ready at put; keys no MFC reads do not
    count; an unknown MFC is a ValueError; the entry is freed after both MFCs read it."""

    async def go():
        e, x = Mfc("e", 1), Mfc("x", 1, ["k"])
        buf = AsyncIOSequenceBuffer([e, x], 2)
        await buf.put_batch([Sample("s", ["other"])])
        idx, got = await buf.get_batch_for_rpc(e)
        assert idx.tolist() == [0] and got.keys == set()
        with pytest.raises(ValueError, match="not one of this buffer's MFCs"):
            await buf.get_batch_for_rpc(Mfc("nope", 1))
        with pytest.raises(Timeout):
            await buf.get_batch_for_rpc(x, timeout=0.05)
        await buf.amend_batch(idx, [Sample("s", ["k", "other"], seqlen=7)])
        idx, got = await buf.get_batch_for_rpc(x)
        assert got.keys == {"k"} and got.seqlens["k"] == [[7]]
        assert buf.size == 0

    run(go())


def test_amends_merge_and_concurrent_amends_both_land():
    async def go():
        buf = AsyncIOSequenceBuffer([Mfc("t", 1, ["a", "b"])], 2)
        idx = await buf.put_batch([Sample(0, ["p"])])
        await asyncio.gather(
            buf.amend_batch(idx, [Sample(0, ["a"])]), buf.amend_batch(idx, [Sample(0, ["b"])])
        )
        _, got = await buf.get_batch_for_rpc(Mfc("t", 1, ["a", "b"]))
        assert got.keys == {"a", "b"}

    run(go())


def test_birth_time_ties_go_to_the_earlier_put_and_births_must_be_positive():
    async def go():
        buf = AsyncIOSequenceBuffer([Mfc("t", 3, ["p"])], 8)
        await buf.put_batch([Sample(i, ["p"]) for i in range(6)], birth_times=[5, 5, 5, 1, 5, 5])
        idx, _ = await buf.get_batch_for_rpc(Mfc("t", 3, ["p"]))
        assert idx.tolist() == [3, 0, 1]
        for bad in ([0, 1], [1]):
            with pytest.raises(ValueError):
                await buf.put_batch([Sample("b0", ["p"]), Sample("b1", ["p"])], birth_times=bad)
        assert buf.size == 3, "three read (and freed by the only MFC); a refused put takes no slot"

    run(go())


def test_refusals_change_nothing():
    """§4.4 items 15, 16, 18 and the duplicate-id rule: n_seqs over max_size is refused at
    construction, amending a freed slot raises, a bad amend or put leaves the buffer as it
    was."""

    async def go():
        with pytest.raises(Exception, match="n_seqs"):
            AsyncIOSequenceBuffer([Mfc("t", 5, ["p"])], 4)
        t = Mfc("t", 1, ["p"])
        buf = AsyncIOSequenceBuffer([t], 4)
        idx = await buf.put_batch([Sample("a", ["p"])])
        with pytest.raises(ValueError, match="sample `a` .* is a duplicate"):
            await buf.put_batch([Sample("a", ["p"])])
        # Within one put too, whether the samples share a key set or not: nothing stored.
        with pytest.raises(ValueError, match=r"[`\"]b[`\"] .*(appears|duplicate)"):
            await buf.put_batch([Sample("b", ["p"]), Sample("b", ["p"])])
        with pytest.raises(ValueError, match=r"[`\"]b[`\"] .*(appears|duplicate)"):
            await buf.put_batch([Sample("b", ["p"]), Sample("b", ["q"])])
        assert buf.size == 1
        with pytest.raises(ValueError, match="do not match"):
            await buf.amend_batch(idx, [Sample("zzz", ["q"])])
        for odd in (float("nan"), -1.0, "1"):
            with pytest.raises(ValueError, match="timeout"):
                await buf.get_batch_for_rpc(t, timeout=odd)
        await buf.get_batch_for_rpc(t)
        with pytest.raises(StaleHandle):
            await buf.amend_batch(idx, [Sample("a", ["q"])])
        assert buf.size == 0
        # The slot is reusable and the id free again.
        assert (await buf.put_batch([Sample("a", ["p"])])).tolist() == [0]

    run(go())


def test_no_lost_wakeup():
    """§4.4 item 17: three getters of one MFC, then a put of three: all three return (the
    reference returned one)."""

    async def go():
        t = Mfc("only", 1, ["x"])
        buf = AsyncIOSequenceBuffer([t], 16)
        getters = [asyncio.ensure_future(buf.get_batch_for_rpc(t)) for _ in range(3)]
        await asyncio.sleep(0)
        await buf.put_batch([Sample(i, ["x"]) for i in range(3)])
        done = await asyncio.wait_for(asyncio.gather(*getters), 5)
        assert sorted(i for idx, _ in done for i in idx.tolist()) == [0, 1, 2]
        assert buf.size == 0

    run(go())


def test_concurrent_getters_of_one_mfc_never_share_and_a_soak_trains_every_sample_once():
    """§4.4 items 19-20: the 3-MFC pipeline, two consumers per MFC, capacity 64, four times
    the capacity put with the producer waiting on BufferFull: every sample trained once."""

    async def go():
        gen = Mfc("gen", 8, ["p"], ["x"])
        rew = Mfc("rew", 8, ["x"], ["r"])
        train = Mfc("train", 8, ["x", "r"])
        buf = AsyncIOSequenceBuffer([gen, rew, train], 64)
        total, trained, seen = 256, [], {"gen": [], "rew": []}

        async def producer():
            for start in range(0, total, 16):
                while True:
                    try:
                        await buf.put_batch([Sample(i, ["p"]) for i in range(start, start + 16)])
                        break
                    except BufferFull:
                        await asyncio.sleep(0.001)

        async def stage(rpc, out_key):
            while len(trained) < total:
                try:
                    idx, got = await buf.get_batch_for_rpc(rpc, timeout=0.2)
                except Timeout:
                    continue
                seen[rpc.name].extend(got.ids)
                await asyncio.sleep(0)
                await buf.amend_batch(idx, [Sample(i, [out_key]) for i in got.ids])

        async def trainer():
            while len(trained) < total:
                try:
                    _, got = await buf.get_batch_for_rpc(train, timeout=0.2)
                except Timeout:
                    continue
                trained.extend(got.ids)

        await asyncio.wait_for(
            asyncio.gather(producer(), *[stage(gen, "x"), stage(gen, "x"), stage(rew, "r"), stage(rew, "r")],
                           trainer(), trainer()),
            60,
        )
        want = sorted(str(i) for i in range(total))
        assert sorted(trained) == want
        assert sorted(seen["gen"]) == want and sorted(seen["rew"]) == want
        assert buf.size == 0

    run(go())


def _fields(s):
    return (set(s.keys), list(s.ids), s.seqlens, s.trailing_shapes, s.dtypes, s.metadata,
            None if s.data is None else {k: np.asarray(v).tolist() for k, v in s.data.items()})


def _standin(i, keys, meta=False, data=False, shape=()):
    return SequenceSample(
        keys=set(keys), ids=[f"s{i}"], seqlens={k: [[i % 5 + 1]] for k in keys},
        trailing_shapes={k: shape for k in keys}, dtypes={k: "int32" for k in keys},
        data={k: np.arange(i % 5 + 1) for k in keys} if data else None,
        metadata={"src": [f"m{i}"]} if meta else {},
    )


def test_the_native_gather_matches_the_python_one():
    samples = [_standin(i, ["p", "x", "r"] if i % 2 else ["p", "x"], meta=i % 3 == 0) for i in range(9)]
    for keys in (["p"], ["x", "p"], None):
        fast = SequenceSample.gather(samples, keys=keys)
        slow = SequenceSample._gather(samples, list(samples[0].keys if keys is None else keys))
        assert type(fast) is SequenceSample and _fields(fast) == _fields(slow)
    # Samples carrying data take the Python path (numpy concatenation), with the same answer.
    with_data = [_standin(i, ["p"], data=True) for i in range(4)]
    assert _fields(SequenceSample.gather(with_data)) == _fields(SequenceSample._gather(with_data, ["p"]))
    with pytest.raises(KeyError, match=r"sample \['s0'\] has no key\(s\) \['r'\]"):
        SequenceSample.gather(samples, keys=["p", "r"])
    with pytest.raises(ValueError, match="no samples"):
        SequenceSample.gather([])


def test_an_amend_merges_as_update_does():
    """The drop-in merges two stand-ins natively and anything else by its own update_;
    either way the stored sample ends as ``update_`` leaves a copy of it."""

    class OtherMapping(dict):
        pass

    async def go():
        gen, train = build_graph([MFCDef("gen", 4, ["p"], ["x"]), MFCDef("train", 4, ["p", "x"])])
        buf = AsyncIOSequenceBuffer([gen, train], 8)
        stored = [_standin(i, ["p"], meta=i == 1) for i in range(4)]
        stored[3].metadata = OtherMapping(stored[3].metadata)  # not a dict: update_ itself
        outputs = [
            _standin(0, ["x"]),
            _standin(1, ["x", "p"], meta=True, shape=(2,)),  # overrides p's fields
            _standin(2, ["x"], data=True),  # data where the entry had none
            _standin(3, ["x"], meta=True),
        ]
        expect = []
        for s, o in zip(stored, outputs):
            copy = _standin(int(s.ids[0][1:]), ["p"], meta=s.ids == ["s1"])
            copy.update_(o)
            expect.append(_fields(copy))
        idx = await buf.put_batch(stored)
        await buf.get_batch_for_rpc(gen)
        await buf.amend_batch(idx, outputs)
        assert [_fields(s) for s in stored] == expect
        _, got = await buf.get_batch_for_rpc(train)
        assert got.ids == ["s0", "s1", "s2", "s3"] and got.seqlens["x"] == [[1], [2], [3], [4]]
        # Each sample's metadata at its place: s0 and s2 have none.
        assert got.trailing_shapes == {"p": (), "x": ()} and got.metadata == {"src": [None, "m1", None, "m3"]}

    run(go())


def test_ids_are_checked_before_an_amend_changes_anything():
    async def go():
        gen, train = build_graph([MFCDef("gen", 2, ["p"], ["x"]), MFCDef("train", 2, ["x"])])
        buf = AsyncIOSequenceBuffer([gen, train], 4)
        stored = [_standin(i, ["p"]) for i in range(2)]
        idx = await buf.put_batch(stored)
        await buf.get_batch_for_rpc(gen)
        with pytest.raises(ValueError, match=r"slot 1: ids \['s9'\] do not match the entry's \['s1'\]"):
            await buf.amend_batch(idx, [_standin(0, ["x"]), _standin(9, ["x"])])
        assert [s.keys for s in stored] == [{"p"}, {"p"}]
        with pytest.raises(Timeout):
            await buf.get_batch_for_rpc(train, timeout=0.01)
        await buf.amend_batch(idx, [_standin(i, ["x"]) for i in range(2)])
        _, got = await buf.get_batch_for_rpc(train)
        assert got.ids == ["s0", "s1"]
        # Integer ids match their str form, as AReaL's do.
        idx = await buf.put_batch([SequenceSample(keys={"p"}, ids=[i], seqlens={"p": [[1]]}) for i in (7, 8)])
        await buf.get_batch_for_rpc(gen)
        outputs = [SequenceSample(keys={"x"}, ids=[0], seqlens={"x": [[1]]}) for _ in range(2)]
        outputs[0].ids, outputs[1].ids = [7], [8]
        await buf.amend_batch(idx, outputs)
        _, got = await buf.get_batch_for_rpc(train)
        assert got.ids == ["7", "8"] and buf.size == 0

    run(go())


def test_an_update_that_raises_leaves_the_entries_unready():
    """The samples are merged before the buffer learns their new keys: an ``update_`` that
    raises part-way leaves no entry ready for a key it does not hold."""

    class Fussy(Sample):
        def update_(self, other):
            if other.ids == ["b"]:
                raise RuntimeError("refused")
            super().update_(other)

    async def go():
        gen, train = Mfc("gen", 2, ["p"], ["x"]), Mfc("train", 2, ["x"])
        buf = AsyncIOSequenceBuffer([gen, train], 4)
        idx = await buf.put_batch([Fussy("a", ["p"]), Fussy("b", ["p"])])
        await buf.get_batch_for_rpc(gen)
        with pytest.raises(RuntimeError, match="refused"):
            await buf.amend_batch(idx, [Sample("a", ["x"]), Sample("b", ["x"])])
        with pytest.raises(Timeout):
            await buf.get_batch_for_rpc(train, timeout=0.01)
        assert buf.size == 2

    run(go())


def test_threads_each_with_an_event_loop_share_one_buffer():
    """The producer, each MFC's consumer and the trainer run in four threads, each with
    its own event loop, on one buffer of the module's stand-ins (the native merge and
    gather): every sample is trained once with every key, and nothing deadlocks."""
    gen, rew, train = build_graph([
        MFCDef("gen", 16, ["p"], ["x"]), MFCDef("rew", 16, ["x"], ["r"]), MFCDef("train", 16, ["x", "r"]),
    ])
    buf = AsyncIOSequenceBuffer([gen, rew, train], 64)
    total, trained, errors = 1024, [], []

    def one(i, key):
        return SequenceSample(keys={key}, ids=[f"t{i}"], seqlens={key: [[i % 7 + 1]]})

    async def producer():
        for start in range(0, total, 16):
            while True:
                try:
                    await buf.put_batch([one(i, "p") for i in range(start, start + 16)])
                    break
                except BufferFull:
                    await asyncio.sleep(0.0005)

    async def stage(rpc, key):
        for _ in range(total // 16):
            idx, got = await buf.get_batch_for_rpc(rpc, timeout=20)
            await buf.amend_batch(idx, [one(int(i[1:]), key) for i in got.ids])

    async def trainer():
        for _ in range(total // 16):
            _, got = await buf.get_batch_for_rpc(train, timeout=20)
            assert got.keys == {"x", "r"}
            assert got.seqlens["x"] == got.seqlens["r"] == [[int(i[1:]) % 7 + 1] for i in got.ids]
            trained.extend(got.ids)

    def in_thread(coro):
        def target():
            try:
                asyncio.run(coro)
            except BaseException as e:  # reported below, in the test's thread
                errors.append(e)
        return threading.Thread(target=target)

    threads = [in_thread(c) for c in (producer(), stage(gen, "x"), stage(rew, "r"), trainer())]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads) and errors == []
    assert sorted(trained) == sorted(f"t{i}" for i in range(total)) and buf.size == 0


def test_random_amends_and_reads_match_the_python_methods():
    """Random stand-in samples (keys, metadata, data on some) put, amended and read through
    the drop-in, against a shadow copy merged by the Python ``update_`` and gathered by
    the Python ``_gather``: the same result every time."""
    import copy
    import random

    rng = random.Random(7)
    keys = ["p", "x", "r", "v"]

    def make(i, ks, data):
        ks = sorted(ks)
        return SequenceSample(
            keys=set(ks), ids=[f"q{i}"], seqlens={k: [[rng.randint(1, 9)]] for k in ks},
            trailing_shapes={k: rng.choice([(), (2,)]) for k in ks},
            dtypes={k: rng.choice([None, "f32"]) for k in ks},
            data={k: np.arange(rng.randint(1, 4)) for k in ks} if data else None,
            metadata={m: [rng.randint(0, 9)] for m in rng.sample(["a", "b"], rng.randint(0, 2))},
        )

    async def go():
        mfcs = build_graph([MFCDef("gen", 4, ["p"], ["x"]), MFCDef("rew", 4, ["x"], ["r", "v"]),
                            MFCDef("train", 4, ["x", "r"])])
        buf = AsyncIOSequenceBuffer(mfcs, 16)
        for round_ in range(40):
            base = round_ * 4
            # Data on every sample of a round, or on none (a gather concatenates each key's
            # data only when every sample has some).
            data = rng.random() < 0.25
            stored = [make(base + j, ["p"] + rng.sample(["v"], rng.randint(0, 1)), data) for j in range(4)]
            shadow = copy.deepcopy(stored)
            idx = await buf.put_batch(stored)
            for rpc, out_keys in ((mfcs[0], ["x"]), (mfcs[1], ["r", "v"]), (mfcs[2], None)):
                got_idx, got = await buf.get_batch_for_rpc(rpc)
                assert got_idx.tolist() == idx.tolist()
                want = SequenceSample._gather(shadow, list(rpc.input_keys))
                assert _fields(got) == _fields(want)
                if out_keys is None:
                    continue
                # The MFC's first output key always, the others on some samples.
                outs = [make(base + j, out_keys[:1] + rng.sample(out_keys[1:], rng.randint(0, len(out_keys) - 1)), data)
                        for j in range(4)]
                for s, o in zip(shadow, copy.deepcopy(outs)):
                    s.update_(o)
                await buf.amend_batch(idx, outs)
                assert [_fields(s) for s in stored] == [_fields(s) for s in shadow]
        assert buf.size == 0

    run(go())


def test_a_get_gathers_the_keys_of_the_mfc_passed_in():
    """AReaL decides readiness by the constructor's MFCs and gathers the keys of the MFC
    object passed in: a key the entries lack is the stand-in gather's KeyError."""

    async def go():
        gen = MFCDef("gen", 2, ["p"])
        buf = AsyncIOSequenceBuffer([gen], 4)
        await buf.put_batch([_standin(i, ["p", "v"]) for i in range(2)])
        _, got = await buf.get_batch_for_rpc(MFCDef("gen", 2, ["p", "v"]))
        assert got.keys == {"p", "v"} and len(got.seqlens["v"]) == 2
        await buf.put_batch([_standin(i, ["p"]) for i in range(2, 4)])
        with pytest.raises(KeyError, match=r"sample \['s2'\] has no key\(s\) \['v'\]"):
            await buf.get_batch_for_rpc(MFCDef("gen", 2, ["p", "v"]))

    run(go())


def test_a_merge_that_fails_leaves_the_merged_entries_readable():
    """An amend whose second `update_` raises: the first entry, already merged, is amended
    in the buffer too (it was left holding keys the buffer never learned of, so it was
    never ready), and the second can be amended again."""

    class Broken(Sample):
        def update_(self, other):
            raise RuntimeError("a broken merge")

    async def go():
        gen, train = Mfc("gen", 2, ["a"], ["b"]), Mfc("train", 2, ["a", "b"])
        buf = AsyncIOSequenceBuffer([gen, train], 8)
        first, second = Sample(1, ["a"]), Broken(2, ["a"])
        idx = await buf.put_batch([first, second])
        await buf.get_batch_for_rpc(gen)
        with pytest.raises(RuntimeError, match="a broken merge"):
            await buf.amend_batch(idx, [Sample(1, ["b"]), Sample(2, ["b"])])
        assert first.keys == {"a", "b"}
        second.update_ = lambda other: Sample.update_(second, other)
        await buf.amend_batch(idx[1:], [Sample(2, ["b"])])
        slots, batch = await asyncio.wait_for(buf.get_batch_for_rpc(train), 5)
        assert sorted(slots.tolist()) == sorted(idx.tolist())
        assert sorted(batch.ids) == ["1", "2"]

    run(go())

