"""Where a replay buffer keeps things, under its ``root_path`` (a local path, ``file://``,
``s3://`` or ``gs://``: anything ``pyarrow.fs`` opens):

- ``rollouts/environment=E/policy_version=V/segment_idx=S/part-<run>-<n>.parquet``: the
  sealed groups, append-only, hive-partitioned (DuckDB's ``read_parquet(...,
  hive_partitioning=true)`` and ``pyarrow.dataset`` read it as it is). Each data file has
  a ``_manifest-<run>-<n>.jsonl`` beside it (the leading ``_`` keeps it out of
  ``pyarrow.dataset`` scans), one line per group (id, rows, uids, seal time);
  a data file whose manifest is missing (a crash between the two writes) is scanned.
- ``scores/part-<run>-<n>.parquet``: the verifier sidecar, keyed by ``(group_id,
  rollout_uid)``; later rows win.
- ``control/``: leases, acks, the step -> batch map, exits, the policy version: a log of
  numbered JSON objects and, now and then, a snapshot that replaces the log before it.

Every object is written whole and never rewritten, so the layout works the same on a local
disk (written to a temporary name, fsynced and renamed) and on object stores (one put).
"""

from __future__ import annotations

import io
import json
import os
import time
import urllib.parse
from typing import Any, Iterator, Optional

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from .records import FILE_SCHEMA, PARTITION_COLUMNS, SCHEMA

ROLLOUTS = "rollouts"
SCORES = "scores"
CONTROL = "control"

DICTIONARY_COLUMNS = ["group_id", "example_id", "replica_id", "rollout_policy_version", "actor_policy_version"]
STATISTICS_COLUMNS = [
    f.name for f in FILE_SCHEMA if not pa.types.is_list(f.type) and f.name != "metadata"
]

SCORES_SCHEMA = pa.schema(
    [
        ("group_id", pa.string()),
        ("rollout_uid", pa.string()),
        ("scores", pa.map_(pa.string(), pa.float64())),
        ("flags", pa.map_(pa.string(), pa.bool_())),
        ("ts", pa.float64()),
    ]
)


# Parquet's codecs as pyarrow names them (LZO it does not write); case is free.
PARQUET_CODECS = ("none", "snappy", "gzip", "brotli", "lz4", "lz4_raw", "zstd")


def _codec_available(name: str) -> bool:
    if name == "none":
        return True
    try:
        return pa.Codec.is_available(name)
    except ValueError:  # a name this pyarrow does not know
        return False


def check_compression(compression: object) -> None:
    """Refuses a ``compression`` the data writes would fail on: not a Parquet codec, or
    one this pyarrow was built without (``None`` is ``"none"``)."""
    if compression is None:
        return
    accepted = [c for c in PARQUET_CODECS if _codec_available(c)]
    if not isinstance(compression, str) or compression.lower() not in accepted:
        raise ValueError(
            f"compression must be one of {', '.join(map(repr, accepted))} (or None), not {compression!r}"
        )


def filesystem(root_path: str) -> tuple:
    """``(file system, root path in it, local)`` for a root: a local path or ``file://``
    URL, or any URL pyarrow opens (``s3://``, ``gs://``, ...). Makes nothing."""
    if "://" in root_path and not root_path.startswith("file://"):
        fs, root = pafs.FileSystem.from_uri(root_path)
        return fs, root, False
    path = root_path[len("file://") :] if root_path.startswith("file://") else root_path
    return pafs.LocalFileSystem(), os.path.abspath(path), True


class Store:
    """Whole-object reads and writes under one root."""

    def __init__(self, root_path: str, durable: bool = True) -> None:
        self.fs, self.root, self.local = filesystem(root_path)
        if self.local:
            os.makedirs(self.root, exist_ok=True)
        self.url = root_path
        self.durable = durable

    def path(self, rel: str) -> str:
        return f"{self.root.rstrip('/')}/{rel}"

    def claim(self) -> Optional[Any]:
        """Makes this process the root's only writer, for as long as the returned file
        stays open (a process that dies lets go with it): a second buffer on the same
        folder, in this process or another, is a ``RuntimeError`` naming the holder's pid.
        Two had each served the same groups and overwritten each other's control log. On
        an object store there is no lock to take: ``None``, and one writer per root is
        the caller's to keep."""
        if not self.local:
            return None
        import fcntl

        f = open(os.path.join(self.root, ".owner.lock"), "a+")
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            f.seek(0)
            holder = f.read().strip() or "unknown"
            f.close()
            raise RuntimeError(
                f"another ReplayBuffer has {self.url!r} open (pid {holder}): one writer per "
                "folder; close it first"
            ) from None
        f.truncate(0)
        f.write(str(os.getpid()))
        f.flush()
        return f

    def put(self, rel: str, data: bytes) -> None:
        """Writes ``rel`` whole: readers see all of it or nothing."""
        full = self.path(rel)
        if self.local:
            directory = os.path.dirname(full)
            os.makedirs(directory, exist_ok=True)
            base = os.path.basename(full)
            # Hidden (dataset scans skip it) and never listed: see `list`.
            tmp = os.path.join(directory, f".{base}.tmp-{os.getpid()}")
            with open(tmp, "wb") as f:
                f.write(data)
                if self.durable:
                    f.flush()
                    os.fsync(f.fileno())
            os.replace(tmp, full)
            if self.durable:
                fd = os.open(directory, os.O_RDONLY)
                try:
                    os.fsync(fd)
                finally:
                    os.close(fd)
            return
        with self.fs.open_output_stream(full) as f:
            f.write(data)

    def get(self, rel: str) -> bytes:
        with self.fs.open_input_stream(self.path(rel)) as f:
            return f.read()

    def list(self, rel_dir: str, recursive: bool = False) -> list[str]:
        """Paths (relative to the root) of the files under ``rel_dir``, sorted."""
        sel = pafs.FileSelector(self.path(rel_dir), allow_not_found=True, recursive=recursive)
        root = self.root.rstrip("/") + "/"
        out = [
            info.path[len(root) :] if info.path.startswith(root) else info.path
            for info in self.fs.get_file_info(sel)
            if info.type == pafs.FileType.File and ".tmp-" not in info.path
        ]
        return sorted(out)

    def delete(self, rel: str) -> None:
        try:
            self.fs.delete_file(self.path(rel))
        except FileNotFoundError:
            pass


def quote_part(value: Any) -> str:
    """``value`` as one folder name: URL-quoted, ``/`` included."""
    return urllib.parse.quote(str(value), safe="")


# The longest name of one folder that local file systems take (NAME_MAX), in bytes.
NAME_MAX = 255


def partition_name_error(folder: str, value: Any) -> Optional[str]:
    """Why ``value`` cannot name a partition folder ``folder=<value URL-quoted>``: over
    :data:`NAME_MAX` bytes (250 letters, or 100 CJK characters at nine bytes each). Its
    group would be sealed and then never written, every write, draw and ``close`` failing
    on it. ``None`` too for text that is not valid Unicode, which the buffer's own check
    of text refuses, naming it."""
    return folder_name_error(f"{folder}=", f"{folder} ", "a partition", value)


def folder_name_error(prefix: str, what: str, kind: str, value: Any) -> Optional[str]:
    """Why folder ``<prefix><value URL-quoted>`` cannot be made: over :data:`NAME_MAX`
    bytes, said as ``<what><value> names <kind> folder of ...``; ``None`` if it can be, or
    if ``value`` is text without a UTF-8 form (each caller names that its own way)."""
    try:
        size = len(f"{prefix}{quote_part(value)}".encode())
    except UnicodeEncodeError:
        return None
    if size <= NAME_MAX:
        return None
    shown = repr(value) if len(str(value)) <= 40 else f"{str(value)[:40]!r}..."
    return (
        f"{what}{shown} names {kind} folder of {size} bytes ('{prefix}' and the "
        f"value URL-quoted), over the {NAME_MAX} a file system takes"
    )


def check_partition_names(table: pa.Table) -> None:
    """A ``ValueError`` naming the first row (and its uid) of ``table`` (rollouts as the
    buffer holds them) with a :func:`partition_name_error`."""
    for column, folder in (("environment", "environment"), ("rollout_policy_version", "policy_version")):
        for value in pc.unique(table.column(column)).to_pylist():
            problem = partition_name_error(folder, value)
            if problem:
                row = table.column(column).to_pylist().index(value)
                uid = table.column("rollout_uid")[row].as_py()
                raise ValueError(f"rollout {row} (uid {uid!r}): {problem}")


def partition_dir(environment: str, policy_version: str, segment_idx: int) -> str:
    return (
        f"{ROLLOUTS}/environment={quote_part(environment)}/policy_version={quote_part(policy_version)}"
        f"/segment_idx={int(segment_idx)}"
    )


def partition_values(rel_path: str) -> dict:
    """The partition columns named in a data file's path."""
    out = {}
    for piece in rel_path.split("/"):
        name, sep, value = piece.partition("=")
        if sep and name in PARTITION_COLUMNS:
            out[name] = urllib.parse.unquote(value)
    out["segment_idx"] = int(out.get("segment_idx", 0))
    return out


def write_groups(store: Store, name: str, table: pa.Table, groups: list, compression: str) -> list:
    """Writes one partition's groups: ``table`` holds their rows, each group's contiguous
    and in ``groups`` order (``groups``: ``(group_id, example_id, uids, sealed_ts,
    first_ts, policy_versions, replicas)``). Data first, then the manifest; returns the
    manifest's entries."""
    first = table.slice(0, 1).to_pylist()[0]
    directory = partition_dir(first["environment"], first["policy_version"], first["segment_idx"])
    data_rel = f"{directory}/part-{name}.parquet"
    buf = io.BytesIO()
    pq.write_table(
        table.select(FILE_SCHEMA.names),
        buf,
        compression=compression,
        # Dictionaries and min/max statistics on the per-token lists cost 5-9x the write
        # (measured: 73 MB/s with them, 660 without) and help no reader.
        use_dictionary=DICTIONARY_COLUMNS,
        write_statistics=STATISTICS_COLUMNS,
    )
    store.put(data_rel, buf.getvalue())
    entries, row = [], 0
    for gid, example_id, uids, sealed_ts, first_ts, versions, replicas in groups:
        entries.append(
            {
                "group_id": gid,
                "example_id": example_id,
                "sealed_ts": sealed_ts,
                "first_ts": first_ts,
                "num_rollouts": len(uids),
                "row": row,
                "uids": list(uids),
                "policy_versions": list(versions),
                "replicas": list(replicas),
                "rel_paths": [data_rel],
            }
        )
        row += len(uids)
    lines = "".join(json.dumps(e) + "\n" for e in entries)
    store.put(f"{directory}/_manifest-{name}.jsonl", lines.encode())
    return entries


def read_data_file(store: Store, rel: str) -> pa.Table:
    """A data file as a table in the full schema (partition columns from its path)."""
    t = pq.read_table(io.BytesIO(store.get(rel)), schema=FILE_SCHEMA)
    values = partition_values(rel)
    n = t.num_rows
    cols = {}
    for f in SCHEMA:
        if f.name in PARTITION_COLUMNS:
            cols[f.name] = pa.array([values[f.name]] * n, f.type)
        else:
            cols[f.name] = t.column(f.name)
    return pa.table(cols, schema=SCHEMA)


def scan_groups(store: Store) -> Iterator[dict]:
    """Every group header on storage: from manifests, and by reading the data files that
    have none."""
    files = store.list(ROLLOUTS, recursive=True)
    manifests = {f for f in files if f.endswith(".jsonl") and "/_manifest-" in f}
    for rel in files:
        if not rel.endswith(".parquet"):
            continue
        directory, base = rel.rsplit("/", 1)
        name = base[len("part-") : -len(".parquet")]
        manifest = f"{directory}/_manifest-{name}.jsonl"
        values = partition_values(rel)
        if manifest in manifests:
            for line in store.get(manifest).decode().splitlines():
                if line.strip():
                    yield {**json.loads(line), **values, "file": rel}
            continue
        yield from _scan_file(store, rel, values)


def _scan_file(store: Store, rel: str, values: dict) -> Iterator[dict]:
    t = pq.read_table(
        io.BytesIO(store.get(rel)),
        columns=[
            "group_id", "example_id", "rollout_uid", "sealed_ts", "created_ts",
            "rollout_policy_version", "replica_id",
        ],
    ).to_pydict()
    row = 0
    n = len(t["group_id"])
    while row < n:
        gid = t["group_id"][row]
        end = row
        while end < n and t["group_id"][end] == gid:
            end += 1
        yield {
            "group_id": gid,
            "example_id": t["example_id"][row],
            "sealed_ts": t["sealed_ts"][row],
            "first_ts": min(t["created_ts"][row:end]),
            "num_rollouts": end - row,
            "row": row,
            "uids": t["rollout_uid"][row:end],
            "policy_versions": sorted(set(t["rollout_policy_version"][row:end])),
            "replicas": sorted(set(t["replica_id"][row:end])),
            "rel_paths": [rel],
            **values,
            "file": rel,
        }
        row = end


def write_scores(store: Store, name: str, rows: list) -> None:
    """One sidecar file: ``rows`` of ``(group_id, rollout_uid, scores, flags)``."""
    now = time.time()
    table = pa.table(
        {
            "group_id": [r[0] for r in rows],
            "rollout_uid": [r[1] for r in rows],
            "scores": [list(r[2].items()) for r in rows],
            "flags": [list(r[3].items()) for r in rows],
            "ts": [now] * len(rows),
        },
        schema=SCORES_SCHEMA,
    )
    buf = io.BytesIO()
    pq.write_table(table, buf)
    store.put(f"{SCORES}/part-{name}.parquet", buf.getvalue())


def read_scores(store: Store) -> Iterator[tuple]:
    """Every sidecar row, in write order: ``(group_id, rollout_uid, scores, flags, ts)``."""
    for rel in store.list(SCORES):
        if not rel.endswith(".parquet"):
            continue
        t = pq.read_table(io.BytesIO(store.get(rel))).to_pydict()
        for g, u, s, f, ts in zip(t["group_id"], t["rollout_uid"], t["scores"], t["flags"], t["ts"]):
            yield g, u, dict(s or []), dict(f or []), ts


class ControlLog:
    """Numbered JSON objects under ``control/``: ``log-<seq>.json`` (a list of events),
    ``snapshot-<seq>.json`` (the whole state as of event object ``seq``, but the groups
    that left) and ``exits-<seq>.json`` (the groups that left since the snapshot before,
    group id -> reason). A snapshot replaces the logs and snapshots before it; exits files
    stay, each written once, so a long run does not rewrite every consumed group's id at
    every snapshot."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.next_seq = 1
        self.since_snapshot = 0

    def load(self) -> tuple[Optional[dict], list, dict]:
        """The latest snapshot (or None), the events logged after it, in order, and the
        exits written up to it. An exits file past the snapshot (a crash between the two
        writes) is left out: its exits are in the logs after the snapshot."""
        files = self.store.list(CONTROL)
        snaps = sorted((_seq(f), f) for f in files if "/snapshot-" in f)
        logs = sorted((_seq(f), f) for f in files if "/log-" in f)
        exit_files = sorted((_seq(f), f) for f in files if "/exits-" in f)
        snapshot, base = None, 0
        if snaps:
            base, rel = snaps[-1]
            snapshot = json.loads(self.store.get(rel))
        exits: dict = {}
        for seq, rel in exit_files:
            if seq <= base:
                exits.update(json.loads(self.store.get(rel)))
        events = []
        for seq, rel in logs:
            if seq > base:
                events.extend(json.loads(self.store.get(rel)))
        # Past every file, exits files too: a number reused would name two files.
        top = max([base] + [s for s, _ in logs] + [s for s, _ in exit_files])
        self.next_seq = top + 1
        self.since_snapshot = sum(1 for s, _ in logs if s > base)
        return snapshot, events, exits

    def append(self, events: list) -> None:
        if not events:
            return
        seq = self.next_seq
        self.store.put(f"{CONTROL}/log-{seq:012d}.json", json.dumps(events).encode())
        self.next_seq += 1
        self.since_snapshot += 1

    def snapshot(self, state: dict, exits: dict) -> None:
        """Writes ``exits`` (the groups that left since the last snapshot) and then
        ``state``, as of everything appended so far, then deletes the logs and snapshots
        they replace."""
        seq = self.next_seq
        self.next_seq += 1
        if exits:
            self.store.put(f"{CONTROL}/exits-{seq:012d}.json", json.dumps(exits).encode())
        self.store.put(f"{CONTROL}/snapshot-{seq:012d}.json", json.dumps(state).encode())
        for rel in self.store.list(CONTROL):
            if _seq(rel) < seq and "/exits-" not in rel:
                self.store.delete(rel)
        self.since_snapshot = 0


def _seq(rel: str) -> int:
    base = rel.rsplit("/", 1)[-1]
    digits = base.split("-", 1)[-1].split(".", 1)[0]
    return int(digits) if digits.isdigit() else -1
