//! A router served in-process over plain TCP on either runtime, for tests
//! of a service with prepared state (e.g. a log tree with known entries).

use std::net::SocketAddr;

use metropolis_runtime_smol::rt::SmolRuntime;
use metropolis_runtime_tokio::rt::TokioRuntime;
use metropolis_service::Router;
use metropolis_transport::connect;
use metropolis_transport::grpc::Channel;
use metropolis_transport::listen;
use metropolis_transport::runtime::SharedRuntime;
use metropolis_transport::shutdown::{ShutdownTrigger, shutdown_pair};

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
        let serve = move |runtime: SharedRuntime| {
            let (listener, addr) = listen::bind_tcp(&runtime, "127.0.0.1:0".parse().unwrap())
                .expect("binds a loopback port");
            let limits = metropolis_transport::edge::EdgeLimits::default();
            let serving = listen::serve_plain(runtime, listener, router, limits, shutdown);
            (addr, serving)
        };
        match runtime {
            RuntimeKind::Tokio => {
                let (addr, serving) = serve(TokioRuntime::shared());
                tokio::spawn(serving);
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
                    let (addr, serving) = serve(SmolRuntime::on(ex.clone()).shared());
                    tx.send(addr).unwrap();
                    smol::block_on(ex.run(serving));
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
        connect::plain(&TokioRuntime::shared(), &self.addr.to_string())
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
