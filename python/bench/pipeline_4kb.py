"""Python-side cost of the buffer against the same workload in Rust.

Each round puts 64 samples of 4 KB (1,024 float32 each), leases them for one RPC, reads
the field and commits: once per API, dicts (one dict per sample, the convenience path) and
columns (one numpy array for the batch), blocking and asyncio. Prints one JSON line per
API:

    {"api": "columnar_blocking", "samples_per_s": ..., "rust_samples_per_s": ...,
     "ratio": ..., "rss_mb": ..., "rss_growth_mb": ...}

The Rust figure comes from ``examples/pipeline_4kb.rs``, run in the same invocation: pass
its binary's path, or let this script build it with ``cargo run --release``. Build the
package in release mode first (``maturin develop --release``); a debug build measures
the debug build.

``rss_growth_mb`` is the growth of this process's resident memory between the end of a
first run and the end of a second one of ten times as many rounds: a leak would grow with
the rounds, a bounded working set does not.

Usage: python bench/pipeline_4kb.py [--seconds S] [--rust PATH]
"""

import argparse
import asyncio
import json
import os
import pathlib
import subprocess
import time

import numpy as np

import rollout_buffer as rb

N = 64
PAYLOAD = np.arange(1024, dtype=np.float32)
COLUMN = np.tile(PAYLOAD, (N, 1))
ROOT = pathlib.Path(__file__).resolve().parents[2]


def rss_mb():
    with open("/proc/self/statm") as f:
        pages = int(f.read().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE") / 2**20


def new_buffer():
    return rb.Buffer(1024, [rb.Rpc("train", N, inputs=["x"])])


def dict_round_blocking(buf, start):
    buf.put_batch_blocking([{"id": start + i, "x": PAYLOAD} for i in range(N)])
    batch = buf.get_batch_for_rpc_blocking("train")
    assert batch.samples()[0]["x"].nbytes == 4096
    batch.commit_blocking()


def columnar_round_blocking(buf, start):
    buf.put_columns_blocking({"x": COLUMN}, ids=np.arange(start, start + N))
    batch = buf.get_batch_for_rpc_blocking("train")
    assert batch.columns()["x"].nbytes == N * 4096
    batch.commit_blocking()


async def dict_round_async(buf, start):
    await buf.put_batch([{"id": start + i, "x": PAYLOAD} for i in range(N)])
    batch = await buf.get_batch_for_rpc("train")
    assert batch.samples()[0]["x"].nbytes == 4096
    await batch.commit()


async def columnar_round_async(buf, start):
    await buf.put_columns({"x": COLUMN}, ids=np.arange(start, start + N))
    batch = await buf.get_batch_for_rpc("train")
    assert batch.columns()["x"].nbytes == N * 4096
    await batch.commit()


def run_blocking(round_fn, rounds, buf, start):
    for r in range(rounds):
        round_fn(buf, start + r * N)


async def run_async(round_fn, rounds, buf, start):
    for r in range(rounds):
        await round_fn(buf, start + r * N)


def measure(name, round_fn, is_async, seconds):
    """Rounds for `seconds` (the rate), then rounds and 10x rounds (the memory)."""
    buf = new_buffer()
    loop = asyncio.new_event_loop()  # one loop for the whole measurement
    if is_async:
        def run(n, s):
            loop.run_until_complete(run_async(round_fn, n, buf, s))
    else:
        def run(n, s):
            run_blocking(round_fn, n, buf, s)
    run(50, 0)  # warm up
    rounds, start, t0 = 0, 50 * N, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        run(20, start)
        rounds += 20
        start += 20 * N
    rate = rounds * N / (time.perf_counter() - t0)
    base_rounds = max(rounds // 4, 100)
    run(base_rounds, start)
    start += base_rounds * N
    rss_before = rss_mb()
    run(10 * base_rounds, start)
    rss_after = rss_mb()
    loop.close()
    return {"api": name, "samples_per_s": round(rate), "rss_mb": round(rss_after, 1),
            "rss_growth_mb": round(rss_after - rss_before, 1),
            "rounds_for_memory": [base_rounds, 10 * base_rounds]}


def rust_rate(path, seconds):
    cmd = [os.path.abspath(path), str(seconds)] if path else [
        "cargo", "run", "--quiet", "--release", "--example", "pipeline_4kb", "--", str(seconds)]
    out = subprocess.run(cmd, cwd=ROOT, check=True, capture_output=True, text=True).stdout
    for line in out.splitlines():
        if line.startswith("{"):
            return json.loads(line)["samples_per_s"]
    raise SystemExit(f"no JSON line from {cmd}: {out!r}")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--rust", help="path of the built pipeline_4kb example")
    args = parser.parse_args()
    rust = rust_rate(args.rust, args.seconds)
    print(json.dumps({"api": "rust", "samples_per_s": rust}))
    for name, fn, is_async in [
        ("dict_blocking", dict_round_blocking, False),
        ("dict_asyncio", dict_round_async, True),
        ("columnar_blocking", columnar_round_blocking, False),
        ("columnar_asyncio", columnar_round_async, True),
    ]:
        result = measure(name, fn, is_async, args.seconds)
        result["rust_samples_per_s"] = rust
        result["ratio"] = round(result["samples_per_s"] / rust, 3)
        print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
