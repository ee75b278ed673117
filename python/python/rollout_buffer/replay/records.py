"""The replay buffer's data model (spec 000's dataclasses) and the one conversion between
records and Arrow columns.

A call's records are checked in full before any is taken (all or none), then become one
Arrow table: the unit the buffer keeps in memory, writes to Parquet and hands back.
"""

from __future__ import annotations

import hashlib
import json
import math
import time
from dataclasses import dataclass, field
from typing import Any, Iterable, Optional, Sequence

import numpy as np
import pyarrow as pa


@dataclass(frozen=True, eq=False)
class RolloutRecord:
    """One rollout, as a generator produced it.

    ``eq=False``: records hold numpy arrays, which have no single truth value; compare
    ``rollout_uid`` instead.
    """

    environment: str
    example_id: str
    policy_version: str
    replica_id: str = "unknown"
    rollout_uid: str = ""
    token_count: int = 0
    reward: Optional[float] = None
    logprobs: Optional[np.ndarray] = None
    output_tokens: Optional[np.ndarray] = None
    metadata: Optional[dict] = None
    created_ts: float = field(default_factory=time.time)
    actor_logprobs: Optional[np.ndarray] = None
    actor_policy_version: Optional[str] = None
    ref_logprobs: Optional[np.ndarray] = None
    continuation_of: Optional[str] = None
    prefix_hash: Optional[str] = None
    segment_idx: int = 0
    is_last_segment: bool = True


@dataclass(frozen=True, eq=False)
class RolloutGroup:
    """A sealed group: the rollouts of one key. ``metadata`` holds ``num_rollouts``,
    ``uids``, ``replicas``, ``policy_versions``, ``uses``, and ``scores`` / ``flags`` (by
    rollout uid) once a verifier upserted some."""

    id: str
    environment: str
    example_id: str
    policy_version: str
    rollouts: list
    sealed_ts: float
    metadata: dict
    segment_idx: int = 0


@dataclass(frozen=True)
class GroupKey:
    """What a strict group shares."""

    environment: str
    example_id: str
    policy_version: str


@dataclass(frozen=True)
class SampledBatch:
    """Groups drawn together, leased until :meth:`ReplayBuffer.ack`. ``step`` is set for
    batches drawn by :meth:`ReplayBuffer.next_batch`."""

    batch_id: str
    group_ids: list
    ts: float
    step: Optional[int] = None


# Columns holding per-token arrays, with the element type each is stored as.
ARRAY_FIELDS = {
    "output_tokens": pa.int32(),
    "logprobs": pa.float32(),
    "actor_logprobs": pa.float32(),
    "ref_logprobs": pa.float32(),
}

# The schema of the rollouts dataset. `environment`, `policy_version` and `segment_idx`
# are also the hive partition columns of the files on storage (and so not inside them).
# `policy_version` is the group's (a mixed group's oldest member's);
# `rollout_policy_version` is the rollout's own.
SCHEMA = pa.schema(
    [
        ("group_id", pa.string()),
        ("environment", pa.string()),
        ("example_id", pa.string()),
        ("policy_version", pa.string()),
        ("segment_idx", pa.int32()),
        ("rollout_policy_version", pa.string()),
        ("replica_id", pa.string()),
        ("rollout_uid", pa.string()),
        ("token_count", pa.int64()),
        ("reward", pa.float64()),
        ("output_tokens", pa.list_(pa.int32())),
        ("logprobs", pa.list_(pa.float32())),
        ("actor_logprobs", pa.list_(pa.float32())),
        ("ref_logprobs", pa.list_(pa.float32())),
        ("actor_policy_version", pa.string()),
        ("continuation_of", pa.string()),
        ("prefix_hash", pa.string()),
        ("is_last_segment", pa.bool_()),
        ("metadata", pa.string()),
        ("created_ts", pa.float64()),
        ("sealed_ts", pa.float64()),
    ]
)
PARTITION_COLUMNS = ("environment", "policy_version", "segment_idx")
FILE_SCHEMA = pa.schema([f for f in SCHEMA if f.name not in PARTITION_COLUMNS])

_SCALARS = (
    "environment",
    "example_id",
    "replica_id",
    "rollout_uid",
    "actor_policy_version",
    "continuation_of",
    "prefix_hash",
)


def _bad(field_name: str, uid: str, why: str) -> ValueError:
    return ValueError(f"rollout {uid!r}: field {field_name!r} {why}")


def _as_record(r: Any, i: int) -> RolloutRecord:
    if isinstance(r, RolloutRecord):
        return r
    if isinstance(r, dict):
        try:
            return RolloutRecord(**r)
        except TypeError as e:
            raise ValueError(f"record {i}: {e}") from None
    raise ValueError(f"record {i}: a RolloutRecord or a dict, not {type(r).__name__}")


def _version(v: Any, numeric: bool, uid: str, field_name: str = "policy_version") -> str:
    if isinstance(v, bool) or v is None:
        raise _bad(field_name, uid, f"must be a version, not {v!r}")
    if isinstance(v, (int, np.integer)):
        return str(int(v))
    if not isinstance(v, str) or not v:
        raise _bad(field_name, uid, f"must be a non-empty string or an int, not {v!r}")
    if numeric:
        try:
            int(v)
        except ValueError:
            raise _bad(
                field_name, uid, f"is {v!r}: not an integer (this buffer orders versions by number)"
            ) from None
    return v


def _array(r: RolloutRecord, name: str, uid: str) -> Optional[np.ndarray]:
    a = getattr(r, name)
    if a is None:
        return None
    a = np.asarray(a)
    if a.ndim != 1:
        raise _bad(name, uid, f"must be 1-D, has shape {a.shape}")
    want = ARRAY_FIELDS[name].to_pandas_dtype()
    if a.dtype != want:
        if a.dtype.kind not in "iuf" or (want == np.int32 and a.dtype.kind == "f"):
            raise _bad(name, uid, f"has dtype {a.dtype}, wants {np.dtype(want)}")
        a = a.astype(want)
    return a


def derived_uid(r: RolloutRecord) -> str:
    """A uid for a record sent without one: a hash of what identifies it, so a resend is
    still a duplicate."""
    h = hashlib.blake2b(digest_size=10)
    for part in (r.environment, r.example_id, str(r.policy_version), r.replica_id, repr(r.created_ts)):
        h.update(str(part).encode())
        h.update(b"\0")
    if r.output_tokens is not None:
        h.update(np.ascontiguousarray(r.output_tokens).tobytes())
    return "r-" + h.hexdigest()


def records_to_table(
    records: Iterable[Any], numeric_versions: bool
) -> tuple[pa.Table, list[RolloutRecord]]:
    """Checks every record and returns them as one table (``group_id`` and ``sealed_ts``
    empty) plus the records. Raises ``ValueError`` naming the first bad field and its
    record's uid; then nothing is taken."""
    recs = [_as_record(r, i) for i, r in enumerate(records)]
    cols: dict[str, list] = {name: [] for name in SCHEMA.names}
    arrays: dict[str, list] = {name: [] for name in ARRAY_FIELDS}
    for r in recs:
        uid = r.rollout_uid if isinstance(r.rollout_uid, str) else ""
        uid = uid or derived_uid(r)
        for name in ("environment", "example_id"):
            v = getattr(r, name)
            if not isinstance(v, str) or not v:
                raise _bad(name, uid, f"must be a non-empty string, not {v!r}")
        pv = _version(r.policy_version, numeric_versions, uid)
        apv = r.actor_policy_version
        if apv is not None:
            apv = _version(apv, False, uid, "actor_policy_version")
        reward = r.reward
        if reward is not None:
            if isinstance(reward, bool) or not isinstance(reward, (int, float, np.number)):
                raise _bad("reward", uid, f"must be a number, not {reward!r}")
            reward = float(reward)
            if not math.isfinite(reward):
                raise _bad("reward", uid, f"is {reward}: not finite")
        per_token = {name: _array(r, name, uid) for name in ARRAY_FIELDS}
        lengths = {k: len(a) for k, a in per_token.items() if a is not None}
        if len(set(lengths.values())) > 1:
            raise _bad(
                "logprobs" if "logprobs" in lengths else next(iter(lengths)),
                uid,
                f"length differs from the other per-token fields: {lengths}",
            )
        tc = r.token_count
        if isinstance(tc, bool) or not isinstance(tc, (int, np.integer)):
            raise _bad("token_count", uid, f"must be an int, not {tc!r}")
        if tc < 0:
            raise _bad("token_count", uid, f"is {tc}: negative")
        if tc == 0 and "output_tokens" in lengths:
            tc = lengths["output_tokens"]
        seg = r.segment_idx
        if isinstance(seg, bool) or not isinstance(seg, (int, np.integer)) or seg < 0:
            raise _bad("segment_idx", uid, f"must be an int >= 0, not {seg!r}")
        for name in ("replica_id", "continuation_of", "prefix_hash"):
            v = getattr(r, name)
            if v is not None and not isinstance(v, str):
                raise _bad(name, uid, f"must be a string, not {v!r}")
        meta = None
        if r.metadata is not None:
            try:
                meta = json.dumps(r.metadata, sort_keys=True, default=_json_default)
            except (TypeError, ValueError) as e:
                raise _bad("metadata", uid, f"is not JSON-serializable: {e}") from None
        cols["group_id"].append(None)
        cols["environment"].append(r.environment)
        cols["example_id"].append(r.example_id)
        cols["policy_version"].append(pv)
        cols["rollout_policy_version"].append(pv)
        cols["segment_idx"].append(int(seg))
        cols["replica_id"].append(r.replica_id)
        cols["rollout_uid"].append(uid)
        cols["token_count"].append(int(tc))
        cols["reward"].append(reward)
        cols["actor_policy_version"].append(apv)
        cols["continuation_of"].append(r.continuation_of)
        cols["prefix_hash"].append(r.prefix_hash)
        cols["is_last_segment"].append(bool(r.is_last_segment))
        cols["metadata"].append(meta)
        cols["created_ts"].append(float(r.created_ts))
        cols["sealed_ts"].append(None)
        for name, a in per_token.items():
            arrays[name].append(a)
    out = {}
    for f in SCHEMA:
        if f.name in ARRAY_FIELDS:
            out[f.name] = _list_column(arrays[f.name], ARRAY_FIELDS[f.name])
        else:
            out[f.name] = pa.array(cols[f.name], type=f.type)
    return pa.table(out, schema=SCHEMA), recs


def _json_default(o: Any) -> Any:
    if isinstance(o, np.generic):
        return o.item()
    if isinstance(o, np.ndarray):
        return o.tolist()
    raise TypeError(f"{type(o).__name__} is not JSON-serializable")


def _list_column(items: Sequence[Optional[np.ndarray]], value_type: pa.DataType) -> pa.Array:
    """One list column from per-row arrays (None: a null row), with one copy."""
    lengths = np.fromiter((0 if a is None else len(a) for a in items), np.int64, len(items))
    offsets = np.zeros(len(items) + 1, np.int32)
    np.cumsum(lengths, out=offsets[1:])
    present = [a for a in items if a is not None]
    dtype = value_type.to_pandas_dtype()
    values = np.concatenate(present).astype(dtype, copy=False) if present else np.zeros(0, dtype)
    mask = None
    if len(present) != len(items):
        mask = pa.array([a is None for a in items], pa.bool_())
    return pa.ListArray.from_arrays(pa.array(offsets), pa.array(values, value_type), mask=mask)


def table_to_records(table: pa.Table) -> list[RolloutRecord]:
    """The records of a table in the dataset's schema."""
    cols = {name: table.column(name) for name in table.column_names}
    n = table.num_rows
    plain = {
        name: cols[name].to_pylist()
        for name in SCHEMA.names
        if name not in ARRAY_FIELDS and name in cols
    }
    arrays = {}
    for name in ARRAY_FIELDS:
        col = cols[name].combine_chunks() if name in cols else None
        arrays[name] = [None] * n if col is None else _rows_of(col)
    out = []
    for i in range(n):
        meta = plain["metadata"][i]
        out.append(
            RolloutRecord(
                environment=plain["environment"][i],
                example_id=plain["example_id"][i],
                policy_version=plain["rollout_policy_version"][i],
                replica_id=plain["replica_id"][i],
                rollout_uid=plain["rollout_uid"][i],
                token_count=plain["token_count"][i],
                reward=plain["reward"][i],
                logprobs=arrays["logprobs"][i],
                output_tokens=arrays["output_tokens"][i],
                metadata=None if meta is None else json.loads(meta),
                created_ts=plain["created_ts"][i],
                actor_logprobs=arrays["actor_logprobs"][i],
                actor_policy_version=plain["actor_policy_version"][i],
                ref_logprobs=arrays["ref_logprobs"][i],
                continuation_of=plain["continuation_of"][i],
                prefix_hash=plain["prefix_hash"][i],
                segment_idx=plain["segment_idx"][i],
                is_last_segment=plain["is_last_segment"][i],
            )
        )
    return out


def _rows_of(col: pa.ListArray) -> list[Optional[np.ndarray]]:
    """Per-row numpy views of a list column (None for null rows)."""
    if isinstance(col, pa.ChunkedArray):
        col = col.combine_chunks()
    offsets = col.offsets.to_numpy()
    values = col.values.to_numpy(zero_copy_only=False)
    valid = col.is_valid().to_numpy(zero_copy_only=False)
    return [
        values[offsets[i] : offsets[i + 1]] if valid[i] else None for i in range(len(col))
    ]
