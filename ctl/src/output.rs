//! The output formats (`-o table|wide|json|yaml`) and the output of nodes
//! and watch events.

use metropolis_proto::prelude::curator;
use serde_json::{Value, json};

use super::debug::rfc3339;

/// How a command prints what it got (`-o`, `METROCTL_OUTPUT`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    /// Lines for people (the default).
    #[default]
    Table,
    /// Lines for people with more columns (node and machine lists).
    Wide,
    /// One JSON object per line (per item of a list, per event of a
    /// stream); times in RFC 3339.
    Json,
    /// One YAML document per item or event, each starting with `---`.
    Yaml,
}

impl Format {
    /// `self`, or JSON when a command's `--json` was given.
    pub fn or_json(self, json: bool) -> Format {
        if json { Format::Json } else { self }
    }

    /// Whether the output is data for programs (JSON or YAML).
    pub fn structured(self) -> bool {
        matches!(self, Format::Json | Format::Yaml)
    }
}

/// `value` as the text of a structured format: JSON on one line, or a
/// YAML document (for [`Format::Table`] and [`Format::Wide`], JSON).
pub fn render(value: &Value, format: Format) -> String {
    match format {
        Format::Yaml => match serde_yaml_ng::to_string(value) {
            Ok(yaml) => format!("---\n{}", yaml.trim_end()),
            // A JSON value always has a YAML form; JSON if not.
            Err(_) => value.to_string(),
        },
        _ => value.to_string(),
    }
}

/// The lines of a table for people: a header row, then one row per item,
/// each column padded to its widest cell and separated by two spaces (the
/// last column is not padded).
pub fn table(header: &[&str], rows: &[Vec<String>]) -> Vec<String> {
    layout(header, rows).0
}

/// The fewest characters of the last column [`table_within`] keeps.
const LAST_COLUMN_KEEPS: usize = 12;

/// The lines of [`table`], each cut to `width` characters (when given) by
/// shortening its last column, which ends in `…` then; the last column
/// keeps at least [`LAST_COLUMN_KEEPS`] characters, so on a very narrow
/// terminal a line may be longer.
pub fn table_within(header: &[&str], rows: &[Vec<String>], width: Option<usize>) -> Vec<String> {
    let (lines, last_start) = layout(header, rows);
    let Some(width) = width else {
        return lines;
    };
    let keep = width.max(last_start + LAST_COLUMN_KEEPS);
    lines
        .into_iter()
        .map(|line| {
            if line.chars().count() <= keep {
                return line;
            }
            let mut cut: String = line.chars().take(keep.saturating_sub(1)).collect();
            cut.push('…');
            cut
        })
        .collect()
}

/// The width tables for people are cut to (only where a command says
/// so, e.g. `machine list`): `COLUMNS` when it is set to a positive
/// number; else, when standard output is a terminal, its width (80 if it
/// cannot be read); else none: output into a pipe or a file is not cut.
pub fn output_width() -> Option<usize> {
    use std::io::IsTerminal as _;
    let columns = std::env::var("COLUMNS").ok();
    if let Some(n) = columns
        .and_then(|v| v.trim().parse::<usize>().ok())
        .filter(|n| *n > 0)
    {
        return Some(n);
    }
    if !std::io::stdout().is_terminal() {
        return None;
    }
    Some(terminal_width().unwrap_or(80))
}

/// The width of the terminal on standard output, if it tells.
fn terminal_width() -> Option<usize> {
    let mut size = libc::winsize {
        ws_row: 0,
        ws_col: 0,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    // SAFETY: TIOCGWINSZ on a descriptor only writes a `winsize` into the
    // struct given, which is valid and exclusively borrowed for the call.
    let rc = unsafe { libc::ioctl(libc::STDOUT_FILENO, libc::TIOCGWINSZ, &mut size) };
    (rc == 0 && size.ws_col > 0).then_some(usize::from(size.ws_col))
}

/// The lines of [`table`], and where its last column starts (in
/// characters).
fn layout(header: &[&str], rows: &[Vec<String>]) -> (Vec<String>, usize) {
    let mut widths: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (i, cell) in row.iter().enumerate() {
            if let Some(w) = widths.get_mut(i) {
                *w = (*w).max(cell.chars().count());
            }
        }
    }
    let line = |cells: Vec<&str>| {
        let last = cells.len().saturating_sub(1);
        let mut out = String::new();
        for (i, cell) in cells.into_iter().enumerate() {
            if i == last {
                out.push_str(cell);
            } else {
                let pad = widths[i].saturating_sub(cell.chars().count());
                out.push_str(cell);
                out.push_str(&" ".repeat(pad + 2));
            }
        }
        out
    };
    let mut lines = vec![line(header.to_vec())];
    lines.extend(
        rows.iter()
            .map(|r| line(r.iter().map(String::as_str).collect())),
    );
    let last = header.len().saturating_sub(1);
    let last_start = widths.iter().take(last).map(|w| w + 2).sum();
    (lines, last_start)
}

/// Prints the lines of [`table`].
pub fn print_table(header: &[&str], rows: &[Vec<String>]) {
    for line in table(header, rows) {
        outln!("{line}");
    }
}

/// Prints `value` in `format` ([`render`]).
pub fn emit(value: &Value, format: Format) {
    outln!("{}", render(value, format));
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

/// A node as one JSON object (its status time in RFC 3339; the port of
/// the curator it runs, and its version, null when it did not say).
pub fn node_json(node: &curator::Node) -> Value {
    json!({
        "id": node.id,
        "roles": roles(node),
        "status": node.status.as_ref().map(|s| json!({
            "external_address": s.external_address,
            "timestamp": s.timestamp.as_ref().map(rfc3339),
            "running_curator_port": s.running_curator.as_ref().map(|c| c.port),
            "version": version(node),
        })),
    })
}

/// The node's release, `vMAJOR.MINOR.PATCH`, if its status has one.
fn version(node: &curator::Node) -> Option<String> {
    let release = node.status.as_ref()?.version.as_ref()?.release.as_ref()?;
    Some(format!(
        "v{}.{}.{}",
        release.major, release.minor, release.patch
    ))
}

/// How long ago `then` was, in whole units as `kubectl` prints an AGE:
/// `45s`, `12m`, `5h`, `3d` (a time in the future counts as now).
pub fn age_since(then: &prost_types::Timestamp, now: std::time::SystemTime) -> String {
    let now = now
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
        .unwrap_or(0);
    let s = now.saturating_sub(then.seconds).max(0);
    match s {
        0..120 => format!("{s}s"),
        120..7200 => format!("{}m", s / 60),
        7200..172_800 => format!("{}h", s / 3600),
        _ => format!("{}d", s / 86_400),
    }
}

/// The AGE of a node: since its last status report, `-` if it made none.
fn node_age(node: &curator::Node, now: std::time::SystemTime) -> String {
    node.status
        .as_ref()
        .and_then(|s| s.timestamp.as_ref())
        .map_or_else(|| "-".into(), |t| age_since(t, now))
}

/// Prints one node (`node show`): a field per line for people, or one
/// document.
pub fn print_node(node: &curator::Node, format: Format) {
    if format.structured() {
        emit(&node_json(node), format);
        return;
    }
    let roles = roles(node).join(",");
    let addr = address(node);
    let status = node.status.as_ref();
    let reported = status.and_then(|s| s.timestamp.as_ref());
    outln!("node           {}", node.id);
    outln!(
        "roles          {}",
        if roles.is_empty() { "-" } else { &roles }
    );
    outln!(
        "address        {}",
        if addr.is_empty() { "-" } else { addr }
    );
    match reported {
        Some(t) => outln!(
            "last status    {} ago ({})",
            age_since(t, std::time::SystemTime::now()),
            rfc3339(t)
        ),
        None => outln!("last status    never reported"),
    }
    match status.and_then(|s| s.running_curator.as_ref()) {
        Some(c) => outln!("curator        runs one, port {}", c.port),
        None => outln!("curator        -"),
    }
    outln!(
        "version        {}",
        version(node).unwrap_or_else(|| "-".into())
    );
}

fn node_line(node: &curator::Node, format: Format) -> String {
    let addr = address(node);
    let roles = roles(node).join(",");
    let mut line = format!(
        "{}  address={}  roles={}",
        node.id,
        if addr.is_empty() { "-" } else { addr },
        if roles.is_empty() { "-" } else { &roles }
    );
    if format == Format::Wide {
        let updated = node.status.as_ref().and_then(|s| s.timestamp.as_ref());
        line.push_str(&format!(
            "  status-time={}",
            updated.map(rfc3339).unwrap_or_else(|| "-".into())
        ));
    }
    line
}

/// Prints one watch event.
pub fn print_event(event: &curator::WatchEvent, format: Format) {
    let backlogged = event.progress == curator::watch_event::Progress::LastBacklogged as i32;
    if format.structured() {
        let value = json!({
            "nodes": event.nodes.iter().map(node_json).collect::<Vec<_>>(),
            "tombstones": event.node_tombstones.iter().map(|t| &t.node_id).collect::<Vec<_>>(),
            "last_backlogged": backlogged,
        });
        emit(&value, format);
        return;
    }
    for n in &event.nodes {
        outln!("node      {}", node_line(n, format));
    }
    for t in &event.node_tombstones {
        outln!("removed   {}", t.node_id);
    }
    if backlogged {
        outln!("-- end of current state; following changes --");
    }
}

/// Prints a list of nodes: a table with a header row, AGE the time since
/// each node's last status report (`-o wide`: with that report's time),
/// or one document per node.
pub fn print_nodes(nodes: &[curator::Node], format: Format) {
    if format.structured() {
        for n in nodes {
            emit(&node_json(n), format);
        }
        return;
    }
    let wide = format == Format::Wide;
    let now = std::time::SystemTime::now();
    let mut header = vec!["ID", "ADDRESS", "ROLES", "AGE"];
    if wide {
        header.push("STATUS TIME");
    }
    let rows: Vec<Vec<String>> = nodes
        .iter()
        .map(|n| {
            let addr = address(n);
            let roles = roles(n).join(",");
            let mut row = vec![
                n.id.clone(),
                if addr.is_empty() {
                    "-".into()
                } else {
                    addr.into()
                },
                if roles.is_empty() { "-".into() } else { roles },
                node_age(n, now),
            ];
            if wide {
                let updated = n.status.as_ref().and_then(|s| s.timestamp.as_ref());
                row.push(updated.map(rfc3339).unwrap_or_else(|| "-".into()));
            }
            row
        })
        .collect();
    print_table(&header, &rows);
    outln!("{} node(s)", nodes.len());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_table_has_a_header_and_aligned_columns() {
        let rows = vec![
            vec!["a".to_string(), "long cell".to_string(), "x".to_string()],
            vec!["bbb".to_string(), "c".to_string(), "y".to_string()],
        ];
        let lines = table(&["ID", "WHAT", "LAST"], &rows);
        assert_eq!(lines[0], "ID   WHAT       LAST");
        assert_eq!(lines[1], "a    long cell  x");
        assert_eq!(lines[2], "bbb  c          y");
    }

    #[test]
    fn a_table_is_cut_in_its_last_column() {
        let rows = vec![
            vec!["a".to_string(), "short".to_string()],
            vec!["bbb".to_string(), "a long report that goes on".to_string()],
        ];
        let lines = table_within(&["ID", "REPORT"], &rows, Some(20));
        assert_eq!(lines[1], "a    short");
        assert_eq!(lines[2], "bbb  a long report …");
        assert!(lines.iter().all(|l| l.chars().count() <= 20), "{lines:?}");
        // The last column keeps its first characters on a narrow terminal.
        let lines = table_within(&["ID", "REPORT"], &rows, Some(3));
        assert_eq!(lines[2], "bbb  a long repo…");
        // No width: nothing cut.
        assert_eq!(
            table_within(&["ID", "REPORT"], &rows, None),
            table(&["ID", "REPORT"], &rows)
        );
    }

    #[test]
    fn ages_are_whole_units() {
        let at = |seconds| prost_types::Timestamp { seconds, nanos: 0 };
        let now = std::time::UNIX_EPOCH + std::time::Duration::from_secs(1_000_000);
        assert_eq!(age_since(&at(1_000_000 - 45), now), "45s");
        assert_eq!(age_since(&at(1_000_000 - 600), now), "10m");
        assert_eq!(age_since(&at(1_000_000 - 3 * 3600), now), "3h");
        assert_eq!(age_since(&at(1_000_000 - 4 * 86_400), now), "4d");
        assert_eq!(age_since(&at(2_000_000), now), "0s");
    }

    #[test]
    fn a_node_is_json_with_an_rfc3339_time() {
        let node = curator::Node {
            id: "metropolis-\"x\"\n".into(),
            status: Some(metropolis_proto::prelude::common::NodeStatus {
                external_address: "10.0.0.1".into(),
                timestamp: Some(prost_types::Timestamp {
                    seconds: 86_400,
                    nanos: 5_000,
                }),
                ..Default::default()
            }),
            ..Default::default()
        };
        let back: Value = serde_json::from_str(&node_json(&node).to_string()).unwrap_or_default();
        assert_eq!(back["id"], "metropolis-\"x\"\n");
        assert_eq!(back["status"]["timestamp"], "1970-01-02T00:00:00.000005Z");
        assert_eq!(back["roles"], json!([]));
    }
}
