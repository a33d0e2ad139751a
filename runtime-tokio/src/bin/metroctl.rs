//! The Metropolis CLI. See `metroctl --help`.

fn main() -> std::process::ExitCode {
    metropolis_runtime_tokio::ctl::main()
}
