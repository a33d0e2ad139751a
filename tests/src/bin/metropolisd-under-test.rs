//! The daemon, built inside this package so that the end-to-end tests can
//! run it as a real process (`metropolisd-under-test`). Same code as the
//! `metropolisd` of `metropolis-runtime-tokio`, with the same allocator.

#[global_allocator]
static ALLOCATOR: metropolisd::allocator::MiMalloc = metropolisd::allocator::MiMalloc;

fn main() -> std::process::ExitCode {
    metropolisd::allocator::configure();
    metropolisd::main()
}
