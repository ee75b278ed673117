"""Scale-out of the replay buffer on a local Ray cluster: shards x producer tasks writing
4 KB rollouts (512 int32 tokens + 512 float32 logprobs) in groups of 8, one trainer task
drawing, fetching (object refs from the shards) and acking batches of 16 groups.

Prints one JSON line per configuration:
    {"shards", "producers", "input", "rollouts_per_s", "groups_sampled_per_s",
     "efficiency", "cores", "seconds"}
where efficiency = rollouts_per_s / (shards x the one-shard rate at the same producer
count). Producers send ``add_rollouts`` batches of ``--batch`` rollouts as Arrow tables
(``--input columns``, the fast path) or as lists of ``RolloutRecord`` (``--input records``).

    python python/bench/ray_scale.py                      # 1,2,4 shards x 4,8,16 producers
    python python/bench/ray_scale.py --shards 1 --producers 4 --seconds 1   # a smoke run
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import shutil
import tempfile
import time

import numpy as np
import pyarrow as pa
import ray

from rollout_buffer.replay import RolloutRecord, ShardedReplayBuffer
from rollout_buffer.replay.records import records_to_table

TOKENS = 512
GROUP = 8


def template(batch: int) -> list:
    """A batch of rollouts; producers swap in fresh ids per call."""
    rng = np.random.default_rng(0)
    return [
        RolloutRecord(
            environment="math",
            example_id="x",
            policy_version="1",
            rollout_uid=f"t{i}",
            reward=float(i % 2),
            output_tokens=rng.integers(0, 50_000, TOKENS, dtype=np.int32),
            logprobs=rng.standard_normal(TOKENS).astype(np.float32),
        )
        for i in range(batch)
    ]


def as_columns(records: list) -> pa.Table:
    """What a producer with columns sends: the fields it has, as one table."""
    names = ["environment", "example_id", "policy_version", "replica_id", "rollout_uid",
             "token_count", "reward", "output_tokens", "logprobs", "created_ts"]
    return records_to_table(records, True)[0].select(names)


@ray.remote(num_cpus=0)
class Gate:
    """A start line: tasks warm up (imports, templates), arrive, and all start when the
    driver opens it, so worker start-up is not in the measured window."""

    def __init__(self) -> None:
        self.event = asyncio.Event()
        self.arrived = 0
        self.start = 0.0

    async def arrive(self) -> float:
        self.arrived += 1
        await self.event.wait()
        return self.start

    async def count(self) -> int:
        return self.arrived

    async def open(self) -> None:
        self.start = time.time()
        self.event.set()


def open_gate(gate, tasks: int) -> None:
    while ray.get(gate.count.remote()) < tasks:
        time.sleep(0.01)
    ray.get(gate.open.remote())


@ray.remote(num_cpus=0)
def producer(front: ShardedReplayBuffer, p: int, batch: int, gate, seconds: float, mode: str) -> int:
    records = template(batch)
    base = as_columns(records)
    deadline = ray.get(gate.arrive.remote()) + seconds
    sent, k = 0, 0
    while time.time() < deadline:
        # GROUP rollouts per example: each call seals batch / GROUP groups.
        examples = [f"p{p}-e{k}-{i // GROUP}" for i in range(batch)]
        uids = [f"p{p}-{k}-{i}" for i in range(batch)]
        if mode == "records":
            rs = [
                dataclasses.replace(r, example_id=e, rollout_uid=u)
                for r, e, u in zip(records, examples, uids)
            ]
        else:
            rs = base.set_column(1, "example_id", pa.array(examples)).set_column(
                4, "rollout_uid", pa.array(uids)
            )
        ray.get([ref for _, ref in front.add_rollouts_refs(rs)])
        sent += batch
        k += 1
    return sent


@ray.remote(num_cpus=0)
class NoopShard:
    """Ray's own floor: an actor that takes the same calls and does nothing."""

    def add_rollouts(self, rs):
        return ["pending"] * len(rs)


@ray.remote(num_cpus=0)
def noop_producer(shard, p: int, batch: int, gate, seconds: float, mode: str) -> int:
    records = template(batch)
    base = as_columns(records) if mode == "columns" else records
    deadline = ray.get(gate.arrive.remote()) + seconds
    sent, k = 0, 0
    while time.time() < deadline:
        uids = [f"p{p}-{k}-{i}" for i in range(batch)]
        if mode == "columns":
            rs = base.set_column(4, "rollout_uid", pa.array(uids))
        else:
            rs = [dataclasses.replace(r, rollout_uid=u) for r, u in zip(records, uids)]
        ray.get(shard.add_rollouts.remote(rs))
        sent += batch
        k += 1
    return sent


def run_noop(producers: int, seconds: float, batch: int, mode: str) -> float:
    shard, gate = NoopShard.remote(), Gate.remote()
    tasks = [noop_producer.remote(shard, p, batch, gate, seconds, mode) for p in range(producers)]
    open_gate(gate, producers)
    sent = sum(ray.get(tasks))
    ray.kill(shard)
    return sent / seconds


@ray.remote(num_cpus=0)
def trainer(front: ShardedReplayBuffer, gate, seconds: float, n: int) -> int:
    deadline = ray.get(gate.arrive.remote()) + seconds
    drawn, step = 0, 0
    while time.time() < deadline:
        batch = front.sample_groups(n, seed=step)
        step += 1
        if not batch.group_ids:
            time.sleep(0.001)
            continue
        tables = ray.get(front.batch_refs(batch))
        assert sum(t.num_rows for t in tables) == len(batch.group_ids) * GROUP
        front.ack(batch.batch_id, "ok")
        drawn += len(batch.group_ids)
    return drawn


def run(shards: int, producers: int, seconds: float, batch: int, mode: str, root: str) -> dict:
    front = ShardedReplayBuffer(
        root, shards, by="hash", ray_options={"num_cpus": 0},
        target_group_size=GROUP, max_uses_per_group=1, capacity_groups=200_000,
    )
    ray.get([h.stats.remote() for h in front.handles])  # actors up
    gate = Gate.remote()
    t = trainer.remote(front, gate, seconds, 16)
    ps = [producer.remote(front, p, batch, gate, seconds, mode) for p in range(producers)]
    open_gate(gate, producers + 1)
    sent = sum(ray.get(ps))
    drawn = ray.get(t)
    stats = front.stats()
    front.close()
    for h in front.handles:
        ray.kill(h)
    calls = sum(s["add_calls"] for s in stats)
    busy = sum(s["add_busy_s"] for s in stats)
    return {
        "rollouts_per_s": sent / seconds,
        "groups_sampled_per_s": drawn / seconds,
        "us_per_add_call": busy / calls * 1e6 if calls else 0.0,
        "shard_busy": busy / (seconds * shards),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shards", default="1,2,4")
    ap.add_argument("--producers", default="4,8,16")
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--input", choices=["columns", "records"], default="columns")
    ap.add_argument(
        "--no-baseline", action="store_true",
        help="skip the no-op actor line per producer count (Ray's own ceiling here)",
    )
    args = ap.parse_args()
    cores = os.cpu_count() or 1
    ray.init(num_cpus=cores, include_dashboard=False, log_to_driver=False)
    one: dict = {}
    tmp = tempfile.mkdtemp(prefix="ray-scale-")
    try:
        for p in [int(x) for x in args.producers.split(",")]:
            if not args.no_baseline:
                rate = run_noop(p, args.seconds, args.batch, args.input)
                print(json.dumps({"shards": 1, "producers": p, "input": args.input,
                                  "actor": "noop", "rollouts_per_s": round(rate, 1),
                                  "cores": cores, "seconds": args.seconds}), flush=True)
            for s in [int(x) for x in args.shards.split(",")]:
                root = os.path.join(tmp, f"s{s}-p{p}")
                r = run(s, p, args.seconds, args.batch, args.input, root)
                if s == 1:
                    one[p] = r["rollouts_per_s"]
                base = one.get(p)
                r = {
                    "shards": s,
                    "producers": p,
                    "input": args.input,
                    **{k: round(v, 1) for k, v in r.items()},
                    "efficiency": round(r["rollouts_per_s"] / (s * base), 3) if base else None,
                    "cores": cores,
                    "seconds": args.seconds,
                }
                print(json.dumps(r), flush=True)
                shutil.rmtree(root, ignore_errors=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        ray.shutdown()


if __name__ == "__main__":
    main()
