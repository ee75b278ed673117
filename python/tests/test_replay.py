"""Spec 000's replay buffer in-process: the spec's test list (dedupe, timeout sealing,
strict vs mixed with round-robin fairness, determinism across a restart, recovery,
capacity never evicting un-acked groups) plus acks, leases, scores and bad input.

Time is a fake clock the tests move, so nothing waits."""

import json
import math

import duckdb
import numpy as np
import pyarrow.dataset as ds
import pytest

from rollout_buffer.replay import (
    ReplayBuffer,
    ReplayBufferClosed,
    RolloutGroup,
    RolloutRecord,
    SampledBatch,
)


class Clock:
    def __init__(self, t=1_000.0):
        self.t = t

    def __call__(self):
        return self.t


def rec(env="math", ex="q0", pv="1", uid=None, i=0, replica="r0", n=4, **kw):
    return RolloutRecord(
        environment=env,
        example_id=ex,
        policy_version=pv,
        replica_id=replica,
        rollout_uid=uid or f"{env}-{ex}-{pv}-{i}",
        reward=float(i),
        output_tokens=np.arange(n, dtype=np.int32) + i,
        logprobs=np.full(n, -0.5, np.float32),
        **kw,
    )


def group_of(env="math", ex="q0", pv="1", size=4, start=0, **kw):
    return [rec(env, ex, pv, i=start + i, **kw) for i in range(size)]


def open_buffer(tmp_path, clock=None, **kw):
    kw.setdefault("target_group_size", 4)
    kw.setdefault("min_group_size", 2)
    kw.setdefault("durable", False)
    return ReplayBuffer(str(tmp_path / "replay"), clock=clock or Clock(), **kw)


def test_a_group_seals_at_target_size_and_comes_back_whole(tmp_path):
    buf = open_buffer(tmp_path)
    out = buf.add_rollouts(group_of(size=4))
    assert out == ["pending"] * 3 + ["sealed"]
    batch = buf.sample_groups(4, seed=1)
    assert isinstance(batch, SampledBatch) and len(batch.group_ids) == 1
    [g] = buf.get_groups(batch.group_ids)
    assert isinstance(g, RolloutGroup)
    assert (g.environment, g.example_id, g.policy_version) == ("math", "q0", "1")
    assert sorted(r.rollout_uid for r in g.rollouts) == [f"math-q0-1-{i}" for i in range(4)]
    by_uid = {r.rollout_uid: r for r in g.rollouts}
    np.testing.assert_array_equal(by_uid["math-q0-1-2"].output_tokens, np.arange(4) + 2)
    assert by_uid["math-q0-1-2"].reward == 2.0
    table = buf.get_groups(batch.group_ids, as_arrow=True)
    assert table.num_rows == 4 and set(table.column("group_id").to_pylist()) == {g.id}


def test_dedupe_of_rollouts_and_of_groups(tmp_path):
    buf = open_buffer(tmp_path)
    first = group_of(size=3)
    assert buf.add_rollouts(first) == ["pending"] * 3
    assert buf.add_rollouts([first[0], first[1]]) == ["duplicate", "duplicate"]
    assert buf.add_rollout(rec(i=3)) == "sealed"
    assert buf.add_rollouts(group_of(size=4)) == ["duplicate"] * 4
    s = buf.stats()
    assert (s["duplicates"], s["groups_sealed"], s["groups_live"]) == (6, 1, 1)
    buf.close()
    # Written once, whatever was resent.
    again = open_buffer(tmp_path)
    assert again.add_rollouts(group_of(size=4)) == ["duplicate"] * 4
    again.flush()
    rows = ds.dataset(str(tmp_path / "replay" / "rollouts"), partitioning="hive").count_rows()
    assert rows == 4


def test_timeout_sealing_needs_min_group_size(tmp_path):
    clock = Clock()
    buf = open_buffer(tmp_path, clock, seal_timeout_s=30.0)
    buf.add_rollouts(group_of(ex="a", size=2) + group_of(ex="b", size=1))
    clock.t += 29.0
    buf.tick()
    assert buf.stats()["groups_sealed"] == 0
    clock.t += 1.0
    buf.tick()
    s = buf.stats()
    assert s["groups_sealed"] == 1, "a (2 >= min 2) seals, b (1) waits"
    assert s["generator_queue_len"] == 1
    assert s["seal_time_ms_p50"] == pytest.approx(30_000.0)


def test_max_per_replica_and_accepted_versions(tmp_path):
    buf = open_buffer(tmp_path, max_per_replica=2, accept_policy_versions=["1"])
    out = buf.add_rollouts(group_of(size=3, replica="only") + [rec(pv="2", i=9)])
    assert out == ["pending", "pending", "replica_capped", "version_rejected"]


def test_strict_groups_split_by_version_mixed_groups_do_not(tmp_path):
    rollouts = group_of(pv="1", size=2) + group_of(pv="2", size=2, start=2)
    strict = open_buffer(tmp_path / "s")
    strict.add_rollouts(rollouts)
    assert strict.stats()["groups_sealed"] == 0
    mixed = open_buffer(tmp_path / "m", grouping="mixed")
    assert mixed.add_rollouts(rollouts)[-1] == "sealed"
    [g] = mixed.get_groups(mixed.sample_groups(1).group_ids)
    assert g.policy_version == "1", "a mixed group's version is its oldest member's"
    assert g.metadata["policy_versions"] == ["1", "2"]
    assert sorted(r.policy_version for r in g.rollouts) == ["1", "1", "2", "2"]


def test_round_robin_does_not_let_one_example_crowd_out_the_others(tmp_path):
    buf = open_buffer(tmp_path, target_group_size=2, min_group_size=1)
    # Example "hot" has 10 groups; "a", "b", "c" one each.
    for k in range(10):
        buf.add_rollouts(group_of(ex="hot", pv=str(k + 1), size=2))
    for ex in "abc":
        buf.add_rollouts(group_of(ex=ex, size=2))
    for seed in range(5):
        batch = buf.sample_groups(4, seed=seed)
        examples = sorted(g.example_id for g in buf.get_groups(batch.group_ids))
        assert examples == ["a", "b", "c", "hot"], (seed, examples)
        buf.ack(batch.batch_id, "failed")
        # Failed groups come first next time: drain them with a throwaway draw.
        buf.ack(buf.sample_groups(4, seed=seed).batch_id, "ok")


def fill(buf, examples=6, versions=3):
    for v in range(1, versions + 1):
        for e in range(examples):
            buf.add_rollouts(group_of(ex=f"q{e}", pv=str(v)))


def test_same_seed_and_offset_give_the_same_batch_also_after_a_restart(tmp_path):
    buf = open_buffer(tmp_path)
    fill(buf)
    first = buf.sample_groups(5, seed=7, start_offset=3)
    buf.ack(first.batch_id, "failed")
    buf.ack(buf.sample_groups(5, seed=0).batch_id, "failed")  # back in the pool
    # Same ready set (the redelivery queue is drained by one draw of everything).
    buf.ack(buf.sample_groups(100).batch_id, "ok")
    again = buf.sample_groups(5, seed=7, start_offset=3)
    assert again.group_ids == first.group_ids
    other = buf.sample_groups(5, seed=8, start_offset=3)
    assert set(other.group_ids).isdisjoint(again.group_ids), "leased groups are not drawn"
    buf.ack(again.batch_id, "ok")
    buf.ack(other.batch_id, "ok")
    buf.close()
    restarted = open_buffer(tmp_path)
    assert restarted.sample_groups(5, seed=7, start_offset=3).group_ids == first.group_ids
    # Offsets walk the same order.
    full = restarted.sample_groups(0, seed=7)
    assert full.group_ids == []


def test_recovery_gives_the_ready_groups_from_before(tmp_path):
    buf = open_buffer(tmp_path)
    fill(buf, examples=4, versions=2)
    buf.add_rollouts(group_of(ex="unsealed", size=2))
    leased = buf.sample_groups(3, seed=1)
    before = buf.stats()
    ready_before = before["ready_by_policy_version"]
    buf.flush()
    # A crash: the object is dropped without close().
    del buf
    after = open_buffer(tmp_path)
    s = after.stats()
    assert s["ready_by_policy_version"] == ready_before
    assert s["groups_leased"] == 3 and s["generator_queue_len"] == 0
    after.ack(leased.batch_id, "ok")
    assert after.stats()["groups_ready"] == before["groups_live"]


def test_capacity_evicts_the_oldest_unleased_never_a_leased_group(tmp_path):
    buf = open_buffer(tmp_path, capacity_groups=4)
    buf.add_rollouts(group_of(ex="old0"))
    buf.add_rollouts(group_of(ex="old1"))
    held = buf.sample_groups(2, seed=0)  # both old groups leased
    for e in range(4):
        buf.add_rollouts(group_of(ex=f"new{e}"))
    s = buf.stats()
    assert s["groups_live"] == 4 and s["evicted"] == 2
    live = buf.get_groups(held.group_ids)
    assert {g.example_id for g in live} == {"old0", "old1"}
    evicted = [gid for gid, why in buf._control.exited.items() if why == "evicted"]
    assert len(evicted) == 2
    with pytest.raises(KeyError, match="evicted"):
        buf.get_groups(evicted[:1])
    buf.close()
    # Evictions are durable: a restart does not bring them back.
    again = open_buffer(tmp_path, capacity_groups=4)
    assert again.stats()["groups_live"] == 4


def test_acks_count_uses_failed_and_expired_leases_redeliver_first(tmp_path):
    clock = Clock()
    buf = open_buffer(tmp_path, clock, max_uses_per_group=2, lease_timeout_s=60.0)
    fill(buf, examples=4, versions=1)
    b1 = buf.sample_groups(2, seed=3)
    buf.ack(b1.batch_id, "failed")
    buf.ack(b1.batch_id, "failed")  # a retry: nothing changes
    with pytest.raises(ValueError, match="already acked 'failed'"):
        buf.ack(b1.batch_id, "ok")
    b2 = buf.sample_groups(2, seed=99)
    assert b2.group_ids == b1.group_ids, "failed groups come first"
    clock.t += 61.0
    b3 = buf.sample_groups(2, seed=5)
    assert b3.group_ids == b1.group_ids, "an expired lease comes back first"
    assert buf.stats()["leases_expired"] == 1
    buf.ack(b3.batch_id, "ok")
    b4 = buf.next_batch(0, 4)
    buf.ack(b4.batch_id, "ok")
    assert buf.stats()["consumed"] == 2, "the two groups used twice are consumed"
    with pytest.raises(KeyError, match="unknown batch id 'nope'"):
        buf.ack("nope")
    with pytest.raises(ValueError, match="status"):
        buf.ack(b4.batch_id, "maybe")


def test_next_batch_returns_the_same_batch_for_a_step_after_a_crash(tmp_path):
    buf = open_buffer(tmp_path)
    fill(buf)
    b = buf.next_batch(10, 4)
    assert b.step == 10 and len(b.group_ids) == 4
    assert buf.next_batch(10, 4).group_ids == b.group_ids
    del buf  # crash before the ack
    again = open_buffer(tmp_path)
    same = again.next_batch(10, 4)
    assert (same.batch_id, same.group_ids) == (b.batch_id, b.group_ids)
    assert again.get_groups(same.group_ids)[0].id == b.group_ids[0]
    again.ack(same.batch_id, "ok")
    assert again.next_batch(11, 4).group_ids != b.group_ids


def test_a_lease_survives_a_crash_and_expires_after_it(tmp_path):
    clock = Clock()
    buf = open_buffer(tmp_path, clock, lease_timeout_s=100.0, max_uses_per_group=1)
    fill(buf, examples=3, versions=1)
    acked = buf.sample_groups(1, seed=0)
    pending = buf.sample_groups(1, seed=0)
    buf.ack(acked.batch_id, "ok")
    del buf
    again = open_buffer(tmp_path, clock, lease_timeout_s=100.0, max_uses_per_group=1)
    assert again.stats()["groups_leased"] == 1
    clock.t += 101.0
    back = again.sample_groups(3, seed=1)
    assert back.group_ids[0] == pending.group_ids[0]
    assert acked.group_ids[0] not in back.group_ids, "an acked group is never redelivered"
    again.ack(acked.batch_id, "ok")  # acked before the crash: still a no-op


def test_scores_go_to_a_sidecar_filter_draws_and_survive_a_restart(tmp_path):
    clock = Clock()
    buf = open_buffer(tmp_path, clock)
    fill(buf, examples=3, versions=1)
    gids = [g for g in buf._live]
    clock.t += 2.0
    buf.upsert_scores(gids[0], {"correct": 1.0}, flags={"verified": True})
    buf.upsert_scores(gids[1], {"correct": 0.0}, flags={"verified": False})
    buf.upsert_scores(gids[1], {"len": 3}, rollout_uid="math-q1-1-0")
    with pytest.raises(KeyError, match="not in the buffer"):
        buf.upsert_scores("g-unknown", {"x": 1.0})
    with pytest.raises(ValueError, match="not finite"):
        buf.upsert_scores(gids[2], {"x": math.nan})
    with pytest.raises(KeyError, match="no rollout"):
        buf.upsert_scores(gids[2], {"x": 1.0}, rollout_uid="other")
    assert buf.stats()["verifier_latency_ms"]["p50"] == pytest.approx(2000.0)
    assert buf.stats()["sample_latency_ms"] == {"p50": None, "p99": None}
    only = buf.sample_groups(3, require_flags={"verified": True})
    assert only.group_ids == [gids[0]]
    buf.ack(only.batch_id, "failed")
    # The spec's sampling and ack latency: time inside the calls (wall clock, not `clock`).
    stats = buf.stats()
    for name in ("sample_latency_ms", "ack_latency_ms"):
        assert 0.0 < stats[name]["p50"] <= stats[name]["p99"] < 60_000.0, stats[name]
    buf.close()
    again = open_buffer(tmp_path, clock)
    [g0, g1] = again.get_groups(gids[:2])
    assert len(g0.metadata["scores"]) == 4
    assert all(v == {"correct": 1.0} for v in g0.metadata["scores"].values())
    assert all(f == {"verified": True} for f in g0.metadata["flags"].values())
    assert g1.metadata["scores"]["math-q1-1-0"] == {"correct": 0.0, "len": 3.0}
    assert again.sample_groups(3, require_flags={"verified": True}).group_ids == [gids[0]]
    # The sidecar is a plain Parquet dataset keyed by (group_id, rollout_uid).
    rows = duckdb.sql(
        f"select group_id, rollout_uid from read_parquet('{tmp_path}/replay/scores/*.parquet')"
    ).fetchall()
    assert (gids[1], "math-q1-1-0") in rows


def test_policy_lag_controls_and_stats(tmp_path):
    buf = open_buffer(tmp_path)
    fill(buf, examples=2, versions=5)
    buf.set_policy_version(5)
    near = buf.sample_groups(10, max_policy_lag=1)
    assert {g.policy_version for g in buf.get_groups(near.group_ids)} == {"4", "5"}
    buf.ack(near.batch_id, "ok")
    # A numpy int counts as an int (it was refused).
    recent = buf.sample_groups(10, recent_n_versions=np.int64(1), seed=2)
    assert {g.policy_version for g in buf.get_groups(recent.group_ids)} == {"5"}
    buf.ack(recent.batch_id, "ok")
    mix = buf.sample_groups(4, on_policy_fraction=0.5, seed=3)
    versions = [g.policy_version for g in buf.get_groups(mix.group_ids)]
    assert versions[:2] == ["5", "5"]
    buf.ack(mix.batch_id, "ok")
    pref = buf.sample_groups(2, prefer_policy_versions=["2"], seed=1)
    assert [g.policy_version for g in buf.get_groups(pref.group_ids)] == ["2", "2"]
    s = buf.stats()
    assert s["policy_lag_histogram"][0] >= 4 and s["policy_lag_histogram"][3] == 2
    assert sum(s["ready_by_policy_version"].values()) == s["groups_ready"] == 8
    assert s["groups_leased"] == 2
    assert s["policy_version"] == 5


def test_recency_weighting_prefers_recent_versions(tmp_path):
    buf = open_buffer(tmp_path, target_group_size=1, min_group_size=1)
    for v in range(1, 11):
        for e in range(20):
            buf.add_rollouts([rec(ex=f"q{e}", pv=str(v))])
    lags = {"uniform": [], "exp": []}
    for mode in lags:
        for seed in range(20):
            b = buf.sample_groups(10, seed=seed, recency_weighting=mode)
            lags[mode] += [10 - int(g.policy_version) for g in buf.get_groups(b.group_ids)]
            buf.ack(b.batch_id, "failed")
            buf.ack(buf.sample_groups(10).batch_id, "ok")  # drain the redelivery
    assert np.mean(lags["exp"]) < np.mean(lags["uniform"]) / 2


@pytest.mark.parametrize(
    "bad, field",
    [
        (dict(environment=""), "environment"),
        (dict(example_id=None), "example_id"),
        (dict(policy_version="v1"), "policy_version"),
        (dict(logprobs=np.zeros(3, np.float32)), "logprobs"),
        (dict(reward=math.nan), "reward"),
        (dict(token_count=-1), "token_count"),
    ],
)
def test_bad_input_names_field_and_uid_and_takes_nothing(tmp_path, bad, field):
    buf = open_buffer(tmp_path)
    good = group_of(size=3)
    fields = {**rec(i=7).__dict__, **bad, "rollout_uid": "the-bad-one"}
    with pytest.raises(ValueError, match=f"'the-bad-one'.*'{field}'"):
        buf.add_rollouts(good + [RolloutRecord(**fields)])
    s = buf.stats()
    assert (s["received"], s["generator_queue_len"]) == (0, 0), "none of the call is taken"
    assert buf.add_rollouts(good) == ["pending"] * 3


def test_tokens_past_int32_and_uids_that_are_no_strings_are_refused(tmp_path):
    buf = open_buffer(tmp_path)
    wide = RolloutRecord("math", "q1", 3, rollout_uid="u0", output_tokens=np.array([2**40 + 7, 1], np.int64))
    with pytest.raises(ValueError, match="'u0'.*'output_tokens'.*outside int32"):
        buf.add_rollouts([wide])
    # An int uid was replaced by a hash that changed with every resend: never deduplicated.
    with pytest.raises(ValueError, match="'rollout_uid' must be a string"):
        buf.add_rollouts([RolloutRecord("math", "q1", 3, rollout_uid=5, reward=1.0)])
    # A fractional token count was truncated when the other records took the fast path.
    with pytest.raises(ValueError, match="'token_count' must be an int"):
        buf.add_rollouts(group_of(size=2) + [RolloutRecord("math", "q9", 3, rollout_uid="t", token_count=1.5)])
    assert buf.stats()["received"] == 0
    fine = RolloutRecord("math", "q1", 3, rollout_uid="u1", output_tokens=np.array([2**31 - 1, -(2**31)], np.int64))
    assert buf.add_rollouts([fine]) == ["pending"]


def test_non_integer_versions_work_until_a_lag_control_is_asked_for(tmp_path):
    buf = open_buffer(tmp_path, numeric_versions=False)
    buf.add_rollouts(group_of(pv="ckpt-a"))
    assert len(buf.sample_groups(1).group_ids) == 1
    with pytest.raises(ValueError, match="'policy_version'.*integer"):
        buf.sample_groups(1, max_policy_lag=2)


def test_close_flushes_and_later_calls_raise(tmp_path):
    buf = open_buffer(tmp_path)
    buf.add_rollouts(group_of())
    buf.close()
    with pytest.raises(ReplayBufferClosed):
        buf.sample_groups(1)
    with pytest.raises(ReplayBufferClosed):
        buf.add_rollouts(group_of(ex="x"))


def test_the_dataset_is_hive_partitioned_with_manifests(tmp_path):
    buf = open_buffer(tmp_path)
    fill(buf, examples=2, versions=2)
    buf.flush()
    root = tmp_path / "replay" / "rollouts"
    parts = sorted(p.relative_to(root).parent.as_posix() for p in root.rglob("*.parquet"))
    assert parts == [
        "environment=math/policy_version=1/segment_idx=0",
        "environment=math/policy_version=2/segment_idx=0",
    ]
    manifests = list(root.rglob("_manifest-*.jsonl"))
    entries = [json.loads(line) for m in manifests for line in m.read_text().splitlines()]
    assert sorted(e["group_id"] for e in entries) == sorted(buf._live)
    n = duckdb.sql(
        f"select count(*), count(distinct group_id) from read_parquet('{root}/**/*.parquet',"
        " hive_partitioning=true) where environment = 'math'"
    ).fetchall()[0]
    assert n == (16, 4)


def test_rebuild_scans_a_data_file_whose_manifest_is_missing(tmp_path):
    buf = open_buffer(tmp_path)
    fill(buf, examples=3, versions=1)
    buf.close()
    for m in (tmp_path / "replay" / "rollouts").rglob("_manifest-*.jsonl"):
        m.unlink()
    again = open_buffer(tmp_path)
    assert again.stats()["groups_ready"] == 3
    groups = again.get_groups(list(again._live))
    assert all(len(g.rollouts) == 4 for g in groups)


def test_retention_by_ttl_and_by_version_cap(tmp_path):
    clock = Clock()
    buf = open_buffer(tmp_path, clock, retention_ttl_s=100.0, max_groups_per_version=2)
    for e in range(3):
        buf.add_rollouts(group_of(ex=f"q{e}", pv="1"))
    assert buf.stats()["groups_live"] == 2, "the version cap keeps the newest two"
    held = buf.sample_groups(1)
    clock.t += 101.0
    buf.tick()
    s = buf.stats()
    assert (s["groups_live"], s["retention"]) == (1, 1), "the leased group stays"
    assert buf.get_groups(held.group_ids)[0].id == held.group_ids[0]


def test_rollouts_as_columns_are_the_same_as_records(tmp_path):
    import pyarrow as pa

    n = 4
    columns = {
        "environment": ["math"] * n,
        "example_id": ["q0"] * n,
        "policy_version": [3] * n,  # ints become version strings
        "rollout_uid": [f"c{i}" for i in range(n)],
        "reward": [0.0, 1.0, 0.0, 1.0],
        "output_tokens": [np.arange(5, dtype=np.int32) + i for i in range(n)],
        "logprobs": [np.zeros(5, np.float32) for _ in range(n)],
    }
    buf = open_buffer(tmp_path)
    assert buf.add_rollouts(columns)[-1] == "sealed"
    [g] = buf.get_groups(buf.sample_groups(1).group_ids)
    assert g.policy_version == "3"
    r = {x.rollout_uid: x for x in g.rollouts}["c2"]
    np.testing.assert_array_equal(r.output_tokens, np.arange(5) + 2)
    assert r.token_count == 5 and r.replica_id == "unknown"
    # An Arrow table takes the same path.
    table = pa.table({**columns, "example_id": ["q1"] * n, "rollout_uid": [f"t{i}" for i in range(n)],
                      "output_tokens": pa.array([list(range(5))] * n, pa.list_(pa.int32())),
                      "logprobs": pa.array([[0.0] * 5] * n, pa.list_(pa.float32()))})
    assert buf.add_rollouts(table)[-1] == "sealed"


@pytest.mark.parametrize(
    "change, message",
    [
        ({"reward": [0.0, math.inf]}, "'c1'.*'reward'.*not finite"),
        ({"policy_version": ["1", "v2"]}, "'c1'.*'policy_version'"),
        ({"example_id": ["q", None]}, "'c1'.*'example_id'"),
        ({"logprobs": [np.zeros(2, np.float32), np.zeros(3, np.float32)]}, "'c1'.*'logprobs'.*length"),
        ({"colour": ["red", "blue"]}, "column 'colour' is not a RolloutRecord field"),
        ({"metadata": ['{"a": 1}', "{not json"]}, "'c1'.*'metadata'.*JSON"),
        ({"metadata": ['{"a": 1}', "[1, 2]"]}, "'c1'.*'metadata'.*object"),
    ],
)
def test_bad_columns_are_named_and_nothing_is_taken(tmp_path, change, message):
    columns = {
        "environment": ["math"] * 2,
        "example_id": ["q"] * 2,
        "policy_version": ["1", "1"],
        "rollout_uid": ["c0", "c1"],
        "reward": [0.0, 1.0],
        "output_tokens": [np.zeros(2, np.int32)] * 2,
        "logprobs": [np.zeros(2, np.float32)] * 2,
        **change,
    }
    buf = open_buffer(tmp_path)
    with pytest.raises(ValueError, match=message):
        buf.add_rollouts(columns)
    assert buf.stats()["received"] == 0


def test_a_consumed_group_sent_again_whole_is_refused_by_its_id(tmp_path):
    buf = open_buffer(tmp_path, max_uses_per_group=1)
    buf.add_rollouts(group_of())
    buf.ack(buf.sample_groups(1).batch_id)
    assert buf.stats()["groups_live"] == 0
    # Rollout dedupe covers pending and live groups; the whole group again has the same id.
    assert buf.add_rollouts(group_of())[-1] == "duplicate_group"
    assert buf.stats()["groups_live"] == 0 and buf.stats()["generator_queue_len"] == 0


def drawn_again_after_its_lease_expired(tmp_path):
    """One group (one use allowed) whose first lease expired and which was drawn again:
    the clock, the buffer and the two batches."""
    clock = Clock()
    buf = open_buffer(tmp_path, clock, max_uses_per_group=1, lease_timeout_s=10.0)
    buf.add_rollouts(group_of())
    first = buf.sample_groups(1)
    clock.t += 11.0
    second = buf.sample_groups(1)
    assert second.group_ids == first.group_ids
    return clock, buf, first, second


def test_a_late_ok_ack_does_not_consume_a_group_another_batch_holds(tmp_path):
    _, buf, first, second = drawn_again_after_its_lease_expired(tmp_path)
    buf.ack(first.batch_id, "ok")  # late: counts the use, leaves it to `second`
    assert buf.get_groups(second.group_ids)[0].metadata["uses"] == 1
    buf.ack(second.batch_id, "ok")
    assert buf.stats()["consumed"] == 1 and buf.stats()["groups_live"] == 0


@pytest.mark.parametrize("settle", ["failed", "expired"])
def test_a_group_used_up_while_another_batch_held_it_is_consumed_when_that_batch_settles(
        tmp_path, settle):
    clock, buf, first, second = drawn_again_after_its_lease_expired(tmp_path)
    buf.ack(first.batch_id, "ok")  # its one use
    if settle == "failed":
        buf.ack(second.batch_id, "failed")
    else:
        clock.t += 11.0
    assert buf.sample_groups(1).group_ids == []  # never served a second time
    assert buf.stats()["consumed"] == 1 and buf.stats()["groups_live"] == 0
    buf.close()
    again = open_buffer(tmp_path, clock, max_uses_per_group=1, lease_timeout_s=10.0)
    assert again.sample_groups(1).group_ids == [] and again.stats()["groups_live"] == 0


def test_a_mixed_group_keeps_its_versions_and_replicas_across_a_restart(tmp_path):
    buf = open_buffer(tmp_path, grouping="mixed")
    buf.add_rollouts(group_of(pv="2", size=2) + group_of(pv="5", size=2, start=2, replica="r9"))
    buf.close()
    again = open_buffer(tmp_path, grouping="mixed")
    [g] = again.get_groups(list(again._live))
    assert (g.policy_version, g.metadata["policy_versions"]) == ("2", ["2", "5"])
    assert g.metadata["replicas"] == ["r0", "r9"]


def test_an_empty_draw_is_a_batch_any_ack_of_which_is_a_no_op(tmp_path):
    buf = open_buffer(tmp_path)
    empty = buf.sample_groups(4)
    assert empty.group_ids == []
    buf.ack(empty.batch_id, "failed")
    buf.ack(empty.batch_id, "ok")
    assert buf.next_batch(3, 4).group_ids == [] and buf.recorded_batch(3) is None


@pytest.mark.parametrize(
    "options, message",
    [
        (dict(lease_timeout_s=-1), "lease_timeout_s"),
        (dict(lease_timeout_s=math.nan), "lease_timeout_s"),
        (dict(seal_timeout_s=-1.0), "seal_timeout_s"),
        (dict(max_uses_per_group=0), "max_uses_per_group"),
        (dict(capacity_groups=math.nan), "capacity_groups"),
    ],
)
def test_bad_options_are_refused(tmp_path, options, message):
    with pytest.raises(ValueError, match=message):
        ReplayBuffer(str(tmp_path), target_group_size=2, **options)


def test_bad_filters_are_refused(tmp_path):
    buf = open_buffer(tmp_path)
    buf.add_rollouts(group_of())
    for filters, message in [
        (dict(recent_n_versions=-1), "recent_n_versions"),
        (dict(recent_n_versions=0), "recent_n_versions"),
        (dict(recent_n_versions=np.True_), "recent_n_versions"),
        (dict(max_policy_lag=math.nan), "max_policy_lag"),
        (dict(require_flags=["x"]), "require_flags"),
    ]:
        with pytest.raises(ValueError, match=message):
            buf.sample_groups(1, **filters)
    batch = buf.sample_groups(1)
    with pytest.raises(ValueError, match="list of ids"):
        buf.get_groups(batch.group_ids[0])
    assert len(buf.get_groups(batch.group_ids)) == 1


def test_an_empty_add_is_a_no_op(tmp_path):
    """A producer's flush of nothing (an empty list, table or dict of columns) returns
    no outcomes and changes nothing; it raised a TypeError from the column checks."""
    import pyarrow as pa

    from rollout_buffer.replay import SCHEMA, to_table

    buf = open_buffer(tmp_path)
    buf.add_rollouts(group_of(size=2))
    empty = to_table([])
    assert empty.num_rows == 0 and empty.schema.equals(SCHEMA)
    for nothing in ([], (), empty, pa.RecordBatch.from_pylist([], schema=SCHEMA),
                    {"environment": [], "example_id": [], "policy_version": []}):
        assert buf.add_rollouts(nothing) == []
    s = buf.stats()
    assert (s["received"], s["generator_queue_len"]) == (2, 2)
    assert buf.add_rollouts(group_of(size=4))[2:] == ["pending", "sealed"]


def test_an_unknown_compression_is_refused_at_construction(tmp_path):
    """Not at the first durable write, on the writer thread; the message lists what this
    pyarrow writes."""
    import pyarrow as pa

    root = tmp_path / "bogus"
    with pytest.raises(ValueError, match=r"compression must be one of 'none', .*'zstd'.*not 'bogus'"):
        ReplayBuffer(str(root), compression="bogus")
    assert not root.exists(), "nothing created"
    with pytest.raises(ValueError, match="compression"):
        ReplayBuffer(str(root), compression=3)
    names = [None, "none", "ZSTD"] + [c for c in ("snappy", "gzip", "lz4") if pa.Codec.is_available(c)]
    for i, name in enumerate(names):
        buf = open_buffer(tmp_path / f"ok{i}", compression=name)
        buf.add_rollouts(group_of())
        buf.flush()
        assert buf.stats()["groups_written"] == 1
        buf.close()


def test_seed_and_start_offset_must_be_ints(tmp_path):
    buf = open_buffer(tmp_path)
    fill(buf, examples=3, versions=1)
    for bad in (1.5, True, "1", None):
        with pytest.raises(ValueError, match=f"seed must be an int, not {bad!r}"):
            buf.sample_groups(1, seed=bad)
        with pytest.raises(ValueError, match="seed must be an int"):
            buf.next_batch(7, 1, seed=bad)
        with pytest.raises(ValueError, match="start_offset must be an int"):
            buf.sample_groups(1, start_offset=bad)
    assert buf.stats()["batches"] == 0 and buf.recorded_batch(7) is None
    assert buf.ready_count() == 3, "nothing leased"
    assert len(buf.sample_groups(1, seed=np.int64(-3), start_offset=np.int32(1)).group_ids) == 1


def test_scores_and_flags_that_are_no_dict_are_refused(tmp_path):
    buf = open_buffer(tmp_path)
    buf.add_rollouts(group_of())
    [gid] = list(buf._live)
    for scores, flags, message in [
        ([1], None, r"scores must be a dict of score name \(str\) -> number, not \[1\]"),
        ([("correct", 1.0)], None, "scores must be a dict"),
        (1.0, None, "scores must be a dict"),
        ({"correct": 1.0}, [1], r"flags must be a dict of flag name \(str\) -> bool"),
        ({"correct": 1.0}, "verified", "flags must be a dict"),
    ]:
        with pytest.raises(ValueError, match=f"group '{gid}': {message}"):
            buf.upsert_scores(gid, scores, flags=flags)
    assert "scores" not in buf.get_groups([gid])[0].metadata
    assert not list((tmp_path / "replay").glob("scores/*.parquet")), "nothing written"
