//! Unary calls with retries within the caller's deadline: each attempt
//! on the endpoint that answered last (the next one after a failure),
//! bounded by the client's `call_timeout` and the time left, a little
//! less than that sent as `grpc-timeout` (so a curator without a leader
//! waits for one no longer than the caller would, and says so before the
//! attempt times out: [`server_budget`]), waits from [`Schedule`] between
//! attempts.

use std::time::{Duration, Instant};

use futures::future::{Either, select};
use tonic::client::Grpc;

use crate::client::Inner;
use crate::connection::{TransportError, origin};
use crate::error::{AttemptError, CallError};
use crate::retry::{Misconfigured, Resend, retryable_call};

/// Calls `path` with `request` until an attempt succeeds, one fails in a
/// way retrying cannot change, or `deadline` has passed. `resend`:
/// whether a request that may have reached a curator may be sent again.
pub(crate) async fn call<Req, Resp>(
    inner: &Inner,
    path: &'static str,
    request: Req,
    deadline: Duration,
    resend: Resend,
) -> Result<Resp, CallError>
where
    Req: prost::Message + Clone + Send + Sync + 'static,
    Resp: prost::Message + Default + Send + Sync + 'static,
{
    let timer = inner.runtime.timer();
    let started = Instant::now();
    let mut schedule = inner.schedule();
    let mut misconfigured = Misconfigured::new(inner.endpoints.len());
    let mut attempts = 0u32;
    let mut last = None;
    loop {
        let left = deadline.saturating_sub(started.elapsed());
        if left.is_zero() {
            return Err(CallError::DeadlineExceeded {
                deadline,
                attempts,
                last,
            });
        }
        let budget = left.min(inner.call_timeout);
        let index = inner.endpoints.current();
        attempts += 1;
        let mut generation = None;
        let attempt =
            attempt::<Req, Resp>(inner, index, path, request.clone(), budget, &mut generation);
        let outcome = match select(Box::pin(attempt), timer.sleep(budget)).await {
            Either::Left((outcome, _)) => outcome,
            Either::Right(((), _)) => Err(AttemptError::TimedOut {
                endpoint: inner.endpoints.name(index).to_string(),
                after: budget,
            }),
        };
        let failure = match outcome {
            Ok(response) => {
                inner.endpoints.answered(index);
                return Ok(response);
            }
            Err(failure) => failure,
        };
        // What no retry fixes ends the call once no endpoint is left
        // that might serve it.
        misconfigured.record(index, &failure);
        let failure = match failure {
            AttemptError::Misconfigured {
                endpoint,
                problem,
                reason,
            } if misconfigured.all() => {
                inner.endpoints.forget(index, generation);
                return Err(CallError::Misconfigured {
                    endpoint,
                    problem,
                    reason,
                });
            }
            other => other,
        };
        if !retryable_call(&failure, resend) {
            inner.endpoints.failed(index, generation, &failure);
            return Err(match failure {
                AttemptError::Status {
                    code: tonic::Code::DeadlineExceeded,
                    ..
                }
                | AttemptError::TimedOut { .. }
                | AttemptError::Broken { .. } => CallError::OutcomeUnknown { attempt: failure },
                AttemptError::Status {
                    endpoint,
                    code,
                    message,
                } => CallError::Rejected {
                    endpoint,
                    code,
                    message,
                },
                other => CallError::DeadlineExceeded {
                    deadline,
                    attempts,
                    last: Some(other),
                },
            });
        }
        tracing::debug!(attempt = attempts, error = %failure, "retrying a curator call");
        inner.endpoints.failed(index, generation, &failure);
        let wait = schedule.after(&failure);
        last = Some(failure);
        let left = deadline.saturating_sub(started.elapsed());
        if !wait.is_zero() {
            timer.sleep(wait.min(left)).await;
        }
    }
}

/// One attempt on endpoint `index`; the generation of the connection it
/// used goes to `generation`.
async fn attempt<Req, Resp>(
    inner: &Inner,
    index: usize,
    path: &'static str,
    request: Req,
    budget: Duration,
    generation: &mut Option<u64>,
) -> Result<Resp, AttemptError>
where
    Req: prost::Message + Send + Sync + 'static,
    Resp: prost::Message + Default + Send + Sync + 'static,
{
    let endpoint = inner.endpoints.name(index).to_string();
    let leased = inner.endpoints.connect(index).await?;
    *generation = Some(leased.generation);
    let mut grpc = Grpc::with_origin(leased.connection, origin());
    grpc.ready()
        .await
        .map_err(|e| transport_failure(&endpoint, &e))?;
    let mut request = tonic::Request::new(request);
    request.set_timeout(server_budget(budget));
    let codec = tonic_prost::ProstCodec::<Req, Resp>::default();
    let path = http::uri::PathAndQuery::from_static(path);
    match grpc.unary(request, path, codec).await {
        Ok(response) => Ok(response.into_inner()),
        Err(status) => Err(from_status(&endpoint, status)),
    }
}

/// The time left a request tells the server (`grpc-timeout`) for an
/// attempt the client waits `budget` for: a little less, so that a
/// curator that held the call that long for a leader answers (Unavailable,
/// retried) before the client's own timer ends the attempt as timed out,
/// which for a call that must not be sent twice would end the call with
/// its outcome unknown.
pub(crate) fn server_budget(budget: Duration) -> Duration {
    budget.saturating_sub((budget / 5).min(Duration::from_millis(250)))
}

/// The attempt failure a connection failure is.
pub(crate) fn transport_failure(endpoint: &str, e: &TransportError) -> AttemptError {
    match e.problem {
        Some(problem) => AttemptError::Misconfigured {
            endpoint: endpoint.to_string(),
            problem,
            reason: e.reason.clone(),
        },
        None => AttemptError::Broken {
            endpoint: endpoint.to_string(),
            reason: e.reason.clone(),
            sent: e.sent,
        },
    }
}

/// The attempt failure `status` is: a connection failure tonic wrapped in
/// a status, or the server's status.
pub(crate) fn from_status(endpoint: &str, status: tonic::Status) -> AttemptError {
    let transport = std::error::Error::source(&status)
        .and_then(|s| s.downcast_ref::<TransportError>())
        .cloned();
    match transport {
        Some(e) => transport_failure(endpoint, &e),
        None => AttemptError::Status {
            endpoint: endpoint.to_string(),
            code: status.code(),
            message: status.message().to_string(),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_server_is_told_a_little_less_time_than_the_client_waits() {
        assert_eq!(
            server_budget(Duration::from_secs(1)),
            Duration::from_millis(800)
        );
        assert_eq!(
            server_budget(Duration::from_secs(10)),
            Duration::from_millis(9750)
        );
        assert_eq!(
            server_budget(Duration::from_millis(100)),
            Duration::from_millis(80)
        );
    }
}
