"""Replay buffers as Ray actors: one (:func:`remote`) or one per shard
(:class:`ShardedReplayBuffer`).

Each shard is a :class:`ReplayBuffer` actor on its own folder under the root, restarted by
Ray after a crash (``max_restarts=-1``) and recovering from that folder. The sharded front
is a plain object holding the shard handles, so it pickles into producer and trainer
tasks: producers write to their shard directly, the trainer draws across shards
deterministically (``sample_groups`` asks every shard for its ready count, splits ``n``
round-robin from ``seed % shards``, and draws each part on its shard with the same seed and
offset), and payloads go from the shards to the trainer as Ray object refs
(:meth:`ShardedReplayBuffer.batch_refs`): only ids travel through the front.
"""

from __future__ import annotations

import inspect
import os
import time
from typing import Any, Iterable, Optional

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs

from . import storage
from .buffer import ReplayBuffer
from .options import check_options
from .draw import check_int, stable_hash
from .columns import columns_to_table, dict_to_table
from .records import SCHEMA, RolloutRecord, SampledBatch, as_record, records_to_table

_ACTOR = None
# The draw's filters: what decides which groups a shard counts as ready.
_FILTERS = (
    "max_policy_lag", "recent_n_versions", "recency_weighting", "on_policy_fraction",
    "require_flags",
)


def _actor_class():
    global _ACTOR
    if _ACTOR is None:
        import ray

        _ACTOR = ray.remote(ReplayBuffer)
    return _ACTOR


def remote(root_path: str, *, ray_options: Optional[dict] = None, **kwargs: Any):
    """A :class:`ReplayBuffer` actor on ``root_path``, restarted by Ray on failure (and
    then recovered from storage). ``ray_options`` go to ``.options()``; the defaults are
    ``max_concurrency=1``, ``max_restarts=-1`` and ``max_task_retries=-1`` (a call cut by
    a crash is retried on the restarted actor: acks, ``add_rollouts`` and ``next_batch``
    are safe to retry; a retried ``sample_groups`` may leave one more leased batch, which
    expires after ``lease_timeout_s``). A bad ``kwargs`` option is a ``ValueError`` here,
    before the actor starts."""
    _check_buffer_options(root_path, kwargs)
    opts = {"max_concurrency": 1, "max_restarts": -1, "max_task_retries": -1}
    opts.update(ray_options or {})
    return _actor_class().options(**opts).remote(root_path, **kwargs)


def _check_buffer_options(root_path: str, kwargs: dict) -> dict:
    """Checks a ``ReplayBuffer``'s arguments before its actor starts: an actor refusing
    them would die in its constructor, and every call to it raise that as an actor error
    (an unknown name is a ``TypeError``, as the constructor's). Returns every argument
    of the constructor, defaults included."""
    given = inspect.signature(ReplayBuffer).bind(root_path, **kwargs)
    given.apply_defaults()
    check_options(given.arguments)
    return given.arguments


def _join(root: str, name: str) -> str:
    return f"{root.rstrip('/')}/{name}"


def _environment_shard_folder(environment: str) -> str:
    """The folder of an environment's shard: ``shard=env-<name URL-quoted>``, as partition
    folders are named, so a ``/`` in a name makes no nested folder and ``..`` climbs out of
    none. A ``ValueError`` naming the environment if that is no folder name a file system
    takes (text without UTF-8, over ``storage.NAME_MAX`` bytes)."""
    try:
        folder = f"shard=env-{storage.quote_part(environment)}"
    except UnicodeEncodeError:
        raise ValueError(f"environment {environment!r} is text without a UTF-8 form; it cannot name a shard folder") from None
    problem = storage.folder_name_error("shard=env-", "environment ", "a shard", environment)
    if problem:
        raise ValueError(problem)
    return folder


def _refuse_legacy_folder(root_path: str, environment: str, folder: str) -> None:
    """A ``ValueError`` if the folder this environment's shard had before names were
    quoted (``shard=env-<raw name>``) is another one and holds something: the shard would
    start empty beside it, its groups and remembered uids gone without a word."""
    legacy = f"shard=env-{environment}"
    if legacy == folder:
        return
    try:
        fs, root, _ = storage.filesystem(root_path)
        found = fs.get_file_info(_join(root, legacy)).type == pafs.FileType.Directory
    except (OSError, ValueError, pa.ArrowException):
        return  # nothing to read there: nothing to keep
    if found:
        raise ValueError(
            f"environment {environment!r}: its shard's folder is {folder!r} now (the name "
            f"URL-quoted, as partition folders are), and {legacy!r} under {root_path} holds "
            "the data of an earlier run: move it to the new name before starting"
        )


class ShardedReplayBuffer:
    """Shards of a replay buffer on Ray. ``by="environment"``: ``shards`` lists the
    environments, one shard each (spec 000's "one replay buffer per env type"); a record
    of another environment is a ``ValueError``. ``by="hash"``: ``shards`` is a count, and
    a record goes to the shard of the hash of its environment and example id (so a
    group's rollouts always meet). Other keyword arguments go to every shard's
    :class:`ReplayBuffer`, checked here first (a bad one is a ``ValueError`` naming it,
    before any actor starts)."""

    def __init__(
        self,
        root_path: str,
        shards: Any,
        *,
        by: str = "environment",
        ray_options: Optional[dict] = None,
        **buffer_kwargs: Any,
    ) -> None:
        if isinstance(root_path, os.PathLike):
            root_path = os.fspath(root_path)  # a pathlib.Path, as one buffer takes it
        if by == "environment":
            if isinstance(shards, (str, bytes)) or not hasattr(shards, "__iter__"):
                # A string was read as one environment per character.
                raise ValueError(f"with by='environment', shards is a list of environment names, not {shards!r}")
            self.keys = [str(s) for s in shards]
            if not self.keys or len(set(self.keys)) != len(self.keys):
                raise ValueError(f"shards must be distinct environment names, not {shards!r}")
            names = [_environment_shard_folder(k) for k in self.keys]
            for k, name in zip(self.keys, names):
                _refuse_legacy_folder(root_path, k, name)
        elif by == "hash":
            if isinstance(shards, bool) or not isinstance(shards, (int, np.integer)) or shards < 1:
                raise ValueError(f"with by='hash', shards is a count >= 1, not {shards!r}")
            self.keys = list(range(int(shards)))
            names = [f"shard={i}" for i in self.keys]
        else:
            raise ValueError(f"by must be 'environment' or 'hash', not {by!r}")
        options = _check_buffer_options(root_path, buffer_kwargs)
        # What the shards' own check of a call's rollouts reads, to make it here first.
        self._numeric = options["numeric_versions"]
        self._clock = options["clock"] or time.time
        self.by = by
        self.root_path = root_path
        self.handles = [
            remote(_join(root_path, name), ray_options=ray_options, **buffer_kwargs) for name in names
        ]
        self._index = {k: i for i, k in enumerate(self.keys)}

    def shard_of(self, environment: str, example_id: str = "") -> int:
        """The shard a record of this environment (and example) goes to."""
        if self.by == "environment":
            i = self._index.get(environment)
            if i is None:
                raise ValueError(f"no shard for environment {environment!r} (shards: {self.keys})")
            return i
        return stable_hash(f"{environment}\0{example_id}") % len(self.handles)

    def add_rollouts_refs(self, records: Any) -> list:
        """Routes rollouts to their shards, one call per shard; returns ``(positions,
        ObjectRef)`` pairs (``positions``: where the shard's rollouts were in the input).
        ``records`` is what :meth:`ReplayBuffer.add_rollouts` takes: records, or columns
        (a pyarrow Table or RecordBatch, or a dict of columns).

        All or none, as one shard's call is. What routing reads is checked first (a dict
        of columns Arrow cannot build, a missing ``environment`` or ``example_id`` column,
        a record that is no ``RolloutRecord`` or dict of its fields, an environment with
        no shard). A call whose rollouts all go to one shard is then sent as it is, and
        that shard takes all of it or none. A call split over several shards is first
        checked whole here by the shards' own conversion (a NaN reward, text without
        UTF-8, a name too long for a partition folder, ...): a bad rollout is a
        ``ValueError`` naming it, and no shard is sent anything; each shard is then sent
        its rows as a table in the dataset's schema, which it only checks again
        (``created_ts`` missing from columns is this process's ``clock`` reading)."""
        if isinstance(records, dict):
            # As ReplayBuffer builds it: an error names the column, and the row and uid.
            records = dict_to_table(records)
        if isinstance(records, (pa.Table, pa.RecordBatch)):
            if not records.num_columns and not records.num_rows:
                return []  # `{}`: nothing, as ReplayBuffer takes it
            keys: Iterable = zip(_routing_column(records, "environment"), _routing_column(records, "example_id"))
        else:
            if isinstance(records, RolloutRecord):
                raise TypeError("add_rollouts takes a list of rollouts (or columns); for one, "
                                "use add_rollouts([record])")
            records = list(records)
            # A dict without `environment` or an object without the field is named as
            # ReplayBuffer names it.
            keys = ((r.environment, r.example_id) for r in (as_record(r, i) for i, r in enumerate(records)))
        parts: dict = {}
        for i, (env, ex) in enumerate(keys):
            parts.setdefault(self.shard_of(env, ex), []).append(i)
        if len(parts) == 1:
            [(s, pos)] = parts.items()
            return [(pos, self.handles[s].add_rollouts.remote(records))]
        # Split over shards (or none: an empty call, whose columns a shard would check):
        # one shard refusing its part after the others took theirs would lose their
        # answers with the error, and their resends would be duplicates.
        table = self._checked_table(records)
        storage.check_partition_names(table)
        return [(pos, self.handles[s].add_rollouts.remote(table.take(pa.array(pos)))) for s, pos in parts.items()]

    def _checked_table(self, records: Any) -> pa.Table:
        """``records`` as the shards' ``add_rollouts`` builds and checks them."""
        if isinstance(records, (pa.Table, pa.RecordBatch)):
            return columns_to_table(records, self._numeric, self._clock())
        return records_to_table(records, self._numeric)[0]

    def add_rollouts(self, records: Any) -> list:
        """:meth:`add_rollouts_refs`, waited for: each rollout's outcome, in input order."""
        import ray

        pairs = self.add_rollouts_refs(records)
        out: list = [None] * sum(len(pos) for pos, _ in pairs)
        for (pos, _), outcomes in zip(pairs, ray.get([ref for _, ref in pairs])):
            for p, o in zip(pos, outcomes):
                out[p] = o
        return out

    def _allocate(self, n: int, seed: int, kwargs: dict) -> tuple:
        """Each shard's part of a draw of ``n``, and what the shards' draws add to
        ``kwargs``: with lag filters, the newest version over all shards and the versions
        kept, so each shard filters as one buffer holding every group would (a shard's
        own newest version let through, from a shard that lags, groups the trainer's
        version had left behind)."""
        import ray

        # Before any shard is asked: `seed % shards` takes a float, and the split counts
        # `n` down past zero (1.5 groups drew 2). An unknown option is the `TypeError` a
        # shard gives, even when no shard would be asked to draw.
        check_int("n", n, 0)
        check_int("seed", seed)
        inspect.signature(ReplayBuffer.sample_groups).bind(None, n, **kwargs)
        filters = {k: v for k, v in kwargs.items() if k in _FILTERS}
        lag, recent = filters.get("max_policy_lag"), filters.get("recent_n_versions")
        lag_used = (lag is not None or recent is not None
                    or filters.get("on_policy_fraction") is not None
                    or filters.get("recency_weighting", "uniform") != "uniform")
        if not lag_used:
            counts = ray.get([h.ready_count.remote(**filters) for h in self.handles])
            return _split(n, seed, counts), {}
        infos = ray.get([h.ready_versions.remote(**filters) for h in self.handles])
        currents = [c for c, _ in infos if c is not None]
        current = max(currents) if currents else None
        extra: dict = {"_current": current}
        versions = sorted({v for _, hist in infos for v in hist}, reverse=True)
        if lag is not None or recent is not None:
            if lag is not None and current is not None:
                versions = [v for v in versions if current - v <= lag]
            if recent is not None:
                versions = versions[:recent]
            extra["_keep_versions"] = versions
        keep = set(versions)
        counts = [sum(c[1] for v, c in hist.items() if v in keep) for _, hist in infos]
        return _split(n, seed, counts), extra

    def sample_groups(self, n: int, *, seed: int = 0, start_offset: int = 0, **kwargs: Any) -> SampledBatch:
        """Draws up to ``n`` groups across shards (see the module docs); the batch id
        names each shard's part."""
        import ray

        quota, extra = self._allocate(n, seed, kwargs)
        refs = [
            (i, self.handles[i].sample_groups.remote(q, seed=seed, start_offset=start_offset, **kwargs, **extra))
            for i, q in enumerate(quota)
            if q > 0
        ]
        return _combine([(i, b) for (i, _), b in zip(refs, ray.get([r for _, r in refs]))], None)

    def next_batch(self, step: int, n_groups: int, **kwargs: Any) -> SampledBatch:
        """The batch of ``step`` across shards: the recorded one if any shard has the step,
        else a new draw (each shard records its part)."""
        import ray

        step = check_int("step", step)  # here, not as every shard's error
        recorded = ray.get([h.recorded_batch.remote(step) for h in self.handles])
        if any(b is not None for b in recorded):
            return _combine([(i, b) for i, b in enumerate(recorded) if b is not None], step)
        seed = kwargs.pop("seed", step)
        quota, extra = self._allocate(n_groups, seed, kwargs)
        refs = [
            (i, self.handles[i].next_batch.remote(step, q, seed=seed, **kwargs, **extra))
            for i, q in enumerate(quota)
            if q > 0
        ]
        return _combine([(i, b) for (i, _), b in zip(refs, ray.get([r for _, r in refs]))], step)

    def set_policy_version(self, v: int) -> None:
        """The trainer's current version, on every shard (lag is measured from the higher
        of this and the highest version any shard has seen)."""
        import ray

        ray.get([h.set_policy_version.remote(v) for h in self.handles])

    def current_version(self) -> Optional[int]:
        """The newest version over all shards (see :meth:`set_policy_version`)."""
        import ray

        vs = [v for v in ray.get([h.current_version.remote() for h in self.handles]) if v is not None]
        return max(vs) if vs else None

    def _parts(self, batch_id: str) -> list:
        parts = []
        for piece in batch_id.split("|") if batch_id else []:
            shard, sep, bid = piece.partition(":")
            if not sep or not shard.isdigit() or int(shard) >= len(self.handles):
                raise KeyError(f"unknown batch id {batch_id!r}")
            parts.append((int(shard), bid))
        return parts

    def ack(self, batch_id: str, status: str = "ok") -> None:
        """Acks every shard's part of a batch."""
        import ray

        ray.get([self.handles[s].ack.remote(bid, status) for s, bid in self._parts(batch_id)])

    def _shards_of(self, group_ids: list) -> list:
        """The shard holding each group (group ids are hashes: every shard is asked);
        a ``KeyError`` naming a group no shard holds."""
        import ray

        held = ray.get([h.holds.remote(group_ids) for h in self.handles])
        out = []
        for j, gid in enumerate(group_ids):
            shard = next((i for i, hs in enumerate(held) if hs[j]), None)
            if shard is None:
                raise KeyError(f"group {gid!r} is not in any shard")
            out.append(shard)
        return out

    def get_groups(self, group_ids: Iterable[str], as_arrow: bool = False) -> Any:
        """The groups, in the order asked, from the shards holding them (see
        :meth:`ReplayBuffer.get_groups`): records, or one Arrow table."""
        import ray

        if isinstance(group_ids, str) or group_ids is None or not hasattr(group_ids, "__iter__"):
            raise ValueError(f"group_ids must be a list of ids, not {group_ids!r}")
        group_ids = list(group_ids)
        if not group_ids:
            return SCHEMA.empty_table() if as_arrow else []
        parts: dict = {}
        for pos, (gid, shard) in enumerate(zip(group_ids, self._shards_of(group_ids))):
            parts.setdefault(shard, []).append((pos, gid))
        answers = ray.get([
            self.handles[shard].get_groups.remote([gid for _, gid in items], as_arrow=as_arrow)
            for shard, items in parts.items()
        ])
        if as_arrow:
            # The shards' rows back to back, then each group's rows in the order asked (a
            # stable sort keeps a group's rows in their own order).
            table = pa.concat_tables(answers)
            place = {gid: pos for pos, gid in enumerate(group_ids)}
            keys = np.fromiter((place[g] for g in table.column("group_id").to_pylist()), np.int64, table.num_rows)
            return table.take(pa.array(np.argsort(keys, kind="stable")))
        out: list = [None] * len(group_ids)
        for items, groups in zip(parts.values(), answers):
            for (pos, _), g in zip(items, groups):
                out[pos] = g
        return out

    def upsert_scores(self, group_id: str, scores: dict, flags: Optional[dict] = None,
                      rollout_uid: Optional[str] = None) -> None:
        """Scores a group on the shard holding it (see
        :meth:`ReplayBuffer.upsert_scores`)."""
        import ray

        [shard] = self._shards_of([group_id])
        ray.get(self.handles[shard].upsert_scores.remote(group_id, scores, flags=flags, rollout_uid=rollout_uid))

    def batch_refs(self, batch: Any) -> list:
        """Object refs to the batch's Arrow tables, one per shard part: the trainer's
        ``ray.get`` fetches them from the shards, not through the front."""
        bid = batch.batch_id if isinstance(batch, SampledBatch) else batch
        return [self.handles[s].get_batch.remote(b, as_arrow=True) for s, b in self._parts(bid)]

    def stats(self) -> list:
        """Every shard's ``stats()``."""
        import ray

        return ray.get([h.stats.remote() for h in self.handles])

    def flush(self) -> None:
        import ray

        ray.get([h.flush.remote() for h in self.handles])

    def close(self) -> None:
        import ray

        ray.get([h.close.remote() for h in self.handles])


def _routing_column(table: Any, name: str) -> list:
    """A column routing reads, or the ``ValueError`` the shards give for its absence
    (Arrow's KeyError said only that the field does not exist)."""
    if name not in table.column_names:
        raise ValueError(f"column {name!r} is missing")
    return table.column(name).to_pylist()


def _split(n: int, seed: int, counts: list) -> list:
    """``n`` split over shards with ``counts`` ready, one at a time round-robin from
    shard ``seed % shards``."""
    quota = [0] * len(counts)
    left = n
    i = seed % len(counts)
    while left > 0 and any(q < c for q, c in zip(quota, counts)):
        if quota[i] < counts[i]:
            quota[i] += 1
            left -= 1
        i = (i + 1) % len(counts)
    return quota


def _combine(parts: list, step: Optional[int]) -> SampledBatch:
    parts = [(i, b) for i, b in parts if b is not None and b.group_ids]
    return SampledBatch(
        batch_id="|".join(f"{i}:{b.batch_id}" for i, b in parts),
        group_ids=[g for _, b in parts for g in b.group_ids],
        ts=max((b.ts for _, b in parts), default=time.time()),
        step=step,
    )
