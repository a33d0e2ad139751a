//! `metroctl watch nodes|node ID`: a node view that rides through curator
//! failover and outages, printed as watch events.

use std::time::{Duration, Instant};

use clap::Subcommand;
use futures::StreamExt;
use metropolis_core::identity::NodeId;
use metropolis_proto::prelude::curator;
use metropolis_runtime_tokio::rt::TokioRuntime;

use super::exit::{self, Exit, failed, usage};
use super::output::{self, Format};
use super::{CliError, ConnectionArgs, credential, none_answered, socket_path, status_error};

/// `metroctl watch …`
#[derive(Subcommand, Debug)]
pub enum WatchCommand {
    /// Every node: first the current state, then every change.
    Nodes {
        /// One JSON object per event and line.
        #[arg(long)]
        json: bool,
    },
    /// One node: its states, then a tombstone when it is deleted.
    Node {
        /// The node ID (metropolis-<32 hex>).
        id: String,
        /// One JSON object per event and line.
        #[arg(long)]
        json: bool,
    },
}

/// `metroctl watch`: a node view over every endpoint (or the local
/// socket), riding through curator failover: the current state as one
/// batch, then each change; after a reconnect, the changes of the time
/// away as one batch. Until the first complete state it fails as a
/// connection would (exit 3 once each endpoint failed, or after
/// --timeout); after that it reconnects for as long as it runs, saying
/// so on standard error once as an outage begins and once as it ends
/// (with the number of failed attempts), not once per attempt. Only a
/// refusal (a credential not allowed to watch) ends it.
pub async fn watch(
    args: &ConnectionArgs,
    command: WatchCommand,
    format: Format,
    limit: Duration,
) -> Result<(), CliError> {
    use metropolis_client::{Client, ClientConfig, NodeEvent, ViewError};
    let (only, json) = match command {
        WatchCommand::Nodes { json } => (None, json),
        WatchCommand::Node { id, json } => {
            let id = NodeId::parse(&id).map_err(|e| usage(format!("ID: {e}")))?;
            (Some(id), json)
        }
    };
    let format = format.or_json(json);
    let (endpoints, tls) = if args.endpoints.is_empty() {
        let socket = socket_path(args);
        (vec![format!("unix:{}", socket.display())], None)
    } else {
        (args.endpoints.clone(), Some(credential(args)?.0))
    };
    let tried = endpoints.len();
    let mut config = ClientConfig::new(endpoints, tls);
    config.call_timeout = limit.min(Duration::from_secs(10));
    let client = Client::new(TokioRuntime::shared(), config).map_err(|e| usage(e.to_string()))?;
    let mut view = match &only {
        Some(id) => client.watch_node(id.clone()),
        None => client.watch_nodes(),
    };
    let refused = |e: ViewError| match e {
        ViewError::Rejected {
            endpoint,
            code,
            message,
            ..
        } => status_error(tonic::Status::new(code, format!("{message} ({endpoint})"))),
        other => failed(Exit::Failure, other.to_string()),
    };
    let started = Instant::now();
    let mut problems: Vec<(Exit, String)> = Vec::new();
    let mut synced = false;
    // The reconnect under way, once synced: when it began and how many
    // attempts failed. Said on standard error once as it begins and once
    // as it ends, however many attempts it takes.
    let mut away: Option<(Instant, u32)> = None;
    // What is handed out until the view is (re)synced, printed as one event.
    let mut batch: Option<curator::WatchEvent> = Some(curator::WatchEvent::default());
    loop {
        let next = if synced {
            view.next().await
        } else {
            let left = limit.saturating_sub(started.elapsed());
            match tokio::time::timeout(left, view.next()).await {
                Ok(next) => next,
                Err(_) => {
                    let why = format!("no curator answered within {limit:?} (--timeout)");
                    let list: Vec<String> = problems.into_iter().map(|(_, why)| why).collect();
                    return Err(failed(Exit::Unavailable, with_problems(why, &list)));
                }
            }
        };
        let event = match next {
            Some(Ok(event)) => event,
            Some(Err(e)) => return Err(refused(e)),
            None => return Ok(()),
        };
        match event {
            NodeEvent::Changed(node) => match batch.as_mut() {
                Some(batch) => batch.nodes.push(node),
                None => output::print_event(
                    &curator::WatchEvent {
                        nodes: vec![node],
                        ..Default::default()
                    },
                    format,
                ),
            },
            NodeEvent::Removed(id) => {
                let tombstone = curator::watch_event::NodeTombstone { node_id: id };
                match batch.as_mut() {
                    Some(batch) => batch.node_tombstones.push(tombstone),
                    None => output::print_event(
                        &curator::WatchEvent {
                            node_tombstones: vec![tombstone],
                            ..Default::default()
                        },
                        format,
                    ),
                }
            }
            NodeEvent::Synced => {
                let mut event = batch.take().unwrap_or_default();
                if let Some(id) = &only
                    && event.nodes.is_empty()
                {
                    // Said once: a mistyped ID would otherwise wait in
                    // silence.
                    eprintln!(
                        "node {id} does not exist (yet): waiting for it to be created \
                         (Ctrl-C to stop; `metroctl node list` lists the nodes)"
                    );
                }
                event.progress = curator::watch_event::Progress::LastBacklogged as i32;
                output::print_event(&event, format);
                synced = true;
            }
            NodeEvent::Reconnecting { reason } if !synced => {
                let (endpoint, text) = reason
                    .split_once(": ")
                    .unwrap_or(("the curator", reason.as_str()));
                problems.push(exit::connect_problem(endpoint, None, text));
                if problems.len() >= tried {
                    return Err(none_answered(problems));
                }
            }
            NodeEvent::Reconnecting { reason } => {
                match away.as_mut() {
                    Some((_, attempts)) => *attempts += 1,
                    None => {
                        eprintln!(
                            "reconnecting: {reason} (retrying until a curator answers; said once)"
                        );
                        away = Some((Instant::now(), 1));
                    }
                }
                batch.get_or_insert_with(Default::default);
            }
            NodeEvent::Resynced => {
                let event = batch.take().unwrap_or_default();
                let changes = event.nodes.len() + event.node_tombstones.len();
                if changes > 0 {
                    output::print_event(&event, format);
                }
                let (since, attempts) = away.take().unwrap_or((Instant::now(), 0));
                eprintln!(
                    "reconnected after {attempts} failed attempt(s) in {:.1} s ({changes} \
                     change(s) while away)",
                    since.elapsed().as_secs_f64()
                );
            }
            _ => {}
        }
    }
}

/// `why`, and the failures that led to it.
fn with_problems(why: String, problems: &[String]) -> String {
    if problems.is_empty() {
        why
    } else {
        format!("{why}: {}", problems.join("; "))
    }
}
