//! A TCP proxy in front of a server that, while told to, drips what the
//! server sends: on each connection the first bytes pass at once, the
//! rest a few bytes at a time. Before a registry (TLS passes through
//! untouched) it plays a registry whose layer downloads crawl, fast
//! enough to beat any socket timeout, too slow to ever finish.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

/// A running proxy.
pub struct DripProxy {
    /// `127.0.0.1:port`.
    pub addr: String,
    dripping: Arc<AtomicBool>,
    stop: Arc<AtomicBool>,
    connections: Arc<Mutex<Vec<TcpStream>>>,
    thread: Option<JoinHandle<()>>,
}

impl DripProxy {
    /// Proxies to `upstream`; while dripping, each connection passes the
    /// server's first `fast` bytes, then `chunk` bytes every `pause`.
    pub fn start(upstream: &str, fast: usize, chunk: usize, pause: Duration) -> DripProxy {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let dripping = Arc::new(AtomicBool::new(true));
        let stop = Arc::new(AtomicBool::new(false));
        let connections = Arc::new(Mutex::new(Vec::new()));
        let thread = {
            let (dripping, stop, connections) =
                (dripping.clone(), stop.clone(), connections.clone());
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
                    let drip = dripping.load(Ordering::SeqCst);
                    {
                        let mut open = connections.lock().unwrap();
                        open.push(client.try_clone().unwrap());
                        open.push(server.try_clone().unwrap());
                    }
                    let (mut client_in, mut server_out) =
                        (client.try_clone().unwrap(), server.try_clone().unwrap());
                    std::thread::spawn(move || {
                        let _ = std::io::copy(&mut client_in, &mut server_out);
                        let _ = server_out.shutdown(Shutdown::Write);
                    });
                    std::thread::spawn(move || {
                        pass(server, client, drip.then_some((fast, chunk, pause)))
                    });
                }
            })
        };
        DripProxy {
            addr,
            dripping,
            stop,
            connections,
            thread: Some(thread),
        }
    }

    /// Whether new connections drip (they do from the start).
    pub fn set_dripping(&self, dripping: bool) {
        self.dripping.store(dripping, Ordering::SeqCst);
    }
}

/// Copies `from` to `to`, dripping after `fast` bytes when asked to.
fn pass(mut from: TcpStream, mut to: TcpStream, drip: Option<(usize, usize, Duration)>) {
    let mut passed = 0usize;
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let want = match drip {
            Some((fast, chunk, _)) if passed >= fast => chunk.max(1).min(buf.len()),
            Some((fast, _, _)) => (fast - passed).min(buf.len()),
            None => buf.len(),
        };
        let read = match from.read(&mut buf[..want]) {
            Ok(0) | Err(_) => break,
            Ok(read) => read,
        };
        if let Some((fast, _, pause)) = drip
            && passed >= fast
        {
            std::thread::sleep(pause);
        }
        if to.write_all(&buf[..read]).is_err() {
            break;
        }
        passed += read;
    }
    let _ = to.shutdown(Shutdown::Write);
}

impl Drop for DripProxy {
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
