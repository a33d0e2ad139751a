//! What a finished command left, for the tests that run the programs as
//! a user would: its output as text, its exit status asserted.

use std::path::Path;
use std::process::Output;

/// `out`'s standard output, as text.
pub fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).to_string()
}

/// `out`'s standard error, as text.
pub fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).to_string()
}

/// Asserts that `out` exited with `code` (the message names `what` and
/// shows both outputs); returns its standard error.
pub fn exits(out: &Output, code: i32, what: &str) -> String {
    assert_eq!(
        out.status.code(),
        Some(code),
        "{what}: stdout {} stderr {}",
        stdout(out),
        stderr(out)
    );
    stderr(out)
}

/// `p` as an argument (test paths are UTF-8).
#[allow(clippy::unwrap_used)]
pub fn path(p: &Path) -> &str {
    p.to_str().unwrap()
}
