//! Fuzz target: `rollout_buffer::persist::fuzzing::segment` on arbitrary bytes.
//!
//! Recovery catches panics of the Parquet decoder (`checkpoint.rs`), so this target lets a
//! caught panic unwind quietly instead of aborting (libFuzzer's hook would); a panic that
//! escapes still aborts, and is reported.
#![no_main]

use libfuzzer_sys::fuzz_target;
use std::sync::Once;

static QUIET: Once = Once::new();

fuzz_target!(|data: &[u8]| {
    QUIET.call_once(|| std::panic::set_hook(Box::new(|_| {})));
    rollout_buffer::persist::fuzzing::segment(data)
});
