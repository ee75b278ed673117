//! Admission control wired to a buffer: the AReaL cases, and the bound after a restart
//! (the policy version and the accepted count come back with the buffer).

mod common;

use common::TempDir;
use rollout_buffer::persist::PersistOptions;
use rollout_buffer::rollout::{Admission, AdmissionLimits};
use rollout_buffer::{RpcDef, Sample, SequenceBuffer, POLICY_VERSION};

fn rpcs() -> [RpcDef; 1] {
    [RpcDef::new("train", 4).inputs(["tokens"]).max_staleness(2)]
}

fn samples(n: usize, version: i64) -> Vec<Sample> {
    (0..n)
        .map(|i| {
            Sample::new(format!("v{version}-{i}"))
                .with("tokens", vec![1i32])
                .meta(POLICY_VERSION, version)
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_areal_cases_through_a_buffer() {
    let buf = SequenceBuffer::new(64, rpcs()).expect("config");
    let limits = |max_concurrent| AdmissionLimits {
        max_concurrent,
        batch_size: 4,
        max_staleness: 2,
    };
    let version = || buf.policy_version().unwrap_or(0);
    assert_eq!(
        Admission::for_buffer(&buf, limits(10)).capacity(version()),
        10
    );
    assert_eq!(
        Admission::for_buffer(&buf, limits(100)).capacity(version()),
        12
    );
    buf.set_policy_version(5).expect("version");
    assert_eq!(
        Admission::for_buffer(&buf, limits(100)).capacity(version()),
        32
    );
    // Without a concurrency limit, straight from the buffer.
    assert_eq!(buf.admission(4, 2), 32);
    buf.put_batch(samples(5, 5)).await.expect("put");
    assert_eq!(buf.admission(4, 2), 27);
    // Running rollouts count against the window too.
    let admission = Admission::for_buffer(&buf, limits(100));
    admission.enqueued(3);
    admission.submitted(3);
    assert_eq!(admission.capacity(5), 24);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_bound_holds_after_a_restart() {
    let dir = TempDir::new("admission-restart");
    let open = || SequenceBuffer::open(dir.path(), 64, rpcs(), PersistOptions::default());
    {
        let buf = open().await.expect("open");
        buf.set_policy_version(3).expect("version");
        buf.put_batch(samples(10, 3)).await.expect("put");
        buf.put_batch(samples(2, 0)).await.expect("put"); // 0 < 3 - 2: dropped as stale
        assert_eq!(buf.len(), 10);
        buf.flush().await.expect("flush");
    }
    let buf = open().await.expect("reopen");
    assert_eq!(buf.policy_version(), Some(3));
    // (2 + 3 + 1) * 4 - 12 samples stored over the buffer's life.
    assert_eq!(buf.admission(4, 2), 12);
    let limits = AdmissionLimits {
        max_concurrent: 100,
        batch_size: 4,
        max_staleness: 2,
    };
    assert_eq!(Admission::for_buffer(&buf, limits).capacity(3), 12);
    // The version still applies: a sample from the future is refused.
    assert!(buf.put_batch(samples(1, 4)).await.is_err());
    buf.flush().await.expect("flush");
}
