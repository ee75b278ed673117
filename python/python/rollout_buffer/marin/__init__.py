"""Marin's replay buffer (``marin.rl.replay_buffer``) and data loader, as a drop-in::

    from rollout_buffer.marin import ReplayBuffer, ReplayBufferConfig, ReplayDataLoader

Same names, constructor fields (``capacity`` per environment, ``alpha``, ``max_samples``,
``max_rollout_step_delay``, ``max_rollout_timestamp_delay``,
``filter_out_groups_with_no_variance``, ``local_batch_size``, ``total_processes``,
``loss_module``, ``seed``), methods and return types, and Marin's semantics:

* ``add_batches`` skips an empty batch or one whose first group is empty, and a whole
  batch whose first rollout is not fresh (its ``weight_step`` outside
  ``[step - max_rollout_step_delay, step]``, or its timestamp at or before
  ``now - max_rollout_timestamp_delay``); advantages are computed once per group at
  ingestion (RLOO unless a ``loss_module`` says otherwise); groups with no reward variance
  are kept or dropped per ``filter_out_groups_with_no_variance``; each environment keeps
  its newest ``capacity`` rollouts.
* ``set_current_step`` drops every stored rollout that is no longer fresh.
* ``sample_rollouts`` returns ``None`` rather than a partial batch; environments get
  counts drawn without replacement in proportion to their sizes, and within one,
  rollouts are drawn without replacement with weight ``(i + 1) ** alpha`` by insertion
  index; each draw counts a use, and rollouts used ``max_samples`` times retire.

The draws are Marin's draw for draw: the same calls on ``numpy.random.default_rng(seed)``
with the same arguments, so a run with a given seed samples the same batches as Marin's
buffer (and every process with the same seed samples the same global batch, as Marin's
trainer relies on). What differs is the cost: the bookkeeping is numpy columns per
environment, so a call costs O(batch + environments) Python work instead of a Python list
of every stored rollout per draw, and ``ReplayDataLoader.get_rollouts`` waits on the
buffer (woken by ``add_batches``) instead of polling every 0.1 s.

The newer API is here too: ``sample_sequences`` returns :class:`StoredTrajectory`
objects (the rollout, its group id and its group's surviving members; no advantage), and
``sample_groups`` the distinct groups of such a draw. Capacity eviction and staleness
remove members from their group, so RLOO at training time runs over the survivors.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence

import numpy as np

from .store import EnvRollouts, GroupIndex
from .types import (
    RLOO,
    GroupRecord,
    Rollout,
    RolloutBatch,
    RolloutGroup,
    RolloutMetadata,
    RolloutWithCount,
    StoredTrajectory,
    rloo_advantages,
)

__all__ = [
    "GroupRecord",
    "ReplayBuffer",
    "ReplayBufferConfig",
    "ReplayDataLoader",
    "Rollout",
    "RolloutBatch",
    "RolloutGroup",
    "RolloutMetadata",
    "RolloutWithCount",
    "StoredTrajectory",
    "rloo_advantages",
]

logger = logging.getLogger(__name__)


@dataclass
class ReplayBufferConfig:
    """Marin's ``ReplayBufferConfig``."""

    capacity: int
    alpha: float
    max_samples: int
    max_rollout_step_delay: int
    max_rollout_timestamp_delay: float = 3600.0
    filter_out_groups_with_no_variance: bool = False


class ReplayBuffer:
    """Marin's ``ReplayBuffer`` (see the module docs). Thread-safe."""

    def __init__(
        self,
        capacity: int,
        local_batch_size: int,
        alpha: float,
        total_processes: int = 1,
        max_samples: int = -1,
        max_rollout_step_delay: int = 0,
        max_rollout_timestamp_delay: float = 3600.0,
        filter_out_groups_with_no_variance: bool = False,
        loss_module: Any = None,
        seed: int = 0,
    ):
        if capacity <= 0 or local_batch_size <= 0:
            raise ValueError(f"capacity ({capacity}) and local_batch_size ({local_batch_size}) must be > 0")
        self.capacity = int(capacity)
        self.local_batch_size = int(local_batch_size)
        self.alpha = float(alpha)
        self.total_processes = int(total_processes)
        self.max_samples = int(max_samples)
        self.max_rollout_step_delay = int(max_rollout_step_delay)
        self.max_rollout_timestamp_delay = float(max_rollout_timestamp_delay)
        self.filter_out_groups_with_no_variance = bool(filter_out_groups_with_no_variance)
        self.loss_module = loss_module if loss_module is not None else RLOO()
        self.seed = seed
        self._rng = np.random.default_rng(seed=seed)
        self._weights = np.zeros(0)
        self._envs: Dict[str, EnvRollouts] = {}
        self._groups = GroupIndex()
        self._current_step = 0
        self._total_batches_added = 0
        self._total_batches_sampled = 0
        # Guards everything above; notified when rollouts arrive.
        self._cond = threading.Condition()

    @classmethod
    def from_config(
        cls,
        config: ReplayBufferConfig,
        local_batch_size: int,
        total_processes: int = 1,
        loss_module: Any = None,
        seed: int = 0,
    ) -> "ReplayBuffer":
        return cls(
            capacity=config.capacity,
            local_batch_size=local_batch_size,
            alpha=config.alpha,
            total_processes=total_processes,
            max_samples=config.max_samples,
            max_rollout_step_delay=config.max_rollout_step_delay,
            max_rollout_timestamp_delay=config.max_rollout_timestamp_delay,
            filter_out_groups_with_no_variance=config.filter_out_groups_with_no_variance,
            loss_module=loss_module,
            seed=seed,
        )

    # ----- freshness --------------------------------------------------------------------

    def _fresh(self, steps: np.ndarray, stamps: np.ndarray, step: int, now: float) -> np.ndarray:
        # Rollouts from the future (a restarted trainer) are not fresh, as in Marin.
        return (
            (steps >= step - self.max_rollout_step_delay)
            & (steps <= step)
            & (stamps > now - self.max_rollout_timestamp_delay)
        )

    def set_current_step(self, step: int) -> None:
        """Sets the trainer's step and drops the rollouts that are no longer fresh."""
        now = time.time()
        with self._cond:
            self._current_step = int(step)
            removed = 0
            for env in self._envs.values():
                removed += env.keep(self._fresh(env.steps, env.stamps, self._current_step, now), self._groups)
            if removed:
                logger.info("dropped %d stale rollouts, %d remain", removed, self._size())

    # ----- in ---------------------------------------------------------------------------

    def add_batches(self, new_batches: Sequence[Any]) -> None:
        """Adds rollout batches (see the module docs for what is skipped)."""
        now = time.time()
        staged: Dict[str, list] = {}
        with self._cond:
            step = self._current_step
        for batch in new_batches:
            groups = list(getattr(batch, "groups", None) or [])
            if not groups or not groups[0].rollouts:
                continue
            first = groups[0].rollouts[0].metadata
            w_step, stamp = int(first.weight_step), float(first.timestamp)
            fresh = step - self.max_rollout_step_delay <= w_step <= step
            if not (fresh and stamp > now - self.max_rollout_timestamp_delay):
                logger.info("skipping a stale batch (weight step %d, current step %d)", w_step, step)
                continue
            with self._cond:
                self._total_batches_added += 1
            for group in groups:
                rollouts = list(group.rollouts)
                if not rollouts:
                    continue  # an empty group is skipped, never an IndexError
                rewards = np.array([r.episode_reward for r in rollouts], dtype=np.float32)
                if self.filter_out_groups_with_no_variance and not np.std(rewards) > 0.0:
                    continue
                advantages = self.loss_module.compute_advantages(rollouts)
                meta = getattr(group, "metadata", None)
                staged.setdefault(rollouts[-1].env_name, []).append(
                    (rollouts, advantages, w_step, getattr(meta, "group_id", None), getattr(meta, "lesson_id", None))
                )
        if not staged:
            return
        with self._cond:
            for env_name, groups in staged.items():
                env = self._envs.get(env_name)
                if env is None:
                    env = self._envs[env_name] = EnvRollouts()
                rows = [
                    (rollouts, advantages, w_step, self._groups.open(env_name, group_id, lesson_id))
                    for rollouts, advantages, w_step, group_id, lesson_id in groups
                ]
                env.extend(rows, self._groups)
                env.trim(self.capacity, self._groups)
            self._cond.notify_all()

    # ----- out --------------------------------------------------------------------------

    def _draw(self) -> Optional[List[tuple]]:
        """Marin's draw, under the lock: ``(env, row)`` pairs in Marin's output order
        (environments in the order of their first label drawn), uses counted, nothing
        retired yet; ``None`` when fewer than a batch are stored."""
        names = [n for n, e in self._envs.items() if len(e)]
        if not names:
            return None
        sizes = np.array([len(self._envs[n]) for n in names])
        if sizes.sum() < self.local_batch_size:
            return None
        # Marin draws env labels (one per stored rollout) without replacement; drawing
        # positions in the same flat order consumes the generator identically.
        picked = self._rng.choice(int(sizes.sum()), size=self.local_batch_size, replace=False)
        labels = np.searchsorted(np.cumsum(sizes), picked, side="right")
        order, counts = [], {}
        for label in labels.tolist():
            if label not in counts:
                order.append(label)
                counts[label] = 0
            counts[label] += 1
        out = []
        for label in order:
            env = self._envs[names[label]]
            weights = self._recency(len(env))
            rows = self._rng.choice(len(env), p=weights / weights.sum(), size=counts[label], replace=False)
            env.usage[rows] += 1
            out.extend((names[label], int(r)) for r in rows)
        return out

    def _recency(self, n: int) -> np.ndarray:
        """``(i + 1) ** alpha`` for ``i < n``: a slice of a table kept across calls (the
        power is most of a draw's cost at large capacities). Elementwise equal to
        computing it afresh, so the draws stay Marin's."""
        if len(self._weights) < n:
            size = max(n, 2 * len(self._weights), 1024)
            self._weights = (np.arange(size) + 1) ** self.alpha
        return self._weights[:n]

    def _retire(self) -> None:
        if self.max_samples < 0:
            return
        for env in self._envs.values():
            env.keep(env.usage < self.max_samples, self._groups)

    def sample_rollouts(self) -> Optional[List[RolloutWithCount]]:
        """A batch of ``local_batch_size`` rollouts, or ``None`` (see the module docs)."""
        with self._cond:
            drawn = self._draw()
            if drawn is None:
                return None
            out = [self._envs[e].entry(r) for e, r in drawn]
            self._retire()
            self._total_batches_sampled += 1
            return out

    def sample_sequences(self) -> Optional[List[StoredTrajectory]]:
        """The newer API: a batch as :class:`StoredTrajectory` objects, each with its
        group's members still stored at the draw (before retirement)."""
        with self._cond:
            drawn = self._draw()
            if drawn is None:
                return None
            out = []
            for e, r in drawn:
                env = self._envs[e]
                gid = env.group_ids[r]
                out.append(StoredTrajectory(
                    trajectory=env.items[r].rollout,
                    group_id=gid,
                    group=self._groups.record(gid),
                    usage_count=int(env.usage[r]),
                ))
            self._retire()
            self._total_batches_sampled += 1
            return out

    def sample_groups(self) -> Optional[List[GroupRecord]]:
        """The distinct groups of a :meth:`sample_sequences` draw, in order of first
        appearance."""
        seqs = self.sample_sequences()
        if seqs is None:
            return None
        seen: Dict[str, GroupRecord] = {}
        for s in seqs:
            seen.setdefault(s.group_id, s.group)
        return list(seen.values())

    def _size(self) -> int:
        return sum(len(e) for e in self._envs.values())

    def size(self) -> int:
        """Rollouts stored over every environment."""
        with self._cond:
            return self._size()

    def get_stats(self) -> dict:
        """Marin's stats: ``total_size``, ``env_sizes``, ``num_environments`` (every
        environment ever seen, as Marin counts), ``total_batches_added`` and
        ``total_batches_sampled``."""
        with self._cond:
            sizes = {n: len(e) for n, e in self._envs.items()}
            return {
                "total_size": sum(sizes.values()),
                "env_sizes": sizes,
                "num_environments": len(sizes),
                "total_batches_added": self._total_batches_added,
                "total_batches_sampled": self._total_batches_sampled,
            }

    def wait_for_batch(self, timeout: float) -> Optional[List[RolloutWithCount]]:
        """:meth:`sample_rollouts`, waiting up to ``timeout`` seconds for enough rollouts
        (woken by :meth:`add_batches`, not by polling)."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                batch = self.sample_rollouts()
                left = deadline - time.monotonic()
                if batch is not None or left <= 0:
                    return batch
                self._cond.wait(left)


class ReplayDataLoader:
    """Marin's ``ReplayDataLoader``: a background thread moves what the reader has into
    the buffer every ``rollout_fetch_interval`` seconds; :meth:`get_rollouts` waits on
    the buffer. Use it as a context manager, or :meth:`start` / :meth:`stop`."""

    def __init__(self, rollout_reader: Any, replay_buffer: ReplayBuffer, rollout_fetch_interval: float = 1.0):
        self.rollout_reader = rollout_reader
        self.replay_buffer = replay_buffer
        self.rollout_fetch_interval = rollout_fetch_interval
        self._thread: Optional[threading.Thread] = None
        self._stop = threading.Event()

    def start(self) -> None:
        if self._thread is not None:
            raise RuntimeError("ReplayDataLoader already running")
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, name="replay-data-loader", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        if self._thread is not None:
            self._stop.set()
            self._thread.join(timeout=5.0)
            self._thread = None

    def get_rollouts(self, timeout: float = 5.0) -> Optional[List[RolloutWithCount]]:
        """The next batch, or ``None`` after ``timeout`` seconds without enough rollouts."""
        return self.replay_buffer.wait_for_batch(timeout)

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                batches = self.rollout_reader.read_all_available()
                if batches:
                    self.replay_buffer.add_batches(batches)
            except Exception:  # a bad read must not end the loader (Marin's behaviour)
                logger.exception("ReplayDataLoader: reading or adding rollouts failed")
            self._stop.wait(self.rollout_fetch_interval)

    def __enter__(self) -> "ReplayDataLoader":
        self.start()
        return self

    def __exit__(self, *exc) -> bool:
        self.stop()
        return False
