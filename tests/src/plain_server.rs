//! A router served in-process over plain TCP on either runtime, for tests
//! of a service with prepared state (e.g. a log tree with known entries).

use std::net::SocketAddr;

use metropolis_core::service::Router;
use metropolis_host::grpc::Channel;
use metropolis_host::shutdown::{ShutdownTrigger, shutdown_pair};

use crate::RuntimeKind;

/// A running in-process server; stops when dropped.
pub struct PlainServer {
    /// Where it listens.
    pub addr: SocketAddr,
    trigger: Option<ShutdownTrigger>,
    smol_thread: Option<std::thread::JoinHandle<()>>,
}

impl PlainServer {
    /// Serves `router` on a free loopback port with the listener of
    /// `runtime` (tokio: on the current tokio runtime; smol: on a thread of
    /// its own running a smol executor).
    pub async fn start(router: Router, runtime: RuntimeKind) -> PlainServer {
        let (trigger, shutdown) = shutdown_pair();
        match runtime {
            RuntimeKind::Tokio => {
                let tcp =
                    metropolis_runtime_tokio::listen::bind_tcp("127.0.0.1:0".parse().unwrap())
                        .await
                        .unwrap();
                let addr = tcp.local_addr().unwrap();
                tokio::spawn(metropolis_runtime_tokio::listen::serve_plain(
                    tcp,
                    router,
                    metropolis_host::edge::EdgeLimits::default(),
                    shutdown,
                ));
                PlainServer {
                    addr,
                    trigger: Some(trigger),
                    smol_thread: None,
                }
            }
            RuntimeKind::Smol => {
                let (tx, rx) = std::sync::mpsc::channel();
                let thread = std::thread::spawn(move || {
                    let ex = std::sync::Arc::new(smol::Executor::new());
                    let executor = metropolis_runtime_smol::rt::SmolExecutor::on(ex.clone());
                    smol::block_on(ex.run(async move {
                        let tcp = metropolis_runtime_smol::listen::bind_tcp(
                            "127.0.0.1:0".parse().unwrap(),
                        )
                        .await
                        .unwrap();
                        tx.send(tcp.local_addr().unwrap()).unwrap();
                        metropolis_runtime_smol::listen::serve_plain(
                            tcp,
                            router,
                            metropolis_host::edge::EdgeLimits::default(),
                            executor,
                            shutdown,
                        )
                        .await;
                    }));
                });
                let addr = rx.recv().unwrap();
                PlainServer {
                    addr,
                    trigger: Some(trigger),
                    smol_thread: Some(thread),
                }
            }
        }
    }

    /// A channel to it (tokio client).
    pub async fn channel(&self) -> Channel {
        metropolis_runtime_tokio::connect::plain(&self.addr.to_string())
            .await
            .unwrap()
    }
}

impl Drop for PlainServer {
    fn drop(&mut self) {
        if let Some(trigger) = self.trigger.take() {
            trigger.trigger();
        }
        if let Some(thread) = self.smol_thread.take() {
            let _ = thread.join();
        }
    }
}
