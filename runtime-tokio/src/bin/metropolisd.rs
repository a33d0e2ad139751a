//! The Metropolis node daemon. See `metropolisd --help`.

/// mimalloc rather than glibc's malloc: an `UpdateNodeStatus` makes about
/// 50 allocations, many freed on another thread than the one that made
/// them, and glibc's malloc was the largest cost the daemon had over the
/// echo server (README, Performance).
#[cfg(feature = "mimalloc")]
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    metropolis_runtime_tokio::daemon::main()
}
