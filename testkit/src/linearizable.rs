//! A linearizability checker for one register (Wing and Gong's search,
//! with the memoisation of Lowe and of porcupine): given the recorded
//! history of writes and reads of one key, is there a total order of the
//! operations that respects real time (an operation that returned before
//! another was called comes first) in which every read returns the value
//! of the latest write before it?
//!
//! A call whose outcome is unknown (it ended Unavailable, or its
//! connection broke) has no return: it may have taken effect at any
//! moment after it was called, or never. Its return is placed after every
//! other event, so the search may linearize it anywhere after its call,
//! and at the very end, where a write changes nothing anyone read. Reads
//! with no answer carry no information and are left out by the caller.
//!
//! Histories are checked per key (linearizability is compositional), so
//! the search stays small: the cache holds (operations linearized, value)
//! pairs already explored and never explores one twice. Unknown writes
//! would still make a failing search exponential (each may sit anywhere
//! after its call), so before searching they are narrowed by what the
//! reads saw: an unknown write of a value no read saw is left out (it can
//! go last, where it changes nothing read); one whose value no other
//! write writes, and some read saw, must take effect before the first
//! such read returned, which becomes its return. Neither changes a
//! verdict. A search
//! that still takes more than [`MAX_STEPS`] steps gives up and says so.

use std::collections::HashSet;
use std::fmt::Debug;
use std::hash::Hash;

/// One recorded operation on the register.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Op<V> {
    /// When the client called: any number that orders the history's
    /// calls and answers as they happened (a global event counter, or a
    /// time fine enough that nothing shares an instant).
    pub called: u64,
    /// When the answer arrived, on the same scale; `None` if the outcome
    /// is unknown.
    pub returned: Option<u64>,
    /// What it did.
    pub kind: OpKind<V>,
}

/// A write of a value, or a read that saw one (`None`: absent).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum OpKind<V> {
    /// Sets the register.
    Write(V),
    /// Returned the register's value.
    Read(Option<V>),
}

/// Why a history is not linearizable: the operations that could not be
/// ordered, as the search left them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NotLinearizable {
    /// The longest prefix the search could order (indices into the
    /// history).
    pub longest_order: Vec<usize>,
    /// The first operation (index) that could not follow that prefix.
    pub stuck_at: usize,
    /// Whether the search gave up after [`MAX_STEPS`] (the history may
    /// be linearizable, in an order too costly to find).
    pub gave_up: bool,
}

/// Most steps of one search.
pub const MAX_STEPS: u64 = 20_000_000;

/// One call or return event in the search's list.
#[derive(Clone, Copy)]
struct Entry {
    op: usize,
    is_call: bool,
    prev: usize,
    next: usize,
}

/// The head sentinel of the list.
const HEAD: usize = 0;
/// No entry.
const NONE: usize = usize::MAX;

/// Checks `history` of a register that holds `initial` before any write.
pub fn check<V: Clone + Eq + Hash + Debug>(
    initial: Option<V>,
    history: &[Op<V>],
) -> Result<(), NotLinearizable> {
    let (narrowed, index) = narrow(history);
    search(initial, &narrowed).map_err(|mut e| {
        e.longest_order = e.longest_order.iter().map(|&i| index[i]).collect();
        e.stuck_at = index[e.stuck_at];
        e
    })
}

/// `history` with its unknown writes narrowed (see the module's
/// documentation), and the index in `history` of each operation kept.
fn narrow<V: Clone + Eq + Hash>(history: &[Op<V>]) -> (Vec<Op<V>>, Vec<usize>) {
    let mut writers: std::collections::HashMap<&V, usize> = std::collections::HashMap::new();
    for op in history {
        if let OpKind::Write(v) = &op.kind {
            *writers.entry(v).or_default() += 1;
        }
    }
    let mut first_seen: std::collections::HashMap<&V, u64> = std::collections::HashMap::new();
    for op in history {
        if let (OpKind::Read(Some(v)), Some(ret)) = (&op.kind, op.returned) {
            let at = first_seen.entry(v).or_insert(ret);
            *at = (*at).min(ret);
        }
    }
    let mut kept = Vec::with_capacity(history.len());
    let mut index = Vec::with_capacity(history.len());
    for (i, op) in history.iter().enumerate() {
        let mut op = op.clone();
        if let (OpKind::Write(v), None) = (&op.kind, op.returned) {
            match first_seen.get(v) {
                None => continue,
                Some(&seen) if writers.get(v) == Some(&1) => {
                    op.returned = Some(seen.max(op.called));
                }
                Some(_) => {}
            }
        }
        kept.push(op);
        index.push(i);
    }
    (kept, index)
}

/// The search proper, over a narrowed history.
fn search<V: Clone + Eq + Hash + Debug>(
    initial: Option<V>,
    history: &[Op<V>],
) -> Result<(), NotLinearizable> {
    let n = history.len();
    if n == 0 {
        return Ok(());
    }
    // Events in time order; at equal times calls before returns (two
    // operations touching at one instant may be in either order).
    let unknown = history
        .iter()
        .filter_map(|o| o.returned)
        .chain(history.iter().map(|o| o.called))
        .max()
        .unwrap_or(0)
        .saturating_add(1);
    let mut events: Vec<(u64, bool, usize)> = Vec::with_capacity(2 * n);
    for (i, op) in history.iter().enumerate() {
        events.push((op.called, true, i));
        let ret = op.returned.unwrap_or(unknown).max(op.called);
        events.push((ret, false, i));
    }
    events.sort_by_key(|&(t, is_call, i)| (t, !is_call, i));
    // A doubly linked list with a sentinel at 0; `call_of[i]` and
    // `return_of[i]` locate operation i's entries.
    let mut list = Vec::with_capacity(2 * n + 1);
    list.push(Entry {
        op: NONE,
        is_call: false,
        prev: NONE,
        next: 1,
    });
    let mut call_of = vec![0; n];
    let mut return_of = vec![0; n];
    for (k, &(_, is_call, op)) in events.iter().enumerate() {
        let at = k + 1;
        list.push(Entry {
            op,
            is_call,
            prev: k,
            next: if k + 1 == events.len() { NONE } else { at + 1 },
        });
        if is_call {
            call_of[op] = at;
        } else {
            return_of[op] = at;
        }
    }

    let words = n.div_ceil(64);
    let mut linearized = vec![0u64; words];
    let mut cache: HashSet<(Vec<u64>, Option<V>)> = HashSet::new();
    // The ops linearized so far, with the value before each.
    let mut stack: Vec<(usize, Option<V>)> = Vec::new();
    let mut state = initial;
    let mut longest: Vec<usize> = Vec::new();
    let mut cursor = list[HEAD].next;
    let mut steps = 0u64;
    while list[HEAD].next != NONE {
        steps += 1;
        if steps > MAX_STEPS {
            let mut e = stuck(&longest, history, &list);
            e.gave_up = true;
            return Err(e);
        }
        if cursor == NONE {
            // Only reachable after every call was tried: nothing fits.
            return Err(stuck(&longest, history, &list));
        }
        let entry = list[cursor];
        if entry.is_call {
            let op = entry.op;
            let next_state = match &history[op].kind {
                OpKind::Write(v) => Some(Some(v.clone())),
                OpKind::Read(seen) => (*seen == state).then(|| state.clone()),
            };
            let mut advanced = false;
            if let Some(next_state) = next_state {
                linearized[op / 64] |= 1 << (op % 64);
                if cache.insert((linearized.clone(), next_state.clone())) {
                    stack.push((op, std::mem::replace(&mut state, next_state)));
                    unlink(&mut list, call_of[op]);
                    unlink(&mut list, return_of[op]);
                    if stack.len() > longest.len() {
                        longest = stack.iter().map(|&(o, _)| o).collect();
                    }
                    cursor = list[HEAD].next;
                    advanced = true;
                } else {
                    linearized[op / 64] &= !(1 << (op % 64));
                }
            }
            if !advanced {
                cursor = entry.next;
            }
        } else {
            // A return of an operation not yet linearized: the ones on the
            // stack must be ordered differently.
            let Some((op, before)) = stack.pop() else {
                return Err(stuck(&longest, history, &list));
            };
            state = before;
            linearized[op / 64] &= !(1 << (op % 64));
            relink(&mut list, return_of[op]);
            relink(&mut list, call_of[op]);
            cursor = list[call_of[op]].next;
        }
    }
    Ok(())
}

fn unlink(list: &mut [Entry], at: usize) {
    let Entry { prev, next, .. } = list[at];
    list[prev].next = next;
    if next != NONE {
        list[next].prev = prev;
    }
}

/// Undoes [`unlink`] of `at` (entries are relinked in the reverse order
/// of their unlinking, so its neighbours are as they were).
fn relink(list: &mut [Entry], at: usize) {
    let Entry { prev, next, .. } = list[at];
    list[prev].next = at;
    if next != NONE {
        list[next].prev = at;
    }
}

fn stuck<V>(longest: &[usize], history: &[Op<V>], list: &[Entry]) -> NotLinearizable {
    let done: HashSet<usize> = longest.iter().copied().collect();
    // The earliest-returning operation the longest order left out.
    let stuck_at = (0..history.len())
        .filter(|i| !done.contains(i))
        .min_by_key(|&i| (history[i].returned.unwrap_or(u64::MAX), history[i].called))
        .unwrap_or_else(|| list[HEAD].next.min(history.len().saturating_sub(1)));
    NotLinearizable {
        longest_order: longest.to_vec(),
        stuck_at,
        gave_up: false,
    }
}

/// The operations of a failed check, for a report: the stuck operation
/// and those overlapping it, one per line.
pub fn explain<V: Debug>(history: &[Op<V>], failure: &NotLinearizable) -> String {
    let stuck = &history[failure.stuck_at];
    let end = stuck.returned.unwrap_or(u64::MAX);
    let verdict = if failure.gave_up {
        "gave up after the step budget"
    } else {
        "cannot linearize"
    };
    let mut lines = vec![format!(
        "{verdict}: op {} {stuck:?} after {} ordered ops",
        failure.stuck_at,
        failure.longest_order.len()
    )];
    let last = failure.longest_order.last().map(|&i| &history[i]);
    if let Some(op) = last {
        lines.push(format!("  last ordered: {op:?}"));
    }
    for (i, op) in history.iter().enumerate() {
        let op_end = op.returned.unwrap_or(u64::MAX);
        if i != failure.stuck_at && op.called <= end && op_end >= stuck.called {
            lines.push(format!("  overlapping op {i}: {op:?}"));
        }
    }
    lines.join("\n")
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn w(call: u64, ret: Option<u64>, v: u32) -> Op<u32> {
        Op {
            called: call,
            returned: ret,
            kind: OpKind::Write(v),
        }
    }

    fn r(call: u64, ret: u64, v: Option<u32>) -> Op<u32> {
        Op {
            called: call,
            returned: Some(ret),
            kind: OpKind::Read(v),
        }
    }

    #[test]
    fn sequential_history_is_linearizable() {
        let h = [
            w(0, Some(1), 1),
            r(2, 3, Some(1)),
            w(4, Some(5), 2),
            r(6, 7, Some(2)),
        ];
        assert_eq!(check(None, &h), Ok(()));
    }

    #[test]
    fn a_stale_read_after_a_completed_write_is_not() {
        let h = [w(0, Some(1), 1), w(2, Some(3), 2), r(4, 5, Some(1))];
        let err = check(None, &h).unwrap_err();
        assert_eq!(err.stuck_at, 2, "{}", explain(&h, &err));
    }

    #[test]
    fn reading_the_initial_value_after_a_write_is_not() {
        let h = [w(0, Some(1), 1), r(2, 3, None)];
        assert!(check(None, &h).is_err());
        assert_eq!(check(None, &[r(0, 1, None)]), Ok(()));
        assert!(check(Some(7), &[r(0, 1, None)]).is_err());
    }

    #[test]
    fn concurrent_operations_may_take_either_order() {
        // The read overlaps both writes: it may see either.
        for seen in [Some(1), Some(2)] {
            let h = [w(0, Some(10), 1), w(1, Some(10), 2), r(2, 9, seen)];
            assert_eq!(check(None, &h), Ok(()), "{seen:?}");
        }
        // But two reads cannot see 2 then 1 when 1 was written first and
        // done before 2 began.
        let h = [
            w(0, Some(1), 1),
            w(2, Some(20), 2),
            r(3, 4, Some(2)),
            r(5, 6, Some(1)),
        ];
        assert!(check(None, &h).is_err());
    }

    #[test]
    fn an_unknown_write_may_or_may_not_have_happened() {
        // Never seen.
        let h = [w(0, None, 1), r(5, 6, None)];
        assert_eq!(check(None, &h), Ok(()));
        // Seen long after it was called.
        let h = [w(0, None, 1), r(5, 6, None), r(100, 101, Some(1))];
        assert_eq!(check(None, &h), Ok(()));
        // But once seen, it cannot be undone by nothing.
        let h = [w(0, None, 1), r(5, 6, Some(1)), r(7, 8, None)];
        assert!(check(None, &h).is_err());
        // Nor read before it was called.
        let h = [r(0, 1, Some(1)), w(5, None, 1)];
        assert!(check(None, &h).is_err());
    }

    #[test]
    fn a_lost_update_is_caught_among_many_operations() {
        // 200 sequential writes with reads between them; then one read
        // returns a value overwritten long ago.
        let mut h = Vec::new();
        for v in 0..200u32 {
            let t = u64::from(v) * 10;
            h.push(w(t, Some(t + 2), v));
            h.push(r(t + 3, t + 5, Some(v)));
        }
        assert_eq!(check(None, &h), Ok(()));
        h.push(r(5000, 5001, Some(150)));
        assert!(check(None, &h).is_err());
    }

    #[test]
    fn a_violation_among_many_unknown_writes_is_found_quickly() {
        // Unknown writes, each seen by a read; then a stale read.
        let mut h = Vec::new();
        for v in 0..300u32 {
            let t = u64::from(v) * 10;
            h.push(w(t, None, v));
            h.push(r(t + 3, t + 4, Some(v)));
        }
        assert_eq!(check(None, &h), Ok(()));
        h.push(r(5000, 5001, Some(3)));
        let err = check(None, &h).unwrap_err();
        assert!(!err.gave_up, "{}", explain(&h, &err));
        assert_eq!(err.stuck_at, h.len() - 1, "{}", explain(&h, &err));
    }

    #[test]
    fn an_outage_of_retried_unknown_writes_stays_cheap() {
        // A writer's calls all end unknown for a while, each sent up to
        // three times; nobody sees them; then a read of the last known
        // value and a new known write.
        let mut h = vec![w(0, Some(1), 0), r(2, 3, Some(0))];
        for v in 1..40u32 {
            let t = u64::from(v) * 10;
            for copy in 0..3 {
                h.push(w(t + copy, None, v));
            }
        }
        h.push(r(500, 501, Some(0)));
        h.push(w(502, Some(503), 40));
        h.push(r(504, 505, Some(40)));
        assert_eq!(check(None, &h), Ok(()));
        h.push(r(506, 507, Some(0)));
        let err = check(None, &h).unwrap_err();
        assert!(!err.gave_up, "{}", explain(&h, &err));
    }

    #[test]
    fn many_unknown_writes_stay_cheap() {
        // Every other write's outcome unknown, reads seeing the latest
        // known one: the cache keeps the search small.
        let mut h = Vec::new();
        for v in 0..300u32 {
            let t = u64::from(v) * 10;
            let ret = (v % 2 == 0).then_some(t + 2);
            h.push(w(t, ret, v));
            if v % 2 == 0 {
                h.push(r(t + 3, t + 4, Some(v)));
            }
        }
        assert_eq!(check(None, &h), Ok(()));
    }
}
