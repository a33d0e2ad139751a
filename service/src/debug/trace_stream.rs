//! Running one trace session (`metropolis_core::trace`) against a
//! [`Tracefs`] port, as a stream of `TraceEvent`s for a gRPC response.
//! Futures-only: no runtime.
//!
//! ```no_run
//! use std::sync::Arc;
//!
//! use metropolis_core::trace::{Target, TraceBuffers, Tracefs};
//! use metropolis_proto::prelude::debug;
//! use metropolis_service::debug::{TraceStream, run_session};
//! use metropolis_service::status;
//!
//! fn start_trace(
//!     port: Arc<dyn Tracefs>,
//!     buffers: &TraceBuffers,
//!     request: &debug::TraceRequest,
//! ) -> Result<TraceStream, tonic::Status> {
//!     // Or Target::Instance(buffers.fresh_instance_name()) for a buffer of
//!     // the session's own.
//!     let target = Target::Global;
//!     // A TraceError becomes the status the RPC ends with.
//!     run_session(port, buffers, target, request).map_err(|e| status::debug::trace(&e))
//! }
//! ```

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use futures::{Stream, StreamExt};
use metropolis_proto::prelude::debug;

use metropolis_core::trace::{
    Action, BufferClaim, FailureKind, State, Target, TraceBuffers, TraceError, TracePipe,
    TraceSession, TraceSpec, Tracefs, TracefsFailure,
};

/// Starts a trace session: validates `request`, claims `target` in
/// `buffers`, and performs the start of the lifecycle (see
/// [`TraceSession`]) synchronously on the calling thread.
///
/// Returns, before any event:
/// - `Err` [`TraceError::Invalid`] for a bad request (nothing written),
/// - `Err` [`TraceError::AlreadyInProgress`] when a session of `buffers`
///   holds `target` (nothing written),
/// - `Err` with the start failure (e.g. [`TraceError::TracerRefused`])
///   after the teardown has run (its failures are logged),
/// - `Ok` with the running session's stream otherwise.
///
/// Convert errors with [`status::debug::trace`](crate::status::debug::trace).
///
/// The stream yields one `TraceEvent` per `trace_pipe` line. It ends only
/// on a pipe failure: one `Err(Status)` (Unavailable, naming teardown
/// failures if any) after the teardown ran, then `None`. Dropping it (the
/// client cancelled, the server shuts down) runs the teardown
/// synchronously inside `drop`: tracefs writes are quick in-kernel
/// operations and closing the pipe is prompt (see [`TracePipe::close`]),
/// and a `Drop` is the one place guaranteed to run on every way a gRPC
/// response stream ends. The buffer's claim is released after the
/// teardown, so a next session never overlaps with this one's teardown.
///
/// The start runs on the caller's thread too (see [`Tracefs`] for how long
/// the writes take); call it where a short blocking call is acceptable.
pub fn run_session(
    port: Arc<dyn Tracefs>,
    buffers: &TraceBuffers,
    target: Target,
    request: &debug::TraceRequest,
) -> Result<TraceStream, TraceError> {
    let spec = TraceSpec::from_request(request)?;
    let claim = buffers.claim(target.clone())?;
    tracing::info!(%target, tracer = spec.tracer(), "trace session starting");
    let mut driver = Driver {
        session: TraceSession::new(spec, target),
        port,
        pipe: None,
        claim: Some(claim),
    };
    driver.drive();
    match driver.session.state() {
        State::Running => Ok(TraceStream {
            driver,
            final_error: None,
        }),
        _ => Err(driver
            .session
            .error()
            .cloned()
            .expect("a session that stops while starting and was not cancelled has an error")),
    }
}

/// The events of a running trace session; see [`run_session`].
/// Dropping it tears the session down.
pub struct TraceStream {
    driver: Driver,
    /// The status to yield once, after a pipe failure's teardown.
    final_error: Option<tonic::Status>,
}

impl TraceStream {
    /// The buffer traced into.
    pub fn target(&self) -> &Target {
        self.driver.session.target()
    }
}

impl std::fmt::Debug for TraceStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TraceStream")
            .field("session", &self.driver.session)
            .finish_non_exhaustive()
    }
}

impl Stream for TraceStream {
    type Item = Result<debug::TraceEvent, tonic::Status>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        loop {
            if let Some(event) = this.driver.session.poll_event() {
                return Poll::Ready(Some(Ok(event)));
            }
            if let Some(status) = this.final_error.take() {
                return Poll::Ready(Some(Err(status)));
            }
            if this.driver.session.is_finished() {
                return Poll::Ready(None);
            }
            let Some(pipe) = this.driver.pipe.as_mut() else {
                // Running implies an open pipe; be safe anyway.
                this.driver.pipe_failed(TracefsFailure::new(
                    FailureKind::Other,
                    "trace_pipe is not open",
                ));
                this.final_error = this.driver.final_status();
                continue;
            };
            match pipe.poll_next_unpin(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Some(Ok(line))) => this.driver.session.handle_pipe_line(line),
                Poll::Ready(Some(Err(failure))) => {
                    this.driver.pipe_failed(failure);
                    this.final_error = this.driver.final_status();
                }
                Poll::Ready(None) => {
                    this.driver.pipe_failed(TracefsFailure::new(
                        FailureKind::Other,
                        "trace_pipe ended unexpectedly",
                    ));
                    this.final_error = this.driver.final_status();
                }
            }
        }
    }
}

/// The machine, the port it runs against and what it holds.
struct Driver {
    session: TraceSession,
    port: Arc<dyn Tracefs>,
    pipe: Option<Box<dyn TracePipe>>,
    /// Released once the teardown is done.
    claim: Option<BufferClaim>,
}

impl Driver {
    /// Performs actions until the machine wants none; logs and releases the
    /// claim once it is finished.
    fn drive(&mut self) {
        while let Some(action) = self.session.poll_action() {
            let result = self.perform(&action);
            self.session.handle_action_result(result);
        }
        if self.session.is_finished() && self.claim.is_some() {
            self.log_end();
            self.pipe = None;
            self.claim = None;
        }
    }

    fn perform(&mut self, action: &Action) -> Result<(), TracefsFailure> {
        match action {
            Action::Mkdir { dir } => self.port.mkdir(dir),
            Action::Rmdir { dir } => self.port.rmdir(dir),
            Action::Write { file, value, mode } => self.port.write(file, value, *mode),
            Action::OpenPipe { file } => {
                self.pipe = Some(self.port.open_pipe(file)?);
                Ok(())
            }
            Action::ClosePipe => match self.pipe.as_mut() {
                Some(pipe) => {
                    let result = pipe.close();
                    if result.is_ok() {
                        self.pipe = None;
                    }
                    result
                }
                None => Ok(()),
            },
        }
    }

    fn pipe_failed(&mut self, failure: TracefsFailure) {
        self.session.handle_pipe_error(failure);
        self.drive();
    }

    /// The status ending the stream after a pipe failure.
    fn final_status(&self) -> Option<tonic::Status> {
        let error = self.session.error()?;
        Some(crate::status::debug::trace_ended(
            error,
            self.session.teardown_failures(),
        ))
    }

    fn log_end(&self) {
        let target = self.session.target();
        for failure in self.session.teardown_failures() {
            tracing::warn!(%target, %failure, "trace teardown step failed");
        }
        match self.session.error() {
            Some(error) => tracing::info!(%target, %error, "trace session ended"),
            None => tracing::info!(%target, "trace session ended by the client"),
        }
    }
}

impl Drop for Driver {
    fn drop(&mut self) {
        if !self.session.is_finished() && !crate::canary_planted!(SkipTeardown) {
            self.session.handle_cancel();
            self.drive();
        }
    }
}
