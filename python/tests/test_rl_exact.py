"""The RL layer from Python: an add that gives up waiting for room leaves its group
pending (never a lost group answered "duplicate"), each advantage estimator computes its
formula over the raw rewards, and a group sealed short by its timeout is trained on,
padded, as slime does."""

import asyncio
import time

import numpy as np
import pytest

import rollout_buffer as rb


def rollout(example, uid, reward, tokens=(2,)):
    n = len(tokens)
    return {
        "environment": "e",
        "example_id": example,
        "policy_version": 0,
        "rollout_uid": uid,
        "prompt_tokens": np.array([1], np.int32),
        "output_tokens": np.array(tokens, np.int32),
        "logprobs": np.full(n, -0.5, np.float32),
        "reward": reward,
    }


async def full_with_b0_pending():
    """A buffer of room for one group of 2, holding group a, with b0 pending."""
    buf = rb.Buffer(1, [rb.Rpc("train", 1, inputs=rb.GROUP_INPUTS)])
    ingest = rb.Ingest(buf, group_size=2)
    assert await ingest.add_rollout(rollout("a", "a0", 0.0)) == "pending"
    assert await ingest.add_rollout(rollout("a", "a1", 1.0)) == "sealed"  # buffer full
    assert await ingest.add_rollout(rollout("b", "b0", 0.0)) == "pending"
    return buf, ingest


def test_an_add_that_times_out_waiting_for_room_leaves_its_group_pending():
    async def main():
        buf, ingest = await full_with_b0_pending()
        with pytest.raises(rb.Timeout):
            await ingest.add_rollout(rollout("b", "b1", 1.0), timeout=0.2)
        counters = ingest.counters()
        assert (counters["reopened_groups"], counters["pending_rollouts"]) == (1, 1)
        batcher = rb.Batcher([("e", buf, "train", 1.0)], 16, 4, 2, wait=0.2)
        batch = await batcher.next_batch(timeout=5)
        await batch.complete()
        # The resend completes b: stored once; b0 is then a duplicate of a stored rollout.
        assert await ingest.add_rollout(rollout("b", "b1", 1.0), timeout=5) == "sealed"
        assert await ingest.add_rollout(rollout("b", "b0", 0.0)) == "duplicate"
        assert len(buf) == 1
        assert ingest.counters()["stored_groups"] == 2

    asyncio.run(main())


def test_a_group_waiting_for_room_is_counted_as_storing():
    async def main():
        buf, ingest = await full_with_b0_pending()
        waiting = asyncio.create_task(ingest.add_rollout(rollout("b", "b1", 1.0)))
        deadline = time.monotonic() + 10
        while ingest.counters()["storing_rollouts"] == 0:
            assert time.monotonic() < deadline, "the add never took its group out"
            await asyncio.sleep(0.01)
        counters = ingest.counters()
        assert (counters["storing_rollouts"], counters["pending_rollouts"]) == (2, 0)
        assert not waiting.done()
        batcher = rb.Batcher([("e", buf, "train", 1.0)], 16, 4, 2, wait=0.2)
        batch = await batcher.next_batch(timeout=5)
        await batch.complete()
        assert await asyncio.wait_for(waiting, 10) == "sealed"
        assert ingest.counters()["storing_rollouts"] == 0

    asyncio.run(main())


def test_a_blocking_add_takes_a_timeout_too():
    buf = rb.Buffer(1, [rb.Rpc("train", 1, inputs=rb.GROUP_INPUTS)])
    ingest = rb.Ingest(buf, group_size=1)
    assert ingest.add_rollout_blocking(rollout("a", "a0", 0.5)) == "sealed"
    started = time.monotonic()
    with pytest.raises(rb.Timeout):
        ingest.add_rollout_blocking(rollout("b", "b0", 0.5), timeout=0.2)
    assert time.monotonic() - started < 5
    with pytest.raises(ValueError, match="timeout"):
        ingest.add_rollout_blocking(rollout("c", "c0", 0.5), timeout=-1)


def advantages_of(estimator, rewards):
    buf = rb.Buffer(16, [rb.Rpc("train", 1, inputs=rb.GROUP_INPUTS)])
    ingest = rb.Ingest(buf, group_size=len(rewards))
    for k, r in enumerate(rewards):
        ingest.add_rollout_blocking(rollout("q", f"u{k}", r, tokens=(k + 10,)))
    batcher = rb.Batcher([("e", buf, "train", 1.0)], 16, 4, len(rewards), wait=0.2,
                         advantage=estimator)
    arrays = batcher.next_batch_blocking(timeout=5).arrays()
    # Each rollout's advantage sits on its one output token, which names it.
    by_token = {}
    for ids, adv, mask in zip(arrays["input_ids"], arrays["advantages"], arrays["loss_mask"]):
        for t, a, m in zip(ids, adv, mask):
            if m:
                by_token[int(t)] = float(a)
    return np.array([by_token[k + 10] for k in range(len(rewards))])


@pytest.mark.parametrize("estimator", ["grpo", "rloo", "none"])
def test_each_estimator_is_its_formula_over_the_raw_rewards(estimator):
    raw = np.array([0.2, 0.5, 0.9, 0.3])
    want = {
        "grpo": (raw - raw.mean()) / raw.std(),
        "rloo": raw - (raw.sum() - raw) / (len(raw) - 1),
        "none": raw,
    }[estimator]
    np.testing.assert_allclose(advantages_of(estimator, list(raw)), want, rtol=1e-5, atol=1e-6)


def test_a_group_sealed_short_by_its_timeout_is_trained_padded():
    buf = rb.Buffer(64, [rb.Rpc("train", 1, inputs=rb.GROUP_INPUTS)])
    ingest = rb.Ingest(buf, group_size=4, min_size=2, seal_timeout=0.2)
    for k in range(3):
        ingest.add_rollout_blocking(rollout("q", f"u{k}", float(k % 2)))
    # The batcher waits (up to `wait`) for groups; the seal timer stores this one first.
    batcher = rb.Batcher([("e", buf, "train", 1.0)], 64, 4, 4, wait=3.0)
    batch = batcher.next_batch_blocking(timeout=10)
    assert ingest.counters()["sealed_timeout"] == 1
    rows = batch.arrays()["loss_mask"].sum(axis=1)
    assert int(rows.sum()) == 4, "three rollouts and one padding copy"
    batch.complete_blocking()
    assert buf.stats()["filtered"] == 0


def test_a_uid_another_group_holds_is_refused_as_taken():
    # Samples numbered per prompt ("0", "1" for every prompt): the second prompt's are
    # refused and counted apart, not merged into the first's group nor taken as plain
    # duplicates of it.
    async def main():
        buf = rb.Buffer(4, [rb.Rpc("train", 1, inputs=rb.GROUP_INPUTS)])
        ingest = rb.Ingest(buf, group_size=2)
        assert await ingest.add_rollout(rollout("p1", "0", 0.0)) == "pending"
        assert await ingest.add_rollout(rollout("p2", "0", 1.0)) == "uid_taken"
        assert await ingest.add_rollout(rollout("p1", "1", 1.0)) == "sealed"
        assert await ingest.add_rollout(rollout("p2", "1", 0.0)) == "uid_taken"
        assert await ingest.add_rollout(rollout("p1", "1", 1.0)) == "duplicate"
        counters = ingest.counters()
        assert (counters["uid_taken"], counters["duplicates"]) == (2, 1)
        assert (counters["stored_groups"], counters["pending_rollouts"]) == (1, 0)

    asyncio.run(main())
