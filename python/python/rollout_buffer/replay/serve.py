"""The trainer's and the verifier's side of :class:`ReplayBuffer`: drawing batches, acks,
the step -> batch map, reading groups back, scores and stats. A mixin over the buffer's
state (``buffer.py`` owns ingest, capacity and durability).
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from typing import Any, Iterable, Optional

import numpy as np
import pyarrow as pa

from .draw import check_int, recency_weights, round_robin, version_set, window
from .groups import materialize
from .records import RolloutGroup, SampledBatch, not_utf8, table_to_records

_STATUSES = ("ok", "failed")


def _check_name(group_id: str, kind: str, name: str) -> None:
    """A score or flag name is an Arrow string in the sidecar: one with no UTF-8 (a lone
    surrogate) failed in the write with a UnicodeEncodeError naming neither it nor the
    group."""
    why = not_utf8(name)
    if why is not None:
        raise ValueError(f"group {group_id!r}: {kind} name {name!r} {why}")


# What a sharded front adds to a shard's draw (see `_ready`).
_SHARDED = {"_current", "_keep_versions"}
# What `ready_count` takes: the draw's filters.
_FILTERS = {"max_policy_lag", "recent_n_versions", "recency_weighting", "on_policy_fraction", "require_flags"}


class Serving:
    """Mixed into ``ReplayBuffer``; see its docs."""

    def sample_groups(
        self,
        n: int,
        *,
        seed: int = 0,
        start_offset: int = 0,
        prefer_policy_versions: Optional[Iterable[Any]] = None,
        max_policy_lag: Optional[int] = None,
        recent_n_versions: Optional[int] = None,
        recency_weighting: str = "uniform",
        on_policy_fraction: Optional[float] = None,
        require_flags: Optional[dict] = None,
        _step: Optional[int] = None,
        _current: Optional[int] = None,
        _keep_versions: Optional[list] = None,
    ) -> SampledBatch:
        """Draws up to ``n`` ready, unleased groups and leases them to a new batch.

        Redelivered groups (a failed ack, an expired lease) come first, in the order they
        came back; the rest follow the seeded round-robin over examples (``draw.py``),
        positions ``start_offset .. start_offset + n``, wrapping. Filters: versions within
        ``max_policy_lag`` of the current one, or among the ``recent_n_versions`` newest;
        ``require_flags`` (every rollout of the group flagged so by a verifier). Order:
        ``prefer_policy_versions`` first; ``on_policy_fraction`` of the batch from the
        current version; ``recency_weighting`` (``uniform``, ``linear``, ``exp``) weights
        the shuffle by lag. The batch's groups are written before its lease is logged.
        ``seed`` and ``start_offset`` are ints (a float or a bool is a ``ValueError``).
        """
        self._check_open()
        started = time.perf_counter()
        n = check_int("n", n, 0)
        seed = check_int("seed", seed)
        start_offset = check_int("start_offset", start_offset)
        now = self.clock()
        self._housekeeping(now)
        ready, current = self._ready(
            max_policy_lag, recent_n_versions, recency_weighting, on_policy_fraction, require_flags,
            _current, _keep_versions,
        )
        ready_ids = {g.id for g in ready}
        first = [self._live[gid] for gid in self._control.redeliver if gid in ready_ids]
        picked = first[:n]
        first_ids = {g.id for g in first}
        rest = [g for g in ready if g.id not in first_ids]
        want = n - len(picked)
        if want > 0 and on_policy_fraction is not None and current is not None:
            on = [g for g in rest if g.version_num == current]
            k = min(len(on), int(round(want * on_policy_fraction)))
            took = window(self._order(on, seed, recency_weighting, current), start_offset, k)
            picked += took
            ids = {g.id for g in took}
            rest = [g for g in rest if g.id not in ids]
            want -= len(took)
        if want > 0 and prefer_policy_versions is not None:
            prefer = version_set("prefer_policy_versions", prefer_policy_versions, self.numeric)
            head = [g for g in rest if g.policy_version in prefer]
            tail = [g for g in rest if g.policy_version not in prefer]
            order = self._order(head, seed, recency_weighting, current) + self._order(
                tail, seed, recency_weighting, current
            )
            picked += window(order, start_offset, want)
        elif want > 0:
            picked += window(self._order(rest, seed, recency_weighting, current), start_offset, want)
        batch = self._lease(picked, now, current, _step)
        self.stats_.sampled((time.perf_counter() - started) * 1000.0)
        return batch

    def ready_count(self, **filters: Any) -> int:
        """How many groups ``sample_groups`` with these filters could draw now."""
        self._check_open()
        # The draw's options that do not filter (seed, offset, preference) are taken and
        # ignored, so the same keywords serve both calls; any other is named.
        for name in ("prefer_policy_versions", "seed", "start_offset"):
            filters.pop(name, None)
        unknown = sorted(set(filters) - _FILTERS - _SHARDED)
        if unknown:
            raise TypeError(f"ready_count() got unknown filters {unknown}; filters are {sorted(_FILTERS)}")
        self._housekeeping(self.clock())
        return len(self._ready(**filters)[0])

    def ready_versions(self, **filters: Any) -> tuple:
        """For a sharded front's draw with lag filters: the current version, and per
        integer version of the unleased groups, how many there are and how many of them
        pass ``require_flags``. The filters are checked as ``ready_count`` checks them."""
        self.ready_count(**filters)
        flags = filters.get("require_flags")
        counts: dict = {}
        leased = self._control.leased
        for g in self._live.values():
            if g.id not in leased:
                c = counts.setdefault(g.version_num, [0, 0])
                c[0] += 1
                c[1] += not flags or self._flags_hold(g, flags)
        return self.current_version(), counts

    def _ready(
        self,
        max_policy_lag: Optional[int] = None,
        recent_n_versions: Optional[int] = None,
        recency_weighting: str = "uniform",
        on_policy_fraction: Optional[float] = None,
        require_flags: Optional[dict] = None,
        _current: Optional[int] = None,
        _keep_versions: Optional[list] = None,
    ) -> tuple:
        """The unleased groups that pass the filters, and the current version. A sharded
        front passes ``_current`` (the newest version over all shards) and
        ``_keep_versions`` (the versions its lag filters keep, over all shards), so each
        shard filters as one buffer holding every shard's groups would."""
        # Numbers, not text or bools: a str had failed inside the comparison with a
        # TypeError naming neither the option nor its value.
        for name, v in (("on_policy_fraction", on_policy_fraction), ("max_policy_lag", max_policy_lag)):
            if v is not None and (isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, float, np.number))):
                raise ValueError(f"{name} must be a number, not {v!r}")
        if on_policy_fraction is not None and not 0.0 <= on_policy_fraction <= 1.0:
            raise ValueError(f"on_policy_fraction must be in [0, 1], not {on_policy_fraction}")
        if max_policy_lag is not None and not max_policy_lag >= 0:  # NaN too
            raise ValueError(f"max_policy_lag must be >= 0, not {max_policy_lag}")
        # numpy ints too (a count taken from an array): it was refused as "not an int".
        if recent_n_versions is not None and (
            isinstance(recent_n_versions, (bool, np.bool_))
            or not isinstance(recent_n_versions, (int, np.integer))
            or recent_n_versions < 1
        ):
            raise ValueError(f"recent_n_versions must be an int >= 1, not {recent_n_versions!r}")
        if recent_n_versions is not None:
            recent_n_versions = int(recent_n_versions)
        if require_flags is not None and not isinstance(require_flags, dict):
            raise ValueError(f"require_flags must be a dict of flag -> value, not {require_flags!r}")
        recency_weights(np.zeros(0), recency_weighting)  # checks the name
        current = self.current_version() if _current is None else _current
        lag_used = (
            max_policy_lag is not None
            or recent_n_versions is not None
            or recency_weighting != "uniform"
            or on_policy_fraction is not None
        )
        leased = self._control.leased
        ready = [g for g in self._live.values() if g.id not in leased]
        if lag_used:
            bad = next((g for g in self._live.values() if g.version_num is None), None)
            if bad is not None:
                raise ValueError(
                    f"rollout {bad.uids[0]!r} (group {bad.id!r}): field 'policy_version' is"
                    f" {bad.policy_version!r}, not an integer: the lag controls need integer"
                    " versions"
                )
        if _keep_versions is not None:
            keep = set(_keep_versions)
            ready = [g for g in ready if g.version_num in keep]
        elif max_policy_lag is not None and current is not None:
            ready = [g for g in ready if current - g.version_num <= max_policy_lag]
        if recent_n_versions is not None and _keep_versions is None:
            keep = set(sorted({g.version_num for g in ready}, reverse=True)[:recent_n_versions])
            ready = [g for g in ready if g.version_num in keep]
        if require_flags:
            ready = [g for g in ready if self._flags_hold(g, require_flags)]
        return ready, current

    def recorded_batch(self, step: int) -> Optional[SampledBatch]:
        """The batch recorded for ``step``, if any. ``step`` is an int (a float or a bool
        is a ``ValueError``: ``int(1.9)`` answered with step 1's batch)."""
        self._check_open()
        step = check_int("step", step)
        bid = self._control.steps.get(step)
        if bid is None:
            return None
        b = self._control.batches[bid]
        return SampledBatch(bid, list(b["g"]), b["ts"], step)

    def _order(self, groups: list, seed: int, mode: str, current: Optional[int]) -> list:
        if not groups:
            return []
        gh = np.fromiter((g.group_hash for g in groups), np.uint64, len(groups))
        eh = np.fromiter((g.example_hash for g in groups), np.uint64, len(groups))
        weights = None
        if mode != "uniform":
            # Floats: a lag past int64 (a version of 2**70) overflowed the array.
            lags = np.fromiter(
                (float((current or 0) - (g.version_num or 0)) for g in groups), np.float64, len(groups)
            )
            weights = recency_weights(lags, mode)
        return [groups[i] for i in round_robin(gh, eh, seed, weights)]

    def _lease(self, picked: list, now: float, current: Optional[int], step: Optional[int]) -> SampledBatch:
        self._durable(picked)
        bid = self._control.next_batch_id()
        gids = [g.id for g in picked]
        self._commit([{"e": "lease", "b": bid, "g": gids, "ts": now, "step": step}])
        for g in picked:
            lag = None if current is None or g.version_num is None else current - g.version_num
            self.stats_.drawn(lag)
        self.stats_.count("batches")
        return SampledBatch(bid, gids, now, step)

    def next_batch(self, step: int, n_groups: int, **kwargs: Any) -> SampledBatch:
        """The batch of training step ``step``: the same one every time the step is
        asked for, also after a crash (the map is durable); a new step draws
        ``n_groups`` with ``sample_groups(**kwargs)`` (``seed`` defaults to ``step``). A
        step whose draw found nothing ready is not recorded, so asking again draws again."""
        self._check_open()
        step = check_int("step", step)
        recorded = self.recorded_batch(step)
        if recorded is not None:
            return recorded
        kwargs.setdefault("seed", step)
        return self.sample_groups(n_groups, _step=step, **kwargs)

    def ack(self, batch_id: str, status: str = "ok") -> None:
        """Settles a batch: ``"ok"`` counts a use of each group (a group reaching
        ``max_uses_per_group`` is consumed); ``"failed"`` returns them uncounted, first in
        the next draw. Acking again with the same status does nothing; an unknown batch id
        is a ``KeyError`` naming it; another status for a settled batch is a
        ``ValueError``."""
        self._check_open()
        if not isinstance(batch_id, str):
            raise ValueError(f"batch_id must be a batch's id (a str), not {batch_id!r}")
        if status not in _STATUSES:
            raise ValueError(f"status must be 'ok' or 'failed', not {status!r}")
        b = self._control.batches.get(batch_id)
        if b is None:
            raise KeyError(f"unknown batch id {batch_id!r}")
        was = b["s"]
        if was == status or (was == "expired" and status == "failed") or not b["g"]:
            return  # a retry, or an empty batch (nothing to settle)
        if was in _STATUSES:
            raise ValueError(f"batch {batch_id!r} was already acked {was!r}, not {status!r}")
        started = time.perf_counter()
        self.stats_.count("acks_ok" if status == "ok" else "acks_failed")
        self._settle_batches([batch_id], status)
        self.stats_.acked((time.perf_counter() - started) * 1000.0)

    def _settle_batches(self, batch_ids: list, status: str) -> None:
        """Settles `batch_ids` as ``status`` (``"ok"``, ``"failed"`` or ``"expired"``),
        consuming each group this leaves at ``max_uses_per_group``: one an ``ok`` brings
        there, or one that reached it while another batch held it (an expired lease drawn
        again, then acked) once that batch settles. Such a group is never served again."""
        kind = {"ok": "ack", "failed": "ack", "expired": "expire"}[status]
        events = [{"e": kind, "b": b} | ({"s": status} if kind == "ack" else {})
                  for b in batch_ids]
        if self.max_uses is not None:
            uses = self._control.uses
            leased = self._control.leased
            counted = 1 if status == "ok" else 0
            # A group another batch holds now (this one's lease expired and it was drawn
            # again) is left to that batch's settling.
            done = [
                g for b in batch_ids for g in self._control.batches[b]["g"]
                if g in self._live and uses[g] + counted >= self.max_uses
                and leased.get(g, b) == b
            ]
            if done:
                events.append({"e": "exit", "g": done, "r": "consumed"})
        self._commit(events)  # the consumed groups leave the live set there, counted

    # ---- reading groups ------------------------------------------------------------

    def get_groups(self, group_ids: Iterable[str], as_arrow: bool = False) -> Any:
        """The groups, in the order asked: ``RolloutGroup`` records, or one Arrow table
        (the dataset's schema, each group's rows together) with ``as_arrow=True``. A group
        not in the buffer (never sealed, evicted, consumed) is a ``KeyError`` naming it
        and why."""
        self._check_open()
        if isinstance(group_ids, str):
            raise ValueError(f"group_ids must be a list of ids, not the one string {group_ids!r}")
        if group_ids is None or not hasattr(group_ids, "__iter__"):
            raise ValueError(f"group_ids must be a list of ids, not {group_ids!r}")
        groups = []
        for gid in group_ids:
            g = self._live.get(gid)
            if g is None:
                why = self._control.exited.get(gid)
                raise KeyError(f"group {gid!r} is not in the buffer" + (f" ({why})" if why else ""))
            groups.append(g)
        table = materialize(groups, self._read_file)
        if as_arrow:
            return table
        out, row = [], 0
        for g in groups:
            out.append(self._group_record(g, table.slice(row, g.size)))
            row += g.size
        return out

    def get_batch(self, batch_id: str, as_arrow: bool = True) -> Any:
        """:meth:`get_groups` of a batch's groups."""
        self._check_open()
        b = self._control.batches.get(batch_id)
        if b is None:
            raise KeyError(f"unknown batch id {batch_id!r}")
        return self.get_groups(b["g"], as_arrow=as_arrow)

    def _group_record(self, g: Any, table: pa.Table) -> RolloutGroup:
        meta = {
            "num_rollouts": len(g.uids),
            "uids": sorted(g.uids),
            "replicas": list(g.replicas),
            "policy_versions": list(g.versions) or [g.policy_version],
            "uses": self._control.uses.get(g.id, 0),
        }
        sc = self._scores.get(g.id)
        if sc:
            meta["scores"] = {u: dict(v["scores"]) for u, v in sc.items()}
            meta["flags"] = {u: dict(v["flags"]) for u, v in sc.items()}
        return RolloutGroup(
            id=g.id,
            environment=g.environment,
            example_id=g.example_id,
            policy_version=g.policy_version,
            rollouts=table_to_records(table),
            sealed_ts=g.sealed_ts,
            metadata=meta,
            segment_idx=g.segment_idx,
        )

    # ---- scores --------------------------------------------------------------------

    def holds(self, group_ids: Iterable[str]) -> list:
        """For each id, whether the group is in the buffer now (for a sharded front that
        routes by group id)."""
        self._check_open()
        return [gid in self._live for gid in group_ids]

    def upsert_scores(
        self,
        group_id: str,
        scores: dict,
        flags: Optional[dict] = None,
        rollout_uid: Optional[str] = None,
    ) -> None:
        """Scores every rollout of a group, or one (``rollout_uid``), into the sidecar
        dataset: merged over earlier scores, durable when this returns, visible to
        ``require_flags`` and in ``metadata["scores"]``. An unknown group or uid is a
        ``KeyError``; a non-finite score, a non-bool flag or a name that is no valid text
        a ``ValueError``; then nothing is written."""
        self._check_open()
        # Mappings only: `dict()` of anything else raised a TypeError about "update
        # sequence elements", naming neither the argument nor what it takes.
        if not isinstance(scores, Mapping):
            raise ValueError(
                f"group {group_id!r}: scores must be a dict of score name (str) -> number, not {scores!r}"
            )
        if flags is not None and not isinstance(flags, Mapping):
            raise ValueError(
                f"group {group_id!r}: flags must be a dict of flag name (str) -> bool (or None), not {flags!r}"
            )
        g = self._live.get(group_id)
        if g is None:
            why = self._control.exited.get(group_id)
            raise KeyError(f"group {group_id!r} is not in the buffer" + (f" ({why})" if why else ""))
        if rollout_uid is not None and rollout_uid not in g.uids:
            raise KeyError(f"group {group_id!r} has no rollout {rollout_uid!r}")
        clean = {}
        for k, v in dict(scores).items():
            if not isinstance(k, str) or isinstance(v, bool) or not isinstance(v, (int, float, np.number)):
                raise ValueError(f"group {group_id!r}: score {k!r} must be a str -> number, not {v!r}")
            _check_name(group_id, "score", k)
            try:
                finite = math.isfinite(float(v))
            except OverflowError:  # an int past float64's range
                finite = False
            if not finite:
                raise ValueError(f"group {group_id!r}: score {k!r} is {v}: not finite")
            clean[k] = float(v)
        clean_flags = {}
        for k, v in dict(flags or {}).items():
            if not isinstance(k, str) or not isinstance(v, (bool, np.bool_)):
                raise ValueError(f"group {group_id!r}: flag {k!r} must be a str -> bool, not {v!r}")
            _check_name(group_id, "flag", k)
            clean_flags[k] = bool(v)
        uids = [rollout_uid] if rollout_uid is not None else list(g.uids)
        from . import storage

        self._files += 1
        storage.write_scores(
            self._store,
            f"{self._run}-{self._files:06d}",
            [(group_id, u, clean, clean_flags) for u in uids],
        )
        if group_id not in self._scores:
            self.stats_.verified((self.clock() - g.sealed_ts) * 1000.0)
        self._apply_scores(group_id, uids, clean, clean_flags)

    def _apply_scores(self, gid: str, uids: list, scores: dict, flags: dict) -> None:
        per = self._scores.setdefault(gid, {})
        for u in uids:
            entry = per.setdefault(u, {"scores": {}, "flags": {}})
            entry["scores"].update(scores)
            entry["flags"].update(flags)

    def _flags_hold(self, g: Any, required: dict) -> bool:
        sc = self._scores.get(g.id)
        if not sc:
            return False
        for u in g.uids:
            f = sc.get(u, {}).get("flags", {})
            if any(f.get(k) != v for k, v in required.items()):
                return False
        return True

    # ---- stats ---------------------------------------------------------------------

    def stats(self) -> dict:
        """Counts, rates and the spec's observability figures: ``policy_lag_histogram``,
        ``ready_by_policy_version``, ``seal_time_ms_p50/p99``, ``generator_queue_len``
        (rollouts in unsealed groups), ``verifier_latency_ms`` (seal to first score)."""
        self._check_open()
        now = self.clock()
        leased = self._control.leased
        ready: dict = {}
        for g in self._live.values():
            if g.id not in leased:
                ready[g.policy_version] = ready.get(g.policy_version, 0) + 1
        return self.stats_.report(
            now,
            groups_live=len(self._live),
            groups_ready=sum(ready.values()),
            groups_leased=len(leased),
            groups_staged=len(self._staged),
            batches_open=len(self._control.open),
            redelivery_queue=len(self._control.redeliver),
            ready_by_policy_version=ready,
            generator_queue_len=sum(len(a.uids) for a in self._pending.values()),
            pending_groups=len(self._pending),
            policy_version=self.current_version(),
        )
