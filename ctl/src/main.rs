//! The Metropolis CLI. See `metroctl --help`.

fn main() -> std::process::ExitCode {
    metroctl::main()
}
