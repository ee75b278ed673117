//! Costs of the RL layer.
//!
//! * `lease64_release/<policy>/<eligible>`: leasing a batch of 64 from a pool of eligible
//!   samples and releasing it, per selection policy. `Fifo` takes from one end of the
//!   ready index; the randomised policies draw once per eligible sample (O(eligible)).
//! * `group8`: eight rollouts through `GroupIngest` (assembly, the sealed group's put)
//!   plus the trainer's get and commit of that group: the per-group cost of the GRPO path.
//! * `pack_64x8`: slime's hooks, GRPO advantages and first-fit-decreasing packing of 64
//!   groups of 8 rollouts (64-token prompts, 64-448-token answers) into 32 x 4,096.

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use rollout_buffer::rollout::{GroupConfig, GroupIngest, RolloutRecord};
use rollout_buffer::{RpcDef, Sample, Selection, SequenceBuffer};

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
}

fn selection(c: &mut Criterion) {
    let rt = runtime();
    let mut g = c.benchmark_group("lease64_release");
    let policies = [
        ("fifo", Selection::Fifo),
        ("uniform", Selection::Uniform { seed: 1 }),
        (
            "recency",
            Selection::Recency {
                alpha: 1.0,
                seed: 1,
            },
        ),
        (
            "prioritized",
            Selection::Prioritized {
                key: "priority".into(),
                exponent: 1.0,
                seed: 1,
            },
        ),
    ];
    for eligible in [1_024usize, 65_536] {
        for (name, policy) in &policies {
            let buf = SequenceBuffer::new(
                eligible,
                [RpcDef::new("train", 64)
                    .inputs(["x"])
                    .reads(u32::from(u16::MAX))
                    .selection(policy.clone())],
            )
            .expect("config");
            rt.block_on(async {
                for chunk in 0..eligible / 1024 {
                    let samples = (0..1024)
                        .map(|i| {
                            let n = chunk * 1024 + i;
                            Sample::new(n as u64)
                                .with("x", 0i32)
                                .with("priority", (n % 7 + 1) as f64)
                        })
                        .collect();
                    buf.put_batch(samples).await.expect("fill");
                }
            });
            g.bench_function(BenchmarkId::new(*name, eligible), |b| {
                b.iter(|| {
                    rt.block_on(async {
                        drop(buf.get_batch_for_rpc("train").await.expect("get"));
                    })
                })
            });
        }
    }
    g.finish();
}

fn groups(c: &mut Criterion) {
    let rt = runtime();
    let buf = SequenceBuffer::new(1024, [RpcDef::new("train", 1).inputs(["output_tokens"])])
        .expect("config");
    let ingest = rt
        .block_on(GroupIngest::start(buf.clone(), GroupConfig::new(8)))
        .expect("start");
    let mut example = 0u64;
    c.bench_function("group8", |b| {
        b.iter(|| {
            example += 1;
            rt.block_on(async {
                for k in 0..8 {
                    let mut r =
                        RolloutRecord::new("env", example.to_string(), 0, format!("{example}-{k}"));
                    r.prompt_tokens = vec![1; 128];
                    r.output_tokens = vec![2; 256];
                    r.logprobs = vec![-0.5; 256];
                    r.reward = Some(1.0);
                    ingest.add(r).await.expect("add");
                }
                buf.get_batch_for_rpc("train")
                    .await
                    .expect("get")
                    .commit()
                    .await
                    .expect("commit");
            })
        })
    });
}

fn packing(c: &mut Criterion) {
    use rollout_buffer::rollout::{
        process_groups, Advantage, Packer, SlimeHooks, TrainGroup, TrainItem,
    };
    let groups: Vec<TrainGroup> = (0..64)
        .map(|g| TrainGroup {
            id: format!("g{g}"),
            environment: "env".into(),
            policy_version: 0,
            items: (0..8)
                .map(|i| {
                    let len = 64 + (g * 37 + i * 53) % 384;
                    TrainItem {
                        rollout_uid: format!("g{g}-{i}"),
                        prompt_tokens: vec![1; 64],
                        output_tokens: vec![2; len],
                        logprobs: vec![-0.5; len],
                        ref_logprobs: None,
                        token_versions: vec![0; len],
                        raw_reward: (i % 2) as f64,
                        reward: (i % 2) as f64,
                        advantage: 0.0,
                        truncated: false,
                        copy_of: None,
                    }
                })
                .collect(),
        })
        .collect();
    let packer = Packer::new(4096, 32);
    let hooks = SlimeHooks { group_size: 8 };
    c.bench_function("pack_64x8", |b| {
        b.iter(|| {
            let processed = process_groups(
                &hooks,
                &Advantage::Grpo {
                    divide_by_std: true,
                },
                None,
                groups.clone(),
            );
            packer.pack(&processed.kept).expect("pack")
        })
    });
}

criterion_group!(benches, selection, groups, packing);
criterion_main!(benches);
