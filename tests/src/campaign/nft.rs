//! Cuts between processes as nftables rules, in a table of the campaign's
//! own (`inet metropolis_chaos`), deleted at the end (and by
//! [`super::cleanup`] however the program ends).
//!
//! Every process listens on an address of its own (etcd members on
//! 127.0.10.x, curators on 127.0.20.x), but the kernel gives every
//! connection on loopback the source 127.0.0.1, whoever opens it. So the
//! table tells the initiator of a connection by the group ID of its
//! socket: the campaign starts each process with a group of its own
//! (`meta skgid`), and the first packet of each connection marks the
//! connection (`ct mark`) with its initiator. A cut is then a rule on the
//! mark and the connection's original destination, one direction
//! (`ct direction original`: the initiator's packets; `reply`: the
//! answers) or both.

use std::fmt;

use super::cleanup;

/// Which packets of a cut connection are dropped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Direction {
    /// Both ways: a partition.
    Both,
    /// The initiator's packets: its requests never arrive.
    RequestsLost,
    /// The answering side's packets: requests arrive and are carried out,
    /// their answers never come back.
    AnswersLost,
}

impl fmt::Display for Direction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Direction::Both => "both ways",
            Direction::RequestsLost => "requests lost",
            Direction::AnswersLost => "answers lost",
        })
    }
}

/// The table's name (family `inet`).
pub const TABLE: &str = "metropolis_chaos";

/// An initiator of connections: its socket group and its mark.
#[derive(Clone, Copy, Debug)]
pub struct Initiator {
    /// The group ID its process runs with.
    pub gid: u32,
    /// The connection mark its connections get.
    pub mark: u32,
    /// Only its connections to this address or prefix are marked.
    pub only_to: Option<&'static str>,
}

/// The campaign's table: marking rules, and a chain of cuts.
pub struct Firewall {
    live: bool,
}

impl Firewall {
    /// Deletes a table left by an interrupted earlier run, if any; true if
    /// there was one.
    pub fn delete_stale() -> Result<bool, String> {
        match cleanup::quiet("nft", &["list", "table", "inet", TABLE]) {
            Ok(()) => {
                cleanup::quiet("nft", &["delete", "table", "inet", TABLE])?;
                Ok(true)
            }
            Err(_) => Ok(false),
        }
    }

    /// Creates the table, marking every new connection of each initiator.
    pub fn create(initiators: &[Initiator]) -> Result<Firewall, String> {
        let mut script = format!(
            "table inet {TABLE} {{\n  chain tagging {{\n    \
             type filter hook output priority -150; policy accept;\n"
        );
        for i in initiators {
            let to = i
                .only_to
                .map(|a| format!(" ip daddr {a}"))
                .unwrap_or_default();
            script.push_str(&format!(
                "    ct state new meta skgid {}{to} ct mark set {:#x}\n",
                i.gid, i.mark
            ));
        }
        script.push_str(
            "  }\n  chain cuts {\n    type filter hook output priority 0; policy accept;\n  }\n}\n",
        );
        cleanup::set_table(Some(TABLE));
        nft_script(&script).map_err(|e| format!("creating the nftables table: {e}"))?;
        Ok(Firewall { live: true })
    }

    /// Cuts the connections `from` opens to `to_addr` (an address or a
    /// prefix, e.g. `127.0.10.0/24`), in `direction`.
    pub fn cut(&self, from: Initiator, to_addr: &str, direction: Direction) -> Result<(), String> {
        let directions: &[&str] = match direction {
            Direction::Both => &["original", "reply"],
            Direction::RequestsLost => &["original"],
            Direction::AnswersLost => &["reply"],
        };
        let mut script = String::new();
        for d in directions {
            script.push_str(&format!(
                "add rule inet {TABLE} cuts ct mark {:#x} ct original ip daddr {to_addr} \
                 ct direction {d} drop\n",
                from.mark
            ));
        }
        nft_script(&script).map_err(|e| format!("adding a cut: {e}"))
    }

    /// Removes every cut.
    pub fn heal(&self) -> Result<(), String> {
        cleanup::quiet("nft", &["flush", "chain", "inet", TABLE, "cuts"])
    }

    /// Deletes the table.
    pub fn delete(mut self) -> Result<(), String> {
        self.live = false;
        cleanup::quiet("nft", &["delete", "table", "inet", TABLE])?;
        cleanup::set_table(None);
        Ok(())
    }
}

impl Drop for Firewall {
    fn drop(&mut self) {
        if self.live {
            let _ = cleanup::quiet("nft", &["delete", "table", "inet", TABLE]);
            cleanup::set_table(None);
        }
    }
}

/// Runs an nft script (`nft -f -`).
fn nft_script(script: &str) -> Result<(), String> {
    use std::io::Write;
    use std::process::{Command, Stdio};
    let mut child = Command::new("nft")
        .args(["-f", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot run nft: {e}"))?;
    if let Some(mut stdin) = child.stdin.take() {
        stdin
            .write_all(script.as_bytes())
            .map_err(|e| format!("writing to nft: {e}"))?;
    }
    let out = child
        .wait_with_output()
        .map_err(|e| format!("waiting for nft: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "nft refused the rules: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}
