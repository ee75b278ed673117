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
* Input of the wrong kind is a ``ValueError`` naming the argument, or the batch, group
  and rollout and the field (a reward that is no finite number, a weight step that is
  no int, a timestamp that is no finite number, a loss module's advantages that are not
  one finite number per rollout), and a refused call stores nothing and counts nothing.
  Marin took some of these (a NaN reward made its group's advantages NaN) and failed on
  others halfway through a store.

The draws are Marin's draw for draw: the same calls on ``numpy.random.default_rng(seed)``
with the same arguments, so a run with a given seed samples the same batches as Marin's
buffer (and every process with the same seed samples the same global batch, as Marin's
trainer relies on). What differs is the cost: the bookkeeping is numpy columns per
environment, so a call costs O(batch + environments) Python work instead of a Python list
of every stored rollout per draw, and ``ReplayDataLoader.get_rollouts`` waits on the
buffer (woken by ``add_batches``) instead of polling every 0.1 s.

The newer API is here too: ``sample_sequences`` returns :class:`StoredTrajectory`
objects (the rollout, its group id and its group's surviving members; no advantage), and
``sample_groups`` whole groups as Marin's newest does (see its docs); the loader has
``get_trajectories`` and ``get_groups`` beside ``get_rollouts``. Capacity eviction and staleness
remove members from their group, so RLOO at training time runs over the survivors.
"""

from __future__ import annotations

import contextlib
import logging
import math
import operator
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence

import numpy as np

from . import checks
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
        # Everything is checked before anything is kept: a float count was truncated
        # (capacity 2.5 kept 2), a string flag was true, and a NaN alpha or delay was
        # taken, to fail at the first draw or to find every rollout stale.
        # Guards everything below; notified when rollouts arrive.
        self._cond = threading.Condition()
        self._weights = np.zeros(0)
        self.capacity = checks.count("capacity", capacity, least=1)
        self.local_batch_size = checks.count("local_batch_size", local_batch_size, least=1)
        self.alpha = alpha
        self.total_processes = checks.count("total_processes", total_processes, least=1)
        self.max_samples = checks.count("max_samples", max_samples)
        # A negative delay (or a timestamp delay of 0) makes no rollout ever fresh: the
        # trainer would starve without a word.
        self.max_rollout_step_delay = checks.count("max_rollout_step_delay", max_rollout_step_delay, least=0)
        self.max_rollout_timestamp_delay = checks.number(
            "max_rollout_timestamp_delay", max_rollout_timestamp_delay, positive=True, inf_ok=True
        )
        self.filter_out_groups_with_no_variance = checks.flag(
            "filter_out_groups_with_no_variance", filter_out_groups_with_no_variance
        )
        if loss_module is not None and not callable(getattr(loss_module, "compute_advantages", None)):
            raise ValueError(f"loss_module must have a compute_advantages(rollouts) method, not {loss_module!r}")
        self.loss_module = loss_module if loss_module is not None else RLOO()
        try:
            self._rng = np.random.default_rng(seed=seed)
        except (TypeError, ValueError) as e:
            raise ValueError(f"seed must be an int >= 0 (or None), not {seed!r}: {e}") from None
        self.seed = seed
        self._envs: Dict[str, EnvRollouts] = {}
        self._groups = GroupIndex()
        self._current_step = 0
        self._total_batches_added = 0
        self._total_batches_sampled = 0

    @property
    def alpha(self) -> float:
        """The recency exponent. Set it at any time, as Marin's draws read it afresh:
        checked as the constructor checks it, and the next draw uses it (a table of
        weights kept across draws had kept the first draw's alpha)."""
        return self._alpha

    @alpha.setter
    def alpha(self, value: Any) -> None:
        alpha = checks.number("alpha", value)
        with self._cond:
            self._alpha = alpha
            self._weights = np.zeros(0)

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

    def _is_rollout_fresh(
        self, rollout_step: int, rollout_timestamp: float, current_step: int, current_time: float
    ) -> bool:
        """Marin's freshness test of one rollout (its tests call it): its weight step
        within ``[current_step - max_rollout_step_delay, current_step]`` and its timestamp
        after ``current_time - max_rollout_timestamp_delay``."""
        return bool(self._fresh(np.array([rollout_step]), np.array([rollout_timestamp], float),
                                current_step, current_time)[0])

    def set_current_step(self, step: int) -> None:
        """Sets the trainer's step and drops the rollouts that are no longer fresh."""
        # Checked before it is kept: "3" was taken as 3, 1.9 as 1.
        step = checks.count("step", step, int64=True)
        now = time.time()
        with self._cond:
            self._current_step = step
            removed = 0
            for env in self._envs.values():
                removed += env.keep(self._fresh(env.steps, env.stamps, self._current_step, now), self._groups)
            if removed:
                logger.info("dropped %d stale rollouts, %d remain", removed, self._size())

    # ----- in ---------------------------------------------------------------------------

    def add_batches(self, new_batches: Sequence[Any]) -> None:
        """Adds rollout batches (see the module docs for what is skipped). A rollout of
        the wrong kind (a reward that is no finite number, a weight step that is no int, a
        timestamp that is no number, an env name that is no str) or a loss module's
        advantages of the wrong length or not finite are a ``ValueError`` naming the
        batch, group and rollout, and none of the call is stored."""
        now = time.time()
        with self._cond:
            step = self._current_step
        # Everything that can fail (reading the rollouts, the loss module) runs here,
        # before the lock: a failure used to leave part of the call stored, members in the
        # group index that no environment held, and the batch counted.
        accepted, staged = self._stage(new_batches, step, now)
        if not accepted:
            return
        with self._cond:
            self._total_batches_added += accepted
            for env_name, groups in staged.items():
                env = self._envs.get(env_name)
                if env is None:
                    env = self._envs[env_name] = EnvRollouts()
                rows = [
                    (rollouts, advantages, w_step, self._groups.open(env_name, group_id, lesson_id), steps, stamps)
                    for rollouts, advantages, w_step, group_id, lesson_id, steps, stamps in groups
                ]
                added = env.extend(rows, self._groups)
                if added and self._current_step != step:
                    # set_current_step ran while this call staged its rollouts: keep what
                    # it would have kept had they been stored first (none of them stale
                    # after the step moved on).
                    keep = np.ones(len(env), bool)
                    keep[len(env) - added:] = self._fresh(
                        env.steps[-added:], env.stamps[-added:], self._current_step, now
                    )
                    env.keep(keep, self._groups)
                env.trim(self.capacity, self._groups)
            self._cond.notify_all()

    def _stage(self, new_batches: Any, step: int, now: float) -> tuple:
        """The batches to store: ``(accepted, {env: [group rows]})``. Marin's skips (an
        empty batch or first group, a stale batch, a group without variance when asked)
        happen here; a rollout or advantages of the wrong kind raise."""
        if new_batches is None or isinstance(new_batches, (str, bytes, dict)) or hasattr(new_batches, "groups"):
            raise ValueError(f"new_batches must be a list of rollout batches, not {_short(new_batches)}")
        accepted = 0
        staged: Dict[str, list] = {}
        for b, batch in enumerate(new_batches):
            if not hasattr(batch, "groups"):
                # A group or a rollout passed as a batch was skipped as empty: lost.
                raise ValueError(f"new_batches[{b}] is no rollout batch (it has no `groups`): {_short(batch)}")
            groups = list(batch.groups or [])
            first = _rollouts_of(groups[0], f"new_batches[{b}].groups[0]") if groups else []
            if not first:
                continue
            w_step, stamp = _when(first[0], f"new_batches[{b}].groups[0].rollouts[0]")
            fresh = step - self.max_rollout_step_delay <= w_step <= step
            if not (fresh and stamp > now - self.max_rollout_timestamp_delay):
                logger.info("skipping a stale batch (weight step %d, current step %d)", w_step, step)
                continue
            accepted += 1
            for g, group in enumerate(groups):
                where = f"new_batches[{b}].groups[{g}]"
                rollouts = first if g == 0 else _rollouts_of(group, where)
                if not rollouts:
                    continue  # an empty group is skipped, never an IndexError
                rewards, steps, stamps = _read_rollouts(rollouts, where)
                if self.filter_out_groups_with_no_variance and not np.std(rewards.astype(np.float32)) > 0.0:
                    continue
                # Filed under its last rollout's environment, as Marin files it; every
                # rollout's env_name is checked (a None or bytes one was stored and served).
                for i, r in enumerate(rollouts):
                    env_name = getattr(r, "env_name", None)
                    if not isinstance(env_name, str):
                        raise ValueError(f"{where}.rollouts[{i}]: env_name must be a str, not {_short(env_name)}")
                advantages = self._advantages(rollouts, where)
                meta = getattr(group, "metadata", None)
                # Marin's newer rollouts carry the ids in their own metadata; the group's
                # win where both are given, as in Marin.
                own = getattr(rollouts[0], "metadata", None)
                group_id = _given(getattr(meta, "group_id", None), getattr(own, "group_id", None))
                lesson_id = _given(getattr(meta, "lesson_id", None), getattr(own, "lesson_id", None))
                try:
                    hash(group_id)
                except TypeError:
                    raise ValueError(f"{where}: metadata.group_id must be hashable (a str), not {_short(group_id)}") from None
                staged.setdefault(env_name, []).append(
                    (rollouts, advantages, w_step, group_id, lesson_id, steps, stamps)
                )
        return accepted, staged

    def _advantages(self, rollouts: list, where: str) -> np.ndarray:
        """The loss module's advantages for one group, one finite number per rollout."""
        got = self.loss_module.compute_advantages(rollouts)
        try:
            adv = np.asarray(got, dtype=np.float64)
        except (TypeError, ValueError):
            adv = None
        if adv is None or adv.shape != (len(rollouts),) or not np.isfinite(adv).all():
            raise ValueError(
                f"{where}: loss_module.compute_advantages must give {len(rollouts)} finite numbers "
                f"(one per rollout), not {_short(got)}"
            )
        return adv

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
        name = names[0]
        with self._undone_if_failed(lambda: f"environment {name!r} ({len(self._envs[name])} rollouts)"):
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
            drawn = []
            for label in order:
                name = names[label]
                env = self._envs[name]
                p = self._recency_p(len(env))
                drawn.append((name, env, self._rng.choice(len(env), p=p, size=counts[label], replace=False)))
        out = []
        for name, env, rows in drawn:
            env.usage[rows] += 1
            out.extend((name, int(r)) for r in rows)
        return out

    @contextlib.contextmanager
    def _undone_if_failed(self, what: Callable[[], str]) -> Iterator[None]:
        """A draw that fails (recency weights that overflow or vanish: (i + 1) ** alpha
        past 1e308 for a large alpha) leaves the generator as it was (the caller counts
        uses only after) and says which alpha and what (``what()``); it used to count the
        uses of the environments drawn before the failing one, move the generator on and
        blame "probabilities"."""
        state = self._rng.bit_generator.state
        try:
            yield
        except ValueError as e:
            self._rng.bit_generator.state = state
            raise ValueError(
                f"alpha={self.alpha}: the recency weights (i + 1) ** alpha of {what()} cannot be "
                f"drawn from ({e}); nothing was drawn"
            ) from None

    def _recency_p(self, n: int) -> np.ndarray:
        """The recency weights of ``n`` as probabilities (NaN where they overflow, which
        the draw then refuses)."""
        weights = self._recency(n)
        with np.errstate(invalid="ignore"):
            return weights / weights.sum()

    def _recency(self, n: int) -> np.ndarray:
        """``(i + 1) ** alpha`` for ``i < n``: a slice of a table kept across calls (the
        power is most of a draw's cost at large capacities). Elementwise equal to
        computing it afresh, so the draws stay Marin's."""
        if len(self._weights) < n:
            size = max(n, 2 * len(self._weights), 1024)
            # The table runs past n, where a large alpha overflows to inf: no error unless
            # a draw reads it (and then the draw says so).
            with np.errstate(over="ignore"):
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
                key = env.group_keys[r]
                out.append(StoredTrajectory(
                    trajectory=env.items[r].rollout,
                    group_id=self._groups.id_of(key),
                    group=self._groups.record(key),
                    usage_count=int(env.usage[r]),
                ))
            self._retire()
            self._total_batches_sampled += 1
            return out

    def sample_groups(self, min_trajectories: Optional[int] = None) -> Optional[List[GroupRecord]]:
        """Whole groups, as Marin's newest ``sample_groups``: groups are picked until
        they hold at least ``min_trajectories`` rollouts (``local_batch_size`` by
        default), each pick an environment drawn in proportion to the rollouts of its
        groups not yet picked, then one of those groups with weight ``(j + 1) ** alpha``
        by the order of their newest rollouts; every member of a picked group counts a
        use, and members used ``max_samples`` times retire after the draw. ``None`` when
        the groups stored hold fewer rollouts than that. Draw for draw Marin's calls on
        the generator. It had drawn single rollouts and returned their groups, counting
        a use only on the members drawn: with ``max_samples=1`` a rollout came back three
        times."""
        target = self.local_batch_size if min_trajectories is None else checks.count(
            "min_trajectories", min_trajectories, 1)
        with self._cond:
            # Per environment: its groups in the order of their newest rows, and each
            # group's rows there (its number names its environment too).
            available: Dict[str, List[int]] = {}
            rows: Dict[int, List[int]] = {}
            for name, env in self._envs.items():
                newest: Dict[int, int] = {}
                for row, key in enumerate(env.group_keys.tolist()):
                    newest[key] = row
                    rows.setdefault(key, []).append(row)
                available[name] = sorted(newest, key=newest.__getitem__)
            size = {key: len(r) for key, r in rows.items()}
            if sum(size.values()) < target:
                return None
            picked: List[int] = []
            n = 0
            name = ""
            with self._undone_if_failed(lambda: f"the groups of environment {name!r}"):
                while n < target:
                    envs = [e for e, keys in available.items() if keys]
                    counts = np.array([sum(size[key] for key in available[e]) for e in envs])
                    # Marin draws from a list of env names, one per rollout: the same call
                    # on positions.
                    k = int(self._rng.choice(int(counts.sum())))
                    name = envs[int(np.searchsorted(np.cumsum(counts), k, side="right"))]
                    keys = available[name]
                    key = keys.pop(int(self._rng.choice(len(keys), p=self._recency_p(len(keys)))))
                    picked.append(key)
                    n += size[key]
            out = [self._groups.record(key) for key in picked]
            for key in picked:
                self._envs[self._groups.env_of(key)].usage[rows[key]] += 1
            self._retire()
            self._total_batches_sampled += 1
            return out

    @property
    def rollout_storage(self) -> Dict[str, List[StoredTrajectory]]:
        """Marin's attribute, as a snapshot: per environment, its stored rollouts oldest
        first, each with its group and uses (changing the snapshot changes nothing)."""
        with self._cond:
            # One record per group, shared by its members' entries: a record per entry
            # made a snapshot cost rollouts x group size (4 s for one group of 16K).
            records: Dict[int, GroupRecord] = {}
            for env in self._envs.values():
                for key in env.group_keys.tolist():
                    if key not in records:
                        records[key] = self._groups.record(key)
            return {
                name: [
                    StoredTrajectory(trajectory=item.rollout, group_id=records[key].group_id, group=records[key],
                                     usage_count=int(uses))
                    for item, key, uses in zip(env.items.tolist(), env.group_keys.tolist(), env.usage.tolist())
                ]
                for name, env in self._envs.items()
            }

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

    def wait_for_batch(self, timeout: Optional[float], sample: Optional[Any] = None) -> Optional[List[Any]]:
        """:meth:`sample_rollouts` (or ``sample``, another of the sampling methods),
        waiting up to ``timeout`` seconds for enough rollouts (woken by
        :meth:`add_batches`, not by polling); ``None`` or infinity waits until there are.
        A NaN timeout is a ``ValueError`` (it waited forever)."""
        return self._wait_for(timeout, sample, None)

    def _wait_for(
        self, timeout: Optional[float], sample: Optional[Any], ended: Optional[Callable[[], bool]]
    ) -> Optional[List[Any]]:
        """:meth:`wait_for_batch`, returning ``None`` without drawing once ``ended()``
        (read under the lock; whoever makes it true notifies the condition)."""
        timeout = checks.timeout(timeout)
        deadline = None if timeout is None else time.monotonic() + timeout
        sample = sample or self.sample_rollouts
        with self._cond:
            while True:
                if ended is not None and ended():
                    return None
                batch = sample()
                if batch is not None:
                    return batch
                if deadline is None:
                    self._cond.wait()
                    continue
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                # In slices: a wait past the platform's time_t (1e300 s) is an
                # OverflowError.
                self._cond.wait(min(left, _WAIT_SLICE))


# The longest single wait on the condition (seconds); a longer timeout waits again.
_WAIT_SLICE = 3600.0


def _given(first: Any, second: Any) -> Any:
    """``first`` unless it is absent (None or ""), else ``second``: an id of 0 is an id
    (``or`` replaced it)."""
    return second if first is None or (isinstance(first, str) and not first) else first


def _short(value: Any) -> str:
    """A value for an error message: its type and a repr cut short."""
    text = repr(value)
    return f"{type(value).__name__} {text[:60] + '...' if len(text) > 60 else text}"


def _name(rollout: Any) -> str:
    return f"env {getattr(rollout, 'env_name', None)!r}, example {getattr(rollout, 'env_example_id', None)!r}"


def _rollouts_of(group: Any, where: str) -> list:
    if not hasattr(group, "rollouts"):
        raise ValueError(f"{where} is no rollout group (it has no `rollouts`): {_short(group)}")
    return list(group.rollouts or [])


def _when(rollout: Any, where: str) -> tuple:
    """A rollout's ``metadata.weight_step`` (an int within int64, as its column stores
    it) and ``metadata.timestamp`` (a finite number)."""
    meta = getattr(rollout, "metadata", None)
    w_step = checks.integer(getattr(meta, "weight_step", None))
    if w_step is None or not checks.INT64_MIN <= w_step <= checks.INT64_MAX:
        raise ValueError(
            f"{where} ({_name(rollout)}): metadata.weight_step must be an int that fits int64, "
            f"not {_short(getattr(meta, 'weight_step', None))}"
        )
    stamp = checks.real(getattr(meta, "timestamp", None))
    if stamp is None or not math.isfinite(stamp):
        raise ValueError(
            f"{where} ({_name(rollout)}): metadata.timestamp must be a finite number, "
            f"not {_short(getattr(meta, 'timestamp', None))}"
        )
    return w_step, stamp


def _read_rollouts(rollouts: list, where: str) -> tuple:
    """One group's rewards, weight steps and timestamps as arrays, every value checked: a
    NaN or None reward made every advantage of its group NaN, and a weight step past int64
    failed the store half done."""
    # The common case in bulk (plain Python or numpy numbers, finite, in range); anything
    # else goes one by one below, which names the rollout at fault. (A sum that
    # overflows is no error: the slow path then checks each value.)
    try:
        rewards = list(map(_REWARD, rollouts))
        metas = list(map(_META, rollouts))
        steps = list(map(_STEP, metas))
        stamps = list(map(_STAMP, metas))
    except AttributeError:
        pass
    else:
        try:
            bulk = (
                set(map(type, rewards)) <= _REALS
                and set(map(type, stamps)) <= _REALS
                and set(map(type, steps)) <= _INTS
                and math.isfinite(sum(rewards))
                and math.isfinite(sum(stamps))
                and _INT64_RANGE[0] <= min(steps)
                and max(steps) <= _INT64_RANGE[1]
            )
        except OverflowError:  # an int past a float's range
            bulk = False
        if bulk:
            return np.array(rewards, np.float64), np.array(steps, np.int64), np.array(stamps, np.float64)
    out = (np.empty(len(rollouts), np.float64), np.empty(len(rollouts), np.int64), np.empty(len(rollouts), np.float64))
    for i, r in enumerate(rollouts):
        value = getattr(r, "episode_reward", None)
        reward = checks.real(value)
        if reward is None or not math.isfinite(reward):
            raise ValueError(
                f"{where}.rollouts[{i}] ({_name(r)}): episode_reward must be a finite number, not {_short(value)}"
            )
        out[0][i] = reward
        out[1][i], out[2][i] = _when(r, f"{where}.rollouts[{i}]")
    return out


# What _read_rollouts reads, and the types it takes in bulk (never bool: it is no reward
# nor step).
_REWARD = operator.attrgetter("episode_reward")
_META = operator.attrgetter("metadata")
_STEP = operator.attrgetter("weight_step")
_STAMP = operator.attrgetter("timestamp")
_REALS = {float, int, np.float64, np.float32, np.int64, np.int32}
_INTS = {int, np.int64, np.int32}
_INT64_RANGE = (checks.INT64_MIN, checks.INT64_MAX)


# Marin's loader, beside the buffer it feeds (imported last: it names the buffer's types).
from .loader import ReplayDataLoader  # noqa: E402
