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

    def table(self, read_file) -> pa.Table:
        """The group's rows, in the dataset's schema, with its id, version and seal time."""
        pieces = [chunk.table(read_file).take(pa.array(rows)) for chunk, rows in self.parts]
        t = pieces[0] if len(pieces) == 1 else pa.concat_tables(pieces)
        n = t.num_rows
        t = t.set_column(
            SCHEMA.get_field_index("group_id"), "group_id", pa.array([self.id] * n, pa.string())
        )
        t = t.set_column(
            SCHEMA.get_field_index("policy_version"),
            "policy_version",
            pa.array([self.policy_version] * n, pa.string()),
        )
        return t.set_column(
            SCHEMA.get_field_index("sealed_ts"),
            "sealed_ts",
            pa.array([self.sealed_ts] * n, pa.float64()),
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
