//! Seeds of the `registry_responses` harness ([`super::fuzz`]), one or
//! more per selector: real manifests and indexes, responses as
//! registries send them, framings, zstd blobs.

use super::image_config::{
    CONFIG_MEDIA_TYPE, DISK_ARTIFACT, METROPOLIS_ARTIFACT, PAYLOAD_RAW, PAYLOAD_ZSTD,
};
use super::manifest::{INDEX_TYPES, OCI_MANIFEST};

const DIGEST: &str = "sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";

fn manifest(artifact_type: &str, layer_type: &str) -> String {
    format!(
        r#"{{"schemaVersion":2,"mediaType":"{OCI_MANIFEST}","artifactType":"{artifact_type}","config":{{"mediaType":"{CONFIG_MEDIA_TYPE}","digest":"{DIGEST}","size":2,"data":"e30="}},"layers":[{{"mediaType":"{layer_type}","digest":"{DIGEST}","size":1048576}},{{"mediaType":"{PAYLOAD_RAW}","digest":"{DIGEST}","size":7}}]}}"#
    )
}

fn index() -> String {
    let entry = |arch: &str, variant: &str, i: u8| {
        format!(
            r#"{{"mediaType":"{OCI_MANIFEST}","digest":"sha256:{i:064x}","size":{i},"platform":{{"os":"linux","architecture":"{arch}"{variant}}}}}"#
        )
    };
    format!(
        r#"{{"schemaVersion":2,"mediaType":"{}","manifests":[{},{},{}]}}"#,
        INDEX_TYPES[0],
        entry("arm64", r#","variant":"v8""#, 1),
        entry("amd64", "", 2),
        entry("s390x", "", 3)
    )
}

fn with(selector: u8, head: &[u8], rest: &[u8]) -> Vec<u8> {
    let mut out = vec![selector];
    out.extend_from_slice(head);
    out.extend_from_slice(rest);
    out
}

fn lp(data: &[u8]) -> Vec<u8> {
    let n = u16::try_from(data.len()).unwrap_or(u16::MAX);
    let mut out = n.to_le_bytes().to_vec();
    out.extend_from_slice(&data[..usize::from(n)]);
    out
}

/// The seeds, by name.
pub(crate) fn seeds() -> crate::fuzz::Seeds {
    let mut out: Vec<(&str, Vec<u8>)> = vec![
        (
            "oci-manifest",
            with(
                0,
                &[0, 0],
                manifest(METROPOLIS_ARTIFACT, PAYLOAD_ZSTD).as_bytes(),
            ),
        ),
        (
            "disk-image-manifest",
            with(0, &[1, 1], manifest(DISK_ARTIFACT, PAYLOAD_RAW).as_bytes()),
        ),
        (
            "gzip-layer",
            with(
                0,
                &[0, 0],
                manifest(METROPOLIS_ARTIFACT, "application/gzip").as_bytes(),
            ),
        ),
        ("index", with(0, &[2, 0], index().as_bytes())),
        ("index-arm64", with(0, &[0, 1], index().as_bytes())),
        ("index-no-arm", with(0, &[0, 2], index().as_bytes())),
        ("not-json", with(0, &[3, 0], b"{\"schemaVersion\":2,")),
        // Built: schema 2, an OCI media type, one zstd layer with a digest.
        ("built-image", with(1, &[0, 0, 1, 3, 2, 0, 1, 1, 0], &[])),
        (
            "built-index",
            with(1, &[1, 2, 0, 1, 8 | 4 | 2 | 1, 2, 2, 3, 0, 0], &[]),
        ),
        (
            "built-long-type",
            with(
                1,
                &[
                    0, 5, 0, 2, 6, 3, 5, 9, b'x', b'y', b'z', b'"', b'\\', 0, 0, 0xff,
                ],
                &[],
            ),
        ),
    ];
    let responses: [(&str, &[u8]); 7] = [
        ("sized", b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Type: application/vnd.oci.image.manifest.v1+json\r\n\r\nhello"),
        ("chunked", b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5;a=b\r\nhello\r\n3\r\n wo\r\n0\r\nX: y\r\n\r\n"),
        ("until-close", b"HTTP/1.0 200 OK\r\n\r\nall of it"),
        ("interim", b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 204 No Content\r\n\r\n"),
        ("error-document", b"HTTP/1.1 404 Not Found\r\nContent-Type: application/json\r\nContent-Length: 96\r\n\r\n{\"errors\":[{\"code\":\"MANIFEST_UNKNOWN\",\"message\":\"manifest unknown\"},{\"code\":\"DENIED\"},{}]}\n\n\n"),
        ("conflicting-length", b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\nhello!"),
        ("gzip-coding", b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n0\r\n\r\n"),
    ];
    for (name, bytes) in responses {
        out.push((name, with(2, &[16, 0, 1], bytes)));
    }
    let payload = b"GPT header, partitions, an EFI system partition and a root filesystem";
    for (name, flags) in [
        ("framed-sized", 0u8),
        ("framed-chunked", 2 | 16 | 32),
        ("framed-odd", 1 | 2 | 4 | 8 | 64),
        ("framed-cut", 2 | 128),
    ] {
        let mut input = lp(payload);
        input.extend_from_slice(&[flags, 2, 7, 1, 30, 40, 0, 3]);
        out.push((name, with(3, &[], &input)));
    }
    let text: Vec<u8> = (0..3000u32)
        .map(|i| b"abcdefgh\n"[(i % 9) as usize] ^ (i / 700) as u8)
        .collect();
    let mut blob = super::fuzz::frame(&text, true);
    blob.extend_from_slice(&0x184D_2A5Au32.to_le_bytes());
    blob.extend_from_slice(&2u32.to_le_bytes());
    blob.extend_from_slice(b"zz");
    blob.extend(super::fuzz::frame(&text[..100], false));
    out.push(("zstd-frames", with(4, &[9], &blob)));
    out.push((
        "zstd-garbage",
        with(4, &[0], b"\x28\xb5\x2f\xfd\x00\xf8\x01\x00\x00"),
    ));
    for (name, flags) in [("zstd-stored", 2u8), ("zstd-fastest", 1 | 2 | 0x30)] {
        let mut input = lp(&text[..1500]);
        input.extend_from_slice(&[flags, 0xe8, 0x03, 0x90, 0x01, 5]);
        out.push((name, with(5, &[], &input)));
    }
    out.into_iter().map(|(n, d)| (n.to_string(), d)).collect()
}
