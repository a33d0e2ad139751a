//! A TCP proxy on a loopback port in front of a server, relaying each
//! connection as its owner says: the base of the fault proxies
//! (`drip_proxy`, `cut_proxy`).

use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

/// A running proxy. Dropping it stops accepting and shuts every
/// connection it relayed.
pub struct Proxy {
    /// `127.0.0.1:port`.
    pub addr: String,
    stop: Arc<AtomicBool>,
    connections: Arc<Mutex<Vec<TcpStream>>>,
    thread: Option<JoinHandle<()>>,
}

impl Proxy {
    /// Accepts connections, connects each to `upstream` and hands both
    /// ends, `(client, server)`, to `relay` on the accepting thread
    /// (`relay` starts threads of its own for the copying).
    pub fn start(upstream: &str, relay: impl Fn(TcpStream, TcpStream) + Send + 'static) -> Proxy {
        Proxy::start_at("127.0.0.1:0", upstream, relay)
    }

    /// [`start`](Self::start) listening on `listen` (`IP:PORT`).
    pub fn start_at(
        listen: &str,
        upstream: &str,
        relay: impl Fn(TcpStream, TcpStream) + Send + 'static,
    ) -> Proxy {
        let listener = TcpListener::bind(listen).unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let stop = Arc::new(AtomicBool::new(false));
        let connections = Arc::new(Mutex::new(Vec::new()));
        let thread = {
            let (stop, connections) = (stop.clone(), connections.clone());
            let upstream = upstream.to_string();
            std::thread::spawn(move || {
                for client in listener.incoming() {
                    if stop.load(Ordering::SeqCst) {
                        return;
                    }
                    let Ok(client) = client else { continue };
                    let Ok(server) = TcpStream::connect(&upstream) else {
                        continue;
                    };
                    {
                        let mut open = connections.lock().unwrap();
                        open.push(client.try_clone().unwrap());
                        open.push(server.try_clone().unwrap());
                    }
                    relay(client, server);
                }
            })
        };
        Proxy {
            addr,
            stop,
            connections,
            thread: Some(thread),
        }
    }
}

/// Copies `from` to `to` on a thread of its own until `from` ends, then
/// ends `to`'s sending side.
pub fn copy_in_background(mut from: TcpStream, mut to: TcpStream) {
    std::thread::spawn(move || {
        let _ = std::io::copy(&mut from, &mut to);
        let _ = to.shutdown(Shutdown::Write);
    });
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        let _ = TcpStream::connect(&self.addr);
        for connection in self.connections.lock().unwrap().drain(..) {
            let _ = connection.shutdown(Shutdown::Both);
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}
