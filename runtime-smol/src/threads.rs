//! Running a program on a multi-threaded smol executor: one thread per
//! core, each doing the program's [`Housekeeping`] periodically.

use std::future::Future;
use std::sync::Arc;

use metropolis_transport::runtime::Housekeeping;

use crate::rt::SmolRuntime;

/// Drives `future` on the current thread, with `housekeeping` alongside.
fn block_on_with<T>(housekeeping: Option<Housekeeping>, future: impl Future<Output = T>) -> T {
    match housekeeping {
        Some(h) => smol::block_on(smol::future::or(future, run_forever(h))),
        None => smol::block_on(future),
    }
}

/// Runs `h` forever on the polling thread (hence any output type).
async fn run_forever<T>(h: Housekeeping) -> T {
    loop {
        smol::Timer::after(h.every).await;
        (h.run)();
    }
}

/// Runs the future `main` makes to completion on a new smol executor
/// driven by one thread per core (the calling thread among them), each
/// doing `housekeeping` periodically. Fails only when a thread cannot be
/// started.
pub fn block_on<T, F>(
    housekeeping: Option<Housekeeping>,
    main: impl FnOnce(SmolRuntime) -> F,
) -> std::io::Result<T>
where
    F: Future<Output = T>,
{
    let executor = Arc::new(smol::Executor::new());
    let threads = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1);
    let (stop, stopped) = smol::channel::unbounded::<()>();
    let mut workers = Vec::new();
    let spawned = (|| {
        for i in 0..threads.saturating_sub(1) {
            let (ex, stopped) = (executor.clone(), stopped.clone());
            let worker = std::thread::Builder::new()
                .name(format!("metropolis-smol-{i}"))
                .spawn(move || block_on_with(housekeeping, ex.run(stopped.recv())))?;
            workers.push(worker);
        }
        Ok::<_, std::io::Error>(())
    })();
    let result = spawned.map(|()| {
        let future = main(SmolRuntime::on(executor.clone()));
        block_on_with(housekeeping, executor.run(future))
    });
    drop(stop);
    for w in workers {
        let _ = w.join();
    }
    result
}
