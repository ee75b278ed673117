"""The replay buffer's data model (spec 000's dataclasses) and the one conversion between
records and Arrow columns.

A call's records are checked in full before any is taken (all or none), then become one
Arrow table: the unit the buffer keeps in memory, writes to Parquet and hands back.
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass, field
from typing import Any, Iterable, Optional, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc


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

def _bad(field_name: str, uid: str, why: str) -> ValueError:
    return ValueError(f"rollout {uid!r}: field {field_name!r} {why}")


# The largest value each integer field's column holds (int64 and int32).
_INT_MAX = {"token_count": 2**63 - 1, "segment_idx": 2**31 - 1}


def _count(field_name: str, v: Any, uid: str) -> int:
    """An int field (``token_count``, ``segment_idx``): an int >= 0 that fits its column
    (past it, Arrow raised an OverflowError that named neither the field nor the
    rollout)."""
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
        raise _bad(field_name, uid, f"must be an int, not {v!r}")
    v = int(v)
    if not 0 <= v <= _INT_MAX[field_name]:
        raise _bad(field_name, uid, f"is {v}: must be an int >= 0 and <= {_INT_MAX[field_name]}")
    return v


def _float(field_name: str, v: Any, uid: str) -> float:
    """A number field as a float64 (an int past its range has none: OverflowError)."""
    if isinstance(v, bool) or not isinstance(v, (int, float, np.number)):
        raise _bad(field_name, uid, f"must be a number, not {v!r}")
    try:
        return float(v)
    except OverflowError:
        raise _bad(field_name, uid, "is an int too large for a float64") from None


def _text(field_name: str, v: str, uid: str) -> None:
    """Refuses a str with no UTF-8 (see :func:`not_utf8`): the build raised a
    UnicodeEncodeError that named neither the field nor the rollout."""
    why = not_utf8(v)
    if why is not None:
        raise _bad(field_name, uid, why)


def not_utf8(v: str) -> Optional[str]:
    """What makes a str unstorable in an Arrow string (UTF-8), for an error naming where
    it is: a lone surrogate such as ``"\\ud800"``, left by a ``surrogateescape`` decode
    upstream. None for valid text."""
    try:
        v.encode("utf-8")
    except UnicodeEncodeError as e:
        return f"is not valid text: {v[e.start:e.end]!r} at position {e.start} has no UTF-8 encoding"
    return None


def as_record(r: Any, i: int) -> RolloutRecord:
    """Record ``i`` of a call as a ``RolloutRecord`` (a dict's fields), or a
    ``ValueError`` naming it."""
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
    return _checked_array(getattr(r, name), name, uid)


def _checked_array(a: Any, name: str, uid: str) -> Optional[np.ndarray]:
    """Per-token array ``a`` of field ``name`` as the dtype it is stored as, or a
    ``ValueError`` naming the field and ``uid``: floats where integers go, integers past
    int32 and anything not numeric are refused, never truncated or wrapped."""
    if a is None:
        return None
    a = np.asarray(a)
    if a.ndim != 1:
        raise _bad(name, uid, f"must be 1-D, has shape {a.shape}")
    want = ARRAY_FIELDS[name].to_pandas_dtype()
    if a.dtype != want and a.size == 0 and a.dtype.kind in "iuf":
        return a.astype(want)  # `[]` is float64 to numpy, and holds nothing to convert
    if a.dtype != want:
        if a.dtype.kind not in "iuf" or (want == np.int32 and a.dtype.kind == "f"):
            raise _bad(name, uid, f"has dtype {a.dtype}, wants {np.dtype(want)}")
        if want == np.int32 and a.size:
            lo, hi = int(a.min()), int(a.max())
            if lo < -(2**31) or hi >= 2**31:
                raise _bad(name, uid, f"has values outside int32 ({lo} to {hi})")
        a = a.astype(want)
    return a


def derived_uids(recs: Sequence[RolloutRecord]) -> list:
    """Uids for records sent without one: a hash of what a rollout holds (its key, replica,
    creation time, reward and per-token arrays), plus, for rollouts of one call that hash
    alike, their place among them. A resend of the same call gets the same uids, so it is a
    duplicate; rollouts that differ only in their place in the call are all kept. The
    hash alone made every rollout of a call without tokens, and each answer sampled twice
    alike ("4" to a math question), a duplicate of the first, dropped. A record that has a
    uid gets ``None`` and is not hashed: most calls carry uids, and hashing every rollout's
    tokens would cost each of them."""
    seen: dict = {}
    out: list = []
    for r in recs:
        if r.rollout_uid:
            out.append(None)
            continue
        base = _content_hash(r)
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.append(base if n == 0 else f"{base}-{n}")
    return out


def _content_hash(r: RolloutRecord) -> str:
    h = hashlib.blake2b(digest_size=10)
    for part in (r.environment, r.example_id, str(r.policy_version), r.replica_id,
                 repr(r.created_ts), repr(r.reward)):
        # Surrogates pass (valid text encodes the same): a record with a lone surrogate
        # still gets a uid, for the error that refuses it to name.
        h.update(str(part).encode("utf-8", "surrogatepass"))
        h.update(b"\0")
    for name in ARRAY_FIELDS:
        a = getattr(r, name)
        if a is None:
            h.update(b"\1")
            continue
        try:
            h.update(np.ascontiguousarray(a).tobytes())
        except (TypeError, ValueError):
            # Not an array (the checks refuse it, naming this uid): its text.
            h.update(repr(a).encode("utf-8", "surrogatepass"))
        h.update(b"\0")
    return "r-" + h.hexdigest()


def records_to_table(
    records: Iterable[Any], numeric_versions: bool
) -> tuple[pa.Table, list[RolloutRecord]]:
    """Checks every record and returns them as one table (``group_id`` and ``sealed_ts``
    empty) plus the records. Raises ``ValueError`` naming the first bad field and its
    record's uid; then nothing is taken.

    Column by column when every value has its expected type (the common case, a few
    microseconds a record); a call that does not build that way is checked record by
    record, to name what is wrong."""
    recs = [as_record(r, i) for i, r in enumerate(records)]
    try:
        table = _columns_of(recs)
    except (pa.ArrowException, TypeError, ValueError, OverflowError, _SlowPath):
        table = _checked_one_by_one(recs, numeric_versions)
    return check_table(table, numeric_versions), recs


class _SlowPath(Exception):
    """A value the column-wise build does not take as it is."""


def to_table(records: Iterable[Any], numeric_versions: bool = True) -> pa.Table:
    """Records as one checked table in the dataset's schema: what a producer sends to
    ``add_rollouts`` to keep the conversion on its side (the buffer then only checks it).
    Raises ``ValueError`` as ``add_rollouts`` does."""
    return records_to_table(records, numeric_versions)[0]


def _columns_of(recs: list) -> pa.Table:
    def col(name):
        return [getattr(r, name) for r in recs]

    pv = [str(v) if type(v) is int else v for v in col("policy_version")]
    apv = [str(v) if type(v) is int else v for v in col("actor_policy_version")]
    uids = [r.rollout_uid or d for r, d in zip(recs, derived_uids(recs))]
    out = {
        "group_id": pa.nulls(len(recs), pa.string()),
        "environment": pa.array(col("environment"), pa.string()),
        "example_id": pa.array(col("example_id"), pa.string()),
        "policy_version": pa.array(pv, pa.string()),
        "segment_idx": pa.array(col("segment_idx"), pa.int32()),
        "rollout_policy_version": pa.array(pv, pa.string()),
        "replica_id": pa.array(col("replica_id"), pa.string()),
        "rollout_uid": pa.array(uids, pa.string()),
        "token_count": pa.array(col("token_count"), pa.int64()),
        "reward": pa.array(col("reward"), pa.float64()),
        "actor_policy_version": pa.array(apv, pa.string()),
        "continuation_of": pa.array(col("continuation_of"), pa.string()),
        "prefix_hash": pa.array(col("prefix_hash"), pa.string()),
        "is_last_segment": pa.array(col("is_last_segment"), pa.bool_()),
        "metadata": pa.array(
            [None if m is None else json.dumps(m, sort_keys=True) for m in col("metadata")],
            pa.string(),
        ),
        "created_ts": pa.array(col("created_ts"), pa.float64()),
        "sealed_ts": pa.nulls(len(recs), pa.float64()),
    }
    if (
        any(type(v) is bool for v in col("reward"))
        or any(type(v) is not int for v in col("token_count"))
        or any(type(v) not in (float, int) for v in col("created_ts"))
    ):
        # The record-by-record build checks them (a float token count is refused there,
        # where a cast would truncate it).
        raise _SlowPath
    for name, value_type in ARRAY_FIELDS.items():
        arrays = col(name)
        want = value_type.to_pandas_dtype()
        for a in arrays:
            if a is not None and (type(a) is not np.ndarray or a.dtype != want or a.ndim != 1):
                raise _SlowPath
        out[name] = _list_column(arrays, value_type)
    return pa.table(out, schema=SCHEMA)


def _checked_one_by_one(recs: list, numeric_versions: bool) -> pa.Table:
    """The record-by-record build: raises on the first bad record, naming it."""
    cols: dict = {name: [] for name in SCHEMA.names}
    arrays: dict = {name: [] for name in ARRAY_FIELDS}
    for r, derived in zip(recs, derived_uids(recs)):
        if r.rollout_uid is not None and not isinstance(r.rollout_uid, str):
            raise _bad("rollout_uid", repr(r.rollout_uid), "must be a string (a resend must carry the same uid)")
        uid = r.rollout_uid or derived
        _text("rollout_uid", uid, uid)
        for name in ("environment", "example_id"):
            v = getattr(r, name)
            if not isinstance(v, str) or not v:
                raise _bad(name, uid, f"must be a non-empty string, not {v!r}")
            _text(name, v, uid)
        pv = _version(r.policy_version, numeric_versions, uid)
        _text("policy_version", pv, uid)
        apv = r.actor_policy_version
        if apv is not None:
            apv = _version(apv, False, uid, "actor_policy_version")
            _text("actor_policy_version", apv, uid)
        reward = None if r.reward is None else _float("reward", r.reward, uid)
        per_token = {name: _array(r, name, uid) for name in ARRAY_FIELDS}
        tc = _count("token_count", r.token_count, uid)
        seg = _count("segment_idx", r.segment_idx, uid)
        for name in ("replica_id", "continuation_of", "prefix_hash"):
            v = getattr(r, name)
            if v is not None and not isinstance(v, str):
                raise _bad(name, uid, f"must be a string, not {v!r}")
            if v is not None:
                _text(name, v, uid)
        last = r.is_last_segment
        if last is not None and not isinstance(last, (bool, np.bool_)):
            # bool("false") is True.
            raise _bad("is_last_segment", uid, f"must be a bool, not {last!r}")
        created_ts = _float("created_ts", r.created_ts, uid)
        meta = None
        if r.metadata is not None:
            try:
                meta = json.dumps(r.metadata, sort_keys=True, default=_json_default)
            except (TypeError, ValueError) as e:
                raise _bad("metadata", uid, f"is not JSON-serializable: {e}") from None
        for name, v in (
            ("group_id", None), ("environment", r.environment), ("example_id", r.example_id),
            ("policy_version", pv), ("segment_idx", seg), ("rollout_policy_version", pv),
            ("replica_id", r.replica_id), ("rollout_uid", uid), ("token_count", tc),
            ("reward", reward), ("actor_policy_version", apv),
            ("continuation_of", r.continuation_of), ("prefix_hash", r.prefix_hash),
            ("is_last_segment", None if last is None else bool(last)), ("metadata", meta),
            ("created_ts", created_ts), ("sealed_ts", None),
        ):
            cols[name].append(v)
        for name, a in per_token.items():
            arrays[name].append(a)
    out = {}
    for f in SCHEMA:
        if f.name in ARRAY_FIELDS:
            out[f.name] = _list_column(arrays[f.name], ARRAY_FIELDS[f.name])
        else:
            out[f.name] = pa.array(cols[f.name], type=f.type)
    return pa.table(out, schema=SCHEMA)


def _first(mask: Any) -> Optional[int]:
    """The first row where a boolean array is true (nulls are false)."""
    a = np.asarray(pc.fill_null(mask, False).to_numpy(zero_copy_only=False))
    hits = np.flatnonzero(a)
    return int(hits[0]) if len(hits) else None


def _min(col: Any) -> Any:
    return pc.min(col).as_py()


def check_table(table: pa.Table, numeric_versions: bool) -> pa.Table:
    """Checks rows in the dataset's schema, column by column; returns the table with
    token counts filled in from ``output_tokens`` where they are 0. Raises ``ValueError``
    naming the field and the first bad row's uid.

    Each check is one aggregate over the column (a few calls per call, not per row); only
    a failed one looks for the row to name."""
    uid = table.column("rollout_uid")

    def fail(i: int, name: str, why: str) -> ValueError:
        return _bad(name, uid[i].as_py() or f"row {i}", why)

    for name, default in _DEFAULTS.items():
        # A null (None) is the field left out: its default, on every path. A null
        # replica_id had been kept, and failed the seal of its group after the call had
        # taken other groups, losing it.
        col = table.column(name)
        if col.null_count:
            filled = pc.fill_null(col, pa.scalar(default, col.type))
            table = table.set_column(SCHEMA.get_field_index(name), name, filled)
    for name in ("environment", "example_id", "policy_version", "rollout_uid"):
        col = table.column(name)
        lengths = pc.utf8_length(col)
        if col.null_count or (len(col) and _min(lengths) == 0):
            i = _first(pc.or_kleene(pc.is_null(col), pc.equal(lengths, 0)))
            raise fail(i, name, f"must be a non-empty string, not {col[i].as_py()!r}")
    if numeric_versions:
        # The group's version and the rollout's own (a table in the dataset's schema
        # carries both).
        for name in ("policy_version", "rollout_policy_version"):
            pv = table.column(name)
            if pv.null_count:
                i = _first(pc.is_null(pv))
                raise fail(i, name, "must be a version, not None")
            ok = pc.match_substring_regex(pv, r"^[+-]?[0-9]+$")
            # min_count=0: true over no rows (by default `all` of nothing is null).
            if not pc.all(ok, min_count=0).as_py():
                i = _first(pc.invert(ok))
                raise fail(
                    i, name,
                    f"is {pv[i].as_py()!r}: not an integer (this buffer orders versions by number)",
                )
            # One number, one text: "03", "+3" and "3" were three groups and three
            # partitions of the version the lag filters read as 3.
            canonical = pc.match_substring_regex(pv, r"^(0|-?[1-9][0-9]*)$")
            if not pc.all(canonical, min_count=0).as_py():
                texts = pa.array([str(int(v)) for v in pv.to_pylist()], pa.string())
                table = table.set_column(SCHEMA.get_field_index(name), name, texts)
    reward = table.column("reward")
    finite = pc.is_finite(reward)
    if reward.null_count < len(reward) and not pc.all(finite).as_py():
        i = _first(pc.invert(finite))
        raise fail(i, "reward", f"is {reward[i].as_py()}: not finite")
    for name in ("token_count", "segment_idx"):
        col = table.column(name)
        if col.null_count or (len(col) and _min(col) < 0):
            i = _first(pc.or_kleene(pc.is_null(col), pc.less(col, 0)))
            raise fail(i, name, f"is {col[i].as_py()}: must be an int >= 0")
    for name in ARRAY_FIELDS:
        # A null inside a list came back as NaN in a float64 array: refused, as the
        # record and dict paths refuse it.
        col = table.column(name)
        if pc.list_flatten(col).null_count:
            whole = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
            parents = pc.list_parent_indices(whole)
            i = parents[_first(pc.is_null(pc.list_flatten(whole)))].as_py()
            raise fail(i, name, "holds a null element; a per-token field holds a number for every token")
    lengths = {
        name: pc.list_value_length(table.column(name))
        for name in ARRAY_FIELDS
        if table.column(name).null_count < table.num_rows
    }
    names = list(lengths)
    for a in range(len(names)):
        for b in range(a + 1, len(names)):
            differ = pc.not_equal(lengths[names[a]], lengths[names[b]])
            if pc.any(differ).as_py():
                i = _first(differ)
                shown = {k: v[i].as_py() for k, v in lengths.items() if v[i].is_valid}
                field_name = "logprobs" if "logprobs" in (names[a], names[b]) else names[b]
                raise fail(i, field_name, f"length differs from the other per-token fields: {shown}")
    tc = table.column("token_count")
    if "output_tokens" not in lengths or (len(tc) and _min(tc) > 0):
        return table
    filled = pc.if_else(
        pc.and_(pc.equal(tc, 0), pc.is_valid(lengths["output_tokens"])),
        pc.cast(lengths["output_tokens"], pa.int64()),
        tc,
    )
    return table.set_column(SCHEMA.get_field_index("token_count"), "token_count", filled)


_DEFAULTS = {
    "replica_id": "unknown",
    "segment_idx": 0,
    "token_count": 0,
    "is_last_segment": True,
}


def _json_default(o: Any) -> Any:
    if isinstance(o, np.generic):
        return o.item()
    if isinstance(o, np.ndarray):
        return o.tolist()
    raise TypeError(f"{type(o).__name__} is not JSON-serializable")


def _list_column(items: Sequence[Optional[np.ndarray]], value_type: pa.DataType) -> pa.Array:
    """One list column from per-row arrays (None: a null row), with one copy."""
    dtype = value_type.to_pandas_dtype()
    present = [a for a in items if a is not None]
    if not present:
        return pa.nulls(len(items), pa.list_(value_type))
    offsets = np.zeros(len(items) + 1, np.int32)
    if len(present) == len(items):
        np.cumsum([len(a) for a in items], out=offsets[1:])
        mask = None
    else:
        np.cumsum([0 if a is None else len(a) for a in items], out=offsets[1:])
        mask = pa.array([a is None for a in items], pa.bool_())
    values = np.concatenate(present).astype(dtype, copy=False)
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
