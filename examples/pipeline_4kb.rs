//! The Python benchmark's workload (`python/bench/pipeline_4kb.py`) in Rust: put 64
//! samples of 4 KB (1,024 f32), get them for one RPC, read one field, commit; samples/s,
//! printed as one JSON line (`{"api": "rust", "samples_per_s": ...}`), which the Python
//! benchmark reads to report its ratios.
//!
//! Usage: `cargo run --release --example pipeline_4kb -- [seconds]`.

use rollout_buffer::{RpcDef, Sample, SequenceBuffer, Tensor};
use std::time::Instant;

const N: u64 = 64;

#[tokio::main(flavor = "current_thread")]
async fn main() -> rollout_buffer::Result<()> {
    let seconds: f64 = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(3.0);
    let payload: Vec<f32> = (0..1024).map(|i| i as f32).collect();
    let buf = SequenceBuffer::new(1024, [RpcDef::new("train", N as usize).inputs(["x"])])?;
    let (mut done, mut start) = (0u64, 0u64);
    let t0 = Instant::now();
    while t0.elapsed().as_secs_f64() < seconds {
        // Like the Python side, each sample gets its own copy of the payload.
        let samples = (start..start + N)
            .map(|i| Sample::new(i).with("x", Tensor::from(payload.clone())))
            .collect();
        buf.put_batch(samples).await?;
        let batch = buf.get_batch_for_rpc("train").await?;
        let bytes = batch
            .sample(0)
            .and_then(|s| s.get("x"))
            .map_or(0, Tensor::nbytes);
        assert_eq!(bytes, 4096);
        batch.commit().await?;
        start += N;
        done += N;
    }
    let rate = done as f64 / t0.elapsed().as_secs_f64();
    println!("{{\"api\": \"rust\", \"samples_per_s\": {rate:.0}}}");
    Ok(())
}
