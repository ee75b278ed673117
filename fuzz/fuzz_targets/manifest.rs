//! Fuzz target: `rollout_buffer::persist::fuzzing::manifest` on arbitrary bytes.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| rollout_buffer::persist::fuzzing::manifest(data));
