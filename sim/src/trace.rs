//! Trace sessions: a client of each node's debug service starts
//! [`TraceSession`]s on the global buffer or a fresh instance, reads lines,
//! cancels (at any moment, also while an operation is outstanding) or
//! hits a pipe error, over the in-memory tracefs of the test kit
//! whose operations fail at a seeded rate. Every finished session must
//! have restored tracefs, unless a teardown step failed and said so.

use std::time::Duration;

use metropolis_core::trace::{
    Action, FailureKind, InstanceName, State, Target, TraceSession, TracefsFailure,
};
use metropolis_proto::prelude::debug;
use metropolis_testkit::tracefs::{FakeTracefs, Op};

use crate::canary::Canary;
use crate::ctx::Ctx;
use crate::net::Time;

const TRACERS: [&str; 5] = ["blk", "function_graph", "nop", "function", "bogus"];
const KINDS: [FailureKind; 5] = [
    FailureKind::NotFound,
    FailureKind::NotPermitted,
    FailureKind::Rejected,
    FailureKind::Busy,
    FailureKind::Other,
];

#[derive(Debug)]
struct Running {
    id: u64,
    session: TraceSession,
    /// The outstanding action and when its result comes back.
    outstanding: Option<(Action, Time)>,
    /// When the client cancels.
    cancel_at: Time,
    /// Where the log of the fake stood when the session started.
    log_start: usize,
    lines: u64,
    events: u64,
}

/// The trace client and tracefs of one node.
#[derive(Debug)]
pub struct TraceDriver {
    /// The node's tracefs.
    pub fs: FakeTracefs,
    sessions: Vec<Running>,
    /// Whether new sessions still start.
    pub active: bool,
    /// Sessions finished (for the report).
    pub finished: u64,
}

impl Default for TraceDriver {
    fn default() -> Self {
        Self::new()
    }
}

impl TraceDriver {
    /// A node with a fresh tracefs.
    pub fn new() -> TraceDriver {
        TraceDriver {
            fs: FakeTracefs::new(),
            sessions: Vec::new(),
            active: true,
            finished: 0,
        }
    }

    /// Whether no session runs.
    pub fn idle(&self) -> bool {
        self.sessions.is_empty()
    }

    fn start(&mut self, ctx: &mut Ctx<'_>) {
        let global_busy = self
            .sessions
            .iter()
            .any(|r| *r.session.target() == Target::Global);
        let id = ctx.fresh_id();
        let target = if global_busy || ctx.rng.chance(0.5) {
            match InstanceName::new(&format!("sim{id}")) {
                Ok(name) => Target::Instance(name),
                Err(e) => return ctx.checks.fail(format!("instance name refused: {e}")),
            }
        } else {
            Target::Global
        };
        let pick = |ctx: &mut Ctx<'_>| -> Vec<String> {
            (0..ctx.rng.below(3))
                .map(|i| {
                    if ctx.rng.chance(0.1) {
                        "nomatch".to_string()
                    } else {
                        format!("vfs_{i}*")
                    }
                })
                .collect()
        };
        let request = debug::TraceRequest {
            tracer: TRACERS[ctx.rng.index(TRACERS.len())].to_string(),
            function_filter: pick(ctx),
            graph_function_filter: pick(ctx),
        };
        let session = match TraceSession::from_request(&request, target) {
            Ok(s) => s,
            Err(e) => return ctx.checks.fail(format!("valid trace request refused: {e}")),
        };
        let cancel_at = ctx.now + ctx.rng.range(0, 3_000_000);
        self.sessions.push(Running {
            id,
            session,
            outstanding: None,
            cancel_at,
            log_start: self.fs.log.len(),
            lines: 0,
            events: 0,
        });
    }

    /// Timer: starts sessions, completes operations, feeds lines,
    /// cancels, and checks finished sessions.
    pub fn tick(&mut self, ctx: &mut Ctx<'_>, fail: f64) {
        if self.active && self.sessions.len() < 2 && ctx.rng.chance(0.3) {
            self.start(ctx);
        }
        let mut i = 0;
        while i < self.sessions.len() {
            self.step(ctx, i, fail);
            if self.sessions[i].session.is_finished() {
                let r = self.sessions.remove(i);
                self.check_finished(ctx, &r);
                self.finished += 1;
            } else {
                i += 1;
            }
        }
        let ms = ctx.rng.range(5, 50);
        ctx.wake_in(Duration::from_millis(ms));
    }

    fn step(&mut self, ctx: &mut Ctx<'_>, i: usize, fail: f64) {
        let now = ctx.now;
        let healing = ctx.healing;
        let r = &mut self.sessions[i];
        if (now >= r.cancel_at || healing) && r.session.state() != State::TearingDown {
            r.session.handle_cancel();
        }
        if let Some((action, at)) = r.outstanding.take() {
            if now < at {
                r.outstanding = Some((action, at));
                return;
            }
            let skip =
                ctx.canary == Canary::SkipTeardown && r.session.state() == State::TearingDown;
            let result = if skip {
                // Planted bug: teardown actions reported done, never performed.
                Ok(())
            } else {
                if ctx.rng.chance(fail) {
                    let kind = KINDS[ctx.rng.index(KINDS.len())];
                    self.fs.fail_at = Some((self.fs.log.len(), kind));
                }
                let result = self.fs.apply(&action);
                self.fs.fail_at = None;
                result
            };
            let r = &mut self.sessions[i];
            r.session.handle_action_result(result);
        }
        let r = &mut self.sessions[i];
        if let Some(action) = r.session.poll_action() {
            let at = now + ctx.rng.range(100, 20_000);
            r.outstanding = Some((action, at));
            return;
        }
        if r.session.state() == State::Running {
            if ctx.rng.chance(0.02) {
                r.session
                    .handle_pipe_error(TracefsFailure::new(FailureKind::Other, "sim: pipe eof"));
                return;
            }
            for _ in 0..ctx.rng.below(4) {
                r.lines += 1;
                r.session.handle_pipe_line(format!("line {}\n", r.lines));
                while r.session.poll_event().is_some() {
                    r.events += 1;
                }
            }
            if r.events != r.lines {
                ctx.checks.fail(format!(
                    "trace session {}: {} lines gave {} events",
                    r.id, r.lines, r.events
                ));
            }
        }
    }

    fn check_finished(&self, ctx: &mut Ctx<'_>, r: &Running) {
        if !r.session.teardown_failures().is_empty() {
            // A failed teardown step is reported; tracefs may stay dirty.
            return;
        }
        let target = r.session.target();
        // A write counts once it opened the file (a failure to open it,
        // NotFound or NotPermitted, changed nothing).
        let touched = |file: &str| {
            self.fs.log[r.log_start..].iter().any(|Op { action: a, result: res, .. }| {
                matches!(a, Action::Write { file: f, .. } if *f == target.file(file))
                    && !matches!(res, Err(e) if matches!(e.kind, FailureKind::NotFound | FailureKind::NotPermitted))
            })
        };
        let opened = self.fs.log[r.log_start..].iter().any(
            |Op {
                 action: a,
                 result: res,
                 ..
             }| {
                matches!(a, Action::OpenPipe { file } if *file == target.file("trace_pipe"))
                    && res.is_ok()
            },
        );
        let problem = match target {
            Target::Instance(name) => {
                let created = self.fs.log[r.log_start..].iter().any(
                    |Op {
                         action: a,
                         result: res,
                         ..
                     }| {
                        matches!(a, Action::Mkdir { dir } if *dir == format!("instances/{name}"))
                            && res.is_ok()
                    },
                );
                (created && self.fs.instances.contains_key(name.as_str()))
                    .then(|| format!("instance {name} left behind"))
            }
            Target::Global => {
                let b = &self.fs.global;
                if b.tracing_on {
                    Some("tracing left on".to_string())
                } else if b.tracer != "nop" {
                    Some(format!("tracer left at {}", b.tracer))
                } else if b.pipe_open && opened {
                    Some("trace_pipe left open".to_string())
                } else if touched("set_ftrace_filter") && !b.filter.is_empty() {
                    Some(format!("filter left at {:?}", b.filter))
                } else if touched("set_graph_function") && !b.graph.is_empty() {
                    Some(format!("graph filter left at {:?}", b.graph))
                } else {
                    None
                }
            }
        };
        if let Some(problem) = problem {
            let log: Vec<String> = self.fs.log[r.log_start..]
                .iter()
                .map(
                    |Op {
                         action: a,
                         result: res,
                         ..
                     }| {
                        format!("{a} -> {}", if res.is_ok() { "ok" } else { "failed" })
                    },
                )
                .collect();
            ctx.checks.fail(format!(
                "trace session {} on {target} ended without restoring tracefs: {problem}; \
                 tracefs operations since it started: {log:?}",
                r.id
            ));
        }
    }
}
