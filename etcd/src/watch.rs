//! Watches of a key or prefix from a revision, with etcd's compaction and
//! connection loss mapped to the port's errors, and revision order checked.

use std::time::Duration;

use etcd_client as ec;
use etcd_client::proto::PbEvent;
use futures::stream::BoxStream;
use metropolis_core::ports::WatchBatch;
use metropolis_core::store::{Event, EventKind, KeyRange, Revision, StoreError};
use tokio::sync::mpsc;

use super::Inner;
use super::convert::{describe, describe_range, header_revision, kv};

/// Watch batches buffered between the etcd task and a slow reader. Past
/// that, the task stops reading from etcd (gRPC flow control then holds
/// etcd's sender), so a slow reader costs bounded memory here.
const WATCH_BUFFER: usize = 16;

/// First and longest pause between attempts to resume a broken watch.
const RESUME_BACKOFF_MIN: Duration = Duration::from_millis(100);
const RESUME_BACKOFF_MAX: Duration = Duration::from_secs(1);

/// One etcd watch, read on the tokio runtime: the state behind
/// [`EtcdStore::watch`](super::EtcdStore::watch) and the election helpers.
///
/// Checks on what etcd delivers (a violation ends the watch with
/// `Unavailable` rather than hand over a history with a hole):
/// - every event is of the revision asked for or later, revisions never go
///   down within a batch, and a batch starts above the previous batch's
///   last revision (so a revision is never split, and nothing is repeated);
/// - fragments of one large response are joined before delivery.
pub(super) struct RawWatch {
    inner: std::sync::Arc<Inner>,
    stream: ec::WatchStream,
    cursor: Cursor,
    /// Events of a fragmented response, waiting for its last fragment.
    fragments: Vec<PbEvent>,
    /// Whether it ended because the stream broke (it may be resumed).
    lost: bool,
}

/// Where a watch is, and the checks on what etcd delivers.
#[derive(Debug)]
struct Cursor {
    range: KeyRange,
    /// Events of revisions below this are dropped: the revision before
    /// the one asked for, where the watch was opened (see
    /// `RawWatch::open`). 0 for a watch from "now".
    start: Revision,
    /// The last revision delivered (at first: `start - 1`, or for a watch
    /// from "now" the revision etcd created it at). Every event must be
    /// above it: one at or below it ends the watch, loudly.
    delivered: Revision,
}

impl RawWatch {
    /// Opens a watch of `range` from `start` (inclusive; 0 or less: from
    /// the next revision on). Must run on the client's runtime.
    ///
    /// etcd (before the fix of etcd-io/etcd#18089, so including Debian's
    /// 3.4.23) accepts a watch starting exactly at its compaction revision
    /// `C` but may have dropped the tombstones of revision `C`. The core
    /// contract treats `start <= C` as compacted, so the watch is opened at
    /// `start - 1`: etcd then refuses it exactly when `start <= C`,
    /// reporting `C`, and the events of revision `start - 1` are dropped
    /// here.
    pub(super) async fn open(
        inner: std::sync::Arc<Inner>,
        range: KeyRange,
        start: Revision,
    ) -> Result<RawWatch, StoreError> {
        let what = format!("watch of {} from revision {start}", describe_range(&range));
        let mut options = ec::WatchOptions::new().with_prev_key().with_fragment();
        let key = match &range {
            KeyRange::Key(k) => k.to_vec(),
            KeyRange::Prefix(p) => {
                options = options.with_prefix();
                p.to_vec()
            }
        };
        if start > 1 {
            options = options.with_start_revision(start - 1);
        } else if start == 1 {
            options = options.with_start_revision(1);
        }
        let timeout = inner.config.request_timeout;
        let mut refreshed = false;
        let (stream, created) = loop {
            let mut client = inner.watch.clone();
            let opening = client.watch(key.clone(), Some(options.clone()));
            let mut stream = match tokio::time::timeout(timeout, opening).await {
                Err(_) => return Err(inner.endpoints.timed_out(&what, timeout)),
                Ok(Err(e)) => return Err(inner.endpoints.error(&what, None, &e)),
                Ok(Ok(stream)) => stream,
            };
            // etcd answers a creation with `created` (or refuses it): wait
            // for that, so that a watch that could not be created fails here.
            let created = match tokio::time::timeout(timeout, stream.message()).await {
                Err(_) => return Err(inner.endpoints.timed_out(&what, timeout)),
                Ok(Err(e)) => return Err(inner.endpoints.error(&what, None, &e)),
                Ok(Ok(None)) => {
                    return Err(inner.endpoints.unavailable(
                        &what,
                        "the watch stream ended before the watch was created",
                    ));
                }
                Ok(Ok(Some(resp))) => resp.0,
            };
            // etcd refuses a watch whose stream carries an expired or
            // unknown token (a member restarted, or the token outlived
            // etcd's --auth-token-ttl) by canceling its creation, with
            // "invalid auth token" in the reason, instead of failing the
            // call: etcd-client does not see it, so authenticate again
            // here, once, and open the watch again.
            if created.canceled
                && created.cancel_reason.contains("invalid auth token")
                && inner.config.user.is_some()
                && !refreshed
            {
                refreshed = true;
                inner.refresh_token(&what).await?;
                continue;
            }
            break (stream, created);
        };
        if created.canceled {
            return Err(canceled(&inner, &what, &created));
        }
        if !created.created {
            return Err(inner
                .endpoints
                .unavailable(&what, "etcd did not confirm the watch's creation"));
        }
        // From "now": etcd sends the changes after the revision it created
        // the watch at, which its answer carries. Nothing is dropped then:
        // an event at or below that revision would end the watch instead.
        let (start, delivered) = if start > 0 {
            (start, start - 1)
        } else {
            let created_at = header_revision(created.header.as_ref())
                .map_err(|e| inner.endpoints.unavailable(&what, e))?;
            (0, created_at)
        };
        Ok(RawWatch {
            inner,
            stream,
            cursor: Cursor {
                range,
                start,
                delivered,
            },
            fragments: Vec::new(),
            lost: false,
        })
    }

    /// Whether the last error of [`next`](Self::next) was the stream
    /// breaking (resumable from [`resume_from`](Self::resume_from)) rather
    /// than a refusal or a broken contract.
    pub(super) fn was_lost(&self) -> bool {
        self.lost
    }

    /// The revision a resumed watch starts at.
    pub(super) fn resume_from(&self) -> Revision {
        self.cursor.delivered + 1
    }

    /// The next batch of events. After an error the watch is over.
    pub(super) async fn next(&mut self) -> Result<WatchBatch, StoreError> {
        loop {
            let resp = match self.stream.message().await {
                Ok(Some(resp)) => resp.0,
                Ok(None) => return Err(self.lost("etcd closed the watch stream")),
                Err(e) => return Err(self.lost(describe(&e))),
            };
            if resp.canceled {
                let what = self.what();
                return Err(canceled(&self.inner, &what, &resp));
            }
            if resp.fragment {
                self.fragments.extend(resp.events);
                continue;
            }
            let mut raw = std::mem::take(&mut self.fragments);
            raw.extend(resp.events);
            let header = header_revision(resp.header.as_ref()).unwrap_or(0);
            match self.cursor.accept(raw, header) {
                Ok(Some(batch)) => return Ok(batch),
                Ok(None) => {}
                Err(why) => {
                    let what = self.what();
                    return Err(self.inner.endpoints.unavailable(&what, why));
                }
            }
        }
    }

    fn what(&self) -> String {
        format!(
            "watch of {} (delivered up to revision {})",
            describe_range(&self.cursor.range),
            self.cursor.delivered
        )
    }

    /// `Unavailable` for a watch cut off by the connection or etcd.
    fn lost(&mut self, cause: impl std::fmt::Display) -> StoreError {
        self.lost = true;
        self.fragments.clear();
        let what = self.what();
        self.inner.endpoints.unavailable(
            &what,
            format_args!(
                "{cause}; watch again from revision {} to resume",
                self.cursor.delivered + 1
            ),
        )
    }
}

impl Cursor {
    /// Converts and checks the events of one (whole) response: the batch
    /// to deliver, `None` if no event is left once those below `start` are
    /// dropped (or it had none: a progress notification), or why the
    /// response breaks the watch's guarantees.
    fn accept(
        &mut self,
        raw: Vec<PbEvent>,
        header: Revision,
    ) -> Result<Option<WatchBatch>, String> {
        let mut events = Vec::with_capacity(raw.len());
        let mut last = self.delivered;
        for e in raw {
            let event = self.event(e)?;
            let rev = event.kv.mod_revision;
            if rev < self.start {
                continue;
            }
            // A batch starts past the last delivered revision; within a
            // batch, revisions do not go down.
            if (events.is_empty() && rev <= last) || rev < last {
                return Err(format!(
                    "event of revision {rev} after revision {last}: \
                     etcd's events are out of order or repeated"
                ));
            }
            last = rev;
            events.push(event);
        }
        if events.is_empty() {
            return Ok(None);
        }
        self.delivered = last;
        Ok(Some(WatchBatch {
            events,
            revision: header.max(last),
        }))
    }

    /// A core event of an etcd one.
    fn event(&self, e: PbEvent) -> Result<Event, String> {
        let kind = match e.r#type {
            0 => EventKind::Put,
            1 => EventKind::Delete,
            other => return Err(format!("event of unknown type {other}")),
        };
        let Some(current) = e.kv else {
            return Err("event without a key-value".into());
        };
        let current = kv(current);
        if !self.range.contains(&current.key) {
            return Err(format!(
                "event for key \"{}\" outside the watched range",
                current.key.escape_ascii()
            ));
        }
        Ok(Event {
            kind,
            kv: current,
            prev_kv: e.prev_kv.map(kv),
        })
    }
}

/// The error of a watch etcd canceled: compaction, or something else
/// (e.g. "no leader" for a member cut off from its cluster).
fn canceled(inner: &Inner, what: &str, resp: &etcd_client::proto::PbWatchResponse) -> StoreError {
    if resp.compact_revision > 0 {
        // etcd keeps revision `compact_revision` itself, but may have lost
        // its tombstones (see `RawWatch::open`): as in the core contract,
        // the first revision available is the one after it.
        StoreError::Compacted {
            compact_revision: resp.compact_revision,
        }
    } else if resp.cancel_reason.is_empty() {
        inner
            .endpoints
            .unavailable(what, "etcd canceled the watch without saying why")
    } else {
        inner.endpoints.unavailable(
            what,
            format_args!("etcd canceled the watch: {}", resp.cancel_reason),
        )
    }
}

/// A stream of a watch run by a task on the client's runtime: batches in
/// order, then at most one error, then the end. A watch whose stream
/// broke, or that could not be opened, is opened again from the revision
/// after the last one delivered, with backoff, for up to
/// [`EtcdConfig::watch_resume`](super::EtcdConfig::watch_resume) (so a
/// member restart costs no error); compaction meanwhile ends it with
/// `Compacted`.
pub(super) fn spawn(
    inner: std::sync::Arc<Inner>,
    exec: &super::exec::Exec,
    range: KeyRange,
    start: Revision,
) -> BoxStream<'static, Result<WatchBatch, StoreError>> {
    let (tx, rx) = mpsc::channel(WATCH_BUFFER);
    exec.spawn(async move {
        let run = async {
            let resume_for = inner.config.watch_resume;
            let mut start = start;
            // When the current outage began; `None` while connected.
            let mut outage: Option<tokio::time::Instant> = None;
            let mut backoff = RESUME_BACKOFF_MIN;
            loop {
                let mut watch = match RawWatch::open(inner.clone(), range.clone(), start).await {
                    Ok(watch) => watch,
                    Err(e @ StoreError::Unavailable(_)) => {
                        // Opening failed (first or resuming): an outage
                        // too, retried within the same window.
                        let since = outage.get_or_insert_with(tokio::time::Instant::now);
                        if since.elapsed() >= resume_for {
                            return Err(e);
                        }
                        tokio::time::sleep(backoff).await;
                        backoff = (backoff * 2).min(RESUME_BACKOFF_MAX);
                        continue;
                    }
                    Err(e) => return Err(e),
                };
                if outage.take().is_some() {
                    tracing::info!(from = start, "etcd watch (re)opened after an outage");
                }
                backoff = RESUME_BACKOFF_MIN;
                loop {
                    match watch.next().await {
                        Ok(batch) => {
                            if tx.send(Ok(batch)).await.is_err() {
                                return Ok(());
                            }
                        }
                        Err(e) if watch.was_lost() && !resume_for.is_zero() => {
                            tracing::warn!(error = %e, "etcd watch broke; resuming");
                            start = watch.resume_from();
                            outage = Some(tokio::time::Instant::now());
                            break;
                        }
                        Err(e) => return Err(e),
                    }
                }
            }
        };
        let result: Result<(), StoreError> = tokio::select! {
            result = run => result,
            () = tx.closed() => Ok(()),
        };
        if let Err(e) = result {
            let _ = tx.send(Err(e)).await;
        }
    });
    exec.stream(rx)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use bytes::Bytes;
    use etcd_client::proto::PbKeyValue;

    use super::*;

    fn cursor(start: Revision) -> Cursor {
        Cursor {
            range: KeyRange::Prefix(Bytes::from_static(b"a/")),
            start,
            delivered: start - 1,
        }
    }

    fn ev(kind: i32, key: &str, rev: Revision) -> PbEvent {
        PbEvent {
            r#type: kind,
            kv: Some(PbKeyValue {
                key: key.as_bytes().to_vec(),
                mod_revision: rev,
                ..PbKeyValue::default()
            }),
            prev_kv: None,
        }
    }

    fn revs(batch: &WatchBatch) -> Vec<Revision> {
        batch.events.iter().map(|e| e.kv.mod_revision).collect()
    }

    #[test]
    fn events_before_start_are_dropped_and_the_rest_delivered_in_order() {
        let mut c = cursor(5);
        // The revision before `start` (the watch opens there) is dropped.
        let b = c
            .accept(vec![ev(0, "a/1", 4), ev(0, "a/1", 5), ev(1, "a/2", 5)], 6)
            .unwrap()
            .unwrap();
        assert_eq!(revs(&b), vec![5, 5]);
        assert_eq!(b.revision, 6);
        assert_eq!(b.events[1].kind, EventKind::Delete);
        assert_eq!(c.delivered, 5);
        // Only dropped events, or none (progress): nothing to deliver.
        assert_eq!(cursor(5).accept(vec![ev(0, "a/1", 4)], 4), Ok(None));
        assert_eq!(c.accept(vec![], 9), Ok(None));
        let b = c.accept(vec![ev(0, "a/3", 7)], 0).unwrap().unwrap();
        assert_eq!(b.revision, 7, "never below the last event");
    }

    #[test]
    fn a_watch_from_now_drops_nothing_and_refuses_the_past() {
        let mut c = Cursor {
            range: KeyRange::Prefix(Bytes::from_static(b"a/")),
            start: 0,
            delivered: 7,
        };
        let err = c.accept(vec![ev(0, "a/1", 7)], 8).unwrap_err();
        assert!(err.contains("revision 7 after revision 7"), "{err}");
        let b = c.accept(vec![ev(0, "a/1", 8)], 8).unwrap().unwrap();
        assert_eq!(revs(&b), vec![8]);
    }

    #[test]
    fn repeated_split_or_reordered_revisions_end_the_watch() {
        let mut c = cursor(5);
        c.accept(vec![ev(0, "a/1", 6)], 6).unwrap();
        // A revision already delivered (repeated, or split across batches).
        let err = c.accept(vec![ev(0, "a/2", 6)], 7).unwrap_err();
        assert!(err.contains("revision 6 after revision 6"), "{err}");
        // Going down within a batch.
        let err = cursor(5)
            .accept(vec![ev(0, "a/1", 8), ev(0, "a/2", 7)], 8)
            .unwrap_err();
        assert!(err.contains("out of order"), "{err}");
    }

    #[test]
    fn malformed_events_end_the_watch() {
        assert!(
            cursor(1)
                .accept(vec![ev(7, "a/1", 2)], 2)
                .unwrap_err()
                .contains("unknown type 7")
        );
        let no_kv = PbEvent {
            r#type: 0,
            kv: None,
            prev_kv: None,
        };
        assert!(cursor(1).accept(vec![no_kv], 2).is_err());
        let err = cursor(1).accept(vec![ev(0, "b/1", 2)], 2).unwrap_err();
        assert!(err.contains("outside the watched range"), "{err}");
    }
}
