//! The campaign's figures: schedules run, faults injected by kind,
//! operations, availability (the share of quarter-second windows in which
//! each writer had a write acknowledged, during faults and healing), the
//! longest stretch without an acknowledged write per fault kind, and
//! violations.

use std::collections::BTreeMap;

use crate::history::{History, Micros};
use crate::schedule::KINDS;

/// A fault as it happened: its kind and when it was in place.
#[derive(Clone, Debug)]
pub struct FaultWindow {
    /// One of [`KINDS`].
    pub kind: &'static str,
    /// When applied.
    pub start: Micros,
    /// When undone.
    pub end: Micros,
}

/// Figures summed over schedules.
#[derive(Debug, Default)]
pub struct Totals {
    /// Schedules run.
    pub schedules: u64,
    /// Faults injected, by kind.
    pub faults: BTreeMap<&'static str, u64>,
    /// Writes acknowledged.
    pub writes_ok: u64,
    /// Writes failed or given up (outcome unknown).
    pub writes_unknown: u64,
    /// Reads placed (probe and final backlogs).
    pub reads: u64,
    /// Events handed to watchers.
    pub watch_events: u64,
    /// Reconnects of watchers.
    pub reconnects: u64,
    /// Heartbeats answered.
    pub beats_ok: u64,
    /// Heartbeats failed.
    pub beats_failed: u64,
    /// Windows with an acknowledged write, and all windows.
    pub windows: (u64, u64),
    /// Longest stretch without an acknowledged write, by fault kind, in
    /// microseconds, with its seed.
    pub longest: BTreeMap<&'static str, (Micros, u64)>,
    /// Violations.
    pub violations: u64,
    /// Seeds that failed.
    pub failed_seeds: Vec<u64>,
}

const WINDOW: Micros = 250_000;
/// A stretch shorter than this is not an outage.
const GAP: Micros = 500_000;

impl Totals {
    /// Adds one schedule's figures: its history, faults, the span
    /// `from..to` (fault phase and healing), and its watchers' events and
    /// reconnects.
    pub fn add(
        &mut self,
        seed: u64,
        h: &History,
        faults: &[FaultWindow],
        (from, to): (Micros, Micros),
        (watch_events, reconnects): (u64, u64),
    ) {
        self.schedules += 1;
        for f in faults {
            *self.faults.entry(f.kind).or_default() += 1;
        }
        self.writes_ok += h.writes.iter().filter(|w| w.error.is_none()).count() as u64;
        self.writes_unknown += h.writes.iter().filter(|w| w.error.is_some()).count() as u64;
        self.reads += h.reads.len() as u64;
        self.watch_events += watch_events;
        self.reconnects += reconnects;
        self.beats_ok += h.beats.iter().filter(|b| b.ok).count() as u64;
        self.beats_failed += h.beats.iter().filter(|b| !b.ok).count() as u64;
        let span = to.saturating_sub(from);
        let windows = span / WINDOW;
        for node in 0..h.nodes.len() {
            let mut acked: Vec<Micros> = h
                .writes
                .iter()
                .filter(|w| w.node == node && w.error.is_none())
                .map(|w| w.returned)
                .filter(|&t| t >= from && t <= to)
                .collect();
            acked.sort_unstable();
            let mut hit = vec![false; usize::try_from(windows).unwrap_or(0)];
            for &t in &acked {
                if let Some(slot) = hit.get_mut(usize::try_from((t - from) / WINDOW).unwrap_or(0)) {
                    *slot = true;
                }
            }
            self.windows.0 += hit.iter().filter(|&&b| b).count() as u64;
            self.windows.1 += windows;
            let mut last = from;
            for &t in acked.iter().chain(std::iter::once(&to)) {
                let gap = t.saturating_sub(last);
                if gap >= GAP {
                    let kind = blame(faults, last);
                    let entry = self.longest.entry(kind).or_insert((0, seed));
                    if gap > entry.0 {
                        *entry = (gap, seed);
                    }
                }
                last = t;
            }
        }
    }

    /// Prints the figures.
    pub fn print(&self) {
        println!();
        println!("== figures");
        println!("schedules run        {}", self.schedules);
        let total: u64 = self.faults.values().sum();
        println!("faults injected      {total}");
        for kind in KINDS {
            let n = self.faults.get(kind).copied().unwrap_or(0);
            let longest = self
                .longest
                .get(kind)
                .map(|(us, seed)| format!("{:.1} s (seed {seed})", *us as f64 / 1e6))
                .unwrap_or_else(|| "-".into());
            println!("  {kind:<18} {n:>5}   longest without an acked write: {longest}");
        }
        if let Some((us, seed)) = self.longest.get("none") {
            println!(
                "  {:<18} {:>5}   longest without an acked write: {:.1} s (seed {seed})",
                "(no fault)",
                "",
                *us as f64 / 1e6
            );
        }
        println!(
            "writes               {} acknowledged, {} failed or unknown",
            self.writes_ok, self.writes_unknown
        );
        println!("reads (backlogs)     {}", self.reads);
        println!(
            "watch events         {} ({} reconnects)",
            self.watch_events, self.reconnects
        );
        println!(
            "heartbeats           {} answered, {} failed",
            self.beats_ok, self.beats_failed
        );
        let share = if self.windows.1 == 0 {
            0.0
        } else {
            100.0 * self.windows.0 as f64 / self.windows.1 as f64
        };
        println!("availability         {share:.1} % of 0.25 s windows had an acked write");
        println!("violations           {}", self.violations);
        if !self.failed_seeds.is_empty() {
            let seeds: Vec<String> = self.failed_seeds.iter().map(u64::to_string).collect();
            println!("failed seeds         {}", seeds.join(", "));
        }
        println!(
            "RESULT schedules={} faults={} writes_ok={} writes_unknown={} reads={} \
             availability={share:.1} violations={}",
            self.schedules, total, self.writes_ok, self.writes_unknown, self.reads, self.violations
        );
    }
}

/// The fault kind a stretch starting at `at` is blamed on: the fault in
/// place then, else the last one undone before it; `none` if neither.
fn blame(faults: &[FaultWindow], at: Micros) -> &'static str {
    faults
        .iter()
        .rfind(|f| f.start <= at + GAP && at <= f.end + 2 * GAP)
        .or_else(|| faults.iter().rfind(|f| f.end <= at))
        .map_or("none", |f| f.kind)
}
