"""AReaL's ``AsyncIOSequenceBuffer`` (v0.4.0, ``realhf/system/buffer.py``) over this buffer.

Switching is one import line::

    from rollout_buffer.areal import AsyncIOSequenceBuffer

The class takes the same arguments, has the same methods, returns the same types and keeps
AReaL's contract: an entry becomes ready for an MFC once it holds all of the MFC's input
keys; every MFC in ``rpcs`` reads every entry exactly once, oldest ``birth_time`` first,
``n_seqs`` at a time; the read that makes the last MFC finish frees the slot; ``put_batch``
returns int64 slot indices and raises ``BufferFull`` at once (all or nothing) when there is
no room; ``get_batch_for_rpc`` returns ``(indices, SequenceSample.gather(samples,
keys=rpc.input_keys))``. Slots, readiness, ordering and wake-ups live in the Rust buffer;
this module keeps the ``SequenceSample`` objects beside it.

MFCs and samples are duck-typed: AReaL's ``MFCDef`` and ``SequenceSample`` work, and so do
the small stand-ins here (:class:`MFCDef`, :class:`SequenceSample`) for code that does not
install AReaL; neither AReaL nor torch is imported.

Where AReaL's buffer has a bug, this one differs (see ``docs/python.md``):

* no lost wake-up: every waiting ``get_batch_for_rpc`` that can be served is served (AReaL
  wakes at most ``len(rpcs)`` waiters, and none after a read that frees every slot it took);
* ``amend_batch`` of a freed slot raises ``StaleHandle`` instead of waiting forever;
* ``get_batch_for_rpc(rpc, timeout=...)`` may time out (``Timeout``); without a timeout it
  waits as AReaL's does;
* bad input changes nothing: a ``birth_times`` of the wrong length or a birth time <= 0
  raises ``ValueError`` before any slot is taken (AReaL left slots stuck in
  ``being_put``, or failed an assertion at the next get); an amend whose ids do not match
  raises ``ValueError`` before any sample changes (AReaL left the slot amended forever);
* ids must be unique among stored entries (``ValueError``, as AReaL's ``load_data`` raised
  for a duplicate in one fetch);
* an MFC whose ``n_seqs`` exceeds ``max_size`` is refused at construction (AReaL waited
  forever), and ties between equal birth times go to the earlier put (AReaL's order was
  unspecified);
* slot indices are handles: a fresh buffer fills slots 0, 1, 2, ... as AReaL's does, but a
  freed slot is reused first (its memory is still in cache) where AReaL took the lowest
  free one.
"""

from __future__ import annotations

import asyncio
from typing import Any, Iterable, List, Optional, Sequence

import numpy as np

from .. import BufferFull, Rpc, StaleHandle, Timeout
from .._native import Buffer as _NativeBuffer
from .types import MFCDef, SequenceSample, build_graph, gather

__all__ = [
    "AsyncIOSequenceBuffer",
    "BufferFull",
    "MFCDef",
    "SequenceSample",
    "StaleHandle",
    "Timeout",
    "build_graph",
]


def _marks(n: int) -> np.ndarray:
    """A key present on ``n`` entries, as a column of empty rows: readiness is decided in
    Rust from which keys an entry holds, while the data stays in the Python sample."""
    return np.zeros((n, 0), np.uint8)


class AsyncIOSequenceBuffer:
    """AReaL's ``AsyncIOSequenceBuffer(rpcs, max_size)`` (see the module docs)."""

    def __init__(self, rpcs: Sequence[Any], max_size: int):
        names = [r.name for r in rpcs]
        if len(set(names)) != len(names):
            raise ValueError(f"duplicate MFC names in {names}")
        self._rpcs = list(rpcs)
        self._rpc_names = names
        # AReaL's `rpc_data_keys`: only input keys decide readiness.
        self._keys = sorted(set().union(*[set(r.input_keys) for r in rpcs])) if rpcs else []
        self._key_set = frozenset(self._keys)
        native_rpcs = [Rpc(r.name, int(r.n_seqs), inputs=list(r.input_keys)) for r in rpcs]
        # Every key is "external" (amended in), so no key is required at put: an entry
        # without an MFC's keys is simply not ready for it, as in AReaL.
        self._buf = _NativeBuffer(int(max_size), native_rpcs, None, self._keys, "none", None)
        self._max_size = int(max_size)
        self._samples: List[Any] = [None] * self._max_size
        self._generation = np.zeros(self._max_size, np.int64)
        # Reads left per slot: every MFC reads every entry once; 0 means freed.
        self._reads_left = np.zeros(self._max_size, np.int64)
        self._ids: dict = {}
        self._lock = asyncio.Condition()

    # ----- AReaL's attributes ----------------------------------------------------------

    @property
    def max_size(self) -> int:
        return self._max_size

    @property
    def size(self) -> int:
        """Entries stored (AReaL's ``_buf_size``)."""
        return len(self._buf)

    @property
    def n_rpcs(self) -> int:
        return len(self._rpcs)

    @property
    def lock(self) -> asyncio.Condition:
        """Kept for code that reads it: the buffer itself never waits on it (its waits and
        wake-ups are in Rust), so holding it blocks nothing."""
        return self._lock

    # ----- the calls -------------------------------------------------------------------

    async def put_batch(self, samples: Sequence[Any], birth_times: Optional[Sequence[int]] = None):
        """Stores ``samples`` (one entry each) in free slots; returns their slot
        indices as an int64 array. ``BufferFull`` when they do not all fit, with nothing
        stored. ``birth_times`` (one positive int per sample, smaller first) orders
        selection; without it the order of arrival does."""
        return self._put(samples, birth_times)

    def put_batch_synced(self, samples: Sequence[Any]):
        """AReaL's lock-free put (no birth times); the same as :meth:`put_batch` here."""
        return self._put(samples, None)

    def _put(self, samples: Sequence[Any], birth_times: Optional[Sequence[int]]):
        n = len(samples)
        if n == 0:
            return np.zeros(0, np.int64)
        if birth_times is not None:
            births = np.asarray(birth_times, dtype=np.int64)
            if births.shape != (n,):
                raise ValueError(f"{len(births)} birth times for {n} samples")
            if (births <= 0).any():
                bad = int(np.flatnonzero(births <= 0)[0])
                raise ValueError(f"birth time of sample {bad} is {births[bad]}; it must be > 0")
        free = self._max_size - len(self._buf)
        if n > free:
            raise BufferFull(
                f"cannot put {n} samples: {free} of {self._max_size} slots are free "
                f"(raise max_size, as REAL_MASTER_BUFFER_SIZE does in AReaL)"
            )
        ids = [_entry_id(s) for s in samples]
        taken = [i for i in ids if i in self._ids]
        if taken or len(set(ids)) != n:
            dup = taken[0] if taken else next(i for i in ids if ids.count(i) > 1)
            raise ValueError(f"duplicate sample id {dup!r}")
        # Samples sharing a key set go in one call (usually the whole batch).
        by_keys: dict = {}
        for j, s in enumerate(samples):
            by_keys.setdefault(frozenset(s.keys) & self._key_set, []).append(j)
        slots = np.empty(n, np.int64)
        for keys, rows in by_keys.items():
            columns = {k: _marks(len(rows)) for k in keys}
            if birth_times is not None:
                columns["birth"] = births[rows].astype(np.uint64)
            handles = self._buf.put_columns_blocking(columns, [ids[j] for j in rows], None)
            for j, (slot, gen) in zip(rows, handles):
                slots[j] = slot
                self._generation[slot] = gen
        self._reads_left[slots] = len(self._rpcs)
        for j, slot in enumerate(slots.tolist()):
            self._samples[slot] = samples[j]
            self._ids[ids[j]] = slot
        # AReaL hands the indices back lowest first within a put.
        return slots

    async def amend_batch(self, indices: Sequence[int], samples: Sequence[Any]) -> None:
        """Merges ``samples[j]`` into the entry at ``indices[j]`` (AReaL's ``update_``: new
        keys added, existing ones replaced); the entries become ready for the MFCs whose
        input keys they now hold. ``StaleHandle`` for a slot that was freed."""
        idx = [int(i) for i in indices]
        if len(idx) != len(samples):
            raise ValueError(f"{len(samples)} samples for {len(idx)} indices")
        for i, s in zip(idx, samples):
            if not 0 <= i < self._max_size or self._reads_left[i] == 0:
                raise StaleHandle(f"slot {i} holds no entry (it was freed or never put)")
            stored = self._samples[i]
            # Equal lists of str pass at once; other id types compare as str, as AReaL's do.
            if stored.ids != s.ids and list(map(str, stored.ids)) != list(map(str, s.ids)):
                raise ValueError(f"slot {i}: ids {list(s.ids)} do not match the entry's {list(stored.ids)}")
        by_keys: dict = {}
        for i, s in zip(idx, samples):
            by_keys.setdefault(frozenset(s.keys) & self._key_set, []).append(i)
        for keys, slots in by_keys.items():
            if keys:
                handles = [(i, int(self._generation[i])) for i in slots]
                self._buf.amend_columns_blocking(handles, {k: _marks(len(slots)) for k in keys})
        for i, s in zip(idx, samples):
            _update(self._samples[i], s)

    async def get_batch_for_rpc(self, rpc: Any, timeout: Optional[float] = None):
        """Waits until ``rpc.n_seqs`` entries are ready for ``rpc`` and unread by it, takes
        the oldest, and returns ``(indices, SequenceSample.gather(samples,
        keys=rpc.input_keys))``. The read is done when this returns: the last MFC's read
        frees the slots. ``ValueError`` for an MFC not given to the constructor."""
        try:
            r = self._rpc_names.index(rpc.name)
        except ValueError:
            raise ValueError(f"{rpc.name!r} is not one of this buffer's MFCs {self._rpc_names}") from None
        if int(rpc.n_seqs) != int(self._rpcs[r].n_seqs):
            raise ValueError(
                f"MFC {rpc.name!r} asks for {rpc.n_seqs} entries; the buffer was built with {self._rpcs[r].n_seqs}"
            )
        batch = await self._buf.get_batch_for_rpc(rpc.name, timeout)
        slots = np.fromiter((h[0] for h in batch.handles()), np.int64, len(batch))
        samples = [self._samples[s] for s in slots.tolist()]
        batch.commit_blocking()
        left = self._reads_left[slots] - 1
        self._reads_left[slots] = left
        for s in slots[left == 0].tolist():
            del self._ids[_entry_id(self._samples[s])]
            self._samples[s] = None
        return slots, gather(samples, keys=list(rpc.input_keys))


def _entry_id(sample: Any) -> str:
    ids = list(sample.ids)
    return str(ids[0]) if len(ids) == 1 else "|".join(map(str, ids))


def _update(stored: Any, other: Any) -> None:
    update = getattr(stored, "update_", None)
    if update is not None:
        update(other)
    else:
        SequenceSample.update_(stored, other)
