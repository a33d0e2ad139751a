//! How `metroctl machine show` and `install status` print a machine: for
//! people (aligned fields, the hardware report as a readable list) and as
//! JSON (serde; times in RFC 3339, keys and bytes in hex).

use metropolis_core::hex;
use metropolis_proto::metropolis::node::core::curator::proto::private::Machine;
use metropolis_proto::prelude::agent;
use prost::Message;
use serde_json::{Value, json};

use super::debug::rfc3339;

/// RFC 3339 of a time in milliseconds since the epoch; None for 0
/// (never), which JSON shows as null.
pub fn unix_ms(ms: i64) -> Option<String> {
    if ms == 0 {
        return None;
    }
    let ts = prost_types::Timestamp {
        seconds: ms.div_euclid(1000),
        nanos: (ms.rem_euclid(1000) * 1_000_000) as i32,
    };
    Some(rfc3339(&ts))
}

fn mac(bytes: &[u8]) -> String {
    let parts: Vec<String> = bytes.iter().map(|b| format!("{b:02x}")).collect();
    parts.join(":")
}

/// The hardware report as JSON.
pub fn hardware_json(report: &agent::AgentHardwareReport) -> Value {
    let Some(node) = &report.report else {
        return json!({ "warnings": report.warning });
    };
    json!({
        "manufacturer": node.manufacturer,
        "product": node.product,
        "serial_number": node.serial_number,
        "efi_support": node.efi_support().as_str_name(),
        "memory_installed_bytes": node.memory_installed_bytes,
        "memory_usable_ratio": node.memory_usable_ratio,
        "cpus": node.cpu.iter().map(|c| json!({
            "vendor": c.vendor,
            "model": c.model,
            "cores": c.cores,
            "hardware_threads": c.hardware_threads,
        })).collect::<Vec<_>>(),
        "block_devices": node.block_device.iter().map(|d| json!({
            "vendor": d.vendor,
            "model": d.device_model,
            "serial_number": d.serial_number,
            "capacity_bytes": d.capacity_bytes,
            "protocol": d.protocol().as_str_name(),
            "rotational": d.rotational,
            "critical_warning": d.critical_warning,
        })).collect::<Vec<_>>(),
        "network_interfaces": node.network_interface.iter().map(|n| json!({
            "mac": mac(&n.mac),
            "driver": n.driver,
            "link_up": n.link_up,
            "current_speed_bytes": n.current_speed_bytes,
        })).collect::<Vec<_>>(),
        "warnings": report.warning,
    })
}

/// The current installation request's image and device, if it decodes.
fn request_json(m: &Machine) -> Value {
    if m.current_generation == 0 {
        return Value::Null;
    }
    let decoded = agent::OsInstallationRequest::decode(m.current_request.as_ref()).ok();
    match decoded.and_then(|r| r.r#type) {
        Some(agent::os_installation_request::Type::Metropolis(r)) => {
            let image = r.os_image.unwrap_or_default();
            json!({
                "generation": m.current_generation,
                "image": format!(
                    "{}://{}/{}@{}",
                    image.scheme, image.host, image.repository, image.digest
                ),
                "tag": image.tag,
                "root_device": r.root_device,
                "submitted": unix_ms(m.request_submitted_unix_ms),
                "handed_out": unix_ms(m.request_handed_out_unix_ms),
            })
        }
        None => json!({ "generation": m.current_generation, "undecodable": true }),
    }
}

/// What is known of a machine's agent.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AgentState {
    /// It never sent a heartbeat (not started yet, or it cannot reach the
    /// curator): nothing was lost.
    NeverSeen,
    /// It sent heartbeats, but none for longer than the daemon's
    /// `--agent-lost-after`.
    Lost,
    /// It is heard from.
    Heartbeating,
}

impl AgentState {
    /// The state of `m`'s agent.
    pub fn of(m: &Machine) -> AgentState {
        if m.last_heartbeat_unix_ms == 0 {
            AgentState::NeverSeen
        } else if m.lost {
            AgentState::Lost
        } else {
            AgentState::Heartbeating
        }
    }

    /// For people: the AGENT column of `machine list`.
    pub fn word(self) -> &'static str {
        match self {
            AgentState::NeverSeen => "never seen",
            AgentState::Lost => "LOST",
            AgentState::Heartbeating => "ok",
        }
    }

    /// For programs: the `agent` field of the JSON.
    pub fn name(self) -> &'static str {
        match self {
            AgentState::NeverSeen => "never_seen",
            AgentState::Lost => "lost",
            AgentState::Heartbeating => "ok",
        }
    }
}

/// A machine as JSON: identity, liveness (`agent`: `never_seen`, `lost`
/// or `ok`; `lost` true for the first two, as the curator says), the
/// current request, reports and (with `hardware`) the full hardware
/// report.
pub fn machine_json(m: &Machine, hardware: bool) -> Value {
    let mut value = json!({
        "machine_id": m.machine_id,
        "agent_public_key": hex::encode(&m.agent_public_key),
        "last_heartbeat": unix_ms(m.last_heartbeat_unix_ms),
        "agent": AgentState::of(m).name(),
        "lost": m.lost,
        "current_generation": m.current_generation,
        "request": request_json(m),
        "reports": m.reports.iter().map(|r| json!({
            "generation": r.generation,
            "success": r.success,
            "error": if r.success { Value::Null } else { Value::String(r.error.clone()) },
            "received": unix_ms(r.received_unix_ms),
        })).collect::<Vec<_>>(),
    });
    if hardware {
        value["hardware_report"] = m
            .hardware_report
            .as_ref()
            .map_or(Value::Null, hardware_json);
    }
    value
}

fn gib(bytes: i64) -> String {
    format!("{:.1} GiB", bytes as f64 / (1u64 << 30) as f64)
}

/// The hardware report for people, one line per part, indented.
pub fn hardware_lines(report: &agent::AgentHardwareReport) -> Vec<String> {
    let mut lines = Vec::new();
    if let Some(node) = &report.report {
        lines.push(format!(
            "  system     {} {} (serial {}), EFI {}",
            node.manufacturer,
            node.product,
            if node.serial_number.is_empty() {
                "-"
            } else {
                &node.serial_number
            },
            node.efi_support()
                .as_str_name()
                .trim_start_matches("EFI_SUPPORT_")
                .to_lowercase()
        ));
        lines.push(format!(
            "  memory     {} installed, {:.0} % usable",
            gib(node.memory_installed_bytes),
            node.memory_usable_ratio * 100.0
        ));
        for c in &node.cpu {
            lines.push(format!(
                "  cpu        {} {}: {} cores, {} threads",
                c.vendor, c.model, c.cores, c.hardware_threads
            ));
        }
        for d in &node.block_device {
            lines.push(format!(
                "  disk       {} {} ({}), {:.0} GB, {}{}",
                d.vendor,
                d.device_model,
                d.protocol()
                    .as_str_name()
                    .trim_start_matches("PROTOCOL_")
                    .to_lowercase(),
                d.capacity_bytes as f64 / 1e9,
                if d.rotational {
                    "rotational"
                } else {
                    "solid state"
                },
                if d.critical_warning {
                    ", CRITICAL WARNING"
                } else {
                    ""
                }
            ));
        }
        for n in &node.network_interface {
            lines.push(format!(
                "  nic        {} ({}), link {}",
                mac(&n.mac),
                if n.driver.is_empty() { "-" } else { &n.driver },
                if n.link_up { "up" } else { "down" }
            ));
        }
    }
    for w in &report.warning {
        lines.push(format!("  warning    {w}"));
    }
    lines
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_and_hardware_render() {
        assert_eq!(unix_ms(0), None);
        assert_eq!(
            unix_ms(1_700_000_000_123).as_deref(),
            Some("2023-11-14T22:13:20.123000Z")
        );
        let report = agent::AgentHardwareReport {
            report: Some(metropolis_proto::prelude::hwreport::Node {
                manufacturer: "ACME".into(),
                product: "Box \"1\"".into(),
                memory_installed_bytes: 8 << 30,
                network_interface: vec![metropolis_proto::prelude::hwreport::NetworkInterface {
                    mac: vec![0, 0x1b, 0x2c, 0x3d, 0x4e, 0x5f].into(),
                    link_up: true,
                    ..Default::default()
                }],
                ..Default::default()
            }),
            warning: vec!["no SMBIOS".into()],
        };
        let value = hardware_json(&report);
        let text = serde_json::to_string(&value).unwrap_or_default();
        let back: Value = serde_json::from_str(&text).unwrap_or_default();
        assert_eq!(back["product"], "Box \"1\"");
        assert_eq!(back["network_interfaces"][0]["mac"], "00:1b:2c:3d:4e:5f");
        let lines = hardware_lines(&report).join("\n");
        assert!(lines.contains("8.0 GiB installed"), "{lines}");
        assert!(
            lines.contains("00:1b:2c:3d:4e:5f") && lines.contains("link up"),
            "{lines}"
        );
        assert!(lines.contains("warning    no SMBIOS"), "{lines}");
    }
}
