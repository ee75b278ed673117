"""The drop-ins under the workloads of their originals, printed as JSON lines beside the
original's figures from ``research/areal.md`` §7 (same machine class: this 2-core VM).

AReaL (``rollout_buffer.areal``): 3 MFCs (gen: packed_prompts -> packed_input_ids;
reward: packed_input_ids -> rewards; train: packed_input_ids, rewards), n_seqs 64, puts
of 64 metadata-only samples made before timing, at capacities 1K / 8K / 64K:

* ``put``: fill fresh buffers with puts of 64 until 16,384 samples are in;
* ``pipeline``: a producer putting 64 at a time (retrying on BufferFull), one consumer
  coroutine per MFC looping get -> ``await asyncio.sleep(0)`` -> amend (gen, reward) with
  outputs made before timing; max(N, 16,384) samples trained; samples trained per second;
* ``pipeline_floor``: the pipeline through ``FifoFloor``, a FIFO per MFC doing nothing but
  the samples' own (Python) ``gather`` and ``update_``: the ceiling for a buffer that merges
  and gathers through the samples' methods (the drop-in does both natively for the
  stand-in samples, so it is not bound by it);
* ``pipeline_harness``: the same FIFO with no gather and no merge at all: what the event
  loop and the workload's own loops cost, the ceiling for any buffer whatsoever;
* ``pipeline_split``: the drop-in's pipeline with each call timed: microseconds per batch
  of 64 in puts (retries included), gets and amends, and the rest (the event loop);
* ``get_ready``: a full buffer whose samples hold every key, drained by gets round-robin
  over the MFCs; microseconds per get call (p50).

Marin (``rollout_buffer.marin``): two environments, each filled to its capacity first;
then a loop of ``add_batches`` (one batch of 8 groups of 8 rollouts) and
``sample_rollouts`` (64, alpha 3, max_samples 4); rollouts sampled per second, beside the
same loop on a plain-list implementation of Marin's algorithm (a label list of every
stored rollout per draw, every list rebuilt at retirement) as the baseline.

usage: python python/bench/dropin.py [--capacities 1024,8192,65536] [--repeat 3]
                                     [--workloads areal,marin]
"""

import argparse
import asyncio
import json
import statistics
import time

from collections import defaultdict, deque

import numpy as np

from rollout_buffer.areal import AsyncIOSequenceBuffer, BufferFull, MFCDef, SequenceSample, build_graph
from rollout_buffer.marin import ReplayBuffer, Rollout, RolloutBatch, RolloutGroup, RolloutMetadata

# research/areal.md §7.2, medians on this machine class.
AREAL = {
    1024: {"put": 266_637, "pipeline": 51_097, "get_ready_us": 157},
    8192: {"put": 167_978, "pipeline": 29_615, "get_ready_us": 361},
    65536: {"put": 39_358, "pipeline": 7_596, "get_ready_us": 1_928},
}
BATCH = 64


def mfcs():
    return build_graph([
        MFCDef("gen", BATCH, ["packed_prompts"], ["packed_input_ids"]),
        MFCDef("reward", BATCH, ["packed_input_ids"], ["rewards"]),
        MFCDef("train", BATCH, ["packed_input_ids", "rewards"]),
    ])


def sample(i, keys):
    return SequenceSample(keys=set(keys), ids=[i], seqlens={k: [[128]] for k in keys})


def put_case(capacity):
    rpcs = mfcs()
    total = max(16_384, capacity)
    batches = [[sample(f"{b}-{i}", ["packed_prompts"]) for i in range(BATCH)] for b in range(total // BATCH)]

    async def go():
        done, elapsed = 0, 0.0
        while done < total:
            buf = AsyncIOSequenceBuffer(rpcs, capacity)
            t = time.perf_counter()
            for _ in range(capacity // BATCH):
                if done >= total:
                    break
                await buf.put_batch(batches[done // BATCH])
                done += BATCH
            elapsed += time.perf_counter() - t
        return total / elapsed

    return asyncio.run(go())


class FifoFloor:
    """The least any buffer with AReaL's API can do for the pipeline workload: a FIFO queue
    per MFC in chain order, with no slots, readiness, ordering or checks; only the samples'
    own ``gather`` and ``update_``. Its rate is the ceiling for this workload on this
    machine, whatever the buffer."""

    def __init__(self, rpcs, capacity):
        self.rpcs, self.capacity, self.size = list(rpcs), capacity, 0
        self.queues = {r.name: deque() for r in self.rpcs}
        self.next = {a.name: b.name for a, b in zip(self.rpcs, self.rpcs[1:])}
        self.changed = asyncio.Event()

    async def put_batch(self, samples):
        if self.size + len(samples) > self.capacity:
            raise BufferFull(f"{self.size} of {self.capacity} held")
        self.size += len(samples)
        self.queues[self.rpcs[0].name].extend(samples)
        self.changed.set()

    async def get_batch_for_rpc(self, rpc):
        queue = self.queues[rpc.name]
        while len(queue) < rpc.n_seqs:
            self.changed.clear()
            await self.changed.wait()
        got = [queue.popleft() for _ in range(rpc.n_seqs)]
        if rpc.name not in self.next:
            self.size -= len(got)
        return (rpc.name, got), self.gather(got, rpc)

    async def amend_batch(self, handle, samples):
        name, entries = handle
        self.merge(entries, samples)
        self.queues[self.next[name]].extend(entries)
        self.changed.set()

    def gather(self, entries, rpc):
        return SequenceSample.gather(entries, keys=list(rpc.input_keys))

    def merge(self, entries, samples):
        for entry, sample in zip(entries, samples):
            entry.update_(sample)


class HarnessOnly(FifoFloor):
    """``FifoFloor`` without the samples' work: reads hand out no gathered sample and amends
    merge nothing. What is left is the workload's own cost."""

    def gather(self, entries, rpc):
        return None

    def merge(self, entries, samples):
        pass


class TimedBuffer(AsyncIOSequenceBuffer):
    """The drop-in with the time of each call added up per kind (a get includes any wait
    for data, which the pipeline's order keeps short)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.spent = defaultdict(float)

    async def put_batch(self, samples, birth_times=None):
        t = time.perf_counter()
        try:
            return await super().put_batch(samples, birth_times)
        finally:
            self.spent["put"] += time.perf_counter() - t

    async def get_batch_for_rpc(self, rpc):
        t = time.perf_counter()
        try:
            return await super().get_batch_for_rpc(rpc)
        finally:
            self.spent["get"] += time.perf_counter() - t

    async def amend_batch(self, indices, samples):
        t = time.perf_counter()
        try:
            return await super().amend_batch(indices, samples)
        finally:
            self.spent["amend"] += time.perf_counter() - t


def split_case(capacity):
    """Microseconds per batch of 64 through the pipeline, by kind of call."""
    made = []

    def make(rpcs, cap):
        made.append(TimedBuffer(rpcs, cap))
        return made[-1]

    rate = pipeline_case(capacity, make)
    per_batch = 1e6 * BATCH / rate
    batches = max(16_384, capacity) // BATCH
    out = {kind: 1e6 * t / batches for kind, t in made[0].spent.items()}
    out["rest"] = per_batch - sum(out.values())
    out["total"] = per_batch
    return out


def pipeline_case(capacity, make=None):
    gen, reward, train = mfcs()
    total = max(16_384, capacity)
    batches = [[sample(b * BATCH + i, ["packed_prompts"]) for i in range(BATCH)] for b in range(total // BATCH)]
    # Each MFC's outputs, made before timing as the inputs are: batch k of an MFC's reads
    # is put batch k (oldest first), and the amend checks every output's ids against its
    # entry's, so a read out of order fails the run.
    outs = {
        name: [[sample(b * BATCH + i, [key]) for i in range(BATCH)] for b in range(total // BATCH)]
        for name, key in (("gen", "packed_input_ids"), ("reward", "rewards"))
    }

    async def go():
        buf = (make or AsyncIOSequenceBuffer)([gen, reward, train], capacity)
        trained = 0

        async def producer():
            for batch in batches:
                while True:
                    try:
                        await buf.put_batch(batch)
                        break
                    except BufferFull:
                        await asyncio.sleep(0)

        async def stage(rpc):
            for outputs in outs[rpc.name]:
                idx, got = await buf.get_batch_for_rpc(rpc)
                await asyncio.sleep(0)
                await buf.amend_batch(idx, outputs)

        async def trainer():
            nonlocal trained
            for _ in range(total // BATCH):
                await buf.get_batch_for_rpc(train)
                await asyncio.sleep(0)
                trained += BATCH

        t = time.perf_counter()
        await asyncio.gather(producer(), stage(gen), stage(reward), trainer())
        return trained / (time.perf_counter() - t)

    return asyncio.run(go())


def get_ready_case(capacity):
    rpcs = mfcs()
    keys = ["packed_prompts", "packed_input_ids", "rewards"]
    samples = [sample(i, keys) for i in range(capacity)]

    async def go():
        buf = AsyncIOSequenceBuffer(rpcs, capacity)
        for b in range(0, capacity, BATCH):
            await buf.put_batch(samples[b : b + BATCH])
        times = []
        for call in range(3 * (capacity // BATCH)):
            t = time.perf_counter()
            await buf.get_batch_for_rpc(rpcs[call % 3])
            times.append(time.perf_counter() - t)
        return statistics.median(times) * 1e6

    return asyncio.run(go())


class ListMarin:
    """Marin's algorithm on plain lists (the baseline): per draw, a label per stored
    rollout; per sampled env, recency weights; at retirement, every list rebuilt."""

    def __init__(self, capacity, batch_size, alpha, max_samples, seed):
        self.capacity, self.b, self.alpha, self.max = capacity, batch_size, alpha, max_samples
        self.rng = np.random.default_rng(seed)
        self.store = {}

    def add_batches(self, batches):
        for b in batches:
            for g in b.groups:
                xs = self.store.setdefault(g.rollouts[0].env_name, [])
                xs.extend([r, 0] for r in g.rollouts)
                del xs[: max(0, len(xs) - self.capacity)]

    def sample_rollouts(self):
        envs = [e for e, xs in self.store.items() if xs]
        labels = [e for e in envs for _ in self.store[e]]
        if len(labels) < self.b:
            return None
        counts = defaultdict(int)
        for e in self.rng.choice(np.array(labels), size=self.b, replace=False):
            counts[e] += 1
        out = []
        for e, n in counts.items():
            xs = self.store[e]
            w = (np.arange(len(xs)) + 1) ** self.alpha
            for i in self.rng.choice(len(xs), p=w / w.sum(), size=n, replace=False):
                xs[i][1] += 1
                out.append(xs[i][0])
        for e in self.store:
            self.store[e] = [x for x in self.store[e] if x[1] < self.max]
        return out


def marin_batches(count, env, start):
    meta = RolloutMetadata(worker_id="w", timestamp=time.time(), weight_step=0)
    tokens = np.zeros(16, np.int32)
    out = []
    for b in range(count):
        groups = []
        for g in range(8):
            rollouts = [
                Rollout(env, f"{env}-{start + b}-{g}", tokens, tokens, tokens, tokens, float(k % 2), metadata=meta)
                for k in range(8)
            ]
            groups.append(RolloutGroup(rollouts))
        out.append(RolloutBatch(groups, meta))
    return out


def marin_case(capacity, make):
    buf = make(capacity)
    steps = 200
    fill = {env: marin_batches(capacity // 64, env, 0) for env in ("math", "code")}
    for env in fill:
        buf.add_batches(fill[env])
    feed = [marin_batches(1, ("math", "code")[i % 2], 10**6 + i)[0] for i in range(steps)]
    t = time.perf_counter()
    sampled = 0
    for batch in feed:
        buf.add_batches([batch])
        got = buf.sample_rollouts()
        sampled += len(got or ())
    return sampled / (time.perf_counter() - t)


def run_marin(capacity, repeat):
    ours = lambda c: ReplayBuffer(capacity=c, local_batch_size=64, alpha=3.0, max_samples=4,
                                  max_rollout_step_delay=0, seed=1)
    base = lambda c: ListMarin(c, 64, 3.0, 4, seed=1)
    runs = [marin_case(capacity, ours) for _ in range(repeat)]
    ref = [marin_case(capacity, base) for _ in range(repeat)]
    value, ref_value = statistics.median(runs), statistics.median(ref)
    print(json.dumps({"workload": "marin", "capacity": capacity, "samples_per_s": round(value, 1),
                      "runs": [round(r, 1) for r in runs], "list_baseline_samples_per_s": round(ref_value, 1),
                      "speedup": round(value / ref_value, 1)}), flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--capacities", default="1024,8192,65536")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--workloads", default="areal,marin")
    args = ap.parse_args()
    workloads = args.workloads.split(",")
    for capacity in [int(c) for c in args.capacities.split(",")]:
        if "marin" in workloads:
            run_marin(capacity, args.repeat)
        if "areal" not in workloads:
            continue
        ref = AREAL.get(capacity, {})
        for case, fn, unit in (
            ("put", put_case, "samples_per_s"),
            ("pipeline", pipeline_case, "samples_per_s"),
            ("pipeline_floor", lambda c: pipeline_case(c, FifoFloor), "samples_per_s"),
            ("pipeline_harness", lambda c: pipeline_case(c, HarnessOnly), "samples_per_s"),
            ("get_ready", get_ready_case, "us_per_get"),
        ):
            runs = [fn(capacity) for _ in range(args.repeat)]
            value = statistics.median(runs)
            line = {"workload": "areal", "case": case, "capacity": capacity, unit: round(value, 1),
                    "runs": [round(r, 1) for r in runs]}
            if case == "get_ready" and "get_ready_us" in ref:
                line["areal_us_per_get"] = ref["get_ready_us"]
                line["speedup"] = round(ref["get_ready_us"] / value, 1)
            elif case in ("pipeline_floor", "pipeline_harness") and "pipeline" in ref:
                # No buffer: the ceilings the pipeline's figure is read against.
                line["areal_samples_per_s"] = ref["pipeline"]
                line["speedup"] = round(value / ref["pipeline"], 1)
            elif case in ref:
                line["areal_samples_per_s"] = ref[case]
                line["speedup"] = round(value / ref[case], 1)
            print(json.dumps(line), flush=True)
        splits = [split_case(capacity) for _ in range(args.repeat)]
        line = {"workload": "areal", "case": "pipeline_split", "capacity": capacity,
                "us_per_batch": {k: round(statistics.median(s[k] for s in splits), 1) for k in splits[0]}}
        if "pipeline" in ref:
            # AReaL's rate x 10, as microseconds per batch of 64: the target's budget.
            line["budget_for_10x_us"] = round(1e6 * BATCH / (10 * ref["pipeline"]), 1)
        print(json.dumps(line), flush=True)


if __name__ == "__main__":
    main()
