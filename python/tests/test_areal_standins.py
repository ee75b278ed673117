"""The module's stand-ins for AReaL's ``SequenceSample``, ``MFCDef`` and
``build_graph`` (for code without AReaL): AReaL's semantics for what a buffer touches,
``gather``, ``unpack``, ``split_with_spec`` and ``update_``, and the buffer driven by them."""

from types import SimpleNamespace

import numpy as np
import pytest

from rollout_buffer.areal import AsyncIOSequenceBuffer, MFCDef, SequenceSample, build_graph
from test_areal import run


def test_the_stand_ins_follow_areal():
    s = SequenceSample(
        keys={"tok", "rew"},
        ids=[1, 2, 3],
        seqlens={"tok": [[2], [3], [1]], "rew": [[1], [1], [1]]},
        data={"tok": np.arange(6), "rew": np.array([0.5, 1.0, 0.0])},
        metadata={"src": ["a", "b", "c"]},
    )
    parts = s.unpack()
    assert [p.ids for p in parts] == [["1"], ["2"], ["3"]]
    # AReaL's split_with_spec: a SequenceSplitSpec's partitions (or its sizes).
    halves = s.split_with_spec(SimpleNamespace(partitions=[(0, 1), (1, 3)]))
    assert [h.ids for h in halves] == [["1"], ["2", "3"]]
    assert halves[1].data["tok"].tolist() == [2, 3, 4, 5] and halves[1].metadata == {"src": ["b", "c"]}
    assert [h.ids for h in s.split_with_spec(SimpleNamespace(sizes=[2, 1]))] == [["1", "2"], ["3"]]
    for bad in ([(0, 1), (2, 3)], [(0, 2)], [(1, 3)], [(0, 0), (0, 3)]):
        with pytest.raises(ValueError, match="do not cover"):
            s.split_with_spec(SimpleNamespace(partitions=bad))
    assert parts[1].data["tok"].tolist() == [2, 3, 4] and parts[1].metadata == {"src": ["b"]}
    back = SequenceSample.gather(parts)
    assert back.ids == s.ids and back.data["tok"].tolist() == list(range(6))
    assert back.seqlens == s.seqlens
    only = SequenceSample.gather(parts, keys=["rew"])
    assert only.keys == {"rew"} and only.data["rew"].tolist() == [0.5, 1.0, 0.0]
    with pytest.raises(KeyError):
        SequenceSample.gather(parts, keys=["nope"])
    with pytest.raises(ValueError, match="not unique"):
        SequenceSample(keys={"a"}, ids=[1, 1], seqlens={"a": [[1], [1]]})
    for bad, says in (([1, 2], "not 2"), ("ab", "not str")):
        with pytest.raises(ValueError, match=rf"metadata\['m'\] must be a list of 1 entries .*{says}"):
            SequenceSample(keys=set(), ids=["a"], seqlens={}, metadata={"m": bad})
    parts[0].update_(SequenceSample(keys={"adv"}, ids=[1], seqlens={"adv": [[2]]}, data={"adv": np.ones(2)}))
    assert parts[0].keys == {"tok", "rew", "adv"} and parts[0].data["adv"].tolist() == [1.0, 1.0]
    with pytest.raises(ValueError):
        parts[0].update_(parts[1])

    nodes = build_graph([
        MFCDef("gen", 2, ["p"], ["x"]),
        MFCDef("rew", 2, ["x"], ["r"]),
        MFCDef("ref", 2, ["x"], ["lp"]),
        MFCDef("train", 2, ["x", "r", "lp"]),
    ])
    gen, rew, ref, train = nodes
    assert gen.is_src and train.is_dst and not rew.is_src
    assert [n.name for n in gen.all_successors()] == ["rew", "train", "ref"]
    assert {p.name for p in train.parents} == {"gen", "rew", "ref"}
    with pytest.raises(ValueError):
        build_graph([MFCDef("a", 1), MFCDef("a", 1)])


def test_the_module_stand_ins_drive_the_buffer():
    async def go():
        gen, train = build_graph([MFCDef("gen", 2, ["p"], ["x"]), MFCDef("train", 2, ["x"])])
        buf = AsyncIOSequenceBuffer([gen, train], 8)
        batch = SequenceSample(keys={"p"}, ids=["a", "b"], seqlens={"p": [[3], [4]]},
                               data={"p": np.arange(7)})
        idx = await buf.put_batch(batch.unpack())
        _, got = await buf.get_batch_for_rpc(gen)
        assert isinstance(got, SequenceSample) and got.data["p"].tolist() == list(range(7))
        await buf.amend_batch(idx, [
            SequenceSample(keys={"x"}, ids=[i], seqlens={"x": [[1]]}, data={"x": np.array([n])})
            for i, n in (("a", 10), ("b", 20))
        ])
        _, got = await buf.get_batch_for_rpc(train)
        assert got.ids == ["a", "b"] and got.data["x"].tolist() == [10, 20]
        assert buf.size == 0 and buf.n_rpcs == 2 and buf.max_size == 8
        assert buf.rpcs == [gen, train]

    run(go())
