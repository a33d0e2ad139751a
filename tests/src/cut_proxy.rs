//! A TCP proxy in front of a server that breaks uploads: the first
//! `uploads` connections on which the client sends more than `cut` bytes
//! are shut down in both directions once `cut` bytes have passed, as a
//! link that drops in the middle of a large `PUT` does. Everything else
//! passes untouched.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::thread::JoinHandle;

/// A running proxy.
pub struct CutProxy {
    /// `127.0.0.1:port`.
    pub addr: String,
    /// Connections cut so far.
    pub cut: Arc<AtomicUsize>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl CutProxy {
    /// Proxies to `upstream`, cutting the first `uploads` connections
    /// that carry more than `cut` bytes from the client.
    pub fn start(upstream: &str, cut: usize, uploads: usize) -> CutProxy {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let stop = Arc::new(AtomicBool::new(false));
        let done = Arc::new(AtomicUsize::new(0));
        let thread = {
            let (stop, done) = (stop.clone(), done.clone());
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
                    let (server_in, client_out) =
                        (server.try_clone().unwrap(), client.try_clone().unwrap());
                    std::thread::spawn(move || {
                        let mut from = server_in;
                        let mut to = client_out;
                        let _ = std::io::copy(&mut from, &mut to);
                        let _ = to.shutdown(Shutdown::Write);
                    });
                    let done = done.clone();
                    std::thread::spawn(move || upload(client, server, cut, uploads, &done));
                }
            })
        };
        CutProxy {
            addr,
            cut: done,
            stop,
            thread: Some(thread),
        }
    }
}

/// Copies the client's bytes to the server, cutting both off after
/// `cut` bytes while fewer than `uploads` connections were cut.
fn upload(
    mut client: TcpStream,
    mut server: TcpStream,
    cut: usize,
    uploads: usize,
    done: &AtomicUsize,
) {
    let mut passed = 0usize;
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let read = match client.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(read) => read,
        };
        if passed + read > cut && done.load(Ordering::SeqCst) < uploads {
            let _ = server.write_all(&buf[..cut - passed]);
            done.fetch_add(1, Ordering::SeqCst);
            let _ = client.shutdown(Shutdown::Both);
            let _ = server.shutdown(Shutdown::Both);
            return;
        }
        if server.write_all(&buf[..read]).is_err() {
            break;
        }
        passed += read;
    }
    let _ = server.shutdown(Shutdown::Write);
}

impl Drop for CutProxy {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        let _ = TcpStream::connect(&self.addr);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}
