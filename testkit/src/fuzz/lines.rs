//! `trace_pipe_lines`: the [`LineSplitter`] the tracefs reader thread
//! feeds with what each `read` of `trace_pipe` returned: lines split
//! across reads, empty lines, lines over [`MAX_LINE`], invalid UTF-8
//! (also split mid-character).
//!
//! Input: pushes until the input ends, each a kind byte: `% 4` is 0 or
//! 1: the next `u16`-length-prefixed bytes; 2: a run of the next byte,
//! `u32 % (2 * MAX_LINE + 2)` long (lines around the limit without huge
//! inputs); 3: the end of the stream ([`LineSplitter::finish`]), after
//! which the splitter is used again.
//!
//! Checked against a model of the documented behaviour written another
//! way (the push split at every `\n` with `slice::split`: each newline
//! delivers the pending bytes; a pending line is cut at the end of a push
//! once it holds more than `MAX_LINE` bytes): the same lines, in
//! order, each exactly the lossy UTF-8 of its bytes; so the lines'
//! bytes, with a newline at each newline cut, are the input's bytes. No
//! line holds a newline or is longer than `MAX_LINE` plus the push that
//! completed it; `finish` gives the pending bytes once, and nothing when
//! none are pending.

use metropolis_core::trace::{LineSplitter, MAX_LINE};

use super::input::Input;

/// The model: the raw bytes of each line it delivers.
#[derive(Default)]
struct Model {
    pending: Vec<u8>,
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
        if self.pending.len() > MAX_LINE {
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
    let mut splitter = LineSplitter::new();
    let mut model = Model::default();
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
            let n = input.u32() as usize % (2 * MAX_LINE + 2);
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
                line.len() <= MAX_LINE + bytes.len(),
                "a {}-byte line",
                line.len()
            );
        }
        check(push, &got, &expected);
    }
}
