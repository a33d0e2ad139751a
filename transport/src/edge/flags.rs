//! The daemon's flags for the limits at its edge, with their defaults.

use std::time::Duration;

use clap::Args;
use metropolis_service::RequestLimits;
use metropolis_service::admission::{DEFAULT_IN_FLIGHT_BYTES, DEFAULT_MAX_MESSAGE_BYTES};

use super::EdgeLimits;

/// Default of `--max-connections`.
pub const DEFAULT_MAX_CONNECTIONS: usize = 16384;
/// Default of `--max-concurrent-streams`.
pub const DEFAULT_MAX_CONCURRENT_STREAMS: u32 = 1024;
/// Default of `--handshake-timeout`.
pub const DEFAULT_HANDSHAKE_TIMEOUT_SECS: u64 = 10;
/// Default of `--idle-timeout`.
pub const DEFAULT_IDLE_TIMEOUT_SECS: u64 = 300;
/// Default of `--tcp-keepalive`.
pub const DEFAULT_TCP_KEEPALIVE_SECS: u64 = 60;
/// Default of `--keepalive-interval`: off (TCP keepalive finds dead peers
/// at no cost per call; HTTP/2 PINGs cost a few percent of the heartbeat
/// throughput, docs/edge.md).
pub const DEFAULT_KEEPALIVE_INTERVAL_SECS: u64 = 0;
/// Default of `--keepalive-timeout`.
pub const DEFAULT_KEEPALIVE_TIMEOUT_SECS: u64 = 20;

/// Limits on what peers can make each listener hold (curator TLS port,
/// local socket, AgentCallback port, debug port; each has its own).
#[derive(Args, Debug, Clone)]
#[command(next_help_heading = "Connection and request limits (per listener)")]
pub struct EdgeFlags {
    /// Connections open at once; at the limit the listener stops accepting
    /// until one closes (new ones wait in the kernel's backlog).
    #[arg(long, value_name = "N", default_value_t = DEFAULT_MAX_CONNECTIONS)]
    pub max_connections: usize,
    /// Calls (HTTP/2 streams) open at once on one connection; Watch streams
    /// count. More are refused by HTTP/2 flow control (REFUSED_STREAM).
    #[arg(long, value_name = "N", default_value_t = DEFAULT_MAX_CONCURRENT_STREAMS)]
    pub max_concurrent_streams: u32,
    /// Time a TLS handshake may take before the connection is closed.
    #[arg(long, value_name = "SECONDS", default_value_t = DEFAULT_HANDSHAKE_TIMEOUT_SECS)]
    pub handshake_timeout: u64,
    /// A connection with no open call for this long is closed with GOAWAY
    /// (also one that never sends the HTTP/2 preface). 0: never.
    #[arg(long, value_name = "SECONDS", default_value_t = DEFAULT_IDLE_TIMEOUT_SECS)]
    pub idle_timeout: u64,
    /// TCP keepalive: after this long without traffic on a connection the
    /// kernel probes the peer every 10 s and drops the connection after 3
    /// unanswered probes, so a peer that vanished (host down, network
    /// cut) stops holding its Watch streams. 0: off.
    #[arg(long, value_name = "SECONDS", default_value_t = DEFAULT_TCP_KEEPALIVE_SECS)]
    pub tcp_keepalive: u64,
    /// Interval of HTTP/2 keepalive PINGs on a connection that received
    /// nothing meanwhile: also finds a peer whose host still answers TCP
    /// but whose HTTP/2 stack does not, at a cost on every call (about
    /// 4 % of the heartbeat throughput, docs/edge.md). 0: off.
    #[arg(long, value_name = "SECONDS", default_value_t = DEFAULT_KEEPALIVE_INTERVAL_SECS)]
    pub keepalive_interval: u64,
    /// A keepalive PING not answered within this time closes the
    /// connection.
    #[arg(long, value_name = "SECONDS", default_value_t = DEFAULT_KEEPALIVE_TIMEOUT_SECS)]
    pub keepalive_timeout: u64,
    /// Largest request message, in bytes (suffixes K, M, G: KiB, MiB, GiB):
    /// `BYTES` for every method without a limit of its own (default 4M), or
    /// `/package.Service/Method=BYTES` for one method (repeatable).
    /// Defaults: AgentCallback/Heartbeat 1M, Curator/UpdateNodeStatus and
    /// Curator/Watch 64K. Larger messages get OutOfRange before any of
    /// them is buffered.
    #[arg(long = "max-request-bytes", value_name = "[METHOD=]BYTES", value_parser = parse_request_limit)]
    pub max_request_bytes: Vec<RequestLimit>,
    /// Request bytes a listener holds at once for messages still being
    /// received, summed over all its callers (suffixes K, M, G); a message
    /// that does not fit gets ResourceExhausted.
    #[arg(long, value_name = "BYTES", default_value = "64M", value_parser = parse_bytes)]
    pub max_request_bytes_in_flight: usize,
}

impl Default for EdgeFlags {
    fn default() -> Self {
        EdgeFlags {
            max_connections: DEFAULT_MAX_CONNECTIONS,
            max_concurrent_streams: DEFAULT_MAX_CONCURRENT_STREAMS,
            handshake_timeout: DEFAULT_HANDSHAKE_TIMEOUT_SECS,
            idle_timeout: DEFAULT_IDLE_TIMEOUT_SECS,
            tcp_keepalive: DEFAULT_TCP_KEEPALIVE_SECS,
            keepalive_interval: DEFAULT_KEEPALIVE_INTERVAL_SECS,
            keepalive_timeout: DEFAULT_KEEPALIVE_TIMEOUT_SECS,
            max_request_bytes: Vec::new(),
            max_request_bytes_in_flight: DEFAULT_IN_FLIGHT_BYTES,
        }
    }
}

/// One `--max-request-bytes` value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestLimit {
    /// The method (`/package.Service/Method`), or None for the default.
    pub method: Option<String>,
    /// The limit in bytes.
    pub bytes: usize,
}

fn parse_request_limit(s: &str) -> Result<RequestLimit, String> {
    match s.rsplit_once('=') {
        None => Ok(RequestLimit {
            method: None,
            bytes: parse_bytes(s)?,
        }),
        Some((method, bytes)) => {
            let parts: Vec<&str> = method.split('/').collect();
            if parts.len() != 3
                || !parts[0].is_empty()
                || parts[1].is_empty()
                || parts[2].is_empty()
            {
                return Err(format!(
                    "{}: the method must be written /package.Service/Method",
                    metropolis_core::quote::quoted(method)
                ));
            }
            Ok(RequestLimit {
                method: Some(method.to_owned()),
                bytes: parse_bytes(bytes)?,
            })
        }
    }
}

/// Bytes with an optional K, M or G suffix (powers of 1024).
pub fn parse_bytes(s: &str) -> Result<usize, String> {
    let (digits, unit) = match s.char_indices().find(|(_, c)| !c.is_ascii_digit()) {
        None => (s, 1usize),
        Some((i, _)) => {
            let unit = match &s[i..] {
                "K" | "k" | "KiB" => 1 << 10,
                "M" | "m" | "MiB" => 1 << 20,
                "G" | "g" | "GiB" => 1 << 30,
                other => {
                    return Err(format!(
                        "{}: unknown unit (use K, M or G)",
                        metropolis_core::quote::quoted(other)
                    ));
                }
            };
            (&s[..i], unit)
        }
    };
    let n: usize = digits.parse().map_err(|_| {
        format!(
            "{}: not a number of bytes",
            metropolis_core::quote::quoted(s)
        )
    })?;
    n.checked_mul(unit)
        .ok_or_else(|| format!("{}: too large", metropolis_core::quote::quoted(s)))
}

/// `s` seconds; None for 0 (off).
pub(crate) fn seconds(s: u64) -> Option<Duration> {
    (s > 0).then(|| Duration::from_secs(s))
}

impl EdgeFlags {
    /// The connection limits these flags give.
    pub fn limits(&self) -> EdgeLimits {
        EdgeLimits {
            max_connections: self.max_connections,
            max_concurrent_streams: self.max_concurrent_streams,
            handshake_timeout: Duration::from_secs(self.handshake_timeout.max(1)),
            idle_timeout: seconds(self.idle_timeout),
            tcp_keepalive: seconds(self.tcp_keepalive),
            keepalive_interval: seconds(self.keepalive_interval),
            keepalive_timeout: Duration::from_secs(self.keepalive_timeout.max(1)),
            ..EdgeLimits::default()
        }
    }

    /// Request limits for one listener (each call gives a budget of its
    /// own).
    pub fn request_limits(&self) -> RequestLimits {
        let mut limits = RequestLimits::default()
            .with_default_max(DEFAULT_MAX_MESSAGE_BYTES)
            .with_in_flight_bytes(self.max_request_bytes_in_flight);
        for limit in &self.max_request_bytes {
            limits = match &limit.method {
                None => limits.with_default_max(limit.bytes),
                Some(method) => limits.with_method_max(method.clone(), limit.bytes),
            };
        }
        limits
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn sizes_and_methods_parse() {
        assert_eq!(parse_bytes("123"), Ok(123));
        assert_eq!(parse_bytes("64K"), Ok(65536));
        assert_eq!(parse_bytes("2MiB"), Ok(2 << 20));
        assert!(parse_bytes("1T").unwrap_err().contains("unit"));
        assert!(parse_bytes("").is_err());
        let l = parse_request_limit("/cloud.bmaas.server.api.AgentCallback/Heartbeat=8K").unwrap();
        assert_eq!(l.bytes, 8192);
        assert!(
            parse_request_limit("Heartbeat=8K")
                .unwrap_err()
                .contains("/package")
        );
        assert_eq!(parse_request_limit("1M").unwrap().method, None);
    }

    #[test]
    fn flags_become_limits() {
        let flags = EdgeFlags {
            max_request_bytes: vec![
                parse_request_limit("1K").unwrap(),
                parse_request_limit("/a.B/C=10").unwrap(),
            ],
            idle_timeout: 0,
            ..EdgeFlags::default()
        };
        let limits = flags.request_limits();
        assert_eq!(limits.max_message("/a.B/C"), 10);
        assert_eq!(limits.max_message("/x.Y/Z"), 1024);
        assert_eq!(
            limits.max_message("/cloud.bmaas.server.api.AgentCallback/Heartbeat"),
            1024 * 1024
        );
        assert_eq!(flags.limits().idle_timeout, None);
    }
}
