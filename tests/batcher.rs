//! Trainer batches across environments: token shares within one group of their targets,
//! shortfalls, determinism, leases held until completion, rejected groups archived.

mod common;

use rollout_buffer::persist::{ArchiveWriter, PersistOptions, Store};
use rollout_buffer::rollout::{
    Advantage, Batcher, BatcherConfig, GroupBatch, GroupKey, GroupMode, Packer, Rejection,
    RolloutRecord, SealReason, SealedGroup, Shortfall, SlimeHooks, Source,
};
use rollout_buffer::ExitReason;
use rollout_buffer::{
    BufferConfig, Error, MetaValue, RpcDef, Sample, SequenceBuffer, DISCARD_REASON,
};
use std::sync::Arc;
use std::time::Duration;

/// A group of two rollouts of `item_tokens` tokens each (half prompt, half output), with
/// rewards `rewards`.
fn group(env: &str, n: usize, item_tokens: usize, rewards: [f64; 2]) -> Sample {
    group_of(
        env,
        n,
        &[(item_tokens, rewards[0]), (item_tokens, rewards[1])],
    )
}

/// A group of one rollout per `(tokens, reward)` of `rollouts` (half prompt, half output).
fn group_of(env: &str, n: usize, rollouts: &[(usize, f64)]) -> Sample {
    let records: Vec<RolloutRecord> = rollouts
        .iter()
        .enumerate()
        .map(|(k, &(item_tokens, reward))| {
            let mut r = RolloutRecord::new(env, format!("{env}-{n}"), 0, format!("{env}-{n}-{k}"));
            r.prompt_tokens = vec![1; item_tokens / 2];
            r.output_tokens = vec![2; item_tokens - item_tokens / 2];
            r.logprobs = vec![-0.5; item_tokens - item_tokens / 2];
            r.reward = Some(reward);
            r
        })
        .collect();
    let key = GroupKey::of(&records[0], GroupMode::Strict);
    SealedGroup::new(key, records, SealReason::Full)
        .to_sample()
        .expect("group sample")
}

fn trainer_rpc() -> RpcDef {
    rollout_buffer::rollout::trainer_rpc("train")
}

async fn env_buffer(env: &str, groups: usize, item_tokens: usize) -> SequenceBuffer {
    let buf = SequenceBuffer::new(groups.max(1), [trainer_rpc()]).expect("config");
    let samples: Vec<Sample> = (0..groups)
        .map(|n| group(env, n, item_tokens, [0.0, 1.0]))
        .collect();
    if !samples.is_empty() {
        buf.put_batch(samples).await.expect("put");
    }
    buf
}

fn config(rows: usize, seq_len: usize, shortfall: Shortfall) -> BatcherConfig {
    BatcherConfig {
        packer: Packer::new(seq_len, rows),
        hooks: Arc::new(SlimeHooks { group_size: 2 }),
        advantage: Advantage::Grpo {
            divide_by_std: true,
        },
        dynamic: None,
        wait: Duration::from_millis(20),
        shortfall,
    }
}

fn source(name: &str, buffer: &SequenceBuffer, fraction: f64) -> Source {
    Source {
        name: name.into(),
        buffer: buffer.clone(),
        rpc: "train".into(),
        fraction,
    }
}

/// The first batch of a batcher over `sources`.
async fn one_batch(sources: Vec<Source>, config: BatcherConfig) -> GroupBatch {
    Batcher::new(sources, config)
        .expect("batcher")
        .next_batch()
        .await
        .expect("batch")
}

fn tokens(batch: &GroupBatch, source: usize) -> usize {
    batch.tokens_by_source[source].1
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn token_shares_stay_within_one_group_of_their_targets() {
    // Groups of 100 tokens (a) and 300 tokens (b); 4 rows of 1,000 tokens per batch.
    // Fractions 0.25 and 0.5 leave a quarter over, shared 1 : 2: targets 1,333 and 2,667.
    let a = env_buffer("a", 1400, 50).await;
    let b = env_buffer("b", 950, 150).await;
    let batcher = Batcher::new(
        vec![source("a", &a, 0.25), source("b", &b, 0.5)],
        config(4, 1000, Shortfall::FillFromOthers),
    )
    .expect("batcher");
    for _ in 0..100 {
        let batch = batcher.next_batch().await.expect("batch");
        assert!(!batch.short);
        let (ta, tb) = (tokens(&batch, 0), tokens(&batch, 1));
        assert!((ta as f64 - 4000.0 / 3.0).abs() <= 100.0, "a took {ta}");
        assert!((tb as f64 - 8000.0 / 3.0).abs() <= 300.0, "b took {tb}");
        assert!(
            batch.batch.efficiency() > 0.9,
            "{}",
            batch.batch.efficiency()
        );
        batch.complete().await.expect("complete");
    }
    common::assert_invariants(&a);
    common::assert_invariants(&b);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_source_furthest_below_its_target_relative_to_it_goes_next() {
    // Targets of 20 tokens each in a batch of 40; a's groups hold 12 tokens, b's 6. By
    // share of target: a (12), b (6), b (12), then a at an equal share (24); b's next
    // group would pass 40 and goes back. Taking by tokens alone, or ignoring the budget,
    // would give b more than a.
    let a = env_buffer("a", 10, 6).await;
    let b = env_buffer("b", 10, 3).await;
    let batch = one_batch(
        vec![source("a", &a, 0.5), source("b", &b, 0.5)],
        config(4, 10, Shortfall::FillFromOthers),
    )
    .await;
    assert_eq!((tokens(&batch, 0), tokens(&batch, 1)), (24, 12));
    assert!(batch.rejected.is_empty(), "{:?}", batch.rejected);
    assert!(!batch.short);
    // Only what fits was taken: the group over the budget went back at once, not after
    // packing (when it would count in the batch's stats).
    assert_eq!(batch.stats.groups, 4);
    assert_eq!(b.stats().rpcs[0].redelivered, 1);
    drop(batch);
    assert_eq!(b.stats().rpcs[0].eligible, 10);
}

/// The share of every source is relative to its own target, the one compared with as well
/// as the one compared against. Groups of 4 (a) and 12 (b) tokens, targets of 20 each in
/// a batch of 40: a 4, b 12, a 8, 12, 16 (b is at 0.6), b 24 (a at 0.8), then a's next
/// group would pass 40. Comparing b's raw token count with a's share would give a 20 and
/// b 12.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shares_are_compared_both_ways_relative_to_their_targets() {
    let a = env_buffer("a", 10, 2).await;
    let b = env_buffer("b", 10, 6).await;
    let batch = one_batch(
        vec![source("a", &a, 0.5), source("b", &b, 0.5)],
        config(4, 10, Shortfall::FillFromOthers),
    )
    .await;
    assert_eq!((tokens(&batch, 0), tokens(&batch, 1)), (16, 24));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dry_sources_share_goes_to_the_others_in_proportion_to_theirs() {
    // Fractions 0.5, 0.25, 0.25 of 4,000 tokens; c is dry, so its 1,000 go 2 : 1 to a and
    // b: targets 2,667 and 1,333 (groups of 100 tokens).
    let a = env_buffer("a", 100, 50).await;
    let b = env_buffer("b", 100, 50).await;
    let c = env_buffer("c", 0, 50).await;
    let batch = one_batch(
        vec![
            source("a", &a, 0.5),
            source("b", &b, 0.25),
            source("c", &c, 0.25),
        ],
        config(4, 1000, Shortfall::FillFromOthers),
    )
    .await;
    let (ta, tb) = (tokens(&batch, 0), tokens(&batch, 1));
    assert!((ta as f64 - 8000.0 / 3.0).abs() <= 100.0, "a took {ta}");
    assert!((tb as f64 - 4000.0 / 3.0).abs() <= 100.0, "b took {tb}");
    assert_eq!(tokens(&batch, 2), 0);
    assert!(!batch.short);
}

/// What a source that runs dry leaves over is what it had not yet taken of its target,
/// not more: c (one group of 4 tokens, a third of 60) leaves 16, 8 each to a (groups of
/// 4) and b (groups of 6), whose targets become 28: a 28, b 24 (its next group would pass
/// the batch's 60), c 4. Handing out more than the unmet part would let a take 32, one
/// group more than the packer then fits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dry_source_hands_out_only_its_unmet_share() {
    let a = env_buffer("a", 20, 2).await;
    let b = env_buffer("b", 20, 3).await;
    let c = env_buffer("c", 1, 2).await;
    let batch = one_batch(
        vec![
            source("a", &a, 1.0),
            source("b", &b, 1.0),
            source("c", &c, 1.0),
        ],
        config(6, 10, Shortfall::FillFromOthers),
    )
    .await;
    let taken: Vec<usize> = (0..3).map(|s| tokens(&batch, s)).collect();
    assert_eq!(taken, [28, 24, 4]);
    // Nothing of a's was taken and then left over by the packer; b's group over the
    // budget went back.
    assert_eq!(a.stats().rpcs[0].redelivered, 0);
    assert_eq!(b.stats().rpcs[0].redelivered, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dry_source_is_filled_from_the_others_or_returned_short() {
    let a = env_buffer("a", 200, 50).await;
    let b = env_buffer("b", 0, 150).await;
    let sources = || vec![source("a", &a, 0.5), source("b", &b, 0.5)];
    let filled = one_batch(sources(), config(2, 1000, Shortfall::FillFromOthers)).await;
    assert_eq!((tokens(&filled, 0), tokens(&filled, 1)), (2000, 0));
    assert!(!filled.short);
    drop(filled); // gives every group back
    assert_eq!(a.stats().rpcs[0].eligible, 200);
    let short = one_batch(sources(), config(2, 1000, Shortfall::ReturnShort)).await;
    assert!(short.short);
    assert!(tokens(&short, 0) <= 1100, "a stopped near its own share");
}

/// A source with nothing eligible is waited for: a group that arrives while the batcher
/// waits goes into the batch, under a bounded wait and under `BlockForever`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_arriving_during_the_wait_is_taken() {
    for shortfall in [Shortfall::ReturnShort, Shortfall::BlockForever] {
        let b = env_buffer("b", 0, 100).await;
        let mut cfg = config(1, 100, shortfall);
        cfg.wait = Duration::from_secs(60);
        let batcher = Batcher::new(vec![source("b", &b, 1.0)], cfg).expect("batcher");
        let next = tokio::spawn(async move { batcher.next_batch().await });
        common::wait_until(|| b.stats().rpcs[0].waiting == 1).await;
        b.put_batch(vec![group("b", 0, 50, [0.0, 1.0])])
            .await
            .expect("put");
        let batch = tokio::time::timeout(Duration::from_secs(60), next)
            .await
            .expect("the batch came with the group")
            .expect("task")
            .expect("batch");
        assert!(
            !batch.short,
            "{shortfall:?}: the group that arrived filled it"
        );
        assert_eq!(tokens(&batch, 0), 100, "{shortfall:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_inputs_give_the_same_batch() {
    let mut batches = Vec::new();
    for _ in 0..2 {
        let a = env_buffer("a", 64, 40).await;
        let b = env_buffer("b", 64, 90).await;
        let batcher = Batcher::new(
            vec![source("a", &a, 0.5), source("b", &b, 0.5)],
            config(3, 512, Shortfall::FillFromOthers),
        )
        .expect("batcher");
        let batch = batcher.next_batch().await.expect("batch");
        batches.push(batch.batch.clone());
    }
    assert_eq!(batches[0], batches[1]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rejected_group_is_archived_with_its_reason_once_the_batch_completes() {
    let dir = common::TempDir::new("batcher-archive");
    let buf = SequenceBuffer::open_in(
        Store::open(dir.path()).expect("store"),
        BufferConfig::new(8).rpc(trainer_rpc()),
        PersistOptions::default(),
    )
    .await
    .expect("open");
    buf.put_batch(vec![
        group("a", 0, 20, [0.0, 1.0]),
        group("a", 1, 20, [1.0, 1.0]), // all rewards equal: invalid under slime's defaults
    ])
    .await
    .expect("put");
    let batcher = Batcher::new(
        vec![source("a", &buf, 1.0)],
        config(2, 64, Shortfall::FillFromOthers),
    )
    .expect("batcher");
    let batch = batcher.next_batch().await.expect("batch");
    assert_eq!(batch.rejected.len(), 1);
    assert_eq!(batch.batch.group_ids.len(), 1);
    // Nothing leaves the buffer before the batch is complete.
    assert_eq!(buf.len(), 2);
    batch.complete().await.expect("complete");
    assert_eq!((buf.len(), buf.stats().filtered), (0, 1));
    buf.flush().await.expect("flush");
    let rows = ArchiveWriter::new(Store::open(dir.path()).expect("store"))
        .read_all()
        .await
        .expect("read");
    let mut reasons: Vec<(ExitReason, Option<MetaValue>)> = rows
        .iter()
        .map(|r| (r.reason, r.sample.get_meta(DISCARD_REASON).cloned()))
        .collect();
    reasons.sort_by_key(|r| r.0.as_str());
    assert_eq!(
        reasons,
        vec![
            (ExitReason::Consumed, None),
            (ExitReason::Filtered, Some(MetaValue::Str("invalid".into()))),
        ]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreadable_group_is_discarded_once_and_the_batch_goes_on() {
    // Its reward was written as float32 (by a verifier's complete, say): no trainer can
    // read it as a group. Given back, it was leased first and failed every later call.
    let buf = SequenceBuffer::new(4, [trainer_rpc()]).expect("config");
    let bad = group("a", 0, 8, [0.0, 1.0]).with("reward", vec![0.0f32, 1.0]);
    let good = group("a", 1, 8, [0.0, 1.0]);
    let good_id = good.id().to_string();
    buf.put_batch(vec![bad, good]).await.expect("put");
    let batcher = Batcher::new(
        vec![source("a", &buf, 1.0)],
        // Room for both groups: whichever is leased first, both are.
        config(2, 16, Shortfall::ReturnShort),
    )
    .expect("batcher");
    for _ in 0..2 {
        let batch = batcher.next_batch().await.expect("the readable group");
        assert_eq!(
            batch.batch.group_ids,
            std::slice::from_ref(&good_id),
            "the unreadable one is gone"
        );
        drop(batch); // given back: served again, alone
    }
    let st = buf.stats();
    assert_eq!(
        (buf.len(), st.filtered),
        (1, 1),
        "discarded once, as filtered"
    );
    common::assert_invariants(&buf);
}

/// A batch with no group in it is never handed out as a step: with every source dry the
/// call waits on (a `Timeout` only when told to wait for nothing; under `ReturnShort`, the
/// empty batch flagged short), and a group too large for any batch is discarded as too
/// long instead of coming first again at every call.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_batch_never_holds_padding_alone() {
    let dry = env_buffer("a", 0, 50).await;
    let batcher = Batcher::new(
        vec![source("a", &dry, 1.0)],
        config(2, 1000, Shortfall::FillFromOthers),
    )
    .expect("batcher");
    // Fifty waits of 20 ms (the clock runs ahead while the test idles): no batch.
    let waited = tokio::time::timeout(Duration::from_secs(1), batcher.next_batch()).await;
    assert!(waited.is_err(), "an empty batch came: {waited:?}");
    dry.put_batch(vec![group("a", 0, 50, [0.0, 1.0])])
        .await
        .expect("put");
    let batch = batcher.next_batch().await.expect("the group came");
    assert_eq!((tokens(&batch, 0), batch.short), (100, false));
    drop(batch);
    let mut no_wait = config(2, 1000, Shortfall::FillFromOthers);
    no_wait.wait = Duration::ZERO;
    let empty = env_buffer("e", 0, 50).await;
    let err = Batcher::new(vec![source("e", &empty, 1.0)], no_wait)
        .expect("batcher")
        .next_batch()
        .await
        .expect_err("nothing to wait for");
    assert!(
        matches!(&err, Error::Timeout { op, .. } if op.starts_with("next_batch")),
        "{err:?}"
    );
    let short = one_batch(
        vec![source("e", &empty, 1.0)],
        config(2, 1000, Shortfall::ReturnShort),
    )
    .await;
    assert!(short.short && tokens(&short, 0) == 0);
    // A batch that holds no token would wait forever for a group that fits: refused.
    for (rows, seq_len) in [(0, 1000), (2, 0)] {
        let err = Batcher::new(
            vec![source("e", &empty, 1.0)],
            config(rows, seq_len, Shortfall::FillFromOthers),
        )
        .expect_err("no token fits");
        assert!(
            matches!(&err, Error::InvalidPacking { detail } if detail.contains("holds no token")),
            "{err:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_source_that_cannot_lease_one_group_per_call_is_refused_at_once() {
    // An RPC leasing two groups per call: its getter would wait for a second group with
    // one stored, where the batcher needs one. Refused when the batcher is made, as is an
    // RPC the buffer does not define.
    let two = RpcDef::new("train", 2).inputs(trainer_rpc().input_keys().to_vec());
    let pairs = SequenceBuffer::new(4, [two]).expect("config");
    pairs
        .put_batch(vec![group("e", 0, 10, [0.0, 1.0])])
        .await
        .expect("put");
    let cfg = || config(2, 1000, Shortfall::FillFromOthers);
    let err = Batcher::new(vec![source("e", &pairs, 1.0)], cfg()).expect_err("two per call");
    assert!(
        matches!(&err, Error::InvalidPacking { detail }
            if detail.contains("source `e`") && detail.contains("leases 2 groups")),
        "{err:?}"
    );
    // An RPC that does not read every group input: each group it leased would be
    // discarded as unreadable.
    let short = RpcDef::new("train", 1).inputs(["prompt_tokens", "output_tokens", "reward"]);
    let partial = SequenceBuffer::new(4, [short]).expect("config");
    partial
        .put_batch(vec![group("e", 0, 10, [0.0, 1.0])])
        .await
        .expect("put");
    let err = Batcher::new(vec![source("e", &partial, 1.0)], cfg()).expect_err("partial inputs");
    assert!(
        matches!(&err, Error::InvalidPacking { detail }
            if detail.contains("source `e`") && detail.contains("\"logprobs\"")
                && !detail.contains("\"reward\"")),
        "{err:?}"
    );
    assert_eq!(partial.stats().idle, 1, "nothing was discarded");
    let one = env_buffer("f", 1, 10).await;
    let mut unknown = source("f", &one, 1.0);
    unknown.rpc = "trian".into();
    let err = Batcher::new(vec![unknown], cfg()).expect_err("no such RPC");
    assert!(
        matches!(&err, Error::UnknownRpc { name } if name == "trian"),
        "{err:?}"
    );
    // The group stays where it was, for a batcher that can take it.
    assert_eq!(pairs.stats().idle, 1);
    let batch = one_batch(vec![source("f", &one, 1.0)], cfg()).await;
    assert!(tokens(&batch, 0) > 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_too_large_for_any_batch_is_discarded_and_the_rest_trained() {
    // One row of 1,000 tokens: a group of 2 x 600 never fits, one of 2 x 100 does.
    let b = SequenceBuffer::new(4, [trainer_rpc()]).expect("config");
    b.put_batch(vec![
        group("b", 0, 600, [0.0, 1.0]),
        group("b", 1, 100, [0.0, 1.0]),
    ])
    .await
    .expect("put");
    let batcher = Batcher::new(
        vec![source("b", &b, 1.0)],
        config(1, 1000, Shortfall::FillFromOthers),
    )
    .expect("batcher");
    let batch = batcher.next_batch().await.expect("batch");
    assert_eq!(tokens(&batch, 0), 200);
    let big = group("b", 0, 600, [0.0, 1.0]).id().to_string();
    assert_eq!(batch.rejected, [(big, Rejection::TooLong)]);
    batch.complete().await.expect("complete");
    let stats = b.stats();
    assert_eq!((b.len(), stats.filtered), (0, 1), "{stats:?}");
    // Alone, it is discarded too, and the call waits for a group that fits.
    b.put_batch(vec![group("b", 2, 600, [0.0, 1.0])])
        .await
        .expect("put");
    let next = tokio::spawn(async move { batcher.next_batch().await });
    common::wait_until(|| b.stats().filtered == 2).await;
    b.put_batch(vec![group("b", 3, 100, [1.0, 0.0])])
        .await
        .expect("put");
    let batch = tokio::time::timeout(Duration::from_secs(60), next)
        .await
        .expect("the group that fits came")
        .expect("task")
        .expect("batch");
    assert_eq!(tokens(&batch, 0), 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_no_empty_batch_can_place_is_discarded_beside_groups_that_pack() {
    // Two rows of 1,000 tokens. Three rollouts of 600 (1,800 tokens, within the 2,000 a
    // batch holds) leave the third no row even alone; three of 60 pack. Given back, the
    // large group would be leased again at every call, take its source's share of the
    // batch and be left over again.
    let b = SequenceBuffer::new(4, [trainer_rpc()]).expect("config");
    let rewards = [0.0, 1.0, 0.0];
    let sized = |n: usize, tokens: usize| {
        let rollouts: Vec<(usize, f64)> = rewards.iter().map(|&r| (tokens, r)).collect();
        group_of("b", n, &rollouts)
    };
    let large = sized(0, 600);
    let large_id = large.id().to_string();
    b.put_batch(vec![large, sized(1, 60)]).await.expect("put");
    let mut cfg = config(2, 1000, Shortfall::FillFromOthers);
    cfg.hooks = Arc::new(SlimeHooks { group_size: 3 });
    let batch = one_batch(vec![source("b", &b, 1.0)], cfg).await;
    assert_eq!(tokens(&batch, 0), 180);
    assert_eq!(batch.rejected, [(large_id, Rejection::TooLong)]);
    batch.complete().await.expect("complete");
    let stats = b.stats();
    assert_eq!((b.len(), stats.filtered), (0, 1), "{stats:?}");
}
