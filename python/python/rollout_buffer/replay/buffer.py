"""Spec 000's ``ReplayBuffer``: grouped rollouts on Parquet with durable leases, acks and a
step -> batch map. One instance serves one call at a time (as a Ray actor,
``max_concurrency=1``): every public method holds the instance's lock, which its flusher
thread also takes to write groups that waited ``flush_interval_s`` while no call came.

What is durable when a call returns: every lease (``sample_groups`` / ``next_batch``),
ack and score, and every group a batch drew (groups are written before the lease that
names them). Sealed groups not drawn yet are written within ``flush_interval_s`` (or at
``flush_rows`` staged rows, ``tick``, ``flush`` and ``close``); unsealed aggregators are in
memory only, as the spec allows. Evictions are logged with the next durable write.
"""

from __future__ import annotations

import functools
import inspect
import logging
import math
import os
import threading
import time
import uuid
import weakref
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Iterable, Optional

import numpy as np
import pyarrow as pa

from . import storage
from .control import Control
from .groups import (
    Aggregator,
    Chunk,
    Group,
    group_id,
    materialize,
    oldest_version,
    rows_by_chunk,
    version_number,
)
from .columns import columns_to_table
from .records import RolloutRecord, records_to_table
from .options import check_options
from .serve import Serving
from .stats import Stats

log = logging.getLogger(__name__)

# Control objects between snapshots.
SNAPSHOT_EVERY = 256


class ReplayBufferClosed(RuntimeError):
    """A call on a closed :class:`ReplayBuffer`."""


def _one_call_at_a_time(cls):
    """Wraps each public method of ``cls`` (its own and inherited) in the instance's lock,
    so the flusher thread never runs beside a call."""

    def locked(fn):
        @functools.wraps(fn)
        def call(self, *args, **kwargs):
            with self._mutex:
                return fn(self, *args, **kwargs)

        return call

    for name, fn in inspect.getmembers(cls, inspect.isfunction):
        if not name.startswith("_"):
            setattr(cls, name, locked(fn))
    return cls


def _flush_when_due(ref: "weakref.ref", staging: threading.Condition) -> None:
    """The flusher thread: writes staged groups once they waited ``flush_interval_s``,
    whether or not a call comes. Writes had only started inside calls, so groups sealed
    before a quiet spell stayed in memory, and a crash lost them however long ago they
    were sealed. Ends when its buffer is closed or collected."""
    with staging:
        while True:
            buf = ref()
            if buf is None or buf._closed:
                return
            wait = buf._flush_if_due()
            # Not held while waiting. Dropped here as the last reference, its finalizer's
            # wake-up came before the wait: the cap bounds how long that goes unseen.
            del buf
            staging.wait(60.0 if wait is None else min(wait, 60.0))


def _wake(staging: threading.Condition) -> None:
    with staging:
        staging.notify_all()


@_one_call_at_a_time
class ReplayBuffer(Serving):
    """See the module docs and ``docs/scale.md``. ``grouping`` is ``"strict"`` (a group is
    environment, example and policy version) or ``"mixed"`` (environment and example, any
    versions). ``numeric_versions`` (default) requires integer policy versions, which the
    lag controls and recency weighting need, and stores each as its number's text
    (``"03"`` and ``"+3"`` are ``"3"``: one group, one partition). ``compression`` is a Parquet codec this
    pyarrow writes (``"zstd"``, ``"snappy"``, ``"none"``, ...; checked here, not at the
    first write). ``clock`` (default ``time.time``) is what leases, seal timeouts and
    retention read."""

    def __init__(
        self,
        root_path: str,
        *,
        compression: str = "zstd",
        capacity_groups: int = 50_000,
        target_group_size: int = 8,
        min_group_size: int = 2,
        seal_timeout_s: float = 30.0,
        max_per_replica: Optional[int] = None,
        accept_policy_versions: Optional[Iterable[Any]] = None,
        grouping: str = "strict",
        max_uses_per_group: Optional[int] = None,
        lease_timeout_s: float = 600.0,
        retention_ttl_s: Optional[float] = None,
        max_groups_per_version: Optional[int] = None,
        numeric_versions: bool = True,
        flush_rows: int = 16_384,
        flush_interval_s: float = 5.0,
        durable: bool = True,
        clock: Optional[Callable[[], float]] = None,
    ) -> None:
        # Every argument, by name (`locals()` holds only them, and self, here).
        counts = check_options(locals())
        self.root_path = root_path = os.fspath(root_path)  # a pathlib.Path too
        self.compression = compression
        self.capacity = counts["capacity_groups"]
        self.target_size = counts["target_group_size"]
        self.min_size = counts["min_group_size"]
        self.seal_timeout_s = seal_timeout_s
        self.max_per_replica = counts["max_per_replica"]
        self.accept = counts["accept_policy_versions"]
        self.mixed = grouping == "mixed"
        self.max_uses = counts["max_uses_per_group"]
        self.lease_timeout_s = lease_timeout_s
        self.retention_ttl_s = retention_ttl_s
        self.max_per_version = counts["max_groups_per_version"]
        self.numeric = numeric_versions
        self.flush_rows = counts["flush_rows"]
        self.flush_interval_s = flush_interval_s
        self.clock = clock or time.time
        self._store = storage.Store(root_path, durable)
        self._owner = self._store.claim()
        try:
            self._open()
        except BaseException:
            # Let go of the folder: a retry (after fixing what failed) must not find it
            # held by this failed attempt, which the traceback keeps alive.
            if self._owner is not None:
                self._owner.close()
            raise

    def _open(self) -> None:
        """The rest of ``__init__``: state, then what the store holds."""
        self._log = storage.ControlLog(self._store)
        # Names of files this process writes: unique per run, ordered within it.
        self._run = f"{time.time_ns():x}-{uuid.uuid4().hex[:6]}"
        self._files = 0
        self._closed = False
        self._pending: dict = {}  # aggregation key -> Aggregator, oldest first
        self._live: dict = {}  # group id -> Group, in seal order
        self._staged: list = []  # sealed groups not handed to the writer yet
        self._staged_rows = 0
        self._inflight: list = []  # (future, groups) of writes in the writer thread
        self._pool: Optional[ThreadPoolExecutor] = None
        self._staged_since: Optional[float] = None
        self._known: set = set()  # every group id ever sealed here or on storage
        # The rollouts of pending and live groups, by `_uid_key`: a uid is unique within
        # its prompt (and, grouping strictly, its policy version), as spec 000's
        # aggregators dedupe. One set for the whole buffer dropped every prompt's rollouts
        # but the first's when uids were numbered per prompt ("0" to "7"), and one per
        # prompt alone a prompt's rollouts drawn again at a newer version.
        self._seen_uids: set = set()
        self._by_version: dict = {}  # (environment, version) -> live group ids, oldest first
        self._scores: dict = {}  # group id -> {uid: {"scores": {}, "flags": {}}}
        self._lazy: list = []  # control events applied, to log with the next write
        self._highest_version: Optional[int] = None
        self.stats_ = Stats(self.clock())
        # Public methods hold `_mutex`; the flusher thread waits on `_staging` (see
        # `_flush_when_due`), started with the first staged group.
        self._mutex = threading.RLock()
        self._staging = threading.Condition(self._mutex)
        self._flusher: Optional[threading.Thread] = None
        snap, events, exits = self._log.load()
        self._control = Control.restore(snap, events, exits)
        self.rebuild_indexes()

    # ---- ingest -------------------------------------------------------------------

    def add_rollout(self, r: Any) -> str:
        """Adds one rollout; returns its outcome (see :meth:`add_rollouts`)."""
        return self.add_rollouts([r])[0]

    def add_rollouts(self, rs: Any) -> list:
        """Adds rollouts; returns each one's outcome: ``"pending"``, ``"sealed"`` (it
        completed a group), ``"duplicate"``, ``"version_rejected"``, ``"replica_capped"``
        or ``"duplicate_group"``.

        ``rs`` is a list of ``RolloutRecord`` (or dicts of its fields), or the same as
        columns: a pyarrow Table or RecordBatch, or a dict of columns (per-token fields as
        Arrow list columns or lists of arrays), which is the fast path across processes.

        All or none: a bad record (missing environment or example id, a non-integer
        version with ``numeric_versions``, per-token arrays of different lengths, a NaN
        reward, a negative token count, ...) raises ``ValueError`` naming the field and the
        record's uid, and none of the call's records is taken. A call with no rollouts (an
        empty list, table or dict of columns, or ``{}``) returns ``[]`` and changes
        nothing.
        """
        self._check_open()
        started = time.perf_counter()
        now = self.clock()
        if isinstance(rs, RolloutRecord):
            raise TypeError("add_rollouts takes a list of rollouts (or columns); for one, "
                            "use add_rollout(record) or add_rollouts([record])")
        if isinstance(rs, (pa.Table, pa.RecordBatch, dict)):
            table = columns_to_table(rs, self.numeric, now)
        elif rs is None or isinstance(rs, (str, bytes)) or not hasattr(rs, "__iter__"):
            raise ValueError(f"add_rollouts takes a list of rollouts (or columns), not {rs!r}")
        else:
            table = records_to_table(rs, self.numeric)[0]
        if not table.num_rows:
            return []  # a flush of nothing: checked (a table's columns), otherwise a no-op
        storage.check_partition_names(table)
        chunk = Chunk(table)
        columns = [
            table.column(name).to_pylist()
            for name in ("environment", "example_id", "rollout_policy_version", "segment_idx",
                         "rollout_uid", "replica_id")
        ]
        add = self._add
        out = [add(chunk, i, *row, now) for i, row in enumerate(zip(*columns))]
        self.stats_.received(table.num_rows, now)
        self._housekeeping(now)
        self.stats_.add_call(time.perf_counter() - started)
        return out

    def _add(self, chunk, i, env, ex, pv, seg, uid, rep, now) -> str:
        if self.accept is not None and pv not in self.accept:
            self.stats_.count("version_rejected")
            return "version_rejected"
        seen = self._uid_key(env, ex, pv, uid)
        if seen in self._seen_uids:
            self.stats_.count("duplicates")
            return "duplicate"
        key = (env, ex, seg) if self.mixed else (env, ex, seg, pv)
        agg = self._pending.get(key)
        if agg is None:
            agg = self._pending[key] = Aggregator(now)
        if self.max_per_replica is not None and agg.by_replica[rep] >= self.max_per_replica:
            self.stats_.count("replica_capped")
            return "replica_capped"
        self._seen_uids.add(seen)
        agg.uids.append(uid)
        agg.rows.append((chunk, i))
        agg.by_replica[rep] += 1
        agg.versions.add(pv)
        if len(agg.uids) >= self.target_size:
            return self._seal(key, agg, now)
        return "pending"

    def _uid_key(self, env: str, ex: str, pv: Optional[str], uid: str) -> tuple:
        """What names a rollout for the dedupe: its uid within its prompt and, grouping
        strictly, its policy version, as the group key has it. A prompt drawn again at a
        newer version, its uids numbered "0" to "7" again, makes a new group; a resend
        carries its version and is a duplicate. Grouping mixed, a group holds rollouts of
        several versions, so a uid is unique within the prompt alone."""
        return (env, ex, uid) if self.mixed else (env, ex, pv, uid)

    def _group_uid_keys(self, g: Group):
        """The `_uid_key` of each of a sealed group's rollouts (grouped strictly, all of
        the group's one version)."""
        return (self._uid_key(g.environment, g.example_id, g.policy_version, u) for u in g.uids)

    def _seal(self, key: tuple, agg: Aggregator, now: float) -> str:
        del self._pending[key]
        env, ex, seg = key[0], key[1], key[2]
        versions = sorted(agg.versions)
        pv = oldest_version(versions)
        gid = group_id(env, ex, "mixed" if self.mixed else pv, seg, agg.uids)
        if gid in self._known:
            self._seen_uids.difference_update(self._uid_key(env, ex, pv, u) for u in agg.uids)
            self.stats_.count("duplicate_groups")
            return "duplicate_group"
        self._known.add(gid)
        g = Group(
            gid, env, ex, pv, versions, seg, list(agg.uids), sorted(agg.by_replica), now,
            agg.created_ts, rows_by_chunk(agg.rows), written=False,
        )
        self._enter(g)
        self._staged.append(g)
        self._staged_rows += g.size
        self._mark_staged(now)
        self.stats_.sealed(now, (now - agg.created_ts) * 1000.0)
        self._enforce_caps(g)
        return "sealed"

    def tick(self) -> None:
        """Housekeeping: seals timed-out groups (at least ``min_group_size``), returns
        expired leases, applies retention, writes staged groups that waited
        ``flush_interval_s`` and logs evictions."""
        self._check_open()
        now = self.clock()
        self._housekeeping(now)
        self._write_control([])

    def _housekeeping(self, now: float) -> None:
        timed_out = []
        for key, agg in self._pending.items():
            if now - agg.created_ts < self.seal_timeout_s:
                break  # oldest first: the rest are younger
            if len(agg.uids) >= self.min_size:
                timed_out.append((key, agg))
        for key, agg in timed_out:
            self._seal(key, agg, now)
        self._expire_leases(now)
        self._retention(now)
        if self._staged and (
            self._staged_rows >= self.flush_rows
            or now - self._staged_since >= self.flush_interval_s
        ):
            self._write_staged()
        self._reap(wait=False, raise_errors=False)

    # ---- capacity and retention ----------------------------------------------------

    def _enter(self, g: Group) -> None:
        """A group joins the live set (and its per-version index). The highest version
        seen is that of the groups stored, sealed here or found on storage, so it is the
        same after a restart: rollouts refused (a version not accepted, a duplicate) or
        still pending had raised it, and a lag-filtered draw then found nothing."""
        self._live[g.id] = g
        self._by_version.setdefault((g.environment, g.policy_version), {})[g.id] = None
        self._seen_uids.update(self._group_uid_keys(g))
        for n in [g.version_num] + [version_number(v) for v in g.versions]:
            if n is not None and (self._highest_version is None or n > self._highest_version):
                self._highest_version = n

    def _leave(self, gid: str) -> None:
        """A group leaves the live set: its uids may be sent again (rollout dedupe is
        within pending and live groups, as spec 000 has it; a whole group sent again keeps
        its id and is refused by the group dedupe)."""
        g = self._live.pop(gid, None)
        if g is None:
            return
        self._scores.pop(gid, None)
        same = self._by_version.get((g.environment, g.policy_version))
        if same is not None:
            same.pop(gid, None)
            if not same:
                del self._by_version[(g.environment, g.policy_version)]
        self._seen_uids.difference_update(self._group_uid_keys(g))

    def _evict(self, gids: list, reason: str) -> None:
        if not gids:
            return
        e = {"e": "exit", "g": gids, "r": reason}
        self._control.apply(e)
        self._lazy.append(e)
        for gid in gids:
            self._leave(gid)
        self.stats_.count(reason, len(gids))

    def _oldest_unleased(self, gids: Iterable[str], k: int) -> list:
        leased = self._control.leased
        out = []
        for gid in gids:
            if len(out) == k:
                break
            if gid not in leased:
                out.append(gid)
        return out

    def _enforce_caps(self, newest: Group) -> None:
        if self.max_per_version is not None:
            same = self._by_version.get((newest.environment, newest.policy_version), {})
            over = len(same) - self.max_per_version
            if over > 0:
                self._evict(self._oldest_unleased(same, over), "evicted")
        over = len(self._live) - self.capacity
        if over > 0:
            self._evict(self._oldest_unleased(self._live, over), "evicted")

    def _retention(self, now: float) -> None:
        if self.retention_ttl_s is None:
            return
        leased = self._control.leased
        old = []
        for gid, g in self._live.items():
            if now - g.sealed_ts < self.retention_ttl_s:
                break
            if gid not in leased:
                old.append(gid)
        self._evict(old, "retention")

    def _expire_leases(self, now: float) -> None:
        expired = [b for b, ts in self._control.open.items() if now - ts >= self.lease_timeout_s]
        if expired:
            self.stats_.count("leases_expired", len(expired))
            self._settle_batches(expired, "expired")

    # ---- durability ----------------------------------------------------------------

    def _write_staged(self) -> None:
        """Hands every staged group to the writer thread: one data file (and manifest) per
        partition. Parquet encoding and compression run there, beside the next calls;
        :meth:`_reap` waits for them where durability is needed."""
        if not self._staged:
            return
        parts: dict = {}
        for g in self._staged:
            parts.setdefault((g.environment, g.policy_version, g.segment_idx), []).append(g)
        for groups in parts.values():
            self._files += 1
            future = self._writer().submit(
                self._write_part, groups, f"{self._run}-{self._files:06d}"
            )
            self._inflight.append((future, groups))
        self._staged = []
        self._staged_rows = 0
        self._staged_since = None

    def _mark_staged(self, now: float) -> None:
        """Notes that groups wait to be written since ``now`` (unless some already waited)
        and has the flusher thread write them once they waited ``flush_interval_s``."""
        if self._staged_since is not None:
            return
        self._staged_since = now
        if not 0 < self.flush_interval_s < math.inf:
            return  # 0: written by this call; infinity: by flush_rows, flush and close
        if self._flusher is None:
            # The thread holds the buffer weakly: one dropped without close() is collected
            # (its folder's lock let go, as a crash would), and the finalizer wakes the
            # thread to end.
            self._flusher = threading.Thread(
                target=_flush_when_due, args=(weakref.ref(self), self._staging),
                name="replay-flusher", daemon=True,
            )
            self._flusher.start()
            weakref.finalize(self, _wake, self._staging)
        self._staging.notify()

    def _flush_if_due(self) -> Optional[float]:
        """In the flusher thread, under the lock: hands the staged groups to the writer if
        they waited ``flush_interval_s`` by the buffer's clock; returns how long to wait
        before asking again (``None``: until notified), or ``0`` once closed."""
        if self._closed:
            return 0.0
        try:
            # Writes handed over earlier: a failed one is staged again (and retried once
            # due) without waiting for a call.
            self._reap(wait=False, raise_errors=False)
            if self._staged_since is not None:
                left = self._staged_since + self.flush_interval_s - self.clock()
                if left > 0:
                    return min(left, threading.TIMEOUT_MAX)
                self._write_staged()
                self._reap(wait=False, raise_errors=False)
        except Exception as e:  # noqa: BLE001 - the next call or flush retries
            log.warning("replay data write failed (retried with the next write): %s", e)
            return self.flush_interval_s
        if self._inflight:
            return min(self.flush_interval_s, 1.0)  # to see how they end
        return None

    def _write_part(self, groups: list, name: str) -> None:
        """In the writer thread: gathers the groups' rows and writes them. Reads only what
        a sealed group never changes (its rows' chunks, its header)."""
        storage.write_groups(
            self._store,
            name,
            materialize(groups, self._read_file),
            [(g.id, g.example_id, g.uids, g.sealed_ts, g.first_ts, g.versions, g.replicas)
             for g in groups],
            self.compression,
        )

    def _writer(self) -> ThreadPoolExecutor:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(1, thread_name_prefix="replay-writer")
        return self._pool

    def _reap(self, wait: bool, raise_errors: bool = True) -> None:
        """Marks the groups of finished writes as written (all writes, waiting, with
        ``wait``). A failed write puts its groups back in the stage (the next write tries
        them again) and raises its error, or logs it without ``raise_errors``."""
        failed = None
        still = []
        for future, groups in self._inflight:
            if not wait and not future.done():
                still.append((future, groups))
                continue
            try:
                future.result()
            except Exception as e:  # noqa: BLE001 - re-raised below, after re-staging
                failed = failed or e
                self._staged.extend(groups)
                self._staged_rows += sum(g.size for g in groups)
                self._mark_staged(self.clock())
                continue
            for g in groups:
                g.written = True
            self.stats_.count("groups_written", len(groups))
        self._inflight = still
        if failed is not None:
            if raise_errors:
                raise failed
            log.warning("replay data write failed (retried with the next write): %s", failed)

    def _durable(self, groups: list) -> None:
        """Returns once ``groups`` are on storage."""
        if any(not g.written for g in groups):
            self._write_staged()
            self._reap(wait=True)

    def _commit(self, events: list) -> None:
        """Logs ``events`` (after the lazy ones), then applies them: a group that exits
        leaves the live set here, before the snapshot that may follow, so a failed snapshot
        cannot leave a consumed group drawable."""
        self._write_control(events)
        for e in events:
            self._control.apply(e)
            if e["e"] == "exit":
                for gid in e["g"]:
                    self._leave(gid)
                if e["r"] == "consumed":
                    self.stats_.count("consumed", len(e["g"]))
        if self._log.since_snapshot >= SNAPSHOT_EVERY:
            self._snapshot()

    def _snapshot(self) -> None:
        """Snapshots the control state. The exits it writes are forgotten as fresh only
        once written: a failed write leaves them for the next snapshot (which deletes the
        logs that hold them now)."""
        self._log.snapshot(self._control.snapshot(), self._control.fresh_exits)
        self._control.fresh_exits = {}

    def _write_control(self, events: list) -> None:
        """Logs the lazy events (already applied) and ``events`` (not yet) in one object."""
        batch = self._lazy + events
        if not batch:
            return
        self._log.append(batch)
        self._lazy = []

    def _read_file(self, rel: str) -> pa.Table:
        return storage.read_data_file(self._store, rel)

    def flush(self) -> None:
        """Writes every sealed group and every logged change."""
        self._check_open()
        self._write_staged()
        self._reap(wait=True)
        self._write_control([])

    def close(self) -> None:
        """Flushes, snapshots the control state and releases the buffer; any later call
        raises :class:`ReplayBufferClosed`."""
        if self._closed:
            return
        self.flush()
        self._snapshot()
        self._closed = True
        self._staging.notify_all()  # the flusher thread ends
        if self._pool is not None:
            self._pool.shutdown()
        if self._owner is not None:
            self._owner.close()  # another buffer may open the folder now
        self._live.clear()
        self._pending.clear()

    def __enter__(self) -> "ReplayBuffer":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _check_open(self) -> None:
        if self._closed:
            raise ReplayBufferClosed(f"the replay buffer at {self.root_path!r} is closed")

    def rebuild_indexes(self) -> None:
        """Rebuilds the sealed groups from storage (manifests; data files without one are
        scanned) and the scores sidecar; the control state decides which are live and
        which are leased. Staged groups are written first; aggregators are kept."""
        self._check_open()
        self._write_staged()
        self._reap(wait=True)
        files: dict = {}
        kept = self._live
        self._live, self._by_version = {}, {}
        # A pending aggregator's key is (environment, example id, segment[, version]).
        self._seen_uids = {
            self._uid_key(k[0], k[1], k[3] if len(k) > 3 else None, u)
            for k, agg in self._pending.items()
            for u in agg.uids
        }
        for h in sorted(storage.scan_groups(self._store), key=lambda h: (h["sealed_ts"], h["group_id"])):
            gid = h["group_id"]
            self._known.add(gid)
            if gid in self._control.exited or gid in self._live:
                continue
            parts = kept[gid].parts if gid in kept else None
            if parts is None:
                c = files.setdefault(h["file"], Chunk(file=h["file"]))
                parts = [(c, np.arange(h["row"], h["row"] + h["num_rollouts"]))]
            g = Group(
                gid, h["environment"], h["example_id"], h["policy_version"],
                h.get("policy_versions", []), h["segment_idx"], list(h["uids"]),
                h.get("replicas", []), h["sealed_ts"], h.get("first_ts", h["sealed_ts"]), parts,
                True,
            )
            self._enter(g)
        self._scores = {}
        for gid, uid, scores, flags, _ in storage.read_scores(self._store):
            if gid in self._live:
                self._apply_scores(gid, [uid] if uid else self._live[gid].uids, scores, flags)

    # ---- drawing -------------------------------------------------------------------

    def set_policy_version(self, v: int) -> None:
        """The trainer's current version (lag is measured from the higher of this and
        the highest version seen)."""
        self._check_open()
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or not -(2**63) <= v < 2**63:
            raise ValueError(f"policy version must be an int (of 64 bits), not {v!r}")
        self._commit([{"e": "version", "v": int(v)}])

    def current_version(self) -> Optional[int]:
        vs = [v for v in (self._control.version, self._highest_version) if v is not None]
        return max(vs) if vs else None
