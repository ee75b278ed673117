"""rollout_buffer.ray.BufferActor on a local Ray cluster given input of the wrong kind and
calls out of order: outputs the buffer refuses (the lease stays held), rewards the
trainer could not read (a poison group that failed every next_batch), lease ids across a
restart, a step asked for twice or concurrently, steps, versions, RPC names and rollout
lists of the wrong kind, constructor arguments that left every next_batch failing,
leases of dead consumers, and producers, verifiers and a trainer running at once."""

import time

import numpy as np
import pytest

ray = pytest.importorskip("ray")

from rollout_buffer import GROUP_INPUTS  # noqa: E402
from rollout_buffer.ray import BufferActor  # noqa: E402

RPCS = [
    {"name": "verify", "n_seqs": 1, "inputs": ["output_tokens"], "outputs": ["reward"], "lease_timeout": 30.0},
    {"name": "train", "n_seqs": 1, "inputs": GROUP_INPUTS},
]


def rollout(example, member, **change):
    r = {
        "environment": "math", "example_id": f"ex{example}", "policy_version": 0,
        "rollout_uid": f"{example}-{member}",
        "prompt_tokens": np.arange(4, dtype=np.int32),
        "output_tokens": np.full(6, member, np.int32),
        "logprobs": np.full(6, -0.5, np.float32),
    }
    r.update(change)
    return r


def actor_with(groups, rpcs=RPCS, **kw):
    """An actor holding ``groups`` sealed groups of two rollouts, none verified."""
    kw.setdefault("group_size", 2)
    kw.setdefault("seq_len", 64)
    kw.setdefault("rows", 1)
    actor = BufferActor.remote(64, rpcs, **kw)
    ray.get(actor.add_rollouts.remote([rollout(e, m) for e in range(groups) for m in range(2)]))
    return actor


def cause(excinfo):
    """The exception a remote call raised (Ray wraps it)."""
    return getattr(excinfo.value, "cause", None) or excinfo.value


def raises(ref, kind, match):
    with pytest.raises(Exception) as excinfo:
        ray.get(ref, timeout=60)
    err = cause(excinfo)
    assert isinstance(err, kind), repr(err)
    assert match in str(err), str(err)
    return err


GOOD = [{"reward": np.array([0.0, 1.0])}]


# ----- leases -------------------------------------------------------------------------------


def test_outputs_the_buffer_refuses_leave_the_lease_held(cluster):
    actor = actor_with(1)
    lease, _ = ray.get(actor.lease.remote("verify", 10.0))
    raises(actor.complete.remote(lease, []), ValueError, "0 patches for 1 samples")
    raises(actor.complete.remote(lease, [{"bogus": np.zeros(2)}]), ValueError, "bogus")
    # The lease was popped before the buffer refused the outputs: the retry was a
    # KeyError and the group went back to the RPC.
    ray.get(actor.complete.remote(lease, GOOD))
    verify = ray.get(actor.stats.remote())["buffer"]["rpcs"]["verify"]
    assert verify["reads"] == 1 and verify["redelivered"] == 0, verify


@pytest.mark.parametrize(
    "reward, message",
    [
        (np.array([0.0, 1.0], np.float32), None),  # stored as float32: unreadable
        ([1, 0], None),  # a list: the buffer refused it naming no group
        (1.0, "must be a 1-d array of numbers"),  # one value for two rollouts
        (np.array([0.5]), "1 rewards for the group's 2 rollouts"),
        (np.array([0.0, 1.0, 2.0]), "3 rewards for the group's 2 rollouts"),  # the 3rd ignored
        (np.array([[0.0, 1.0]]), "must be a 1-d array"),
        ("high", "must be a 1-d array"),
        (np.array([True, False]), "must be a 1-d array of numbers"),
        (np.array([np.nan, 1.0]), "reward 0 is nan"),  # the group was dropped without a word
        (np.array([0.0, np.inf]), "reward 1 is inf"),
    ],
)
def test_a_reward_the_trainer_cannot_read_is_refused_at_complete(cluster, reward, message):
    actor = actor_with(2)
    lease, samples = ray.get(actor.lease.remote("verify", 10.0))
    if message is not None:
        err = raises(actor.complete.remote(lease, [{"reward": reward}]), ValueError, message)
        assert f"output 0 (group {samples[0]['id']!r}), field 'reward'" in str(err)
        reward = [0.0, 1.0]  # the verifier's fixed retry, on the same lease
    ray.get(actor.complete.remote(lease, [{"reward": reward}]))
    lease2, _ = ray.get(actor.lease.remote("verify", 10.0))
    ray.get(actor.complete.remote(lease2, GOOD))
    # Before: the unreadable group was given back to the trainer first, and failed, at
    # every next_batch ("`reward` is not float64", "rollout 1: no reward").
    for step in range(2):
        arrays = ray.get(actor.next_batch.remote(step), timeout=60)
        ray.get(actor.complete_batch.remote(step))
        if samples[0]["id"] in list(arrays["group_ids"]):
            break
    else:
        pytest.fail("the verified group never reached the trainer")


def test_a_lease_id_from_before_a_restart_is_refused(cluster, tmp_path):
    actor = BufferActor.options(max_restarts=1, max_task_retries=0).remote(
        64, RPCS, store=str(tmp_path / "b"), group_size=2
    )
    ray.get(actor.add_rollouts.remote([rollout(e, m) for e in range(3) for m in range(2)]))
    done, _ = ray.get(actor.lease.remote("verify", 10.0))
    ray.get(actor.complete.remote(done, GOOD))
    held, held_samples = ray.get(actor.lease.remote("verify", 10.0))  # ex1, in flight at the crash
    ray.get(actor.flush.remote())
    ray.kill(actor, no_restart=False)
    deadline = time.monotonic() + 60
    while True:  # until the restarted actor answers (its ingestion counts start again)
        try:
            if ray.get(actor.stats.remote())["ingest"]["received"] == 0:
                break
        except (ray.exceptions.ActorUnavailableError, ray.exceptions.ActorDiedError):
            pass
        assert time.monotonic() < deadline, "the actor did not restart"
        time.sleep(0.2)
    # Two verifiers lease the groups left: ex1 (its lease died with the actor), then ex2.
    leases = [ray.get(actor.lease.remote("verify", 10.0)) for _ in range(2)]
    assert [s[0]["id"] for _, s in leases][0] == held_samples[0]["id"]
    assert {done, held}.isdisjoint(lease for lease, _ in leases)
    # The old verifier finishes late. Lease ids counted from 0 in every actor, so its id
    # (1) named the new lease of ex2, which it completed with ex1's rewards.
    raises(actor.complete.remote(held, [{"reward": np.array([0.25, 0.75])}]), KeyError, "restarted")
    for lease, _ in leases:
        ray.get(actor.complete.remote(lease, GOOD))


@pytest.mark.parametrize("call", ["complete", "commit", "release"])
def test_an_unknown_lease_says_what_it_may_be(cluster, call):
    actor = actor_with(1)
    lease, _ = ray.get(actor.lease.remote("verify", 10.0))
    ray.get(actor.complete.remote(lease, GOOD))
    args = (lease, GOOD) if call == "complete" else (lease,)
    # Was KeyError(<the id>), saying nothing else.
    raises(getattr(actor, call).remote(*args), KeyError, "already completed, committed or released")
    raises(getattr(actor, call).remote(*((["x"], GOOD) if call == "complete" else (["x"],))), KeyError, "not held")


def test_leases_of_dead_consumers_are_let_go(cluster):
    rpcs = [dict(RPCS[0], lease_timeout=0.2), RPCS[1]]
    actor = actor_with(2, rpcs)
    dead, _ = ray.get(actor.lease.remote("verify", 10.0))  # its consumer dies
    time.sleep(0.6)
    lease, _ = ray.get(actor.lease.remote("verify", 10.0))
    # The dead consumer's batch was kept by the actor for good, one per dead consumer.
    assert ray.get(actor.stats.remote())["leases"] == 1
    raises(actor.complete.remote(dead, GOOD), KeyError, "lease_timeout")
    ray.get(actor.complete.remote(lease, GOOD))
    assert ray.get(actor.stats.remote())["leases"] == 0


@pytest.mark.parametrize(
    "rpc, message", [(None, "rpc must be a str"), (5, "rpc must be a str"), ("\ud800", "rpc '\\ud800' is not valid text")]
)
def test_an_rpc_name_of_the_wrong_kind_is_named(cluster, rpc, message):
    # Was a TypeError ("'None' is not an instance of 'str'") or a UnicodeEncodeError.
    actor = actor_with(1)
    raises(actor.lease.remote(rpc, 1.0), ValueError, message)


# ----- the trainer --------------------------------------------------------------------------


def verified(groups):
    actor = actor_with(groups, seq_len=24)  # one group (2 x 10 tokens) per batch
    for _ in range(groups):
        lease, _ = ray.get(actor.lease.remote("verify", 10.0))
        ray.get(actor.complete.remote(lease, GOOD))
    return actor


def test_a_step_asked_for_again_is_the_same_batch(cluster):
    actor = verified(3)
    first = ray.get(actor.next_batch.remote(0))
    # A retry (a caller that timed out, a retried task) dropped the first batch, whose
    # groups came back and were trained on twice.
    again = ray.get(actor.next_batch.remote(0))
    assert list(first["group_ids"]) == list(again["group_ids"]) and len(first["group_ids"]) == 1
    ray.get(actor.complete_batch.remote(0))
    trained = list(first["group_ids"])
    for step in (1, 2):
        trained += list(ray.get(actor.next_batch.remote(step))["group_ids"])
        ray.get(actor.complete_batch.remote(step))
    assert len(trained) == len(set(trained)) == 3, trained
    assert ray.get(actor.stats.remote())["steps"] == 0


def test_concurrent_callers_of_one_step_share_its_batch(cluster):
    actor = verified(2)

    @ray.remote
    def ask(a, step):
        return list(ray.get(a.next_batch.remote(step))["group_ids"])

    got = ray.get([ask.remote(actor, 7) for _ in range(4)])
    assert all(g == got[0] for g in got) and len(got[0]) == 1, got
    ray.get(actor.complete_batch.remote(7))
    # Each caller's batch replaced the last, which went back: the next step trained
    # one of the same groups again.
    rest = list(ray.get(actor.next_batch.remote(8))["group_ids"])
    ray.get(actor.complete_batch.remote(8))
    assert len(rest) == 1 and rest != got[0], (got, rest)


@pytest.mark.parametrize("step", [0.0, True, None, "0", [0]])
def test_steps_must_be_ints(cluster, step):
    # They keyed the held batches: 0.0 and True completed step 0 (and 1), "0" did not.
    actor = verified(1)
    raises(actor.next_batch.remote(step), ValueError, "step must be an int")
    raises(actor.complete_batch.remote(step), ValueError, "step must be an int")


def test_an_unknown_step_says_so(cluster):
    actor = verified(1)
    raises(actor.complete_batch.remote(3), KeyError, "step 3 has no batch")  # was KeyError(3)


def test_a_step_completed_before_its_batch_is_made_says_so(cluster):
    actor = actor_with(0)  # nothing to train on: next_batch waits the batcher's second
    pending = actor.next_batch.remote(0)
    raises(actor.complete_batch.remote(0), ValueError, "still being made")
    # Nothing to train on: the step waits for a group past the batcher's wait, rather
    # than be handed a batch of padding alone.
    ready, _ = ray.wait([pending], timeout=3)
    assert not ready
    raises(actor.complete_batch.remote(0), ValueError, "still being made")


@pytest.mark.parametrize("version", [-1, 2**64, True, 1.5, "2", None])
def test_a_policy_version_of_the_wrong_kind_is_named(cluster, version):
    # Were OverflowError ("can't convert negative int to unsigned"), TypeError, or True
    # taken as 1.
    actor = verified(1)
    raises(actor.set_policy_version.remote(version), ValueError, "version must be an int")
    ray.get(actor.set_policy_version.remote(np.int64(2)))
    assert ray.get(actor.stats.remote())["buffer"]["policy_version"] == 2


# ----- producers ----------------------------------------------------------------------------


@pytest.mark.parametrize("rollouts", [rollout(0, 0), None, "ex0", 5])
def test_rollouts_that_are_no_list_are_refused(cluster, rollouts):
    # A dict was iterated as its keys ("a rollout is a dict"); None was a TypeError.
    actor = actor_with(0)
    raises(actor.add_rollouts.remote(rollouts), ValueError, "rollouts must be a list of rollout dicts")


def test_a_bad_rollout_names_its_index_and_what_was_added(cluster):
    actor = actor_with(0)
    batch = [rollout(1, 0), rollout(1, 1, logprobs=np.zeros(2, np.float32)), rollout(2, 0)]
    raises(actor.add_rollouts.remote(batch), ValueError, "rollouts[1]: rollout `1-1`")
    err = raises(actor.add_rollouts.remote(batch), ValueError, "rollouts[:1] were added: ['duplicate']")
    assert "rollouts[1:] were not" in str(err)
    assert ray.get(actor.add_rollouts.remote([rollout(1, 1), rollout(2, 0)])) == ["sealed", "pending"]


# ----- the constructor ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "change, message",
    [
        ({"trainer_rpc": "nope"}, "trainer_rpc 'nope' is none of the RPCs"),  # every next_batch failed
        ({"rpcs": [RPCS[0], dict(RPCS[1], n_seqs=2)]}, "must lease one group at a time"),
        ({"rpcs": [RPCS[0], dict(RPCS[1], inputs=["output_tokens"])]}, "missing: ['prompt_tokens'"),
        ({"rpcs": RPCS[1]}, "rpcs must be a list of dicts"),  # a dict alone, read as its keys
        ({"rpcs": ["train"]}, "rpcs[0] must be a dict"),
        ({"rpcs": [RPCS[0], dict(RPCS[1], bogus=1)]}, "rpcs[1] ('train'): "),  # a bare TypeError
    ],
)
def test_a_constructor_that_could_never_train_is_refused(cluster, change, message):
    args = {"capacity": 64, "rpcs": RPCS, **change}
    actor = BufferActor.remote(**args)
    with pytest.raises(ray.exceptions.RayActorError) as excinfo:
        ray.get(actor.ready.remote(), timeout=60)
    assert "ValueError" in str(excinfo.value) and message in str(excinfo.value), str(excinfo.value)


# ----- many callers at once -----------------------------------------------------------------


@ray.remote
def produce(actor, examples, producer):
    # Every producer sends every rollout: each is stored once, the rest are duplicates.
    return ray.get(actor.add_rollouts.remote([rollout(e, m) for e in examples for m in range(2)]))


@ray.remote
def verify(actor, n):
    ids = []
    for _ in range(n):
        lease, samples = ray.get(actor.lease.remote("verify", 30.0))
        ids.append(samples[0]["id"])
        ray.get(actor.complete.remote(lease, GOOD))
    return ids


def test_producers_verifiers_and_a_trainer_at_once_lose_and_repeat_nothing(cluster):
    examples = 12
    actor = BufferActor.remote(64, RPCS, group_size=2, seq_len=24, rows=1)
    outcomes = ray.get([produce.remote(actor, range(examples), p) for p in range(3)])
    assert sum(o.count("sealed") for o in outcomes) == examples
    verified_ids = ray.get([verify.remote(actor, examples // 2) for _ in range(2)])
    flat = [i for ids in verified_ids for i in ids]
    assert len(flat) == len(set(flat)) == examples
    trained = []
    step = 0
    while len(trained) < examples:
        trained += list(ray.get(actor.next_batch.remote(step), timeout=60)["group_ids"])
        ray.get(actor.complete_batch.remote(step))
        step += 1
        assert step < 4 * examples, "the trainer starved"
    assert sorted(trained) == sorted(flat)
