//! A curator's wall clock, moved through libfaketime: every curator runs
//! with `LD_PRELOAD` of libfaketime and a timestamp file of its own
//! (`FAKETIME_TIMESTAMP_FILE`, re-read every second), which holds its
//! offset (`+0` normally). Only the wall clock moves
//! (`DONT_FAKE_MONOTONIC=1`): timers and the lease's own bookkeeping run
//! on the monotonic clock, as in production; what follows the wall clock
//! (the status timestamps the curator stamps, certificate validity, agent
//! heartbeat ages) sees the jump.

use std::path::Path;

/// Sets the offset in `file` to `seconds`.
pub fn set(file: &Path, seconds: i64) -> Result<(), String> {
    std::fs::write(file, format!("{seconds:+}\n"))
        .map_err(|e| format!("writing the clock offset to {}: {e}", file.display()))
}

/// Where Debian's `faketime` package puts the multi-threaded library.
pub fn find_library() -> Option<std::path::PathBuf> {
    [
        "/usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1",
        "/usr/lib/aarch64-linux-gnu/faketime/libfaketimeMT.so.1",
        "/usr/lib/faketime/libfaketimeMT.so.1",
        "/usr/local/lib/faketime/libfaketimeMT.so.1",
    ]
    .iter()
    .map(std::path::PathBuf::from)
    .find(|p| p.is_file())
}
