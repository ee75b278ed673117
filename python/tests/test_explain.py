"""Why a getter waits: ``Buffer.explain(rpc)`` names each cause, and a getter waiting past
``wait_warning`` logs the explanation through Python's ``logging``."""

import logging

import numpy as np
import pytest

import rollout_buffer as rb


def test_explain_names_the_missing_keys_and_the_leases():
    buf = rb.Buffer(
        8,
        [rb.Rpc("gen", 2, inputs=["prompt"], outputs=["tokens"]), rb.Rpc("train", 2, inputs=["tokens", "score"])],
        external_keys=["score"],
    )
    buf.put_columns_blocking({"prompt": np.zeros((3, 4), np.int32)}, ids=["a", "b", "c"])
    train = buf.explain("train")
    assert (train["eligible"], train["batch_size"], train["incomplete"]) == (0, 2, 3)
    assert train["missing"] == {"tokens": 3, "score": 3}
    held = buf.get_batch_for_rpc_blocking("gen")
    gen = buf.explain("gen")
    assert (gen["leased"], gen["eligible"]) == (2, 1)
    held.complete_columns_blocking({"tokens": np.ones((2, 4), np.int32)})
    assert buf.explain("train")["missing"] == {"tokens": 1, "score": 3}
    with pytest.raises(ValueError, match="nope"):
        buf.explain("nope")


def test_a_long_wait_is_logged_with_its_explanation(caplog):
    buf = rb.Buffer(4, [rb.Rpc("train", 2, inputs=["prompt"])], wait_warning=0.05)
    buf.put_columns_blocking({"prompt": np.zeros((1, 4), np.int32)}, ids=["a"])
    with caplog.at_level(logging.WARNING):
        with pytest.raises(rb.Timeout):
            buf.get_batch_for_rpc_blocking("train", timeout=0.5)
    records = [r for r in caplog.records if "still waiting" in r.getMessage()]
    assert records, [r.getMessage() for r in caplog.records]
    assert records[0].name == "rollout_buffer.buffer.get"
    assert "eligible=1" in records[0].getMessage() and "batch_size=2" in records[0].getMessage()
    assert buf.stats()["rpcs"]["train"]["wait_warnings"] >= 1


def test_a_rate_limited_getter_waits_and_explain_says_so():
    # One sample per insert, min size 2, error buffer 1: two leases use up three inserts'
    # worth (diff 3 -> 1), the third waits for a put.
    buf = rb.Buffer(
        8,
        [rb.Rpc("train", 1, inputs=["prompt"], reads=100, samples_per_insert=1.0, min_size_to_sample=2, error_buffer=1.0)],
    )
    for i in range(3):
        buf.put_columns_blocking({"prompt": np.zeros((1, 4), np.int32)}, ids=[f"s{i}"])
    for _ in range(2):
        buf.get_batch_for_rpc_blocking("train", timeout=1.0).commit_blocking()
    with pytest.raises(rb.Timeout):
        buf.get_batch_for_rpc_blocking("train", timeout=0.05)
    why = buf.explain("train")
    assert why["rate_limited"] and why["eligible"] == 3, why
    buf.put_columns_blocking({"prompt": np.zeros((1, 4), np.int32)}, ids=["s3"])
    buf.get_batch_for_rpc_blocking("train", timeout=1.0).commit_blocking()
    with pytest.raises(ValueError, match="rate limit"):
        rb.Buffer(8, [rb.Rpc("bad", 4, inputs=["prompt"], samples_per_insert=1.0, error_buffer=0.5)])
