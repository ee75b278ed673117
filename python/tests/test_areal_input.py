"""rollout_buffer.areal refusing input of the wrong kind: amend indices that are no slot
numbers, samples that are no SequenceSample, RPCs that are no MFCDef. Each refusal is a
ValueError naming the item, with nothing stored or changed."""

import asyncio
from types import SimpleNamespace

import numpy as np
import pytest

from rollout_buffer.areal import AsyncIOSequenceBuffer, MFCDef, SamplesDropped, Timeout
from test_areal import Mfc, Sample, _standin, run


def test_amend_indices_must_be_ints_and_not_negative():
    """A float index was truncated (0.9 amended slot 0); a bool, a negative number or an
    int past int64 is no slot either. Refused before any entry changes."""

    async def go():
        gen, train = Mfc("gen", 2, ["p"], ["x"]), Mfc("train", 2, ["x"])
        buf = AsyncIOSequenceBuffer([gen, train], 4)
        stored = [Sample("a", ["p"]), Sample("b", ["p"])]
        idx = await buf.put_batch(stored)
        await buf.get_batch_for_rpc(gen)
        for bad, message in [
            ([0.9], r"indices\[0\] is 0\.9"),
            (0.9, r"indices\[0\] is 0\.9"),
            (np.array([0.0, 1.0]), r"indices\[0\]"),
            ([0, 1.0], r"indices\[1\] is 1\.0"),
            ([True, 1], r"indices\[0\] is True"),
            (np.array([True, False]), r"indices\[0\]"),
            ([0, -1], r"indices\[1\] is -1"),
            (np.array([-2, 1]), r"indices\[0\]"),
            ([2**70, 1], r"indices\[0\] is 1180591620717411303424"),
            (["0", "1"], r"indices\[0\] is '0'"),
        ]:
            with pytest.raises(ValueError, match=message + ".*slot index is an int >= 0"):
                await buf.amend_batch(bad, [Sample("a", ["x"]), Sample("b", ["x"])][: np.size(bad)])
        assert [s.keys for s in stored] == [{"p"}, {"p"}], "nothing amended"
        with pytest.raises(Timeout):
            await buf.get_batch_for_rpc(train, timeout=0.01)
        # Python ints and numpy integers (scalars, arrays of any integer type) are slots.
        await buf.amend_batch([np.int32(idx[0])], [Sample("a", ["x"])])
        await buf.amend_batch(idx[1:].astype(np.uint16), [Sample("b", ["x"])])
        slots, got = await buf.get_batch_for_rpc(train)
        assert sorted(got.ids) == ["a", "b"] and buf.size == 0

    run(go())


def test_samples_and_mfcs_of_another_kind_are_named():
    """A put or an amend of something that is no SequenceSample, and a get for something
    that is no MFCDef, raised AttributeError; now a ValueError saying what was expected,
    with nothing stored or changed."""

    async def go():
        gen, train = Mfc("gen", 1, ["p"], ["x"]), Mfc("train", 1, ["x"])
        with pytest.raises(ValueError, match=r"rpcs\[1\] must be an MFCDef .*not None"):
            AsyncIOSequenceBuffer([gen, None], 4)
        buf = AsyncIOSequenceBuffer([gen, train], 4)
        with pytest.raises(ValueError, match=r"samples\[0\] must be a SequenceSample .*type object"):
            await buf.put_batch([object()])
        with pytest.raises(ValueError, match=r"samples\[1\] must be a SequenceSample .*not None"):
            await buf.put_batch([Sample("a", ["p"]), None])
        assert buf.size == 0, "nothing stored"
        idx = await buf.put_batch([Sample("a", ["p"])])
        assert idx.tolist() == [0]
        await buf.get_batch_for_rpc(gen)
        with pytest.raises(ValueError, match=r"samples\[0\] must be a SequenceSample"):
            await buf.amend_batch(idx, ["x"])
        for rpc in (None, "train", object()):
            with pytest.raises(ValueError, match=r"rpc must be an MFCDef \(with name, n_seqs and input_keys\)"):
                await buf.get_batch_for_rpc(rpc, timeout=0.01)
        await buf.amend_batch(idx, [Sample("a", ["x"])])
        _, got = await buf.get_batch_for_rpc(train)
        assert got.ids == ["a"] and buf.size == 0

    run(go())


def test_birth_times_must_be_ints_greater_than_zero():
    """A float birth time was truncated by the cast to int64 (1.5 stored as 1, ordered
    beside the entries born at 1); a bool or text is no birth time either. Refused as an
    amend index is, before any slot is taken."""

    async def go():
        train = Mfc("train", 2, ["p"])
        buf = AsyncIOSequenceBuffer([train], 4)
        two = [Sample("a", ["p"]), Sample("b", ["p"])]
        for bad, message in [
            ([1.5, 2], r"birth_times\[0\] is 1\.5"),
            ([1, 2.0], r"birth_times\[1\] is 2\.0"),
            (np.array([1.5, 2.5]), r"birth_times\[0\]"),
            ([True, 2], r"birth_times\[0\] is True"),
            (["1", "2"], r"birth_times\[0\] is '1'"),
            ([1, 0], r"birth_times\[1\] is 0"),
            (np.array([3, -1]), r"birth_times\[1\]"),
            ([2**70, 1], r"birth_times\[0\] is 1180591620717411303424: past int64"),
            (np.array([2**63 + 5, 1], np.uint64), r"birth_times\[0\] is 9223372036854775813: past int64"),
        ]:
            with pytest.raises(ValueError, match=message + ".*a birth time is an int > 0"):
                await buf.put_batch(two, birth_times=bad)
        assert buf.size == 0, "nothing stored"
        # Ints and numpy integers (scalars, arrays of any integer type) order the reads.
        await buf.put_batch(two, birth_times=np.array([9, 8], np.uint32))
        await buf.put_batch([Sample("c", ["p"]), Sample("d", ["p"])], birth_times=[np.int64(2), 1])
        _, got = await buf.get_batch_for_rpc(train)
        assert got.ids == ["d", "c"]

    run(go())


def test_an_amend_mixing_data_and_metadata_only_samples_never_loses_the_entry():
    """An amend with data into a metadata-only entry (and the reverse) left data whose
    keys no longer matched the sample's: the gather raised KeyError after the last MFC's
    read had freed the slot, and the entry was gone. The batch is now metadata-only."""
    from rollout_buffer.areal import MFCDef, SequenceSample

    async def go(put_data, amend_data):
        gen, tr = MFCDef("gen", 1, ("p",)), MFCDef("tr", 1, ("p", "x"))
        buf = AsyncIOSequenceBuffer([gen, tr], 8)
        put = SequenceSample(keys={"p"}, ids=[0], seqlens={"p": [[3]]},
                             data={"p": np.ones(3)} if put_data else None)
        idx = await buf.put_batch([put])
        await buf.get_batch_for_rpc(gen)
        amend = SequenceSample(keys={"x"}, ids=[0], seqlens={"x": [[3]]},
                               data={"x": np.ones(3)} if amend_data else None)
        await buf.amend_batch(idx, [amend])
        _, out = await buf.get_batch_for_rpc(tr, timeout=5)
        assert out.ids == ["0"] and out.keys == {"p", "x"} and out.data is None
        assert buf.size == 0

    run(go(False, True))
    run(go(True, False))


def test_a_gather_keeps_metadata_at_its_samples_place():
    """A sample without a metadata key had the next sample's value moved onto it."""
    from rollout_buffer.areal import MFCDef, SequenceSample

    async def go(with_data):
        gen = MFCDef("gen", 3, ("p",))
        buf = AsyncIOSequenceBuffer([gen], 8)

        def s(i, meta):
            return SequenceSample(keys={"p"}, ids=[i], seqlens={"p": [[3]]}, metadata=meta,
                                  data={"p": np.ones(3)} if with_data else None)

        await buf.put_batch([s("A", {"version": [10]}), s("B", {}), s("C", {"version": [30], "t": [1.5]})])
        _, out = await buf.get_batch_for_rpc(gen)
        assert out.ids == ["A", "B", "C"]
        assert out.metadata == {"version": [10, None, 30], "t": [None, None, 1.5]}
        assert [u.metadata.get("version") for u in out.unpack()] == [[10], [None], [30]]

    run(go(False))
    run(go(True))


def test_counts_are_ints_and_an_mfcs_n_seqs_is_fixed_at_construction():
    """``int()`` truncated an ``n_seqs`` of 1.5 and a ``max_size`` of 8.7, refused -1 with
    an OverflowError; an MFC whose n_seqs changed after construction was served the old
    count without a word."""
    def mfc(**given):  # an MFC as any class may hold it, unconverted
        return SimpleNamespace(**{"name": "g", "n_seqs": 1, "input_keys": ("p",), **given})

    rule = r"must be an int from 1 to 2\*\*64 - 1"
    for rpcs, size, message in [([Mfc("g", 1.5, ["p"])], 8, rf"rpcs\[0\]\.n_seqs {rule}, not 1\.5"),
                                ([Mfc("g", 1, ["p"])], 8.7, f"max_size {rule}, not 8.7"),
                                ([Mfc("g", 1, ["p"])], -1, f"max_size {rule}, not -1"),
                                # An OverflowError that named nothing.
                                ([Mfc("g", 1, ["p"])], 2**64, f"max_size {rule}, not {2**64}"),
                                ([Mfc("g", 2**64, ["p"])], 8, rf"rpcs\[0\]\.n_seqs {rule}"),
                                # A str is a sequence of letters: 14 one-letter keys, every
                                # get waiting for ever; a key or name of another type was a
                                # TypeError naming neither.
                                ([mfc(input_keys="packed_prompts")], 8, r"rpcs\[0\]\.input_keys must be a sequence of str"),
                                ([mfc(input_keys=(1,))], 8, r"rpcs\[0\]\.input_keys must be a sequence of str"),
                                ([Mfc(None, 1, ["p"])], 8, r"rpcs\[0\]\.name must be a str, not None")]:
        with pytest.raises(ValueError, match=message):
            AsyncIOSequenceBuffer(rpcs, size)
    with pytest.raises(ValueError, match="MFCDef 'gen': input_keys must be a sequence of str keys"):
        MFCDef("gen", 1, input_keys=("packed_prompts"))
    assert MFCDef("gen", 1, input_keys=("packed_prompts",)).input_keys == ("packed_prompts",)

    async def go():
        gen = Mfc("gen", 2, ["p"])
        buf = AsyncIOSequenceBuffer([gen], np.int64(8))
        await buf.put_batch([Sample(i, ["p"]) for i in range(3)])
        gen.n_seqs = 3
        with pytest.raises(ValueError, match="asks for 3 entries; the buffer was built with 2"):
            await buf.get_batch_for_rpc(gen)
        gen.n_seqs = 2
        assert len((await buf.get_batch_for_rpc(gen))[0]) == 2

    run(go())


def test_entry_ids_are_compared_whole_and_samples_must_be_a_list():
    """An entry ``["a|b"]`` was refused as a duplicate of ``["a", "b"]`` (the ids were
    joined by ``|``); a dict of samples failed with a raw AttributeError."""

    async def go():
        buf = AsyncIOSequenceBuffer([Mfc("gen", 1, ["p"])], 8)
        two = Sample("a", ["p"])
        two.ids = ["a", "b"]
        await buf.put_batch([Sample("a|b", ["p"]), two, Sample("a\\|b", ["p"])])
        assert buf.size == 3
        with pytest.raises(ValueError, match="duplicate|appears"):
            await buf.put_batch([Sample("a|b", ["p"])])
        for bad in ({"a": 1}, Sample("z", ["p"])):
            with pytest.raises(ValueError, match="samples must be a list of SequenceSample"):
                await buf.put_batch(bad)
        assert buf.size == 3

    run(go())


def test_a_gather_that_raises_gives_the_batch_back():
    """The read was committed (the last MFC's read freeing the slots) before the gather
    ran: a gather that raised (a class whose gather cannot join the entries' metadata, an
    MFC passed in with a key the entries lack) lost the batch, and a retry waited for ever.
    Now the batch is given back, nothing read."""

    class Picky(Sample):
        fail = True

        @classmethod
        def gather(cls, samples, keys=None):
            if cls.fail:
                raise KeyError("version_start")
            return super().gather(samples, keys=keys)

    async def go():
        gen = Mfc("gen", 2, ["p"])
        buf = AsyncIOSequenceBuffer([gen], 4)
        await buf.put_batch([Picky(1, ["p"]), Picky(2, ["p"])])
        with pytest.raises(KeyError, match="version_start"):
            await buf.get_batch_for_rpc(gen)
        assert buf.size == 2
        Picky.fail = False
        _, got = await asyncio.wait_for(buf.get_batch_for_rpc(gen), 5)
        assert sorted(got.ids) == ["1", "2"] and buf.size == 0
        # The stand-in's native gather of a key the entries lack, named by the MFC passed in.
        await buf.put_batch([_standin(i, ["p"]) for i in range(2)])
        with pytest.raises(KeyError, match="has no key"):
            await buf.get_batch_for_rpc(MFCDef("gen", 2, ["p", "v"]))
        assert buf.size == 2
        _, got = await asyncio.wait_for(buf.get_batch_for_rpc(gen), 5)
        assert sorted(got.ids) == ["s0", "s1"] and buf.size == 0

    run(go())


class Poisoned(Sample):
    """A sample class whose gather refuses a batch holding id "bad", or (``joint``)
    holding two ids of different parity, however often it is asked."""

    joint = False

    @classmethod
    def gather(cls, samples, keys=None):
        ids = [i for s in samples for i in s.ids]
        if "bad" in ids:
            raise TypeError("cannot convert the tokens of bad")
        if cls.joint and len({int(i) % 2 for i in ids}) > 1:
            raise ValueError("cannot join odd and even")
        return super().gather(samples, keys=keys)


def test_a_sample_that_cannot_be_gathered_is_dropped_the_second_time(caplog):
    """Given back after every failed gather, the batch holding it was served again, to
    fail again, at every get: the MFC never read anything else. Now the first failure
    gives it back (the failure may pass), and the same batch failing again drops the
    sample that cannot be gathered, gives its batch-mate back, and names it, also in a
    warning on the ``rollout_buffer.areal`` logger (it went to ``_native.areal``)."""
    import logging

    caplog.set_level(logging.WARNING, logger="rollout_buffer")

    async def go():
        gen = Mfc("gen", 2, ["p"])
        buf = AsyncIOSequenceBuffer([gen], 8)
        await buf.put_batch([Poisoned(i, ["p"]) for i in ("bad", 2, 4, 6)])
        with pytest.raises(TypeError, match="tokens of bad"):
            await buf.get_batch_for_rpc(gen)
        assert buf.size == 4, "given back the first time"
        with pytest.raises(SamplesDropped, match=r"MFC gen .*bad \(slot 0\)") as dropped:
            await buf.get_batch_for_rpc(gen)
        assert isinstance(dropped.value.__cause__, TypeError)
        assert "2 (slot" not in str(dropped.value), "its batch-mate is kept"
        assert buf.size == 3
        warned = [r for r in caplog.records if "cannot be gathered" in r.getMessage()]
        assert [r.name for r in warned] == ["rollout_buffer.areal"], caplog.records
        _, got = await asyncio.wait_for(buf.get_batch_for_rpc(gen), 5)
        assert got.ids == ["2", "4"]
        await buf.put_batch([Poisoned(8, ["p"])])
        _, last = await asyncio.wait_for(buf.get_batch_for_rpc(gen), 5)
        assert last.ids == ["6", "8"] and buf.size == 0

    run(go())


def test_an_mfc_that_read_a_dropped_entry_amends_the_rest_of_its_batch():
    """ref cannot gather "bad" and drops it; rew had read it, with "good", before. rew's
    amend of both raised StaleHandle for the dropped one before any merge, so "good"
    never got rew's output and train never read it. Now the dropped entry is skipped.
    A sample put again under the dropped id is amended as any other."""

    class RefCannot(Sample):
        @classmethod
        def gather(cls, samples, keys=None):
            if "q" in keys and any("bad" in s.ids for s in samples):
                raise TypeError("cannot convert q of bad")
            return super().gather(samples, keys=keys)

    async def go():
        rew, ref = Mfc("rew", 2, ["p"], ["r"]), Mfc("ref", 2, ["q"])
        train = Mfc("train", 1, ["p", "r"])
        buf = AsyncIOSequenceBuffer([rew, ref, train], 8)
        await buf.put_batch([RefCannot("bad", ["p", "q"]), RefCannot("good", ["p", "q"])])
        got, _ = await buf.get_batch_for_rpc(rew)
        for raised in (TypeError, SamplesDropped):
            with pytest.raises(raised):
                await buf.get_batch_for_rpc(ref)
        await buf.amend_batch(got, [RefCannot("bad", ["r"]), RefCannot("good", ["r"])])
        _, trained = await asyncio.wait_for(buf.get_batch_for_rpc(train), 5)
        assert trained.ids == ["good"]
        again = await buf.put_batch([RefCannot("bad", ["p"]), RefCannot("new", ["p"])])
        got, _ = await asyncio.wait_for(buf.get_batch_for_rpc(rew), 5)
        assert sorted(got.tolist()) == sorted(again.tolist())
        await buf.amend_batch(again, [RefCannot("bad", ["r"]), RefCannot("new", ["r"])])
        _, trained = await asyncio.wait_for(buf.get_batch_for_rpc(train), 5)
        assert trained.ids == ["bad"], "the new entry under the dropped id was amended"

    run(go())


def test_a_batch_that_cannot_be_gathered_together_loses_its_oldest_only():
    """Each sample gathers alone, but not with the other: the oldest is dropped, so the
    next get serves a different batch."""

    async def go():
        Poisoned.joint = True
        try:
            gen = Mfc("gen", 2, ["p"])
            buf = AsyncIOSequenceBuffer([gen], 8)
            await buf.put_batch([Poisoned(i, ["p"]) for i in (1, 2, 4)])
            with pytest.raises(ValueError, match="odd and even"):
                await buf.get_batch_for_rpc(gen)
            with pytest.raises(SamplesDropped, match=r"1 \(slot 0\)$") as dropped:
                await buf.get_batch_for_rpc(gen)
            assert isinstance(dropped.value.__cause__, ValueError)
            _, got = await asyncio.wait_for(buf.get_batch_for_rpc(gen), 5)
            assert got.ids == ["2", "4"] and buf.size == 0
        finally:
            Poisoned.joint = False

    run(go())


def test_an_interrupted_gather_drops_nothing():
    """An error that is no Exception (a KeyboardInterrupt, a cancellation) says nothing
    about the data: the batch goes back however often it happens."""

    class Interrupted(BaseException):
        pass

    class Interrupting(Sample):
        interrupt = True

        @classmethod
        def gather(cls, samples, keys=None):
            if cls.interrupt:
                raise Interrupted()
            return super().gather(samples, keys=keys)

    async def go():
        gen = Mfc("gen", 1, ["p"])
        buf = AsyncIOSequenceBuffer([gen], 4)
        await buf.put_batch([Interrupting(1, ["p"])])
        for _ in range(3):
            with pytest.raises(Interrupted):
                await buf.get_batch_for_rpc(gen)
        assert buf.size == 1
        Interrupting.interrupt = False
        _, got = await asyncio.wait_for(buf.get_batch_for_rpc(gen), 5)
        assert got.ids == ["1"] and buf.size == 0

    run(go())


def test_an_amend_naming_one_slot_twice_is_refused_before_any_merge():
    """Both merges ran, then the buffer refused the repeated slot: the entry held keys the
    buffer never learned of, and the MFC reading them waited for ever."""

    async def go():
        gen, train = Mfc("gen", 1, ["p"], ["x", "y"]), Mfc("train", 1, ["p", "x", "y"])
        buf = AsyncIOSequenceBuffer([gen, train], 4)
        stored = Sample("a", ["p"])
        idx = await buf.put_batch([stored])
        await buf.get_batch_for_rpc(gen)
        with pytest.raises(ValueError, match="indices holds slot 0 more than once"):
            await buf.amend_batch([idx[0], idx[0]], [Sample("a", ["x"]), Sample("a", ["y"])])
        assert stored.keys == {"p"}, "nothing merged"
        await buf.amend_batch(idx, [Sample("a", ["x", "y"])])
        _, got = await asyncio.wait_for(buf.get_batch_for_rpc(train), 5)
        assert got.ids == ["a"] and buf.size == 0

    run(go())


def test_an_amend_whose_merge_raises_wakes_the_getters_of_what_it_made_ready():
    """The entries merged before the failing one are made ready, but the getters already
    waiting were woken only by an amend that returned: they slept on while a new get was
    served at once."""

    class Broken(Sample):
        def update_(self, other):
            raise RuntimeError("a broken merge")

    async def go():
        gen, train = Mfc("gen", 2, ["a"], ["b"]), Mfc("train", 1, ["a", "b"])
        buf = AsyncIOSequenceBuffer([gen, train], 4)
        idx = await buf.put_batch([Sample(1, ["a"]), Broken(2, ["a"])])
        await buf.get_batch_for_rpc(gen)
        waiter = asyncio.ensure_future(buf.get_batch_for_rpc(train))
        await asyncio.sleep(0)  # a yield: the getter runs until it waits
        assert not waiter.done()
        with pytest.raises(RuntimeError, match="a broken merge"):
            await buf.amend_batch(idx, [Sample(1, ["b"]), Sample(2, ["b"])])
        _, got = await asyncio.wait_for(waiter, 5)
        assert got.ids == ["1"]

    run(go())


def test_a_put_without_birth_times_sorts_among_areal_stamped_ones_by_arrival():
    """An unstamped put was numbered from 1, so it went before every put stamped as AReaL
    stamps (its monotonic clock in ns): served first although it came last."""
    import time

    async def go():
        gen = Mfc("gen", 1, ["p"])
        buf = AsyncIOSequenceBuffer([gen], 4)
        await buf.put_batch([Sample("early", ["p"])], birth_times=[time.monotonic_ns()])
        await buf.put_batch([Sample("late", ["p"])])
        order = [(await buf.get_batch_for_rpc(gen))[1].ids for _ in range(2)]
        assert order == [["early"], ["late"]]

    run(go())


def test_a_put_of_a_generator_is_stamped_as_a_list_is():
    """A generator has no len(): its samples were numbered from 1 by the native put, and
    so served before every older, stamped sample."""

    async def go():
        gen = Mfc("gen", 2, ["p"])
        buf = AsyncIOSequenceBuffer([gen], 4)
        await buf.put_batch([Sample("old1", ["p"]), Sample("old2", ["p"])])
        await buf.put_batch(Sample(f"new{i}", ["p"]) for i in range(2))
        order = [(await buf.get_batch_for_rpc(gen))[1].ids for _ in range(2)]
        assert order == [["old1", "old2"], ["new0", "new1"]]

    run(go())


def test_a_get_timeout_is_seconds_none_or_infinity():
    """math.inf was refused, though every other wait of the package takes it; a str failed
    inside a comparison with a TypeError naming nothing."""
    import math

    async def go():
        gen = Mfc("gen", 1, ["p"])
        buf = AsyncIOSequenceBuffer([gen], 4)
        for bad in ["1", -1, float("nan"), True, [1]]:
            with pytest.raises(ValueError, match="timeout must be a number of seconds"):
                await buf.get_batch_for_rpc(gen, timeout=bad)
        waiting = asyncio.ensure_future(buf.get_batch_for_rpc(gen, timeout=math.inf))
        await asyncio.sleep(0)
        assert not waiting.done()
        await buf.put_batch([Sample("a", ["p"])])
        _, got = await asyncio.wait_for(waiting, 10)
        assert got.ids == ["a"]
        with pytest.raises(Timeout):
            await buf.get_batch_for_rpc(gen, timeout=np.float64(0.01))

    run(go())
