//! Cancel safety: put, amend, get, complete and commit futures dropped at random points
//! (before their first poll, or after a random number of pending polls, i.e. while they wait
//! in the buffer) leave the buffer consistent and lose no acknowledged sample.

mod common;
use common::*;
use rollout_buffer::{Error, Patch, SequenceBuffer};
use std::collections::HashSet;
use std::future::{poll_fn, Future};
use std::pin::pin;
use std::sync::{Arc, Mutex};
use std::task::Poll;

/// A small deterministic generator (splitmix64), one per task.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// Polls `fut` at most `budget` times and drops it if it is still pending after that
/// (`budget` 0: dropped before its first poll). Returns its output, or `None` if dropped,
/// and whether it was dropped while waiting (after at least one pending poll).
async fn maybe_cancel<F: Future>(fut: F, budget: u64) -> (Option<F::Output>, bool) {
    if budget == 0 {
        drop(fut);
        return (None, false);
    }
    let mut fut = pin!(fut);
    let mut polls = 0;
    poll_fn(|cx| {
        polls += 1;
        match fut.as_mut().poll(cx) {
            Poll::Ready(v) => Poll::Ready((Some(v), false)),
            Poll::Pending if polls >= budget => Poll::Ready((None, true)),
            Poll::Pending => Poll::Pending,
        }
    })
    .await
}

#[derive(Default)]
struct Ledger {
    acknowledged: HashSet<String>,
    trained: Vec<String>,
    /// Puts and gets dropped while waiting in the buffer.
    cancelled_waits: usize,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropped_futures_leave_state_consistent_and_lose_nothing() {
    let buf = ppo(16, 1);
    let ledger = Arc::new(Mutex::new(Ledger::default()));
    let mut tasks = Vec::new();
    for p in 0..2u64 {
        let (buf, ledger) = (buf.clone(), Arc::clone(&ledger));
        tasks.push(tokio::spawn(async move {
            let mut rng = Rng(p + 1);
            for i in 0..300 {
                let samples = prompts(&format!("p{p}-{i}"), 1 + rng.below(3) as usize);
                let batch_ids: Vec<String> = samples.iter().map(|s| s.id().to_string()).collect();
                let put = buf.put_batch(samples);
                match maybe_cancel(put, rng.below(4)).await {
                    (Some(Ok(handles)), _) => {
                        ledger
                            .lock()
                            .expect("ledger")
                            .acknowledged
                            .extend(batch_ids);
                        // Amend something harmless, maybe dropped before it runs.
                        let patch = vec![Patch::new().meta("seen", true); handles.len()];
                        let _ = maybe_cancel(buf.amend_batch(&handles, patch), rng.below(2)).await;
                    }
                    (Some(Err(e)), _) => panic!("put failed: {e}"),
                    (None, waited) => {
                        ledger.lock().expect("ledger").cancelled_waits += usize::from(waited);
                    }
                }
                check(&buf);
            }
        }));
    }
    for (c, rpc) in ["gen", "reward", "train", "gen"].into_iter().enumerate() {
        let (buf, ledger) = (buf.clone(), Arc::clone(&ledger));
        tasks.push(tokio::spawn(async move {
            let mut rng = Rng(100 + c as u64);
            loop {
                let got = maybe_cancel(buf.get_batch_for_rpc(rpc), 1 + rng.below(3)).await;
                let batch = match got {
                    (Some(Ok(b)), _) => b,
                    (Some(Err(Error::Closed)), _) => return,
                    (Some(Err(e)), _) => panic!("{e}"),
                    (None, waited) => {
                        ledger.lock().expect("ledger").cancelled_waits += usize::from(waited);
                        continue;
                    }
                };
                check(&buf);
                match (rpc, rng.below(4)) {
                    (_, 0) => drop(batch), // redelivered
                    ("train", _) => {
                        let ids = ids(&batch);
                        // Dropped unpolled, the commit's batch is released and redelivered.
                        if let (Some(Ok(())), _) = maybe_cancel(batch.commit(), rng.below(4)).await
                        {
                            ledger.lock().expect("ledger").trained.extend(ids);
                        }
                    }
                    (_, _) => {
                        let key = if rpc == "gen" { "tokens" } else { "reward" };
                        let out = patches(&batch, key);
                        let _ = maybe_cancel(batch.complete(out), rng.below(4)).await;
                    }
                }
                check(&buf);
            }
        }));
    }
    // Wait for the producers, then for the pipeline to drain everything acknowledged.
    let consumers = tasks.split_off(2);
    for t in tasks {
        t.await.expect("producer");
    }
    wait_until(|| buf.is_empty()).await;
    buf.close();
    for t in consumers {
        t.await.expect("consumer");
    }
    assert_invariants(&buf);
    let st = buf.stats();
    assert_eq!(
        (st.putting, st.amending, st.live_leases, st.waiting_putters),
        (0, 0, 0, 0)
    );
    let ledger = ledger.lock().expect("ledger");
    let trained: HashSet<_> = ledger.trained.iter().cloned().collect();
    assert_eq!(
        trained.len(),
        ledger.trained.len(),
        "a sample was trained twice"
    );
    assert_eq!(
        trained, ledger.acknowledged,
        "acknowledged and trained samples differ"
    );
    assert!(
        ledger.cancelled_waits > 0,
        "no put or get was dropped while waiting"
    );
    assert!(
        ledger.acknowledged.len() > 100,
        "the run did little: {}",
        ledger.acknowledged.len()
    );
    assert_eq!(
        st.put as usize,
        ledger.acknowledged.len(),
        "a cancelled put stored something"
    );
}

fn check(buf: &SequenceBuffer) {
    assert_invariants(buf);
}
