"""Bad input from Python: every refusal is a ValueError naming the value (sample or row,
field, rollout uid) and stores nothing, and no conversion error escapes without saying
where it was."""

import numpy as np
import pyarrow as pa
import pytest

import rollout_buffer as rb


def one_rpc(*inputs):
    return rb.Buffer(8, [rb.Rpc("train", 2, inputs=list(inputs or ("reward",)))])


@pytest.mark.parametrize("samples, message", [
    # A Python 1 beside 0.5: the batch could never be read as one column.
    ([{"id": "a", "reward": 1}, {"id": "b", "reward": 0.5}],
     r'field "reward": sample 1 \(id "b"\) holds float64 0-d, sample 0 \(id "a"\) holds int64 0-d'),
    ([{"id": "a", "reward": np.zeros(2, np.int32)}, {"id": "b", "reward": np.zeros(2, np.float32)}],
     r'field "reward": sample 1 \(id "b"\) holds float32 1-d'),
    ([{"id": "a", "reward": 1.0}, {"id": "b", "reward": np.zeros(2)}], r"float64 1-d"),
    ([{"id": -1, "reward": 1.0}], r'sample 0: "id" -1 is not from 0 to 2\^64-1'),
    ([{"id": None, "reward": 1.0}], r'sample 0: "id" is a str or an int .*, not NoneType'),
    ([{"id": True, "reward": 1.0}], r"not bool"),
    ([{"id": 1.5, "reward": 1.0}], r"not float"),
    ([{"reward": 1.0}], r'sample 0: needs an "id"'),
    ([{"id": "a", "birth": -1, "reward": 1.0}], r'sample 0 \(id "a"\), "birth"'),
    ([{"id": "a", "reward": 2**70}], r'sample 0 \(id "a"\), field "reward": the int \d+ does not fit in int64'),
    ([{"id": "a", "reward": 1.0, "meta": {"m": 2**70}}], r'sample 0 \(id "a"\), meta "m": the int'),
    ([{"id": "a", "reward": 1.0, "meta": {"m": [1]}}], r'meta "m": metadata values are .*, not list'),
    ([{"id": "\ud800", "reward": 1.0}], r'sample 0, "id": not valid Unicode'),
    ([{"id": "a", "reward": 1.0}, [("id", "b")]], r"sample 1: a sample is a dict, not list"),
    ([{"id": "a", "reward": object()}], r'sample 0 \(id "a"\), field "reward": unsupported value of type object'),
])
def test_bad_samples_name_the_sample_and_field_and_store_nothing(samples, message):
    buf = one_rpc()
    with pytest.raises(ValueError, match=message):
        buf.put_batch_blocking(samples)
    assert len(buf) == 0 and buf.stats()["put"] == 0


def test_numpy_scalars_are_metadata_as_python_ones_are():
    buf = one_rpc()
    buf.put_batch_blocking([{"id": "a", "reward": 1.0, "meta": {"i": np.int64(3), "f": np.float32(1.5)}},
                            {"id": "b", "reward": 2.0, "meta": {"i": 4, "f": 2.5}}])
    metas = [s["meta"] for s in buf.get_batch_for_rpc_blocking("train", timeout=5).samples()]
    assert metas == [{"i": 3, "f": 1.5}, {"i": 4, "f": 2.5}]


def test_a_field_of_mixed_types_across_puts_names_the_field_when_read():
    buf = one_rpc()
    buf.put_batch_blocking([{"id": "a", "reward": 1}])
    buf.put_batch_blocking([{"id": "b", "reward": 0.5}])
    batch = buf.get_batch_for_rpc_blocking("train", timeout=5)
    assert [s["reward"] for s in batch.samples()] == [1, 0.5]
    with pytest.raises(ValueError, match=r'field "reward": its samples differ in element type'):
        batch.columns()
    with pytest.raises(ValueError, match=r"Arrow column `reward`: mixes I64 0-d with F64 0-d"):
        batch.to_arrow()
    # The batch is still held: completing it works.
    batch.commit_blocking()
    assert len(buf) == 0


@pytest.mark.parametrize("kwargs, message", [
    ({"ids": "ab"}, r"ids: a sequence of str or int, not one str"),
    ({"ids": [True, False]}, r"ids: row 0 is a bool"),
    ({"ids": ["a", "\ud800"]}, r"ids: row 1: not valid Unicode"),
    ({"ids": ["a", "b"], "columns": {"id": ["a", "b"], "reward": np.ones(2)}}, r"ids given twice"),
    ({"ids": ["a", "b"], "meta": ["id"]}, r'meta: "id" is the samples\' own id'),
    ({"ids": ["a", "b"], "columns": {"reward": [[1, 2], [3]]}}, r'column "reward": .*inhomogeneous'),
    ({"ids": ["a", "b"], "columns": {"reward": [np.ones(2, np.int32), np.ones(2, np.float32)]}},
     r'column "reward": row 1 is F32 1-d, row 0 I32 1-d'),
    ({"ids": ["a", "b"], "columns": {"reward": ["x", "\udc80"]}}, r'column "reward", row 1: not valid Unicode'),
    ({"ids": ["a", "b"], "meta": {"m": [1, 2**70]}}, r'meta "m", row 1: the int'),
])
def test_bad_columns_name_the_column_and_row(kwargs, message):
    buf = one_rpc()
    columns = kwargs.pop("columns", {"reward": np.ones(2)})
    with pytest.raises(ValueError, match=message):
        buf.put_columns_blocking(columns, **kwargs)
    assert len(buf) == 0 and buf.stats()["put"] == 0


def test_an_arrow_id_column_and_ids_together_are_refused():
    buf = one_rpc()
    table = pa.table({"id": ["a", "b"], "reward": [1.0, 2.0]})
    with pytest.raises(ValueError, match="ids given twice"):
        buf.put_columns_blocking(table, ids=["a", "b"])
    buf.put_columns_blocking(table)
    assert len(buf) == 2


@pytest.mark.parametrize("name", ["id", "birth", "meta"])
def test_an_rpc_cannot_read_or_write_a_samples_own_entries(name):
    with pytest.raises(ValueError, match=f'inputs: "{name}" is reserved'):
        rb.Rpc("train", 1, inputs=["x", name])
    with pytest.raises(ValueError, match=f'outputs: "{name}" is reserved'):
        rb.Rpc("gen", 1, inputs=["x"], outputs=[name])
    with pytest.raises(ValueError, match="priority_key"):
        rb.Rpc("train", 1, inputs=["x"], selection="prioritized", priority_key=name)


def rollout(**changes):
    r = dict(environment="math", example_id="q1", policy_version=0, rollout_uid="u0",
             prompt_tokens=np.array([1, 2], np.int32), output_tokens=np.array([3, 4, 5], np.int32),
             logprobs=np.array([-.1, -.2, -.3], np.float32), reward=1.0)
    r.update(changes)
    return r


@pytest.mark.parametrize("changes, message", [
    ({"policy_version": -1}, r'rollout "u0", field `policy_version` \(expected an int from 0\)'),
    ({"policy_version": "3"}, r"field `policy_version`"),
    ({"reward": "1"}, r'rollout "u0", field `reward` \(expected a finite float\)'),
    ({"reward": float("nan")}, r"field `reward` .*got NaN"),
    ({"reward": float("inf")}, r"field `reward` .*got inf"),
    ({"reward": True}, r"field `reward`"),
    ({"reward_components": {"a": float("nan")}}, r"field `reward_components`"),
    ({"environment": None}, r'rollout "u0", field `environment`: a str, not NoneType'),
    ({"environment": ""}, r"field `environment`: empty"),
    ({"example_id": 7}, r"field `example_id`: a str, not int"),
    ({"truncated": "yes"}, r"field `truncated` \(expected a bool\)"),
    ({"token_versions": np.array([0, -1, 0])}, r"field `token_versions`: a negative version"),
    ({"output_tokens": np.ones((1, 3), np.int32)}, r"field `output_tokens`: a 1-d array, not one of shape \[1, 3\]"),
    ({"logprobs": np.ones(3)}, r"field `logprobs`: F64 values where F32 are expected"),
    ({"metadata": {"k": 2**70}}, r'rollout "u0", metadata "k": the int'),
    ({"rollout_uid": 5}, r"field `rollout_uid`: a str, not int"),
    ({"replica_id": 3}, r'rollout "u0", field `replica_id` \(expected a str\)'),
    ({"replica_id": "\ud800"}, r"field `replica_id` .*surrogates not allowed"),
    ({"reward_components": {1: 0.5}}, r"field `reward_components` \(expected a dict of str"),
])
def test_bad_rollouts_name_the_uid_and_field_and_leave_the_group_as_it_was(changes, message):
    buf = rb.Buffer(16, [rb.Rpc("train", 1, inputs=list(rb.GROUP_INPUTS))])
    ingest = rb.Ingest(buf, group_size=2)
    assert ingest.add_rollout_blocking(rollout(rollout_uid="first")) == "pending"
    with pytest.raises(ValueError, match=message):
        ingest.add_rollout_blocking(rollout(**changes))
    # Nothing of the bad one was taken: the group still waits for its second member.
    assert ingest.counters()["pending_rollouts"] == 1
    assert ingest.add_rollout_blocking(rollout()) == "sealed"
    assert len(buf) == 1


@pytest.mark.parametrize("kwargs, message", [
    ({"group_size": 0}, r"group_size: at least 1"),
    ({"group_size": 2, "min_size": 3}, r"min_size: from 1 to group_size \(2\), not 3"),
    ({"group_size": 2, "min_size": 0}, r"min_size"),
    ({"group_size": 2, "max_per_replica": 0}, r"max_per_replica: at least 1"),
])
def test_ingest_settings_out_of_range_are_refused(kwargs, message):
    buf = rb.Buffer(16, [rb.Rpc("train", 1, inputs=list(rb.GROUP_INPUTS))])
    with pytest.raises(ValueError, match=message):
        rb.Ingest(buf, **kwargs)


@pytest.mark.parametrize("lease_timeout", [0.0, -1.0, float("nan")])
def test_a_lease_timeout_that_expires_every_lease_at_once_is_refused(lease_timeout):
    with pytest.raises(ValueError, match="lease_timeout: seconds > 0"):
        rb.Rpc("train", 1, inputs=["x"], lease_timeout=lease_timeout)


def test_an_infinite_timeout_waits_as_no_timeout_does():
    buf = one_rpc()
    buf.put_batch_blocking([{"id": "a", "reward": 1.0}, {"id": "b", "reward": 2.0}])
    batch = buf.get_batch_for_rpc_blocking("train", timeout=float("inf"))
    assert len(batch) == 2
