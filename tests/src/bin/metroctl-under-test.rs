//! The CLI, built inside this package so that the end-to-end tests can run
//! it as a real process. Same code as the `metroctl` of
//! `metropolis-runtime-tokio`.

fn main() -> std::process::ExitCode {
    metroctl::main()
}
