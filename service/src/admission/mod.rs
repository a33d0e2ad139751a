//! What a caller can make a listener hold while it sends a request:
//! a size limit per gRPC message, per method, and one byte budget shared by
//! every request message being received on a listener at once.
//!
//! The [`Router`](super::Router) wraps every request body it passes on (to
//! a service here, or to the leader) in an `AdmittedBody`, which reads the
//! gRPC message prefixes as the data frames arrive. A message declaring
//! more than its method's limit ends the body with OutOfRange before any of
//! it is buffered; a message the shared budget cannot cover ends it with
//! ResourceExhausted. A message's declared length is reserved from the
//! budget when its prefix arrives and returned once its last byte has
//! passed (the decoder above then holds it only while decoding) or the body
//! is dropped. So, whatever the number of callers and streams, the request
//! messages being assembled on one listener hold at most the budget.
//!
//! Callers are authenticated before their body is read (the router refuses
//! unauthorized calls trailers-only, and AgentCallback checks for an agent
//! certificate first), so the budget is what an authenticated but hostile
//! or unregistered caller can make the listener hold.

use std::collections::BTreeMap;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body as HttpBody, Frame, SizeHint};
use tonic::Status;
use tonic::body::Body;

/// Largest request message of a method without a limit of its own
/// (tonic's default).
pub const DEFAULT_MAX_MESSAGE_BYTES: usize = 4 * 1024 * 1024;

/// Default budget of request bytes being received at once on one listener.
pub const DEFAULT_IN_FLIGHT_BYTES: usize = 64 * 1024 * 1024;

/// Methods with a smaller default limit than [`DEFAULT_MAX_MESSAGE_BYTES`]:
/// their messages are a few hundred bytes to a few KiB.
pub const DEFAULT_METHOD_LIMITS: &[(&str, usize)] = &[
    (
        "/cloud.bmaas.server.api.AgentCallback/Heartbeat",
        1024 * 1024,
    ),
    (
        "/metropolis.node.core.curator.proto.api.Curator/UpdateNodeStatus",
        64 * 1024,
    ),
    (
        "/metropolis.node.core.curator.proto.api.Curator/Watch",
        64 * 1024,
    ),
];

/// Length of the gRPC message prefix: compression flag and length.
const PREFIX_LEN: usize = 5;

/// The request limits of one listener (shared by its connections).
#[derive(Clone, Debug)]
pub struct RequestLimits {
    default_max: usize,
    per_method: Arc<BTreeMap<String, usize>>,
    budget: Arc<Budget>,
}

impl Default for RequestLimits {
    fn default() -> Self {
        let per_method = DEFAULT_METHOD_LIMITS
            .iter()
            .map(|(m, n)| ((*m).to_owned(), *n))
            .collect();
        RequestLimits {
            default_max: DEFAULT_MAX_MESSAGE_BYTES,
            per_method: Arc::new(per_method),
            budget: Arc::new(Budget::new(DEFAULT_IN_FLIGHT_BYTES)),
        }
    }
}

impl RequestLimits {
    /// The defaults, with `default_max` for methods without a limit of
    /// their own.
    pub fn with_default_max(mut self, default_max: usize) -> Self {
        self.default_max = default_max;
        self
    }

    /// Sets the limit of `method` (`/package.Service/Method`).
    pub fn with_method_max(mut self, method: impl Into<String>, max: usize) -> Self {
        Arc::make_mut(&mut self.per_method).insert(method.into(), max);
        self
    }

    /// A budget of `bytes` for the messages being received at once.
    pub fn with_in_flight_bytes(mut self, bytes: usize) -> Self {
        self.budget = Arc::new(Budget::new(bytes));
        self
    }

    /// The largest request message of `method` (`/package.Service/Method`).
    pub fn max_message(&self, method: &str) -> usize {
        self.per_method
            .get(method)
            .copied()
            .unwrap_or(self.default_max)
    }

    /// Bytes of the budget reserved now (for tests and metrics).
    pub fn in_flight(&self) -> usize {
        self.budget.used.load(Ordering::Relaxed)
    }

    /// `body` of a call of `method`, held to these limits.
    pub fn admit(&self, method: &str, body: Body) -> Body {
        Body::new(AdmittedBody {
            inner: body,
            framer: Framer::new(self.max_message(method)),
            budget: self.budget.clone(),
            reserved: 0,
            failed: false,
        })
    }
}

/// A byte budget shared by the connections of a listener.
#[derive(Debug)]
struct Budget {
    limit: usize,
    used: AtomicUsize,
}

impl Budget {
    fn new(limit: usize) -> Self {
        Budget {
            limit,
            used: AtomicUsize::new(0),
        }
    }

    fn try_reserve(&self, n: usize) -> bool {
        self.used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |used| {
                used.checked_add(n).filter(|&total| total <= self.limit)
            })
            .is_ok()
    }

    fn release(&self, n: usize) {
        if n > 0 {
            self.used.fetch_sub(n, Ordering::AcqRel);
        }
    }
}

/// Where the body's bytes stand in the gRPC message framing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Framer {
    max: usize,
    /// Prefix bytes of the next message seen so far.
    prefix: [u8; PREFIX_LEN],
    prefix_len: usize,
    /// Bytes of the current message still to come.
    remaining: usize,
}

/// What one data frame did to the framing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Step {
    /// A message of this many bytes began (its prefix completed).
    Began(usize),
    /// The message that began last ended.
    Ended,
}

impl Framer {
    pub(crate) fn new(max: usize) -> Self {
        Framer {
            max,
            prefix: [0; PREFIX_LEN],
            prefix_len: 0,
            remaining: 0,
        }
    }

    /// Feeds one data frame; reports each message that begins or ends in
    /// it to `on`, and refuses a message over the limit as soon as its
    /// prefix is complete.
    pub(crate) fn feed(
        &mut self,
        mut data: &[u8],
        mut on: impl FnMut(Step) -> Result<(), Status>,
    ) -> Result<(), Status> {
        while !data.is_empty() {
            if self.remaining > 0 {
                let n = self.remaining.min(data.len());
                self.remaining -= n;
                data = &data[n..];
                if self.remaining == 0 {
                    on(Step::Ended)?;
                }
                continue;
            }
            let n = (PREFIX_LEN - self.prefix_len).min(data.len());
            self.prefix[self.prefix_len..self.prefix_len + n].copy_from_slice(&data[..n]);
            self.prefix_len += n;
            data = &data[n..];
            if self.prefix_len < PREFIX_LEN {
                break;
            }
            self.prefix_len = 0;
            let len = u32::from_be_bytes([
                self.prefix[1],
                self.prefix[2],
                self.prefix[3],
                self.prefix[4],
            ]);
            let len = usize::try_from(len).unwrap_or(usize::MAX);
            if len > self.max {
                return Err(Status::out_of_range(format!(
                    "request message too large: {len} bytes, the limit is {} bytes",
                    self.max
                )));
            }
            on(Step::Began(len))?;
            self.remaining = len;
            if len == 0 {
                on(Step::Ended)?;
            }
        }
        Ok(())
    }
}

/// A request body held to a [`RequestLimits`] (see the module docs).
struct AdmittedBody {
    inner: Body,
    framer: Framer,
    budget: Arc<Budget>,
    /// Bytes of the budget the current message holds.
    reserved: usize,
    failed: bool,
}

impl AdmittedBody {
    fn release(&mut self) {
        if self.reserved > 0 {
            self.budget.release(self.reserved);
            self.reserved = 0;
        }
    }

    fn account(&mut self, data: &[u8]) -> Result<(), Status> {
        let AdmittedBody {
            framer,
            budget,
            reserved,
            ..
        } = self;
        framer.feed(data, |step| {
            match step {
                Step::Began(len) => {
                    // The previous message is with the decoder now.
                    budget.release(std::mem::take(reserved));
                    if !budget.try_reserve(len) {
                        return Err(Status::resource_exhausted(format!(
                            "the server is receiving too many request bytes at once \
                             (a {len}-byte message does not fit the listener's budget of {} bytes); \
                             retry later",
                            budget.limit
                        )));
                    }
                    *reserved = len;
                }
                // Held until the next message begins or the body ends: a
                // unary call keeps its message until the body ends.
                Step::Ended => {}
            }
            Ok(())
        })
    }
}

impl Drop for AdmittedBody {
    fn drop(&mut self) {
        self.release();
    }
}

impl HttpBody for AdmittedBody {
    type Data = Bytes;
    type Error = Status;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Status>>> {
        let this = self.get_mut();
        if this.failed {
            return Poll::Ready(None);
        }
        let frame = match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => frame,
            other => {
                if matches!(other, Poll::Ready(_)) {
                    this.release();
                }
                return other;
            }
        };
        if let Some(data) = frame.data_ref()
            && let Err(status) = this.account(data)
        {
            this.failed = true;
            this.release();
            return Poll::Ready(Some(Err(status)));
        }
        Poll::Ready(Some(Ok(frame)))
    }

    fn is_end_stream(&self) -> bool {
        self.failed || self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests;
