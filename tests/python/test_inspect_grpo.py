"""Checks `rollout-buffer inspect` on the stores `examples/grpo_pipeline.rs` writes (one per
environment) against what pyarrow reads from the same files.

usage: python3 tests/python/test_inspect_grpo.py <rollout-buffer binary> <grpo_pipeline dir>
"""
import json
import os
import subprocess
import sys

import pyarrow.dataset as ds


def inspect(binary, store, *args):
    out = subprocess.run([binary, "inspect", store, *args], capture_output=True, text=True, check=True)
    return out.stdout


def check(binary, store, env):
    doc = json.loads(inspect(binary, store, "--json", "--tail", "3"))
    s = doc["summary"]
    assert s["samples"] == s["put"] - s["freed"], s
    assert s["groups"] == s["samples"], "every sample of the pipeline is a group"
    assert all(p["environment"] == env for p in s["partitions"]), s["partitions"]
    names = {r["name"] for r in s["rpcs"]}
    assert "train" in names and names <= {"verify", "train"}, s["rpcs"]
    archive = ds.dataset(f"{store}/archive", format="parquet", partitioning="hive").to_table()
    assert sum(p["rows"] for p in s["archive"]) == archive.num_rows > 0, (s["archive"], archive.num_rows)
    for p in s["archive"]:
        files = [f for f in os.listdir(os.path.join(store, p["path"])) if f.endswith(".parquet")]
        assert p["files"] == len(files), p
        assert p["bytes"] == sum(os.path.getsize(os.path.join(store, p["path"], f)) for f in files), p
    tail = doc["tail"]
    assert len(tail) == min(3, archive.num_rows), len(tail)
    ids = set(archive.column("id").to_pylist())
    for row in tail:
        # A group trained has read_by ["train", ...]; one aged out (reason "stale") may have none.
        assert row["environment"] == env, (row["id"], row["environment"])
        assert isinstance(row["read_by"], list) and row["reason"], (row["id"], row["reason"])
        assert row["id"] in ids, f"tail row {row['id']} is not an archive row"
    text = inspect(binary, store, "--tail", "2")
    assert text.startswith("store ") and "archive: " in text, text
    return s


def main():
    binary, root = sys.argv[1], sys.argv[2]
    envs = sorted(d for d in os.listdir(root) if os.path.isdir(os.path.join(root, d)))
    assert envs, f"no stores under {root}"
    for env in envs:
        s = check(binary, os.path.join(root, env), env)
        print(f"inspect {env}: {s['samples']} groups stored, {sum(p['rows'] for p in s['archive'])} archived: ok")


if __name__ == "__main__":
    main()
