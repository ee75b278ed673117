"""Marin's ``ReplayDataLoader``: a thread that moves what a rollout reader has into a
:class:`~rollout_buffer.marin.ReplayBuffer`, and gets that wait on the buffer. The gets
waiting when :meth:`ReplayDataLoader.stop` runs are ended through the buffer's own lock
and condition (a counter of stops, read under that lock)."""

from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING, Any, List, Optional

from . import checks
from .types import GroupRecord, RolloutWithCount, StoredTrajectory

if TYPE_CHECKING:
    from . import ReplayBuffer

logger = logging.getLogger("rollout_buffer.marin")


class ReplayDataLoader:
    """Marin's ``ReplayDataLoader``: a background thread moves what the reader has into
    the buffer every ``rollout_fetch_interval`` seconds; :meth:`get_rollouts` waits on
    the buffer. Use it as a context manager, or :meth:`start` / :meth:`stop`."""

    def __init__(self, rollout_reader: Any, replay_buffer: ReplayBuffer, rollout_fetch_interval: float = 1.0):
        self.rollout_reader = rollout_reader
        self.replay_buffer = replay_buffer
        # Checked here, not in the thread: a NaN, 0 or negative interval spun the loop
        # at full CPU, None read once and never again, and a string or infinity killed
        # the thread, after which get_rollouts only ever timed out.
        self.rollout_fetch_interval = checks.number("rollout_fetch_interval", rollout_fetch_interval, positive=True)
        self._thread: Optional[threading.Thread] = None
        self._stop = threading.Event()
        # Bumped by each stop() under the buffer's lock: the gets waiting then return None.
        self._stops = 0
        # Set by stop(), cleared by start(): a get on a stopped loader does not wait.
        self._stopped = False

    def start(self) -> None:
        if self._thread is not None:
            if self._thread.is_alive():
                raise RuntimeError("ReplayDataLoader already running (or still stopping)")
            self._thread = None
        self._stop.clear()
        with self.replay_buffer._cond:
            self._stopped = False
        self._thread = threading.Thread(target=self._loop, name="replay-data-loader", daemon=True)
        self._thread.start()

    # How long stop() waits for the thread (seconds), as Marin's.
    _join_timeout = 5.0

    def stop(self) -> None:
        """Stops the thread, and ends the gets waiting now: they return ``None`` without
        drawing (a ``get_rollouts(None)`` waited on after the loader was gone, and a thread
        left waiting by a cancelled asyncio task drew the next batch for nobody, its uses
        counted)."""
        buf = self.replay_buffer
        with buf._cond:
            self._stops += 1
            self._stopped = True
            buf._cond.notify_all()
        if self._thread is not None:
            self._stop.set()
            self._thread.join(timeout=self._join_timeout)
            # A thread still inside the reader after 5 s is kept: forgetting it let start()
            # run a second loop beside it, two threads reading one reader at once.
            if not self._thread.is_alive():
                self._thread = None

    def get_rollouts(self, timeout: Optional[float] = 5.0) -> Optional[List[RolloutWithCount]]:
        """The next batch, or ``None`` after ``timeout`` seconds without enough rollouts
        (see :meth:`ReplayBuffer.wait_for_batch`), or when :meth:`stop` is called."""
        return self._wait(timeout, None)

    def get_trajectories(self, timeout: Optional[float] = 5.0) -> Optional[List[StoredTrajectory]]:
        """Marin's newer name: a :meth:`ReplayBuffer.sample_sequences` batch, waiting as
        :meth:`get_rollouts` does."""
        return self._wait(timeout, self.replay_buffer.sample_sequences)

    def get_groups(self, timeout: Optional[float] = 5.0) -> Optional[List[GroupRecord]]:
        """Whole groups (:meth:`ReplayBuffer.sample_groups`), waiting as
        :meth:`get_rollouts` does."""
        return self._wait(timeout, self.replay_buffer.sample_groups)

    def _wait(self, timeout: Optional[float], sample: Optional[Any]) -> Optional[List[Any]]:
        buf = self.replay_buffer
        timeout = checks.timeout(timeout)
        with buf._cond:
            stops = self._stops
            if self._stopped:
                # Nothing comes from a stopped loader: what is ready is served, and a get
                # that would wait returns None at once (with no timeout, it waited forever).
                timeout = 0.0
        return buf._wait_for(timeout, sample, lambda: self._stops != stops)

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                batches = self.rollout_reader.read_all_available()
                if batches:
                    self._add(list(batches))
            except Exception:  # a bad read must not end the loader (Marin's behaviour)
                logger.exception("ReplayDataLoader: reading or adding rollouts failed")
            # Event.wait refuses a timeout past TIMEOUT_MAX (OverflowError, about 292 years
            # on Linux), which ended the thread after its first read.
            self._stop.wait(min(self.rollout_fetch_interval, threading.TIMEOUT_MAX))

    def _add(self, batches: list) -> None:
        """Adds what one read gave. ``add_batches`` takes all of a call or none, and the
        reader has handed the batches over: one refused batch made the loader drop every
        good batch of its read. A refused read is added again batch by batch, and only
        the batches refused alone are logged and dropped."""
        try:
            self.replay_buffer.add_batches(batches)
            return
        except Exception:  # a loss module may raise anything
            if len(batches) == 1:
                raise
        for i, batch in enumerate(batches):
            try:
                self.replay_buffer.add_batches([batch])
            except Exception as e:  # noqa: BLE001 - logged, the other batches kept
                logger.error("ReplayDataLoader: batch %d of the %d read dropped: %s", i, len(batches), e)

    def __enter__(self) -> "ReplayDataLoader":
        self.start()
        return self

    def __exit__(self, *exc) -> bool:
        self.stop()
        return False
