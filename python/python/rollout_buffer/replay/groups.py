"""Groups in memory: the aggregators that collect rollouts until a group seals, and the
sealed groups, whose rows stay in the Arrow tables they arrived in (or, after a restart,
in the data file they were written to, read once when first needed).
"""

from __future__ import annotations

import collections
import hashlib
from typing import Optional

import numpy as np
import pyarrow as pa

from .draw import stable_hash
from .records import SCHEMA


class Chunk:
    """Rows that arrived together (one ``add_rollouts`` call), or one data file read
    back. Groups keep the chunks their rows are in; a chunk goes when no group needs it."""

    __slots__ = ("_table", "file")

    def __init__(self, table: Optional[pa.Table] = None, file: Optional[str] = None) -> None:
        self._table = table
        self.file = file

    def table(self, read_file) -> pa.Table:
        if self._table is None:
            self._table = read_file(self.file)
        return self._table


class Aggregator:
    """The rollouts of one key so far."""

    __slots__ = ("uids", "rows", "by_replica", "created_ts", "versions")

    def __init__(self, now: float) -> None:
        self.uids: list = []
        self.rows: list = []  # (chunk, row)
        self.by_replica: collections.Counter = collections.Counter()
        self.created_ts = now
        self.versions: set = set()


class Group:
    """A sealed group: its header, where its rows are, and its hashes for the draw."""

    __slots__ = (
        "id",
        "environment",
        "example_id",
        "policy_version",
        "version_num",
        "versions",
        "segment_idx",
        "uids",
        "replicas",
        "sealed_ts",
        "first_ts",
        "parts",
        "written",
        "group_hash",
        "example_hash",
    )

    def __init__(
        self,
        gid: str,
        environment: str,
        example_id: str,
        policy_version: str,
        versions: list,
        segment_idx: int,
        uids: list,
        replicas: list,
        sealed_ts: float,
        first_ts: float,
        parts: list,
        written: bool,
    ) -> None:
        self.id = gid
        self.environment = environment
        self.example_id = example_id
        self.policy_version = policy_version
        self.version_num = version_number(policy_version)
        self.versions = versions
        self.segment_idx = segment_idx
        self.uids = uids
        self.replicas = replicas
        self.sealed_ts = sealed_ts
        self.first_ts = first_ts
        self.parts = parts  # [(Chunk, np.ndarray of rows)]
        self.written = written
        self.group_hash = stable_hash(gid)
        self.example_hash = stable_hash(f"{environment}\0{example_id}")

    @property
    def size(self) -> int:
        return len(self.uids)


def materialize(groups: list, read_file) -> pa.Table:
    """The rows of ``groups``, each group's together and in order, in the dataset's
    schema with each group's id, version and seal time: one ``take`` over the chunks
    they are in (zero-copy concatenated), not one per group."""
    if not groups:
        return SCHEMA.empty_table()
    chunks: dict = {}
    for g in groups:
        for chunk, _ in g.parts:
            chunks.setdefault(id(chunk), chunk)
    tables = [c.table(read_file) for c in chunks.values()]
    base = dict(zip(chunks, np.cumsum([0] + [t.num_rows for t in tables[:-1]])))
    rows = np.concatenate([base[id(chunk)] + r for g in groups for chunk, r in g.parts])
    source = tables[0] if len(tables) == 1 else pa.concat_tables(tables)
    t = source.take(pa.array(rows))
    sizes = [g.size for g in groups]

    def repeat(values, dtype):
        return pa.array(np.repeat(np.array(values, dtype=object), sizes), dtype)

    t = t.set_column(
        SCHEMA.get_field_index("group_id"), "group_id", repeat([g.id for g in groups], pa.string())
    )
    t = t.set_column(
        SCHEMA.get_field_index("policy_version"),
        "policy_version",
        repeat([g.policy_version for g in groups], pa.string()),
    )
    return t.set_column(
        SCHEMA.get_field_index("sealed_ts"),
        "sealed_ts",
        pa.array(np.repeat(np.array([g.sealed_ts for g in groups], np.float64), sizes)),
    )


def version_number(v: str) -> Optional[int]:
    try:
        return int(v)
    except ValueError:
        return None


def oldest_version(versions) -> str:
    """The oldest of some versions: by number when all are numbers, else by text."""
    nums = [version_number(v) for v in versions]
    if all(n is not None for n in nums):
        return min(versions, key=int)
    return min(versions)


def group_id(environment: str, example_id: str, version: str, segment_idx: int, uids) -> str:
    """Spec 000's stable id: the key and the sorted uids, hashed."""
    seg = f"|seg={segment_idx}" if segment_idx else ""
    base = f"{environment}|{example_id}|{version}{seg}|{'/'.join(sorted(uids))}"
    return "g-" + hashlib.blake2b(base.encode(), digest_size=12).hexdigest()


def rows_by_chunk(rows: list) -> list:
    """``(chunk, row)`` pairs as ``(chunk, rows)`` parts, in first-seen order."""
    parts: dict = {}
    for chunk, row in rows:
        parts.setdefault(id(chunk), (chunk, []))[1].append(row)
    return [(chunk, np.asarray(r, np.int64)) for chunk, r in parts.values()]
