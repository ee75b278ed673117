//! Construction rejects graphs that could never be served.

use rollout_buffer::{BufferConfig, Error, RpcDef, SequenceBuffer};

fn build(capacity: usize, rpcs: Vec<RpcDef>, external: &[&str]) -> Result<SequenceBuffer, Error> {
    SequenceBuffer::with_config(
        BufferConfig::new(capacity)
            .rpcs(rpcs)
            .external_keys(external.iter().copied()),
    )
}

#[test]
fn rejects_invalid_definitions() {
    let e = build(4, vec![RpcDef::new("a", 1), RpcDef::new("a", 2)], &[]).err();
    assert_eq!(e, Some(Error::DuplicateRpc { name: "a".into() }));
    let e = build(4, vec![RpcDef::new("a", 0)], &[]).err();
    assert_eq!(
        e,
        Some(Error::InvalidNSeqs {
            rpc: "a".into(),
            n_seqs: 0,
            capacity: 4
        })
    );
    let e = build(4, vec![RpcDef::new("a", 5)], &[]).err();
    assert_eq!(
        e,
        Some(Error::InvalidNSeqs {
            rpc: "a".into(),
            n_seqs: 5,
            capacity: 4
        })
    );
    let cyclic = vec![
        RpcDef::new("gen", 1)
            .inputs(["prompt", "reward"])
            .outputs(["tokens"]),
        RpcDef::new("reward", 1)
            .inputs(["tokens"])
            .outputs(["reward"]),
    ];
    assert!(matches!(
        build(4, cyclic, &[]),
        Err(Error::CyclicGraph { .. })
    ));
    let two_producers = vec![
        RpcDef::new("a", 1).outputs(["k"]),
        RpcDef::new("b", 1).outputs(["k"]),
    ];
    assert_eq!(
        build(4, two_producers, &[]).err(),
        Some(Error::DuplicateProducer {
            key: "k".into(),
            first: "a".into(),
            second: "b".into()
        })
    );
    assert!(matches!(
        build(0, vec![RpcDef::new("a", 1)], &[]),
        Err(Error::InvalidCapacity { .. })
    ));
    assert_eq!(build(4, vec![], &[]).err(), Some(Error::NoRpcs));
}

#[tokio::test]
async fn external_keys_are_not_required_at_put() {
    let buf = build(
        4,
        vec![RpcDef::new("t", 1).inputs(["p", "score"])],
        &["score"],
    )
    .expect("valid");
    let s = rollout_buffer::Sample::new("x").with("p", 1i32);
    buf.put_batch(vec![s])
        .await
        .expect("score comes later by amend");
    let no_ext = build(4, vec![RpcDef::new("t", 1).inputs(["p", "score"])], &[]).expect("valid");
    let s = rollout_buffer::Sample::new("x").with("p", 1i32);
    assert!(matches!(
        no_ext.put_batch(vec![s]).await,
        Err(Error::MissingKey { .. })
    ));
}

#[test]
fn the_buffer_names_its_capacity_and_every_key_of_its_graph() {
    use rollout_buffer::{BufferConfig, RpcDef, Selection, SequenceBuffer};
    let buf = SequenceBuffer::with_config(
        BufferConfig::new(8)
            .rpc(RpcDef::new("gen", 1).inputs(["prompt"]).outputs(["tokens"]))
            .rpc(RpcDef::new("train", 1).inputs(["tokens", "score"]))
            .external_keys(["score"]),
    )
    .expect("valid");
    assert_eq!(buf.capacity(), 8);
    let mut keys: Vec<&str> = buf.keys().collect();
    keys.sort_unstable();
    assert_eq!(keys, ["prompt", "score", "tokens"]);
    // Priority keys are read by the selection, not as inputs: named too, each once.
    let by = |key: &str| Selection::Prioritized {
        key: key.into(),
        exponent: 1.0,
        seed: 0,
    };
    let buf = SequenceBuffer::new(
        8,
        [
            RpcDef::new("a", 1).inputs(["x"]).selection(by("p")),
            RpcDef::new("b", 1).inputs(["x"]).selection(by("p")),
            RpcDef::new("c", 1).inputs(["x"]).selection(by("x")),
        ],
    )
    .expect("valid");
    let mut keys: Vec<&str> = buf.keys().collect();
    keys.sort_unstable();
    assert_eq!(keys, ["p", "x"]);
}

#[cfg(feature = "persist")]
#[test]
fn a_durability_parses_from_its_name_and_a_bad_one_says_what_it_was() {
    use rollout_buffer::persist::Durability;
    use std::time::Duration;
    assert_eq!("sync".parse::<Durability>(), Ok(Durability::Sync));
    assert_eq!("none".parse::<Durability>(), Ok(Durability::None));
    assert_eq!(
        "interval:250".parse::<Durability>(),
        Ok(Durability::Interval(Duration::from_millis(250)))
    );
    for bad in [
        "often",
        "interval:",
        "interval:-1",
        "interval:1.5",
        "Sync",
        "",
    ] {
        match bad.parse::<Durability>() {
            Err(Error::InvalidConfig { detail }) => {
                assert!(detail.contains(&format!("`{bad}`")), "{detail}");
                assert!(detail.contains("interval:<ms>"), "{detail}");
            }
            other => panic!("{bad:?} gave {other:?}"),
        }
    }
}

/// Memory and swap of this machine, in bytes, and whether Linux refuses reservations past
/// them (overcommit mode 0 or 2); `None` where that cannot be read.
fn refuses_overcommit() -> Option<(u64, bool)> {
    let mode = std::fs::read_to_string("/proc/sys/vm/overcommit_memory").ok()?;
    let meminfo = std::fs::read_to_string("/proc/meminfo").ok()?;
    let kb = |name: &str| -> Option<u64> {
        let line = meminfo.lines().find(|l| l.starts_with(name))?;
        line.split_whitespace().nth(1)?.parse().ok()
    };
    let bytes = (kb("MemTotal:")? + kb("SwapTotal:")?) * 1024;
    Some((bytes, mode.trim() != "1"))
}

/// A capacity whose slot table the machine cannot hold is a configuration error, not an
/// abort of the process while the table is built (4 billion slots: 256 GiB of slot lines).
#[test]
fn a_capacity_past_the_machines_memory_is_an_error() {
    let Some((bytes, refuses)) = refuses_overcommit() else {
        return; // not Linux: the reservation's outcome is the platform's
    };
    assert!(
        refuses && bytes < (200 << 30),
        "this test needs a machine that refuses a 256 GiB reservation ({bytes} bytes, overcommit refused: {refuses})"
    );
    let err = build(u32::MAX as usize, vec![RpcDef::new("a", 1)], &[]).err();
    assert!(
        matches!(&err, Some(Error::InvalidConfig { detail }) if detail.contains("slot table")),
        "{err:?}"
    );
}
