//! The provisioning agent. See `bmaas-agent --help`.

fn main() -> std::process::ExitCode {
    bmaas_agent::main()
}
