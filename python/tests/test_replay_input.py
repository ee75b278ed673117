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

from rollout_buffer.replay import ReplayBuffer
from test_replay import Clock, fill, group_of, open_buffer


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
