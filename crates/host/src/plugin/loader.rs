//! The load queue: loads (compile, describe) run on a few threads of the
//! runtime's own, never on an async worker, and wait for one in a bounded
//! queue. A load that finds the queue full, or that no loader picks up
//! within the wait, is refused at once (the caller answers "busy, retry"),
//! so a burst of slow components delays only other loads, never requests.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc::{Receiver, SyncSender, TrySendError};
use std::sync::{Arc, Mutex};
use std::time::Duration;

type Job = Box<dyn FnOnce() + Send>;

/// Why a load did not run to its end.
#[derive(Debug)]
pub(crate) enum NotRun {
    /// The queue was full, or no loader picked it up in time: `queued`
    /// loads were waiting or running.
    Busy { queued: usize },
    /// The load panicked (a host bug): its thread survived.
    Panicked,
}

/// The loader threads and their queue.
#[derive(Debug)]
pub(crate) struct Loader {
    queue: SyncSender<Job>,
    /// Loads queued or running.
    pending: Arc<AtomicUsize>,
}

impl Loader {
    /// Start `threads` loaders over a queue of `capacity` loads.
    pub fn start(threads: usize, capacity: usize) -> std::io::Result<Self> {
        let (queue, jobs) = std::sync::mpsc::sync_channel::<Job>(capacity);
        let jobs = Arc::new(Mutex::new(jobs));
        for _ in 0..threads {
            let jobs = jobs.clone();
            std::thread::Builder::new()
                .name("plugin-loader".into())
                .spawn(move || {
                    lower_priority();
                    serve(&jobs)
                })?;
        }
        Ok(Self {
            queue,
            pending: Arc::new(AtomicUsize::new(0)),
        })
    }

    /// Run `load` on a loader thread, waiting at most `wait` for one to
    /// pick it up; then its result, however long it runs (its own limits
    /// bound it).
    pub async fn run<T: Send + 'static>(
        &self,
        load: impl FnOnce() -> T + Send + 'static,
        wait: Duration,
    ) -> Result<T, NotRun> {
        let (started, on_start) = tokio::sync::oneshot::channel::<()>();
        let (done, on_done) = tokio::sync::oneshot::channel::<T>();
        let given_up = Arc::new(AtomicBool::new(false));
        let pending = self.pending.clone();
        pending.fetch_add(1, Ordering::SeqCst);
        let job: Job = {
            let given_up = given_up.clone();
            let pending = pending.clone();
            Box::new(move || {
                struct Done(Arc<AtomicUsize>);
                impl Drop for Done {
                    fn drop(&mut self) {
                        self.0.fetch_sub(1, Ordering::SeqCst);
                    }
                }
                let _done = Done(pending);
                // The caller answered "busy" already: nobody waits for it.
                if given_up.load(Ordering::SeqCst) || started.send(()).is_err() {
                    return;
                }
                let _ = done.send(load());
            })
        };
        if let Err(e) = self.queue.try_send(job) {
            // The job (and its count) is dropped unrun.
            let queued = pending.fetch_sub(1, Ordering::SeqCst) - 1;
            drop(match e {
                TrySendError::Full(job) | TrySendError::Disconnected(job) => job,
            });
            return Err(NotRun::Busy { queued });
        }
        match tokio::time::timeout(wait, on_start).await {
            Ok(Ok(())) => on_done.await.map_err(|_| NotRun::Panicked),
            _ => {
                given_up.store(true, Ordering::SeqCst);
                Err(NotRun::Busy {
                    queued: pending.load(Ordering::SeqCst),
                })
            }
        }
    }
}

/// Lower this thread's CPU priority: loads (compiles waited for, `describe`
/// calls that loop to their deadline) yield to the threads serving requests.
#[allow(unsafe_code)]
fn lower_priority() {
    #[cfg(target_os = "linux")]
    {
        // SAFETY: gettid has no preconditions; setpriority changes only the
        // scheduling priority of this thread (Linux applies PRIO_PROCESS to
        // a thread id). Failing is harmless.
        unsafe {
            let tid = libc::gettid();
            let _ = libc::setpriority(libc::PRIO_PROCESS, tid as libc::id_t, 10);
        }
    }
}

/// A loader thread: runs jobs until the queue's sender is gone; a job that
/// panics does not end it.
fn serve(jobs: &Mutex<Receiver<Job>>) {
    loop {
        let job = match jobs.lock().unwrap_or_else(|p| p.into_inner()).recv() {
            Ok(job) => job,
            Err(_) => return,
        };
        let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(job));
    }
}
