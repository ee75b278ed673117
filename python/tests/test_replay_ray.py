"""The replay buffer as Ray actors on a local cluster: an actor killed mid-lease and
restarted by Ray on its folder, and two shards with one killed; producers are Ray tasks
writing to their shard directly, and the trainer's payloads come from the shards as object
refs.

The actors' clock is the wall clock plus an offset the test writes to a file, so a lease
expires when the test says, without waiting."""

import os
import time

import numpy as np
import pyarrow as pa
import pytest

ray = pytest.importorskip("ray")

from rollout_buffer.replay import RolloutRecord, ShardedReplayBuffer, remote  # noqa: E402

GROUP = 4


class FileClock:
    """``time.time()`` plus the number in ``path`` (0 while there is none)."""

    def __init__(self, path):
        self.path = path

    def __call__(self):
        try:
            with open(self.path) as f:
                return time.time() + float(f.read())
        except FileNotFoundError:
            return time.time()

    def jump(self, seconds):
        with open(self.path, "w") as f:
            f.write(str(seconds))


def records(env, examples, producer, version=1):
    return [
        RolloutRecord(
            environment=env,
            example_id=f"q{e}",
            policy_version=str(version),
            replica_id=f"p{producer}",
            rollout_uid=f"{env}-{e}-{producer}",
            reward=float(producer % 2),
            output_tokens=np.full(16, e, np.int32),
            logprobs=np.full(16, -0.5, np.float32),
        )
        for e in range(examples)
    ]


def pid_of(actor):
    return ray.get(actor.__ray_call__.remote(lambda self: os.getpid()))


def crash(actor, marker):
    """Kills the actor's process inside a call, so the kill has happened when this
    returns (``ray.kill`` only asks, and a call sent right after it may still reach the
    old process). Ray restarts the actor and retries the call, which finds the marker
    and answers with the new process's pid."""

    def exit_once(self):
        if not os.path.exists(marker):
            open(marker, "w").close()
            os._exit(1)
        return os.getpid()

    return ray.get(actor.__ray_call__.remote(exit_once))


@ray.remote
def produce(target, env, examples, producer):
    """A producer: writes rollout `producer` of every example, straight to its shard."""
    rs = records(env, examples, producer)
    if isinstance(target, ShardedReplayBuffer):
        return target.add_rollouts(rs)
    return ray.get(target.add_rollouts.remote(rs))


def test_an_actor_killed_mid_lease_comes_back_with_its_leases(cluster, tmp_path):
    clock = FileClock(str(tmp_path / "offset"))
    actor = remote(
        str(tmp_path / "replay"), target_group_size=GROUP, lease_timeout_s=60.0,
        max_uses_per_group=1, clock=clock, durable=True,
    )
    ray.get([produce.remote(actor, "math", 6, p) for p in range(GROUP)])
    acked = ray.get(actor.next_batch.remote(0, 2))
    held = ray.get(actor.next_batch.remote(1, 2))
    ray.get(actor.ack.remote(acked.batch_id, "ok"))
    assert len(acked.group_ids) == len(held.group_ids) == 2
    assert ray.get(actor.stats.remote())["groups_live"] == 4, "6 groups, 2 consumed"

    before = pid_of(actor)
    # Ray restarts it (max_restarts=-1) on the same folder.
    assert crash(actor, str(tmp_path / "crashed")) != before, "a new process"
    same = ray.get(actor.next_batch.remote(1, 2))
    assert (same.batch_id, same.group_ids) == (held.batch_id, held.group_ids)
    ray.get(actor.ack.remote(acked.batch_id, "ok"))  # acked before the kill: a no-op
    s = ray.get(actor.stats.remote())
    assert (s["groups_live"], s["groups_leased"]) == (4, 2)
    fresh = ray.get(actor.sample_groups.remote(10, seed=3))
    assert set(fresh.group_ids).isdisjoint(held.group_ids + acked.group_ids)
    ray.get(actor.ack.remote(fresh.batch_id, "failed"))

    clock.jump(61.0)
    back = ray.get(actor.sample_groups.remote(10, seed=3))
    # Redelivered first, in the order they came back: the failed batch, then the lease
    # that expired.
    assert back.group_ids == fresh.group_ids + held.group_ids
    assert not set(acked.group_ids) & set(back.group_ids), "an acked group never returns"
    tables = ray.get(actor.get_batch.remote(back.batch_id))
    assert isinstance(tables, pa.Table) and tables.num_rows == len(back.group_ids) * GROUP


def test_two_shards_one_killed(cluster, tmp_path):
    front = ShardedReplayBuffer(
        str(tmp_path / "replay"), ["math", "code"], target_group_size=GROUP,
        lease_timeout_s=600.0, max_uses_per_group=1,
    )
    outs = ray.get(
        [produce.remote(front, env, 5, p) for env in ("math", "code") for p in range(GROUP)]
    )
    assert sum(o.count("sealed") for o in outs) == 10
    with pytest.raises(ValueError, match="no shard for environment 'chess'"):
        front.add_rollouts(records("chess", 1, 0))

    first = front.next_batch(0, 6, seed=11)
    assert len(first.group_ids) == 6
    # The split is deterministic: the same seed over the same ready counts.
    tables = ray.get(front.batch_refs(first))
    assert sum(t.num_rows for t in tables) == 6 * GROUP
    envs = {e for t in tables for e in t.column("environment").to_pylist()}
    assert envs == {"math", "code"}, "both shards served"

    code = front.handles[front.shard_of("code")]
    before = pid_of(code)
    assert crash(code, str(tmp_path / "crashed")) != before
    again = front.next_batch(0, 6, seed=11)
    assert (again.batch_id, again.group_ids) == (first.batch_id, first.group_ids)
    front.ack(first.batch_id, "ok")
    front.ack(first.batch_id, "ok")  # a retry
    rest = front.sample_groups(10, seed=1)
    assert len(rest.group_ids) == 4 and not set(rest.group_ids) & set(first.group_ids)
    front.ack(rest.batch_id, "ok")
    stats = front.stats()
    assert sum(s["groups_live"] for s in stats) == 0
    with pytest.raises(KeyError):
        front.ack("9:b-0000000001")
    front.close()


def test_sharded_lag_filters_measure_from_the_newest_version_over_all_shards(cluster, tmp_path):
    front = ShardedReplayBuffer(
        str(tmp_path / "replay"), ["math", "code"], target_group_size=GROUP,
        lease_timeout_s=600.0,
    )
    ray.get([produce_at.remote(front, "math", 2, p, 10) for p in range(GROUP)]
            + [produce_at.remote(front, "code", 3, p, 3) for p in range(GROUP)])
    assert front.current_version() == 10

    def versions(batch):
        tables = ray.get(front.batch_refs(batch))
        front.ack(batch.batch_id, "failed")
        return sorted({v for t in tables for v in t.column("policy_version").to_pylist()})

    # As one buffer holding both shards' groups: only version 10 is within lag 0.
    assert versions(front.sample_groups(10, max_policy_lag=0)) == ["10"]
    assert versions(front.sample_groups(10, recent_n_versions=1)) == ["10"]
    assert versions(front.sample_groups(10, max_policy_lag=7)) == ["10", "3"]
    assert versions(front.next_batch(5, 10, max_policy_lag=0)) == ["10"]
    front.set_policy_version(12)
    assert front.current_version() == 12
    assert front.sample_groups(10, max_policy_lag=1).group_ids == []
    assert len(front.sample_groups(10, recency_weighting="linear").group_ids) == 5
    # An unknown option is refused as a shard refuses it, even with nothing to draw.
    with pytest.raises(TypeError, match="max_polcy_lag"):
        front.sample_groups(4, max_polcy_lag=0)
    front.close()


@ray.remote
def produce_at(front, env, examples, producer, version):
    return front.add_rollouts(records(env, examples, producer, version))


def test_the_sharded_front_reads_and_scores_groups_on_the_shard_holding_them(cluster, tmp_path):
    """A verifier reading groups and scoring them through the front (it had to find each
    group's shard itself); a draw with require_flags then finds the flagged group. The
    root is a pathlib.Path, as one buffer takes it."""
    front = ShardedReplayBuffer(
        tmp_path / "replay", ["math", "code"], target_group_size=GROUP,
        lease_timeout_s=600.0,
    )
    ray.get([produce.remote(front, env, 2, p) for env in ("math", "code") for p in range(GROUP)])
    batch = front.sample_groups(4, seed=3)
    ids = batch.group_ids[::-1]  # an order no shard has
    groups = front.get_groups(ids)
    assert [g.id for g in groups] == ids
    table = front.get_groups(ids, as_arrow=True)
    rows = table.column("group_id").to_pylist()
    assert [rows[i] for i in range(0, len(rows), GROUP)] == ids
    assert all(rows[i:i + GROUP] == [rows[i]] * GROUP for i in range(0, len(rows), GROUP))
    assert front.get_groups([]) == [] and front.get_groups([], as_arrow=True).num_rows == 0
    front.ack(batch.batch_id, "failed")
    code_group = next(g for g in groups if g.environment == "code")
    front.upsert_scores(code_group.id, {"correct": 1.0}, flags={"verified": True})
    flagged = front.sample_groups(4, require_flags={"verified": True}, on_policy_fraction=None)
    assert flagged.group_ids == [code_group.id]
    with pytest.raises(KeyError, match="not in any shard"):
        front.upsert_scores("g-unknown", {"correct": 0.0})
    with pytest.raises(KeyError, match="not in any shard"):
        front.get_groups([ids[0], "g-unknown"])
    front.close()
