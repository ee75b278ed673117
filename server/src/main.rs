//! `rollout-buffer`: the buffer as an HTTP server speaking slime's rollout-buffer API, on a
//! durable store; `inspect`, a look into a stored run from a shell; and `repair`, which
//! salvages a run whose store will not open. The command line itself is the library's
//! [`rollout_buffer_server::run`]; this file adds the allocator.

/// The server moves many large request and answer bodies (a batch of 256 items of 4 KB is
/// 1 MB); with glibc's allocator each took fresh pages from the kernel (page faults were a
/// fifth of the server's time under load), mimalloc reuses them.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// `mi_option_purge_delay` in mimalloc 3's `mi_option_t` (`mimalloc.h`), which the sys
/// crate does not name; the test below fails if it stops being that option.
const PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;
/// How long mimalloc keeps freed memory mapped before handing it back to the kernel, in
/// milliseconds. At its default (1 s) memory freed between two checkpoints, a few seconds
/// apart under load, was returned and faulted in again (zeroed) by the next one: some
/// 7,000 page faults a second under single writes, against 1,800 at 10 s, and about 5%
/// more items written a second. An idle server still returns its memory, 10 s later.
const PURGE_DELAY_MS: std::ffi::c_long = 10_000;

fn main() -> std::process::ExitCode {
    // SAFETY: sets one of mimalloc's options, which it reads afresh at each purge; any value
    // is valid for it.
    unsafe { libmimalloc_sys::mi_option_set(PURGE_DELAY, PURGE_DELAY_MS) };
    std::process::ExitCode::from(rollout_buffer_server::run(std::env::args_os()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_purge_delay_option_is_mimallocs_purge_delay() {
        // SAFETY: reading and setting mimalloc's options, as `main` does.
        unsafe {
            // Its default (1,000 ms) tells it from its neighbours (0 and 0).
            assert_eq!(libmimalloc_sys::mi_option_get(PURGE_DELAY), 1000);
            libmimalloc_sys::mi_option_set(PURGE_DELAY, PURGE_DELAY_MS);
            assert_eq!(libmimalloc_sys::mi_option_get(PURGE_DELAY), PURGE_DELAY_MS);
        }
    }
}
