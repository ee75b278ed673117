"""The replay buffer's storage: per environment, its rollouts in insertion order with their
uses, weight steps and timestamps as numpy columns (so freshness, retirement and
eviction are array operations), and the groups' surviving members. The buffer's lock
guards all of it."""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence

import numpy as np

from .types import GroupRecord, RolloutWithCount


class GroupIndex:
    """Each stored group's id, lesson and surviving members."""

    def __init__(self) -> None:
        self._members: Dict[str, List[RolloutWithCount]] = {}
        self._lessons: Dict[str, Optional[str]] = {}
        self._next = 0

    def open(self, env: str, group_id: Optional[str], lesson_id: Optional[str]) -> str:
        """The id a new group is stored under (its own, else a fresh one); a group id seen
        before gathers its members in one record."""
        if group_id is None:
            group_id = f"{env}/{self._next}"
            self._next += 1
        self._members.setdefault(group_id, [])
        self._lessons.setdefault(group_id, lesson_id)
        return group_id

    def add(self, gid: str, item: RolloutWithCount) -> None:
        self._members[gid].append(item)

    def remove(self, gid: str, item: RolloutWithCount) -> None:
        members = self._members.get(gid)
        if members is None:
            return
        for i, m in enumerate(members):
            if m is item:
                del members[i]
                break
        if not members:
            del self._members[gid]
            del self._lessons[gid]

    def record(self, gid: str) -> GroupRecord:
        """The group as it stands: its surviving members' rollouts."""
        members = self._members.get(gid, [])
        return GroupRecord(gid, self._lessons.get(gid), [m.rollout for m in members])


def _objects(items: Sequence[Any]) -> np.ndarray:
    out = np.empty(len(items), dtype=object)
    out[:] = items
    return out


class EnvRollouts:
    """One environment's rollouts, oldest first, as columns: the items and their group ids
    in object arrays (so keeping a subset is one array operation, not a Python loop over
    every stored rollout), uses, weight steps and timestamps in numeric ones."""

    def __init__(self) -> None:
        self.items = _objects([])
        self.group_ids = _objects([])
        self.usage = np.zeros(0, np.int64)
        self.steps = np.zeros(0, np.int64)
        self.stamps = np.zeros(0, np.float64)

    def __len__(self) -> int:
        return len(self.items)

    def extend(self, groups_in: Sequence[tuple], groups: GroupIndex) -> int:
        """Appends groups, each ``(rollouts, advantages, weight_step, group id, steps,
        stamps)`` as the buffer checked them (advantages, steps and stamps one per
        rollout), with one concatenation per column (not one per group); returns how many
        rollouts it added. Nothing here can fail halfway: it runs under the buffer's lock,
        after every check."""
        new: List[RolloutWithCount] = []
        gids: List[str] = []
        steps: List[np.ndarray] = [self.steps]
        stamps: List[np.ndarray] = [self.stamps]
        for rollouts, advantages, weight_step, gid, group_steps, group_stamps in groups_in:
            for r, a in zip(rollouts, advantages.tolist()):
                item = RolloutWithCount(rollout=r, advantage=a, usage_count=0, weight_step=weight_step)
                groups.add(gid, item)
                new.append(item)
            gids.extend([gid] * len(rollouts))
            steps.append(group_steps)
            stamps.append(group_stamps)
        n = len(new)
        self.items = np.concatenate([self.items, _objects(new)])
        self.group_ids = np.concatenate([self.group_ids, _objects(gids)])
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
        for gid, item in zip(self.group_ids[gone].tolist(), self.items[gone].tolist()):
            groups.remove(gid, item)
        self.items = self.items[mask]
        self.group_ids = self.group_ids[mask]
        self.usage = self.usage[mask]
        self.steps = self.steps[mask]
        self.stamps = self.stamps[mask]
        return removed

    def entry(self, row: int) -> RolloutWithCount:
        item = self.items[row]
        item.usage_count = int(self.usage[row])
        return item
