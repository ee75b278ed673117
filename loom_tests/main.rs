//! loom models of the buffer's wake-up protocol and slot state machine, driven through the
//! public async API with 2-3 threads and 1-3 slots.
//!
//! Build with the crate's own cfg so that only this crate swaps in loom's primitives:
//!
//! ```text
//! RUSTFLAGS="--cfg rollout_buffer_loom -C debug-assertions" CARGO_TARGET_DIR=target/loom \
//! LOOM_MAX_PREEMPTIONS=2 cargo test --release --no-default-features --test loom
//! ```
//!
//! A lost wake-up shows up as a loom deadlock (every thread parked in `block_on`); a double
//! lease as a failed disjointness assertion; a broken transition as a failed
//! `check_invariants()`. In ordinary builds this file compiles to nothing.
#![cfg(rollout_buffer_loom)]

use loom::future::block_on;
use loom::thread;
use rollout_buffer::{BufferConfig, Error, Patch, RateLimit, RpcDef, Sample, SequenceBuffer};

fn sample(id: &str) -> Sample {
    Sample::new(id).with("x", 0i32)
}

fn one_rpc(capacity: usize) -> SequenceBuffer {
    SequenceBuffer::new(capacity, [RpcDef::new("r", 1).inputs(["x"])]).expect("valid")
}

fn check(buf: &SequenceBuffer) {
    if let Err(e) = buf.check_invariants() {
        panic!("{e}");
    }
}

/// A getter parked before the put must be woken by it.
#[test]
fn put_wakes_parked_getter() {
    loom::model(|| {
        let buf = one_rpc(2);
        let getter = {
            let buf = buf.clone();
            thread::spawn(move || {
                let b = block_on(buf.get_batch_for_rpc("r")).expect("get");
                check(&buf);
                block_on(b.commit()).expect("commit");
            })
        };
        block_on(buf.put_batch(vec![sample("a")])).expect("put");
        getter.join().expect("getter");
        check(&buf);
        assert!(buf.is_empty());
    });
}

/// Two getters of one RPC and one put of two: both return, with different samples.
#[test]
fn two_getters_get_disjoint_samples() {
    loom::model(|| {
        let buf = one_rpc(2);
        let getters: Vec<_> = (0..2)
            .map(|_| {
                let buf = buf.clone();
                thread::spawn(move || {
                    let b = block_on(buf.get_batch_for_rpc("r")).expect("get");
                    let id = b.ids().next().map(ToString::to_string).unwrap_or_default();
                    block_on(b.commit()).expect("commit");
                    id
                })
            })
            .collect();
        block_on(buf.put_batch(vec![sample("a"), sample("b")])).expect("put");
        let mut ids: Vec<String> = getters
            .into_iter()
            .map(|g| g.join().expect("getter"))
            .collect();
        ids.sort();
        assert_eq!(ids, ["a", "b"], "a sample was leased twice or lost");
        check(&buf);
        assert!(buf.is_empty());
    });
}

/// A completion makes the sample ready downstream and wakes that RPC's parked getter.
#[test]
fn complete_wakes_downstream_getter() {
    loom::model(|| {
        let buf = SequenceBuffer::new(
            1,
            [
                RpcDef::new("gen", 1).inputs(["x"]).outputs(["y"]),
                RpcDef::new("train", 1).inputs(["y"]),
            ],
        )
        .expect("valid");
        block_on(buf.put_batch(vec![sample("a")])).expect("put");
        let trainer = {
            let buf = buf.clone();
            thread::spawn(move || {
                let b = block_on(buf.get_batch_for_rpc("train")).expect("train");
                assert!(
                    b.sample(0).is_some_and(|s| s.get("y").is_some()),
                    "read seen without outputs"
                );
                block_on(b.commit()).expect("commit");
            })
        };
        let g = block_on(buf.get_batch_for_rpc("gen")).expect("gen");
        block_on(g.complete(vec![Patch::new().with("y", 1i32)])).expect("complete");
        trainer.join().expect("trainer");
        check(&buf);
        assert!(buf.is_empty());
    });
}

/// A dropped batch is redelivered to a getter of the same RPC that parked meanwhile.
#[test]
fn release_wakes_getter_of_same_rpc() {
    loom::model(|| {
        let buf = one_rpc(2);
        block_on(buf.put_batch(vec![sample("a")])).expect("put");
        let first = block_on(buf.get_batch_for_rpc("r")).expect("first");
        let second = {
            let buf = buf.clone();
            thread::spawn(move || {
                let b = block_on(buf.get_batch_for_rpc("r")).expect("redelivered");
                block_on(b.commit()).expect("commit");
            })
        };
        drop(first);
        second.join().expect("second");
        check(&buf);
        assert_eq!(buf.stats().redelivered, 1);
        assert!(buf.is_empty());
    });
}

/// A putter waiting for space is woken when a commit frees a slot.
#[test]
fn freed_slot_wakes_waiting_putter() {
    loom::model(|| {
        let buf = one_rpc(2);
        block_on(buf.put_batch(vec![sample("a"), sample("x")])).expect("fill");
        let putter = {
            let buf = buf.clone();
            thread::spawn(move || {
                block_on(buf.put_batch(vec![sample("b")])).expect("put after free");
            })
        };
        let b = block_on(buf.get_batch_for_rpc("r")).expect("get");
        block_on(b.commit()).expect("commit");
        putter.join().expect("putter");
        check(&buf);
        assert_eq!(buf.len(), 2);
    });
}

/// close() wakes a parked getter and a parked putter with `Closed`.
#[test]
fn close_wakes_everyone() {
    loom::model(|| {
        let buf = one_rpc(2);
        block_on(buf.put_batch(vec![sample("a"), sample("x")])).expect("fill");
        let held = [
            block_on(buf.get_batch_for_rpc("r")).expect("lease one"),
            block_on(buf.get_batch_for_rpc("r")).expect("lease the other"),
        ];
        let putter = {
            let buf = buf.clone();
            thread::spawn(move || block_on(buf.put_batch(vec![sample("b")])).map(|_| ()))
        };
        let getter = {
            let buf = buf.clone();
            thread::spawn(move || block_on(buf.get_batch_for_rpc("r")).map(|_| ()))
        };
        buf.close();
        assert_eq!(putter.join().expect("putter"), Err(Error::Closed));
        assert_eq!(getter.join().expect("getter"), Err(Error::Closed));
        drop(held);
        check(&buf);
        assert_eq!(buf.stats().redelivered, 2);
    });
}

/// Three threads race for one sample that one RPC reads three times; one of them first
/// releases a lease and then takes the sample again. Every lease is exclusive, the release
/// is redelivered, and the third read frees the slot.
#[test]
fn racing_leases_with_a_release() {
    loom::model(|| {
        let buf =
            SequenceBuffer::new(2, [RpcDef::new("r", 1).inputs(["x"]).reads(3)]).expect("valid");
        block_on(buf.put_batch(vec![sample("a")])).expect("put");
        let threads: Vec<_> = (0..3)
            .map(|i| {
                let buf = buf.clone();
                thread::spawn(move || {
                    if i == 0 {
                        let b = block_on(buf.get_batch_for_rpc("r")).expect("get");
                        drop(b);
                        check(&buf);
                    }
                    let b = block_on(buf.get_batch_for_rpc("r")).expect("get");
                    check(&buf);
                    block_on(b.commit()).expect("commit");
                })
            })
            .collect();
        for t in threads {
            t.join().expect("thread");
        }
        let st = buf.stats();
        assert_eq!((st.read, st.redelivered, st.freed), (3, 1, 1));
        check(&buf);
    });
}

/// Two putters wait for space while a consumer frees slots: both get in, none is lost.
#[test]
fn waiting_putters_both_get_in() {
    loom::model(|| {
        let buf = one_rpc(2);
        block_on(buf.put_batch(vec![sample("a"), sample("b")])).expect("fill");
        let putters: Vec<_> = ["c", "d"]
            .into_iter()
            .map(|id| {
                let buf = buf.clone();
                thread::spawn(move || {
                    block_on(buf.put_batch(vec![sample(id)])).expect("put");
                    check(&buf);
                })
            })
            .collect();
        for _ in 0..2 {
            let b = block_on(buf.get_batch_for_rpc("r")).expect("get");
            block_on(b.commit()).expect("commit");
        }
        for p in putters {
            p.join().expect("putter");
        }
        check(&buf);
        assert_eq!(buf.len(), 2);
        assert_eq!(buf.stats().waiting_putters, 0);
    });
}

/// An amend that completes a sample's inputs wakes the getter waiting for them, and the
/// getter never sees the sample half amended.
#[test]
fn amend_wakes_getter_with_whole_patch() {
    loom::model(|| {
        let buf = SequenceBuffer::with_config(
            rollout_buffer::BufferConfig::new(3)
                .rpc(RpcDef::new("train", 1).inputs(["x", "y", "z"]))
                .external_keys(["y", "z"]),
        )
        .expect("valid");
        let h = block_on(buf.put_batch(vec![sample("a")])).expect("put");
        let getter = {
            let buf = buf.clone();
            thread::spawn(move || {
                let b = block_on(buf.get_batch_for_rpc("train")).expect("get");
                let s = b.sample(0).expect("sample");
                assert!(
                    s.get("y").is_some() && s.get("z").is_some(),
                    "half amend seen"
                );
                block_on(b.commit()).expect("commit");
            })
        };
        let patch = Patch::new().with("y", 1i32).with("z", 2i32);
        block_on(buf.amend_batch(&h, vec![patch])).expect("amend");
        getter.join().expect("getter");
        check(&buf);
        assert!(buf.is_empty());
    });
}

/// One sample per insert, min size 1, error buffer 1: `diff` in [0, 2]; batches of 1.
fn rate_limited(capacity: usize) -> SequenceBuffer {
    let limit = RateLimit::new(1.0, 1, 1.0);
    let rpc = RpcDef::new("r", 1).inputs(["x"]).reads(3).rate_limit(limit);
    SequenceBuffer::new(capacity, [rpc]).expect("valid")
}

/// A getter held by the rate limiter (enough samples, too few inserts) is woken by a put,
/// even one that makes nothing new eligible for it.
#[test]
fn put_wakes_a_rate_limited_getter() {
    loom::model(|| {
        // `y` is external: a put without it raises the inserts but not the eligible count.
        let rpc = RpcDef::new("r", 1)
            .inputs(["x", "y"])
            .reads(3)
            .rate_limit(RateLimit::new(1.0, 1, 1.0));
        let buf = SequenceBuffer::with_config(BufferConfig::new(3).rpc(rpc).external_keys(["y"]))
            .expect("valid");
        block_on(buf.put_batch(vec![sample("a").with("y", 1i32)])).expect("put");
        // diff 1: one lease, then the limiter holds the next although `a` has reads left.
        drop(block_on(buf.get_batch_for_rpc("r")).expect("first"));
        let getter = {
            let buf = buf.clone();
            thread::spawn(move || {
                drop(block_on(buf.get_batch_for_rpc("r")).expect("after the put"));
            })
        };
        block_on(buf.put_batch(vec![sample("b")])).expect("put");
        getter.join().expect("getter");
        check(&buf);
    });
}

/// A putter held by the rate limiter (inserts too far ahead) is woken by a lease.
#[test]
fn lease_wakes_a_rate_limited_putter() {
    loom::model(|| {
        let buf = rate_limited(3);
        // Free up to min size, then diff 2 = max: the third put waits for a lease.
        block_on(buf.put_batch(vec![sample("a")])).expect("put a");
        block_on(buf.put_batch(vec![sample("b")])).expect("put b");
        let putter = {
            let buf = buf.clone();
            thread::spawn(move || {
                block_on(buf.put_batch(vec![sample("c")])).expect("after a lease");
            })
        };
        let b = block_on(buf.get_batch_for_rpc("r")).expect("get");
        putter.join().expect("putter");
        drop(b);
        check(&buf);
        assert_eq!(buf.len(), 3);
    });
}
