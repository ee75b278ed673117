"""rollout-buffer for Python: the buffer between rollout generation and training in
asynchronous RL for language models.

Data crosses as columns (the fast path): ``Buffer.put_columns`` takes a dict of numpy
arrays (one row per sample; a variable-length field as ``(values, offsets)``) or anything
exporting Arrow (a pyarrow Table or RecordBatch, a polars DataFrame), and
``Batch.columns()`` / ``Batch.to_arrow()`` give a batch back as numpy arrays that view the
buffer's memory, or as Arrow (the batch itself implements ``__arrow_c_stream__``, so
polars and DuckDB read it directly). ``Batch.complete_columns`` and
``Buffer.amend_columns`` write outputs the same way.

Samples as dicts are the convenient path for small calls, at a few microseconds per
sample: ``{"id": ..., "birth": int (optional), "meta": {...} (optional), field: value,
...}`` where a value is a numpy array (int32, int64, float32, float64, uint8, bool), a
Python scalar, a string, a list of strings, or a list of numpy arrays (a ragged field:
several sequences). Batches give fields back as read-only numpy views (a ragged field as
a list of them).

Every waiting call has an awaitable form (driven by the library's tokio runtime, not a
thread per call) and a ``*_blocking`` twin that releases the GIL and honours Ctrl-C.
"""

from __future__ import annotations

import contextlib
import operator
from typing import Any, AsyncIterator, Iterable, Optional, Sequence

import numpy as np

from ._native import (
    GROUP_INPUTS,
    Batch,
    BufferError,
    BufferFull,
    Closed,
    Ragged,
    Rpc,
    SamplesDropped,
    StaleHandle,
    Timeout,
    TrainBatch,
)
from ._native import Batcher as _NativeBatcher
from ._native import Buffer as _NativeBuffer
from ._native import Ingest as _NativeIngest

__all__ = [
    "GROUP_INPUTS",
    "Batch",
    "Batcher",
    "Buffer",
    "BufferError",
    "BufferFull",
    "Closed",
    "Ingest",
    "Ragged",
    "Rpc",
    "SamplesDropped",
    "StaleHandle",
    "Timeout",
    "TrainBatch",
    "ragged",
]

_RESERVED = ("id", "birth", "meta")


def _no_masked(a: np.ndarray, what: str) -> None:
    """Refuses a masked array with masked entries: they are nulls, which no field holds
    (storing the values under the mask had stored numbers nobody gave)."""
    if isinstance(a, np.ma.MaskedArray):
        masked = np.ma.getmaskarray(a)
        if masked.any():
            first = int(np.flatnonzero(masked)[0])
            raise ValueError(
                f"{what}: masked (a null) at element {first}; a field holds a value for every "
                "element (fill it first, e.g. `.filled(0)`)"
            )


def _c_order(a: np.ndarray) -> np.ndarray:
    """``a`` as a C-contiguous ndarray of its own shape (0-d stays 0-d, where
    ``np.ascontiguousarray`` makes it 1-d)."""
    return np.asarray(a, order="C")


def ragged(sequences: Sequence[np.ndarray]) -> Ragged:
    """A ragged field from several 1-D (or same-trailing-shape) arrays of one dtype."""
    arrays = list(sequences)
    for i, a in enumerate(arrays):
        _no_masked(a, f"row {i}")
    arrays = [_c_order(a) for a in arrays]
    for i, a in enumerate(arrays[1:], start=1):
        # np.concatenate would promote: ints past 2^53 rounded into floats, bools as 1/0.
        if a.dtype != arrays[0].dtype:
            raise ValueError(
                f"row {i} is {a.dtype}, row 0 {arrays[0].dtype}: a ragged field's rows share "
                "one dtype (convert them first)"
            )
    values = np.ascontiguousarray(np.concatenate(arrays)) if arrays else np.zeros(0, np.int32)
    return Ragged(values, [len(a) for a in arrays])


def _prepare(value: Any, key: str) -> Any:
    if isinstance(value, np.ndarray):
        _no_masked(value, f"field `{key}`")
        return _c_order(value)
    if isinstance(value, (list, tuple)) and value and all(isinstance(v, np.ndarray) for v in value):
        try:
            return ragged(value)
        except ValueError as e:
            raise ValueError(f"field `{key}`: {e}") from None
    return value


def _prepare_dict(d: dict) -> dict:
    # Anything else goes on as it is, for the native check to refuse naming its position.
    if not isinstance(d, dict):
        return d
    return {k: (v if k in _RESERVED else _prepare(v, k)) for k, v in d.items()}


class Buffer:
    """A fixed-capacity sequence buffer serving RPCs (see the Rust ``SequenceBuffer``).

    ``store`` (``"file:///dir"``, a path, ``"memory://"``, ``"s3://bucket/prefix"``) makes
    it persistent: opened, it recovers everything stored there. ``durability`` is
    ``"sync"`` (a call returns once its change is on storage), ``"interval:<ms>"`` or
    ``"none"``. ``memory_budget`` (bytes) keeps at most that much tensor data in memory
    and spills the rest to Parquet (under the store's ``spill/``, or a temporary
    directory); spilled samples are read back when a batch selects them.
    ``wait_warning`` (seconds, ``None`` for never): a getter waiting that long logs why
    (:meth:`explain`) as a warning to Python's ``logging`` (logger
    ``rollout_buffer.buffer.get``), and again after twice as long each time.
    """

    def __init__(
        self,
        capacity: int,
        rpcs: Iterable[Rpc],
        store: Optional[str] = None,
        external_keys: Iterable[str] = (),
        durability: str = "sync",
        memory_budget: Optional[int] = None,
        wait_warning: Optional[float] = 60.0,
    ) -> None:
        self._native = _NativeBuffer(
            capacity, list(rpcs), store, list(external_keys), durability, memory_budget, wait_warning
        )

    async def put_batch(self, samples: Iterable[dict], timeout: Optional[float] = None) -> list:
        """Stores samples, waiting for room; returns one ``(slot, generation)`` each.
        A sample is a dict of ``id``, fields, and optionally ``birth`` and ``meta`` (a dict
        of metadata); a field no RPC names (as input, output or priority key) and no
        external key declares is a ``ValueError``, with nothing stored, as in
        :meth:`put_columns`. ``timeout`` (s) raises ``Timeout``, with nothing stored unless
        the samples were already on their way to a durable store (look before putting them
        again)."""
        return await self._native.put_batch([_prepare_dict(s) for s in samples], timeout)

    async def amend_batch(self, handles: Iterable[tuple], patches: Iterable[dict]) -> None:
        """Adds or replaces fields of stored samples; ``handles`` are the ``(slot,
        generation)`` pairs from :meth:`put_batch` or ``Batch.handles()``. A field no
        RPC names and no external key declares is a ``ValueError``, with nothing changed."""
        await self._native.amend_batch(list(handles), [_prepare_dict(p) for p in patches])

    def amend_batch_blocking(self, handles: Iterable[tuple], patches: Iterable[dict]) -> None:
        """Blocking :meth:`amend_batch`."""
        self._native.amend_batch_blocking(list(handles), [_prepare_dict(p) for p in patches])

    def put_batch_blocking(self, samples: Iterable[dict], timeout: Optional[float] = None) -> list:
        """Blocking :meth:`put_batch`."""
        return self._native.put_batch_blocking([_prepare_dict(s) for s in samples], timeout)

    async def put_columns(
        self, columns: Any, ids: Any = None, meta: Any = None, timeout: Optional[float] = None
    ) -> list:
        """Stores one sample per row of ``columns``, waiting for room; returns one
        ``(slot, generation)`` per sample. All or nothing.

        ``columns`` is a dict of columns or an object exporting Arrow (a pyarrow Table or
        RecordBatch, a polars DataFrame). A column is a numpy array ``[n, ...]`` (copied
        once; sample ``i`` gets row ``i``), ``(values, offsets)`` for a variable-length
        field (sample ``i`` gets ``values[offsets[i]:offsets[i+1]]``), or a list of ``n``
        arrays or strings. Ids come from ``ids`` or an ``id`` column (str or int),
        births from an optional ``birth`` column, and metadata from ``meta``: a dict of
        columns (int, float, bool or str), or the names of columns of ``columns`` to store
        as metadata. Any problem (unequal lengths, an unsupported dtype, bad offsets,
        missing or repeated ids, a column no RPC declares) is a ``ValueError`` naming the
        column and row, with nothing stored. ``timeout`` as for :meth:`put_batch`.
        """
        return await self._native.put_columns(columns, ids, meta, timeout)

    def put_columns_blocking(
        self, columns: Any, ids: Any = None, meta: Any = None, timeout: Optional[float] = None
    ) -> list:
        """Blocking :meth:`put_columns`."""
        return self._native.put_columns_blocking(columns, ids, meta, timeout)

    async def amend_columns(self, handles: Iterable[tuple], columns: Any) -> None:
        """Adds or replaces fields given as columns, one row per handle (see
        :meth:`put_columns` for the column forms)."""
        await self._native.amend_columns(list(handles), columns)

    def amend_columns_blocking(self, handles: Iterable[tuple], columns: Any) -> None:
        """Blocking :meth:`amend_columns`."""
        self._native.amend_columns_blocking(list(handles), columns)

    async def get_batch_for_rpc(self, rpc: str, timeout: Optional[float] = None) -> Batch:
        """Waits for and leases a batch for ``rpc``; ``timeout`` (s) raises ``Timeout``."""
        return await self._native.get_batch_for_rpc(rpc, timeout)

    def get_batch_for_rpc_blocking(self, rpc: str, timeout: Optional[float] = None) -> Batch:
        """Blocking :meth:`get_batch_for_rpc`."""
        return self._native.get_batch_for_rpc_blocking(rpc, timeout)

    def try_get_batch_for_rpc(self, rpc: str) -> Optional[Batch]:
        """A batch for ``rpc`` if one is ready now, else ``None``: never waits (a poll for
        loops that must not block)."""
        return self._native.try_get_batch_for_rpc(rpc)

    @contextlib.asynccontextmanager
    async def lease(self, rpc: str, timeout: Optional[float] = None) -> AsyncIterator[Batch]:
        """``async with buf.lease("train") as batch:``: commits the batch when the block
        ends normally (unless it was completed or released inside), releases it on an
        exception. A commit refused at the block's end (an RPC with outputs the block did
        not complete, say) releases the batch too, then raises: the block is over, and
        nothing else holds the batch to commit it again."""
        batch = await self.get_batch_for_rpc(rpc, timeout)
        try:
            yield batch
            if len(batch):
                await batch.commit()
        except BaseException:
            with contextlib.suppress(BufferError):
                batch.release()
            raise

    def set_policy_version(self, version: int) -> None:
        """Announces the trainer's policy version (staleness bounds and future checks): an
        int from 0 to 2**64 - 1, else a ``ValueError`` naming it."""
        v = None if isinstance(version, (bool, np.bool_)) else _index(version)
        if v is None or not 0 <= v < 2**64:
            # The native call raised an OverflowError ("can't convert negative int to
            # unsigned") or a TypeError naming no argument, and took True as 1.
            raise ValueError(f"version must be an int from 0 to 2**64 - 1, not {_short(version)}")
        self._native.set_policy_version(v)

    def stats(self) -> dict:
        """A snapshot of slots, per-RPC progress and totals."""
        return self._native.stats()

    def explain(self, rpc: str) -> dict:
        """Why a getter of ``rpc`` would wait now: ``eligible`` against ``batch_size``,
        then every stored sample under the first reason it is not eligible (``leased``,
        ``used_up``, ``stale``, ``discarded``, ``amending``, ``incomplete``), the input keys
        samples lack (``missing``: key -> count) and ``dropped_stale`` so far."""
        return self._native.explain(rpc)

    def flush(self, timeout: Optional[float] = None) -> None:
        """Waits until everything is durable and archived; ``timeout`` (s) raises
        ``Timeout`` (the flushing goes on)."""
        self._native.flush(timeout)

    def close(self) -> None:
        """Closes the buffer: every waiter gets ``Closed``."""
        self._native.close()

    def __len__(self) -> int:
        return len(self._native)


def _short(value: Any) -> str:
    """``value`` for an error message: its type and at most 60 characters of its repr."""
    text = repr(value)
    return f"{type(value).__name__} {text[:60] + '...' if len(text) > 60 else text}"


def _index(value: Any) -> Optional[int]:
    """``value`` as an int, if it is one (numpy's included)."""
    try:
        return operator.index(value)
    except TypeError:
        return None


def _native_of(buffer: Any) -> Any:
    return buffer._native if isinstance(buffer, Buffer) else buffer


class Ingest:
    """Groups rollouts and stores sealed groups in ``buffer`` (see the Rust
    ``GroupIngest``): pending rollouts are durable with the buffer, duplicates are counted
    and never stored, and a group is never stored twice, even across restarts.

    A rollout is a dict with ``environment``, ``example_id``, ``policy_version``,
    ``rollout_uid``, ``prompt_tokens`` (int32), ``output_tokens`` (int32), ``logprobs``
    (float32) and optionally ``reward``, ``replica_id``, ``created_ts``, ``truncated``,
    ``token_versions``, ``ref_logprobs``, ``reward_components`` and ``metadata``.
    """

    def __init__(
        self,
        buffer: Buffer,
        group_size: int,
        min_size: Optional[int] = None,
        seal_timeout: float = 30.0,
        mixed: bool = False,
        max_per_replica: Optional[int] = None,
    ) -> None:
        self._native = _NativeIngest(
            _native_of(buffer), group_size, min_size, seal_timeout, mixed, max_per_replica
        )

    async def add_rollout(self, rollout: dict, timeout: Optional[float] = None) -> str:
        """Adds a rollout; returns ``"pending"``, ``"sealed"``, ``"duplicate"``,
        ``"uid_taken"`` (another group's rollout holds its uid: uids name rollouts across
        the run, not within a group), ``"version_rejected"``, ``"replica_capped"`` or
        ``"duplicate_group"``.
        ``timeout`` (s) bounds the wait for room for the group it completes: ``Timeout``,
        and the group is pending again (resend the rollout). Use it rather than
        ``asyncio.wait_for``: a cancelled add leaves such a group unstored until the
        store is reopened."""
        return await self._native.add_rollout(rollout, timeout)

    def add_rollout_blocking(self, rollout: dict, timeout: Optional[float] = None) -> str:
        """Blocking :meth:`add_rollout`."""
        return self._native.add_rollout_blocking(rollout, timeout)

    def counters(self) -> dict:
        """Received, duplicate, pending, sealed and stored counts."""
        return self._native.counters()


class Batcher:
    """Packed trainer batches from one buffer per environment, by token shares (see the
    Rust ``Batcher``). ``sources`` are ``(name, buffer, rpc, fraction)`` tuples; the RPC
    leases one group at a time with :data:`GROUP_INPUTS` as inputs."""

    def __init__(
        self,
        sources: Iterable[tuple],
        seq_len: int,
        rows: int,
        group_size: int,
        advantage: str = "grpo",
        wait: float = 1.0,
    ) -> None:
        native = [(name, _native_of(buf), rpc, fraction) for name, buf, rpc, fraction in sources]
        self._native = _NativeBatcher(native, seq_len, rows, group_size, advantage, wait)

    async def next_batch(self, timeout: Optional[float] = None) -> TrainBatch:
        """The next batch; ``arrays()`` gives its ``[B, S]`` numpy arrays, ``complete()``
        commits it once trained on. ``timeout`` (s) raises ``Timeout``, with every group
        its current pass had leased given back (groups an earlier pass rejected stay
        discarded). While every source is dry it waits, rather than return a batch of
        padding alone."""
        return await self._native.next_batch(timeout)

    def next_batch_blocking(self, timeout: Optional[float] = None) -> TrainBatch:
        """Blocking :meth:`next_batch`; ``complete_blocking()`` commits the batch."""
        return self._native.next_batch_blocking(timeout)
