"""rollout_buffer.replay refusing input of the wrong kind, continued from test_replay.py:
steps and options that are no ints, score names with no UTF-8, an empty dict of columns.
Each refusal is a ValueError naming the parameter or field (and the uid or row), with
nothing taken or changed. The sharded front's checks run on real Ray in
test_replay_ray_input.py."""

import math
import re

import numpy as np
import pyarrow as pa
import pytest

from rollout_buffer.replay import ReplayBuffer, RolloutRecord
from test_replay import Clock, fill, group_of, open_buffer, rec


def test_steps_must_be_ints(tmp_path):
    """``recorded_batch(1.9)`` did ``int(step)`` and answered with step 1's batch."""
    buf = open_buffer(tmp_path)
    fill(buf, examples=3, versions=1)
    first = buf.next_batch(1, 1)
    for bad in (1.9, 1.0, True, "1", None, np.float64(1.0)):
        message = re.escape(f"step must be an int, not {bad!r}")
        with pytest.raises(ValueError, match=message):
            buf.recorded_batch(bad)
        with pytest.raises(ValueError, match=message):
            buf.next_batch(bad, 1)
    assert buf.stats()["batches"] == 1 and buf.ready_count() == 2, "nothing drawn"
    assert buf.recorded_batch(np.int64(1)) == first and buf.recorded_batch(2) is None



def test_score_and_flag_names_without_utf8_are_named(tmp_path):
    """A name with a lone surrogate failed in the sidecar write with a UnicodeEncodeError
    naming neither the name nor the group."""
    buf = open_buffer(tmp_path)
    buf.add_rollouts(group_of())
    [gid] = list(buf._live)
    for scores, flags, message in [
        ({"\ud800": 1.0}, None, r"score name '\\ud800' is not valid text: .* position 0"),
        ({"ok": 1.0, "bad\udcff": 0.0}, None, r"score name 'bad\\udcff' is not valid text: .* position 3"),
        ({"ok": 1.0}, {"\ud800": True}, r"flag name '\\ud800' is not valid text"),
    ]:
        with pytest.raises(ValueError, match=f"group '{gid}': {message}"):
            buf.upsert_scores(gid, scores, flags=flags)
    assert "scores" not in buf.get_groups([gid])[0].metadata
    assert not list((tmp_path / "replay").glob("scores/*.parquet")), "nothing written"
    buf.upsert_scores(gid, {"ok": 1.0}, flags={"verified": True})
    assert buf.ready_count(require_flags={"verified": True}) == 1


def test_an_empty_dict_of_columns_is_a_no_op(tmp_path):
    """``{}`` (or a table of no columns) was refused for lacking ``environment``; it is a
    flush of nothing, as an empty list is."""
    buf = open_buffer(tmp_path)
    buf.add_rollouts(group_of(size=2))
    for nothing in ({}, pa.table({}), pa.RecordBatch.from_pydict({})):
        assert buf.add_rollouts(nothing) == []
    s = buf.stats()
    assert (s["received"], s["generator_queue_len"]) == (2, 2)
    # Rows without columns are rollouts without an environment.
    with pytest.raises(ValueError, match="column 'environment' is missing"):
        buf.add_rollouts(pa.table({"x": [1, 2]}).select([]))


# Constructor options refused, with what the error says (also refused by the sharded
# front before it starts a shard: test_replay_ray_input.py).
BAD_OPTIONS = [
    (dict(capacity_groups=2.5), r"capacity_groups must be an int >= 1, not 2\.5"),
    (dict(capacity_groups=True), "capacity_groups must be an int >= 1, not True"),
    (dict(target_group_size=2.5), r"target_group_size must be an int >= 1, not 2\.5"),
    (dict(target_group_size=4, min_group_size=1.5), r"min_group_size must be an int >= 1, not 1\.5"),
    (dict(target_group_size=4, min_group_size=5), r"min_group_size must be in 1\.\.target_group_size \(4\), not 5"),
    (dict(max_uses_per_group=1.5), r"max_uses_per_group must be an int >= 1 \(or None: no limit\), not 1\.5"),
    (dict(max_uses_per_group=False), "max_uses_per_group must be an int >= 1"),
    (dict(max_groups_per_version=2.5), "max_groups_per_version must be an int >= 1"),
    (dict(max_groups_per_version=0), "max_groups_per_version must be an int >= 1"),
    (dict(max_per_replica=1.5), "max_per_replica must be an int >= 1"),
    (dict(max_per_replica=0), "max_per_replica must be an int >= 1"),
    (dict(flush_rows=100.0), r"flush_rows must be an int >= 1, not 100\.0"),
    (dict(flush_rows="100"), "flush_rows must be an int >= 1, not '100'"),
    (dict(retention_ttl_s=-1.0), r"retention_ttl_s must be a number of seconds > 0 \(or None"),
    (dict(retention_ttl_s=math.nan), "retention_ttl_s must be"),
    (dict(flush_interval_s=math.nan), "flush_interval_s must be a number of seconds >= 0"),
    (dict(seal_timeout_s="30"), "seal_timeout_s must be a number of seconds > 0, not '30'"),
    (dict(numeric_versions="no"), "numeric_versions must be True or False, not 'no'"),
    (dict(durable="yes"), "durable must be True or False, not 'yes'"),
    (dict(clock=5), "clock must be a function returning seconds"),
]


@pytest.mark.parametrize("options, message", BAD_OPTIONS)
def test_options_that_are_no_ints_are_refused(tmp_path, options, message):
    """The counts were checked with ``>= 1`` only, so a capacity of 2.5 groups or a
    ``True`` was taken; the limits (None: no limit) were not checked at all. A NaN or
    negative retention evicted every unleased group at the next call."""
    root = tmp_path / "refused"
    with pytest.raises(ValueError, match=message):
        ReplayBuffer(str(root), **options)
    assert not root.exists(), "nothing created"


def test_integer_options_of_numpy_types_are_taken_as_ints(tmp_path):
    """A uint64 capacity kept as numpy would wrap ``len(live) - capacity`` below zero."""
    buf = open_buffer(
        tmp_path, capacity_groups=np.uint64(2), target_group_size=np.int32(4),
        max_uses_per_group=np.int64(1), retention_ttl_s=math.inf, flush_interval_s=0,
    )
    assert (type(buf.capacity), type(buf.target_size), type(buf.max_uses)) == (int, int, int)
    fill(buf, examples=3, versions=1)
    assert buf.stats()["groups_live"] == 2, "the oldest evicted past the capacity"


def test_per_token_columns_in_a_dict_are_checked_as_records_arrays(tmp_path):
    """A dict of columns with per-token arrays went through one unchecked concatenate:
    floats were truncated and int64 values past int32 wrapped, stored without a word."""
    buf = open_buffer(tmp_path, target_group_size=2)
    base = {"environment": ["m", "m"], "example_id": ["q", "q"], "policy_version": ["1", "1"],
            "rollout_uid": ["a", "b"]}
    for tokens, message in [
        ([np.array([2**31 + 5], np.int64), np.array([1], np.int64)], "outside int32"),
        ([[2**33 + 1], [1]], "outside int32"),
        ([[1.7, 2.2], [3.9]], "has dtype float64, wants int32"),
        ([np.array([1]), np.zeros((1, 1), np.int32)], "must be 1-D"),
    ]:
        with pytest.raises(ValueError, match=message):
            buf.add_rollouts({**base, "output_tokens": tokens})
    assert buf.stats()["received"] == 0, "nothing taken"
    # An empty list is no tokens, whatever numpy's dtype for it.
    assert buf.add_rollouts({**base, "output_tokens": [[], np.array([], np.int64)]}) == ["pending", "sealed"]


def test_a_dict_of_scalars_is_refused_not_split_into_characters(tmp_path):
    """``{"environment": "ab", ...}`` was read as columns of characters: two rollouts."""
    buf = open_buffer(tmp_path)
    with pytest.raises(ValueError, match="column 'environment' is a str, not a column"):
        buf.add_rollouts({"environment": "ab", "example_id": "cd", "policy_version": "12"})
    with pytest.raises(ValueError, match="column 'reward' is a float, not a column"):
        buf.add_rollouts({"environment": ["m"], "example_id": ["q"], "policy_version": ["1"], "reward": 0.5})
    from rollout_buffer.replay import RolloutRecord

    with pytest.raises(TypeError, match=r"add_rollout\(record\) or add_rollouts\(\[record\]\)"):
        buf.add_rollouts(RolloutRecord("m", "q", "1"))
    assert buf.stats()["received"] == 0


def test_a_null_replica_or_last_segment_is_the_default_and_a_string_bool_is_refused(tmp_path):
    """A None ``replica_id`` beside a named one failed the group's seal after the call had
    taken other groups (the group was lost, its uids then refused as duplicates);
    ``is_last_segment="false"`` was stored as True."""
    from rollout_buffer.replay import RolloutRecord as R

    buf = open_buffer(tmp_path, target_group_size=2)
    out = buf.add_rollouts([R("m", "q1", "1", rollout_uid="a1"), R("m", "q1", "1", rollout_uid="a2"),
                            R("m", "q2", "1", replica_id=None, rollout_uid="b1"),
                            R("m", "q2", "1", replica_id="r1", rollout_uid="b2")])
    assert out == ["pending", "sealed", "pending", "sealed"]
    out = buf.add_rollouts({"environment": ["m", "m"], "example_id": ["q3", "q3"], "policy_version": ["1", "1"],
                            "replica_id": [None, "r1"], "is_last_segment": [None, False],
                            "rollout_uid": ["c1", "c2"]})
    assert out == ["pending", "sealed"]
    assert buf.stats()["groups_live"] == 3
    for gid in buf.sample_groups(3).group_ids:
        [g] = buf.get_groups([gid])
        by_uid = {r.rollout_uid: r for r in g.rollouts}
        if "b1" in by_uid:
            assert by_uid["b1"].replica_id == "unknown"
        if "c1" in by_uid:
            assert (by_uid["c1"].replica_id, by_uid["c1"].is_last_segment) == ("unknown", True)
            assert by_uid["c2"].is_last_segment is False
    for bad in ("false", 1):
        with pytest.raises(ValueError, match="'is_last_segment' must be a bool"):
            buf.add_rollouts([R("m", "q4", "1", rollout_uid="d", is_last_segment=bad)])


def test_rollouts_without_uids_are_told_apart_by_their_place_in_the_call(tmp_path):
    """Uids derived from content alone made every rollout of a call without tokens, and
    each answer sampled twice alike, a duplicate of the first: dropped."""
    from rollout_buffer.replay import RolloutRecord as R

    buf = open_buffer(tmp_path, target_group_size=4)
    cols = {"environment": ["m"] * 4, "example_id": ["q"] * 4, "policy_version": ["1"] * 4,
            "reward": [0.0, 1.0, 0.0, 1.0]}
    assert buf.add_rollouts(cols) == ["pending"] * 3 + ["sealed"]
    same = [R("m", "q2", "1", output_tokens=np.array([4], np.int32), created_ts=5.0, reward=1.0)
            for _ in range(4)]
    assert buf.add_rollouts(same) == ["pending"] * 3 + ["sealed"]
    assert buf.add_rollouts(same) == ["duplicate"] * 4, "a resend of the call is a duplicate"


def test_refused_or_pending_rollouts_do_not_raise_the_current_version(tmp_path):
    """A rollout refused for its version (or a duplicate, or one still pending) raised the
    highest version seen, and every lag-filtered draw came back empty, until a restart
    recomputed it from the stored groups."""
    from rollout_buffer.replay import RolloutRecord as R

    buf = open_buffer(tmp_path, target_group_size=1, min_group_size=1, accept_policy_versions=[1, 2])
    assert buf.add_rollouts([R("m", "q1", "2", rollout_uid="a")]) == ["sealed"]
    assert buf.add_rollouts([R("m", "q2", "1000", rollout_uid="stray")]) == ["version_rejected"]
    assert buf.add_rollouts([R("m", "q1", "9", rollout_uid="a")]) == ["version_rejected"]
    assert buf.current_version() == 2
    assert len(buf.sample_groups(4, max_policy_lag=1).group_ids) == 1
    pending = open_buffer(tmp_path / "p", target_group_size=2)
    pending.add_rollouts([R("m", "q", "1", rollout_uid="x"), R("m", "q", "1", rollout_uid="y")])
    assert pending.add_rollouts([R("m", "q", "7", rollout_uid="z")]) == ["pending"]
    assert pending.current_version() == 1


def test_empty_draws_never_push_a_steps_batch_out_of_the_kept_window(tmp_path):
    """A trainer polling an empty buffer made settled empty batches, which counted in the
    window of settled batches kept: step 0's batch fell out of the snapshot, and after a
    restart ``next_batch(0)`` drew anew."""
    from rollout_buffer.replay import control

    buf = open_buffer(tmp_path, target_group_size=1, min_group_size=1, max_uses_per_group=1)
    buf.add_rollouts(group_of(size=1))
    first = buf.next_batch(0, 1)
    buf.ack(first.batch_id)
    for _ in range(control.KEEP_SETTLED + 10):
        assert buf.next_batch(1, 1).group_ids == []  # waiting for data
    assert buf.recorded_batch(0) == first
    buf.close()
    again = open_buffer(tmp_path, target_group_size=1, min_group_size=1, max_uses_per_group=1)
    assert again.recorded_batch(0) == first
    assert again.next_batch(0, 1) == first


def test_version_lists_must_be_lists_of_ints_or_strings(tmp_path):
    """A string was read character by character ("12": versions 1 and 2) and a float as
    its text (3.0 matched no version), both silently."""
    for bad, message in [("12", "must be a list of policy versions"), ([3.0], "not 3.0"),
                         ([True], "not True"), (7, "must be a list")]:
        with pytest.raises(ValueError, match=message):
            open_buffer(tmp_path, accept_policy_versions=bad)
    buf = open_buffer(tmp_path, accept_policy_versions=[np.int64(1), "2"])
    fill(buf, examples=2, versions=2)
    with pytest.raises(ValueError, match="prefer_policy_versions must be a list"):
        buf.sample_groups(2, prefer_policy_versions="12", on_policy_fraction=0.5)
    picked = buf.sample_groups(2, prefer_policy_versions=[2], on_policy_fraction=1.0)
    assert {g.policy_version for g in buf.get_groups(picked.group_ids)} == {"2"}


def test_uids_are_unique_within_their_prompt(tmp_path):
    """Uids numbered per prompt ("0", "1", ...) lost every prompt's rollouts but the
    first's: the buffer deduplicated them across all prompts, where spec 000 dedupes
    within an aggregator. A resend to the same prompt is still a duplicate, also after a
    restart."""
    from rollout_buffer.replay import RolloutRecord as R

    buf = open_buffer(tmp_path, target_group_size=2)
    out = buf.add_rollouts([R("math", ex, "1", rollout_uid=str(i)) for ex in ("q1", "q2") for i in range(2)])
    assert out == ["pending", "sealed", "pending", "sealed"]
    assert buf.add_rollouts([R("math", "q2", "1", rollout_uid="1")]) == ["duplicate"]
    assert buf.add_rollouts([R("code", "q2", "1", rollout_uid="1")]) == ["pending"]
    buf.close()
    again = open_buffer(tmp_path, target_group_size=2)
    assert again.add_rollouts([R("math", "q1", "1", rollout_uid="0")]) == ["duplicate"]
    assert again.stats()["groups_live"] == 2


def test_a_prompt_drawn_again_at_a_newer_version_makes_a_new_group(tmp_path):
    """Uids numbered per prompt, the prompt drawn again at policy version 2 while its
    version-1 group was live: every new rollout was refused as a duplicate, as the dedupe
    named a rollout by prompt and uid alone. Grouped strictly, the version is part of the
    group key and of the rollout's name; a resend of a version-1 rollout is still a
    duplicate, also after a restart. Grouped mixed, a group holds several versions, so a
    uid stays unique within its prompt."""
    from rollout_buffer.replay import RolloutRecord as R

    def drawn(version):
        return [R("math", "q1", version, rollout_uid=str(i)) for i in range(2)]

    buf = open_buffer(tmp_path / "strict", target_group_size=2)
    assert buf.add_rollouts(drawn("1")) == ["pending", "sealed"]
    assert buf.add_rollouts(drawn("2")) == ["pending", "sealed"]
    assert buf.stats()["groups_live"] == 2
    assert buf.add_rollouts(drawn("1")[:1]) == ["duplicate"]
    buf.close()
    again = open_buffer(tmp_path / "strict", target_group_size=2)
    assert again.add_rollouts(drawn("2")[1:] + drawn("1")[:1]) == ["duplicate", "duplicate"]
    assert again.add_rollouts(drawn("3")) == ["pending", "sealed"]
    assert sorted(g.policy_version for g in again.get_groups(list(again._live))) == ["1", "2", "3"]
    mixed = open_buffer(tmp_path / "mixed", target_group_size=2, grouping="mixed")
    assert mixed.add_rollouts(drawn("1")) == ["pending", "sealed"]
    assert mixed.add_rollouts(drawn("2")) == ["duplicate", "duplicate"]


@pytest.mark.parametrize("column, values, message", [
    ("reward", [True], "numbers only"),
    ("token_count", [True], "integers only"),
    ("token_count", [2.0], "integers only"),
    ("policy_version", [1.0], "strings or integers only"),
    ("created_ts", ["12.5"], "numbers only"),
    ("is_last_segment", [1], "bools only"),
    ("metadata", [{"k": 1}], "the JSON text of an object"),
])
def test_columns_take_the_kinds_records_take(tmp_path, column, values, message):
    """A cast had taken a bool reward as 1.0, a float version 1.0 as "1", a float token
    count and a reward given as text, all of which the record path refuses."""
    buf = open_buffer(tmp_path, target_group_size=1, min_group_size=1)
    with pytest.raises(ValueError, match=f"column '{column}' of type .*: {message}"):
        buf.add_rollouts({"environment": ["m"], "example_id": ["q"], "policy_version": ["1"], column: values})
    assert buf.stats()["received"] == 0
    # Ints where numbers or versions go are taken, as records take them.
    assert buf.add_rollouts({"environment": ["m"], "example_id": ["q"], "policy_version": [3],
                             "reward": [1]}) == ["sealed"]


def test_a_record_creation_time_must_be_a_number(tmp_path):
    from rollout_buffer.replay import RolloutRecord as R

    buf = open_buffer(tmp_path)
    for bad in (None, True, "12.5"):
        with pytest.raises(ValueError, match="'created_ts' must be a number"):
            buf.add_rollouts([R("m", "q", "1", rollout_uid="a", created_ts=bad)])


def test_draw_options_of_the_wrong_kind_are_named(tmp_path):
    """Text for a number failed inside a comparison with a raw TypeError; ``ready_count``
    refused the draw's own ``seed`` with a message about a private method; a score past
    float64 was an OverflowError; a version of 2**70 overflowed the recency weights."""
    with open_buffer(tmp_path) as buf:
        fill(buf, examples=2, versions=2)
        for name, bad in (("max_policy_lag", "1"), ("on_policy_fraction", "0.5"), ("max_policy_lag", True)):
            with pytest.raises(ValueError, match=f"{name} must be a number, not {bad!r}"):
                buf.sample_groups(1, **{name: bad})
        assert buf.ready_count(seed=1, start_offset=2) == buf.ready_count() == 4
        with pytest.raises(TypeError, match=r"unknown filters \['max_lag'\]"):
            buf.ready_count(max_lag=1)
        [gid] = buf.sample_groups(1).group_ids
        with pytest.raises(ValueError, match="not finite"):
            buf.upsert_scores(gid, {"s": 10**400})
        buf.add_rollouts(group_of(ex="far", pv=str(2**70)))
        assert len(buf.sample_groups(2, recency_weighting="linear").group_ids) == 2
        with pytest.raises(ValueError, match="policy version must be an int"):
            buf.set_policy_version(2**70)
    with pytest.raises(Exception, match="closed"):
        buf.stats()


@pytest.mark.parametrize("field, value", [
    ("environment", "e" * 250),
    ("environment", "数" * 100),  # nine bytes each, URL-quoted
    ("policy_version", "v" * 250),
])
def test_a_name_too_long_for_a_partition_folder_is_refused(tmp_path, field, value):
    """An environment (or version) whose folder name is over 255 bytes was taken and
    sealed, then never written: every write, draw, flush and close failed on it with
    "File name too long", the other groups' draws too."""
    from rollout_buffer.replay import RolloutRecord as R

    buf = open_buffer(tmp_path, target_group_size=2, numeric_versions=False)
    fields = {"environment": "math", "policy_version": "1", field: value}
    bad = [R(fields["environment"], "q", fields["policy_version"], rollout_uid=str(i)) for i in range(2)]
    with pytest.raises(ValueError, match=f"rollout 1 \\(uid '0'\\): {field} .* bytes .* over the 255"):
        buf.add_rollouts([R("math", "q0", "1", rollout_uid="a")] + bad)
    with pytest.raises(ValueError, match=f"{field} .* over the 255"):
        buf.add_rollouts({"environment": [fields["environment"]], "example_id": ["q"],
                          "policy_version": [fields["policy_version"]]})
    assert buf.stats()["received"] == 0, "nothing of either call taken"
    assert buf.add_rollouts([R("math", "q", "1", rollout_uid=str(i)) for i in range(2)]) == ["pending", "sealed"]
    assert len(buf.sample_groups(1).group_ids) == 1
    buf.close()


def test_numeric_versions_are_one_text_per_number(tmp_path):
    """With numeric versions, "03", "+3" and "3" were three groups and three partition
    folders of the version the lag filters take as 3 (one prompt drawn at version 3 never
    sealed). Now each is stored as "3", by records and by columns; a version of the
    rollout's own that is no integer, in a table of the dataset's schema, is refused."""
    from rollout_buffer.replay import to_table

    buf = open_buffer(tmp_path, target_group_size=3)
    assert buf.add_rollouts([rec(pv=v, i=i) for i, v in enumerate(["03", "+3", "3"])]) == [
        "pending", "pending", "sealed"]
    assert buf.add_rollouts({"environment": ["math"] * 3, "example_id": ["q1"] * 3,
                             "policy_version": ["-0", "+0", "00"]}) == ["pending", "pending", "sealed"]
    assert buf.stats()["ready_by_policy_version"] == {"3": 1, "0": 1}
    buf.flush()
    folders = {p.name for p in (tmp_path / "replay" / "rollouts" / "environment=math").iterdir()}
    assert folders == {"policy_version=3", "policy_version=0"}
    table = to_table([rec(pv="4", uid="own")])
    table = table.set_column(table.schema.get_field_index("rollout_policy_version"), "rollout_policy_version",
                             pa.array(["four"]))
    with pytest.raises(ValueError, match="'own': field 'rollout_policy_version' is 'four': not an integer"):
        buf.add_rollouts(table)
    table = table.set_column(table.schema.get_field_index("rollout_policy_version"), "rollout_policy_version",
                             pa.array([None], pa.string()))
    with pytest.raises(ValueError, match="'own': field 'rollout_policy_version' must be a version, not None"):
        buf.add_rollouts(table)
    assert buf.stats()["received"] == 6
    # The versions a buffer accepts or prefers are read as the rollouts' are.
    accepting = open_buffer(tmp_path / "accept", target_group_size=1, min_group_size=1,
                            accept_policy_versions=["0003"])
    assert accepting.add_rollouts([rec(pv="3", i=0), rec(pv="+03", i=1), rec(pv="4", i=2)]) == [
        "sealed", "sealed", "version_rejected"]
    strings = open_buffer(tmp_path / "text", target_group_size=2, numeric_versions=False)
    assert strings.add_rollouts([rec(pv="03", i=0), rec(pv="3", i=1)]) == ["pending", "pending"]


@pytest.mark.parametrize("root, message", [
    (123, "root_path must be a folder's path or a URL"),
    ("", "root_path must be a folder's path or a URL"),
    (None, "root_path must be"),
    ("s3:/bucket/run", r"neither a path nor a URL: did you mean s3://"),
])
def test_a_root_that_is_no_path_or_url_is_refused(tmp_path, monkeypatch, root, message):
    """123 failed deep in storage (an int is not iterable); "" wrote its lock and control
    folder into the working directory; "s3:/bucket" (one slash) made a local folder "s3:"."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError, match=message):
        ReplayBuffer(root)
    assert list(tmp_path.iterdir()) == [], "nothing created"


def test_a_pathlib_root_is_taken(tmp_path):
    buf = ReplayBuffer(tmp_path / "replay", durable=False)
    assert buf.root_path == str(tmp_path / "replay")
    buf.close()


def test_calls_given_none_or_the_wrong_kind_say_which_argument(tmp_path):
    buf = ReplayBuffer(str(tmp_path / "replay"), durable=False)
    with pytest.raises(ValueError, match="add_rollouts takes a list of rollouts"):
        buf.add_rollouts(None)
    with pytest.raises(ValueError, match="group_ids must be a list of ids, not None"):
        buf.get_groups(None)
    with pytest.raises(ValueError, match=r"batch_id must be a batch's id \(a str\), not \['b-1'\]"):
        buf.ack(["b-1"])
    buf.close()


@pytest.mark.parametrize(
    "bad, field",
    [
        (dict(token_count=2**70), "token_count"),
        (dict(token_count=np.uint64(2**64 - 1)), "token_count"),
        (dict(segment_idx=2**40), "segment_idx"),
        (dict(environment="\ud800"), "environment"),
        (dict(example_id="q\udcff"), "example_id"),
        (dict(replica_id="\ud800"), "replica_id"),
        (dict(prefix_hash="\ud800"), "prefix_hash"),
        (dict(reward=10**400), "reward"),
        (dict(created_ts=10**400), "created_ts"),
    ],
)
def test_values_arrow_cannot_store_are_named_with_the_uid(tmp_path, bad, field):
    """An int past its column (int64, int32) or a str with no UTF-8 (a lone surrogate) was
    an OverflowError, ArrowInvalid or UnicodeEncodeError naming neither field nor rollout."""
    buf = open_buffer(tmp_path)
    good = group_of(size=3)
    fields = {**rec(i=7).__dict__, **bad, "rollout_uid": "the-bad-one"}
    with pytest.raises(ValueError, match=f"'the-bad-one'.*'{field}'"):
        buf.add_rollouts(good + [RolloutRecord(**fields)])
    # Without a uid, the derived one names it (deriving it raised before).
    nameless = {**fields, "rollout_uid": ""}
    with pytest.raises(ValueError, match=f"rollout 'r-[0-9a-f]+': field '{field}'"):
        buf.add_rollouts([RolloutRecord(**nameless)])
    s = buf.stats()
    assert (s["received"], s["generator_queue_len"]) == (0, 0), "none of the call is taken"
    assert buf.add_rollouts(good) == ["pending"] * 3


@pytest.mark.parametrize(
    "change, message",
    [
        ({"token_count": [0, 2**70]}, "'c1'.*'token_count'.*int64"),
        ({"segment_idx": [0, 2**40]}, "'c1'.*'segment_idx'.*int32"),
        ({"environment": ["math", "\ud800"]}, "'c1'.*'environment'.*UTF-8"),
        ({"replica_id": ["r", "r\udcff"]}, "'c1'.*'replica_id'.*UTF-8"),
    ],
)
def test_column_values_arrow_cannot_store_are_named_with_the_uid(tmp_path, change, message):
    columns = {
        "environment": ["math"] * 2,
        "example_id": ["q"] * 2,
        "policy_version": ["1", "1"],
        "rollout_uid": ["c0", "c1"],
        **change,
    }
    buf = open_buffer(tmp_path)
    with pytest.raises(ValueError, match=message):
        buf.add_rollouts(columns)
    assert buf.stats()["received"] == 0
