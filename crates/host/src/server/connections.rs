//! The server's connections: an accept loop over hyper's HTTP/1 server with
//! what `axum::serve` cannot set — a deadline for a request's head, one for
//! the wait between requests, and a cap on open connections — so that no
//! client can hold the file descriptors the stores need.
//!
//! The two deadlines are kept here rather than by hyper's
//! `header_read_timeout`: hyper starts that timer as soon as a response is
//! written, so it would also bound the wait for the next request and leave
//! no room for an idle timeout longer than the header timeout. Here a
//! connection's head must arrive within the header timeout of the
//! connection's start, or of the first byte of the head after an idle wait;
//! the wait itself is bounded by the idle timeout. A request being served
//! (from its complete head to its response written) has no deadline here:
//! the request deadline and the body's deadline bound it.

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::http::Request;
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper_util::rt::TokioIo;
use hyper_util::service::TowerToHyperService;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::watched::{Tracked, Watched};

/// hyper's read buffer, and so the largest request head (bytes): a head
/// past it is answered 431 (and a URI over 65,534 bytes 414) before the
/// router runs.
pub(crate) const MAX_BUFFERED_HEAD: usize = 128 << 10;

/// How connections are bounded.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Limits {
    /// A request's head must arrive within this of the connection's start or
    /// of its first byte.
    pub header_timeout: Duration,
    /// A connection with no request in progress is closed after this.
    pub idle_timeout: Duration,
    /// Connections open at once.
    pub max_connections: usize,
    /// After the shutdown signal, how long connections may take to finish.
    pub grace: Duration,
}

/// What one connection is doing, for its deadlines and for eviction.
#[derive(Debug)]
pub(crate) struct Activity {
    phase: Mutex<Phase>,
    /// Cancelled when the accept loop wants this connection's slot.
    evicted: CancellationToken,
}

#[derive(Debug, Clone, Copy)]
struct Phase {
    /// Requests being served (their response not yet written).
    serving: usize,
    /// Whether the connection is receiving a head (or is new) rather than
    /// waiting idle between requests.
    head: bool,
    /// When the current wait started.
    since: Instant,
}

impl Activity {
    /// A new connection: its first head is due within the header timeout.
    fn new() -> Self {
        Self {
            phase: Mutex::new(Phase {
                serving: 0,
                head: true,
                since: Instant::now(),
            }),
            evicted: CancellationToken::new(),
        }
    }

    fn phase(&self) -> Phase {
        *self.phase.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn update(&self, change: impl FnOnce(&mut Phase)) {
        change(&mut self.phase.lock().unwrap_or_else(|e| e.into_inner()));
    }

    /// Bytes arrived: after an idle wait, a head has started.
    pub(crate) fn received(&self) {
        self.update(|p| {
            if p.serving == 0 && !p.head {
                p.head = true;
                p.since = Instant::now();
            }
        });
    }

    /// Whether a request is being served.
    pub(crate) fn serving(&self) -> bool {
        self.phase().serving > 0
    }

    /// A request's head arrived; it is served until the guard is dropped
    /// (with its response body).
    pub(crate) fn begin(self: &Arc<Self>) -> Serving {
        self.update(|p| p.serving += 1);
        Serving(self.clone())
    }

    /// When the connection is to be closed, if nothing happens before.
    fn deadline(&self, limits: &Limits) -> Option<Instant> {
        let p = self.phase();
        match (p.serving, p.head) {
            (0, true) => Some(p.since + limits.header_timeout),
            (0, false) => Some(p.since + limits.idle_timeout),
            _ => None,
        }
    }

    /// Completes when the connection is past its deadline.
    ///
    /// A change of phase does not wake it (that would cost the connection
    /// an extra poll, and its syscalls, per request): it looks again at
    /// least every `step`, which is no longer than any deadline that can
    /// start meanwhile.
    async fn expired(&self, limits: &Limits) {
        // (At least 100 ms: a zero timeout must not make this spin.)
        let step = limits
            .header_timeout
            .min(limits.idle_timeout)
            .max(Duration::from_millis(100));
        loop {
            let now = Instant::now();
            let next = match self.deadline(limits) {
                Some(at) if at <= now => return,
                Some(at) => at.min(now + step),
                None => now + step,
            };
            tokio::time::sleep_until(next).await;
        }
    }

    /// Its rank for eviction when it has no request in progress: idle
    /// connections first, then those receiving a head; the longest waiting
    /// first.
    fn eviction_rank(&self) -> Option<(bool, Instant)> {
        let p = self.phase();
        (p.serving == 0 && !self.evicted.is_cancelled()).then_some((p.head, p.since))
    }
}

/// A request being served; dropped with its response body.
#[derive(Debug)]
pub(crate) struct Serving(Arc<Activity>);

impl Drop for Serving {
    fn drop(&mut self) {
        self.0.update(|p| {
            p.serving = p.serving.saturating_sub(1);
            if p.serving == 0 {
                p.head = false;
                p.since = Instant::now();
            }
        });
    }
}

/// The open connections, for eviction.
#[derive(Debug, Default)]
struct Open {
    connections: Mutex<(u64, HashMap<u64, Arc<Activity>>)>,
}

/// A connection's place in [`Open`]; removed when dropped.
#[derive(Debug)]
struct Registered {
    open: Arc<Open>,
    id: u64,
}

impl Drop for Registered {
    fn drop(&mut self) {
        let mut open = self.open.lock();
        open.1.remove(&self.id);
    }
}

impl Open {
    fn lock(&self) -> std::sync::MutexGuard<'_, (u64, HashMap<u64, Arc<Activity>>)> {
        self.connections.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn register(self: &Arc<Self>) -> (Arc<Activity>, Registered) {
        let activity = Arc::new(Activity::new());
        let mut open = self.lock();
        open.0 += 1;
        let id = open.0;
        open.1.insert(id, activity.clone());
        let registered = Registered {
            open: self.clone(),
            id,
        };
        (activity, registered)
    }

    /// Ask the connection that has waited longest without a request in
    /// progress to close (none: every connection is serving a request).
    fn evict_one(&self) {
        let open = self.lock();
        let victim = open
            .1
            .values()
            .filter_map(|a| a.eviction_rank().map(|rank| (rank, a)))
            .min_by_key(|(rank, _)| *rank);
        if let Some((_, activity)) = victim {
            activity.evicted.cancel();
        }
    }
}

/// What every connection task shares.
struct Shared {
    http: http1::Builder,
    app: axum::Router,
    limits: Limits,
    /// Cancelled at the shutdown signal: finish the request in progress, then close.
    stop: CancellationToken,
    /// Cancelled when the grace after the signal is over: close now.
    cut: CancellationToken,
}

/// Serve `app` on `listener` until `signal` is cancelled; then stop
/// accepting and let the connections finish their requests, closing those
/// still open after the grace.
///
/// At the cap, a new connection is accepted only once another closes: the
/// connection that has waited longest without a request in progress is
/// asked to close (a request being served is never cut); until a slot is
/// free, the accepted connection waits and further ones wait in the
/// kernel's backlog, unaccepted, so the server's descriptors stay bounded.
pub(crate) async fn serve(
    listener: TcpListener,
    app: axum::Router,
    limits: Limits,
    signal: CancellationToken,
) {
    let mut http = http1::Builder::new();
    // The head's deadlines are this module's (see the module's comment).
    http.header_read_timeout(None)
        .max_buf_size(MAX_BUFFERED_HEAD);
    let shared = Arc::new(Shared {
        http,
        app,
        limits,
        stop: CancellationToken::new(),
        cut: CancellationToken::new(),
    });
    let slots = Arc::new(Semaphore::new(limits.max_connections.max(1)));
    let open = Arc::new(Open::default());
    let tasks = TaskTracker::new();
    loop {
        let stream = tokio::select! {
            biased;
            () = signal.cancelled() => break,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(e) => {
                    accept_failed(e).await;
                    continue;
                }
            },
        };
        let Some(slot) = slot(&slots, &open, &signal).await else {
            break;
        };
        let (activity, registered) = open.register();
        tasks.spawn(connection(
            stream,
            shared.clone(),
            activity,
            (slot, registered),
        ));
    }
    drop(listener);
    shared.stop.cancel();
    tasks.close();
    if tokio::time::timeout(limits.grace, tasks.wait())
        .await
        .is_err()
    {
        tracing::warn!(
            "connections still open {:?} after the shutdown signal: closing them",
            limits.grace
        );
        shared.cut.cancel();
        tasks.wait().await;
    }
}

/// A free connection slot, evicting a connection without a request in
/// progress when there is none; `None` at the shutdown signal.
async fn slot(
    slots: &Arc<Semaphore>,
    open: &Open,
    signal: &CancellationToken,
) -> Option<OwnedSemaphorePermit> {
    if let Ok(slot) = slots.clone().try_acquire_owned() {
        return Some(slot);
    }
    loop {
        open.evict_one();
        tokio::select! {
            slot = slots.clone().acquire_owned() => return slot.ok(),
            () = signal.cancelled() => return None,
            // The connection asked to close may have started a request
            // meanwhile (it then closes after it): ask another.
            () = tokio::time::sleep(Duration::from_millis(100)) => {}
        }
    }
}

/// After a failed accept: a connection that went away is skipped; anything
/// else (out of descriptors) is logged and waited out, as hyper did.
async fn accept_failed(e: std::io::Error) {
    use std::io::ErrorKind::{ConnectionAborted, ConnectionRefused, ConnectionReset};
    if matches!(
        e.kind(),
        ConnectionAborted | ConnectionRefused | ConnectionReset
    ) {
        return;
    }
    tracing::warn!(error = %e, "accepting a connection failed; retrying in 1 s");
    tokio::time::sleep(Duration::from_secs(1)).await;
}

/// Serve one connection until it ends, passes its deadline, is evicted
/// while between requests, or the grace after the shutdown signal is over.
/// Its slot and registration are released when this returns.
async fn connection(
    stream: TcpStream,
    shared: Arc<Shared>,
    activity: Arc<Activity>,
    _held: (OwnedSemaphorePermit, Registered),
) {
    let router = TowerToHyperService::new(shared.app.clone());
    let watch = activity.clone();
    let service = hyper::service::service_fn(move |request: Request<Incoming>| {
        let serving = watch.begin();
        let answer = hyper::service::Service::call(&router, request);
        async move {
            let response = answer.await?;
            Ok::<_, Infallible>(response.map(|body| Tracked::new(body, serving)))
        }
    });
    let io = TokioIo::new(Watched::new(stream, activity.clone()));
    let conn = shared.http.serve_connection(io, service);
    tokio::pin!(conn);
    let mut closing = false;
    loop {
        tokio::select! {
            served = conn.as_mut() => {
                if let Err(e) = served {
                    tracing::debug!(error = %e, "a connection ended with an error");
                }
                return;
            }
            () = activity.expired(&shared.limits) => return,
            () = shared.cut.cancelled() => return,
            () = shared.stop.cancelled(), if !closing => {
                closing = true;
                conn.as_mut().graceful_shutdown();
            }
            () = activity.evicted.cancelled(), if !closing => {
                if !activity.serving() {
                    return;
                }
                closing = true;
                conn.as_mut().graceful_shutdown();
            }
        }
    }
}
