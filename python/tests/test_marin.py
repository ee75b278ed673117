"""rollout_buffer.marin against Marin's replay buffer as ``research/slime_marin_api.md`` A.3
describes it: freshness, per-environment capacity, recency-weighted draws without
replacement, retirement, the skipped inputs, stats, the data loader, and the newer
group API. Rollouts are plain stand-in classes written here (no Marin, no JAX)."""

import threading
import time
from collections import defaultdict

import numpy as np
import pytest

from rollout_buffer.marin import ReplayBuffer, ReplayBufferConfig, ReplayDataLoader, rloo_advantages


class Meta:
    def __init__(self, weight_step, timestamp=None):
        self.weight_step = weight_step
        self.timestamp = time.time() if timestamp is None else timestamp


class R:
    """A rollout as the buffer reads it."""

    def __init__(self, env, example, reward, step=0, timestamp=None):
        self.env_name, self.env_example_id = env, example
        self.episode_reward = reward
        self.metadata = Meta(step, timestamp)


class Group:
    def __init__(self, rollouts, group_id=None):
        self.rollouts = rollouts
        if group_id is not None:
            self.metadata = type("M", (), {"group_id": group_id, "lesson_id": "l0"})()


class Batch:
    def __init__(self, groups):
        self.groups = groups


def batch(env, n_groups, size=4, step=0, tag="", timestamp=None, rewards=None):
    return Batch([
        Group([R(env, f"{tag}{env}-{g}-{k}", (rewards or [0.0, 1.0, 0.5, 1.0])[k % 4], step, timestamp)
               for k in range(size)])
        for g in range(n_groups)
    ])


def buffer(**kw):
    args = dict(capacity=100, local_batch_size=8, alpha=3.0, max_samples=-1, max_rollout_step_delay=1, seed=7)
    args.update(kw)
    return ReplayBuffer(**args)


class Reference:
    """Marin's sampler as the notes describe it, on plain lists: env labels drawn without
    replacement in proportion to the stored counts, then per env (in order of first
    label) recency weights (i+1)**alpha without replacement, uses counted, overused
    retired."""

    def __init__(self, batch_size, alpha, max_samples, seed):
        self.b, self.alpha, self.max = batch_size, alpha, max_samples
        self.rng = np.random.default_rng(seed=seed)
        self.store = {}

    def add(self, env, items):
        self.store.setdefault(env, []).extend([it, 0] for it in items)

    def sample(self):
        envs = [e for e, xs in self.store.items() if xs]
        labels = [e for e in envs for _ in self.store[e]]
        if not envs or len(labels) < self.b:
            return None
        drawn = self.rng.choice(np.array(labels), size=self.b, replace=False)
        counts = defaultdict(int)
        for e in drawn:
            counts[e] += 1
        out = []
        for e, n in counts.items():
            xs = self.store[e]
            w = (np.arange(len(xs)) + 1) ** self.alpha
            for i in self.rng.choice(len(xs), p=w / w.sum(), size=n, replace=False):
                xs[i][1] += 1
                out.append(xs[i][0])
        if self.max >= 0:
            for e in self.store:
                self.store[e] = [x for x in self.store[e] if x[1] < self.max]
        return out


def test_draws_are_marins_draw_for_draw():
    buf = buffer(max_samples=2)
    ref = Reference(8, 3.0, 2, seed=7)
    for round_ in range(6):
        for env, n in (("math", 3), ("code", 1), ("chess", 2)):
            b = batch(env, n, tag=f"r{round_}")
            buf.add_batches([b])
            ref.add(env, [r.env_example_id for g in b.groups for r in g.rollouts])
        for _ in range(3):
            got = buf.sample_rollouts()
            want = ref.sample()
            assert (got is None) == (want is None)
            if got is not None:
                assert [x.rollout.env_example_id for x in got] == want
    assert buf.size() == sum(len(xs) for xs in ref.store.values())


def test_freshness_of_batches_and_of_stored_rollouts():
    buf = buffer(max_rollout_step_delay=1, max_rollout_timestamp_delay=100.0)
    buf.set_current_step(5)
    buf.add_batches([batch("math", 1, step=6)])  # from the future: skipped
    buf.add_batches([batch("math", 1, step=3)])  # too old: skipped
    buf.add_batches([batch("math", 1, step=4, tag="a"), batch("math", 1, step=5, tag="b")])
    assert buf.size() == 8 and buf.get_stats()["total_batches_added"] == 2
    buf.add_batches([batch("math", 1, step=5, timestamp=time.time() - 100.5)])  # past the limit
    assert buf.size() == 8
    buf.set_current_step(6)
    assert buf.size() == 4, "step 4 is now two behind"
    buf.set_current_step(8)
    assert buf.size() == 0 and buf.get_stats()["num_environments"] == 1


def test_is_rollout_fresh_is_marins():
    """Marin's own test calls the private check: the step window, futures refused, and the
    timestamp delay."""
    buf = buffer(max_rollout_step_delay=2, max_rollout_timestamp_delay=60.0)
    now = 1000.0
    assert buf._is_rollout_fresh(10, now, 10, now)
    assert buf._is_rollout_fresh(8, now, 10, now)
    assert not buf._is_rollout_fresh(7, now, 10, now)
    assert not buf._is_rollout_fresh(11, now, 10, now), "a rollout from the future"
    assert buf._is_rollout_fresh(10, now - 59.0, 10, now)
    assert not buf._is_rollout_fresh(10, now - 60.0, 10, now)


def test_capacity_keeps_the_newest_per_environment_and_groups_keep_their_survivors():
    buf = buffer(capacity=6, local_batch_size=12)
    buf.add_batches([Batch([Group([R("math", f"g0-{k}", float(k % 2)) for k in range(4)], group_id="g0")])])
    buf.add_batches([Batch([Group([R("math", f"g1-{k}", float(k % 2)) for k in range(4)], group_id="g1")])])
    buf.add_batches([batch("code", 2)])
    stats = buf.get_stats()
    assert stats["env_sizes"] == {"math": 6, "code": 6} and stats["total_size"] == 12
    # A batch of everything stored: g0 lost its two oldest members to the capacity.
    seqs = buf.sample_sequences()
    by_group = {s.group_id: s.group for s in seqs}
    assert [r.env_example_id for r in by_group["g0"].trajectories] == ["g0-2", "g0-3"]
    assert by_group["g0"].lesson_id == "l0"
    assert len(by_group["g1"].trajectories) == 4
    assert sorted(s.trajectory.env_example_id for s in seqs if s.group_id == "g0") == ["g0-2", "g0-3"]
    # RLOO runs over the survivors (a singleton gets 0).
    assert rloo_advantages([1.0]).tolist() == [0.0]
    assert rloo_advantages([1.0, 0.0, 0.5]).tolist() == [0.75, -0.75, 0.0]
    groups = buf.sample_groups()
    assert len({g.group_id for g in groups}) == len(groups)


def test_uses_retire_rollouts_and_zero_max_samples_empties_the_buffer():
    buf = buffer(capacity=100, local_batch_size=4, max_samples=1)
    buf.add_batches([batch("math", 2)])
    first = buf.sample_rollouts()
    assert len(first) == 4 and all(x.usage_count == 1 for x in first)
    second = buf.sample_rollouts()
    assert {id(x) for x in first}.isdisjoint(id(x) for x in second), "a used-up rollout never returns"
    assert buf.sample_rollouts() is None and buf.size() == 0
    zero = buffer(local_batch_size=2, max_samples=0)
    zero.add_batches([batch("math", 2)])
    assert len(zero.sample_rollouts()) == 2
    assert zero.size() == 0, "max_samples=0 retires everything after the first call, as Marin"


def test_skipped_inputs_never_raise():
    buf = buffer(local_batch_size=4)
    buf.add_batches([Batch([]), Batch([Group([])]), Batch([Group([R("math", "a", 1.0)]), Group([])])])
    assert buf.size() == 1
    assert buf.sample_rollouts() is None, "never a partial batch"
    assert buffer().sample_rollouts() is None
    flat = buffer(filter_out_groups_with_no_variance=True)
    flat.add_batches([batch("math", 1, rewards=[1.0, 1.0, 1.0, 1.0]), batch("math", 1, tag="v")])
    assert flat.size() == 4
    kept = buffer(filter_out_groups_with_no_variance=False)
    kept.add_batches([batch("math", 1, rewards=[1.0, 1.0, 1.0, 1.0])])
    assert kept.size() == 4


def test_advantages_are_computed_at_ingestion_by_the_loss_module():
    class Zero:
        calls = 0

        def compute_advantages(self, rollouts):
            Zero.calls += 1
            return np.full(len(rollouts), 0.25)

    buf = ReplayBuffer.from_config(
        ReplayBufferConfig(capacity=10, alpha=1.0, max_samples=-1, max_rollout_step_delay=0),
        local_batch_size=4, total_processes=1, loss_module=Zero(), seed=0,
    )
    buf.add_batches([batch("math", 1)])
    assert Zero.calls == 1 and {x.advantage for x in buf.sample_rollouts()} == {0.25}
    rloo = buffer(local_batch_size=4)
    rloo.add_batches([batch("math", 1, rewards=[0.0, 1.0, 0.0, 1.0])])
    got = {x.rollout.env_example_id: x.advantage for x in rloo.sample_rollouts()}
    assert got["math-0-0"] == pytest.approx(-2 / 3) and got["math-0-1"] == pytest.approx(2 / 3)


def test_the_data_loader_waits_on_the_buffer():
    class Reader:
        def __init__(self):
            self.pending, self.lock = [], threading.Lock()

        def push(self, b):
            with self.lock:
                self.pending.append(b)

        def read_all_available(self):
            with self.lock:
                out, self.pending = self.pending, []
            return out

    reader = Reader()
    buf = buffer(local_batch_size=8)
    with ReplayDataLoader(reader, buf, rollout_fetch_interval=0.01) as loader:
        assert loader.get_rollouts(timeout=0.05) is None
        reader.push(batch("math", 2))
        got = loader.get_rollouts(timeout=30)
        assert got is not None and len(got) == 8
        with pytest.raises(RuntimeError):
            loader.start()
    # A waiter is woken by add_batches itself.
    results = []
    waiter = threading.Thread(target=lambda: results.append(buf.wait_for_batch(30)))
    waiter.start()
    buf.add_batches([batch("code", 2)])
    waiter.join(30)
    assert results and results[0] is not None and len(results[0]) == 8


class GroupReference:
    """Marin's newest group sampler as its notes describe it, on plain lists: per pick, an
    environment drawn uniformly over the rollouts of its groups not picked yet, then one of
    those groups with weight (j + 1) ** alpha by the order of their newest rollouts; every
    member of a picked group counts a use; overused rollouts retire after the call."""

    def __init__(self, batch_size, alpha, max_samples, seed):
        self.b, self.alpha, self.max = batch_size, alpha, max_samples
        self.rng = np.random.default_rng(seed=seed)
        self.store = {}  # env -> [[group, rollout id, uses]]

    def add(self, env, group, ids):
        self.store.setdefault(env, []).extend([group, i, 0] for i in ids)

    def sample(self, target=None):
        target = self.b if target is None else target
        avail, size = {}, defaultdict(int)
        for env, xs in self.store.items():
            newest = {}
            for j, (g, _, _) in enumerate(xs):
                newest[g] = j
                size[g] += 1
            avail[env] = sorted(newest, key=newest.get)
        if sum(size.values()) < target:
            return None
        picked, n = [], 0
        while n < target:
            labels = [e for e, gs in avail.items() for g in gs for _ in range(size[g])]
            env = str(self.rng.choice(np.array(labels)))
            w = (np.arange(len(avail[env])) + 1) ** self.alpha
            g = avail[env].pop(int(self.rng.choice(len(avail[env]), p=w / w.sum())))
            picked.append((g, [x[1] for x in self.store[env] if x[0] == g]))
            n += size[g]
        for xs in self.store.values():
            for x in xs:
                if any(x[0] == g for g, _ in picked):
                    x[2] += 1
        if self.max >= 0:
            for e in self.store:
                self.store[e] = [x for x in self.store[e] if x[2] < self.max]
        return picked


def test_sample_groups_draws_whole_groups_as_marin_does_and_counts_every_member():
    """It had drawn single rollouts and returned their groups, counting a use only on the
    members drawn: with max_samples=1 a rollout came back three times."""
    buf = buffer(local_batch_size=6, alpha=2.0, max_samples=1, seed=3)
    ref = GroupReference(6, 2.0, 1, seed=3)
    served = defaultdict(int)
    for round_ in range(5):
        for env, n, size in (("math", 3, 4), ("code", 2, 2)):
            b = Batch([Group([R(env, f"{env}-r{round_}-{g}-{k}", float(k % 2)) for k in range(size)],
                             group_id=f"{env}-r{round_}-{g}") for g in range(n)])
            buf.add_batches([b])
            for grp in b.groups:
                ref.add(env, grp.metadata.group_id, [r.env_example_id for r in grp.rollouts])
        for target in (None, 3):
            got = buf.sample_groups(min_trajectories=target)
            want = ref.sample(target)
            assert (got is None) == (want is None)
            if got is None:
                continue
            assert [(g.group_id, [r.env_example_id for r in g.trajectories]) for g in got] == want
            for g in got:
                for r in g.trajectories:
                    served[r.env_example_id] += 1
    assert served and max(served.values()) == 1, "max_samples=1: each rollout served once"
    assert buf.size() == sum(len(xs) for xs in ref.store.values())
    with pytest.raises(ValueError, match="min_trajectories must be an int >= 1"):
        buf.sample_groups(min_trajectories=0)


def test_the_loader_serves_marins_newer_names():
    class Reader:
        def read_all_available(self):
            return []

    buf = buffer(local_batch_size=4)
    loader = ReplayDataLoader(Reader(), buf)
    assert loader.get_groups(timeout=0) is None and loader.get_trajectories(timeout=0) is None
    buf.add_batches([batch("math", 2)])
    assert sum(len(g.trajectories) for g in loader.get_groups(timeout=0)) >= 4
    assert len(loader.get_trajectories(timeout=0)) == 4


def test_group_and_lesson_ids_come_from_the_rollouts_metadata_too():
    """Marin's newer rollouts carry group_id and lesson_id in their own metadata (its tests
    build groups that way); they had been ignored, every such group given a made-up id."""
    from rollout_buffer.marin import Rollout, RolloutBatch, RolloutGroup, RolloutMetadata

    buf = buffer(local_batch_size=2)
    md = RolloutMetadata(worker_id="w", timestamp=time.time(), weight_step=0, lesson_id="lesson_0",
                         group_id="group_0")
    rollouts = [Rollout("env1", f"e{k}", None, None, None, None, float(k), metadata=md) for k in range(2)]
    buf.add_batches([RolloutBatch([RolloutGroup(rollouts)])])
    [g] = buf.sample_groups()
    assert (g.group_id, g.lesson_id, len(g.trajectories)) == ("group_0", "lesson_0", 2)
    stored = buf.rollout_storage["env1"]
    assert [s.trajectory.env_example_id for s in stored] == ["e0", "e1"]
    assert all(s.group_id == "group_0" and s.usage_count == 1 for s in stored)


def test_a_group_draw_that_fails_counts_nothing():
    buf = buffer(local_batch_size=2, alpha=1e6)
    buf.add_batches([batch("math", 3)])
    with pytest.raises(ValueError, match="alpha=1000000.0: .* the groups of environment 'math' .*nothing was drawn"):
        buf.sample_groups()
    assert buf.get_stats()["total_batches_sampled"] == 0
    assert all(s.usage_count == 0 for s in buf.rollout_storage["math"])


def test_a_group_id_in_two_environments_is_two_groups_to_sample_groups():
    """Groups were keyed by id alone across environments: one id in two environments was
    counted with the wrong size and had its uses counted on the wrong environment's rows;
    and the group index still was, so each pick returned both environments' members,
    counting uses on one: with max_samples=1 a rollout was served twice."""
    buf = buffer(local_batch_size=2, max_samples=1)
    for env in ("math", "code"):
        buf.add_batches([Batch([Group([R(env, f"{env}-{k}", float(k % 2)) for k in range(2)], group_id="g")])])
    trajectories = buf.rollout_storage
    for env, stored in trajectories.items():
        assert {r.env_name for s in stored for r in s.group.trajectories} == {env}
    served = []
    for _ in range(2):
        [g] = buf.sample_groups()
        assert g.group_id == "g" and len({r.env_name for r in g.trajectories}) == 1, g
        served += [r.env_example_id for r in g.trajectories]
    assert sorted(served) == ["code-0", "code-1", "math-0", "math-1"]
    assert buf.sample_groups() is None and buf.size() == 0


def test_group_ids_are_ids_whatever_their_value_and_made_up_ones_never_merge():
    """An id of 0 was replaced by a made-up one (``or``), and a made-up id ("math/0") took
    in a later group whose own id was that text: one record of two prompts."""
    buf = buffer(local_batch_size=16)
    buf.add_batches([Batch([Group([R("math", f"z{k}", float(k)) for k in range(2)], group_id=0)])])
    buf.add_batches([Batch([Group([R("math", f"none{k}", float(k)) for k in range(2)])])])
    buf.add_batches([Batch([Group([R("math", f"named{k}", float(k)) for k in range(2)], group_id="math/0")])])
    stored = buf.rollout_storage["math"]
    groups = {s.trajectory.env_example_id: (s.group_id, [r.env_example_id for r in s.group.trajectories])
              for s in stored}
    assert groups["z0"] == (0, ["z0", "z1"])
    assert groups["none0"] == ("math/0", ["none0", "none1"])
    assert groups["named0"] == ("math/0", ["named0", "named1"])
    assert stored[0].group is stored[1].group, "one record per group in a snapshot"


def test_alpha_set_after_a_draw_is_the_next_draws_alpha():
    """The weights (i + 1) ** alpha were kept from the first draw: alpha set to 0 later
    still drew with the old one. A bad alpha set is refused as the constructor's."""
    buf = buffer(max_samples=-1)
    ref = Reference(8, 3.0, -1, seed=7)
    b = batch("math", 10)
    buf.add_batches([b])
    ref.add("math", [r.env_example_id for g in b.groups for r in g.rollouts])
    for alpha in (3.0, 0.0, 8.0):
        buf.alpha = alpha
        ref.alpha = alpha
        for _ in range(3):
            assert [x.rollout.env_example_id for x in buf.sample_rollouts()] == ref.sample()
    with pytest.raises(ValueError, match="alpha must be a number"):
        buf.alpha = float("nan")
    assert buf.alpha == 8.0


def test_the_stand_in_types_take_the_fields_of_marins_revisions():
    from rollout_buffer.marin import Rollout, RolloutMetadata

    md = RolloutMetadata(worker_id="w", timestamp=time.time(), weight_step=0, trace_id="t", task_name="gsm8k",
                         task_version="1", run_id="r", verifier_name="v", verifier_version="2", trace_ref="ref")
    older = Rollout("math", "e0", None, None, None, None, 1.0, metadata=md, temperature=1.0, top_k=None)
    newer = Rollout("math", "e1", None, None, None, None, 0.0, metadata=md, decoding={"temperature": 0.7})
    buf = buffer(local_batch_size=2)
    buf.add_batches([Batch([Group([older, newer])])])
    got = buf.sample_rollouts()
    assert {x.rollout.env_example_id for x in got} == {"e0", "e1"}
    assert {x.rollout.metadata.task_name for x in got} == {"gsm8k"}
