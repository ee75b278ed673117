"""Spec 000's replay buffer: grouped rollouts on Parquet, drawn deterministically, with
durable leases, acks and a step -> batch map, in-process or as Ray actors, one per shard.

    from rollout_buffer.replay import ReplayBuffer, RolloutRecord

    buf = ReplayBuffer("/tmp/replay", target_group_size=8)
    buf.add_rollouts([RolloutRecord("math", "q1", "0", rollout_uid=f"u{i}") for i in range(8)])
    batch = buf.sample_groups(1, seed=0)
    groups = buf.get_groups(batch.group_ids)
    buf.ack(batch.batch_id)

``ReplayBuffer.remote(...)``-style use goes through :func:`remote` (one actor) or
:class:`ShardedReplayBuffer` (one actor per shard); both need ``ray``.
"""

from .buffer import ReplayBuffer, ReplayBufferClosed
from .records import SCHEMA, GroupKey, RolloutGroup, RolloutRecord, SampledBatch, to_table
from .sharded import ShardedReplayBuffer, remote

__all__ = [
    "GroupKey",
    "SCHEMA",
    "ReplayBuffer",
    "ReplayBufferClosed",
    "RolloutGroup",
    "RolloutRecord",
    "SampledBatch",
    "ShardedReplayBuffer",
    "remote",
    "to_table",
]
