//! The allocator of the daemon binaries: mimalloc, configured.
//!
//! Measured with `metropolis-load` on this project's 2-core machine
//! (README, Performance): under glibc's malloc an `UpdateNodeStatus` spent
//! 6.8 µs in the allocator against the echo server's 2.6 (about 50
//! allocations per update, many freed on another thread than the one that
//! made them, the store's writer); with mimalloc the daemon's CPU per
//! update fell from 37-38 to 26-27 µs.
//!
//! mimalloc returns freed memory to the system only after a delay (1 s by
//! default, and only when the thread allocates again), so an idle daemon
//! kept what a burst had used: 30 KiB per idle `Watch` stream against 14.5
//! under glibc (`metropolis-load fanout --streams-per-connection 100`).
//! With a 50 ms delay: 9.3 KiB, and no change in update throughput that
//! the benchmark could show. [`configure`] sets that.
//!
//! A binary uses it with
//!
//! ```ignore
//! #[global_allocator]
//! static ALLOCATOR: metropolis_runtime_tokio::allocator::MiMalloc =
//!     metropolis_runtime_tokio::allocator::MiMalloc;
//!
//! fn main() {
//!     metropolis_runtime_tokio::allocator::configure();
//!     // ...
//! }
//! ```

pub use mimalloc::MiMalloc;

/// How long freed memory stays with mimalloc before it is returned to the
/// system, in milliseconds.
pub const PURGE_DELAY_MS: i64 = 50;

/// `mi_option_purge_delay` in the `mi_option_e` of the mimalloc version
/// libmimalloc-sys builds (v3), which names no constant for it. The test
/// below checks it against that version's default.
const MI_OPTION_PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;

/// Sets mimalloc's options for a daemon. Call it first thing in `main`.
pub fn configure() {
    // SAFETY: `mi_option_set` stores a value in mimalloc's option table and
    // has no other precondition; the index is that of the purge delay in
    // the bundled mimalloc (tested below), and any value is valid for it.
    unsafe { libmimalloc_sys::mi_option_set(MI_OPTION_PURGE_DELAY, PURGE_DELAY_MS as _) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_option_set_is_the_purge_delay() {
        // SAFETY: reading an option has no precondition.
        let default = unsafe { libmimalloc_sys::mi_option_get(MI_OPTION_PURGE_DELAY) };
        if std::env::var_os("MIMALLOC_PURGE_DELAY").is_none() {
            assert_eq!(default, 1000, "mimalloc v3's default purge delay");
        }
        configure();
        // SAFETY: as above.
        let set = unsafe { libmimalloc_sys::mi_option_get(MI_OPTION_PURGE_DELAY) };
        assert_eq!(set as i64, PURGE_DELAY_MS);
    }
}
