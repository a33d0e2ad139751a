#![allow(clippy::unwrap_used)]

use std::io::{self, Read};

use sha2::{Digest as _, Sha256};

use super::*;

fn spec(data: &[u8], chunk: usize) -> PayloadSpec {
    PayloadSpec {
        name: "system".to_string(),
        size: data.len() as u64,
        chunk_size: chunk as u64,
        chunk_hashes: data
            .chunks(chunk)
            .map(|c| Sha256::digest(c).into())
            .collect(),
    }
}

fn data(len: usize) -> Vec<u8> {
    (0..len).map(|i| (i * 7 + i / 4093) as u8).collect()
}

/// Reads the whole verified payload; what was read and how it ended.
fn read_all(
    source: impl Read + Send,
    spec: &PayloadSpec,
    workers: usize,
) -> (Vec<u8>, io::Result<()>) {
    with_verified(source, spec, workers, |reader| {
        let mut out = Vec::new();
        let mut buf = vec![0u8; 100_003];
        loop {
            match reader.read(&mut buf) {
                Ok(0) => return (out, Ok(())),
                Ok(n) => out.extend_from_slice(&buf[..n]),
                Err(e) => return (out, Err(e)),
            }
        }
    })
}

#[test]
fn payloads_read_back_whole_for_any_chunking() {
    for (len, chunk) in [
        (0, 4096),
        (1, 1),
        (4096, 4096),
        (10 * 1024 * 1024 + 17, 1024 * 1024),
        (9 * 1024 * 1024, 3 * 1024 * 1024 + 5),
        (5 * 1024 * 1024 + 3, 4096),
        (100_000, 16 * 1024 * 1024),
    ] {
        let data = data(len);
        for workers in [1, 2, 4] {
            let (read, ended) = read_all(&data[..], &spec(&data, chunk), workers);
            assert!(ended.is_ok(), "{len}/{chunk}: {ended:?}");
            assert!(
                read == data,
                "{len} bytes in chunks of {chunk} read back otherwise"
            );
        }
    }
}

#[test]
fn no_byte_of_a_bad_chunk_is_handed_out() {
    let chunk = 1024 * 1024;
    let good = data(12 * chunk + 5);
    let spec = spec(&good, chunk);
    for bad in [0, 3, 7, 12] {
        let mut served = good.clone();
        served[(bad * chunk + chunk / 2).min(good.len() - 1)] ^= 1;
        for workers in [1, 2, 4] {
            let (read, ended) = read_all(&served[..], &spec, workers);
            let failure = PayloadFailure::of(ended.unwrap_err()).unwrap();
            assert!(
                matches!(failure, PayloadFailure::ChunkMismatch { chunk: c, offset }
                    if c == bad as u64 && offset == (bad * chunk) as u64),
                "{failure}"
            );
            assert!(read.len() <= bad * chunk, "{} bytes read", read.len());
            assert!(read[..] == good[..read.len()]);
            assert!(failure.to_string().contains(&format!("chunk {bad} ")));
        }
    }
}

#[test]
fn the_earliest_failure_is_reported() {
    let chunk = 4096;
    let good = data(64 * chunk);
    let spec = spec(&good, chunk);
    let mut served = good.clone();
    served[5 * chunk] ^= 1;
    served[40 * chunk] ^= 1;
    let (_, ended) = read_all(&served[..], &spec, 4);
    let failure = PayloadFailure::of(ended.unwrap_err()).unwrap();
    assert!(
        matches!(failure, PayloadFailure::ChunkMismatch { chunk: 5, .. }),
        "{failure}"
    );
}

#[test]
fn a_short_source_is_truncated_and_a_long_one_read_to_the_size_only() {
    let good = data(3 * 1024 * 1024);
    let spec = spec(&good, 1024 * 1024);
    let (read, ended) = read_all(&good[..good.len() - 10], &spec, 2);
    let failure = PayloadFailure::of(ended.unwrap_err()).unwrap();
    assert!(
        matches!(failure, PayloadFailure::Truncated { received } if received == good.len() as u64 - 10),
        "{failure}"
    );
    assert!(read.len() < good.len());

    let mut longer = good.clone();
    longer.extend_from_slice(b"trailing bytes");
    let mut source = &longer[..];
    // By reference, to see afterwards where the source was left.
    let by_ref: &mut &[u8] = &mut source;
    let (ended, read) = with_verified(by_ref, &spec, 2, |reader| {
        let mut out = Vec::new();
        (reader.read_to_end(&mut out).map(|_| ()), out)
    });
    assert!(ended.is_ok());
    assert!(read == good);
    assert_eq!(source, b"trailing bytes");
}

/// A source that fails after `good` bytes, or never ends.
struct Failing {
    left: usize,
    endless: bool,
}

impl Read for Failing {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.endless {
            buf.fill(1);
            return Ok(buf.len());
        }
        if self.left == 0 {
            return Err(io::Error::new(
                io::ErrorKind::ConnectionReset,
                "reset by peer",
            ));
        }
        let n = buf.len().min(self.left);
        buf[..n].fill(1);
        self.left -= n;
        Ok(n)
    }
}

#[test]
fn source_errors_surface_in_order_and_a_reader_may_stop_early() {
    let ones = vec![1u8; 8 * 1024 * 1024];
    let spec = spec(&ones, 1024 * 1024);
    let (read, ended) = read_all(
        Failing {
            left: 5 * 1024 * 1024 + 1,
            endless: false,
        },
        &spec,
        2,
    );
    let failure = PayloadFailure::of(ended.unwrap_err()).unwrap();
    assert!(
        matches!(&failure, PayloadFailure::Source(e) if e.kind() == io::ErrorKind::ConnectionReset)
    );
    assert!(read.len() <= 5 * 1024 * 1024);

    // A reader that gives up after one read: every thread still ends.
    let first = with_verified(
        Failing {
            left: 0,
            endless: true,
        },
        &spec,
        2,
        |reader| {
            let mut buf = [0u8; 10];
            reader.read(&mut buf).unwrap()
        },
    );
    assert_eq!(first, 10);
}

#[test]
fn whole_runs_come_in_order_and_their_buffers_go_back() {
    // More batches than the pool holds: each buffer must come back.
    let data = data(40 * 1024 * 1024 + 5);
    let spec = spec(&data, 1024 * 1024);
    let read = with_verified(&data[..], &spec, 2, |reader| {
        let recycler = reader.recycler().unwrap();
        let mut out = Vec::new();
        while let Some(run) = reader.take_run().unwrap() {
            assert_eq!(run.offset, out.len() as u64);
            out.extend_from_slice(&run.buf.as_slice()[..run.len]);
            // Fails only once the reading thread is done.
            let _ = recycler.send(run.buf);
        }
        out
    });
    assert!(read == data);

    // Taking a batch whole after part of it was read is refused.
    let refused = with_verified(&data[..], &spec, 2, |reader| {
        let mut byte = [0u8; 1];
        reader.read_exact(&mut byte).unwrap();
        reader.take_run().err()
    });
    assert!(refused.is_some());
}
