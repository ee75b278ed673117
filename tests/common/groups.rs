//! A small persistent store for the recovery and repair tests: four samples, each put in
//! its own log group.

use rollout_buffer::persist::{PersistOptions, RecoveryMode, Store};
use rollout_buffer::{BufferConfig, Error, RpcDef, Sample, SequenceBuffer};

fn config() -> BufferConfig {
    BufferConfig::new(16).rpc(RpcDef::new("train", 1).inputs(["tokens"]))
}

/// Opens (or recovers) the store's buffer, without an archive, recovering in `mode`.
pub async fn open(store: &Store, mode: RecoveryMode) -> Result<SequenceBuffer, Error> {
    let options = PersistOptions::new().recovery(mode).archive(None);
    SequenceBuffer::open_in(store.clone(), config(), options).await
}

/// A store holding `s0`..`s3`, each put in its own log group: `wal` lists them in order.
pub async fn four_groups() -> (Store, Vec<String>) {
    let store = Store::open("memory://").expect("memory store");
    let buf = open(&store, RecoveryMode::Strict).await.expect("opens");
    for i in 0..4 {
        buf.put_batch(vec![Sample::new(format!("s{i}")).with("tokens", vec![i])])
            .await
            .expect("put");
    }
    drop(buf);
    let wal = store.list("wal").await.expect("list");
    assert_eq!(wal.len(), 4, "{wal:?}");
    (store, wal)
}

/// [`four_groups`] folded into a checkpoint (opening it writes one): the store, its one
/// segment and its one manifest.
pub async fn checkpointed() -> (Store, String, String) {
    let (store, _) = four_groups().await;
    drop(
        open(&store, RecoveryMode::Strict)
            .await
            .expect("checkpoints"),
    );
    let segments = store.list("segments").await.expect("list");
    let manifests = store.list("manifest").await.expect("list");
    assert_eq!((segments.len(), manifests.len()), (1, 1));
    (store, segments[0].clone(), manifests[0].clone())
}

/// Rewrites the file at `path` with `f` applied to its bytes; returns the new bytes.
pub async fn rewrite(store: &Store, path: &str, f: impl FnOnce(&mut Vec<u8>)) -> Vec<u8> {
    let mut bytes = store
        .get(path)
        .await
        .expect("get")
        .expect("exists")
        .to_vec();
    f(&mut bytes);
    store.put(path, bytes.clone().into()).await.expect("put");
    bytes
}
