//! One storage test suite, run against every backend: in memory, a local directory (as a
//! bare path and as a `file://` URL), and S3 through an S3-compatible server when
//! `ROLLOUT_BUFFER_S3_URL` names one (`.ci/run` starts one on loopback and sets it; under
//! `CI` its absence is a failure, not a skip).
#![cfg(feature = "persist")]

mod common;
use bytes::Bytes;
use common::{s3_url, TempDir};
use object_store::memory::InMemory;
use rollout_buffer::persist::Store;
use std::sync::Arc;

fn open(url: &str) -> Store {
    Store::open(url).unwrap_or_else(|e| panic!("open {url}: {e}"))
}

async fn conformance(store: &Store) {
    let b = |s: &str| Bytes::from(s.to_owned());
    assert_eq!(store.get("a/missing").await.expect("get"), None);
    store.put("a/one", b("1")).await.expect("put");
    store.put("a/b/two", b("2")).await.expect("put");
    store.put("c/three", b("3")).await.expect("put");
    assert_eq!(store.get("a/one").await.expect("get"), Some(b("1")));
    store.put("a/one", b("uno")).await.expect("replace");
    assert_eq!(store.get("a/one").await.expect("get"), Some(b("uno")));

    assert!(store
        .put_if_absent("m/manifest", b("first"))
        .await
        .expect("create"));
    assert!(!store
        .put_if_absent("m/manifest", b("second"))
        .await
        .expect("exists"));
    assert_eq!(
        store.get("m/manifest").await.expect("get"),
        Some(b("first"))
    );

    assert_eq!(store.list("a").await.expect("list"), ["a/b/two", "a/one"]);
    assert_eq!(store.list("").await.expect("list").len(), 4);

    store.delete("a/one").await.expect("delete");
    store
        .delete("a/one")
        .await
        .expect("deleting a missing object is fine");
    assert_eq!(store.get("a/one").await.expect("get"), None);
    assert_eq!(store.list("a").await.expect("list"), ["a/b/two"]);
}

#[tokio::test]
async fn memory_backend() {
    conformance(&open("memory://")).await;
}

#[tokio::test]
async fn local_directory_as_bare_path_and_file_url() {
    let dir = TempDir::new("store");
    conformance(&open(dir.path())).await;
    let dir = TempDir::new("store-url");
    conformance(&open(&format!("file://{}", dir.path()))).await;
    assert!(
        std::path::Path::new(dir.path()).join("c/three").is_file(),
        "files land on disk"
    );
}

#[tokio::test]
async fn prefixes_isolate_stores_on_one_backend() {
    let backend = Arc::new(InMemory::new());
    let a = Store::from_object_store(Arc::clone(&backend) as _, "run-a");
    let b = Store::from_object_store(backend, "run-b");
    a.put("x", Bytes::from_static(b"a")).await.expect("put");
    assert_eq!(b.get("x").await.expect("get"), None);
    assert_eq!(a.list("").await.expect("list"), ["x"]);
    conformance(&b).await;
}

#[tokio::test]
async fn s3_backend() {
    let Some(url) = s3_url("storage") else {
        return;
    };
    conformance(&open(&url)).await;
}

#[test]
fn bad_urls_are_typed_errors() {
    assert!(matches!(
        Store::open("ftp://x/y"),
        Err(rollout_buffer::Error::Storage { .. })
    ));
    assert!(matches!(
        Store::open("s3://"),
        Err(rollout_buffer::Error::Storage { .. })
    ));
}
