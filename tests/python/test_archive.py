"""Reads an archive written by `examples/write_archive.rs` with pyarrow, DuckDB and Polars, the way
an analyst would, and checks every row against the formulas the example uses.

usage: python3 tests/python/test_archive.py <archive dir> <n>
"""
import glob
import sys

import duckdb
import polars as pl
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq


def expected(n):
    rows = {}
    for i in range(n):
        env, version = {0: ("math", 3), 1: ("code/python", 4), 2: ("math", 4)}.get(i % 4, (None, None))
        rows[f"rollout-{i}"] = {
            "birth": i + 1,
            "tokens": list(range(4 + i % 3)),
            "logprobs": [-0.5] * (4 + i % 3),
            "reward": i * 0.5,
            "environment": env,
            "policy_version": version,
        }
    return rows


def check(name, got, want):
    assert len(got) == len(want), f"{name}: {len(got)} rows, expected {len(want)}"
    for row in got:
        exp = want[row["id"]]
        for key, value in exp.items():
            assert row[key] == value, f"{name}: {row['id']}.{key} = {row[key]!r}, expected {value!r}"
        assert row["reason"] == "consumed", row["reason"]
        assert list(row["read_by"]) == ["gen", "reward", "train"], row["read_by"]


def main():
    root, n = sys.argv[1], int(sys.argv[2])
    want = expected(n)
    path = f"{root}/archive"

    # As docs/persistence.md reads it: partition types given, not inferred.
    hive = ds.partitioning(
        pa.schema([("environment", pa.string()), ("policy_version", pa.int64())]), flavor="hive"
    )
    dataset = ds.dataset(path, format="parquet", partitioning=hive)
    table = dataset.to_table()
    types = {f.name: str(f.type) for f in table.schema}
    assert types["tokens"] == "list<item: int32 not null>", types["tokens"]
    assert types["logprobs"] == "list<item: float not null>", types["logprobs"]
    assert types["reward"] == "double", types["reward"]
    check("pyarrow", table.to_pylist(), want)

    rows = duckdb.sql(
        f"SELECT * FROM read_parquet('{path}/**/*.parquet', hive_partitioning = true)"
    )
    cols = rows.columns
    got = [dict(zip(cols, r)) for r in rows.fetchall()]
    for row in got:  # DuckDB reads partition values as typed columns: normalise ints
        if row["policy_version"] is not None:
            row["policy_version"] = int(row["policy_version"])
    check("duckdb", got, want)
    by_env = duckdb.sql(
        f"SELECT environment, count(*) FROM read_parquet('{path}/**/*.parquet', hive_partitioning = true) "
        "GROUP BY environment ORDER BY environment NULLS LAST"
    ).fetchall()
    # Polars wants one schema per dataset: every file carries every column, in one order,
    # including `judge`, which the archive gained after the first half's files were written.
    files = sorted(glob.glob(f"{path}/**/*.parquet", recursive=True))
    schemas = {tuple(pq.read_schema(f).names) for f in files}
    assert len(schemas) == 1, schemas
    assert len(files) > len(by_env), f"{len(files)} files: the archive was written more than once"
    frame = pl.read_parquet(f"{path}/**/*.parquet", hive_partitioning=True)
    assert frame.height == n, frame.height
    flagged = dict(zip(frame["id"].to_list(), frame["flagged"].to_list()))
    for i in range(n):
        want_flag = (i % 8 == 0) if i % 4 == 0 else None
        assert flagged[f"rollout-{i}"] == want_flag, (i, flagged[f"rollout-{i}"])
    judged = dict(zip(frame["id"].to_list(), frame["judge"].to_list()))
    for i in range(n):
        assert judged[f"rollout-{i}"] == ("v2" if i >= n // 2 else None), (i, judged[f"rollout-{i}"])
    assert abs(frame["reward"].sum() - sum(r["reward"] for r in want.values())) < 1e-9
    print(f"archive read by pyarrow, DuckDB and Polars: {n} rows; per environment {by_env}")
    print("1 passed, 0 failed")


if __name__ == "__main__":
    main()
