"""Per-call costs of the replay buffer, in-process (no Ray), and of a Ray actor call on
this machine: the inputs of the model in docs/scale.md. One JSON line per figure:
    {"figure": ..., "value": ..., "unit": ...}

    python python/bench/replay_costs.py            # in-process figures and Ray's call cost
    python python/bench/replay_costs.py --no-ray   # in-process only
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import time

import numpy as np
import pyarrow as pa

from rollout_buffer.replay import ReplayBuffer, RolloutRecord
from rollout_buffer.replay import storage
from rollout_buffer.replay.groups import materialize
from rollout_buffer.replay.records import records_to_table

TOKENS, GROUP, BATCH = 512, 8, 64


def emit(figure: str, value: float, unit: str) -> None:
    print(json.dumps({"figure": figure, "value": round(value, 2), "unit": unit}), flush=True)


def records(k: int) -> list:
    rng = np.random.default_rng(k)
    return [
        RolloutRecord(
            environment="math",
            example_id=f"e{k}-{i // GROUP}",
            policy_version=str(1 + k % 4),
            rollout_uid=f"{k}-{i}",
            reward=float(i % 2),
            output_tokens=rng.integers(0, 50_000, TOKENS, dtype=np.int32),
            logprobs=rng.standard_normal(TOKENS).astype(np.float32),
        )
        for i in range(BATCH)
    ]


def per_call(fn, calls) -> float:
    start = time.perf_counter()
    for c in calls:
        fn(c)
    return (time.perf_counter() - start) / len(calls) * 1e6


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=400)
    ap.add_argument("--no-ray", action="store_true")
    args = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="replay-costs-")
    try:
        recs = [records(k) for k in range(args.calls)]
        tables = [records_to_table(r, True)[0] for r in recs]
        flat = dict(flush_rows=10**9, flush_interval_s=1e9, capacity_groups=10**7)
        buf = ReplayBuffer(os.path.join(tmp, "records"), **flat)
        emit("add_rollouts_records_us_per_64", per_call(buf.add_rollouts, recs), "us")
        buf = ReplayBuffer(os.path.join(tmp, "columns"), **flat)
        emit("add_rollouts_columns_us_per_64", per_call(buf.add_rollouts, tables), "us")
        groups = list(buf._staged)
        start = time.perf_counter()
        table = materialize(groups, buf._read_file)
        meta = [
            (g.id, g.example_id, g.uids, g.sealed_ts, g.first_ts, g.versions, g.replicas)
            for g in groups
        ]
        storage.write_groups(buf._store, "bench", table, meta, "zstd")
        elapsed = time.perf_counter() - start
        emit("write_rollouts_per_s", table.num_rows / elapsed, "rollouts/s")
        emit("write_mb_per_s", table.nbytes / elapsed / 1e6, "MB/s")
        buf.flush()
        ready = buf.stats()["groups_ready"]
        batches = []

        def draw(_):
            batches.append(buf.sample_groups(16, seed=len(batches)))

        draws = min(50, ready // 16)
        emit(f"sample_groups_16_us_at_{ready}_ready", per_call(draw, range(draws)), "us")
        emit("get_batch_16_groups_us", per_call(lambda b: buf.get_batch(b.batch_id), batches), "us")
        emit("ack_us", per_call(lambda b: buf.ack(b.batch_id, "failed"), batches), "us")
        buf.close()
        if not args.no_ray:
            ray_costs(tables)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def ray_costs(tables: list) -> None:
    import ray

    ray.init(num_cpus=os.cpu_count(), include_dashboard=False, log_to_driver=False)

    @ray.remote(num_cpus=0)
    class Noop:
        def call(self, x):
            return None

    a = Noop.remote()
    ray.get(a.call.remote(0))
    emit("ray_actor_call_small_us", per_call(lambda _: ray.get(a.call.remote(0)), range(300)), "us")
    n = len(tables)
    emit("ray_actor_call_64_rollouts_us", per_call(lambda t: ray.get(a.call.remote(t)), tables), "us")
    refs = [ray.put(t) for t in tables]
    start = time.perf_counter()
    ray.get([a.call.remote(r) for r in refs])
    emit("ray_actor_call_64_rollouts_pipelined_us", (time.perf_counter() - start) / n * 1e6, "us")
    ray.shutdown()


if __name__ == "__main__":
    main()
