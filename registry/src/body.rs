//! Response bodies as RFC 9112 §6.3 frames them: none for `204`/`304`,
//! chunked when the last transfer coding is `chunked` (any other coding
//! is refused), `Content-Length` (conflicting values are refused), else
//! until the connection closes. A body that ends early is an
//! `UnexpectedEof` error, never a silently short body.

use std::io::{self, BufRead, BufReader, Read};

use crate::http::Stream;

/// The longest chunk-size or trailer line accepted.
const MAX_LINE_BYTES: u64 = 8 * 1024;

/// How the body of a response with `status` and `headers` is delimited.
pub(crate) fn framing(status: u16, headers: &[(String, String)]) -> Result<Framing, String> {
    if status == 204 || status == 304 {
        return Ok(Framing::Done);
    }
    let codings: Vec<String> = headers
        .iter()
        .filter(|(n, _)| n.eq_ignore_ascii_case("transfer-encoding"))
        .flat_map(|(_, v)| v.split(','))
        .map(|c| c.trim().to_ascii_lowercase())
        .filter(|c| !c.is_empty())
        .collect();
    if let Some(last) = codings.last() {
        return if last == "chunked" && codings.len() == 1 {
            Ok(Framing::Chunked(Chunked::Size))
        } else {
            Err(format!(
                "unsupported transfer coding {:?}",
                crate::http::bounded(&codings.join(", "))
            ))
        };
    }
    let mut length = None;
    for value in headers
        .iter()
        .filter(|(n, _)| n.eq_ignore_ascii_case("content-length"))
        .flat_map(|(_, v)| v.split(','))
    {
        let value = value.trim();
        let parsed = value
            .parse::<u64>()
            .ok()
            .filter(|_| value.bytes().all(|b| b.is_ascii_digit()))
            .ok_or_else(|| format!("malformed Content-Length {:?}", crate::http::bounded(value)))?;
        if length.is_some_and(|l| l != parsed) {
            return Err("conflicting Content-Length values".to_string());
        }
        length = Some(parsed);
    }
    Ok(match length {
        Some(0) => Framing::Done,
        Some(remaining) => Framing::Length { remaining },
        None => Framing::UntilClose,
    })
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Chunked {
    /// A chunk-size line is next.
    Size,
    /// Inside a chunk with this many bytes left.
    Data(u64),
    /// The CRLF ending a chunk's data is next.
    DataEnd,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Framing {
    Length { remaining: u64 },
    Chunked(Chunked),
    UntilClose,
    Done,
}

/// A response body; reading it yields the payload, without framing.
pub struct Body {
    reader: BufReader<Box<dyn Stream>>,
    framing: Framing,
}

impl Body {
    pub(crate) fn new(reader: BufReader<Box<dyn Stream>>, framing: Framing) -> Body {
        Body { reader, framing }
    }

    /// The bytes left, when the framing says.
    pub fn remaining(&self) -> Option<u64> {
        match self.framing {
            Framing::Length { remaining } => Some(remaining),
            Framing::Done => Some(0),
            _ => None,
        }
    }

    /// Reads at most `remaining` bytes into `buf`: how many were read and
    /// how many are left. A connection closed before is `missing`.
    fn read_within(
        &mut self,
        buf: &mut [u8],
        remaining: u64,
        missing: impl FnOnce() -> String,
    ) -> io::Result<(usize, u64)> {
        let want = buf
            .len()
            .min(usize::try_from(remaining).unwrap_or(usize::MAX));
        let read = self.reader.read(&mut buf[..want])?;
        if read == 0 {
            return Err(io::Error::new(io::ErrorKind::UnexpectedEof, missing()));
        }
        Ok((read, remaining - read as u64))
    }

    fn read_line(&mut self) -> io::Result<Vec<u8>> {
        let mut line = Vec::new();
        (&mut self.reader)
            .take(MAX_LINE_BYTES)
            .read_until(b'\n', &mut line)?;
        if !line.ends_with(b"\n") {
            return Err(if line.len() as u64 >= MAX_LINE_BYTES {
                malformed("chunked encoding line too long")
            } else {
                io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "connection closed inside the chunked body",
                )
            });
        }
        while matches!(line.last(), Some(b'\n' | b'\r')) {
            line.pop();
        }
        Ok(line)
    }
}

fn malformed(problem: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, problem.to_string())
}

/// The size of a chunk-size line (`hex[;extensions]`).
fn chunk_size(line: &[u8]) -> io::Result<u64> {
    let size = line.split(|&b| b == b';').next().unwrap_or(&[]);
    let size = size.trim_ascii();
    if size.is_empty() {
        return Err(malformed("empty chunk size"));
    }
    let mut value: u64 = 0;
    for &digit in size {
        let digit = char::from(digit)
            .to_digit(16)
            .ok_or_else(|| malformed("malformed chunk size"))?;
        value = value
            .checked_mul(16)
            .and_then(|v| v.checked_add(u64::from(digit)))
            .ok_or_else(|| malformed("chunk size overflows"))?;
    }
    Ok(value)
}

impl Read for Body {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        loop {
            match self.framing {
                Framing::Done => return Ok(0),
                Framing::UntilClose => return self.reader.read(buf),
                Framing::Length { remaining } => {
                    let (read, remaining) = self.read_within(buf, remaining, || {
                        format!("connection closed with {remaining} body bytes missing")
                    })?;
                    self.framing = if remaining == 0 {
                        Framing::Done
                    } else {
                        Framing::Length { remaining }
                    };
                    return Ok(read);
                }
                Framing::Chunked(Chunked::Size) => {
                    let size = chunk_size(&self.read_line()?)?;
                    if size == 0 {
                        // Trailer fields, up to the empty line.
                        while !self.read_line()?.is_empty() {}
                        self.framing = Framing::Done;
                    } else {
                        self.framing = Framing::Chunked(Chunked::Data(size));
                    }
                }
                Framing::Chunked(Chunked::Data(remaining)) => {
                    let (read, remaining) = self.read_within(buf, remaining, || {
                        "connection closed inside a chunk".to_string()
                    })?;
                    self.framing = Framing::Chunked(if remaining == 0 {
                        Chunked::DataEnd
                    } else {
                        Chunked::Data(remaining)
                    });
                    return Ok(read);
                }
                Framing::Chunked(Chunked::DataEnd) => {
                    if !self.read_line()?.is_empty() {
                        return Err(malformed("chunk data longer than its size"));
                    }
                    self.framing = Framing::Chunked(Chunked::Size);
                }
            }
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use std::io::{Cursor, Write};

    /// Found by the `registry_responses` fuzz target under ASan
    /// (fuzz/regressions/registry_responses/long-transfer-coding): a
    /// Transfer-Encoding or Content-Length value was quoted whole.
    #[test]
    fn framing_problems_quote_the_header_cut() {
        let long = "x".repeat(20_000);
        for header in ["transfer-encoding", "content-length"] {
            let headers = vec![(header.to_string(), long.clone())];
            let problem = framing(200, &headers).unwrap_err();
            assert!(
                problem.len() < 400,
                "{header}: a {}-byte problem",
                problem.len()
            );
        }
    }

    fn body(framing: Framing, data: &[u8]) -> Body {
        let stream: Box<dyn Stream> = Box::new(Duplex(Cursor::new(data.to_vec())));
        Body {
            reader: BufReader::new(stream),
            framing,
        }
    }

    struct Duplex(Cursor<Vec<u8>>);
    impl Read for Duplex {
        fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
            self.0.read(buf)
        }
    }
    impl Write for Duplex {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            Ok(buf.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    fn read_all(mut body: Body) -> io::Result<Vec<u8>> {
        let mut out = Vec::new();
        body.read_to_end(&mut out)?;
        Ok(out)
    }

    #[test]
    fn chunked_bodies() {
        let data = b"4;ext=1\r\nWiki\r\n5\r\npedia\r\nE\r\n in\r\n\r\nchunks.\r\n0\r\nTrailer: x\r\n\r\nNEXT";
        let out = read_all(body(Framing::Chunked(Chunked::Size), data)).unwrap();
        assert_eq!(out, b"Wikipedia in\r\n\r\nchunks.");
        assert_eq!(
            read_all(body(
                Framing::Chunked(Chunked::Size),
                b"a\nabcdefghij\n0\n\n"
            ))
            .unwrap(),
            b"abcdefghij"
        );
    }

    #[test]
    fn malformed_or_truncated_chunked_bodies() {
        for data in [
            &b"4\r\nWik"[..],
            b"4\r\nWikiX\r\n0\r\n\r\n",
            b"zz\r\nWiki\r\n",
            b"\r\n",
            b"11111111111111111\r\n",
            b"4\r\nWiki\r\n",
            b"0\r\n",
        ] {
            assert!(
                read_all(body(Framing::Chunked(Chunked::Size), data)).is_err(),
                "{:?}",
                String::from_utf8_lossy(data)
            );
        }
    }

    #[test]
    fn length_bodies() {
        let out = read_all(body(Framing::Length { remaining: 3 }, b"abcdef")).unwrap();
        assert_eq!(out, b"abc");
        let err = read_all(body(Framing::Length { remaining: 10 }, b"abc")).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::UnexpectedEof);
        let out = read_all(body(Framing::UntilClose, b"abc")).unwrap();
        assert_eq!(out, b"abc");
    }

    fn headers(list: &[(&str, &str)]) -> Vec<(String, String)> {
        list.iter()
            .map(|(n, v)| (n.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn body_framing() {
        assert_eq!(
            framing(200, &headers(&[("Content-Length", "12")])),
            Ok(Framing::Length { remaining: 12 })
        );
        assert_eq!(
            framing(200, &headers(&[("content-length", "12, 12")])),
            Ok(Framing::Length { remaining: 12 })
        );
        assert!(
            framing(
                200,
                &headers(&[("Content-Length", "12"), ("Content-Length", "13")])
            )
            .is_err()
        );
        assert!(framing(200, &headers(&[("Content-Length", "+12")])).is_err());
        assert_eq!(
            framing(
                200,
                &headers(&[("Transfer-Encoding", "Chunked"), ("Content-Length", "3")])
            ),
            Ok(Framing::Chunked(Chunked::Size))
        );
        assert!(framing(200, &headers(&[("Transfer-Encoding", "gzip, chunked")])).is_err());
        assert_eq!(framing(200, &[]), Ok(Framing::UntilClose));
        assert_eq!(
            framing(304, &headers(&[("Content-Length", "3")])),
            Ok(Framing::Done)
        );
    }
}
