//! The daemon, built inside this package so that the end-to-end tests can
//! run it as a real process (`metropolisd-under-test`). Same code as the
//! `metropolisd` of `metropolis-runtime-tokio`, with the same allocator.

#[global_allocator]
static ALLOCATOR: metropolis_runtime_tokio::allocator::MiMalloc =
    metropolis_runtime_tokio::allocator::MiMalloc;

fn main() -> std::process::ExitCode {
    metropolis_runtime_tokio::allocator::configure();
    metropolis_runtime_tokio::daemon::main()
}
