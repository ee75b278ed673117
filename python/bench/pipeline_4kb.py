"""Python-side cost of the buffer: put 64 samples of 4 KB (1,024 float32), get them for
one RPC, commit, repeated; samples/s for the blocking and the asyncio API. The same
workload in Rust: `cargo run --release --example pipeline_4kb`.

Usage: python bench/pipeline_4kb.py [seconds]
"""

import asyncio
import sys
import time

import numpy as np

import rollout_buffer as rb

N = 64
PAYLOAD = np.arange(1024, dtype=np.float32)


def make(start):
    return [{"id": start + i, "x": PAYLOAD} for i in range(N)]


def blocking(seconds):
    buf = rb.Buffer(1024, [rb.Rpc("train", N, inputs=["x"])])
    done, start, t0 = 0, 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        buf.put_batch_blocking(make(start))
        batch = buf.get_batch_for_rpc_blocking("train")
        assert batch.samples()[0]["x"].nbytes == 4096
        batch.commit_blocking()
        start += N
        done += N
    return done / (time.perf_counter() - t0)


async def asynchronous(seconds):
    buf = rb.Buffer(1024, [rb.Rpc("train", N, inputs=["x"])])
    done, start, t0 = 0, 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        await buf.put_batch(make(start))
        batch = await buf.get_batch_for_rpc("train")
        assert batch.samples()[0]["x"].nbytes == 4096
        await batch.commit()
        start += N
        done += N
    return done / (time.perf_counter() - t0)


if __name__ == "__main__":
    seconds = float(sys.argv[1]) if len(sys.argv) > 1 else 3.0
    print(f"python blocking: {blocking(seconds):,.0f} samples/s")
    print(f"python asyncio:  {asyncio.run(asynchronous(seconds)):,.0f} samples/s")
