//! `trace_pipe_lines`: the [`LineSplitter`] the tracefs reader thread
//! feeds with what each `read` of `trace_pipe` returned: lines split
//! across reads, empty lines, lines over the limit, invalid UTF-8 (also
//! split mid-character).
//!
//! The splitter runs with a limit the input chooses,
//! [`LineSplitter::with_max_line`] below [`MAX_LINE_LIMIT`], not the
//! reader's 64 KiB [`MAX_LINE`](metropolis_core::trace::MAX_LINE): the
//! code is the same, and lines around a limit of a few hundred bytes
//! cost a few hundred bytes, where 64 KiB runs held the target to 77
//! runs/s under ASan.
//!
//! Input: a `u16`, the limit `% MAX_LINE_LIMIT`; then pushes until the
//! input ends, each a kind byte: `% 4` is 0 or 1: the next
//! `u16`-length-prefixed bytes; 2: a run of the next byte,
//! `u32 % (2 * limit + 2)` long (lines around the limit); 3: the end of
//! the stream ([`LineSplitter::finish`]), after which the splitter is
//! used again.
//!
//! Checked against a model of the documented behaviour written another
//! way (the push split at every `\n` with `slice::split`: each newline
//! delivers the pending bytes; a pending line is cut at the end of a push
//! once it holds more than the limit): the same lines, in order, each
//! exactly the lossy UTF-8 of its bytes; so the lines' bytes, with a
//! newline at each newline cut, are the input's bytes. No line holds a
//! newline or is longer than the limit plus the push that completed it;
//! `finish` gives the pending bytes once, and nothing when none are
//! pending.

use metropolis_core::trace::LineSplitter;

/// The limits the harness uses are below this, in bytes.
pub const MAX_LINE_LIMIT: u16 = 1024;

use super::input::Input;

/// The model: the raw bytes of each line it delivers.
struct Model {
    pending: Vec<u8>,
    max_line: usize,
}

impl Model {
    fn push(&mut self, bytes: &[u8], out: &mut Vec<Vec<u8>>) {
        // Whole segments, not byte by byte: runs of 128 KiB made the
        // byte-at-a-time model the target's cost (60 runs/s under ASan).
        let mut segments = bytes.split(|&b| b == b'\n');
        if let Some(first) = segments.next() {
            self.pending.extend_from_slice(first);
        }
        for segment in segments {
            out.push(std::mem::take(&mut self.pending));
            self.pending.extend_from_slice(segment);
        }
        if self.pending.len() > self.max_line {
            out.push(std::mem::take(&mut self.pending));
        }
    }
}

fn check(push: usize, got: &[String], expected: &[Vec<u8>]) {
    assert_eq!(got.len(), expected.len(), "push {push}: line count");
    for (line, bytes) in got.iter().zip(expected) {
        assert!(!line.contains('\n'), "push {push}: a line holds a newline");
        assert_eq!(
            line.as_str(),
            String::from_utf8_lossy(bytes),
            "push {push}: line differs"
        );
    }
}

/// Runs one input.
pub fn run(data: &[u8]) {
    let mut input = Input::new(data);
    let max_line = usize::from(input.u16() % MAX_LINE_LIMIT);
    let mut splitter = LineSplitter::with_max_line(max_line);
    let mut model = Model {
        pending: Vec::new(),
        max_line,
    };
    let mut run_bytes = Vec::new();
    let mut push = 0;
    while !input.is_empty() {
        push += 1;
        let kind = input.u8() % 4;
        if kind == 3 {
            let got = splitter.finish();
            let expected = std::mem::take(&mut model.pending);
            match got {
                Some(line) => {
                    assert!(!expected.is_empty(), "finish gave a line with none pending");
                    check(push, &[line], &[expected]);
                }
                None => assert!(expected.is_empty(), "finish lost {} bytes", expected.len()),
            }
            assert_eq!(
                splitter.finish(),
                None,
                "finish gave the pending line twice"
            );
            continue;
        }
        let bytes: &[u8] = if kind == 2 {
            let b = input.u8();
            let n = input.u32() as usize % (2 * max_line + 2);
            run_bytes.clear();
            run_bytes.resize(n, b);
            &run_bytes
        } else {
            input.lp()
        };
        let mut got = Vec::new();
        splitter.push(bytes, |line| got.push(line));
        let mut expected = Vec::new();
        model.push(bytes, &mut expected);
        for line in &expected {
            assert!(
                line.len() <= max_line + bytes.len(),
                "a {}-byte line",
                line.len()
            );
        }
        check(push, &got, &expected);
    }
}
