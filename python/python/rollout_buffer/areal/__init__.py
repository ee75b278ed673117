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
import threading
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
    """A key present on ``n`` entries, as a column of one byte per entry: readiness is
    decided in Rust from which keys an entry holds, while the data stays in the Python
    sample. One value per row is stored inline in the entry, with no allocation."""
    return np.zeros(n, np.uint8)


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
        self._lock = asyncio.Condition()
        # Getters that found nothing wait on an event of their event loop; a put or an
        # amend, the only calls that make entries ready, sets every one. The events live
        # in Python so that a wake-up within one event loop never crosses a thread; the
        # lock keeps the map whole when calls come from several threads.
        self._waiting: dict = {}
        self._waiting_lock = threading.Lock()

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
        ids = _entry_ids(samples)
        # Duplicate ids (in the buffer or within the batch) are refused by the one native
        # put below with a ValueError, before anything is stored.
        first = samples[0].keys
        if all(s.keys == first for s in samples):
            # One key set for the batch (the usual case): one put of one column per key.
            columns = {k: _marks(n) for k in self._key_set.intersection(first)}
            if birth_times is not None:
                columns["birth"] = births.astype(np.uint64)
            handles = self._buf.put_columns_blocking(columns, ids, None)
        else:
            rows = [dict.fromkeys(self._key_set.intersection(s.keys), 0) for s in samples]
            for j, row in enumerate(rows):
                row["id"] = ids[j]
                if birth_times is not None:
                    row["birth"] = int(births[j])
            handles = self._buf.put_batch_blocking(rows)
        slot_list, generations = zip(*handles)
        slots = np.array(slot_list, np.int64)
        self._generation[slots] = generations
        self._reads_left[slots] = len(self._rpcs)
        stored = self._samples
        for slot, sample in zip(slot_list, samples):
            stored[slot] = sample
        self._wake()
        return slots

    async def amend_batch(self, indices: Sequence[int], samples: Sequence[Any]) -> None:
        """Merges ``samples[j]`` into the entry at ``indices[j]`` (AReaL's ``update_``: new
        keys added, existing ones replaced); the entries become ready for the MFCs whose
        input keys they now hold. ``StaleHandle`` for a slot that was freed."""
        array = np.asarray(indices, np.int64).reshape(-1)
        idx = array.tolist()
        if len(idx) != len(samples):
            raise ValueError(f"{len(samples)} samples for {len(idx)} indices")
        if not idx:
            return
        stored = self._samples
        if min(idx) < 0 or max(idx) >= self._max_size or not self._reads_left[array].all():
            bad = next(i for i in idx if not 0 <= i < self._max_size or self._reads_left[i] == 0)
            raise StaleHandle(f"slot {bad} holds no entry (it was freed or never put)")
        entries = [stored[i] for i in idx]
        if [e.ids for e in entries] != [s.ids for s in samples]:
            for i, e, s in zip(idx, entries, samples):
                # Other id types compare as str, as AReaL's do.
                if e.ids != s.ids and list(map(str, e.ids)) != list(map(str, s.ids)):
                    raise ValueError(f"slot {i}: ids {list(s.ids)} do not match the entry's {list(e.ids)}")
        first = samples[0].keys
        if all(s.keys == first for s in samples):
            groups = {frozenset(self._key_set.intersection(first)): idx}
        else:
            groups = {}
            for i, s in zip(idx, samples):
                groups.setdefault(frozenset(self._key_set.intersection(s.keys)), []).append(i)
        for keys, slots in groups.items():
            if keys:
                handles = list(zip(slots, self._generation[slots].tolist()))
                self._buf.amend_columns_blocking(handles, {k: _marks(len(slots)) for k in keys})
        for e, s in zip(entries, samples):
            _update(e, s)
        self._wake()

    async def _next_batch(self, name: str, timeout: Optional[float]):
        """A batch for MFC ``name`` once one is ready (``Timeout`` after ``timeout``
        seconds). The event is taken before the buffer is asked, so a put or amend landing
        in between sets the event being waited on: no wake-up is lost."""
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        while True:
            with self._waiting_lock:
                changed = self._waiting.get(loop)
                if changed is None:
                    changed = self._waiting[loop] = asyncio.Event()
            batch = self._buf.try_get_batch_for_rpc(name)
            if batch is not None:
                return batch
            if deadline is None:
                await changed.wait()
                continue
            left = deadline - loop.time()
            try:
                if left <= 0:
                    raise asyncio.TimeoutError
                await asyncio.wait_for(changed.wait(), left)
            except asyncio.TimeoutError:
                raise Timeout(f"no batch for MFC {name!r} within {timeout} s") from None

    def _wake(self) -> None:
        """Wakes every waiting getter (each asks the buffer again), in whichever event
        loop it waits."""
        if not self._waiting:
            return
        with self._waiting_lock:
            waiting, self._waiting = self._waiting, {}
        try:
            here = asyncio.get_running_loop()
        except RuntimeError:
            here = None
        for loop, event in waiting.items():
            if loop is here:
                event.set()
            elif not loop.is_closed():
                loop.call_soon_threadsafe(event.set)

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
        batch = await self._next_batch(rpc.name, timeout)
        slots = batch.slots()
        stored = self._samples
        samples = [stored[s] for s in slots.tolist()]
        batch.commit_blocking()
        left = self._reads_left[slots] - 1
        self._reads_left[slots] = left
        for s in slots[left == 0].tolist():
            stored[s] = None
        return slots, gather(samples, keys=list(rpc.input_keys))


def _entry_ids(samples: Sequence[Any]) -> List[str]:
    """One id per entry: a sample's id, or its ids joined by ``|`` when it holds several."""
    return [str(i[0]) if len(i) == 1 else "|".join(map(str, i)) for i in [s.ids for s in samples]]


def _update(stored: Any, other: Any) -> None:
    update = getattr(stored, "update_", None)
    if update is not None:
        update(other)
    else:
        SequenceSample.update_(stored, other)
