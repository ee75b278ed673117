"""End to end on a local Ray cluster: producer tasks, a verifier scoring through leases, a
trainer taking packed batches and bumping the policy version, and the buffer actor killed
and recreated on its store halfway, with nothing lost and nothing trained twice."""

import numpy as np
import pytest

ray = pytest.importorskip("ray")

from rollout_buffer import GROUP_INPUTS  # noqa: E402
from rollout_buffer.ray import BufferActor  # noqa: E402

EXAMPLES = 60
GROUP = 4
MAX_STALENESS = 30
RPCS = [
    {"name": "verify", "n_seqs": 1, "inputs": ["output_tokens"], "outputs": ["reward"],
     "lease_timeout": 5.0},
    {"name": "train", "n_seqs": 1,
     "inputs": GROUP_INPUTS,
     "max_staleness": MAX_STALENESS},
]


def make_actor(store):
    actor = BufferActor.remote(
        256, RPCS, store=store, group_size=GROUP, seq_len=256, rows=1, advantage="rloo"
    )
    ray.get(actor.ready.remote())
    return actor


@ray.remote
def produce(actor, producer, examples=EXAMPLES):
    # Producer p writes rollout p of every example: groups complete across producers.
    rollouts = [
        {
            "environment": "math", "example_id": f"ex{e}", "policy_version": 0,
            "rollout_uid": f"{e}-{producer}", "replica_id": f"p{producer}",
            "prompt_tokens": np.arange(8, dtype=np.int32),
            "output_tokens": np.full(16, e * 10 + producer, np.int32),
            "logprobs": np.full(16, -0.5, np.float32),
        }
        for e in range(examples)
    ]
    return ray.get(actor.add_rollouts.remote(rollouts))


@ray.remote
class Verifier:
    """Scores groups through leases: reward 1 for odd producers, so every group has
    reward variance."""

    def __init__(self, actor):
        self.actor = actor

    def run(self, groups):
        for _ in range(groups):
            lease, samples = ray.get(self.actor.lease.remote("verify", 30.0))
            outs = [
                {"reward": np.array([float(i % 2) for i in range(len(s["output_tokens"]))])}
                for s in samples
            ]
            ray.get(self.actor.complete.remote(lease, outs))
        return groups


def train(actor, steps, first_step, trained):
    for step in range(first_step, first_step + steps):
        arrays = ray.get(actor.next_batch.remote(step))
        mask = arrays["loss_mask"]
        lags = step - arrays["policy_versions"][mask]
        assert (lags <= MAX_STALENESS).all(), f"step {step}: lag {lags.max()}"
        for gid in arrays["group_ids"]:
            assert gid not in trained, f"group {gid} trained twice"
            trained.add(gid)
        ray.get(actor.complete_batch.remote(step))
        ray.get(actor.set_policy_version.remote(step + 1))


def test_producers_verifier_trainer_and_a_restarted_actor(tmp_path):
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        store = str(tmp_path / "buffer")
        actor = make_actor(store)
        outcomes = ray.get([produce.remote(actor, p) for p in range(GROUP)])
        assert sum(o.count("sealed") for o in outcomes) == EXAMPLES
        verifier = Verifier.remote(actor)
        assert ray.get(verifier.run.remote(EXAMPLES)) == EXAMPLES
        trained = set()
        train(actor, 10, 0, trained)  # one group per batch (rows=1, 4 x 24 tokens < 256)
        assert len(trained) >= 10
        ray.get(actor.flush.remote())
        ray.kill(actor)
        # A new actor on the same store: everything acknowledged comes back.
        actor = make_actor(store)
        stats = ray.get(actor.stats.remote())
        assert stats["buffer"]["policy_version"] == 10
        left = stats["buffer"]["put"] - stats["buffer"]["freed"] - stats["buffer"]["filtered"]
        assert left == EXAMPLES - len(trained), stats
        train(actor, 10, 10, trained)
        assert len(trained) >= 20
        final = ray.get(actor.stats.remote())["buffer"]
        assert final["put"] - final["freed"] - final["filtered"] == EXAMPLES - len(trained)
        ray.get(actor.flush.remote())
    finally:
        ray.shutdown()


def test_a_dead_verifiers_lease_comes_back(tmp_path):
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        rpcs = [dict(RPCS[0], lease_timeout=0.5), RPCS[1]]
        actor = BufferActor.remote(16, rpcs, store=str(tmp_path / "b"), group_size=GROUP)
        ray.get(actor.ready.remote())
        ray.get([produce.remote(actor, p, 1) for p in range(GROUP)])
        _, samples = ray.get(actor.lease.remote("verify", 10.0))
        # The verifier holding the only group dies without a word. The next lease waits
        # until the dead one's 0.5 s lease timeout passes and gets the same group.
        lease, again = ray.get(actor.lease.remote("verify", 10.0))
        assert again[0]["id"] == samples[0]["id"]
        ray.get(actor.complete.remote(lease, [{"reward": np.array([0.0, 1.0, 0.0, 1.0])}]))
        verify_stats = ray.get(actor.stats.remote())["buffer"]["rpcs"]["verify"]
        assert verify_stats["redelivered"] == 1 and verify_stats["reads"] == 1
    finally:
        ray.shutdown()
