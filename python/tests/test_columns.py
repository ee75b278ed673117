"""The columnar data plane: puts of columns (numpy and Arrow), batches as numpy columns
that view the buffer's memory and as Arrow for pyarrow, polars and DuckDB, outputs and
amends as columns, bad input refused whole, and many asyncio tasks mixing both APIs."""

import asyncio
import gc

import duckdb
import numpy as np
import polars as pl
import pyarrow as pa
import pytest

import rollout_buffer as rb

NUMERIC = [np.int32, np.int64, np.float32, np.float64, np.uint8, np.bool_]


def column_of(dtype, n, k):
    if dtype is np.bool_:
        return np.arange(n * k).reshape(n, k) % 3 == 0
    return np.arange(n * k, dtype=dtype).reshape(n, k)


def ptr(a):
    return a.__array_interface__["data"][0]


def one_rpc(n=4, inputs=("x",), outputs=(), capacity=16, **kw):
    return rb.Buffer(capacity, [rb.Rpc("train", n, inputs=list(inputs), outputs=list(outputs))], **kw)


@pytest.mark.parametrize("dtype", NUMERIC)
def test_every_dtype_round_trips_through_columns_arrow_and_dicts(dtype):
    x = column_of(dtype, 4, 3)
    ids = [f"s{i}" for i in range(4)]
    # Columns in, columns out.
    buf = one_rpc()
    buf.put_columns_blocking({"x": x}, ids=ids)
    batch = buf.get_batch_for_rpc_blocking("train")
    got = batch.columns()["x"]
    assert got.dtype == x.dtype and got.shape == x.shape
    np.testing.assert_array_equal(got, x)
    # ... and as Arrow.
    table = batch.to_arrow()
    assert table.column("id").to_pylist() == ids
    assert [np.array(v, dtype=dtype).tolist() for v in table.column("x").to_pylist()] == x.tolist()
    batch.commit_blocking()
    # Arrow in (a pyarrow Table), columns out.
    buf = one_rpc()
    arrow_in = pa.table({"id": ids, "x": pa.array(list(x), type=pa.list_(pa.from_numpy_dtype(x.dtype)))})
    buf.put_columns_blocking(arrow_in)
    np.testing.assert_array_equal(buf.get_batch_for_rpc_blocking("train").columns()["x"], x)
    # Dicts in, columns out, and the other way round.
    buf = one_rpc()
    buf.put_batch_blocking([{"id": i, "x": row} for i, row in zip(ids, x)])
    batch = buf.get_batch_for_rpc_blocking("train")
    np.testing.assert_array_equal(batch.columns()["x"], x)
    batch.commit_blocking()
    buf.put_columns_blocking({"x": x}, ids=ids)
    rows = buf.get_batch_for_rpc_blocking("train").samples()
    for row, want in zip(rows, x):
        np.testing.assert_array_equal(row["x"], want)


def test_scalars_strings_metadata_and_births():
    buf = one_rpc(inputs=("reward", "text"))
    buf.put_columns_blocking(
        {"id": np.arange(4), "birth": [4, 3, 2, 1], "reward": np.array([0.5, 1, 0, 2]),
         "text": ["a", "bb", "ccc", ""]},
        meta={"environment": ["math"] * 4, "policy_version": np.array([1, 1, 2, 2])},
    )
    batch = buf.get_batch_for_rpc_blocking("train")  # Fifo: oldest birth first
    cols = batch.columns()
    assert cols["text"] == ["", "ccc", "bb", "a"]
    np.testing.assert_array_equal(cols["reward"], [2, 0, 1, 0.5])
    table = batch.to_arrow()
    assert table.column("id").to_pylist() == ["3", "2", "1", "0"]
    assert table.column("policy_version").to_pylist() == [2, 2, 1, 1]
    assert table.column("environment").to_pylist() == ["math"] * 4
    assert [s["meta"]["policy_version"] for s in batch.samples()] == [2, 2, 1, 1]
    batch.commit_blocking()
    # The same through Arrow: int ids, births, strings, and metadata named by column.
    buf.put_columns_blocking(
        pa.table({"id": pa.array([10, 11, 12, 13], pa.int64()), "birth": pa.array([1, 2, 3, 4], pa.uint64()),
                  "reward": [0.5, 1.0, 0.0, 2.0], "text": ["a", "bb", "ccc", ""],
                  "environment": pa.array(["code"] * 4, pa.large_string())}),
        meta=["environment"],
    )
    batch = buf.get_batch_for_rpc_blocking("train")
    assert batch.columns()["text"] == ["a", "bb", "ccc", ""]
    assert [s["id"] for s in batch.samples()] == ["10", "11", "12", "13"]
    assert {s["meta"]["environment"] for s in batch.samples()} == {"code"}


def test_variable_length_fields_as_values_and_offsets():
    buf = one_rpc(inputs=("tokens",))
    values = np.arange(10, dtype=np.int32)
    offsets = np.array([0, 3, 3, 7, 10])
    buf.put_columns_blocking({"tokens": (values, offsets)}, ids=["a", "b", "c", "d"])
    batch = buf.get_batch_for_rpc_blocking("train")
    got_values, got_offsets = batch.columns()["tokens"]
    np.testing.assert_array_equal(got_values, values)
    np.testing.assert_array_equal(got_offsets, offsets)
    assert [list(s["tokens"]) for s in batch.samples()] == [[0, 1, 2], [], [3, 4, 5, 6], [7, 8, 9]]
    batch.commit_blocking()
    # A list of arrays is the per-sample form of the same field.
    buf.put_columns_blocking({"tokens": [np.array([1], np.int32), np.array([2, 3], np.int32),
                                         np.array([], np.int32), np.array([4], np.int32)]},
                             ids=["e", "f", "g", "h"])
    batch = buf.get_batch_for_rpc_blocking("train")
    vals, offs = batch.columns()["tokens"]
    assert vals.tolist() == [1, 2, 3, 4] and offs.tolist() == [0, 1, 3, 3, 4]
    batch.commit_blocking()
    # Ragged fields from Arrow list columns (polars exports large lists and strings).
    df = pl.DataFrame({"id": ["p", "q", "r", "s"], "tokens": [[1], [2, 3], [], [4, 5, 6]]},
                      schema={"id": pl.String, "tokens": pl.List(pl.Int32)})
    buf.put_columns_blocking(df)
    vals, offs = buf.get_batch_for_rpc_blocking("train").columns()["tokens"]
    assert vals.tolist() == [1, 2, 3, 4, 5, 6] and offs.tolist() == [0, 1, 3, 3, 6]


def test_columns_view_the_buffers_memory_and_outlive_everything():
    buf = one_rpc(n=8, capacity=8)
    x = np.random.default_rng(0).standard_normal((8, 256)).astype(np.float32)
    buf.put_columns_blocking({"x": x}, ids=[f"a{i}" for i in range(8)])
    batch = buf.get_batch_for_rpc_blocking("train")
    col = batch.columns()["x"]
    rows = [s["x"] for s in batch.samples()]
    # The column is one view over the stored rows: no copy on the way out.
    assert ptr(col) == ptr(rows[0])
    assert all(ptr(r) == ptr(col) + i * 256 * 4 for i, r in enumerate(rows))
    assert not col.flags.writeable and not col.flags.owndata
    arrow = batch.to_arrow()
    arrow_ptr = arrow.column("x").values.buffers()[1].address
    assert arrow_ptr == ptr(col), "Arrow's values buffer is the same memory"
    # Commit, reuse every slot with other data, drop the buffer: the views stay valid.
    batch.commit_blocking()
    buf.put_columns_blocking({"x": np.zeros((8, 256), np.float32)}, ids=[f"b{i}" for i in range(8)])
    buf.get_batch_for_rpc_blocking("train").commit_blocking()
    del batch, buf
    gc.collect()
    np.testing.assert_array_equal(col, x)
    np.testing.assert_array_equal(rows[5], x[5])
    assert arrow.column("x").to_pylist()[7] == pytest.approx(x[7].tolist())


def test_polars_and_duckdb_read_batches_directly():
    buf = one_rpc(inputs=("x", "reward"))
    x = np.arange(12, dtype=np.int64).reshape(4, 3)
    buf.put_columns_blocking({"x": x, "reward": np.array([0.0, 1.0, 0.5, 0.25])},
                             ids=["a", "b", "c", "d"])
    batch = buf.get_batch_for_rpc_blocking("train")
    via_polars = pl.from_arrow(batch.to_arrow())
    assert via_polars["reward"].to_list() == [0.0, 1.0, 0.5, 0.25]
    assert via_polars["x"].to_list()[2] == [6, 7, 8]
    # Without pyarrow in between: the batch exports an Arrow stream itself.
    direct = pl.DataFrame(batch)
    assert direct["id"].to_list() == ["a", "b", "c", "d"]
    rel = duckdb.sql("select id, reward, x[1] as first from batch order by id")
    assert rel.fetchall() == [("a", 0.0, 0), ("b", 1.0, 3), ("c", 0.5, 6), ("d", 0.25, 9)]
    arrow_table = batch.to_arrow()
    assert duckdb.sql("select sum(reward) from arrow_table").fetchall()[0][0] == pytest.approx(1.75)


def test_outputs_and_amends_as_columns():
    buf = rb.Buffer(8, [
        rb.Rpc("gen", 4, inputs=["prompt"], outputs=["tokens", "logp"]),
        rb.Rpc("train", 4, inputs=["tokens", "logp", "score"]),
    ], external_keys=["score"])
    handles = buf.put_columns_blocking({"prompt": np.ones((4, 2), np.int32)}, ids=list("abcd"))
    gen = buf.get_batch_for_rpc_blocking("gen")
    gen.complete_columns_blocking({
        "tokens": (np.arange(6, dtype=np.int32), np.array([0, 1, 2, 4, 6])),
        "logp": np.full((4, 1), -0.5, np.float32),
    })
    buf.amend_columns_blocking(handles, {"score": np.array([1.0, 2.0, 3.0, 4.0])})
    train = buf.get_batch_for_rpc_blocking("train")
    cols = train.columns()
    vals, offs = cols["tokens"]
    assert vals.tolist() == [0, 1, 2, 3, 4, 5] and offs.tolist() == [0, 1, 2, 4, 6]
    np.testing.assert_array_equal(cols["score"], [1.0, 2.0, 3.0, 4.0])
    assert cols["logp"].shape == (4, 1)


def test_non_contiguous_columns_are_copied_once():
    buf = one_rpc()
    base = np.arange(40, dtype=np.float64).reshape(8, 5)
    buf.put_columns_blocking({"x": base[::2, 1:4]}, ids=list("abcd"))
    np.testing.assert_array_equal(buf.get_batch_for_rpc_blocking("train").columns()["x"], base[::2, 1:4])


@pytest.mark.parametrize("columns, kwargs, message", [
    ({"x": np.zeros((4, 2)), "y": np.zeros((3, 2))}, {"ids": list("abcd")}, r'column "y" has 3 rows'),
    ({"x": np.zeros((4, 2), np.float16)}, {"ids": list("abcd")}, r'column "x": unsupported dtype float16'),
    ({"x": np.zeros((4, 2))}, {}, r"no ids"),
    ({"x": np.zeros((4, 2))}, {"ids": ["a", "b", "a", "c"]}, r'ids: "a" appears at rows 0 and 2'),
    ({"x": np.zeros((4, 2)), "extra": np.zeros(4)}, {"ids": list("abcd")}, r'column "extra" is not a key'),
    ({"x": (np.zeros(5), np.array([0, 2, 1, 5, 5]))}, {"ids": list("abcd")}, r'offsets decrease at row 1'),
    ({"x": (np.zeros(5), np.array([0, 2, 3, 4, 6]))}, {"ids": list("abcd")}, r"last offset must be the number of values, 5"),
    ({"x": np.float64(3.0)}, {"ids": ["a"]}, r"single value"),
    ({"x": np.zeros((4, 2))}, {"ids": list("abcd"), "meta": {"v": [1, 2, 3]}}, r'meta "v"'),
    # Each of these was stored wrong: nulls as NaN, masked values as they lay, a str as
    # one metadata value per character.
    ({"x": pa.array([1, None, 3, 4], pa.int64())}, {"ids": list("abcd")}, r'column "x": null at row 1'),
    ({"x": pa.chunked_array([[1.0], [2.0, None, 4.0]])}, {"ids": list("abcd")}, r'null at row 2'),
    ({"x": pl.Series([1, 2, None, 4], dtype=pl.Int32)}, {"ids": list("abcd")}, r'null at row 2'),
    ({"x": (pa.array([1.0, None, 2.0, 3.0, 4.0]), [0, 1, 2, 3, 5])}, {"ids": list("abcd")}, r"values: null at element 1"),
    ({"x": [pa.array([1.0, 2.0]), pa.array([1.0, None]), pa.array([1.0, 2.0]), pa.array([1.0, 2.0])]},
     {"ids": list("abcd")}, r'column "x", row 1: null at element 1'),
    ({"x": np.ma.array(np.zeros(4), mask=[0, 1, 0, 0])}, {"ids": list("abcd")}, r"masked \(a null\) at element 1"),
    ({"x": (np.zeros(2), np.zeros(2), np.zeros(2), np.zeros(2))}, {"ids": list("abcd")}, r"a tuple is a ragged column"),
    ({"x": np.zeros((4, 2))}, {"ids": list("abcd"), "meta": {"env": "math"}}, r'meta "env": one value per sample'),
    (pa.table({"nope": pa.array([], pa.int32())}), {"ids": ["a"]}, r'column "nope" is not a key'),
    # Stored, then every Arrow export of the batch failed.
    ({"x": np.zeros((4, 2))}, {"ids": list("abcd"), "meta": {"birth": list("wxyz")}}, r'meta: "birth" is the samples'),
    ({"x": np.zeros((4, 2))}, {"ids": list("abcd"), "meta": {"c": [1.0, 2, True, 4.0]}}, r'meta "c", row 2: a bool among float'),
    (pa.table({"x": pa.array([], pa.int32())}), {"ids": ["a"]}, r'ids has 1 rows, but column "x" has 0'),
])
def test_bad_columns_raise_value_errors_and_store_nothing(columns, kwargs, message):
    buf = one_rpc(inputs=("x", "y"))
    with pytest.raises(ValueError, match=message):
        buf.put_columns_blocking(columns, **kwargs)
    assert len(buf) == 0
    assert buf.stats()["put"] == 0


def test_bad_outputs_and_amends_change_nothing():
    buf = rb.Buffer(8, [
        rb.Rpc("gen", 2, inputs=["prompt"], outputs=["tokens"]),
        rb.Rpc("train", 2, inputs=["tokens"]),
    ])
    handles = buf.put_columns_blocking({"prompt": np.ones((2, 1), np.int32)}, ids=["a", "b"])
    gen = buf.get_batch_for_rpc_blocking("gen")
    with pytest.raises(ValueError, match=r'column "tokens" has 3 rows, but the batch has 2'):
        gen.complete_columns_blocking({"tokens": np.ones((3, 1), np.int32)})
    with pytest.raises(ValueError, match=r'column "other" is not a key'):
        buf.amend_columns_blocking(handles, {"other": np.ones(2)})
    # The batch is still held, whole: completing it properly works.
    gen.complete_columns_blocking({"tokens": np.ones((2, 4), np.int32)})
    assert buf.get_batch_for_rpc_blocking("train").columns()["tokens"].shape == (2, 4)


def test_fifty_asyncio_tasks_mixing_columnar_and_dict_calls():
    async def main():
        buf = rb.Buffer(64, [
            rb.Rpc("gen", 4, inputs=["prompt"], outputs=["tokens"]),
            rb.Rpc("train", 4, inputs=["prompt", "tokens"]),
        ])
        trained = []

        async def producer(p):
            for i in range(4):
                ids = [f"{p}-{i}-{j}" for j in range(4)]
                if (p + i) % 2:
                    await buf.put_columns({"prompt": np.full((4, 2), p, np.int32)}, ids=ids)
                else:
                    await buf.put_batch([{"id": k, "prompt": np.full(2, p, np.int32)} for k in ids])

        async def generator(g):
            for i in range(32):
                batch = await buf.get_batch_for_rpc("gen")
                prompts = batch.columns()["prompt"]
                if i % 2:
                    await batch.complete_columns({"tokens": prompts * 10})
                else:
                    await batch.complete([{"tokens": p * 10} for p in prompts])

        async def trainer(t):
            for _ in range(32):
                batch = await buf.get_batch_for_rpc("train")
                cols = batch.columns()
                np.testing.assert_array_equal(cols["tokens"], cols["prompt"] * 10)
                trained.extend(batch.to_arrow().column("id").to_pylist())
                await batch.commit()

        tasks = [producer(p) for p in range(40)] + [generator(g) for g in range(5)]
        tasks += [trainer(t) for t in range(5)]
        await asyncio.wait_for(asyncio.gather(*tasks), timeout=60)
        assert sorted(trained) == sorted(f"{p}-{i}-{j}" for p in range(40) for i in range(4) for j in range(4))
        assert len(buf) == 0

    asyncio.run(main())


def test_columnar_puts_are_durable(tmp_path):
    store = f"file://{tmp_path}"
    x = np.arange(24, dtype=np.float32).reshape(4, 6)
    buf = one_rpc(store=store)
    buf.put_columns_blocking({"x": x, "id": ["a", "b", "c", "d"]})
    buf.flush()
    buf.close()
    del buf
    reopened = one_rpc(store=store)
    assert len(reopened) == 4
    np.testing.assert_array_equal(reopened.get_batch_for_rpc_blocking("train").columns()["x"], x)


def test_any_memory_layout_reads_in_logical_order():
    buf = one_rpc(inputs=("x", "flags"))
    logical = np.arange(12, dtype=np.float64).reshape(4, 3)
    fortran = np.asfortranarray(logical)
    misaligned = np.frombuffer(b"\0" + logical.tobytes(), np.float64, offset=1).reshape(4, 3)
    odd_bools = np.array([[0, 2], [1, 0], [255, 1], [0, 0]], np.uint8).view(np.bool_)
    for i, x in enumerate([fortran, misaligned, logical.T.copy().T]):
        buf.put_columns_blocking({"x": x, "flags": odd_bools}, ids=[f"{i}-{j}" for j in range(4)])
        batch = buf.get_batch_for_rpc_blocking("train")
        cols = batch.columns()
        np.testing.assert_array_equal(cols["x"], logical)
        assert cols["flags"].tolist() == [[False, True], [True, False], [True, True], [False, False]]
        batch.commit_blocking()


def test_numpy_scalars_are_fields():
    buf = one_rpc(n=1, inputs=("a", "b", "c"))
    buf.put_batch_blocking([{"id": "s", "a": np.float32(1.5), "b": np.int64(7), "c": np.array(2.0)}])
    s = buf.get_batch_for_rpc_blocking("train").samples()[0]
    assert (s["a"], s["b"], s["c"]) == (1.5, 7, 2.0)


def test_a_rejected_output_keeps_the_batch_whole():
    buf = rb.Buffer(8, [
        rb.Rpc("gen", 2, inputs=["prompt"], outputs=["tokens"]),
        rb.Rpc("train", 2, inputs=["tokens"]),
    ])
    buf.put_columns_blocking({"prompt": np.ones((2, 1), np.int32)}, ids=["a", "b"])
    gen = buf.get_batch_for_rpc_blocking("gen")
    frame = pa.table({"id": ["a", "b"], "tokens": [[1], [2]]})
    with pytest.raises(ValueError, match=r'column "id": a patch\'s rows follow the samples\' order'):
        gen.complete_columns_blocking(frame)
    # The batch read back with an output added carries the inputs too: the message names
    # what the call writes, and no meta= that the call does not take.
    back = gen.to_arrow().append_column("tokens", pa.array([[1], [2]]))
    with pytest.raises(ValueError, match=r'column "prompt" is not a key this call writes '
                                         r'\(it writes: tokens\)') as refused:
        gen.complete_columns_blocking(back.drop_columns(["id", "birth"]))
    assert "meta=" not in str(refused.value)
    with pytest.raises(ValueError, match=r"does not declare output `score`"):
        gen.complete_blocking([{"tokens": np.ones(1, np.int32), "score": 1.0}] * 2)
    gen.complete_columns_blocking(frame.drop_columns(["id"]))
    assert buf.get_batch_for_rpc_blocking("train").columns()["tokens"].tolist() == [[1], [2]]


def test_a_batch_exported_to_arrow_puts_back_as_it_was():
    src = one_rpc(inputs=("x",))
    src.put_columns_blocking({"x": np.arange(8, dtype=np.int32).reshape(4, 2)}, ids=list("abcd"),
                             meta={"environment": ["m"] * 4})
    table = src.get_batch_for_rpc_blocking("train").to_arrow()
    dst = one_rpc(inputs=("x",))
    dst.put_columns_blocking(table)  # ids, births and the metadata column come back as such
    back = dst.get_batch_for_rpc_blocking("train")
    assert [s["id"] for s in back.samples()] == list("abcd")
    assert {s["meta"]["environment"] for s in back.samples()} == {"m"}
    np.testing.assert_array_equal(back.columns()["x"], np.arange(8).reshape(4, 2))
    with pytest.raises(ValueError, match=r'meta: no column named "missing"'):
        dst.put_columns_blocking(pa.table({"id": ["z"], "x": [[1, 2]]}), meta=["missing"])


def test_arrow_columns_inside_a_dict_are_read_as_arrow():
    # numpy.asarray made int64 past 2**53 a float (and a null NaN); a list column failed.
    big = 2**53 + 1
    buf = one_rpc(inputs=("x", "y", "z"))
    buf.put_columns_blocking({
        "x": pa.array([big, 1, 2, 3], pa.int64()),
        "y": pa.chunked_array([[[1, 2]], [[3], [4, 5, 6], []]], pa.list_(pa.int32())),
        "z": pl.Series([0.5, 1.5, 2.5, 3.5]),
    }, ids=list("abcd"))
    cols = buf.get_batch_for_rpc_blocking("train").columns()
    assert cols["x"].dtype == np.int64 and cols["x"].tolist() == [big, 1, 2, 3]
    values, offsets = cols["y"]
    assert values.tolist() == [1, 2, 3, 4, 5, 6] and offsets.tolist() == [0, 2, 3, 6, 6]
    assert cols["z"].tolist() == [0.5, 1.5, 2.5, 3.5]


def test_one_sample_twice_in_an_amend_is_refused():
    # The last row won without a word.
    buf = rb.Buffer(8, [rb.Rpc("r", 1, inputs=["x", "e"])], external_keys=["e"])
    hs = buf.put_columns_blocking({"x": np.array([1, 2], np.int32)}, ids=["a", "b"])
    with pytest.raises(ValueError, match=r"appears twice \(positions 0 and 1\)"):
        buf.amend_columns_blocking([hs[0], hs[0]], {"e": np.array([10.0, 20.0])})
    assert buf.stats()["rpcs"]["r"]["eligible"] == 0, "nothing applied"


def test_metadata_columns_of_an_output_table_are_stored():
    # A column to_arrow() marks as metadata was dropped without a word by complete_columns.
    buf = rb.Buffer(8, [rb.Rpc("gen", 1, inputs=["x"], outputs=["y"]), rb.Rpc("train", 1, inputs=["y"])])
    buf.put_columns_blocking({"x": np.array([1], np.int32)}, ids=["a"])
    gen = buf.get_batch_for_rpc_blocking("gen")
    schema = pa.schema([pa.field("y", pa.float64()), pa.field("note", pa.string(), metadata={"rollout_buffer.role": "meta"})])
    gen.complete_columns_blocking(pa.table([pa.array([2.0]), pa.array(["hello"])], schema=schema))
    [sample] = buf.get_batch_for_rpc_blocking("train").samples()
    assert sample["meta"]["note"] == "hello" and sample["y"] == 2.0


def test_ints_among_floats_in_a_metadata_column_are_floats():
    buf = one_rpc()
    buf.put_columns_blocking({"x": np.zeros((4, 2))}, ids=list("abcd"), meta={"c": [1, 2.5, 3, 4]})
    batch = buf.get_batch_for_rpc_blocking("train")
    assert [s["meta"]["c"] for s in batch.samples()] == [1.0, 2.5, 3.0, 4.0]
    assert batch.to_arrow().column("c").type == pa.float64()


def test_ints_in_one_put_and_floats_in_another_export_as_floats():
    # Each put's column has one type; a batch spanning both made to_arrow() fail.
    buf = one_rpc()
    buf.put_columns_blocking({"x": np.zeros((2, 2))}, ids=["a", "b"], meta={"c": [1, 2]})
    buf.put_columns_blocking({"x": np.zeros((2, 2))}, ids=["c", "d"], meta={"c": [0.5, 1.5]})
    table = buf.get_batch_for_rpc_blocking("train").to_arrow()
    assert table.column("c").type == pa.float64()
    assert dict(zip(table.column("id").to_pylist(), table.column("c").to_pylist())) == {
        "a": 1.0, "b": 2.0, "c": 0.5, "d": 1.5}
    assert pl.from_arrow(table)["c"].dtype == pl.Float64
    # Integers past 2^53 never become floats (they would be rounded): refused in one put,
    # and a batch spanning a put of them and one of floats does not export.
    with pytest.raises(ValueError, match="past 2\\^53"):
        buf.put_columns_blocking({"x": np.zeros((2, 2))}, ids=["e", "f"], meta={"c": [2**60 + 1, 0.5]})
    big = one_rpc()
    big.put_columns_blocking({"x": np.zeros((1, 2))}, ids=["g"], meta={"t": [2**60 + 1]})
    big.put_columns_blocking({"x": np.zeros((3, 2))}, ids=["h", "i", "j"], meta={"t": [0.5, 1.5, 2.5]})
    with pytest.raises(Exception, match="past 2\\^53"):
        big.get_batch_for_rpc_blocking("train").to_arrow()


def test_ids_may_be_an_arrow_array():
    # Iterated, they were Arrow scalars: "row 0 is neither str nor a non-negative int".
    buf = one_rpc(n=2)
    buf.put_columns_blocking({"x": np.zeros((2, 1))}, ids=pa.array(["a", "b"]))
    buf.put_columns_blocking({"x": np.zeros((2, 1))}, ids=pa.chunked_array([["c"], ["d"]], pa.large_string()))
    seen = []
    for _ in range(2):
        batch = buf.get_batch_for_rpc_blocking("train")
        seen += [s["id"] for s in batch.samples()]
        batch.commit_blocking()
    assert sorted(seen) == ["a", "b", "c", "d"]
    with pytest.raises(ValueError, match="nulls"):
        buf.put_columns_blocking({"x": np.zeros((2, 1))}, ids=pa.array(["e", None]))


def test_dictionary_encoded_ids_and_metadata_are_read_as_their_values():
    """A polars categorical or a pyarrow dictionary column (what a dataset of repeated
    names often holds) was refused as "str or non-negative int"."""
    pl = pytest.importorskip("polars")
    buf = one_rpc(n=4)
    buf.put_columns_blocking({"x": np.zeros((2, 1))}, ids=pa.array(["a", "b"]).dictionary_encode(),
                             meta={"env": pa.array(["math", "math"]).dictionary_encode()})
    buf.put_columns_blocking({"x": np.zeros((2, 1))}, ids=pl.Series(["c", "d"], dtype=pl.Categorical),
                             meta={"env": pl.Series(["code", "math"], dtype=pl.Categorical)})
    table = buf.get_batch_for_rpc_blocking("train").to_arrow()
    assert dict(zip(table.column("id").to_pylist(), table.column("env").to_pylist())) == {
        "a": "math", "b": "math", "c": "code", "d": "math"}
    with pytest.raises(ValueError, match="column \"id\" of type Float64: ids are str or ints"):
        buf.put_columns_blocking({"x": np.zeros((1, 1))}, ids=pa.array([1.5]))


@pytest.mark.parametrize("bad, shown", [(2**70, "1180591620717411303424"), (-1, "-1"), (np.int64(-3), "-3")])
def test_an_int_id_out_of_range_is_named_as_one(bad, shown):
    # It was "neither str nor a non-negative int", which an int past 2**64 - 1 is not.
    buf = one_rpc(n=2)
    with pytest.raises(ValueError, match=f"ids: row 1 is {shown}: an int id is from 0 to 2\\*\\*64 - 1"):
        buf.put_columns_blocking({"x": np.zeros((2, 1))}, ids=[5, bad])
    assert len(buf) == 0, "none of the put taken"


@pytest.mark.parametrize("sample", [
    {"id": "a", "x": 1.0, "meta": {"id": "o"}},
    {"id": "a", "x": 1.0, "meta": {"birth": 3}},
    {"id": "a", "x": 1.0, "meta": {"x": "also a field"}},
])
def test_a_dict_samples_metadata_may_not_reuse_a_name(sample):
    # Stored, each made every Arrow export of its batch fail (a column named twice).
    buf = one_rpc(n=1)
    with pytest.raises(ValueError, match="one name, one role"):
        buf.put_batch_blocking([sample])
    assert len(buf) == 0
