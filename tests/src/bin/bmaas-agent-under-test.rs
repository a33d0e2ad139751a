//! The provisioning agent, built inside this package so that the
//! end-to-end tests can run it as a real process. Same code as the
//! `bmaas-agent` of `metropolis-runtime-tokio`.

fn main() -> std::process::ExitCode {
    bmaas_agent::main()
}
