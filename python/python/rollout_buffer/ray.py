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
arguments. The trainer RPC (``trainer_rpc``) leases one group at a time (``n_seqs`` 1)
and reads :data:`rollout_buffer.GROUP_INPUTS`.

Lease ids are ints unique to one actor (a restarted or recreated actor never hands out
an id an earlier one gave), so a late ``complete`` from before a restart is refused
rather than applied to another group. ``next_batch(step)`` asked again for a step not
yet completed returns the same batch (a retried call does not drop the first answer,
whose groups would then be trained on twice). A verifier's ``reward`` output is checked
against its group (one finite number per rollout, stored as float64) before the lease
is completed: a group the trainer cannot read would be given back to it first, and
fail, at every ``next_batch``. Bad input is a ``ValueError`` naming the argument (and
the rollout, output or RPC at fault). A lease whose ``complete`` is refused stays held,
to be completed again; ``add_rollouts`` adds the rollouts before a bad one (its error
lists their outcomes) and none after it.
"""

from __future__ import annotations

import asyncio
import itertools
import secrets
import time
from typing import Any, Optional

import numpy as np
import ray

from . import GROUP_INPUTS, Batcher, Buffer, Ingest, Rpc, _index, _short


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
        specs = _rpc_specs(rpcs, trainer_rpc)
        self._buffer = Buffer(capacity, [_rpc(i, spec) for i, spec in enumerate(specs)], store=store)
        self._ingest = Ingest(self._buffer, group_size, min_size, seal_timeout)
        self._batcher = Batcher(
            [(environment, self._buffer, trainer_rpc, 1.0)], seq_len, rows, group_size, advantage
        )
        self._lease_timeouts = {spec["name"]: spec.get("lease_timeout") for spec in specs}
        # lease id -> (batch, rpc, when to forget it). The ids start at a random 62-bit
        # number: counting from 0 in every actor gave a restarted actor's leases the ids
        # of the old one's, so a verifier finishing an old lease completed another
        # verifier's group with its outputs.
        self._leases: dict = {}
        self._ids = itertools.count(secrets.randbits(62))
        # step -> the task making (or that made) its batch, shared by calls for the step.
        self._batches: dict = {}

    async def add_rollouts(self, rollouts: list) -> list:
        """Adds rollouts (dicts, see :class:`rollout_buffer.Ingest`); returns each one's
        outcome. A bad rollout is a ``ValueError`` naming its index; the ones before it
        were added (a resend answers them ``duplicate``), the ones after it were not."""
        if not isinstance(rollouts, (list, tuple)):
            # A single dict was iterated as its keys: "a rollout is a dict", for each key.
            raise ValueError(f"rollouts must be a list of rollout dicts, not {_short(rollouts)}")
        outcomes = []
        for i, r in enumerate(rollouts):
            try:
                outcomes.append(await self._ingest.add_rollout(r))
            except ValueError as e:
                raise ValueError(
                    f"rollouts[{i}]: {e} (rollouts[:{i}] were added: {outcomes}; "
                    f"rollouts[{i}:] were not)"
                ) from None
        return outcomes

    async def lease(self, rpc: str, timeout: Optional[float] = None) -> tuple:
        """Leases a batch for ``rpc``: ``(lease_id, samples)``."""
        _text("rpc", rpc)
        self._forget_expired()
        batch = await self._buffer.get_batch_for_rpc(rpc, timeout)
        lease_id = next(self._ids)
        lease_timeout = self._lease_timeouts.get(rpc)
        # Kept until finished, or until twice the RPC's lease timeout: by then the lease
        # expired, its samples went back to the RPC and a late complete fails anyway,
        # and a consumer that died would otherwise leave its batch here for good.
        forget = None if lease_timeout is None else time.monotonic() + 2 * lease_timeout
        self._leases[lease_id] = (batch, rpc, forget)
        return lease_id, batch.samples()

    async def complete(self, lease_id: int, outputs: list) -> None:
        """Completes lease ``lease_id`` with one output dict per sample. Outputs the
        buffer refuses (a ``ValueError``) leave the lease held, to be completed again."""
        batch, rpc, forget = self._take(lease_id)
        try:
            outputs = _checked_outputs(batch, outputs)
            await batch.complete(outputs)
        except ValueError:
            self._leases[lease_id] = (batch, rpc, forget)
            raise

    async def commit(self, lease_id: int) -> None:
        """Uses one read of every sample of lease ``lease_id``. (A commit the buffer
        refuses, on an RPC that must write outputs, gives the samples back: the lease is
        over either way.)"""
        await self._take(lease_id)[0].commit()

    def release(self, lease_id: int) -> None:
        """Gives lease ``lease_id`` back unused."""
        self._take(lease_id)[0].release()

    async def next_batch(self, step: int) -> dict:
        """The packed batch for training step ``step`` (numpy arrays, ``group_ids``,
        ``efficiency``); held until :meth:`complete_batch`. Asked again before then
        (a retry, or concurrent calls), the step's batch is the same."""
        step = _step(step)
        task = self._batches.get(step)
        if task is None:
            task = self._batches[step] = asyncio.ensure_future(self._batcher.next_batch())
        try:
            # Shielded: a caller cancelled while waiting must not cancel the batch the
            # other callers for this step wait on.
            batch = await asyncio.shield(task)
        except BaseException:
            if task.done() and self._batches.get(step) is task:
                del self._batches[step]  # failed: the next call for the step tries again
            raise
        return batch.arrays()

    async def complete_batch(self, step: int) -> None:
        """The trainer is done with step ``step``'s batch."""
        step = _step(step)
        task = self._batches.get(step)
        if task is None:
            raise KeyError(f"step {step} has no batch: never asked for with next_batch, or already completed")
        if not task.done():
            raise ValueError(f"step {step}'s batch is still being made: complete it once next_batch({step}) returns")
        del self._batches[step]
        await task.result().complete()

    def set_policy_version(self, version: int) -> None:
        """Announces the trainer's policy version."""
        self._buffer.set_policy_version(version)

    def stats(self) -> dict:
        """The buffer's and the ingestion's counts, and the leases and trainer steps the
        actor holds (``leases``, ``steps``)."""
        return {
            "buffer": self._buffer.stats(),
            "ingest": self._ingest.counters(),
            "leases": len(self._leases),
            "steps": len(self._batches),
        }

    def flush(self) -> None:
        """Waits until everything is durable."""
        self._buffer.flush()

    def ready(self) -> bool:
        """True once constructed (for callers that wait for a restart)."""
        return True

    def _take(self, lease_id: int) -> tuple:
        """Takes lease ``lease_id`` out of the held leases: ``(batch, rpc, forget)``."""
        try:
            return self._leases.pop(lease_id)
        except (KeyError, TypeError):  # TypeError: an unhashable id
            raise KeyError(
                f"lease {lease_id!r} is not held: never given by this actor (an actor that "
                "restarted forgets its leases), already completed, committed or released, or "
                "past its RPC's lease_timeout (its samples were given to another consumer)"
            ) from None

    def _forget_expired(self) -> None:
        now = time.monotonic()
        for lease_id in [k for k, (_, _, forget) in self._leases.items() if forget is not None and forget < now]:
            del self._leases[lease_id]


def _step(step: Any) -> int:
    """A training step: an int (steps key the held batches, where 0, 0.0 and False were
    one key and "0" another)."""
    v = None if isinstance(step, (bool, np.bool_)) else _index(step)
    if v is None:
        raise ValueError(f"step must be an int, not {_short(step)}")
    return v


def _text(name: str, value: Any) -> None:
    if not isinstance(value, str):
        raise ValueError(f"{name} must be a str, not {_short(value)}")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as e:
        raise ValueError(f"{name} {value!r} is not valid text: {value[e.start:e.end]!r} has no UTF-8 encoding") from None


def _rpc_specs(rpcs: Any, trainer_rpc: Any) -> list:
    """The RPC dicts, checked: a list of dicts, one of them the trainer RPC, which the
    batcher reads groups through (one per lease, with every group field). An actor
    built without it took every call and then failed every next_batch."""
    if isinstance(rpcs, (str, bytes, dict)) or not isinstance(rpcs, (list, tuple)):
        raise ValueError(f"rpcs must be a list of dicts (Rpc's keyword arguments), not {_short(rpcs)}")
    for i, spec in enumerate(rpcs):
        if not isinstance(spec, dict):
            raise ValueError(f"rpcs[{i}] must be a dict of Rpc's keyword arguments, not {_short(spec)}")
    _text("trainer_rpc", trainer_rpc)
    names = [spec.get("name") for spec in rpcs]
    if trainer_rpc not in names:
        raise ValueError(f"trainer_rpc {trainer_rpc!r} is none of the RPCs {names}")
    trainer = rpcs[names.index(trainer_rpc)]
    missing = [k for k in GROUP_INPUTS if k not in (trainer.get("inputs") or ())]
    if trainer.get("n_seqs") != 1 or missing:
        raise ValueError(
            f"trainer_rpc {trainer_rpc!r} must lease one group at a time (n_seqs 1, not "
            f"{trainer.get('n_seqs')!r}) and read GROUP_INPUTS (missing: {missing})"
        )
    return list(rpcs)


def _rpc(i: int, spec: dict) -> Rpc:
    try:
        return Rpc(**spec)
    except (TypeError, ValueError) as e:
        raise ValueError(f"rpcs[{i}] ({spec.get('name')!r}): {e}") from None


def _checked_outputs(batch: Any, outputs: Any) -> Any:
    """``outputs`` with each ``reward`` (the group field the trainer reads) as a float64
    array of one finite number per rollout of its group. Left to the buffer, a float32
    array, a scalar or too few values were stored and made the group unreadable by the
    trainer, which was then given it first, and failed, at every next_batch; a NaN
    dropped the group without a word."""
    if not isinstance(outputs, (list, tuple)):
        return outputs  # the buffer refuses it, naming it
    samples = None
    checked = []
    for i, out in enumerate(outputs):
        if isinstance(out, dict) and "reward" in out:
            if samples is None:
                samples = batch.samples()
            if i < len(samples):
                out = dict(out, reward=_group_rewards(i, samples[i], out["reward"]))
        checked.append(out)
    return checked


def _group_rewards(i: int, sample: dict, value: Any) -> np.ndarray:
    meta = sample.get("meta") or {}
    k = meta.get("num_rollouts")
    where = f"output {i} (group {sample.get('id')!r}), field 'reward'"
    arr = None
    if not isinstance(value, (str, bytes)):
        try:
            arr = np.asarray(value)
        except (TypeError, ValueError):
            arr = None
    if arr is None or arr.dtype.kind not in "iuf" or arr.ndim != 1:
        raise ValueError(f"{where}: must be a 1-d array of numbers, one per rollout, not {_short(value)}")
    if k is not None and len(arr) != k:
        raise ValueError(f"{where}: {len(arr)} rewards for the group's {k} rollouts")
    arr = arr.astype(np.float64)
    bad = np.flatnonzero(~np.isfinite(arr))
    if len(bad):
        raise ValueError(f"{where}: reward {bad[0]} is {arr[bad[0]]}, not a finite number")
    return arr


__all__ = ["BufferActor"]
