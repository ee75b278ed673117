//! `rollout-buffer`: the buffer as an HTTP server speaking slime's rollout-buffer API, on a
//! durable store; `inspect`, a look into a stored run from a shell; and `repair`, which
//! salvages a run whose store will not open. The command line itself is the library's
//! [`rollout_buffer_server::run`]; this file adds the allocator.

/// The server moves many large request and answer bodies (a batch of 256 items of 4 KB is
/// 1 MB); with glibc's allocator each took fresh pages from the kernel (page faults were a
/// fifth of the server's time under load), mimalloc reuses them.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    std::process::ExitCode::from(rollout_buffer_server::run(std::env::args_os()))
}
