//! The Metropolis node daemon. See `metropolisd --help`.

fn main() -> std::process::ExitCode {
    metropolis_runtime_tokio::daemon::main()
}
