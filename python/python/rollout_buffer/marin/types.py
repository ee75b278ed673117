"""Stand-ins for Marin's rollout types (``marin.rl.types``) and its RLOO advantage, for
code that does not install Marin (no JAX, no equinox). Marin's own classes work wherever
these do: the buffer reads only ``env_name``, ``env_example_id``, ``episode_reward`` and
``metadata.weight_step`` / ``metadata.timestamp`` of a rollout, ``rollouts`` (and an
optional ``metadata`` with ``group_id`` / ``lesson_id``) of a group, and ``groups`` of a
batch.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, List, Optional, Sequence

import numpy as np


@dataclass(frozen=True)
class RolloutMetadata:
    """When and where rollouts were made: the worker, the wall-clock time and the trainer
    step of the weights (``-1`` for the bootstrap weights); Marin's newer rollouts also
    name their lesson and group here."""

    worker_id: str = ""
    timestamp: float = 0.0
    weight_step: int = -1
    lesson_id: Optional[str] = None
    group_id: Optional[str] = None
    # Marin's newer revisions' fields, kept as given (the buffer reads none of them).
    run_id: Optional[str] = None
    trace_id: Optional[str] = None
    task_name: Optional[str] = None
    task_version: Optional[str] = None
    verifier_name: Optional[str] = None
    verifier_version: Optional[str] = None
    trace_ref: Optional[str] = None


@dataclass(eq=False)
class Rollout:
    """One prompt and one response, as Marin's ``Rollout``."""

    env_name: str
    env_example_id: str
    prompt_tokens: Any
    response_tokens: Any
    response_logprobs: Any
    token_rewards: Any
    episode_reward: float
    is_truncated: bool = False
    metadata: RolloutMetadata = field(default_factory=RolloutMetadata)
    correctness_reward: Optional[float] = None
    # The sampling settings, as one revision or another of Marin names them: `temperature`
    # and `top_k`, or a `decoding` trace. Kept as given.
    temperature: Optional[float] = None
    top_k: Optional[int] = None
    decoding: Any = None


@dataclass(eq=False)
class RolloutGroup:
    """The responses to one prompt."""

    rollouts: List[Any]
    metadata: Any = None


@dataclass(eq=False)
class RolloutBatch:
    """What a rollout worker writes at once."""

    groups: List[Any]
    metadata: RolloutMetadata = field(default_factory=RolloutMetadata)


@dataclass(eq=False)
class RolloutWithCount:
    """A stored rollout: its advantage (computed once, at ingestion), how often it was
    sampled, and the weight step of its batch."""

    rollout: Any
    advantage: float
    usage_count: int = 0
    weight_step: int = 0


@dataclass(eq=False)
class GroupRecord:
    """A group as the newer API returns it: its id, lesson, and the members still stored
    when it was sampled (capacity eviction and staleness remove members)."""

    group_id: str
    lesson_id: Optional[str]
    trajectories: List[Any]


@dataclass(eq=False)
class StoredTrajectory:
    """One sampled rollout with its group, as the newer API's ``sample_sequences``
    returns it (no advantage: compute it at training time, e.g. with
    :func:`rloo_advantages` over ``group.trajectories``)."""

    trajectory: Any
    group_id: str
    group: GroupRecord
    usage_count: int = 0


def rloo_advantages(rewards: Sequence[float]) -> np.ndarray:
    """Marin's RLOO: ``r_i`` minus the mean of the others' rewards; zeros for a group of
    one or none."""
    r = np.asarray(rewards, dtype=np.float64)
    n = len(r)
    if n <= 1:
        return np.zeros(n)
    return r - (r.sum() - r) / (n - 1)


class RLOO:
    """The default loss module: ``compute_advantages(rollouts)`` is RLOO over their
    episode rewards."""

    def compute_advantages(self, rollouts: Sequence[Any]) -> np.ndarray:
        return rloo_advantages([r.episode_reward for r in rollouts])
