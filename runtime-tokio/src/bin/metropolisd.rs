//! The Metropolis node daemon. See `metropolisd --help`.

/// mimalloc rather than glibc's malloc: see `metropolis_runtime_tokio::allocator`.
#[cfg(feature = "mimalloc")]
#[global_allocator]
static ALLOCATOR: metropolis_runtime_tokio::allocator::MiMalloc =
    metropolis_runtime_tokio::allocator::MiMalloc;

fn main() -> std::process::ExitCode {
    #[cfg(feature = "mimalloc")]
    metropolis_runtime_tokio::allocator::configure();
    metropolis_runtime_tokio::daemon::main()
}
