use std::io::Read as _;

use base64::Engine as _;
use sha2::{Digest as _, Sha256};

use super::encode::encode;
use super::format::{Compression, Kind, name_problem};
use super::reference::{Reference, parse};

#[test]
fn references() {
    let r = parse("http://127.0.0.1:5000/os/metropolis:v1").expect("valid");
    assert_eq!(
        r,
        Reference {
            scheme: "http",
            host: "127.0.0.1:5000".into(),
            repository: "os/metropolis".into(),
            tag: Some("v1".into()),
        }
    );
    let r = parse("registry.example/a.b__c--d/e").expect("valid");
    assert_eq!((r.scheme, r.tag), ("https", None));
    assert!(parse("https://[::1]:443/x:1.0_rc-2").is_ok());
    for bad in [
        "ftp://h/r",
        "h",
        "/r",
        "h:0/r",
        "h:x/r",
        "h/R",
        "h/r:",
        "h/r:.x",
        "h/r@sha256:00",
        "h/a..b",
        "h/a/",
        "h/_a",
        "[zz]/r",
    ] {
        let e = parse(bad).expect_err(bad);
        assert!(e.starts_with("REFERENCE "), "{e}");
    }
}

#[test]
fn payload_names() {
    for good in ["kernel.efi", "system", "a", "A-1_b.c", &"x".repeat(80)] {
        assert_eq!(name_problem(good), None, "{good}");
    }
    for bad in ["", ".a", "_a", "a.", "a/b", "a b", "é", &"x".repeat(81)] {
        assert!(name_problem(bad).is_some(), "{bad:?}");
    }
}

fn hashes(data: &[u8], chunk: usize) -> Vec<String> {
    data.chunks(chunk)
        .map(|c| base64::engine::general_purpose::STANDARD_NO_PAD.encode(Sha256::digest(c)))
        .collect()
}

#[test]
fn payloads_are_hashed_by_chunk_and_compressed_as_one_frame() {
    let data: Vec<u8> = (0..300_000u32)
        .map(|i| (i % 251) as u8 ^ (i >> 12) as u8)
        .collect();
    for (chunk, compression) in [
        (65_536, Compression::Zstd),
        (100_000, Compression::None),
        (1, Compression::None),
        (300_000, Compression::Zstd),
    ] {
        let mut blob = Vec::new();
        let hidden = indicatif::ProgressBar::hidden();
        let e =
            encode("system", &data[..], &mut blob, chunk, compression, hidden).expect("encoded");
        assert_eq!(e.payload.size, data.len() as u64);
        assert_eq!(e.payload.chunk_hashes, hashes(&data, chunk as usize));
        assert_eq!(e.blob_size, blob.len() as u64);
        assert_eq!(
            e.digest,
            super::format::digest_of(&Sha256::digest(&blob)),
            "the blob's digest"
        );
        let back = match compression {
            Compression::None => blob,
            Compression::Zstd => {
                assert!(blob.len() < data.len() / 2, "compressed");
                let mut decoder = zstd::stream::read::Decoder::with_buffer(&blob[..])
                    .expect("a zstd decoder")
                    .single_frame();
                let mut out = Vec::new();
                decoder.read_to_end(&mut out).expect("decodes");
                assert!(decoder.finish().is_empty(), "one frame, nothing after it");
                out
            }
        };
        assert_eq!(back, data);
    }
}

#[test]
fn read_and_write_errors_are_returned_not_panics() {
    struct Failing;
    impl std::io::Read for Failing {
        fn read(&mut self, _: &mut [u8]) -> std::io::Result<usize> {
            Err(std::io::Error::other("disk gone"))
        }
    }
    impl std::io::Write for Failing {
        fn write(&mut self, _: &[u8]) -> std::io::Result<usize> {
            Err(std::io::Error::other("disk full"))
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    for compression in [Compression::Zstd, Compression::None] {
        let hidden = indicatif::ProgressBar::hidden;
        let mut sink = Vec::new();
        let r = encode("disk", Failing, &mut sink, 16, compression, hidden());
        assert!(
            matches!(r, Err(super::encode::EncodeError::Read(_))),
            "{r:?}"
        );
        let data = vec![7u8; 1 << 20];
        let r = encode("disk", &data[..], Failing, 16, compression, hidden());
        assert!(
            matches!(r, Err(super::encode::EncodeError::Write(_))),
            "{r:?}"
        );
    }
}

#[test]
fn kinds_name_their_payloads() {
    assert_eq!(Kind::Metropolis.payloads(), ["kernel.efi", "system"]);
    assert_eq!(Kind::Disk.payloads(), ["disk"]);
    assert_eq!(
        Kind::Disk.artifact_type(),
        "application/vnd.metropolis-rs.os.disk-image.v1"
    );
}
