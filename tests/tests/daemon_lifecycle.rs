//! The daemon as a process: no acknowledged update lost to SIGKILL, a
//! corrupt store refuses to start, bad requests get gRPC errors while the
//! daemon keeps serving, SIGTERM stops it cleanly.

#![allow(clippy::unwrap_used)]

use std::time::Duration;

use bytes::{Buf, BufMut};
use futures::StreamExt;
use metropolis_proto::prelude::curator;
use metropolis_tests::{
    Daemon, RuntimeKind, StatusWriters, against_both_runtimes_and_etcd, curator, status_seqs,
    status_with,
};
use metropolis_transport::grpc::Channel;
use prost::Message;
use tonic::Code;

async fn acknowledged_updates_survive_sigkill(rt: RuntimeKind) {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("d");
    let mut d = Daemon::start(&data, rt);
    // Four nodes write concurrently (exercising group commit); each records
    // the last sequence number the daemon acknowledged.
    let writers = StatusWriters::start(&d, dir.path(), 4).await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    d.kill();
    let acked = writers.join().await;
    let d = Daemon::start(&data, rt);
    let stored = status_seqs(&d).await;
    for (id, last) in &acked {
        let last = *last;
        assert!(
            last > 10,
            "node {id} made progress before the kill ({last})"
        );
        let got = stored[id];
        assert!(
            got >= last,
            "node {id}: acknowledged {last}, found {got} after restart"
        );
        assert!(
            got <= last + 1,
            "node {id}: found {got}, more than one past the last acknowledged {last}"
        );
    }
    assert!(!d.log().contains("ERROR"), "clean restart:\n{}", d.log());
}

async fn corrupt_store_refuses_to_start(rt: RuntimeKind) {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("d");
    let mut d = Daemon::start(&data, rt);
    let me = d.node_id().to_string();
    let mut c = curator(d.unix().await);
    for seq in 1..50 {
        let req = curator::UpdateNodeStatusRequest {
            node_id: me.clone(),
            status: status_with(seq),
        };
        c.update_node_status(req).await.unwrap();
    }
    assert!(d.terminate().success());
    // Flip one byte in the middle of the largest store file.
    let mut files: Vec<_> = std::fs::read_dir(data.join("store"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.is_file() && !p.to_string_lossy().ends_with("lock"))
        .collect();
    files.sort_by_key(|p| std::fs::metadata(p).unwrap().len());
    let victim = files.pop().unwrap();
    let mut bytes = std::fs::read(&victim).unwrap();
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0x5a;
    std::fs::write(&victim, &bytes).unwrap();

    let mut d = Daemon::spawn(
        &data,
        format!("127.0.0.1:{}", metropolis_tests::free_port()),
        rt,
    );
    let status = d.wait_exit(Duration::from_secs(30));
    assert!(!status.success());
    let log = d.log();
    let name = victim.file_name().unwrap().to_string_lossy().to_string();
    assert!(
        log.contains(&name),
        "the error names the file {name}:\n{log}"
    );
    // Nothing was reset: the corrupt file is still there, byte for byte.
    assert_eq!(std::fs::read(&victim).unwrap(), bytes);
}

/// A message that encodes as the given raw bytes.
#[derive(Clone, Debug, Default, PartialEq)]
struct Raw(Vec<u8>);

impl Message for Raw {
    fn encode_raw(&self, buf: &mut impl BufMut) {
        buf.put_slice(&self.0);
    }
    fn merge_field(
        &mut self,
        _tag: u32,
        wire_type: prost::encoding::WireType,
        buf: &mut impl Buf,
        ctx: prost::encoding::DecodeContext,
    ) -> Result<(), prost::DecodeError> {
        prost::encoding::skip_field(wire_type, _tag, buf, ctx)
    }
    fn encoded_len(&self) -> usize {
        self.0.len()
    }
    fn clear(&mut self) {
        self.0.clear();
    }
}

async fn raw_call(channel: Channel, body: Vec<u8>) -> Result<(), tonic::Status> {
    let mut grpc = tonic::client::Grpc::with_origin(channel, Channel::origin())
        .max_encoding_message_size(usize::MAX);
    grpc.ready()
        .await
        .map_err(|e| tonic::Status::unavailable(e.to_string()))?;
    let path = http::uri::PathAndQuery::from_static(
        "/metropolis.node.core.curator.proto.api.Curator/UpdateNodeStatus",
    );
    let codec = tonic_prost::ProstCodec::<Raw, curator::UpdateNodeStatusResponse>::default();
    grpc.unary(tonic::Request::new(Raw(body)), path, codec)
        .await
        .map(|_| ())
}

async fn malformed_and_oversized_requests_get_errors(rt: RuntimeKind) {
    let dir = tempfile::tempdir().unwrap();
    let d = Daemon::start(&dir.path().join("d"), rt);
    let me = d.node_id().to_string();

    // Not a protobuf message at all.
    let e = raw_call(d.unix().await, vec![0xff; 64]).await.unwrap_err();
    assert_ne!(e.code(), Code::Ok);
    // node_id with invalid UTF-8.
    let e = raw_call(d.unix().await, vec![0x0a, 0x02, 0xc3, 0x28])
        .await
        .unwrap_err();
    assert_ne!(e.code(), Code::Ok);
    // A 5 MiB message: over the decoding limit.
    let mut big = curator::UpdateNodeStatusRequest {
        node_id: me.clone(),
        status: status_with(1),
    };
    big.status.as_mut().unwrap().external_address = "x".repeat(5 << 20);
    let e = raw_call(d.unix().await, big.encode_to_vec())
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::OutOfRange, "{e:?}");
    assert!(e.message().contains("too large"), "{}", e.message());
    // A status over the 16 KiB cap.
    let mut large = status_with(1);
    large.as_mut().unwrap().version = Some(metropolis_proto::version::spec::Version {
        git_information: Some(metropolis_proto::version::spec::version::GitInformation {
            commit_hash: "a".repeat(20_000),
            ..Default::default()
        }),
        ..Default::default()
    });
    let e = curator(d.unix().await)
        .update_node_status(curator::UpdateNodeStatusRequest {
            node_id: me.clone(),
            status: large,
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
    // Garbage on the TLS port that is not TLS at all.
    {
        use tokio::io::AsyncWriteExt;
        let mut s = tokio::net::TcpStream::connect(&d.addr).await.unwrap();
        s.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            .await
            .unwrap();
    }
    // Still serving.
    let req = curator::UpdateNodeStatusRequest {
        node_id: me,
        status: status_with(2),
    };
    curator(d.unix().await)
        .update_node_status(req)
        .await
        .unwrap();
    curator(d.owner().await)
        .watch(curator::WatchRequest {
            kind: Some(curator::watch_request::Kind::NodesInCluster(
                Default::default(),
            )),
        })
        .await
        .unwrap();
}

async fn sigterm_ends_watches_unavailable_and_exits_cleanly(rt: RuntimeKind) {
    let dir = tempfile::tempdir().unwrap();
    let mut d = Daemon::start(&dir.path().join("d"), rt);
    let kind = curator::watch_request::Kind::NodesInCluster(Default::default());
    let mut s = curator(d.unix().await)
        .watch(curator::WatchRequest { kind: Some(kind) })
        .await
        .unwrap()
        .into_inner();
    let first = s.next().await.unwrap().unwrap();
    assert_ne!(first.progress, 0);
    let status = d.terminate();
    assert!(status.success(), "exit status {status}:\n{}", d.log());
    match s.next().await {
        Some(Err(e)) => assert_eq!(e.code(), Code::Unavailable, "{e:?}"),
        other => panic!("expected Unavailable, got {other:?}"),
    }
    // The socket file is gone.
    assert!(!d.socket.exists());
}

against_both_runtimes_and_etcd!(
    acknowledged_updates_survive_sigkill,
    malformed_and_oversized_requests_get_errors,
    sigterm_ends_watches_unavailable_and_exits_cleanly
);

/// The embedded store's own failure mode: not run over etcd.
mod embedded_only {
    use super::corrupt_store_refuses_to_start;
    use metropolis_tests::against_both_runtimes;

    against_both_runtimes!(corrupt_store_refuses_to_start);
}
