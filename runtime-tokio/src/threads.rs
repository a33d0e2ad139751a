//! Running a program on a multi-threaded tokio runtime whose workers do
//! the program's [`Housekeeping`] when they go idle.

use std::future::Future;
use std::time::Duration;

use metropolis_transport::runtime::Housekeeping;

use crate::rt::TokioRuntime;

/// Runs the future `main` makes to completion on a new multi-threaded
/// tokio runtime (all drivers on). With `housekeeping`, each worker runs
/// it when it parks (the function rate-limits itself) and parked workers
/// are woken that often so they run it again. Fails only when the runtime
/// cannot be built.
pub fn block_on<T, F>(
    housekeeping: Option<Housekeeping>,
    main: impl FnOnce(TokioRuntime) -> F,
) -> std::io::Result<T>
where
    F: Future<Output = T>,
{
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    builder.enable_all();
    if let Some(h) = housekeeping {
        builder.on_thread_park(h.run);
    }
    let runtime = builder.build()?;
    Ok(runtime.block_on(async {
        if let Some(h) = housekeeping {
            tokio::spawn(nudge_workers(h.every));
        }
        main(TokioRuntime::current()).await
    }))
}

/// Every `every`, spawns two empty tasks per worker, which wakes parked
/// workers (a second task queued behind the first is offered to an idle
/// worker), so each passes its park hook again. Without it, a worker that
/// went to sleep right after a burst, within its hook's rate limit, kept
/// the burst's memory.
async fn nudge_workers(every: Duration) {
    let workers = tokio::runtime::Handle::current().metrics().num_workers();
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        for _ in 0..2 * workers {
            tokio::spawn(async {});
        }
    }
}
