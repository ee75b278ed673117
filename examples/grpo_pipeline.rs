//! An asynchronous GRPO run, simulated end to end on a local directory:
//!
//! * two environments, `math` (short answers, generated quickly) and `code` (long ones,
//!   slowly), each with two replicas that generate rollouts with the current policy
//!   version and send them to the environment's `GroupIngest` (groups of 4: each replica
//!   contributes two rollouts of each example), gated by the staleness-bounded admission;
//! * per environment, a verifier scoring sealed groups through the `verify` RPC;
//! * a trainer taking packed batches from both buffers (half the tokens each, 8 rows of
//!   1,024), "training" on them and advancing the policy version, which bounds staleness.
//!
//! Every buffer is persistent (`<dir>/<env>`), with consumed and filtered groups archived
//! as Parquet under `<dir>/<env>/archive/`.
//!
//! Usage: `cargo run --example grpo_pipeline -- [dir] [steps]` (default
//! `target/grpo-pipeline/run-<time>`, 40 steps).

use indicatif::{ProgressBar, ProgressStyle};
use rollout_buffer::persist::{Durability, PersistOptions};
use rollout_buffer::rollout::{
    Advantage, Batcher, BatcherConfig, DynamicSampling, GroupConfig, GroupIngest, MetricsTracker,
    Packer, RolloutRecord, Shortfall, SlimeHooks, Source, GROUP_INPUTS,
};
use rollout_buffer::{Patch, RpcDef, Selection, SequenceBuffer};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

const GROUP: usize = 4;
const MAX_STALENESS: u64 = 2;
const ROWS: usize = 8;
const SEQ_LEN: usize = 1024;

/// One environment: its name, answer lengths, and time per rollout.
struct Env {
    name: &'static str,
    output_len: (usize, usize),
    per_rollout: Duration,
    /// About how many of its groups a batch takes (half of 8 x 1,024 tokens): the batch
    /// size admission counts in.
    groups_per_batch: u64,
}

const ENVS: [Env; 2] = [
    Env {
        name: "math",
        output_len: (48, 160),
        per_rollout: Duration::from_micros(300),
        groups_per_batch: 6,
    },
    Env {
        name: "code",
        output_len: (200, 480),
        per_rollout: Duration::from_micros(900),
        groups_per_batch: 3,
    },
];

/// A small deterministic generator (the simulated model).
fn mix(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

fn unix_now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

fn buffer_rpcs() -> [RpcDef; 2] {
    [
        RpcDef::new("verify", 1)
            .inputs(["output_tokens"])
            .outputs(["reward"]),
        RpcDef::new("train", 1)
            .inputs(GROUP_INPUTS)
            .max_staleness(MAX_STALENESS)
            .selection(Selection::Fifo),
    ]
}

/// Replica `replica` (0 or 1) of `env`: rollouts 2 * replica and 2 * replica + 1 of every
/// example, with the version the trainer announced, while admission allows.
async fn replica(
    env: &'static Env,
    replica: usize,
    buf: SequenceBuffer,
    ingest: GroupIngest,
    stop: Arc<AtomicBool>,
) -> rollout_buffer::Result<()> {
    let mut example = 0u64;
    while !stop.load(Ordering::Relaxed) {
        if buf.admission(env.groups_per_batch, MAX_STALENESS) <= 0 {
            tokio::time::sleep(Duration::from_millis(2)).await;
            continue;
        }
        let version = buf.policy_version().unwrap_or(0);
        for k in [2 * replica, 2 * replica + 1] {
            let seed = mix(example * 31 + k as u64 + env.name.len() as u64 * 1_000_003);
            let (lo, hi) = env.output_len;
            let len = lo + (seed as usize) % (hi - lo);
            let mut r = RolloutRecord::new(
                env.name,
                format!("{}-{example}", env.name),
                version,
                format!("{}-{example}-{k}", env.name),
            );
            r.replica_id = format!("{}-replica-{replica}", env.name);
            r.created_ts = unix_now();
            r.prompt_tokens = (0..64).map(|t| (example as i32 + t) % 32_000).collect();
            r.output_tokens = (0..len)
                .map(|t| ((seed >> (t % 48)) & 0x7fff) as i32)
                .collect();
            r.logprobs = vec![-0.7; len];
            r.truncated = len + 32 > hi;
            tokio::time::sleep(env.per_rollout).await;
            ingest.add(r).await?;
        }
        example += 1;
    }
    Ok(())
}

/// Scores groups: reward 1 for an answer whose first token is even, else 0.
async fn verifier(buf: SequenceBuffer, stop: Arc<AtomicBool>) -> rollout_buffer::Result<()> {
    while !stop.load(Ordering::Relaxed) {
        let batch = match buf
            .get_batch_for_rpc_timeout("verify", Duration::from_millis(50))
            .await
        {
            Ok(batch) => batch,
            Err(rollout_buffer::Error::Timeout { .. }) => continue,
            Err(e) => return Err(e),
        };
        let patches = batch
            .samples()
            .map(|group| {
                let tokens = group.get("output_tokens");
                let k = tokens.and_then(|t| t.lengths()).map_or(0, <[usize]>::len);
                let rewards: Vec<f64> = (0..k)
                    .map(|i| {
                        let first = tokens
                            .and_then(|t| t.sequence::<i32>(i))
                            .and_then(|s| s.iter().next().copied())
                            .unwrap_or(1);
                        f64::from(u8::from(first % 2 == 0))
                    })
                    .collect();
                Patch::new().with("reward", rewards)
            })
            .collect();
        batch.complete(patches).await?;
    }
    Ok(())
}

#[tokio::main]
async fn main() -> rollout_buffer::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let dir = args
        .get(1)
        .cloned()
        .unwrap_or_else(|| format!("target/grpo-pipeline/run-{}", unix_now() as u64));
    let steps: u64 = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(40);
    let stop = Arc::new(AtomicBool::new(false));
    let options =
        PersistOptions::default().durability(Durability::Interval(Duration::from_millis(50)));
    let mut buffers = Vec::new();
    let mut ingests = Vec::new();
    let mut tasks = Vec::new();
    for env in &ENVS {
        let buf = SequenceBuffer::open(
            &format!("{dir}/{}", env.name),
            512,
            buffer_rpcs(),
            options.clone(),
        )
        .await?;
        let ingest = GroupIngest::start(
            buf.clone(),
            GroupConfig::new(GROUP).seal_after(Duration::from_secs(2), GROUP / 2),
        )
        .await?;
        for r in 0..2 {
            tasks.push(tokio::spawn(replica(
                env,
                r,
                buf.clone(),
                ingest.clone(),
                Arc::clone(&stop),
            )));
        }
        tasks.push(tokio::spawn(verifier(buf.clone(), Arc::clone(&stop))));
        buffers.push(buf);
        ingests.push(ingest);
    }
    let batcher = Batcher::new(
        ENVS.iter()
            .zip(&buffers)
            .map(|(env, buf)| Source {
                name: env.name.into(),
                buffer: buf.clone(),
                rpc: "train".into(),
                fraction: 0.5,
            })
            .collect(),
        BatcherConfig {
            packer: Packer::new(SEQ_LEN, ROWS),
            hooks: Arc::new(SlimeHooks { group_size: GROUP }),
            advantage: Advantage::Grpo {
                divide_by_std: true,
            },
            dynamic: Some(DynamicSampling {
                min_std: 1e-6,
                keep_at_least: 1,
            }),
            wait: Duration::from_millis(200),
            shortfall: Shortfall::FillFromOthers,
        },
    )?;
    let mut trackers: Vec<MetricsTracker> =
        ENVS.iter().map(|e| MetricsTracker::new(e.name)).collect();
    let bar = ProgressBar::new(steps);
    bar.set_style(
        ProgressStyle::with_template("{bar:40} {pos}/{len} steps {msg}")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    let start = Instant::now();
    let (mut rollouts, mut tokens, mut efficiency) = (0usize, 0usize, 0.0f64);
    let mut lag_tokens: BTreeMap<i64, u64> = BTreeMap::new();
    for step in 0..steps {
        let batch = batcher.next_batch().await?;
        for (i, tracker) in trackers.iter_mut().enumerate() {
            tracker.record_batch(&batch, i);
        }
        let b = &batch.batch;
        for (&version, &mask) in b.policy_versions.iter().zip(b.loss_mask.iter()) {
            if mask {
                *lag_tokens.entry(step as i64 - version).or_default() += 1;
            }
        }
        rollouts += b.rows.iter().map(Vec::len).sum::<usize>();
        tokens += b.real_tokens;
        let packing = b.efficiency();
        efficiency += packing;
        tokio::time::sleep(Duration::from_millis(5)).await; // the training step
        batch.complete().await?;
        for buf in &buffers {
            buf.set_policy_version(step + 1)?;
        }
        bar.set_message(format!(
            "{rollouts} rollouts, packing {:.0}%",
            100.0 * packing
        ));
        bar.inc(1);
    }
    bar.finish();
    let elapsed = start.elapsed().as_secs_f64();
    stop.store(true, Ordering::Relaxed);
    for task in tasks {
        task.await
            .map_err(|e| rollout_buffer::Error::InvalidPacking {
                detail: e.to_string(),
            })??;
    }
    println!(
        "{steps} steps in {elapsed:.1} s: {:.0} rollouts/s and {:.0} tokens/s trained, packing efficiency {:.1}%",
        rollouts as f64 / elapsed,
        tokens as f64 / elapsed,
        100.0 * efficiency / steps.max(1) as f64
    );
    let total: u64 = lag_tokens.values().sum();
    println!("staleness of trained tokens (policy versions behind the trainer):");
    for (lag, n) in &lag_tokens {
        println!("  {lag}: {:5.1}%", 100.0 * *n as f64 / total.max(1) as f64);
    }
    for ((env, buf), (ingest, tracker)) in ENVS
        .iter()
        .zip(&buffers)
        .zip(ingests.iter().zip(&mut trackers))
    {
        let m = tracker.snapshot(buf, Some(ingest));
        m.publish();
        let c = ingest.counters();
        println!(
            "{}: {} groups stored, {} left in the buffer, {} stale, {} filtered, reward mean {:.2}; archive: {dir}/{}/archive/",
            env.name, c.stored_groups, m.groups_in_buffer, m.stale, m.filtered, m.reward_mean, env.name
        );
        buf.flush().await?;
    }
    Ok(())
}
