"""A Ray actor owning a buffer, for runs whose producers, verifiers and trainers sit on
many machines.

``BufferActor`` is an async actor: producers call ``add_rollouts``; verifiers lease groups
by RPC and finish them by lease id (give the RPC a ``lease_timeout`` so the samples of a
consumer that died come back); the trainer calls ``next_batch(step)`` for packed numpy
arrays and ``complete_batch(step)`` once trained on. With a ``store`` URL the buffer is
persistent: an actor recreated on the same store (after ``ray.kill``, a node failure, a
preemption) recovers everything acknowledged, pending rollouts included.

RPCs are given as dicts (``{"name": "train", "n_seqs": 1, "inputs": [...], ...}``, the
keyword arguments of :class:`rollout_buffer.Rpc`), since Ray pickles constructor
arguments.
"""

from __future__ import annotations

import itertools
from typing import Optional

import ray

from . import Batcher, Buffer, Ingest, Rpc


@ray.remote
class BufferActor:
    """See the module docs."""

    def __init__(
        self,
        capacity: int,
        rpcs: list,
        store: Optional[str] = None,
        group_size: int = 8,
        min_size: Optional[int] = None,
        seal_timeout: float = 30.0,
        trainer_rpc: str = "train",
        seq_len: int = 4096,
        rows: int = 8,
        advantage: str = "grpo",
        environment: str = "default",
    ) -> None:
        self._buffer = Buffer(capacity, [Rpc(**spec) for spec in rpcs], store=store)
        self._ingest = Ingest(self._buffer, group_size, min_size, seal_timeout)
        self._batcher = Batcher(
            [(environment, self._buffer, trainer_rpc, 1.0)], seq_len, rows, group_size, advantage
        )
        self._leases: dict = {}
        self._ids = itertools.count()
        self._batches: dict = {}

    async def add_rollouts(self, rollouts: list) -> list:
        """Adds rollouts (dicts, see :class:`rollout_buffer.Ingest`); returns each one's
        outcome."""
        return [await self._ingest.add_rollout(r) for r in rollouts]

    async def lease(self, rpc: str, timeout: Optional[float] = None) -> tuple:
        """Leases a batch for ``rpc``: ``(lease_id, samples)``."""
        batch = await self._buffer.get_batch_for_rpc(rpc, timeout)
        lease_id = next(self._ids)
        self._leases[lease_id] = batch
        return lease_id, batch.samples()

    async def complete(self, lease_id: int, outputs: list) -> None:
        """Completes lease ``lease_id`` with one output dict per sample."""
        await self._leases.pop(lease_id).complete(outputs)

    async def commit(self, lease_id: int) -> None:
        """Uses one read of every sample of lease ``lease_id``."""
        await self._leases.pop(lease_id).commit()

    def release(self, lease_id: int) -> None:
        """Gives lease ``lease_id`` back unused."""
        self._leases.pop(lease_id).release()

    async def next_batch(self, step: int) -> dict:
        """The packed batch for training step ``step`` (numpy arrays, ``group_ids``,
        ``efficiency``); held until :meth:`complete_batch`."""
        batch = await self._batcher.next_batch()
        self._batches[step] = batch
        return batch.arrays()

    async def complete_batch(self, step: int) -> None:
        """The trainer is done with step ``step``'s batch."""
        await self._batches.pop(step).complete()

    def set_policy_version(self, version: int) -> None:
        """Announces the trainer's policy version."""
        self._buffer.set_policy_version(version)

    def stats(self) -> dict:
        """The buffer's and the ingestion's counts."""
        return {"buffer": self._buffer.stats(), "ingest": self._ingest.counters()}

    def flush(self) -> None:
        """Waits until everything is durable."""
        self._buffer.flush()

    def ready(self) -> bool:
        """True once constructed (for callers that wait for a restart)."""
        return True


__all__ = ["BufferActor"]
