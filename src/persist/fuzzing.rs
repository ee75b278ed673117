//! Entry points for the fuzz targets in `fuzz/` (cargo feature `fuzzing`; not an API).
//!
//! Each takes bytes as they would come from storage and decodes them the way recovery and
//! loads do: a log group (then every record applied to a durable state), a manifest, a
//! checkpoint segment, a spill value, a whole spill segment file, one encoded sample or
//! record. Each must return (with an error or a value), never panic, hang or abort.
#![allow(missing_docs)]

use super::checkpoint::{decode_segment, Manifest};
use super::codec::{skip_sample, take_record, take_sample, Reader};
use super::log::decode_group;
use super::spill::{take_tensor_padded, ParquetSpill};
use super::state::DurableState;
use super::store::Store;
use crate::buffer::SpillStore;
use crate::sample::FieldKey;
use crate::sync::Arc;
use bytes::Bytes;

/// A log group file, then its records replayed (with the archive kept, so the freed-sample
/// bookkeeping runs too) and every sample decoded.
pub fn log_group(bytes: &[u8]) {
    let Ok(group) = decode_group(&Bytes::copy_from_slice(bytes)) else {
        return;
    };
    let mut state = DurableState::default();
    state.archiving = true;
    for record in &group.records {
        if state.apply(record).is_err() {
            return;
        }
    }
    let _ = state.decode_all();
    let _ = state.unarchived_samples();
}

/// One encoded sample, skipped then decoded, and one encoded log record.
pub fn codec(bytes: &[u8]) {
    let _ = skip_sample(&mut Reader::new(bytes));
    let _ = take_sample(&mut Reader::new(bytes));
    let _ = take_record(&mut Reader::new(bytes));
}

/// A manifest file.
pub fn manifest(bytes: &[u8]) {
    if let Ok(value) = serde_json::from_slice(bytes) {
        let _ = Manifest::from_json(&value);
    }
}

/// A checkpoint segment file, as recovery reads it (the Parquet decoder is not panic-free
/// on every malformed page, so recovery, and this, catch its panics).
pub fn segment(bytes: &[u8]) {
    let bytes = Bytes::copy_from_slice(bytes);
    let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| decode_segment(bytes)));
}

/// A spill value (the padded tensor encoding), on its own and as a view of its owner.
pub fn spill_value(bytes: &[u8]) {
    let _ = take_tensor_padded(bytes, None);
    let owner: crate::tensor::SharedBytes = Arc::new(Bytes::copy_from_slice(bytes));
    let _ = take_tensor_padded(bytes, Some((&owner, 0)));
}

/// A whole spill segment file of one row, read back for the keys `tokens` and
/// `logprobs` as a load would.
pub fn spill_segment(bytes: &[u8]) {
    let Ok(runtime) = tokio::runtime::Builder::new_current_thread().build() else {
        return;
    };
    runtime.block_on(async {
        let Ok(store) = Store::open("memory://") else {
            return;
        };
        let spill = ParquetSpill::new(store.clone());
        let segment = spill.segment(1, 1);
        if store
            .put(&segment.path, Bytes::copy_from_slice(bytes))
            .await
            .is_err()
        {
            return;
        }
        let keys = vec![FieldKey::from("tokens"), FieldKey::from("logprobs")];
        let _ = spill.read(segment, vec![0], keys).await;
    });
}
