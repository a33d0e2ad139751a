//! Watches a cluster's nodes through several curators, riding through
//! failover: every node, then every real change, one line each; what the
//! view goes through (reconnecting, resynced) on standard error.
//!
//! ```sh
//! cargo run -p metropolis-client --example watch_nodes -- \
//!     --credentials ./metropolis-data/owner 10.0.0.1:7835,10.0.0.2:7835,10.0.0.3:7835
//! cargo run -p metropolis-client --example watch_nodes -- unix:./metropolis-data/curator.sock
//! ```
//!
//! `--credentials DIR` holds `owner.pem` (or `node.pem`), its `-key.pem`
//! and `ca.pem`; a `unix:` endpoint needs none. `--smol` runs it on smol
//! instead of tokio: the library is the same.

use std::path::PathBuf;
use std::time::Duration;

use futures::StreamExt;
use metropolis_client::{Client, ClientConfig, NodeEvent};
use metropolis_pki::{Credentials, client_config};
use metropolis_transport::runtime::SharedRuntime;

type Error = Box<dyn std::error::Error + Send + Sync>;

struct Args {
    endpoints: Vec<String>,
    credentials: Option<PathBuf>,
    smol: bool,
}

fn parse_args() -> Result<Args, Error> {
    let mut args = Args {
        endpoints: Vec::new(),
        credentials: None,
        smol: false,
    };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        match arg.as_str() {
            "--credentials" => {
                let dir = it.next().ok_or("--credentials: a directory is missing")?;
                args.credentials = Some(PathBuf::from(dir));
            }
            "--smol" => args.smol = true,
            other => args.endpoints.extend(other.split(',').map(str::to_string)),
        }
    }
    if args.endpoints.is_empty() {
        return Err(
            "usage: watch_nodes [--credentials DIR] [--smol] ENDPOINT[,ENDPOINT...]".into(),
        );
    }
    Ok(args)
}

async fn watch(runtime: SharedRuntime, args: Args) -> Result<(), Error> {
    let tls = match &args.credentials {
        Some(dir) => {
            let prefix = if dir.join("owner.pem").exists() {
                "owner"
            } else {
                "node"
            };
            let creds = Credentials::read_from_dir(dir, prefix)
                .map_err(|e| format!("--credentials {}: {e}", dir.display()))?;
            Some(client_config(Some(&creds), &creds.ca_pem)?)
        }
        None => None,
    };
    let mut config = ClientConfig::new(args.endpoints, tls);
    config.call_timeout = Duration::from_secs(5);
    let client = Client::new(runtime, config)?;
    let mut view = client.watch_nodes();
    while let Some(event) = view.next().await {
        match event? {
            NodeEvent::Changed(node) => {
                let address = node
                    .status
                    .as_ref()
                    .map_or("-", |s| s.external_address.as_str());
                println!("node      {}  address={address}", node.id);
            }
            NodeEvent::Removed(id) => println!("removed   {id}"),
            NodeEvent::Synced => println!("-- end of current state; following changes --"),
            NodeEvent::Reconnecting { reason } => eprintln!("reconnecting: {reason}"),
            NodeEvent::Resynced => eprintln!("reconnected; the changes of the time away are above"),
            _ => {}
        }
    }
    Ok(())
}

fn main() -> std::process::ExitCode {
    let result = parse_args().and_then(|args| {
        if args.smol {
            let runtime = metropolis_runtime_smol::rt::SmolRuntime::global().shared();
            smol::block_on(watch(runtime, args))
        } else {
            let tokio = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?;
            tokio.block_on(async {
                let runtime = metropolis_runtime_tokio::rt::TokioRuntime::shared();
                watch(runtime, args).await
            })
        }
    });
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("watch_nodes: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}
