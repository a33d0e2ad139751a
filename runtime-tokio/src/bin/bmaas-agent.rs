//! The provisioning agent. See `bmaas-agent --help`.

fn main() -> std::process::ExitCode {
    metropolis_runtime_tokio::agent::main()
}
