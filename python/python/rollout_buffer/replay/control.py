"""The control state a restart must not lose: batches and their leases, acks, the step ->
batch map, uses per group, the redelivery queue, exits and the policy version.

It changes only by events (dicts), applied by :meth:`Control.apply` both live and when the
log is replayed, so a recovered state is the state that was logged. Events:

- ``{"e": "lease", "b": id, "g": [group ids], "ts": t, "step": s or None}``
- ``{"e": "ack", "b": id, "s": "ok" | "failed"}``: ``ok`` counts a use of each group;
  ``failed`` puts them at the end of the redelivery queue.
- ``{"e": "expire", "b": id}``: a lease past its timeout, returned as ``failed`` is.
- ``{"e": "exit", "g": [group ids], "r": reason}``: groups that left (consumed, evicted,
  retention).
- ``{"e": "version", "v": n}``: the trainer's policy version.
"""

from __future__ import annotations

import collections
from typing import Optional

# Settled batches kept (so a retried ack stays a no-op, and `next_batch` of a recent step
# gives its batch back); older ones are dropped from snapshots.
KEEP_SETTLED = 4096


class Control:
    def __init__(self) -> None:
        self.batches: dict = {}  # id -> {"g", "ts", "step", "s"} in lease order
        self.open: dict = {}  # id -> lease ts, for batches not settled, oldest first
        self.leased: dict = {}  # group id -> batch id
        self.steps: dict = {}  # step -> batch id
        self.uses: collections.Counter = collections.Counter()
        self.redeliver: dict = {}  # group id -> None, in queue order
        self.exited: dict = {}  # group id -> reason
        # Exits not yet in an exits file: each snapshot writes only these (see
        # `ControlLog.snapshot`), so a snapshot's size follows the live state, not every
        # group the run ever consumed.
        self.fresh_exits: dict = {}
        self.version: Optional[int] = None
        self.counter = 0

    def next_batch_id(self) -> str:
        return f"b-{self.counter + 1:010d}"

    def apply(self, e: dict) -> None:
        kind = e["e"]
        if kind == "lease":
            bid = e["b"]
            self.counter = max(self.counter, int(bid[2:]))
            self.batches[bid] = {"g": e["g"], "ts": e["ts"], "step": e["step"], "s": None}
            if e["g"]:
                self.open[bid] = e["ts"]
                if e["step"] is not None:
                    self.steps[e["step"]] = bid
            else:
                self.batches[bid]["s"] = "ok"
            for g in e["g"]:
                self.leased[g] = bid
                self.redeliver.pop(g, None)
        elif kind == "ack":
            self._settle(e["b"], e["s"])
        elif kind == "expire":
            self._settle(e["b"], "expired")
        elif kind == "exit":
            for g in e["g"]:
                self.exited[g] = e["r"]
                self.fresh_exits[g] = e["r"]
                self.uses.pop(g, None)
                self.redeliver.pop(g, None)
                self.leased.pop(g, None)
        elif kind == "version":
            self.version = e["v"]
        else:
            raise ValueError(f"unknown control event {kind!r}")

    def _settle(self, bid: str, status: str) -> None:
        b = self.batches.get(bid)
        if b is None:
            return
        was = b["s"]
        b["s"] = status
        self.open.pop(bid, None)
        for g in b["g"]:
            if g in self.exited:
                continue
            if self.leased.get(g) == bid:
                del self.leased[g]
            if status == "ok":
                self.uses[g] += 1
                self.redeliver.pop(g, None)
            elif was is None and g not in self.leased:
                self.redeliver[g] = None

    def snapshot(self) -> dict:
        """The state to store, after dropping the settled batches past the last
        :data:`KEEP_SETTLED`, here too, so a step's batch is kept as long before a restart
        as after. Empty batches (a draw that found nothing ready) are counted apart: a
        trainer polling an empty buffer had pushed real steps out of the window, and after
        a restart ``next_batch`` drew anew for a step that had its batch."""
        drop: set = set()
        for empty in (False, True):
            settled = [b for b, v in self.batches.items()
                       if v["s"] is not None and (not v["g"]) == empty]
            drop.update(settled[: max(0, len(settled) - KEEP_SETTLED)])
        for b in drop:
            del self.batches[b]
        self.steps = {s: b for s, b in self.steps.items() if b in self.batches}
        return {
            "batches": self.batches,
            "steps": {str(s): b for s, b in self.steps.items()},
            "uses": dict(self.uses),
            "redeliver": list(self.redeliver),
            "version": self.version,
            "counter": self.counter,
        }

    @classmethod
    def restore(cls, snap: Optional[dict], events: list, exits: Optional[dict] = None) -> "Control":
        """The state of ``snap`` (or an empty one), the exits files written up to it
        (``exits``), then ``events``."""
        c = cls()
        c.exited = dict(exits or {})
        if snap is not None:
            c.batches = snap["batches"]
            for bid, b in c.batches.items():
                if b["s"] is None:
                    c.open[bid] = b["ts"]
                    for g in b["g"]:
                        c.leased[g] = bid
            c.steps = {int(s): b for s, b in snap["steps"].items()}
            c.uses = collections.Counter(snap["uses"])
            c.redeliver = dict.fromkeys(snap["redeliver"])
            # A snapshot written before exits had files of their own holds them all: they
            # go to the next snapshot's exits file, before that snapshot deletes this one.
            c.exited.update(snap.get("exited", {}))
            c.fresh_exits = dict(snap.get("exited", {}))
            c.version = snap["version"]
            c.counter = snap["counter"]
        for e in events:
            c.apply(e)
        return c
