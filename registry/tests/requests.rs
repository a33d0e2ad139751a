//! The client's requests as a server on loopback sees them: methods,
//! bodies and their lengths, `HEAD` responses without a body, and which
//! methods follow redirects.

#![allow(clippy::unwrap_used)]

use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::thread::JoinHandle;
use std::time::Duration;

use metropolis_registry::{Client, HttpError, Method, Request, RetryPolicy, Upload, Url};

fn client() -> Client {
    Client {
        tls: None,
        connect_timeout: Duration::from_secs(5),
        io_timeout: Duration::from_secs(5),
        deadline: Duration::from_secs(10),
        user_agent: "registry-test",
        retry: RetryPolicy::default(),
    }
}

/// A server answering one connection with `answer`, returning the
/// request's head and the body its `Content-Length` gives.
fn serve_once(answer: &'static str) -> (Url, JoinHandle<(String, Vec<u8>)>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let handle = std::thread::spawn(move || {
        let (stream, _) = listener.accept().unwrap();
        let mut reader = BufReader::new(stream.try_clone().unwrap());
        let mut head = String::new();
        loop {
            let mut line = String::new();
            reader.read_line(&mut line).unwrap();
            head.push_str(&line);
            if line == "\r\n" || line.is_empty() {
                break;
            }
        }
        let length = head
            .lines()
            .find_map(|l| l.strip_prefix("Content-Length: "))
            .map_or(0, |n| n.trim().parse::<usize>().unwrap());
        let mut body = vec![0; length];
        let read = reader.read_exact(&mut body);
        let mut stream = stream;
        if read.is_ok() {
            stream.write_all(answer.as_bytes()).unwrap();
        }
        (head, body)
    });
    let url = Url::parse(&format!("http://{addr}/v2/repo/blobs/uploads/x?a=b")).unwrap();
    (url, handle)
}

#[test]
fn a_put_sends_its_body_with_its_length_and_type() {
    let (url, server) = serve_once("HTTP/1.1 201 Created\r\nContent-Length: 0\r\n\r\n");
    let data = b"hello, registry".to_vec();
    let open = || -> io::Result<Box<dyn Read>> { Ok(Box::new(io::Cursor::new(data.clone()))) };
    let response = client()
        .send(
            &url,
            Request {
                method: Method::Put,
                upload: Some(Upload {
                    len: data.len() as u64,
                    content_type: "application/octet-stream",
                    open: &open,
                }),
                ..Request::default()
            },
        )
        .unwrap();
    assert_eq!(response.status, 201);
    let (head, body) = server.join().unwrap();
    assert!(
        head.starts_with("PUT /v2/repo/blobs/uploads/x?a=b HTTP/1.1\r\n"),
        "{head}"
    );
    assert!(head.contains("Content-Length: 15\r\n"), "{head}");
    assert!(
        head.contains("Content-Type: application/octet-stream\r\n"),
        "{head}"
    );
    assert_eq!(body, data);
}

#[test]
fn a_post_without_a_body_says_its_length_is_zero() {
    let (url, server) = serve_once("HTTP/1.1 202 Accepted\r\nLocation: /up/1\r\n\r\n");
    let response = client()
        .send(
            &url,
            Request {
                method: Method::Post,
                ..Request::default()
            },
        )
        .unwrap();
    assert_eq!(response.status, 202);
    assert_eq!(response.header("location"), Some("/up/1"));
    let (head, _) = server.join().unwrap();
    assert!(head.starts_with("POST "), "{head}");
    assert!(head.contains("Content-Length: 0\r\n"), "{head}");
}

#[test]
fn a_head_response_has_no_body_whatever_its_length_says() {
    let (url, server) = serve_once("HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n");
    let mut response = client()
        .send(
            &url,
            Request {
                method: Method::Head,
                ..Request::default()
            },
        )
        .unwrap();
    assert_eq!(response.status, 200);
    assert_eq!(response.read_body(10).unwrap(), Some(Vec::new()));
    let (head, _) = server.join().unwrap();
    assert!(head.starts_with("HEAD "), "{head}");
}

#[test]
fn a_body_shorter_than_its_length_fails_the_request() {
    let (url, server) = serve_once("HTTP/1.1 201 Created\r\n\r\n");
    let open = || -> io::Result<Box<dyn Read>> { Ok(Box::new(io::Cursor::new(vec![1u8; 5]))) };
    let err = client()
        .send(
            &url,
            Request {
                method: Method::Put,
                upload: Some(Upload {
                    len: 10,
                    content_type: "application/octet-stream",
                    open: &open,
                }),
                ..Request::default()
            },
        )
        .err()
        .unwrap();
    match err {
        HttpError::Io { source, .. } => {
            assert_eq!(source.kind(), io::ErrorKind::UnexpectedEof);
            assert!(source.to_string().contains("5 of its 10 bytes"), "{source}");
        }
        other => panic!("{other:?}"),
    }
    drop(server);
}

#[test]
fn puts_and_posts_do_not_follow_redirects() {
    for method in [Method::Put, Method::Post] {
        let (url, server) = serve_once(
            "HTTP/1.1 307 Temporary Redirect\r\nLocation: /elsewhere\r\nContent-Length: 0\r\n\r\n",
        );
        let response = client()
            .send(
                &url,
                Request {
                    method,
                    ..Request::default()
                },
            )
            .unwrap();
        assert_eq!(response.status, 307, "{method:?}");
        server.join().unwrap();
    }
}

#[test]
fn gets_follow_redirects() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let server = std::thread::spawn(move || {
        let mut targets = Vec::new();
        for answer in [
            "HTTP/1.1 307 Temporary Redirect\r\nLocation: /elsewhere\r\nContent-Length: 0\r\n\r\n",
            "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok",
        ] {
            let (mut stream, _) = listener.accept().unwrap();
            let mut line = String::new();
            BufReader::new(stream.try_clone().unwrap())
                .read_line(&mut line)
                .unwrap();
            targets.push(line);
            stream.write_all(answer.as_bytes()).unwrap();
        }
        targets
    });
    let url = Url::parse(&format!("http://{addr}/first")).unwrap();
    let mut response = client().send(&url, Request::default()).unwrap();
    assert_eq!(response.status, 200);
    assert_eq!(response.read_body(10).unwrap(), Some(b"ok".to_vec()));
    let targets = server.join().unwrap();
    assert_eq!(
        targets,
        ["GET /first HTTP/1.1\r\n", "GET /elsewhere HTTP/1.1\r\n"]
    );
}
