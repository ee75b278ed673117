//! Rollouts with 8 KiB of tensor data whose every value depends on the sample's id, so a
//! test can check that each sample came back with its own data (the spill tests).

use rollout_buffer::{Sample, Tensor};

/// Tokens per sample (4 KiB of int32 tokens and 4 KiB of float32 logprobs).
pub const TOKENS: usize = 1024;
/// Tensor bytes per sample.
pub const SAMPLE_BYTES: u64 = (TOKENS * 8) as u64;

/// Sample `i`: `tokens[t] = t ^ i`, `logp[t] = -t - i`.
pub fn rollout(i: u64) -> Sample {
    let tokens: Vec<i32> = (0..TOKENS as i32).map(|t| t ^ i as i32).collect();
    let logp: Vec<f32> = (0..TOKENS).map(|t| -(t as f32) - i as f32).collect();
    Sample::new(i).with("tokens", tokens).with("logp", logp)
}

/// Checks that the fields of the sample with id `id` are those `rollout` gave it; returns
/// its number.
pub fn check<'a>(id: &str, get: impl Fn(&str) -> Option<&'a Tensor>) -> u64 {
    let i: u64 = id.parse().expect("numeric id");
    let tokens = get("tokens")
        .and_then(|t| t.array::<i32>())
        .expect("tokens");
    let logp = get("logp").and_then(|t| t.array::<f32>()).expect("logp");
    assert_eq!(tokens.len(), TOKENS, "sample {i}");
    for (t, (&a, &b)) in tokens.iter().zip(logp.iter()).enumerate() {
        assert_eq!(a, t as i32 ^ i as i32, "sample {i} token {t}");
        assert_eq!(b, -(t as f32) - i as f32, "sample {i} logp {t}");
    }
    i
}
