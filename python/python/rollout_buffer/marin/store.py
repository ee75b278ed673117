"""The replay buffer's storage: per environment, its rollouts in insertion order with their
uses, weight steps and timestamps as numpy columns (so freshness, retirement and
eviction are array operations), and the groups' surviving members. The buffer's lock
guards all of it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence

import numpy as np

from .types import GroupRecord, RolloutWithCount


@dataclass(frozen=True)
class GroupKey:
    """A stored group: its environment and id (a group id may recur in another
    environment, and is another group there). A group given no id gets a number of its
    own (``made``): it reads ``"<env>/<n>"`` but is never the group of a later batch whose
    own id is that text."""

    env: str
    id: Any
    made: bool = False


class GroupIndex:
    """Each stored group's lesson and surviving members, by :class:`GroupKey`."""

    def __init__(self) -> None:
        self._members: Dict[GroupKey, List[RolloutWithCount]] = {}
        self._lessons: Dict[GroupKey, Optional[str]] = {}
        self._next = 0

    def open(self, env: str, group_id: Any, lesson_id: Optional[str]) -> GroupKey:
        """The key a new group is stored under (its own id, else a fresh one); a group id
        seen before in the same environment gathers its members in one record."""
        if group_id is None:
            key = GroupKey(env, f"{env}/{self._next}", made=True)
            self._next += 1
        else:
            key = GroupKey(env, group_id)
        self._members.setdefault(key, [])
        self._lessons.setdefault(key, lesson_id)
        return key

    def add(self, key: GroupKey, item: RolloutWithCount) -> None:
        self._members[key].append(item)

    def remove(self, key: GroupKey, item: RolloutWithCount) -> None:
        members = self._members.get(key)
        if members is None:
            return
        for i, m in enumerate(members):
            if m is item:
                del members[i]
                break
        if not members:
            del self._members[key]
            del self._lessons[key]

    def record(self, key: GroupKey) -> GroupRecord:
        """The group as it stands: its surviving members' rollouts."""
        members = self._members.get(key, [])
        return GroupRecord(key.id, self._lessons.get(key), [m.rollout for m in members])


def _objects(items: Sequence[Any]) -> np.ndarray:
    out = np.empty(len(items), dtype=object)
    out[:] = items
    return out


class EnvRollouts:
    """One environment's rollouts, oldest first, as columns: the items and their groups'
    keys in object arrays (so keeping a subset is one array operation, not a Python loop over
    every stored rollout), uses, weight steps and timestamps in numeric ones."""

    def __init__(self) -> None:
        self.items = _objects([])
        self.group_keys = _objects([])
        self.usage = np.zeros(0, np.int64)
        self.steps = np.zeros(0, np.int64)
        self.stamps = np.zeros(0, np.float64)

    def __len__(self) -> int:
        return len(self.items)

    def extend(self, groups_in: Sequence[tuple], groups: GroupIndex) -> int:
        """Appends groups, each ``(rollouts, advantages, weight_step, group key, steps,
        stamps)`` as the buffer checked them (advantages, steps and stamps one per
        rollout), with one concatenation per column (not one per group); returns how many
        rollouts it added. Nothing here can fail halfway: it runs under the buffer's lock,
        after every check."""
        new: List[RolloutWithCount] = []
        keys: List[GroupKey] = []
        steps: List[np.ndarray] = [self.steps]
        stamps: List[np.ndarray] = [self.stamps]
        for rollouts, advantages, weight_step, key, group_steps, group_stamps in groups_in:
            for r, a in zip(rollouts, advantages.tolist()):
                item = RolloutWithCount(rollout=r, advantage=a, usage_count=0, weight_step=weight_step)
                groups.add(key, item)
                new.append(item)
            keys.extend([key] * len(rollouts))
            steps.append(group_steps)
            stamps.append(group_stamps)
        n = len(new)
        self.items = np.concatenate([self.items, _objects(new)])
        self.group_keys = np.concatenate([self.group_keys, _objects(keys)])
        self.usage = np.concatenate([self.usage, np.zeros(n, np.int64)])
        self.steps = np.concatenate(steps)
        self.stamps = np.concatenate(stamps)
        return n

    def trim(self, capacity: int, groups: GroupIndex) -> int:
        """Keeps the newest ``capacity``; returns how many left."""
        over = len(self.items) - capacity
        if over <= 0:
            return 0
        keep = np.ones(len(self.items), bool)
        keep[:over] = False
        return self.keep(keep, groups)

    def keep(self, mask: np.ndarray, groups: GroupIndex) -> int:
        """Keeps the rows where ``mask`` holds, taking the others out of their groups;
        returns how many left."""
        removed = int(len(mask) - np.count_nonzero(mask))
        if removed == 0:
            return 0
        gone = ~mask
        for key, item in zip(self.group_keys[gone].tolist(), self.items[gone].tolist()):
            groups.remove(key, item)
        self.items = self.items[mask]
        self.group_keys = self.group_keys[mask]
        self.usage = self.usage[mask]
        self.steps = self.steps[mask]
        self.stamps = self.stamps[mask]
        return removed

    def entry(self, row: int) -> RolloutWithCount:
        item = self.items[row]
        item.usage_count = int(self.usage[row])
        return item
