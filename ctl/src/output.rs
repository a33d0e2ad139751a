//! Human-readable and JSON output of nodes and watch events.

use std::fmt::Write as _;

use metropolis_proto::prelude::curator;

/// A JSON string literal.
pub(super) fn json_str(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

fn roles(node: &curator::Node) -> Vec<&'static str> {
    let mut out = Vec::new();
    if let Some(r) = &node.roles {
        if r.consensus_member.is_some() {
            out.push("consensus_member");
        }
        if r.kubernetes_controller.is_some() {
            out.push("kubernetes_controller");
        }
        if r.kubernetes_worker.is_some() {
            out.push("kubernetes_worker");
        }
    }
    out
}

fn address(node: &curator::Node) -> &str {
    node.status
        .as_ref()
        .map(|s| s.external_address.as_str())
        .unwrap_or("")
}

/// A node as one JSON object.
pub fn node_json(node: &curator::Node) -> String {
    let roles: Vec<String> = roles(node).iter().map(|r| json_str(r)).collect();
    let status = match &node.status {
        None => "null".to_string(),
        Some(s) => {
            let ts = s
                .timestamp
                .as_ref()
                .map(|t| format!("{}.{:09}", t.seconds, t.nanos))
                .unwrap_or_else(|| "null".into());
            format!(
                "{{\"external_address\":{},\"timestamp\":{ts}}}",
                json_str(&s.external_address)
            )
        }
    };
    format!(
        "{{\"id\":{},\"roles\":[{}],\"status\":{status}}}",
        json_str(&node.id),
        roles.join(",")
    )
}

fn node_line(node: &curator::Node) -> String {
    let addr = address(node);
    let roles = roles(node).join(",");
    format!(
        "{}  address={}  roles={}",
        node.id,
        if addr.is_empty() { "-" } else { addr },
        if roles.is_empty() { "-" } else { &roles }
    )
}

/// Prints one watch event.
pub fn print_event(event: &curator::WatchEvent, json: bool) {
    let backlogged = event.progress == curator::watch_event::Progress::LastBacklogged as i32;
    if json {
        let nodes: Vec<String> = event.nodes.iter().map(node_json).collect();
        let tombstones: Vec<String> = event
            .node_tombstones
            .iter()
            .map(|t| json_str(&t.node_id))
            .collect();
        outln!(
            "{{\"nodes\":[{}],\"tombstones\":[{}],\"last_backlogged\":{backlogged}}}",
            nodes.join(","),
            tombstones.join(",")
        );
        return;
    }
    for n in &event.nodes {
        outln!("node      {}", node_line(n));
    }
    for t in &event.node_tombstones {
        outln!("removed   {}", t.node_id);
    }
    if backlogged {
        outln!("-- end of current state; following changes --");
    }
}

/// Prints a list of nodes.
pub fn print_nodes(nodes: &[curator::Node], json: bool) {
    for n in nodes {
        if json {
            outln!("{}", node_json(n));
        } else {
            outln!("{}", node_line(n));
        }
    }
    if !json {
        outln!("{} node(s)", nodes.len());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_escapes() {
        assert_eq!(json_str("a\"b\\c\n\u{1}"), "\"a\\\"b\\\\c\\n\\u0001\"");
    }
}
