//! Splitting the bytes read from `trace_pipe` into the lines a session
//! delivers as `TraceEvent.raw_line`s: pure, so the host's reader thread
//! (`metropolis_node::tracefs::pipe`) and the fuzz harness share it.

/// Longest line kept waiting for its newline, in bytes.
pub const MAX_LINE: usize = 64 * 1024;

/// Splits a byte stream into lines, keeping a partial last line.
///
/// Lines are split at `\n` (not included in the line). A partial line at
/// the end of a [`push`](Self::push) is kept until its newline arrives,
/// unless it then exceeds the limit ([`MAX_LINE`] bytes unless set by
/// [`with_max_line`](Self::with_max_line)): it is delivered as it is,
/// so a line is at most the limit plus one push long. Invalid UTF-8 is
/// replaced (U+FFFD) in each line on its own.
#[derive(Debug)]
pub struct LineSplitter {
    partial: Vec<u8>,
    max_line: usize,
}

impl Default for LineSplitter {
    fn default() -> LineSplitter {
        LineSplitter::with_max_line(MAX_LINE)
    }
}

impl LineSplitter {
    /// A splitter with nothing pending, keeping partial lines up to
    /// [`MAX_LINE`] bytes.
    pub fn new() -> LineSplitter {
        LineSplitter::default()
    }

    /// A splitter with nothing pending, keeping partial lines up to
    /// `max_line` bytes (0: a partial line is delivered at the end of the
    /// push that left it). The fuzz harness uses small limits, so that
    /// lines around the limit need small inputs.
    pub fn with_max_line(max_line: usize) -> LineSplitter {
        LineSplitter {
            partial: Vec::new(),
            max_line,
        }
    }

    /// The longest partial line kept waiting for its newline, in bytes.
    pub fn max_line(&self) -> usize {
        self.max_line
    }

    /// Adds `bytes`; calls `line` with each completed line (without its
    /// newline), in order. Bytes after the last newline stay pending,
    /// unless they exceed [`max_line`](Self::max_line).
    pub fn push(&mut self, bytes: &[u8], mut line: impl FnMut(String)) {
        let mut rest = bytes;
        while let Some(i) = rest.iter().position(|&b| b == b'\n') {
            self.partial.extend_from_slice(&rest[..i]);
            line(String::from_utf8_lossy(&self.partial).into_owned());
            self.partial.clear();
            rest = &rest[i + 1..];
        }
        self.partial.extend_from_slice(rest);
        if self.partial.len() > self.max_line {
            line(String::from_utf8_lossy(&self.partial).into_owned());
            self.partial.clear();
        }
    }

    /// The pending partial line, if any (at the end of the input).
    pub fn finish(&mut self) -> Option<String> {
        if self.partial.is_empty() {
            return None;
        }
        let s = String::from_utf8_lossy(&self.partial).into_owned();
        self.partial.clear();
        Some(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn split(chunks: &[&[u8]]) -> (Vec<String>, Option<String>) {
        let mut s = LineSplitter::new();
        let mut lines = Vec::new();
        for c in chunks {
            s.push(c, |l| lines.push(l));
        }
        (lines, s.finish())
    }

    #[test]
    fn partial_lines_wait_for_their_newline() {
        let (lines, rest) = split(&[b"ab", b"c\nde", b"f\n\ng", b"h"]);
        assert_eq!(lines, ["abc", "def", ""]);
        assert_eq!(rest.as_deref(), Some("gh"));
        let (lines, rest) = split(&[b"x\n"]);
        assert_eq!(lines, ["x"]);
        assert_eq!(rest, None);
    }

    #[test]
    fn overlong_and_invalid_lines() {
        let long = vec![b'a'; MAX_LINE + 1];
        let (lines, rest) = split(&[&long, b"b\n"]);
        assert_eq!(lines.len(), 2);
        assert_eq!(lines[0].len(), MAX_LINE + 1);
        assert_eq!(lines[1], "b");
        assert_eq!(rest, None);
        let (lines, _) = split(&[b"\xff\xfe ok\n"]);
        assert_eq!(lines, ["\u{fffd}\u{fffd} ok"]);
    }

    #[test]
    fn a_smaller_limit() {
        let mut s = LineSplitter::with_max_line(4);
        assert_eq!(s.max_line(), 4);
        assert_eq!(LineSplitter::new().max_line(), MAX_LINE);
        let mut lines = Vec::new();
        s.push(b"abcd", |l| lines.push(l));
        assert!(lines.is_empty(), "a line at the limit waits");
        s.push(b"e", |l| lines.push(l));
        s.push(b"f\n", |l| lines.push(l));
        assert_eq!(lines, ["abcde", "f"]);
        let mut s = LineSplitter::with_max_line(0);
        let mut lines = Vec::new();
        s.push(b"x\ny", |l| lines.push(l));
        assert_eq!(lines, ["x", "y"]);
        assert_eq!(s.finish(), None);
    }
}
