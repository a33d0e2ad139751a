//! Real TLS 1.3 handshakes with the configurations of
//! `metropolis_pki`: in memory (both ends driven by hand) and over a
//! TCP socket on loopback.

#![allow(clippy::unwrap_used)]

use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, TcpListener, TcpStream};
use std::sync::Arc;

use metropolis_core::identity::{Identity, NodeId, identity_from_certificate};
use metropolis_pki::{ClientAuth, ClusterCa, Credentials, PkiError, client_config, server_config};
use metropolis_testkit::tls::{Failure, drive, handshake, transfer};
use rustls::pki_types::ServerName;
use rustls::{ClientConfig, ClientConnection, Connection, ServerConfig, ServerConnection};

/// What each end learned about the other in a successful handshake.
struct Session {
    /// The client's identity as the server classifies it.
    client_identity: Identity,
    /// The server's identity as the client classifies it.
    server_identity: Identity,
}

/// Connects a client to a server in memory, checks that application data
/// flows both ways, and classifies both peers.
fn connect(
    client_config: Arc<ClientConfig>,
    server_config: Arc<ServerConfig>,
    name: ServerName<'static>,
) -> Result<Session, Failure> {
    let (mut client, mut server) = handshake(client_config, server_config, name)?;

    for conn in [&client, &server] {
        assert_eq!(
            conn.protocol_version(),
            Some(rustls::ProtocolVersion::TLSv1_3)
        );
        assert_eq!(conn.alpn_protocol(), Some(&b"h2"[..]));
    }
    client.writer().write_all(b"ping").unwrap();
    transfer(&mut client, &mut server);
    server.process_new_packets().unwrap();
    let mut got = [0u8; 4];
    server.reader().read_exact(&mut got).unwrap();
    assert_eq!(&got, b"ping");
    server.writer().write_all(b"pong").unwrap();
    transfer(&mut server, &mut client);
    client.process_new_packets().unwrap();
    client.reader().read_exact(&mut got).unwrap();
    assert_eq!(&got, b"pong");

    let classify = |conn: &Connection| match conn.peer_certificates() {
        Some(chain) => identity_from_certificate(&chain[0]).unwrap(),
        None => Identity::Unauthenticated,
    };
    Ok(Session {
        client_identity: classify(&server),
        server_identity: classify(&client),
    })
}

/// The error of a certificate from another cluster: its CA has the same
/// name as ours, so the signature check is what fails.
fn assert_foreign(e: &rustls::CertificateError) {
    assert!(
        matches!(
            e,
            rustls::CertificateError::BadSignature | rustls::CertificateError::UnknownIssuer
        ),
        "{e:?}"
    );
}

fn dns(id: &NodeId) -> ServerName<'static> {
    ServerName::try_from(id.as_str().to_owned()).unwrap()
}

/// A CA, and a node of it serving with `auth`.
struct Cluster {
    ca: ClusterCa,
    server: Arc<ServerConfig>,
    server_id: NodeId,
}

fn cluster(auth: ClientAuth) -> Cluster {
    let ca = ClusterCa::generate().unwrap();
    let (creds, server_id) = ca.issue_node(&[]).unwrap();
    let server = server_config(&creds, auth).unwrap();
    Cluster {
        ca,
        server,
        server_id,
    }
}

#[test]
fn node_client_is_classified_as_that_node() {
    let c = cluster(ClientAuth::Required);
    let (creds, client_id) = c.ca.issue_node(&[]).unwrap();
    assert_ne!(client_id, c.server_id);
    let config = client_config(Some(&creds), &c.ca.cert_pem()).unwrap();
    let session = connect(config, c.server.clone(), dns(&c.server_id)).unwrap();
    assert_eq!(session.client_identity, Identity::Node(client_id));
    assert_eq!(session.server_identity, Identity::Node(c.server_id));
}

#[test]
fn owner_client_is_classified_as_owner() {
    let c = cluster(ClientAuth::Required);
    let owner = c.ca.issue_owner().unwrap();
    assert_eq!(owner.identity().unwrap(), Identity::Owner);
    let config = client_config(Some(&owner), &owner.ca_pem).unwrap();
    let session = connect(config, c.server.clone(), dns(&c.server_id)).unwrap();
    assert_eq!(session.client_identity, Identity::Owner);
}

#[test]
fn client_without_certificate_fails_when_required_and_is_anonymous_when_optional() {
    let c = cluster(ClientAuth::Required);
    let config = client_config(None, &c.ca.cert_pem()).unwrap();
    match connect(config.clone(), c.server.clone(), dns(&c.server_id)) {
        Err(Failure::Server(e)) => assert_eq!(e, rustls::Error::NoCertificatesPresented),
        other => panic!(
            "expected the server to refuse, got {:?}",
            other.map(|s| s.client_identity)
        ),
    }

    let (creds, _) = c.ca.issue_node(&[]).unwrap();
    let optional = server_config(&creds, ClientAuth::Optional).unwrap();
    let session = connect(
        config,
        optional,
        ServerName::IpAddress(Ipv4Addr::LOCALHOST.into()),
    )
    .unwrap();
    assert_eq!(session.client_identity, Identity::Unauthenticated);
}

#[test]
fn client_certificate_from_another_ca_fails() {
    let c = cluster(ClientAuth::Required);
    let (server_creds, _) = c.ca.issue_node(&[]).unwrap();
    let optional = server_config(&server_creds, ClientAuth::Optional).unwrap();
    let other = ClusterCa::generate().unwrap();
    for creds in [
        other.issue_node(&[]).unwrap().0,
        other.issue_owner().unwrap(),
    ] {
        // The client trusts the right CA, but its own certificate is foreign.
        let config = client_config(Some(&creds), &c.ca.cert_pem()).unwrap();
        for server in [c.server.clone(), optional.clone()] {
            match connect(config.clone(), server, dns(&c.server_id)) {
                Err(Failure::Server(rustls::Error::InvalidCertificate(e))) => {
                    assert_foreign(&e);
                }
                other => panic!(
                    "expected the server to refuse, got {:?}",
                    other.map(|s| s.client_identity)
                ),
            }
        }
    }
}

#[test]
fn server_is_trusted_at_any_name_but_only_under_the_cluster_ca() {
    let c = cluster(ClientAuth::Required);
    let (creds, client_id) = c.ca.issue_node(&[]).unwrap();
    let config = client_config(Some(&creds), &c.ca.cert_pem()).unwrap();
    let names = [
        ServerName::IpAddress(IpAddr::from([10, 9, 8, 7]).into()),
        ServerName::IpAddress(IpAddr::from([0xfd00, 0, 0, 0, 0, 0, 0, 1]).into()),
        ServerName::try_from("elsewhere.example").unwrap(),
        dns(&client_id),
        ServerName::IpAddress(Ipv4Addr::LOCALHOST.into()),
    ];
    for name in names {
        let session = connect(config.clone(), c.server.clone(), name).unwrap();
        assert_eq!(session.server_identity, Identity::Node(c.server_id.clone()));
    }

    // A server of another cluster is refused, whatever name it is reached at.
    let impostor = cluster(ClientAuth::Required);
    for name in [
        dns(&impostor.server_id),
        ServerName::IpAddress(Ipv4Addr::LOCALHOST.into()),
        ServerName::IpAddress(IpAddr::from([10, 9, 8, 7]).into()),
    ] {
        match connect(config.clone(), impostor.server.clone(), name) {
            Err(Failure::Client(rustls::Error::InvalidCertificate(e))) => {
                assert_foreign(&e);
            }
            other => panic!(
                "expected the client to refuse, got {:?}",
                other.map(|s| s.server_identity)
            ),
        }
    }
}

#[test]
fn owner_certificate_cannot_serve() {
    // Owner certificates are for clients only (no server-auth usage).
    let ca = ClusterCa::generate().unwrap();
    let owner = ca.issue_owner().unwrap();
    let server = server_config(&owner, ClientAuth::Optional).unwrap();
    let config = client_config(None, &ca.cert_pem()).unwrap();
    match connect(config, server, ServerName::try_from("owner").unwrap()) {
        Err(Failure::Client(rustls::Error::InvalidCertificate(e))) => {
            assert!(
                matches!(
                    e,
                    rustls::CertificateError::InvalidPurposeContext {
                        required: rustls::ExtendedKeyPurpose::ServerAuth,
                        ..
                    }
                ),
                "{e:?}"
            );
        }
        other => panic!(
            "expected the client to refuse, got {:?}",
            other.map(|s| s.server_identity)
        ),
    }
}

#[test]
fn server_refuses_tls12() {
    let c = cluster(ClientAuth::Optional);
    let mut roots = rustls::RootCertStore::empty();
    roots.add(c.ca.cert_der()).unwrap();
    let tls12 =
        ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_protocol_versions(&[&rustls::version::TLS12])
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth();
    let mut client =
        Connection::from(ClientConnection::new(Arc::new(tls12), dns(&c.server_id)).unwrap());
    let mut server = Connection::from(ServerConnection::new(c.server.clone()).unwrap());
    assert!(matches!(
        drive(&mut client, &mut server),
        Err(Failure::Server(_))
    ));
}

#[test]
fn ca_reloaded_from_pem_issues_certificates_trusted_under_the_original() {
    let c = cluster(ClientAuth::Required);
    let reloaded = ClusterCa::from_pem(&c.ca.cert_pem(), &c.ca.key_pem()).unwrap();
    assert_eq!(reloaded.cert_der(), c.ca.cert_der());
    let (creds, id) = reloaded.issue_node(&[]).unwrap();
    let config = client_config(Some(&creds), &c.ca.cert_pem()).unwrap();
    let session = connect(config, c.server.clone(), dns(&c.server_id)).unwrap();
    assert_eq!(session.client_identity, Identity::Node(id));

    let other = ClusterCa::generate().unwrap();
    let err = ClusterCa::from_pem(&c.ca.cert_pem(), &other.key_pem()).unwrap_err();
    assert_eq!(
        err.to_string(),
        "CA private key PEM: the private key does not belong to the CA certificate in CA certificate PEM"
    );
    let (node, _) = c.ca.issue_node(&[]).unwrap();
    let err = ClusterCa::from_pem(&node.cert_pem, &node.key_pem).unwrap_err();
    assert!(err.to_string().contains("not a CA certificate"), "{err}");
}

#[test]
fn node_certificate_for_an_external_key() {
    let ca = ClusterCa::generate().unwrap();
    let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ED25519).unwrap();
    let raw: [u8; 32] = key.public_key_raw().try_into().unwrap();
    let cert_pem = ca.issue_node_for_key(&raw, &[]).unwrap();
    let creds = Credentials::from_parts(cert_pem, key.serialize_pem(), ca.cert_pem());
    creds.validate().unwrap();
    assert_eq!(creds.ed25519_public_key().unwrap(), raw);
    assert_eq!(
        creds.identity().unwrap(),
        Identity::Node(NodeId::from_public_key(&raw))
    );
}

#[test]
fn extra_sans_are_ip_addresses_or_dns_names() {
    let ca = ClusterCa::generate().unwrap();
    let extra = [
        "10.1.2.3",
        "fd00::7",
        "node1.example.com",
        "localhost",
        "127.0.0.1",
    ]
    .map(String::from);
    let (creds, id) = ca.issue_node(&extra).unwrap();
    let der = creds.cert_der().unwrap();
    let (_, cert) = x509_parser::parse_x509_certificate(&der).unwrap();
    let sans: Vec<String> = cert
        .subject_alternative_name()
        .unwrap()
        .unwrap()
        .value
        .general_names
        .iter()
        .map(|n| match n {
            x509_parser::extensions::GeneralName::DNSName(d) => d.to_string(),
            x509_parser::extensions::GeneralName::IPAddress(ip) => match ip.len() {
                4 => IpAddr::from(<[u8; 4]>::try_from(*ip).unwrap()).to_string(),
                _ => IpAddr::from(<[u8; 16]>::try_from(*ip).unwrap()).to_string(),
            },
            other => panic!("unexpected SAN {other:?}"),
        })
        .collect();
    assert_eq!(
        sans,
        [
            id.as_str(),
            "localhost",
            "127.0.0.1",
            "::1",
            "10.1.2.3",
            "fd00::7",
            "node1.example.com"
        ],
        "defaults first, extras once each"
    );
    let eku = cert.extended_key_usage().unwrap().unwrap().value;
    assert!(eku.server_auth && eku.client_auth);
    assert_eq!(
        cert.subject()
            .iter_common_name()
            .next()
            .unwrap()
            .as_str()
            .unwrap(),
        id.as_str()
    );

    for (bad, why) in [
        ("", "it is empty"),
        ("bad name", "' ' is not a letter, digit or '-'"),
        ("a..b", "empty label"),
        ("-a.b", "starts or ends with '-'"),
        ("ünï.example", "'ü' is not a letter"),
        ("10.0.0.1/8", "'/' is not a letter"),
    ] {
        let err = ca.issue_node(&[bad.to_owned()]).unwrap_err();
        assert!(matches!(err, PkiError::InvalidSan { .. }), "{err:?}");
        let msg = err.to_string();
        assert!(
            msg.starts_with(&format!(
                "extra subject alternative name {bad:?} is neither an IP address nor a DNS name"
            )),
            "{msg}"
        );
        assert!(msg.contains(why), "{msg}");
    }
}

#[test]
fn handshake_over_tcp_on_loopback() {
    let c = cluster(ClientAuth::Required);
    let (creds, client_id) = c.ca.issue_node(&[]).unwrap();
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
    let addr = listener.local_addr().unwrap();
    let server_config = c.server.clone();
    let server = std::thread::spawn(move || {
        let (sock, _) = listener.accept().unwrap();
        let mut tls = rustls::StreamOwned::new(ServerConnection::new(server_config).unwrap(), sock);
        let mut hello = [0u8; 5];
        tls.read_exact(&mut hello).unwrap();
        let chain = tls.conn.peer_certificates().unwrap();
        let identity = identity_from_certificate(&chain[0]).unwrap();
        tls.write_all(identity.to_string().as_bytes()).unwrap();
        tls.conn.send_close_notify();
        tls.flush().unwrap();
        hello
    });

    let config = client_config(Some(&creds), &c.ca.cert_pem()).unwrap();
    let sock = TcpStream::connect(addr).unwrap();
    let conn = ClientConnection::new(config, ServerName::IpAddress(addr.ip().into())).unwrap();
    let mut tls = rustls::StreamOwned::new(conn, sock);
    tls.write_all(b"hello").unwrap();
    let mut reply = String::new();
    tls.read_to_string(&mut reply).unwrap();
    assert_eq!(reply, format!("node {client_id}"));
    assert_eq!(&server.join().unwrap(), b"hello");
    let chain = tls.conn.peer_certificates().unwrap();
    assert_eq!(
        identity_from_certificate(&chain[0]).unwrap(),
        Identity::Node(c.server_id)
    );
}

#[test]
fn deferred_lets_every_client_through_and_the_classifier_decides() {
    let c = cluster(ClientAuth::Deferred);
    let classifier = metropolis_transport::peer::PeerClassifier::new(c.ca.cert_der()).unwrap();
    let classify = |creds: Option<&metropolis_pki::Credentials>| {
        let config = client_config(creds, &c.ca.cert_pem()).unwrap();
        let mut client =
            Connection::from(ClientConnection::new(config, dns(&c.server_id)).unwrap());
        let mut server = Connection::from(ServerConnection::new(c.server.clone()).unwrap());
        drive(&mut client, &mut server).unwrap();
        classifier.classify(server.peer_certificates())
    };
    let (node, node_id) = c.ca.issue_node(&[]).unwrap();
    assert_eq!(classify(Some(&node)), Identity::Node(node_id));
    assert_eq!(
        classify(Some(&c.ca.issue_owner().unwrap())),
        Identity::Owner
    );
    assert_eq!(classify(None), Identity::Unauthenticated);
    // A certificate from another CA completes the handshake (the client
    // proves its key) but is not trusted.
    let foreign = ClusterCa::generate().unwrap().issue_node(&[]).unwrap().0;
    assert_eq!(classify(Some(&foreign)), Identity::Unauthenticated);
}
