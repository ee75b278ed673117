"""The drop-ins under the workloads of their originals, printed as JSON lines beside the
original's figures from ``research/areal.md`` §7 (same machine class: this 2-core VM).

AReaL (``rollout_buffer.areal``): 3 MFCs (gen: packed_prompts -> packed_input_ids;
reward: packed_input_ids -> rewards; train: packed_input_ids, rewards), n_seqs 64, puts
of 64 metadata-only samples made before timing, at capacities 1K / 8K / 64K:

* ``put``: fill fresh buffers with puts of 64 until 16,384 samples are in;
* ``pipeline``: a producer putting 64 at a time (retrying on BufferFull), one consumer
  coroutine per MFC looping get -> ``await asyncio.sleep(0)`` -> amend (gen, reward);
  max(N, 16,384) samples trained; samples trained per second;
* ``get_ready``: a full buffer whose samples hold every key, drained by gets round-robin
  over the MFCs; microseconds per get call (p50).

usage: python python/bench/dropin.py [--capacities 1024,8192,65536] [--repeat 3]
"""

import argparse
import asyncio
import json
import statistics
import time

from rollout_buffer.areal import AsyncIOSequenceBuffer, BufferFull, MFCDef, SequenceSample, build_graph

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


def pipeline_case(capacity):
    gen, reward, train = mfcs()
    total = max(16_384, capacity)
    batches = [[sample(b * BATCH + i, ["packed_prompts"]) for i in range(BATCH)] for b in range(total // BATCH)]
    outs = {
        "gen": {i: sample(i, ["packed_input_ids"]) for i in range(total)},
        "reward": {i: sample(i, ["rewards"]) for i in range(total)},
    }

    async def go():
        buf = AsyncIOSequenceBuffer([gen, reward, train], capacity)
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
            for _ in range(total // BATCH):
                idx, got = await buf.get_batch_for_rpc(rpc)
                await asyncio.sleep(0)
                table = outs[rpc.name]
                await buf.amend_batch(idx, [table[int(i)] for i in got.ids])

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


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--capacities", default="1024,8192,65536")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    for capacity in [int(c) for c in args.capacities.split(",")]:
        ref = AREAL.get(capacity, {})
        for case, fn, unit in (
            ("put", put_case, "samples_per_s"),
            ("pipeline", pipeline_case, "samples_per_s"),
            ("get_ready", get_ready_case, "us_per_get"),
        ):
            runs = [fn(capacity) for _ in range(args.repeat)]
            value = statistics.median(runs)
            line = {"workload": "areal", "case": case, "capacity": capacity, unit: round(value, 1),
                    "runs": [round(r, 1) for r in runs]}
            if case == "get_ready" and "get_ready_us" in ref:
                line["areal_us_per_get"] = ref["get_ready_us"]
                line["speedup"] = round(ref["get_ready_us"] / value, 1)
            elif case in ref:
                line["areal_samples_per_s"] = ref[case]
                line["speedup"] = round(value / ref[case], 1)
            print(json.dumps(line), flush=True)


if __name__ == "__main__":
    main()
