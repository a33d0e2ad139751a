//! `metroctl machine …` and `metroctl install …`: the operator's view of
//! provisioned machines and their OS installation requests.

use std::path::PathBuf;

use clap::Subcommand;
use metropolis_core::hex;
use metropolis_proto::metropolis::node::core::curator::proto::private::{
    AddMachineRequest, GetMachineRequest, ListMachinesRequest, Machine, RemoveMachineRequest,
    SubmitInstallationRequestRequest, machine_management_client::MachineManagementClient,
};
use metropolis_proto::prelude::agent;
use metropolis_transport::grpc::Channel;
use prost::Message;

use super::exit::usage;
pub(super) use super::files::{check_new_file, write_private};
use super::machine_view::{self, AgentState};
use super::osimage::image_ref::{parse_image, resolve_image};
use super::output::{Format, emit, output_width, table_within};
use super::{CliError, status_error};

/// Said by each command here: it needs the owner over TLS.
const OWNER_OVER_TLS: &str = "Needs the owner over mutual TLS: --endpoints HOST:PORT (the \
    daemon's --listen address), with the owner credential <data-dir>/owner by default; the local \
    socket acts as this node and is refused.";

/// `metroctl machine …`
#[derive(Subcommand, Debug)]
pub enum MachineCommand {
    /// Register a machine and the Ed25519 key its agent presents.
    #[command(after_help = OWNER_OVER_TLS)]
    Add {
        /// The machine's ID (a UUID).
        id: String,
        /// The agent's public key, 64 hex characters.
        #[arg(
            long,
            conflicts_with = "generate_key",
            required_unless_present = "generate_key"
        )]
        agent_pubkey: Option<String>,
        /// Generate the agent's key here and write it (PKCS#8 PEM, mode
        /// 0600) to this file, for `bmaas-agent --key`, once the curator
        /// registered it (a failed call leaves no file). FILE must not
        /// exist yet.
        #[arg(long, value_name = "FILE")]
        generate_key: Option<PathBuf>,
    },
    /// List machines: last heartbeat age, the agent (ok, LOST, or never
    /// seen: it never sent a heartbeat), current generation, hardware
    /// summary and latest report. The report is cut to the width of the
    /// terminal (`COLUMNS` when set; output into a pipe or file is not
    /// cut, nor is `-o wide`): `machine show ID` has it whole.
    #[command(after_help = OWNER_OVER_TLS)]
    List {
        /// One JSON object per machine and line (times in RFC 3339).
        #[arg(long)]
        json: bool,
    },
    /// Show one machine with its full hardware report.
    #[command(after_help = OWNER_OVER_TLS)]
    Show {
        /// The machine's ID.
        id: String,
        /// One JSON object, the hardware report included.
        #[arg(long)]
        json: bool,
    },
    /// Remove a machine: its agent key, reports and installation request.
    /// Its agent's heartbeats are refused from then on.
    #[command(after_help = OWNER_OVER_TLS)]
    Rm {
        /// The machine's ID.
        id: String,
    },
}

/// `metroctl install …`
#[derive(Subcommand, Debug)]
pub enum InstallCommand {
    /// Submit an OS installation request (increments the generation).
    #[command(after_help = OWNER_OVER_TLS)]
    Request {
        /// The machine's ID.
        id: String,
        /// The OS image: http(s)://HOST[:PORT]/REPOSITORY@sha256:DIGEST,
        /// or http(s)://HOST[:PORT]/REPOSITORY:TAG, whose tag is looked up
        /// now (with --registry-auth and --registry-ca) and the request
        /// made by the digest it names; the digest is printed.
        #[arg(long)]
        image: String,
        /// With an image by digest: a tag the agent fetches instead of the
        /// digest (the digest still verifies).
        #[arg(long)]
        tag: Option<String>,
        /// For an image by tag: a Docker config.json with the login for
        /// the registry's host, as bmaas-agent --registry-auth reads.
        #[arg(long, value_name = "FILE")]
        registry_auth: Option<PathBuf>,
        /// For an image by tag: PEM CA certificates to trust besides the
        /// system's (repeatable), as bmaas-agent --registry-ca.
        #[arg(long, value_name = "FILE")]
        registry_ca: Vec<PathBuf>,
        /// The device to install to: a device name (sda, meaning
        /// /dev/sda) or a path under /dev/ without . or .. components
        /// (/dev/nvme0n1, /dev/disk/by-id/...). The curator refuses
        /// anything else.
        #[arg(long)]
        root_device: String,
        /// File holding a metropolis.proto.api.NodeParameters: in the
        /// protobuf JSON mapping (a file starting with {; bytes in
        /// base64, e.g. {"cluster_bootstrap": {"owner_public_key":
        /// "<base64>"}, "network_config": {...}}) or encoded.
        #[arg(long, value_name = "FILE")]
        node_parameters: Option<PathBuf>,
    },
    /// Show the current request and the reports of a machine.
    #[command(after_help = OWNER_OVER_TLS)]
    Status {
        /// The machine's ID.
        id: String,
        /// One JSON object: the request, its times and the reports.
        #[arg(long)]
        json: bool,
    },
}

fn hex_key(s: &str) -> Result<Vec<u8>, CliError> {
    let bad = || {
        format!("--agent-pubkey: {s:?} is not 64 hexadecimal characters (a 32-byte Ed25519 key)")
    };
    if s.len() != 64 || !s.is_ascii() {
        return Err(usage(bad()));
    }
    (0..32)
        .map(|i| u8::from_str_radix(&s[2 * i..2 * i + 2], 16).map_err(|_| usage(bad())))
        .collect()
}

/// Checks a `machine` command's values before connecting.
pub fn check_machine(command: &MachineCommand) -> Result<(), CliError> {
    match command {
        MachineCommand::Add {
            agent_pubkey: Some(hexkey),
            ..
        } => hex_key(hexkey).map(drop),
        MachineCommand::Add {
            generate_key: Some(path),
            ..
        } => check_new_file("--generate-key", path),
        _ => Ok(()),
    }
}

/// Checks an `install` command's values before connecting.
pub fn check_install(command: &InstallCommand) -> Result<(), CliError> {
    match command {
        InstallCommand::Request {
            image,
            tag,
            node_parameters,
            ..
        } => {
            parse_image(image, tag.clone())?;
            if let Some(path) = node_parameters {
                super::osimage::read_node_parameters(path)?;
            }
            Ok(())
        }
        InstallCommand::Status { .. } => Ok(()),
    }
}

fn age(now_ms: i64, then_ms: i64) -> String {
    if then_ms == 0 {
        return "never".into();
    }
    let s = (now_ms - then_ms).max(0) / 1000;
    match s {
        0..60 => format!("{s}s ago"),
        60..3600 => format!("{}m ago", s / 60),
        _ => format!("{}h ago", s / 3600),
    }
}

/// Where the current request stands, for an operator waiting on it: when
/// it was submitted and first handed to the agent, and whether the agent
/// is still heard from (an install in progress keeps heartbeating; one
/// that stopped does not).
fn request_progress(m: &Machine, reported: bool, now_ms: i64) -> String {
    let submitted = match m.request_submitted_unix_ms {
        0 => String::new(),
        t => format!("submitted {}, ", age(now_ms, t)),
    };
    let handed = match (m.request_handed_out_unix_ms, reported) {
        (0, _) => "not handed to the agent yet".to_string(),
        (t, true) => format!("handed to the agent {}", age(now_ms, t)),
        (t, false) => format!("handed to the agent {}, no report yet", age(now_ms, t)),
    };
    let agent = match AgentState::of(m) {
        AgentState::NeverSeen => "agent never seen (no heartbeat yet)".to_string(),
        AgentState::Lost => format!(
            "agent LOST (last heartbeat {})",
            age(now_ms, m.last_heartbeat_unix_ms)
        ),
        AgentState::Heartbeating => format!(
            "agent heartbeating (last {})",
            age(now_ms, m.last_heartbeat_unix_ms)
        ),
    };
    format!("{submitted}{handed}; {agent}")
}

fn hardware_summary(m: &Machine) -> String {
    let Some(report) = m.hardware_report.as_ref().and_then(|r| r.report.as_ref()) else {
        return "no hardware report".into();
    };
    let threads: i32 = report.cpu.iter().map(|c| c.hardware_threads).sum();
    let disks: i64 = report.block_device.iter().map(|d| d.capacity_bytes).sum();
    let model = format!("{} {}", report.manufacturer, report.product);
    let model = if model.trim().is_empty() {
        "unknown model"
    } else {
        model.trim()
    };
    format!(
        "{model}, {} threads, {:.1} GiB RAM, {} disks ({:.0} GB), {} NICs",
        threads,
        report.memory_installed_bytes as f64 / (1u64 << 30) as f64,
        report.block_device.len(),
        disks as f64 / 1e9,
        report.network_interface.len()
    )
}

fn latest_report(m: &Machine) -> String {
    match m.reports.last() {
        None => "-".into(),
        Some(r) if r.success => format!("gen {}: success", r.generation),
        Some(r) => format!("gen {}: error: {}", r.generation, r.error),
    }
}

/// [`latest_report`] on one line: control characters (an error's line
/// breaks) become spaces.
fn latest_report_line(m: &Machine) -> String {
    latest_report(m)
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect()
}

fn now_ms() -> i64 {
    let since = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    i64::try_from(since.as_millis()).unwrap_or(i64::MAX)
}

/// Runs a `machine` command.
pub async fn machine(
    channel: Channel,
    command: MachineCommand,
    format: Format,
) -> Result<(), CliError> {
    let mut client = MachineManagementClient::with_origin(channel, Channel::origin());
    match command {
        MachineCommand::Add {
            id,
            agent_pubkey,
            generate_key,
        } => {
            // The key file is written once the curator registered the key:
            // a refused call leaves nothing behind, and a retry works.
            let (key, to_write) = match (agent_pubkey, generate_key) {
                (Some(hexkey), _) => (hex_key(&hexkey)?, None),
                (None, Some(path)) => {
                    check_new_file("--generate-key", &path)?;
                    // PKCS#8 v1: OpenSSL and BoringSSL read it too.
                    let (key_pem, public) = metropolis_pki::generate_ed25519_key()?;
                    (public.to_vec(), Some((path, key_pem)))
                }
                (None, None) => {
                    return Err(usage("give --agent-pubkey HEX or --generate-key FILE"));
                }
            };
            client
                .add_machine(AddMachineRequest {
                    machine_id: id.clone(),
                    agent_public_key: key.clone().into(),
                })
                .await
                .map_err(status_error)?;
            if let Some((path, key_pem)) = to_write {
                write_private("--generate-key", &path, &key_pem).map_err(|e| {
                    format!(
                        "machine {id} was added, but its agent key was not saved: {e}; remove \
                         the machine (`metroctl machine rm {id}`) and add it again"
                    )
                })?;
                outln!("agent key written to {}", path.display());
            }
            outln!("machine {id} added (agent key {})", hex::encode(&key));
        }
        MachineCommand::List { json } => {
            let machines = client
                .list_machines(ListMachinesRequest {})
                .await
                .map_err(status_error)?
                .into_inner();
            let format = format.or_json(json);
            if format.structured() {
                for m in &machines.machines {
                    emit(&machine_view::machine_json(m, false), format);
                }
                return Ok(());
            }
            let now = now_ms();
            let wide = format == Format::Wide;
            let mut header = vec!["MACHINE", "HEARTBEAT", "AGENT", "GEN", "HARDWARE"];
            if wide {
                header.extend(["AGENT KEY", "LAST HEARTBEAT"]);
            }
            // Last, so that it is what a narrow terminal cuts.
            header.push("LATEST REPORT");
            let rows: Vec<Vec<String>> = machines
                .machines
                .iter()
                .map(|m| {
                    let mut row = vec![
                        m.machine_id.clone(),
                        age(now, m.last_heartbeat_unix_ms),
                        AgentState::of(m).word().to_string(),
                        m.current_generation.to_string(),
                        hardware_summary(m),
                    ];
                    if wide {
                        row.push(hex::encode(&m.agent_public_key));
                        row.push(
                            machine_view::unix_ms(m.last_heartbeat_unix_ms)
                                .unwrap_or_else(|| "-".into()),
                        );
                    }
                    row.push(latest_report_line(m));
                    row
                })
                .collect();
            let width = if wide { None } else { output_width() };
            for line in table_within(&header, &rows, width) {
                outln!("{line}");
            }
            outln!("{} machine(s)", machines.machines.len());
        }
        MachineCommand::Show { id, json } => {
            let m = client
                .get_machine(GetMachineRequest { machine_id: id })
                .await
                .map_err(status_error)?
                .into_inner();
            let format = format.or_json(json);
            if format.structured() {
                emit(&machine_view::machine_json(&m, true), format);
                return Ok(());
            }
            outln!("machine          {}", m.machine_id);
            outln!("agent key        {}", hex::encode(&m.agent_public_key));
            outln!(
                "last heartbeat   {}{}{}",
                age(now_ms(), m.last_heartbeat_unix_ms),
                machine_view::unix_ms(m.last_heartbeat_unix_ms)
                    .map(|t| format!(" ({t})"))
                    .unwrap_or_default(),
                match AgentState::of(&m) {
                    AgentState::NeverSeen => ": the agent never connected",
                    AgentState::Lost => ", LOST",
                    AgentState::Heartbeating => "",
                }
            );
            outln!("generation       {}", m.current_generation);
            outln!("latest report    {}", latest_report(&m));
            outln!("summary          {}", hardware_summary(&m));
            match &m.hardware_report {
                Some(r) => {
                    outln!("hardware report");
                    for line in machine_view::hardware_lines(r) {
                        outln!("{line}");
                    }
                }
                None => outln!("hardware report  none yet"),
            }
        }
        MachineCommand::Rm { id } => {
            client
                .remove_machine(RemoveMachineRequest {
                    machine_id: id.clone(),
                })
                .await
                .map_err(status_error)?;
            outln!("machine {id} removed");
        }
    }
    Ok(())
}

/// Runs an `install` command.
pub async fn install(
    channel: Channel,
    command: InstallCommand,
    format: Format,
) -> Result<(), CliError> {
    let mut client = MachineManagementClient::with_origin(channel, Channel::origin());
    match command {
        InstallCommand::Request {
            id,
            image,
            tag,
            root_device,
            node_parameters,
            registry_auth,
            registry_ca,
        } => {
            let os_image = parse_image(&image, tag)?;
            let node_parameters = match node_parameters {
                None => None,
                Some(path) => Some(super::osimage::read_node_parameters(&path)?),
            };
            // A tag is looked up before anything is submitted.
            let (os_image, resolved_tag) =
                resolve_image(os_image, registry_auth, registry_ca).await?;
            let reference = format!(
                "{}://{}/{}@{}",
                os_image.scheme, os_image.host, os_image.repository, os_image.digest
            );
            if let Some(tag) = &resolved_tag
                && !format.structured()
            {
                outln!(
                    "resolved {}:{tag} to {}",
                    os_image.repository,
                    os_image.digest
                );
            }
            let fetch_tag = (!os_image.tag.is_empty()).then(|| os_image.tag.clone());
            let digest = os_image.digest.clone();
            let request = agent::OsInstallationRequest {
                generation: 0,
                r#type: Some(agent::os_installation_request::Type::Metropolis(
                    agent::MetropolisInstallationRequest {
                        os_image: Some(os_image),
                        node_parameters,
                        root_device,
                    },
                )),
            };
            let response = client
                .submit_installation_request(SubmitInstallationRequestRequest {
                    machine_id: id.clone(),
                    request: request.encode_to_vec().into(),
                })
                .await
                .map_err(status_error)?
                .into_inner();
            if format.structured() {
                emit(
                    &serde_json::json!({
                        "machine_id": id,
                        "generation": response.generation,
                        "image": reference,
                        "digest": digest,
                        "resolved": resolved_tag.is_some(),
                        "tag": resolved_tag.or(fetch_tag),
                    }),
                    format,
                );
                return Ok(());
            }
            outln!(
                "installation request for {id} submitted: generation {}, image {reference}",
                response.generation
            );
        }
        InstallCommand::Status { id, json } => {
            let m = client
                .get_machine(GetMachineRequest { machine_id: id })
                .await
                .map_err(status_error)?
                .into_inner();
            let format = format.or_json(json);
            if format.structured() {
                let mut value = machine_view::machine_json(&m, false);
                let done = m
                    .reports
                    .iter()
                    .any(|r| r.generation == m.current_generation);
                value["state"] = match (m.current_generation, done) {
                    (0, _) => "none",
                    (_, true) => "reported",
                    (_, false) => "pending",
                }
                .into();
                emit(&value, format);
                return Ok(());
            }
            if m.current_generation == 0 {
                outln!("no installation request");
            } else {
                let request = agent::OsInstallationRequest::decode(m.current_request.as_ref()).ok();
                let target = request
                    .and_then(|r| r.r#type)
                    .map(|agent::os_installation_request::Type::Metropolis(r)| {
                        let image = r.os_image.unwrap_or_default();
                        format!(
                            "{}://{}/{}@{} -> {}",
                            image.scheme, image.host, image.repository, image.digest, r.root_device
                        )
                    })
                    .unwrap_or_else(|| "(undecodable request)".into());
                let done = m
                    .reports
                    .iter()
                    .any(|r| r.generation == m.current_generation);
                outln!(
                    "generation {}: {} [{}]",
                    m.current_generation,
                    target,
                    if done { "reported" } else { "pending" }
                );
                outln!("  {}", request_progress(&m, done, now_ms()));
            }
            if m.reports.is_empty() {
                outln!("no reports");
                return Ok(());
            }
            let now = now_ms();
            let rows: Vec<Vec<String>> = m
                .reports
                .iter()
                .map(|r| {
                    vec![
                        r.generation.to_string(),
                        age(now, r.received_unix_ms),
                        if r.success {
                            "success".to_string()
                        } else {
                            format!("error: {}", r.error)
                        },
                    ]
                })
                .collect();
            super::output::print_table(&["GEN", "RECEIVED", "RESULT"], &rows);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn agent_keys_are_64_hex_characters() {
        assert!(hex_key(&"ab".repeat(32)).is_ok());
        assert!(hex_key("zz").is_err());
    }
}
