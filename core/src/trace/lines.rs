//! Splitting the bytes read from `trace_pipe` into the lines a session
//! delivers as `TraceEvent.raw_line`s: pure, so the host's reader thread
//! (`metropolis_node::tracefs::pipe`) and the fuzz harness share it.

/// Longest line kept waiting for its newline, in bytes.
pub const MAX_LINE: usize = 64 * 1024;

/// Splits a byte stream into lines, keeping a partial last line.
///
/// Lines are split at `\n` (not included in the line). A partial line at
/// the end of a [`push`](Self::push) is kept until its newline arrives,
/// unless it then exceeds [`MAX_LINE`] bytes: it is delivered as it is,
/// so a line is at most `MAX_LINE` bytes plus one push long. Invalid
/// UTF-8 is replaced (U+FFFD) in each line on its own.
#[derive(Debug, Default)]
pub struct LineSplitter {
    partial: Vec<u8>,
}

impl LineSplitter {
    /// A splitter with nothing pending.
    pub fn new() -> LineSplitter {
        LineSplitter::default()
    }

    /// Adds `bytes`; calls `line` with each completed line (without its
    /// newline), in order. Bytes after the last newline stay pending,
    /// unless they exceed [`MAX_LINE`].
    pub fn push(&mut self, bytes: &[u8], mut line: impl FnMut(String)) {
        let mut rest = bytes;
        while let Some(i) = rest.iter().position(|&b| b == b'\n') {
            self.partial.extend_from_slice(&rest[..i]);
            line(String::from_utf8_lossy(&self.partial).into_owned());
            self.partial.clear();
            rest = &rest[i + 1..];
        }
        self.partial.extend_from_slice(rest);
        if self.partial.len() > MAX_LINE {
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
}
