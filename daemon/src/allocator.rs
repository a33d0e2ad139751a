//! The allocator of the daemon binaries: mimalloc, configured.
//!
//! Measured with `metropolis-load` on this project's 2-core machine
//! (the measurement is in `README.md` at `8256aeb`): under glibc's malloc an `UpdateNodeStatus` spent
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
//! Two more things kept the memory of a burst (1,000 `Watch` streams
//! opening, 50 backlogs of 250 KB in flight) after the daemon went idle,
//! and made the figure swing between 8 and 19 KiB per idle stream from
//! run to run:
//!
//! - mimalloc asks for transparent huge pages on its arenas, so the
//!   resident size moved in 2 MiB steps (26 of 56 MB were huge pages in
//!   one run). [`configure`] turns them off for the process
//!   (`PR_SET_THP_DISABLE`; mimalloc's own option comes too late, its
//!   first arena is reserved before `main`): the daemon's heap is tens of
//!   MB, too small for the TLB to matter.
//! - A thread's freed pages are purged only by that thread, when it
//!   allocates or collects after the delay; an idle worker does neither.
//!   [`release_idle_memory`], called when a worker runs out of work, forces
//!   a collection (at most every [`RELEASE_INTERVAL`] per thread), and
//!   the tokio runtime's idle nudge
//!   (`metropolis_runtime_tokio::threads::block_on`) wakes the workers that
//!   often so the last burst is
//!   released too. Idle-stream RSS after both: 5.0-5.5 KiB in three runs,
//!   against 15-23 KiB with only the huge pages off.
//!
//! A binary uses it with
//!
//! ```no_run
//! #[global_allocator]
//! static ALLOCATOR: metropolisd::allocator::MiMalloc =
//!     metropolisd::allocator::MiMalloc;
//!
//! fn main() {
//!     metropolisd::allocator::configure();
//!     // ...
//! }
//! ```

use std::cell::Cell;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

pub use mimalloc::MiMalloc;

/// How long freed memory stays with mimalloc before it is returned to the
/// system, in milliseconds.
pub const PURGE_DELAY_MS: i64 = 50;

/// `mi_option_purge_delay` in the `mi_option_e` of the mimalloc version
/// libmimalloc-sys builds (v3), which names no constant for it. The test
/// below checks it against that version's default.
const MI_OPTION_PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;

/// The least time between two forced collections by one thread in
/// [`release_idle_memory`], and the period at which the daemon nudges its
/// workers (`metropolis_runtime_tokio::threads::block_on`).
pub const RELEASE_INTERVAL: Duration = Duration::from_millis(100);

/// Whether [`configure`] ran, i.e. the binary allocates with mimalloc.
static CONFIGURED: AtomicBool = AtomicBool::new(false);

/// Sets mimalloc's options for a daemon and turns transparent huge pages
/// off for the process. Call it first thing in `main`.
pub fn configure() {
    // SAFETY: `mi_option_set` stores a value in mimalloc's option table and
    // has no other precondition; the index is that of the purge delay in
    // the bundled mimalloc (tested below), and any value is valid for it.
    unsafe { libmimalloc_sys::mi_option_set(MI_OPTION_PURGE_DELAY, PURGE_DELAY_MS as _) }
    // Fails only on kernels older than 3.15, where the resident size is
    // then merely coarser.
    let _ = rustix::thread::disable_transparent_huge_pages(true);
    CONFIGURED.store(true, Ordering::Relaxed);
}

/// Whether [`configure`] ran: the binary declared mimalloc its allocator,
/// so the runtimes should call [`release_idle_memory`] when idle.
pub fn is_configured() -> bool {
    CONFIGURED.load(Ordering::Relaxed)
}

/// Makes mimalloc return what the calling thread freed to the system now
/// rather than when the thread next allocates (an idle thread may not for
/// hours). Meant for a runtime's "worker is about to sleep" hook (tokio's
/// `on_thread_park`), which under load runs thousands of times a second:
/// a thread collects at most once per [`RELEASE_INTERVAL`] (a forced
/// collection costs about 16 µs and page faults when the memory is needed
/// again), so the runtime's idle nudge (`metropolis_runtime_tokio::threads`) is what
/// releases the last burst.
pub fn release_idle_memory() {
    thread_local!(static LAST: Cell<Option<Instant>> = const { Cell::new(None) });
    let now = Instant::now();
    if !collection_due(LAST.get(), now) {
        return;
    }
    LAST.set(Some(now));
    // SAFETY: `mi_collect` only operates on the calling thread's heap and
    // mimalloc's shared arenas (which it locks); no precondition.
    unsafe { libmimalloc_sys::mi_collect(true) }
}

/// Whether a thread that last collected at `last` should collect at `now`.
fn collection_due(last: Option<Instant>, now: Instant) -> bool {
    last.is_none_or(|last| now.saturating_duration_since(last) >= RELEASE_INTERVAL)
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
        assert!(is_configured());
        assert_eq!(
            rustix::thread::transparent_huge_pages_are_disabled().ok(),
            Some(true)
        );
    }

    #[test]
    fn collections_are_rate_limited_per_interval() {
        let t = Instant::now();
        assert!(collection_due(None, t));
        assert!(!collection_due(Some(t), t));
        assert!(!collection_due(Some(t), t + RELEASE_INTERVAL / 2));
        assert!(collection_due(Some(t), t + RELEASE_INTERVAL));
        // A clock read before `last` (another core) is not due.
        assert!(!collection_due(Some(t + RELEASE_INTERVAL), t));
    }

    /// Resident anonymous memory of this process, in KiB.
    fn rss_anon_kib() -> u64 {
        let status = std::fs::read_to_string("/proc/self/status").expect("Linux /proc");
        let line = status
            .lines()
            .find(|l| l.starts_with("RssAnon:"))
            .expect("a RssAnon line");
        line.split_whitespace()
            .nth(1)
            .and_then(|v| v.parse().ok())
            .expect("a number of kB")
    }

    #[test]
    fn a_released_thread_returns_what_it_freed_before_the_purge_delay() {
        // On a thread of its own, so that the rate limit starts fresh.
        std::thread::spawn(|| {
            const BLOCKS: usize = 8 << 10;
            const BLOCK: usize = 4 << 10; // 32 MiB in all
            let blocks: Vec<*mut u8> = (0..BLOCKS)
                .map(|_| {
                    // SAFETY: plain allocation; the pointer is checked below.
                    let p = unsafe { libmimalloc_sys::mi_malloc(BLOCK) }.cast::<u8>();
                    assert!(!p.is_null(), "mimalloc out of memory");
                    // SAFETY: `p` points to BLOCK writable bytes just allocated.
                    unsafe { std::ptr::write_bytes(p, 1, BLOCK) };
                    p
                })
                .collect();
            for p in blocks {
                // SAFETY: each pointer came from `mi_malloc` and is freed once.
                unsafe { libmimalloc_sys::mi_free(p.cast()) };
            }
            let freed = rss_anon_kib();
            release_idle_memory();
            let released = rss_anon_kib();
            // Other tests allocate meanwhile; most of the 32 MiB must go.
            assert!(
                released + 16 * 1024 < freed,
                "RssAnon {freed} KiB after freeing, {released} KiB after release_idle_memory"
            );
        })
        .join()
        .expect("the test thread");
    }
}
