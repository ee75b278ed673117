"""Values stored exactly or refused, on every way in and out: Python lists that numpy would
round, 0-d arrays, ragged rows of different dtypes, masked entries, string fields of two
dimensions, and Arrow capsules that do not hold what they claim (a ValueError, never a
PanicException)."""

import numpy as np
import pyarrow as pa
import pytest

import rollout_buffer as rb
from rollout_buffer.replay import ReplayBuffer


def one_rpc(n=1, inputs=("x",), capacity=16):
    return rb.Buffer(capacity, [rb.Rpc("r", n, inputs=list(inputs))])


def first(buf):
    return buf.get_batch_for_rpc_blocking("r", timeout=5)


@pytest.mark.parametrize(
    "column, where",
    [
        ([2**63 + 5, 1], "[0]"),  # past int64: numpy makes float64
        ([2**53 + 1, 0.5], "[0]"),  # past 2^53 beside a float
        ([0.5, np.int64(2**60)], "[1]"),  # a numpy integer too
        ([[1.5, 2], [3, 2**54 + 1]], "[1][1]"),  # rows of a 2-d column
    ],
)
def test_a_list_column_whose_ints_numpy_would_round_is_refused(column, where):
    buf = one_rpc(n=len(column))
    ids = [f"s{i}" for i in range(len(column))]
    with pytest.raises(ValueError, match=rf"column \"x\": the integer at {re_escape(where)} is past 2\^53"):
        buf.put_columns_blocking({"x": column}, ids=ids)
    assert len(buf) == 0
    # The same values through (values, offsets) are refused as well.
    flat = [v for row in column for v in (row if isinstance(row, list) else [row])]
    with pytest.raises(ValueError, match="values: the integer at"):
        buf.put_columns_blocking({"x": (flat, [0, len(flat)])}, ids=["s0"])
    assert len(buf) == 0


def test_an_integer_array_among_list_rows_is_checked_too():
    buf = one_rpc(n=2)
    with pytest.raises(ValueError, match=r"the integer at \[0\]\[0\] is past 2\^53"):
        buf.put_columns_blocking({"x": [np.array([2**60 + 1, 1]), [0.5, 1.5]]}, ids=["a", "b"])
    assert len(buf) == 0


def re_escape(text):
    import re

    return re.escape(text)


def test_a_list_column_of_exact_numbers_is_stored_as_numpy_reads_it():
    buf = one_rpc(n=3)
    # Ints up to 2^53 beside floats are exact in float64: taken, as before.
    buf.put_columns_blocking({"x": [2**53, 0.5, True]}, ids=["a", "b", "c"])
    got = first(buf).columns()["x"]
    assert got.dtype == np.float64
    assert got.tolist() == [float(2**53), 0.5, 1.0]
    # Ints alone stay int64, past 2^53 too.
    buf = one_rpc(n=2)
    buf.put_columns_blocking({"x": [2**62 + 1, -(2**62) - 3]}, ids=["a", "b"])
    assert first(buf).columns()["x"].tolist() == [2**62 + 1, -(2**62) - 3]


def test_a_0d_array_in_a_dict_sample_stays_a_scalar():
    buf = one_rpc(n=2)
    buf.put_batch_blocking([
        {"id": "a", "x": np.array(5, np.int32)},
        {"id": "b", "x": np.int32(7)},
    ])
    got = [s["x"] for s in first(buf).samples()]
    assert got == [5, 7]
    assert all(np.ndim(v) == 0 for v in got)


def test_ragged_rows_of_different_dtypes_are_refused_not_promoted():
    buf = one_rpc()
    for rows in (
        [np.array([2**62 + 1]), np.array([0.5])],
        [np.array([1], np.int32), np.array([2.5], np.float32)],
        [np.array([True]), np.array([3], np.int32)],
    ):
        with pytest.raises(ValueError, match=r"field `x`: row 1 is .*, row 0 .*share one dtype"):
            buf.put_batch_blocking([{"id": "a", "x": rows}])
        with pytest.raises(ValueError, match="share one dtype"):
            rb.ragged(rows)
    assert len(buf) == 0
    # Rows of one dtype are taken, exactly.
    buf.put_batch_blocking([{"id": "a", "x": [np.array([2**62 + 1, 2]), np.array([3])]}])
    got = first(buf).samples()[0]["x"]
    assert [r.tolist() for r in got] == [[2**62 + 1, 2], [3]]


def test_masked_entries_are_refused_on_every_dict_path():
    masked = np.ma.array([1, 2, 3], mask=[0, 1, 0])
    buf = one_rpc()
    with pytest.raises(ValueError, match=r"field `x`: masked \(a null\) at element 1"):
        buf.put_batch_blocking([{"id": "a", "x": masked}])
    with pytest.raises(ValueError, match=r"row 1: masked \(a null\) at element 0"):
        buf.put_batch_blocking([{"id": "a", "x": [np.array([1]), np.ma.array([2], mask=[1])]}])
    assert len(buf) == 0
    # A completion (outputs given as dicts) is refused too, and the lease kept.
    two = rb.Buffer(8, [rb.Rpc("g", 1, inputs=["x"], outputs=["y"]), rb.Rpc("t", 1, inputs=["y"])])
    two.put_batch_blocking([{"id": "a", "x": 1}])
    batch = two.get_batch_for_rpc_blocking("g", timeout=5)
    with pytest.raises(ValueError, match="masked"):
        batch.complete_blocking([{"y": masked}])
    batch.complete_blocking([{"y": masked.filled(0)}])
    assert two.get_batch_for_rpc_blocking("t", timeout=5).samples()[0]["y"].tolist() == [1, 0, 3]
    # An unmasked masked array is plain data.
    buf.put_batch_blocking([{"id": "b", "x": np.ma.array([4, 5], mask=[0, 0])}])
    assert first(buf).samples()[0]["x"].tolist() == [4, 5]


def test_masked_ids_and_offsets_are_refused():
    buf = one_rpc(n=2)
    with pytest.raises(ValueError, match=r"ids: masked \(a null\) at element 1"):
        buf.put_columns_blocking({"x": np.arange(2)}, ids=np.ma.array([1, 2], mask=[0, 1]))
    with pytest.raises(ValueError, match=r"offsets: masked \(a null\) at element 1"):
        buf.put_columns_blocking(
            {"x": (np.arange(4), np.ma.array([0, 1, 4], mask=[0, 1, 0]))}, ids=["a", "b"]
        )
    assert len(buf) == 0


def test_a_numpy_bool_is_a_metadata_bool():
    buf = one_rpc(n=2)
    buf.put_batch_blocking([
        {"id": "a", "x": 1, "meta": {"ok": np.True_}},
        {"id": "b", "x": 2, "meta": {"ok": np.bool_(False)}},
    ])
    assert [s["meta"]["ok"] for s in first(buf).samples()] == [True, False]


def test_a_2d_string_field_keeps_its_shape_on_every_way_out():
    text = np.array([[["a", "b"], ["c", "d"]], [["e", "f"], ["g", "h"]]])
    buf = one_rpc(n=2)
    buf.put_columns_blocking({"x": text}, ids=["s0", "s1"])
    batch = first(buf)
    expected = text.tolist()
    assert [s["x"] for s in batch.samples()] == expected
    assert batch.columns()["x"] == expected
    assert batch.to_arrow().column("x").to_pylist() == expected
    # A 1-d string field is a flat list, as before.
    buf = one_rpc()
    buf.put_columns_blocking({"x": np.array([["p", "q"]])}, ids=["s"])
    assert first(buf).samples()[0]["x"] == ["p", "q"]


class _SameCapsules:
    """Hands out the same capsule pair on every call, as a careless producer might."""

    def __init__(self, source):
        self.source, self.capsules = source, None

    def __arrow_c_array__(self, requested_schema=None):
        self.capsules = self.capsules or self.source.__arrow_c_array__()
        return self.capsules


class _MismatchedCapsules:
    """A list<int64> schema over an int64 array."""

    def __arrow_c_array__(self, requested_schema=None):
        schema = pa.array([[1]], pa.list_(pa.int64())).__arrow_c_array__()[0]
        return schema, pa.array([1], pa.int64()).__arrow_c_array__()[1]


def test_arrow_capsules_that_lie_are_a_value_error_not_a_panic():
    reused = _SameCapsules(pa.record_batch({"id": ["a"], "x": [1]}))
    buf = one_rpc()
    buf.put_columns_blocking(reused)
    other = one_rpc()
    with pytest.raises(ValueError, match="Arrow: __arrow_c_array__ gave a malformed array"):
        other.put_columns_blocking(reused)
    with pytest.raises(ValueError, match="Arrow: __arrow_c_array__ gave a malformed array"):
        other.put_columns_blocking({"x": _MismatchedCapsules()}, ids=["a"])
    assert len(other) == 0
    # The buffer goes on serving.
    other.put_columns_blocking({"x": np.array([3])}, ids=["b"])
    assert first(other).columns()["x"].tolist() == [3]


def test_replay_refuses_a_null_inside_a_per_token_list(tmp_path):
    buf = ReplayBuffer(str(tmp_path), target_group_size=1, min_group_size=1, max_uses_per_group=1)
    base = {
        "environment": ["e", "e"],
        "example_id": ["q", "q2"],
        "policy_version": [1, 1],
        "rollout_uid": ["r0", "r1"],
        "reward": [0.0, 1.0],
    }
    try:
        tokens = pa.array([[1, 2], [1, None, 3]], pa.list_(pa.int32()))
        with pytest.raises(ValueError, match=r"r1.*output_tokens.*null element"):
            buf.add_rollouts({**base, "output_tokens": tokens})
        logprobs = pa.chunked_array([
            pa.array([[0.5]], pa.list_(pa.float32())),
            pa.array([[None]], pa.list_(pa.float32())),
        ])
        with pytest.raises(ValueError, match=r"r1.*logprobs.*null element"):
            buf.add_rollouts(pa.table({**base, "logprobs": logprobs}))
        assert buf.ready_count() == 0
        # A whole row left out (a null list) is still the field left out.
        buf.add_rollouts({**base, "output_tokens": pa.array([[1, 2], None], pa.list_(pa.int32()))})
        assert buf.ready_count() == 2
    finally:
        buf.close()


def test_meta_and_birth_columns_take_arrow_and_refuse_bools():
    buf = one_rpc(n=2)
    buf.put_columns_blocking(
        {"x": np.arange(2), "birth": pa.array([5, 3], pa.int64())},
        ids=["a", "b"],
        meta={"score": pa.array([0.5, 1.5]), "env": pa.chunked_array([["m"], ["c"]])},
    )
    got = {s["id"]: (s["birth"], s["meta"]) for s in first(buf).samples()}
    assert got == {"a": (5, {"score": 0.5, "env": "m"}), "b": (3, {"score": 1.5, "env": "c"})}
    buf = one_rpc(n=2)
    for births in ([True, 2], np.array([True, False])):
        with pytest.raises(ValueError, match='column "birth": non-negative ints'):
            buf.put_columns_blocking({"x": np.arange(2), "birth": births}, ids=["a", "b"])
    with pytest.raises(ValueError, match=r'meta "score" has nulls'):
        buf.put_columns_blocking({"x": np.arange(2)}, ids=["a", "b"], meta={"score": pa.array([1.0, None])})
    assert len(buf) == 0


def test_a_lone_surrogate_in_a_string_array_is_named_as_such():
    buf = one_rpc()
    for text in (np.array(["ok", "bad\udc80"]), np.array(["ok", "bad\udc80"], dtype=object)):
        with pytest.raises(ValueError, match=r'column "x", row 0, element 1: not valid Unicode \(a lone surrogate'):
            buf.put_columns_blocking({"x": [text]}, ids=["a"])
    with pytest.raises(ValueError, match=r"element 1 is int, not str"):
        buf.put_columns_blocking({"x": [np.array(["ok", 3], dtype=object)]}, ids=["a"])
    assert len(buf) == 0
