//! rustls handshakes driven in memory: both ends of a connection in one
//! test, records moved by hand, so a TLS configuration is tested without
//! a socket.

use std::sync::Arc;

use rustls::pki_types::ServerName;
use rustls::{ClientConfig, ClientConnection, Connection, ServerConfig, ServerConnection};

/// Which end failed a handshake, and why.
#[derive(Debug)]
pub enum Failure {
    /// The client refused (e.g. the server's certificate).
    Client(rustls::Error),
    /// The server refused (e.g. the client's certificate, or no common
    /// signature scheme).
    Server(rustls::Error),
}

impl Failure {
    /// The error, whichever end it came from.
    pub fn into_error(self) -> rustls::Error {
        match self {
            Failure::Client(e) | Failure::Server(e) => e,
        }
    }
}

/// Moves every pending TLS record from `from` to `to`.
///
/// Panics when a record cannot be moved (in memory that is a bug of the
/// test).
pub fn transfer(from: &mut Connection, to: &mut Connection) {
    let mut buf = Vec::new();
    while from.wants_write() {
        from.write_tls(&mut buf).expect("writes to memory");
    }
    let mut rest = &buf[..];
    while !rest.is_empty() {
        to.read_tls(&mut rest).expect("reads from memory");
    }
}

/// Drives both ends until the handshake is over on both, or one fails
/// (after delivering its alert to the other). Panics when it does not
/// finish within 16 round trips.
pub fn drive(client: &mut Connection, server: &mut Connection) -> Result<(), Failure> {
    for _ in 0..16 {
        transfer(client, server);
        if let Err(e) = server.process_new_packets() {
            transfer(server, client);
            let _ = client.process_new_packets();
            return Err(Failure::Server(e));
        }
        transfer(server, client);
        if let Err(e) = client.process_new_packets() {
            transfer(client, server);
            let _ = server.process_new_packets();
            return Err(Failure::Client(e));
        }
        if !client.is_handshaking()
            && !server.is_handshaking()
            && !client.wants_write()
            && !server.wants_write()
        {
            return Ok(());
        }
    }
    panic!("the handshake did not finish");
}

/// A client with `client` connecting to a server with `server` as `name`,
/// driven to the end of the handshake: both connections, or the failure.
/// Panics when a configuration cannot start a connection.
pub fn handshake(
    client: Arc<ClientConfig>,
    server: Arc<ServerConfig>,
    name: ServerName<'static>,
) -> Result<(Connection, Connection), Failure> {
    let mut client =
        Connection::from(ClientConnection::new(client, name).expect("a client connection"));
    let mut server = Connection::from(ServerConnection::new(server).expect("a server connection"));
    drive(&mut client, &mut server)?;
    Ok((client, server))
}
