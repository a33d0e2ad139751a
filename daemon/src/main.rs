//! The Metropolis node daemon. See `metropolisd --help`.

/// mimalloc rather than glibc's malloc: see `metropolisd::allocator`.
#[cfg(feature = "mimalloc")]
#[global_allocator]
static ALLOCATOR: metropolisd::allocator::MiMalloc = metropolisd::allocator::MiMalloc;

fn main() -> std::process::ExitCode {
    #[cfg(feature = "mimalloc")]
    metropolisd::allocator::configure();
    metropolisd::main()
}
