//! The view's state fed backlogs and updates by hand.

use metropolis_proto::prelude::{common, curator};

use super::{Applied, ViewState};
use crate::view::NodeEvent;

fn node(id: &str, address: &str) -> curator::Node {
    curator::Node {
        id: id.into(),
        status: Some(common::NodeStatus {
            external_address: address.into(),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn event(nodes: &[curator::Node], tombstones: &[&str], last: bool) -> curator::WatchEvent {
    curator::WatchEvent {
        nodes: nodes.to_vec(),
        node_tombstones: tombstones
            .iter()
            .map(|id| curator::watch_event::NodeTombstone {
                node_id: id.to_string(),
            })
            .collect(),
        progress: if last {
            curator::watch_event::Progress::LastBacklogged as i32
        } else {
            0
        },
    }
}

/// Feeds `events` to `state`; what it handed out.
fn feed(state: &mut ViewState, events: Vec<curator::WatchEvent>) -> Vec<NodeEvent> {
    let mut out = Vec::new();
    for e in events {
        state.handle(e, &mut out);
    }
    out
}

fn changed(n: &curator::Node) -> NodeEvent {
    NodeEvent::Changed(n.clone())
}

/// A view synced on a stream with nodes `a` at 1 and `b` at 1.
fn synced() -> ViewState {
    let mut s = ViewState::new(None);
    s.opened();
    let out = feed(
        &mut s,
        vec![event(&[node("a", "1"), node("b", "1")], &[], true)],
    );
    assert_eq!(
        out,
        [
            changed(&node("a", "1")),
            changed(&node("b", "1")),
            NodeEvent::Synced
        ]
    );
    s
}

#[test]
fn the_first_backlog_is_handed_out_whole_then_synced() {
    let mut s = ViewState::new(None);
    s.opened();
    // Split over events: nothing until the marker.
    let mut out = Vec::new();
    assert_eq!(
        s.handle(event(&[node("a", "1")], &[], false), &mut out),
        Applied::Same
    );
    assert!(out.is_empty(), "{out:?}");
    let applied = s.handle(event(&[node("b", "1")], &[], true), &mut out);
    assert_eq!(applied, Applied::BacklogDone);
    assert_eq!(
        out,
        [
            changed(&node("a", "1")),
            changed(&node("b", "1")),
            NodeEvent::Synced
        ]
    );
    // An empty cluster syncs too.
    let mut empty = ViewState::new(None);
    empty.opened();
    assert_eq!(
        feed(&mut empty, vec![event(&[], &[], true)]),
        [NodeEvent::Synced]
    );
}

#[test]
fn updates_pass_on_and_duplicate_states_are_suppressed() {
    let mut s = synced();
    let out = feed(
        &mut s,
        vec![
            event(&[node("a", "2")], &[], false),
            // The same state again (coalescing, a repeated event).
            event(&[node("a", "2")], &[], false),
            event(&[node("b", "1")], &[], false),
            event(&[node("c", "1")], &["b"], false),
            // A tombstone of a node not held: nothing.
            event(&[], &["b", "zz"], false),
        ],
    );
    assert_eq!(
        out,
        [
            changed(&node("a", "2")),
            changed(&node("c", "1")),
            NodeEvent::Removed("b".into()),
        ]
    );
}

#[test]
fn an_unchanged_node_after_a_reconnect_emits_nothing() {
    let mut s = synced();
    s.closed();
    s.opened();
    let out = feed(
        &mut s,
        vec![event(&[node("a", "1"), node("b", "1")], &[], true)],
    );
    assert_eq!(out, [NodeEvent::Resynced]);
}

#[test]
fn a_node_vanished_while_away_is_removed_and_changes_are_the_difference() {
    let mut s = synced();
    s.closed();
    s.opened();
    let out = feed(
        &mut s,
        vec![
            event(&[node("a", "1")], &[], false),
            event(&[node("c", "1"), node("a", "7")], &[], true),
        ],
    );
    assert_eq!(
        out,
        [
            changed(&node("a", "7")),
            changed(&node("c", "1")),
            NodeEvent::Removed("b".into()),
            NodeEvent::Resynced,
        ]
    );
    assert_eq!(s.held().len(), 2);
}

#[test]
fn a_broken_stream_hands_out_nothing_of_its_partial_backlog() {
    let mut s = synced();
    s.closed();
    s.opened();
    // Half a backlog, then the stream breaks.
    assert!(feed(&mut s, vec![event(&[node("a", "9")], &[], false)]).is_empty());
    s.closed();
    // Events of the abandoned stream are dropped.
    let mut out = Vec::new();
    assert_eq!(
        s.handle(event(&[node("a", "9")], &[], true), &mut out),
        Applied::Dropped
    );
    assert!(out.is_empty());
    // The next stream's backlog alone counts: a at 1 as held, b gone.
    s.opened();
    let out = feed(&mut s, vec![event(&[node("a", "1")], &[], true)]);
    assert_eq!(out, [NodeEvent::Removed("b".into()), NodeEvent::Resynced]);
}

#[test]
fn a_first_stream_that_breaks_before_its_marker_syncs_on_the_next() {
    let mut s = ViewState::new(None);
    s.opened();
    assert!(feed(&mut s, vec![event(&[node("a", "1")], &[], false)]).is_empty());
    s.closed();
    s.opened();
    let out = feed(&mut s, vec![event(&[node("a", "2")], &[], true)]);
    assert_eq!(out, [changed(&node("a", "2")), NodeEvent::Synced]);
}

#[test]
fn a_view_of_one_node_keeps_only_that_node() {
    let mut s = ViewState::new(Some("b".into()));
    s.opened();
    let out = feed(
        &mut s,
        vec![
            event(&[node("a", "1"), node("b", "1")], &[], true),
            event(&[node("a", "2")], &["a"], false),
            event(&[node("b", "2")], &[], false),
            event(&[], &["b"], false),
            // Re-created: handed out again.
            event(&[node("b", "3")], &[], false),
        ],
    );
    assert_eq!(
        out,
        [
            changed(&node("b", "1")),
            NodeEvent::Synced,
            changed(&node("b", "2")),
            NodeEvent::Removed("b".into()),
            changed(&node("b", "3")),
        ]
    );
    // Absent from the next backlog: removed; other nodes ignored.
    s.closed();
    s.opened();
    let out = feed(&mut s, vec![event(&[node("a", "5")], &[], true)]);
    assert_eq!(out, [NodeEvent::Removed("b".into()), NodeEvent::Resynced]);
}

#[test]
fn a_second_marker_on_one_stream_is_an_update() {
    let mut s = synced();
    let out = feed(
        &mut s,
        vec![event(&[node("a", "1"), node("b", "2")], &[], true)],
    );
    assert_eq!(out, [changed(&node("b", "2"))]);
}
