//! The REST/JSON server (`lance-context serve`): every store of a registry
//! under `/api/v1`, through the same pipeline as the CLI. See docs/server.md.
//!
//! Each store is opened once, with its writer, on first use and kept open;
//! every operation on it runs in a task of its own (a client that goes away
//! does not cancel a write half-way) under the store's concurrency limit and
//! the request deadline. Connections are bounded in number and in how long
//! they may wait (`connections`). Shutdown stops accepting, lets the
//! requests and their tasks finish, then closes every store (flush and
//! release).

mod auth;
mod connections;
mod error;
mod routes;
mod watched;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

pub use auth::{Role, Token, TokensFile};

use crate::{
    Embedded, EmbeddedConfig, PluginLimits, PluginRuntime, Registry, RegistryError, Residency,
};

/// How the server runs.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// The data root holding the registry.
    pub root: PathBuf,
    /// Where to listen. Without tokens only a loopback address is allowed.
    pub addr: SocketAddr,
    /// Bearer tokens; none: no authentication (loopback only).
    pub tokens: Vec<Token>,
    /// Largest request body, in bytes (larger: 413).
    pub body_limit: usize,
    /// Longest a request may take (longer: 503 `deadline`; a write that was
    /// running finishes in the background).
    pub request_timeout: Duration,
    /// Operations running at once per store.
    pub store_concurrency: usize,
    /// How long a request waits for a free slot of its store (then 503 `busy`).
    pub queue_wait: Duration,
    /// Storage options for stores created with them (values are never
    /// recorded by the registry).
    pub storage_options: HashMap<String, String>,
    /// The plugins' limits and quotas: call slots per store and in all,
    /// loaders, compile bounds (see [`PluginLimits`]).
    pub plugin_limits: PluginLimits,
    /// How long a request's head (request line and headers) may take to
    /// arrive, from the connection's start or from the head's first byte
    /// after an idle wait; then the connection is closed.
    pub header_timeout: Duration,
    /// How long a connection may wait between requests; then it is closed.
    pub idle_timeout: Duration,
    /// Connections open at once. At the cap the connection that has waited
    /// longest without a request in progress is closed to make room; when
    /// every one is serving a request, new connections wait unaccepted.
    pub max_connections: usize,
    /// Where a store created with a uri may go: a uri must be inside one of
    /// these (compared in canonical form, however either is spelt; see
    /// [`crate::check_uri_allowed`]), else 400. Empty: the data root's
    /// `stores/` only. A store created without a uri goes to
    /// `<root>/stores/<name>` whatever this says.
    pub allowed_uri_prefixes: Vec<String>,
    /// The buckets of bucketed stores this server writes (`serve --owns`);
    /// `None`: all. An add with a row of another bucket is refused with
    /// 409 `not_owner`, naming the bucket; reads see every bucket.
    pub owned_buckets: Option<Vec<u32>>,
    /// Scale-out (`serve --advertise URL --instance NAME`): this server
    /// publishes a membership record with each bucketed store and sends the
    /// rows of other servers' buckets to their owners; it opens every store
    /// at start. `None`: rows of buckets not owned are refused (409
    /// `not_owner`). See docs/operations.md.
    pub peers: Option<crate::PeerConfig>,
}

impl ServerConfig {
    /// Defaults: 64 MiB bodies, 60 s deadline, 32 operations per store,
    /// 2 s queue wait, 10 s header timeout, 60 s idle timeout, 1024
    /// connections.
    pub fn new(root: impl Into<PathBuf>, addr: SocketAddr) -> Self {
        Self {
            root: root.into(),
            addr,
            tokens: Vec::new(),
            body_limit: 64 << 20,
            request_timeout: Duration::from_secs(60),
            store_concurrency: 32,
            queue_wait: Duration::from_secs(2),
            storage_options: HashMap::new(),
            plugin_limits: PluginLimits::default(),
            header_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(60),
            max_connections: 1024,
            allowed_uri_prefixes: Vec::new(),
            owned_buckets: None,
            peers: None,
        }
    }

    /// The prefixes a given uri must be inside: the configured ones, or the
    /// data root's `stores/`.
    pub fn uri_prefixes(&self, root: &std::path::Path) -> Vec<String> {
        match self.allowed_uri_prefixes.is_empty() {
            true => vec![format!("{}/", root.join("stores").display())],
            false => self.allowed_uri_prefixes.clone(),
        }
    }
}

/// Why the server could not start or stopped.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ServerError {
    /// Listening on a non-loopback address needs tokens.
    #[error(
        "refusing to listen on {0} without tokens: give --tokens FILE (or LANCE_CONTEXT_TOKENS), or listen on 127.0.0.1"
    )]
    Unprotected(SocketAddr),
    /// The advertised address cannot be one.
    #[error("{0}")]
    Advertise(String),
    /// The registry could not be opened.
    #[error(transparent)]
    Registry(#[from] RegistryError),
    /// The plugin runtime could not start.
    #[error(transparent)]
    Plugin(#[from] crate::PluginError),
    /// Binding or serving failed.
    #[error("{0}")]
    Io(#[from] std::io::Error),
}

impl ServerError {
    /// The kind (an unprotected address is invalid input).
    pub fn kind(&self) -> crate::ErrorKind {
        match self {
            Self::Unprotected(_) | Self::Advertise(_) => crate::ErrorKind::InvalidInput,
            Self::Registry(e) => e.kind(),
            Self::Plugin(e) => e.kind(),
            Self::Io(_) => crate::ErrorKind::Storage,
        }
    }
}

/// What every handler shares: the embedded store API and the server's
/// configuration (tokens, body limit, timeouts).
#[derive(Debug)]
pub(crate) struct AppState {
    pub api: Embedded,
    pub config: ServerConfig,
    /// The stores opened at start (scale-out) are open: `/ready` answers 200.
    pub opened: std::sync::atomic::AtomicBool,
}

/// A bound server, not yet serving.
#[derive(Debug)]
pub struct Server {
    listener: tokio::net::TcpListener,
    state: Arc<AppState>,
}

impl Server {
    /// Open the registry and bind the address (port 0: any free port).
    pub async fn bind(config: ServerConfig) -> Result<Self, ServerError> {
        if config.tokens.is_empty() && !config.addr.ip().is_loopback() {
            return Err(ServerError::Unprotected(config.addr));
        }
        let runtime = Arc::new(PluginRuntime::new(
            config.plugin_limits.clone(),
            crate::default_cache_dir().as_deref(),
        )?);
        let registry = Registry::at(&config.root, runtime)?;
        // A prefix that names no location is a mistake to report now, not
        // on every create.
        for prefix in &config.allowed_uri_prefixes {
            lance_context_store::CanonicalLocation::of(prefix).map_err(RegistryError::from)?;
        }
        let listener = tokio::net::TcpListener::bind(config.addr).await?;
        let mut config = config;
        if let Some(peers) = &mut config.peers
            && peers.address == crate::api::members::AUTO_ADDRESS
        {
            let bound = listener.local_addr()?;
            if bound.ip().is_unspecified() {
                return Err(ServerError::Advertise(format!(
                    "--advertise auto: the server listens on {bound}, which no other instance can reach; give --advertise http://HOST:{}",
                    bound.port()
                )));
            }
            peers.address = format!("http://{bound}");
        }
        let api = Embedded::new(
            registry,
            EmbeddedConfig {
                storage_options: config.storage_options.clone(),
                store_concurrency: config.store_concurrency,
                queue_wait: config.queue_wait,
                deadline: Some(config.request_timeout),
                // A caller of the API goes only where the operator allows.
                allowed_uri_prefixes: Some(config.uri_prefixes(&config.root)),
                residency: Residency::Resident,
                // A request's filter is not the operator's: plain predicates.
                trusted_filters: false,
                max_page: crate::MAX_PAGE,
                owned_buckets: config.owned_buckets.clone(),
                peers: config.peers.clone(),
            },
        );
        Ok(Self {
            listener,
            state: Arc::new(AppState {
                api,
                config,
                opened: std::sync::atomic::AtomicBool::new(false),
            }),
        })
    }

    /// The address it listens on.
    pub fn local_addr(&self) -> Result<SocketAddr, ServerError> {
        Ok(self.listener.local_addr()?)
    }

    /// Whether requests need a token.
    pub fn requires_tokens(&self) -> bool {
        !self.state.config.tokens.is_empty()
    }

    /// Serve until `shutdown` completes; then finish in-flight requests and
    /// their tasks, and close every store.
    pub async fn run(
        self,
        shutdown: impl std::future::Future<Output = ()> + Send + 'static,
    ) -> Result<(), ServerError> {
        let state = self.state.clone();
        let app = routes::router(state.clone());
        let config = &state.config;
        // Deadlines are instants: a year is long enough and cannot overflow.
        let bounded = |d: Duration| d.min(Duration::from_secs(365 * 86_400));
        let limits = connections::Limits {
            header_timeout: bounded(config.header_timeout),
            idle_timeout: bounded(config.idle_timeout),
            max_connections: config.max_connections,
            // After the signal, connections get a grace period to finish (a
            // client that never completes its request does not hold shutdown).
            grace: bounded(
                config
                    .request_timeout
                    .saturating_add(Duration::from_secs(5)),
            ),
        };
        // A scale-out instance claims its buckets and publishes where it
        // is before any request names a store (`/ready` says when).
        // Then again every third of the lease: a store created through
        // another instance is opened here too (its buckets claimed, its
        // record published) without waiting for a request to name it.
        let opening = CancellationToken::new();
        let mut opener = None;
        if let Some(peers) = &config.peers {
            let state = state.clone();
            let every = peers.lease / 3;
            let stop = opening.clone();
            opener = Some(tokio::spawn(async move {
                let mut rounds = crate::api::OpenRounds::default();
                tokio::select! {
                    _ = stop.cancelled() => return,
                    _ = state.api.open_bucketed(&mut rounds) => {}
                }
                state
                    .opened
                    .store(true, std::sync::atomic::Ordering::Release);
                loop {
                    tokio::select! {
                        _ = stop.cancelled() => return,
                        _ = tokio::time::sleep(every) => {}
                    }
                    tokio::select! {
                        _ = stop.cancelled() => return,
                        _ = state.api.open_bucketed(&mut rounds) => {}
                    }
                }
            }));
        } else {
            state
                .opened
                .store(true, std::sync::atomic::Ordering::Release);
        }
        let signal = CancellationToken::new();
        let signalled = signal.clone();
        tokio::spawn(async move {
            shutdown.await;
            signalled.cancel();
        });
        connections::serve(self.listener, app, limits, signal).await;
        // No store is opened after this (an open under way is a task the
        // shutdown below waits for).
        opening.cancel();
        if let Some(opener) = opener {
            let _ = opener.await;
        }
        // The store operations requests started run to their end; then
        // every store is closed.
        state
            .api
            .shutdown()
            .await
            .map_err(|e| ServerError::Registry(RegistryError::Store(e)))
    }
}
