"""The sharded replay front on a local Ray cluster refusing input of the wrong kind as a
shard does, before it sends anything to any shard or starts one: bad rollouts (as
records or columns), text without UTF-8 under hash routing, steps that are no ints, an
empty dict of columns, and constructor options a shard would refuse."""

import re
from dataclasses import replace

import numpy as np
import pytest

ray = pytest.importorskip("ray")

import test_replay  # noqa: E402
from rollout_buffer.replay import ShardedReplayBuffer  # noqa: E402
from test_replay import Clock, group_of, rec  # noqa: E402
from test_replay_input import BAD_OPTIONS  # noqa: E402


# The shards unpickle the tests' clock by value (see conftest.py).
RAY_BY_VALUE = (test_replay,)


def front_of(root, shards=("math", "code"), **kw):
    kw.setdefault("target_group_size", 4)
    return ShardedReplayBuffer(str(root), list(shards), durable=False, clock=Clock(), **kw)


def received(front):
    return [s["received"] for s in front.stats()]


def columns(**change):
    return {
        "environment": ["math", "code"],
        "example_id": ["q", "q"],
        "policy_version": ["1", "1"],
        "rollout_uid": ["c0", "c1"],
        **change,
    }


@pytest.mark.parametrize(
    "data, message",
    [
        (columns(environment=["math", "\ud800"]), "'c1'.*'environment'.*UTF-8"),
        (columns(example_id=["q", "q\udcff"]), "'c1'.*'example_id'.*UTF-8"),
        (columns(token_count=[0, 2**70]), "'c1'.*'token_count'.*int64"),
        (columns(reward=[0.0, "high"]), "column 'reward'"),
        (columns(reward=[0.0]), "rollouts as columns"),  # of different lengths
        ({"example_id": ["q"], "policy_version": ["1"]}, "column 'environment' is missing"),
        ({"environment": ["math"], "policy_version": ["1"]}, "column 'example_id' is missing"),
        ([rec(), {"example_id": "q", "policy_version": "1"}], r"record 1: .*'environment'"),
        ([rec(), "math"], "record 1: a RolloutRecord or a dict, not str"),
        # Checks routing does not need: the "math" shard took its rollout before the
        # "code" shard refused its own, and that answer was lost with the error.
        (columns(reward=[0.0, float("nan")]), "'c1': field 'reward' is nan: not finite"),
        ([rec(uid="m0"), replace(rec(env="code", uid="c0"), reward=float("inf"))], "'c0': field 'reward' is inf"),
        (columns(token_count=[1, -1]), "'c1': field 'token_count' is -1"),
    ],
)
def test_the_sharded_front_names_bad_rollouts_as_a_shard_does(cluster, tmp_path, data, message):
    """The front built a dict of columns with ``pa.table`` (and read its routing columns
    and fields) before any shard checked it: Arrow's UnicodeEncodeError, OverflowError or
    KeyError named neither field nor uid. Now the shards' ValueError, before any shard is
    sent anything."""
    front = front_of(tmp_path / "sharded")
    with pytest.raises(ValueError, match=message):
        front.add_rollouts(data)
    with pytest.raises(ValueError, match=message):
        front.add_rollouts_refs(data)
    assert received(front) == [0, 0]
    assert front.add_rollouts(columns()) == ["pending", "pending"]
    assert received(front) == [1, 1]


def test_the_hash_sharded_front_routes_text_without_utf8_to_the_shard_that_names_it(cluster, tmp_path):
    """Hashing an environment with a lone surrogate raised a UnicodeEncodeError in the
    front; the shards' check, made by the front first, now names the field and uid."""
    front = ShardedReplayBuffer(str(tmp_path / "h"), 2, by="hash", durable=False, clock=Clock())
    with pytest.raises(ValueError, match="'the-bad-one': field 'environment' is not valid text"):
        front.add_rollouts([rec(env="\ud800", uid="the-bad-one")])
    assert received(front) == [0, 0]


def test_steps_counts_and_empty_adds(cluster, tmp_path):
    """The front passed a step of 1.9 to every shard, which answered with step 1's batch,
    and split ``sample_groups(1.5)`` as 2 groups; ``{}`` was refused with Arrow's
    KeyError."""
    front = front_of(tmp_path / "sharded")
    assert front.add_rollouts({}) == [] and front.add_rollouts_refs({}) == []
    assert received(front) == [0, 0]
    front.add_rollouts(group_of(env="math") + group_of(env="code"))
    drawn = front.next_batch(1, 2)
    for bad in (1.9, True):
        with pytest.raises(ValueError, match=re.escape(f"step must be an int, not {bad!r}")):
            front.next_batch(bad, 2)
    with pytest.raises(ValueError, match=r"n must be an int >= 0, not 1\.5"):
        front.sample_groups(1.5)
    assert front.next_batch(np.int32(1), 2) == drawn
    assert sum(s["batches"] for s in front.stats()) == 2, "one part a shard, nothing more"


@pytest.mark.parametrize("options, message", BAD_OPTIONS[::3])
def test_options_a_shard_would_refuse_are_refused_before_any_starts(cluster, tmp_path, options, message):
    root = tmp_path / "refused"
    with pytest.raises(ValueError, match=message):
        ShardedReplayBuffer(str(root), ["math", "code"], **options)
    assert not root.exists(), "no shard started (each makes its folder)"


def test_shards_of_the_wrong_kind_are_refused_and_numpy_counts_taken(cluster, tmp_path):
    """``ShardedReplayBuffer(root, "math")`` made shards m, a, t and h; a numpy count was
    refused where numpy ints are taken everywhere else; a version list given as a string
    was read character by character in every shard."""
    root = tmp_path / "kinds"
    for shards, kw, message in [("math", {}, "shards is a list of environment names"),
                                (["math"], {"accept_policy_versions": "12"}, "must be a list of policy versions")]:
        with pytest.raises(ValueError, match=message):
            ShardedReplayBuffer(str(root), shards, **kw)
    assert not root.exists(), "no shard started"
    front = ShardedReplayBuffer(str(tmp_path / "np"), np.int64(2), by="hash", durable=False, clock=Clock())
    assert len(front.handles) == 2


@pytest.mark.parametrize("long", ["e" * 250, "数" * 100])
def test_a_name_too_long_for_a_shards_partition_folder_is_refused_before_any_shard_takes_any(cluster, tmp_path, long):
    """A shard refused it (its partition folder name over 255 bytes) after the other
    shards had taken their rollouts, and the answers of those were lost with the error."""
    front = ShardedReplayBuffer(str(tmp_path / "hashed"), 2, by="hash", durable=False, clock=Clock(),
                                target_group_size=4)
    good = [rec(ex=f"q{i}", uid=f"u{i}") for i in range(8)]
    bad = rec(env=long, uid="far")
    for data in (good + [bad], columns(environment=["math", long])):
        with pytest.raises(ValueError, match="rollout (8|1) \\(uid '(far|c1)'\\): environment .* over the 255"):
            front.add_rollouts(data)
    assert sum(received(front)) == 0, "no shard took any"
    assert front.add_rollouts(good) == ["pending"] * 8


def test_an_environment_shard_folder_is_named_as_a_partition_folder_is(cluster, tmp_path):
    """The folder was ``shard=env-<name>`` unquoted: a ``/`` in an environment nested
    folders, and ``a/../../../out`` put its shard outside the root. Now the name is
    URL-quoted, and one no folder can carry is a ValueError before any shard starts."""
    root = tmp_path / "root"
    names = ["math/gsm8k", "a/../../../out"]
    front = front_of(root, names)
    for env in names:
        assert front.add_rollouts(group_of(env))[-1] == "sealed"
    front.flush()
    assert sorted(p.name for p in root.iterdir()) == ["shard=env-a%2F..%2F..%2F..%2Fout", "shard=env-math%2Fgsm8k"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["root"], "nothing outside the root"
    tables = ray.get(front.batch_refs(front.sample_groups(2)))
    assert {e for t in tables for e in t.column("environment").to_pylist()} == set(names)
    # A folder of an earlier run under the unquoted name: refused, not started empty beside.
    (tmp_path / "old" / "shard=env-math" / "gsm8k").mkdir(parents=True)
    with pytest.raises(ValueError, match="'shard=env-math/gsm8k' under .* holds the data of an earlier run"):
        front_of(tmp_path / "old", ["math/gsm8k"])
    for long, message in [("e" * 250, r"environment 'e{40}'\.\.\. names a shard folder of 260 bytes .* over the 255"),
                          ("\ud800", r"environment '\\ud800' is text without a UTF-8 form")]:
        refused = tmp_path / "refused"
        with pytest.raises(ValueError, match=message):
            front_of(refused, ["math", long])
        assert not refused.exists(), "no shard started"
