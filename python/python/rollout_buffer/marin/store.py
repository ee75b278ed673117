"""The replay buffer's storage: per environment, its rollouts in insertion order with their
uses, weight steps and timestamps as numpy columns (so freshness, retirement and
eviction are array operations), and the groups' surviving members. The buffer's lock
guards all of it."""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence

import numpy as np

from .types import GroupRecord, RolloutWithCount


class GroupIndex:
    """Each stored group's environment, id, lesson and surviving members, by the number
    it was given when it was opened. A group is its environment and its id: an id may
    recur in another environment, and is another group there. A group given no id gets a
    made-up one, ``"<env>/<n>"``, which never meets a later group whose own id is that
    text. Numbers, not (environment, id) keys, are what the rollouts' columns hold: a
    draw's pass over every stored row hashes them at an int's cost (a key object's hash,
    in Python, made that pass four times slower)."""

    def __init__(self) -> None:
        # (env, id, made up) -> number, and number -> [that triple, lesson, members].
        self._numbers: Dict[tuple, int] = {}
        self._groups: Dict[int, list] = {}
        self._next_number = 0
        self._next_made = 0

    def open(self, env: str, group_id: Any, lesson_id: Optional[str]) -> int:
        """The number a new group is stored under; a group id seen before in the same
        environment gathers its members in one record."""
        if group_id is None:
            ident = (env, f"{env}/{self._next_made}", True)
            self._next_made += 1
        else:
            ident = (env, group_id, False)
        number = self._numbers.get(ident)
        if number is None:
            number = self._numbers[ident] = self._next_number
            self._next_number += 1
            self._groups[number] = [ident, lesson_id, []]
        return number

    def env_of(self, number: int) -> str:
        return self._groups[number][0][0]

    def id_of(self, number: int) -> Any:
        return self._groups[number][0][1]

    def add(self, number: int, item: RolloutWithCount) -> None:
        self._groups[number][2].append(item)

    def remove(self, number: int, item: RolloutWithCount) -> None:
        group = self._groups.get(number)
        if group is None:
            return
        members = group[2]
        for i, m in enumerate(members):
            if m is item:
                del members[i]
                break
        if not members:
            del self._groups[number]
            del self._numbers[group[0]]

    def record(self, number: int) -> GroupRecord:
        """The group as it stands: its surviving members' rollouts."""
        group = self._groups.get(number)
        if group is None:
            return GroupRecord(None, None, [])
        ident, lesson, members = group
        return GroupRecord(ident[1], lesson, [m.rollout for m in members])


def _objects(items: Sequence[Any]) -> np.ndarray:
    out = np.empty(len(items), dtype=object)
    out[:] = items
    return out


class EnvRollouts:
    """One environment's rollouts, oldest first, as columns: the items in an object array
    and their groups' numbers in an int one (so keeping a subset is one array operation, not a Python loop over
    every stored rollout), uses, weight steps and timestamps in numeric ones."""

    def __init__(self) -> None:
        self.items = _objects([])
        self.group_keys = np.zeros(0, np.int64)
        self.usage = np.zeros(0, np.int64)
        self.steps = np.zeros(0, np.int64)
        self.stamps = np.zeros(0, np.float64)

    def __len__(self) -> int:
        return len(self.items)

    def extend(self, groups_in: Sequence[tuple], groups: GroupIndex) -> int:
        """Appends groups, each ``(rollouts, advantages, weight_step, group number, steps,
        stamps)`` as the buffer checked them (advantages, steps and stamps one per
        rollout), with one concatenation per column (not one per group); returns how many
        rollouts it added. Nothing here can fail halfway: it runs under the buffer's lock,
        after every check."""
        new: List[RolloutWithCount] = []
        keys: List[int] = []
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
        self.group_keys = np.concatenate([self.group_keys, np.array(keys, np.int64)])
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
