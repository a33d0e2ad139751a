//! Streaming zstd decompression of a whole blob: every frame in turn
//! (concatenated frames are one stream, as the zstd format specifies),
//! skippable frames skipped, each frame's content checksum verified when
//! it carries one, and windows above [`MAX_WINDOW_BYTES`] refused so that
//! memory stays bounded whatever the blob says.

use std::io::{self, BufRead, Read};

use ruzstd::decoding::errors::{FrameDecoderError, ReadFrameHeaderError};
use ruzstd::decoding::{BlockDecodingStrategy, FrameDecoder};

/// The largest zstd window accepted (libzstd's default decompression
/// limit, `windowLogMax` 27): a frame needing more is refused before any
/// allocation.
pub(crate) const MAX_WINDOW_BYTES: u64 = 128 * 1024 * 1024;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    /// A frame header, or the end of the blob, is next.
    Header,
    /// Inside a frame.
    Frame,
    /// The blob ended after a complete frame.
    Done,
}

/// Decompresses the zstd frames read from `source`. Malformed data is an
/// error of kind `InvalidData`; errors of `source` surface as they are or
/// wrapped by the decoder (callers that need to tell them apart record
/// them in the source).
pub(crate) struct ZstdReader<R> {
    source: R,
    decoder: FrameDecoder,
    state: State,
    frames: u64,
}

impl<R: BufRead> ZstdReader<R> {
    /// A reader decompressing `source`.
    pub(crate) fn new(source: R) -> Self {
        let mut decoder = FrameDecoder::new();
        decoder.set_max_window_size(MAX_WINDOW_BYTES);
        ZstdReader {
            source,
            decoder,
            state: State::Header,
            frames: 0,
        }
    }

    /// The source, mutably (reading from it corrupts the stream).
    pub(crate) fn source_mut(&mut self) -> &mut R {
        &mut self.source
    }

    fn next_frame(&mut self) -> io::Result<()> {
        if self.source.fill_buf()?.is_empty() {
            if self.frames == 0 {
                return Err(invalid("the blob contains no zstd frame".to_string()));
            }
            self.state = State::Done;
            return Ok(());
        }
        match self.decoder.reset(&mut self.source) {
            Ok(()) => {
                self.state = State::Frame;
                Ok(())
            }
            Err(FrameDecoderError::ReadFrameHeaderError(ReadFrameHeaderError::SkipFrame {
                length,
                ..
            })) => {
                let length = u64::from(length);
                let skipped = io::copy(&mut self.source.by_ref().take(length), &mut io::sink())?;
                if skipped < length {
                    return Err(invalid("truncated skippable frame".to_string()));
                }
                Ok(())
            }
            Err(e) => Err(decode_error(self.frames, e)),
        }
    }

    /// Ends a finished frame whose content was all read.
    fn end_frame(&mut self) -> io::Result<()> {
        if let (Some(stored), Some(computed)) = (
            self.decoder.get_checksum_from_data(),
            self.decoder.get_calculated_checksum(),
        ) && stored != computed
        {
            return Err(invalid(format!(
                "frame {}: content checksum mismatch (frame says {stored:#010x}, content has {computed:#010x})",
                self.frames
            )));
        }
        self.frames += 1;
        self.state = State::Header;
        Ok(())
    }
}

fn invalid(problem: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, problem)
}

fn decode_error(frame: u64, e: FrameDecoderError) -> io::Error {
    invalid(format!("frame {frame}: {e}"))
}

impl<R: BufRead> Read for ZstdReader<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        loop {
            match self.state {
                State::Done => return Ok(0),
                State::Header => self.next_frame()?,
                State::Frame => {
                    while self.decoder.can_collect() == 0 && !self.decoder.is_finished() {
                        self.decoder
                            .decode_blocks(&mut self.source, BlockDecodingStrategy::UptoBlocks(1))
                            .map_err(|e| decode_error(self.frames, e))?;
                    }
                    let read = self.decoder.read(buf)?;
                    if read > 0 {
                        return Ok(read);
                    }
                    if self.decoder.is_finished() && self.decoder.can_collect() == 0 {
                        self.end_frame()?;
                    }
                }
            }
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use ruzstd::encoding::{CompressionLevel, compress_to_vec};

    fn decompress(data: &[u8]) -> io::Result<Vec<u8>> {
        let mut out = Vec::new();
        // A small read size exercises the frame state machine.
        let mut reader = ZstdReader::new(io::BufReader::with_capacity(7, data));
        let mut buf = [0u8; 1000];
        loop {
            let read = reader.read(&mut buf)?;
            if read == 0 {
                return Ok(out);
            }
            out.extend_from_slice(&buf[..read]);
        }
    }

    fn sample(len: usize) -> Vec<u8> {
        (0..len)
            .map(|i| (i * 7 % 251) as u8 ^ (i / 1000) as u8)
            .collect()
    }

    #[test]
    fn one_frame() {
        let data = sample(300_000);
        let compressed = compress_to_vec(&data[..], CompressionLevel::Fastest);
        assert!(compressed.len() < data.len());
        assert_eq!(decompress(&compressed).unwrap(), data);
    }

    #[test]
    fn concatenated_and_skippable_frames() {
        let a = sample(10_000);
        let b = sample(20_000);
        let mut blob = compress_to_vec(&a[..], CompressionLevel::Fastest);
        // A skippable frame: magic 0x184D2A5?, little-endian length, payload.
        blob.extend_from_slice(&0x184D_2A53u32.to_le_bytes());
        blob.extend_from_slice(&3u32.to_le_bytes());
        blob.extend_from_slice(b"xyz");
        blob.extend(compress_to_vec(&b[..], CompressionLevel::Uncompressed));
        let mut expected = a;
        expected.extend(b);
        assert_eq!(decompress(&blob).unwrap(), expected);
    }

    #[test]
    fn corrupt_data_is_an_error() {
        let data = sample(50_000);
        let good = compress_to_vec(&data[..], CompressionLevel::Fastest);

        let mut bad_checksum = good.clone();
        let last = bad_checksum.len() - 1;
        bad_checksum[last] ^= 0xff;
        let err = decompress(&bad_checksum).unwrap_err();
        assert!(err.to_string().contains("checksum"), "{err}");

        let truncated = &good[..good.len() / 2];
        assert!(decompress(truncated).is_err());
        assert!(decompress(b"not zstd at all").is_err());
        assert!(decompress(b"").is_err());
        let mut trailing = good.clone();
        trailing.extend_from_slice(b"junk");
        assert!(decompress(&trailing).is_err());
    }

    #[test]
    fn huge_windows_are_refused() {
        // Frame header: magic, descriptor 0 (no single segment, no
        // checksum), window descriptor 0xF8 (exponent 31: a 2 GiB window).
        let mut frame = 0xFD2F_B528u32.to_le_bytes().to_vec();
        frame.extend_from_slice(&[0x00, 0xF8]);
        frame.extend_from_slice(&[0x01, 0x00, 0x00]);
        let err = decompress(&frame).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidData);
    }
}
