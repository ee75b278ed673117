"""AReaL's ``AsyncIOSequenceBuffer`` (v0.4.0, ``realhf/system/buffer.py``) over this buffer.

Switching is one import line::

    from rollout_buffer.areal import AsyncIOSequenceBuffer

The class takes the same arguments, has the same methods, returns the same types and keeps
AReaL's contract: an entry becomes ready for an MFC once it holds all of the MFC's input
keys; every MFC in ``rpcs`` reads every entry exactly once, oldest ``birth_time`` first,
``n_seqs`` at a time; the read that makes the last MFC finish frees the slot; ``put_batch``
returns int64 slot indices and raises ``BufferFull`` at once (all or nothing) when there is
no room; ``get_batch_for_rpc`` returns ``(indices, SequenceSample.gather(samples,
keys=rpc.input_keys))``. Slots, readiness, ordering and freeing live in the Rust buffer,
with the ``SequenceSample`` objects kept by slot beside it (``_native.ArealSlots``): a put,
an amend and a read each make one native call.

MFCs and samples are duck-typed: AReaL's ``MFCDef`` and ``SequenceSample`` work, and so do
the small stand-ins here (:class:`MFCDef`, :class:`SequenceSample`) for code that does not
install AReaL; neither AReaL nor torch is imported.

Where AReaL's buffer has a bug, this one differs (see ``docs/python.md``):

* no lost wake-up: every waiting ``get_batch_for_rpc`` that can be served is served (AReaL
  wakes at most ``len(rpcs)`` waiters, and none after a read that frees every slot it took),
  and no needless one: a put or amend wakes only the getters of the MFCs it may have made
  entries ready for (AReaL's ``notify_all`` woke every getter of every MFC);
* ``amend_batch`` of a freed slot raises ``StaleHandle`` instead of waiting forever;
* ``get_batch_for_rpc(rpc, timeout=...)`` may time out (``Timeout``); without a timeout it
  waits as AReaL's does;
* bad input changes nothing: a ``birth_times`` of the wrong length or a birth time that
  is no int > 0 (a float is not truncated) raises ``ValueError`` before any slot is taken
  (AReaL left slots stuck in ``being_put``, or failed an assertion at the next get); an
  amend whose ids do not match raises ``ValueError`` before any sample changes (AReaL
  left the slot amended forever);
* an entry's ids (one, as AReaL's master worker puts them) must be unique among stored
  entries (``ValueError``, as AReaL's ``load_data`` raised for a duplicate in one fetch);
* a gather aligns metadata by position, a sample without a key getting ``None`` (AReaL
  raised ``KeyError`` after the read had freed the slots), and gathers data only when
  every sample holds it for every key (else the batch is metadata-only, as the master
  worker's always is); any gather (AReaL's own class's too) runs before the read is
  committed. One that raises for keys the constructor's MFC does not declare gives the
  batch back, nothing read. One that raises for the MFC's own inputs gives it back the
  first time too (the failure may pass); if the MFC's next failed gather is of the same
  batch, the failure is the data's (AReaL raised after committing the read: the MFC never
  added their outputs, so their slots were never freed; given back every time, the batch
  would fail at every get): the entries that cannot be gathered alone, or the oldest of
  the batch when each can, are dropped from the buffer, the rest given back, and
  ``SamplesDropped`` names them, the gather's error as its ``__cause__`` (an MFC that
  read one before it was dropped amends the rest of its batch, the dropped one skipped).
  A ``KeyboardInterrupt`` or a cancellation during a gather drops nothing;
* an amend naming one slot twice is refused before any merge; one whose merge raises
  still wakes the getters of the entries it merged before;
* an MFC whose ``n_seqs`` exceeds ``max_size`` is refused at construction (AReaL waited
  forever); each MFC's ``n_seqs`` is fixed then (a get asking another count is a
  ``ValueError``, where AReaL reads it from the object passed in), and ties between equal birth times go to the earlier put (AReaL's order was
  unspecified);
* slot indices are handles: a fresh buffer fills slots 0, 1, 2, ... as AReaL's does, but a
  freed slot is reused first (its memory is still in cache) where AReaL took the lowest
  free one.
"""

from __future__ import annotations

import asyncio
import math
import threading
import time
from typing import Any, List, Optional, Sequence

import numpy as np

from .. import BufferFull, SamplesDropped, StaleHandle, Timeout
from .._native import ArealSlots as _ArealSlots
from .types import MFCDef, SequenceSample, build_graph, gather

__all__ = [
    "AsyncIOSequenceBuffer",
    "BufferFull",
    "MFCDef",
    "SamplesDropped",
    "SequenceSample",
    "StaleHandle",
    "Timeout",
    "build_graph",
]


class AsyncIOSequenceBuffer:
    """AReaL's ``AsyncIOSequenceBuffer(rpcs, max_size)`` (see the module docs)."""

    def __init__(self, rpcs: Sequence[Any], max_size: int):
        rpcs = list(rpcs)
        for j, r in enumerate(rpcs):
            _mfc_fields(r, f"rpcs[{j}]")
        names = [r.name for r in rpcs]
        if len(set(names)) != len(names):
            raise ValueError(f"duplicate MFC names in {names}")
        # Counts as ints, checked, and kept: `int()` truncated 1.5 and refused -1 with an
        # OverflowError; and an MFC whose `n_seqs` changes later is refused at the get,
        # where comparing the object with itself let the buffer serve the old count.
        self._n_seqs = [_count(f"rpcs[{j}].n_seqs", r.n_seqs) for j, r in enumerate(rpcs)]
        max_size = _count("max_size", max_size)
        self._rpcs = list(rpcs)
        self._rpc_names = names
        self._rpc_index = {name: i for i, name in enumerate(names)}
        self._inputs = [frozenset(r.input_keys) for r in rpcs]
        # Slots, readiness, order and freeing in Rust, with the samples kept by slot
        # beside them (AReaL's `rpc_data_keys`, the MFCs' input keys, decide readiness).
        self._slots = _ArealSlots(
            max_size, [(r.name, n, list(r.input_keys)) for r, n in zip(rpcs, self._n_seqs)], SequenceSample
        )
        self._max_size = int(max_size)
        self._lock = asyncio.Condition()
        # Getters that found nothing wait on an event of their event loop and MFC; a put
        # or an amend, the only calls that make entries ready, sets those of the MFCs it
        # may have made entries ready for (the native call says which), and a batch given
        # back sets its MFC's. AReaL's one condition woke every getter of every MFC at
        # each put, each asking the buffer again for nothing. The events live in Python
        # so that a wake-up within one event loop never crosses a thread; the lock keeps
        # the map whole when calls come from several threads.
        self._waiting: dict = {}
        self._waiting_lock = threading.Lock()

    # ----- AReaL's attributes ----------------------------------------------------------

    @property
    def max_size(self) -> int:
        return self._max_size

    @property
    def size(self) -> int:
        """Entries stored (AReaL's ``_buf_size``)."""
        return len(self._slots)

    @property
    def n_rpcs(self) -> int:
        return len(self._rpcs)

    @property
    def lock(self) -> asyncio.Condition:
        """Kept for code that reads it: the buffer itself never waits on it (its waits and
        wake-ups are in Rust), so holding it blocks nothing."""
        return self._lock

    @property
    def rpcs(self) -> list:
        """The MFCs given to the constructor, as AReaL's ``self.rpcs``."""
        return list(self._rpcs)

    # ----- the calls -------------------------------------------------------------------

    async def put_batch(self, samples: Sequence[Any], birth_times: Optional[Sequence[int]] = None):
        """Stores ``samples`` (one entry each) in free slots; returns their slot
        indices as an int64 array. ``BufferFull`` when they do not all fit, with nothing
        stored. ``birth_times`` (one int > 0 per sample, smaller first; a float or a bool
        is a ``ValueError``, nothing stored) orders selection; without it the samples are
        stamped as AReaL stamps them (the monotonic clock in ns), so they sort by arrival,
        among stamped puts too. A sample that is no ``SequenceSample`` (no ``ids`` or ``keys``) is a
        ``ValueError``, nothing stored."""
        return self._put(samples, birth_times)

    def put_batch_synced(self, samples: Sequence[Any]):
        """AReaL's lock-free put (no birth times); the same as :meth:`put_batch` here."""
        return self._put(samples, None)

    def _put(self, samples: Sequence[Any], birth_times: Optional[Sequence[int]]):
        births = None
        if not hasattr(samples, "__len__") and hasattr(samples, "__iter__"):
            # A generator: taken whole first, so it is stamped as a list is (numbered from
            # 1 by the native put instead, its samples went before every stamped one).
            samples = list(samples)
        if birth_times is None and hasattr(samples, "__len__"):
            # AReaL's own stamp: numbered from the process's monotonic clock, so a put
            # without birth times sorts among AReaL-stamped ones by when it came (numbered
            # from 1 instead, it went before every one of them).
            start = time.monotonic_ns()
            births = list(range(start, start + len(samples)))
        if birth_times is not None:
            # As amend indices are: a cast to int64 truncated a birth time of 1.5 to 1.
            births = _int_array(birth_times, "birth_times", 1, "a birth time is an int > 0 (smaller is older)")
            if births.shape != (len(samples),):
                raise ValueError(f"{len(births)} birth times for {len(samples)} samples")
            births = births.tolist()
        # Room, then duplicate ids (in the buffer or within the batch), are checked by the
        # one native put before anything is stored. So is each sample's `ids` and `keys`:
        # a sample without them fails there, with nothing stored, and is named here.
        try:
            slots, ready_for = self._slots.put(samples, births)
        except (AttributeError, TypeError):
            _check_samples(samples)
            raise
        if len(slots):
            self._wake(ready_for)
        return slots

    async def amend_batch(self, indices: Sequence[int], samples: Sequence[Any]) -> None:
        """Merges ``samples[j]`` into the entry at ``indices[j]`` (AReaL's ``update_``: new
        keys added, existing ones replaced); the entries become ready for the MFCs whose
        input keys they now hold. ``StaleHandle`` for a slot that was freed; ``ValueError``,
        with nothing changed, for an index that is no int >= 0 (a float is not truncated)
        or a sample that is no ``SequenceSample``."""
        array = _slot_indices(indices)
        if len(np.unique(array)) != len(array):
            # Refused before any merge: the merges ran, then the buffer refused the repeated
            # slot, and the entry held keys no MFC was ever served it for.
            values, counts = np.unique(array, return_counts=True)
            raise ValueError(f"indices holds slot {int(values[counts > 1][0])} more than once; amend each entry once")
        # As in the put: the native amend reads every sample's `ids` and `keys` before it
        # merges any.
        try:
            ready_for = self._slots.amend(array, samples)
        except BaseException as e:
            # Also after a merge that raised: the entries merged before it were made
            # ready, for MFCs the failed call does not say.
            if len(array):
                self._wake()
            if isinstance(e, (AttributeError, TypeError)):
                _check_samples(samples)
            raise
        if len(array):
            self._wake(ready_for)

    async def _next_batch(self, r: int, name: str, keys: List[str], served: bool, timeout: Optional[float]):
        """A batch for MFC ``name`` once one is ready (``Timeout`` after ``timeout``
        seconds). The event is taken before the buffer is asked, so a put or amend landing
        in between sets the event being waited on: no wake-up is lost."""
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        while True:
            with self._waiting_lock:
                changed = self._waiting.get((loop, r))
                if changed is None:
                    changed = self._waiting[(loop, r)] = asyncio.Event()
            batch = self._try_get(r, keys, served)
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

    def _wake(self, ready_for: Optional[int] = None) -> None:
        """Wakes the waiting getters (each asks the buffer again), in whichever event loop
        they wait: of the MFCs in ``ready_for`` (bit ``r`` for MFC ``r``; MFCs from the
        64th on always), or of every MFC."""
        if not self._waiting:
            return
        with self._waiting_lock:
            if ready_for is None:
                woken, self._waiting = self._waiting, {}
            else:
                woken = {
                    k: self._waiting.pop(k) for k in list(self._waiting) if k[1] >= 64 or ready_for >> k[1] & 1
                }
        try:
            here = asyncio.get_running_loop()
        except RuntimeError:
            here = None
        for (loop, _), event in woken.items():
            if loop is here:
                event.set()
            elif not loop.is_closed():
                loop.call_soon_threadsafe(event.set)

    async def get_batch_for_rpc(self, rpc: Any, timeout: Optional[float] = None):
        """Waits until ``rpc.n_seqs`` entries are ready for ``rpc`` and unread by it, takes
        the oldest, and returns ``(indices, SequenceSample.gather(samples,
        keys=rpc.input_keys))``. The read is done when this returns: the last MFC's read
        frees the slots. ``timeout`` is in seconds; ``None`` or ``math.inf`` waits
        without end. ``ValueError`` for an MFC not given to the constructor, a timeout
        that is negative, NaN or no number, or an ``rpc`` that is no MFC."""
        name, n_seqs, input_keys = _mfc_fields(rpc, "rpc")
        r = self._rpc_index.get(name)
        if r is None:
            raise ValueError(f"{name!r} is not one of this buffer's MFCs {self._rpc_names}")
        timeout = _timeout(timeout)
        if n_seqs != self._n_seqs[r]:
            raise ValueError(
                f"MFC {name!r} asks for {n_seqs} entries; the buffer was built with {self._n_seqs[r]}"
                " (each MFC's n_seqs is fixed when the buffer is built)"
            )
        keys = list(input_keys)
        # Keys the constructor's MFC declares are held by whatever the buffer serves it;
        # others (AReaL gathers the keys of the MFC passed in) are checked by the gather.
        served = self._inputs[r].issuperset(keys)
        # A batch ready now is taken without the waiting machinery (which asks again after
        # taking its event, so a wake-up in between is not lost).
        batch = self._try_get(r, keys, served)
        if batch is None:
            batch = await self._next_batch(r, name, keys, served, timeout)
        return batch

    def _try_get(self, r: int, keys: List[str], served: bool):
        """The native read, gathered before it is committed. A gather that raises gives the
        batch back, or drops the entries it cannot gather (``SamplesDropped``, see the
        module docs): either way the getters are woken, to take what is left."""
        try:
            return self._slots.try_get(r, keys, _gather, served)
        except BaseException:  # a KeyboardInterrupt in a gather gives the batch back too
            self._wake(1 << r)
            raise


def _gather(samples: list, keys: list) -> Any:
    return gather(samples, keys=keys)


def _what(obj: Any) -> str:
    return "None" if obj is None else f"an object of type {type(obj).__name__}"


def _count(name: str, v: Any) -> int:
    """An int from 1 to 2**64 - 1 (numpy ints too), or a ``ValueError`` naming ``name``
    (past that, the native constructor's OverflowError named nothing)."""
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer)) or not 1 <= v < 2**64:
        raise ValueError(f"{name} must be an int from 1 to 2**64 - 1, not {v!r}")
    return int(v)


def _mfc_fields(rpc: Any, where: str) -> tuple:
    """An MFC's ``(name, n_seqs, input_keys)``: what the buffer reads of AReaL's
    ``MFCDef`` (duck-typed), or a ``ValueError`` saying so (not the AttributeError of the
    first missing attribute)."""
    try:
        name, n_seqs, input_keys = rpc.name, rpc.n_seqs, rpc.input_keys
    except AttributeError:
        raise ValueError(
            f"{where} must be an MFCDef (with name, n_seqs and input_keys), not {_what(rpc)}"
        ) from None
    if not isinstance(name, str):
        raise ValueError(f"{where}.name must be a str, not {name!r}")
    # A str is a sequence of its letters: ("packed_prompts") made 14 one-letter keys, and
    # every get waited for ever.
    if isinstance(input_keys, (str, bytes)) or not all(isinstance(k, str) for k in input_keys):
        raise ValueError(f"{where}.input_keys must be a sequence of str keys, not {input_keys!r}")
    return name, n_seqs, input_keys


def _check_samples(samples: Any) -> None:
    """After a native call failed on an attribute: the first sample that is no
    ``SequenceSample`` (it has no ``ids`` or ``keys``) as a ``ValueError``. Returns when
    every sample has both (the error came from elsewhere: the caller re-raises it)."""
    if isinstance(samples, (dict, str, bytes)) or hasattr(samples, "ids"):
        # A dict was iterated as its keys, one sample too: a raw AttributeError.
        raise ValueError(
            f"samples must be a list of SequenceSample, not {_what(samples)}"
            + (" (one sample: pass [sample] or sample.unpack())" if hasattr(samples, "ids") else "")
        ) from None
    if not isinstance(samples, (list, tuple)):
        return  # an iterator the native call consumed: its error stands
    for j, s in enumerate(samples):
        if not (hasattr(s, "ids") and hasattr(s, "keys")):
            raise ValueError(
                f"samples[{j}] must be a SequenceSample (with ids and keys), not {_what(s)}"
            ) from None


def _slot_indices(indices: Any) -> np.ndarray:
    """``amend_batch``'s indices as int64, each >= 0 (see :func:`_int_array`)."""
    return _int_array(indices, "indices", 0, "a slot index is an int >= 0, as put_batch returns")


def _int_array(values: Any, name: str, least: int, rule: str) -> np.ndarray:
    """``values`` (amend indices, birth times) as int64: ints, or numpy integers (scalars
    or arrays), each >= ``least``. A float, a bool, a number below ``least`` or past int64
    is a ``ValueError`` naming it as ``name[j]`` and saying ``rule``: a cast to int64
    truncated an index of 0.9 to slot 0 (amending an entry nobody named) and a birth time
    of 1.5 to 1."""
    if isinstance(values, np.ndarray) and values.dtype.kind in "iu":
        given = values.reshape(-1)
        # uint64 past int64 would wrap to a negative number: refused as one, by value.
        array = given.astype(np.int64, copy=False)
    else:
        if isinstance(values, (list, tuple)):
            given = values
        elif isinstance(values, (int, np.integer)) or not hasattr(values, "__iter__"):
            given = [values]  # one value, as the old reshape took it
        else:
            given = list(values)
        # One look at each distinct element type (usually just int); the elements are
        # looked at one by one only to name a wrong one.
        if not all(
            t is int or (issubclass(t, (int, np.integer)) and not issubclass(t, bool))
            for t in set(map(type, given))
        ):
            j = next(
                j for j, i in enumerate(given) if isinstance(i, bool) or not isinstance(i, (int, np.integer))
            )
            raise _bad_int(name, j, given[j], rule)
        try:
            array = np.asarray(given, np.int64)
        except OverflowError:  # an int past int64
            j = next(j for j, i in enumerate(given) if not -(2**63) <= int(i) < 2**63)
            raise _bad_int(name, j, given[j], rule) from None
    if array.size and array.min() < least:
        j = int(np.flatnonzero(array < least)[0])
        raise _bad_int(name, j, given[j], rule)
    return array


def _bad_int(name: str, j: int, value: Any, rule: str) -> ValueError:
    if isinstance(value, np.integer):
        value = int(value)  # named as the number it is, not as `np.uint64(...)`
    if isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_)) \
            and not -(2**63) <= int(value) < 2**63:
        rule = f"past int64 (the largest is 2**63 - 1); {rule}"
    return ValueError(f"{name}[{j}] is {value!r}: {rule}")


def _timeout(t: Any) -> Optional[float]:
    """A get's ``timeout``: ``None`` (or infinity) waits without end; else seconds
    >= 0. Anything else is a ``ValueError`` naming it (a str failed inside a comparison,
    as a ``TypeError`` naming nothing)."""
    if t is None:
        return None
    if isinstance(t, (bool, np.bool_)) or not isinstance(t, (int, float, np.integer, np.floating)):
        raise ValueError(f"timeout must be a number of seconds >= 0 (or None), not {t!r}")
    t = float(t)
    if t == math.inf:
        return None
    if not t >= 0:  # NaN too
        raise ValueError(f"timeout must be a number of seconds >= 0 (or None), not {t!r}")
    return t
