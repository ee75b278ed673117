"""Rollouts given as columns (a pyarrow Table or RecordBatch, or a dict of columns): built
into the dataset's schema with the same checks records get (:mod:`.records`), so the fast
path across processes takes nothing the record path refuses.
"""

from __future__ import annotations

import json
from typing import Any, Optional

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .records import (
    _DEFAULTS,
    ARRAY_FIELDS,
    SCHEMA,
    RolloutRecord,
    _bad,
    _checked_array,
    _list_column,
    _text,
    check_table,
    derived_uids,
    table_to_records,
)


def columns_to_table(data: Any, numeric_versions: bool, now: float) -> pa.Table:
    """Rollouts given as columns: a pyarrow Table or RecordBatch, or a dict of columns,
    named as :class:`RolloutRecord`'s fields (``environment``, ``example_id`` and
    ``policy_version`` required). Checked as :func:`check_table` does; a column that is
    no field, or of a type that does not cast, is a ``ValueError`` naming it."""
    if isinstance(data, pa.RecordBatch):
        data = pa.Table.from_batches([data])
    if isinstance(data, dict):
        data = dict_to_table(data)
    if not isinstance(data, pa.Table):
        raise ValueError(f"rollouts as columns: a pyarrow Table, RecordBatch or dict, not {type(data).__name__}")
    if not data.num_columns and not data.num_rows:
        # `{}` (or a table of no columns): a flush of nothing, as an empty list is. Not
        # refused for lacking `environment`: it has no column to check.
        return SCHEMA.empty_table()
    if data.schema.equals(SCHEMA):
        # Already the dataset's schema (from `to_table`, or read back): only checked.
        return check_table(data, numeric_versions)
    n = data.num_rows
    fields = set(RolloutRecord.__dataclass_fields__) | set(SCHEMA.names)
    for name in data.column_names:
        if name not in fields:
            raise ValueError(f"column {name!r} is not a RolloutRecord field")
    for name in ("environment", "example_id", "policy_version"):
        if name not in data.column_names:
            raise ValueError(f"column {name!r} is missing")
    out = {}
    for f in SCHEMA:
        source = "policy_version" if f.name == "rollout_policy_version" else f.name
        if source in data.column_names:
            col = data.column(source)
            if not _kind_casts(col.type, f.type):
                rule = _KIND_RULE.get(_kind(f.type), "a column of that type")
                if source == "metadata":
                    rule = "the JSON text of an object per row (json.dumps of each dict)"
                raise ValueError(f"column {source!r} of type {col.type} is not {f.type}: {rule}")
            try:
                out[f.name] = col if col.type == f.type else pc.cast(col, f.type)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as e:
                # A value that does not fit (not a type that never casts): name its row.
                i = _first_uncast(col, f.type) if isinstance(e, pa.ArrowInvalid) else None
                if i is not None:
                    raise _bad(
                        source, _row_uid(data, i),
                        f"is {col[i].as_py()!r}: not a value of its column's type {f.type} ({e})",
                    ) from None
                raise ValueError(f"column {source!r} of type {col.type} is not {f.type}: {e}") from None
        elif f.name == "created_ts":
            out[f.name] = pa.array(np.full(n, now))
        elif f.name in _DEFAULTS:
            out[f.name] = pa.array([_DEFAULTS[f.name]] * n, f.type)
        else:
            out[f.name] = pa.nulls(n, f.type)
    table = pa.table(out, schema=SCHEMA)
    if "metadata" in data.column_names:
        # JSON text of an object per row, as records give it: checked now, or the group
        # would fail to read each time it is drawn.
        for i, text in enumerate(table.column("metadata").to_pylist()):
            if text is None:
                continue
            try:
                ok = isinstance(json.loads(text), dict)
            except ValueError:
                ok = False
            if not ok:
                who = table.column("rollout_uid")[i].as_py() or f"row {i}"
                raise _bad("metadata", who, f"is not the JSON text of an object: {text[:80]!r}")
    uids = table.column("rollout_uid")
    if uids.null_count:
        recs = table_to_records(table)
        filled = [u if u else d for u, d in zip(uids.to_pylist(), derived_uids(recs))]
        table = table.set_column(SCHEMA.get_field_index("rollout_uid"), "rollout_uid", pa.array(filled, pa.string()))
    return check_table(table, numeric_versions)


def _kind(t: pa.DataType) -> str:
    if pa.types.is_boolean(t):
        return "bool"
    if pa.types.is_integer(t):
        return "int"
    if pa.types.is_floating(t):
        return "float"
    # `is_string_view` came with pyarrow 16.
    view = getattr(pa.types, "is_string_view", lambda _: False)
    if pa.types.is_string(t) or pa.types.is_large_string(t) or view(t):
        return "str"
    if pa.types.is_null(t):
        return "null"
    return "other"


# What each kind of field takes, as the record path does: a cast took a bool reward as 1.0,
# a float version 1.0 as "1", a float token count truncated and a reward "12.5" as text.
_KINDS_TAKEN = {"int": {"int"}, "float": {"int", "float"}, "str": {"str", "int"}, "bool": {"bool"}}
_KIND_RULE = {
    "int": "integers only",
    "float": "numbers only (not bools or text)",
    "str": "strings or integers only",
    "bool": "bools only",
}


def _kind_casts(source: pa.DataType, target: pa.DataType) -> bool:
    """Whether a column of ``source`` type may be cast to field type ``target``: of a
    kind the record path takes for that field (nulls always; lists are checked apart)."""
    taken = _KINDS_TAKEN.get(_kind(target))
    return taken is None or source == target or _kind(source) in taken | {"null"}


def dict_to_table(data: dict) -> pa.Table:
    """Columns given as a dict, as one table. A column Arrow cannot build (an int past
    int64, a str with no UTF-8, mixed types) is a ``ValueError`` naming it, and the row
    and its uid where one value is the cause (Arrow's own OverflowError or
    UnicodeEncodeError named neither)."""
    uids = data.get("rollout_uid")

    def who(i: int) -> str:
        u = uids[i] if isinstance(uids, (list, tuple)) and i < len(uids) else None
        return u if isinstance(u, str) and u else f"row {i}"

    def column(k: str, v: Any) -> Any:
        if k not in ARRAY_FIELDS or not isinstance(v, list):
            return v
        # Checked as a record's arrays are: concatenated unchecked, floats were truncated
        # and int64 values past int32 wrapped.
        return _list_column([_checked_array(a, k, who(i)) for i, a in enumerate(v)], ARRAY_FIELDS[k])

    for k, v in data.items():
        if isinstance(v, (str, bytes)) or not hasattr(v, "__len__") or getattr(v, "ndim", 1) == 0:
            # A single rollout as a dict of its fields reads as columns: its strings were
            # split into characters, one rollout each.
            raise ValueError(
                f"column {k!r} is a {type(v).__name__}, not a column: a dict of columns holds "
                "one value per rollout (for one rollout as a dict, pass [rollout])"
            )
    errors = (pa.ArrowException, OverflowError, TypeError, ValueError)
    try:
        return pa.table({k: column(k, v) for k, v in data.items()})
    except errors as e:
        failed = e
    # Only when the build failed: which column, and which of its values.
    for name, values in data.items():
        if not isinstance(values, (list, tuple)):
            continue
        for i, v in enumerate(values):
            if isinstance(v, str):
                _text(name, v, who(i))
            elif isinstance(v, int) and not isinstance(v, bool) and not -(2**63) <= v < 2**63:
                # Every integer column is int64 or narrower.
                raise _bad(name, who(i), f"is {v}: too large for an integer column (int64)")
    for name, values in data.items():
        try:
            pa.table({name: column(name, values)})
        except errors as e:
            raise ValueError(f"column {name!r}: {e}") from None
    raise ValueError(f"rollouts as columns: {failed}")  # columns of different lengths


def _first_uncast(col: Any, to: pa.DataType) -> Optional[int]:
    """The first row of ``col`` that does not cast to ``to`` (an int past int32, text that
    is no number), after a cast of the whole column failed: one cast a row, on the
    error's path only."""
    for i in range(len(col)):
        try:
            pc.cast(col.slice(i, 1), to)
        except pa.ArrowInvalid:
            return i
    return None


def _row_uid(table: pa.Table, i: int) -> str:
    """Row ``i``'s uid for an error, or ``row i`` when the columns carry none."""
    if "rollout_uid" in table.column_names:
        u = table.column("rollout_uid")[i].as_py()
        if isinstance(u, str) and u:
            return u
    return f"row {i}"
