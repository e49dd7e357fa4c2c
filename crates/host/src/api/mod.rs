//! The embedded implementation of the store API
//! ([`lance_context_client::StoreApi`]): the stores of one data root,
//! opened in this process. The REST server's handlers call it and nothing
//! else (they add authentication and HTTP); the CLI calls it, or the
//! client of a server, through the same trait.
//!
//! Each store is opened once, with its writer, on first use and kept open;
//! every operation on it runs in a task of its own (a caller that goes
//! away does not cancel a write half-way) under the store's concurrency
//! limit and, when one is set, a deadline. [`Embedded::shutdown`] lets the
//! running operations finish and closes every store.

mod admin;
mod error;
mod json;
pub(crate) mod members;
mod queries;
mod records;
pub(crate) use records::Origin;
mod stores;

use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use lance_context_client::{
    Added, AdoptStore, Adopted, ApiResult, CompactionReport, CountParams, Counted, CreateStore,
    Deleted, Dropped, GetMany, Indexed, ListParams, MergeReport, Page, Patched, QueryRequest,
    QueryResult, RecordsBody, RetrieveRequest, Rows, SearchRequest, StoreApi, StoreInfo,
    StoreStatus, TableVersion, UpgradeStore, Upgraded, UpsertResult,
};
use serde_json::Value;
use tokio::sync::{Mutex, OnceCell, Semaphore};
use tokio_util::task::TaskTracker;

pub(crate) use error::{ApiError, status};
pub use records::MAX_PAGE;

use crate::{ErrorKind, NamedStore, Registry};

/// How the embedded implementation runs.
#[derive(Debug, Clone)]
pub struct EmbeddedConfig {
    /// Storage options for every store's object store (values are never
    /// recorded by the registry).
    pub storage_options: HashMap<String, String>,
    /// Operations running at once per store.
    pub store_concurrency: usize,
    /// How long an operation waits for a free slot of its store (then
    /// `busy`).
    pub queue_wait: Duration,
    /// Longest an operation may take before its caller gets `deadline`
    /// (the operation still runs to its end); `None`: no deadline.
    pub deadline: Option<Duration>,
    /// Where a store created or adopted with a uri may be: inside one of
    /// these prefixes, given as an absolute path or a URL (compared in
    /// canonical form, see [`crate::check_uri_allowed`]). `None`: anywhere
    /// the process can reach, relative paths included.
    pub allowed_uri_prefixes: Option<Vec<String>>,
    /// Whether stores stay open between operations.
    pub residency: Residency,
    /// Whether a caller's filters are trusted SQL: any predicate the query
    /// engine evaluates (function calls included), for a tool run by the
    /// data root's owner. `false` (a service's choice): plain predicates
    /// only — columns, literals, comparisons, AND/OR/NOT, IN, BETWEEN,
    /// LIKE, IS NULL — so that a request cannot make the host run
    /// arbitrary SQL.
    pub trusted_filters: bool,
    /// Most records of one list page, and most keys of one lookup or
    /// delete ([`records::MAX_PAGE`], 10,000, by default; a tool reading a
    /// whole store where it lies may allow `usize::MAX`: one scan).
    pub max_page: usize,
    /// The buckets of bucketed stores this host writes (`serve --owns`);
    /// `None`: all of them. A store without buckets ignores it. See
    /// `lance_context_store::StoreConfig::with_owned_buckets`.
    pub owned_buckets: Option<Vec<u32>>,
    /// Scale-out (`serve --advertise`): this instance's name and address,
    /// published with each bucketed store it serves, and used to send the
    /// rows of other instances' buckets to their owners (see
    /// docs/operations.md). `None`: rows of buckets not owned are refused
    /// (`not_owner`). Only with [`Residency::Resident`] (a store opened per
    /// call has no membership: rows of other buckets are refused).
    pub peers: Option<members::PeerConfig>,
}

/// What [`Embedded::open_bucketed`] remembers between rounds.
#[derive(Debug, Default)]
pub(crate) struct OpenRounds {
    /// Stores whose failure to open was logged.
    warned: std::collections::HashSet<String>,
    /// Stores without buckets, by name, with their creation time.
    unbucketed: HashMap<String, String>,
}

/// Join a bucketed store's membership (scale-out peers configured).
async fn join_members(
    store: &Arc<OpenStore>,
    peers: Option<(members::PeerConfig, reqwest::Client)>,
) {
    let Some((config, http)) = peers else { return };
    // Every instance of a bucketed store joins, one owning no bucket too:
    // the membership is also how it finds the owners.
    if store.named.bucket_count().is_none() {
        return;
    }
    let membership = members::Membership::start(config, http, store).await;
    let _ = store.membership.set(membership);
}

/// Whether a store stays open between operations.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Residency {
    /// Opened (with its writer) on first use and kept open until
    /// [`Embedded::shutdown`]: a service's choice.
    Resident,
    /// Opened for each operation and closed after it: a read opens
    /// read-only (no writer is claimed, a running service keeps writing),
    /// a write claims the writer for that operation only, with
    /// maintenance left to whoever owns the store. A command-line tool's
    /// choice.
    PerCall,
}

/// What an operation needs of its store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Access {
    /// Reads only.
    Read,
    /// Reads the base table at a version (`as_of`): the store opened
    /// read-only at that version for this operation, whatever the
    /// residency.
    ReadAt(u64),
    /// Writes (claims the writer when stores are opened per call).
    Write,
}

impl Access {
    /// A read, at `as_of` when one is given.
    pub(crate) fn read(as_of: Option<u64>) -> Self {
        as_of.map_or(Self::Read, Self::ReadAt)
    }
}

impl Default for EmbeddedConfig {
    /// 32 operations per store, a 2 s queue wait, no deadline, any uri,
    /// stores kept open, plain filters only, pages of at most 10,000.
    fn default() -> Self {
        Self {
            storage_options: HashMap::new(),
            store_concurrency: 32,
            queue_wait: Duration::from_secs(2),
            deadline: None,
            allowed_uri_prefixes: None,
            residency: Residency::Resident,
            trusted_filters: false,
            max_page: records::MAX_PAGE,
            owned_buckets: None,
            peers: None,
        }
    }
}

/// A store held open.
#[derive(Debug)]
pub(crate) struct OpenStore {
    pub named: NamedStore,
    pub slots: Arc<Semaphore>,
    /// A bucketed store's membership (scale-out peers configured).
    pub membership: std::sync::OnceLock<Arc<members::Membership>>,
}

impl OpenStore {
    fn new(named: NamedStore, slots: Arc<Semaphore>) -> Self {
        Self {
            named,
            slots,
            membership: std::sync::OnceLock::new(),
        }
    }

    /// Leave the membership (the record is deleted), then close the store.
    pub(crate) async fn close(&self) -> Result<(), lance_context_store::Error> {
        if let Some(membership) = self.membership.get() {
            membership.leave(self).await;
        }
        self.named.close().await
    }
}

/// A store's place among those open: filled by the first operation (or by
/// its create); marked held by a drop or an upgrade, after which an open
/// that has not started does not start (one under way is waited for and
/// closed by the holder).
#[derive(Debug, Default)]
struct Slot {
    store: OnceCell<Arc<OpenStore>>,
    held: std::sync::Mutex<Option<Hold>>,
}

impl Slot {
    /// The hold on it, if any.
    fn hold(&self) -> Option<Hold> {
        *self.held.lock().unwrap_or_else(|p| p.into_inner())
    }
}

type Cell = Arc<Slot>;

/// The stores held open, and the names being dropped.
#[derive(Debug, Default)]
struct Stores {
    /// A cell per store, filled by the first operation (or by its create).
    open: HashMap<String, Cell>,
    /// Stores held by a drop or an upgrade: no operation opens them
    /// meanwhile.
    held: HashMap<String, Hold>,
}

/// Why a store is held.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Hold {
    /// Being dropped: operations meanwhile are told it is gone.
    Dropping,
    /// Its plugin being replaced: operations meanwhile are told to retry.
    Upgrading,
}

impl Hold {
    /// What an operation on held store `name` is told.
    fn refusal(self, name: &str) -> ApiError {
        match self {
            Self::Dropping => being_dropped(name),
            Self::Upgrading => ApiError::of_kind(
                ErrorKind::Busy,
                format!("store '{name}' is being upgraded (its plugin replaced); retry"),
            ),
        }
    }
}

impl Stores {
    /// The cell of store `name`, made when there is none; `not_found`
    /// while the store is being dropped.
    fn cell(&mut self, name: &str) -> Result<Cell, ApiError> {
        if let Some(hold) = self.held.get(name) {
            return Err(hold.refusal(name));
        }
        Ok(self.open.entry(name.to_string()).or_default().clone())
    }

    /// Forget `cell` of `name` when it is still the one kept and empty (an
    /// open or create that failed: nothing is remembered).
    fn forget_empty(&mut self, name: &str, cell: &Cell) {
        if self
            .open
            .get(name)
            .is_some_and(|c| Arc::ptr_eq(c, cell) && c.store.get().is_none())
        {
            self.open.remove(name);
        }
    }
}

fn being_dropped(name: &str) -> ApiError {
    ApiError::of_kind(
        ErrorKind::NotFound,
        format!("no store named '{name}' (it is being dropped)"),
    )
}

/// The store API over the stores of one registry, in this process.
#[derive(Debug)]
pub struct Embedded {
    registry: Registry,
    /// Open stores by name, and the names being dropped.
    stores: Mutex<Stores>,
    config: EmbeddedConfig,
    tasks: TaskTracker,
    /// Sends rows to their buckets' owners (scale-out peers configured).
    http: Option<reqwest::Client>,
}

impl Embedded {
    /// The store API over `registry`'s stores.
    pub fn new(registry: Registry, config: EmbeddedConfig) -> Self {
        Self {
            registry,
            stores: Mutex::new(Stores::default()),
            http: config.peers.as_ref().map(|_| {
                // Peers talk directly (no proxy from the environment); a
                // send lasts at most as long as a request may.
                reqwest::Client::builder()
                    .no_proxy()
                    // A peer answers; it does not send the caller's token on.
                    .redirect(reqwest::redirect::Policy::none())
                    .connect_timeout(Duration::from_secs(5))
                    .timeout(config.deadline.unwrap_or(Duration::from_secs(300)))
                    .build()
                    .unwrap_or_else(|e| {
                        tracing::error!(error = %e, "building the peers' HTTP client; using the defaults");
                        reqwest::Client::default()
                    })
            }),
            config,
            tasks: TaskTracker::new(),
        }
    }

    /// The registry.
    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    /// How it runs.
    pub fn config(&self) -> &EmbeddedConfig {
        &self.config
    }

    /// Let the running operations finish, then close every open store
    /// (flush and release its writer). Later calls reopen stores as needed.
    pub async fn shutdown(&self) -> Result<(), lance_context_store::Error> {
        self.tasks.close();
        self.tasks.wait().await;
        self.tasks.reopen();
        let stores: Vec<Arc<OpenStore>> = self
            .stores
            .lock()
            .await
            .open
            .drain()
            .filter_map(|(_, cell)| cell.store.get().cloned())
            .collect();
        let mut first_error = None;
        for store in stores {
            if let Err(e) = store.close().await {
                tracing::warn!(store = store.named.name(), error = %e, "closing a store");
                first_error.get_or_insert(e);
            }
        }
        match first_error {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// The scale-out peers' configuration and client, when configured.
    fn peers(&self) -> Option<(members::PeerConfig, reqwest::Client)> {
        Some((self.config.peers.clone()?, self.http.clone()?))
    }

    /// Open every registered bucketed store not open yet (claiming the
    /// buckets this instance owns and publishing its membership records),
    /// as the first operation on each would: a scale-out instance is
    /// reachable for its buckets before any request names them. A store
    /// without buckets is not opened (its one writer would be taken from
    /// whichever instance holds it). A failure is logged once per store,
    /// not fatal: the next round or operation tries again.
    pub(crate) async fn open_bucketed(&self, rounds: &mut OpenRounds) {
        let entries = match self.registry.list() {
            Ok(entries) => entries,
            Err(e) => {
                tracing::warn!(error = %e, "listing the stores to open");
                return;
            }
        };
        for entry in entries {
            if entry.state != crate::registry::EntryState::Ready {
                continue;
            }
            let name = entry.name.clone();
            // Known to have no buckets (the same store: created at the
            // same instant).
            if rounds.unbucketed.get(&name) == Some(&entry.created_at) {
                continue;
            }
            let open = {
                let stores = self.stores.lock().await;
                stores
                    .open
                    .get(&name)
                    .is_some_and(|cell| cell.store.get().is_some())
            };
            if open {
                continue;
            }
            let config = lance_context_store::StoreConfig::new(&entry.uri)
                .with_key_column(&entry.spec.key)
                .with_storage_options(self.config.storage_options.clone());
            let result = match lance_context_store::Store::bucket_count_at(&config).await {
                Ok(None) => {
                    rounds
                        .unbucketed
                        .insert(name.clone(), entry.created_at.clone());
                    Ok(())
                }
                Ok(Some(_)) => self.open(&name, None).await.map(|_| ()),
                Err(e) => Err(ApiError::from_error(&e)),
            };
            match result {
                Ok(()) => {
                    rounds.warned.remove(&name);
                }
                Err(e) => {
                    if rounds.warned.insert(name.clone()) {
                        tracing::warn!(store = %name, error = %e.message, "opening a bucketed store");
                    }
                }
            }
        }
    }

    fn new_slots(&self) -> Arc<Semaphore> {
        Arc::new(Semaphore::new(self.config.store_concurrency))
    }

    /// The store, opened (with its writer) on first use and kept. The map
    /// is locked only to find the store's cell: opening one store does not
    /// hold operations on the others. The open runs in a task of its own
    /// (a caller that stops waiting — past its deadline — does not cut an
    /// open half-way: it finishes, and the next operation finds the store
    /// open); waited for until `until` when given (then `deadline`).
    async fn open(
        &self,
        name: &str,
        until: Option<(tokio::time::Instant, Duration)>,
    ) -> Result<Arc<OpenStore>, ApiError> {
        let cell = self.stores.lock().await.cell(name)?;
        if let Some(store) = cell.store.get() {
            return Ok(store.clone());
        }
        let opening = {
            let (cell, registry) = (cell.clone(), self.registry.clone());
            let (options, slots) = (self.config.storage_options.clone(), self.new_slots());
            let owned = self.config.owned_buckets.clone();
            let peers = self.peers();
            let name = name.to_string();
            self.tasks.spawn(async move {
                cell.store
                    .get_or_try_init(|| async {
                        // Held by a drop or an upgrade since this open was asked
                        // for: not opened (it would be left out of the holder's
                        // close).
                        if let Some(hold) = cell.hold() {
                            return Err(hold.refusal(&name));
                        }
                        let named = registry
                            .open_with(&name, &options, false, |c| c.with_owned_buckets(owned))
                            .await?;
                        let store = Arc::new(OpenStore::new(named, slots));
                        join_members(&store, peers).await;
                        Ok::<_, ApiError>(store)
                    })
                    .await
                    .cloned()
            })
        };
        let opened = match until {
            Some((at, deadline)) => tokio::time::timeout_at(at, opening)
                .await
                .map_err(|_| past_deadline(deadline))?,
            None => opening.await,
        };
        match joined(opened) {
            Ok(store) => Ok(store),
            Err(e) => {
                // Not kept: a store that does not exist (yet) is not remembered.
                self.stores.lock().await.forget_empty(name, &cell);
                Err(e)
            }
        }
    }

    /// Create a store and keep it open (its writer is claimed), or close
    /// it when stores are opened per call. The new store's cell is filled
    /// by the create itself: an operation on the name meanwhile waits for
    /// the create and uses its handle (never a second writer, which would
    /// fence the create's).
    async fn create_open(
        &self,
        name: &str,
        options: crate::CreateOptions,
    ) -> Result<(crate::StoreEntry, Vec<String>), ApiError> {
        if self.config.residency == Residency::PerCall {
            let named = self.registry.create(name, options).await?;
            let created = (named.entry().clone(), named.probe_warnings().to_vec());
            named.close().await?;
            return Ok(created);
        }
        let cell = self.stores.lock().await.cell(name)?;
        let mut options = Some(options);
        let mut created = None;
        let filled = cell
            .store
            .get_or_try_init(|| async {
                let options = options.take().expect("taken once");
                let named = self.registry.create(name, options).await?;
                created = Some((named.entry().clone(), named.probe_warnings().to_vec()));
                let store = Arc::new(OpenStore::new(named, self.new_slots()));
                join_members(&store, self.peers()).await;
                Ok::<_, ApiError>(store)
            })
            .await
            .map(|_| ());
        match (filled, created, options) {
            (Ok(()), Some(entry), _) => Ok(entry),
            // The store was open already: the registry says it exists.
            (Ok(()), None, Some(options)) => {
                let named = self.registry.create(name, options).await?;
                // Created after all (dropped meanwhile by another process):
                // released; the next operation opens it.
                let created = (named.entry().clone(), named.probe_warnings().to_vec());
                named.close().await?;
                Ok(created)
            }
            (Ok(()), None, None) => Err(ApiError::of_kind(
                ErrorKind::Internal,
                "the create neither ran nor kept its options",
            )),
            (Err(e), _, _) => {
                self.stores.lock().await.forget_empty(name, &cell);
                Err(e)
            }
        }
    }

    /// Hold store `name` for `work` (a drop, an upgrade): no operation
    /// opens it meanwhile; its running operations end first, those queued
    /// are refused (as `hold` says), its writer is released, then `work`
    /// runs. Operations after it open the store afresh.
    async fn holding<T>(
        &self,
        name: &str,
        hold: Hold,
        work: impl Future<Output = Result<T, ApiError>>,
    ) -> Result<T, ApiError> {
        let cell = {
            let mut stores = self.stores.lock().await;
            if let Some(held) = stores.held.get(name) {
                return Err(held.refusal(name));
            }
            stores.held.insert(name.to_string(), hold);
            stores.open.remove(name)
        };
        let result = async {
            // An open of this cell under way ends first (its handle is
            // closed here); none is started.
            let open = match cell {
                Some(cell) => {
                    // Marked first: an open not yet started does not start;
                    // one under way is waited for, and closed below.
                    *cell.held.lock().unwrap_or_else(|p| p.into_inner()) = Some(hold);
                    cell.store
                        .get_or_try_init(|| async { Err::<Arc<OpenStore>, ()>(()) })
                        .await
                        .ok()
                        .cloned()
                }
                None => None,
            };
            if let Some(open) = open {
                let all = open
                    .slots
                    .acquire_many(self.config.store_concurrency as u32)
                    .await;
                // Operations still queued for a slot are refused.
                open.slots.close();
                std::mem::drop(all);
                open.close().await?;
            }
            work.await
        }
        .await;
        self.stores.lock().await.held.remove(name);
        result
    }

    /// Why an operation queued on store `name` was refused (its slots were
    /// closed by a drop or an upgrade).
    async fn refused_while_held(&self, name: &str) -> ApiError {
        match self.stores.lock().await.held.get(name) {
            Some(hold) => hold.refusal(name),
            None => being_dropped(name),
        }
    }

    /// Run `work` on store `name`: in a slot of the store (waiting at most
    /// the queue wait: `busy`), in a task of its own (a caller going away
    /// does not cancel it), within the deadline when one is set
    /// (`deadline`; the task still finishes).
    async fn on_store<T, F, Fut>(&self, name: &str, access: Access, work: F) -> Result<T, ApiError>
    where
        F: FnOnce(Arc<OpenStore>) -> Fut,
        Fut: Future<Output = Result<T, ApiError>> + Send + 'static,
        T: Send + 'static,
    {
        // The deadline counts from here: opening the store and waiting for
        // a slot are part of the operation's time.
        let until = self
            .config
            .deadline
            .map(|d| (tokio::time::Instant::now() + d, d));
        if self.config.residency == Residency::PerCall {
            return self.once(name, access, until, work).await;
        }
        let store = self.open(name, until).await?;
        let busy = || {
            ApiError::of_kind(
                ErrorKind::Busy,
                format!(
                    "store '{name}' is running {} operations; retry later",
                    self.config.store_concurrency
                ),
            )
        };
        let slot = store.slots.clone().acquire_owned();
        let queue_ends = tokio::time::Instant::now() + self.config.queue_wait;
        let permit = match until {
            Some((at, deadline)) if at < queue_ends => tokio::time::timeout_at(at, slot)
                .await
                .map_err(|_| past_deadline(deadline))?,
            _ => tokio::time::timeout_at(queue_ends, slot)
                .await
                .map_err(|_| busy())?,
        };
        let permit = match permit {
            Ok(permit) => permit,
            Err(_) => return Err(self.refused_while_held(name).await),
        };
        let store = match access {
            // A read at a version: the dataset opened read-only at it for
            // this operation, with the resident store's plugin (nothing
            // loaded again), in a slot of the resident store: bounded as
            // any other operation on it.
            Access::ReadAt(version) => {
                let opening = store
                    .named
                    .at_version(&self.config.storage_options, version);
                let named = match until {
                    Some((at, deadline)) => tokio::time::timeout_at(at, opening)
                        .await
                        .map_err(|_| past_deadline(deadline))?,
                    None => opening.await,
                }
                .map_err(|e| version_refused(name, version, e))?;
                Arc::new(OpenStore::new(named, store.slots.clone()))
            }
            _ => store,
        };
        let handle = store.clone();
        let work = work(store);
        let task = self.tasks.spawn(async move {
            let _slot = permit;
            work.await
        });
        let ended = match until {
            Some((at, deadline)) => tokio::time::timeout_at(at, task)
                .await
                .map_err(|_| past_deadline(deadline))?,
            None => task.await,
        };
        match joined(ended) {
            Err(mut e) if e.fenced => {
                // Another process claimed the store's writer (an operator's
                // command where the data root is): taken back, so that the
                // next operation writes again. This one is not retried: it
                // did not land.
                match handle.named.reclaim().await {
                    Ok(()) => {
                        tracing::warn!(
                            store = name,
                            "the store's writer was fenced by another process; taken back"
                        );
                        e.message
                            .push_str(" (the store has been taken back: retry)");
                    }
                    Err(err) => {
                        tracing::warn!(store = name, error = %err, "taking back a fenced store")
                    }
                }
                Err(e)
            }
            other => other,
        }
    }
}

impl Embedded {
    /// [`Self::on_store`] of [`Residency::PerCall`]: the store opened for
    /// this operation (a writer only for a write, at a version for a read
    /// at one), closed after it; within `until` when given.
    async fn once<T, F, Fut>(
        &self,
        name: &str,
        access: Access,
        until: Option<(tokio::time::Instant, Duration)>,
        work: F,
    ) -> Result<T, ApiError>
    where
        F: FnOnce(Arc<OpenStore>) -> Fut,
        Fut: Future<Output = Result<T, ApiError>> + Send + 'static,
        T: Send + 'static,
    {
        let options = &self.config.storage_options;
        let open = async {
            Ok::<_, ApiError>(match access {
                Access::Read => self.registry.open_with(name, options, true, |c| c).await?,
                Access::ReadAt(version) => {
                    // The store as it is, then its table at the version: a
                    // version it does not keep is told apart from the rest.
                    let latest = self.registry.open_with(name, options, true, |c| c).await?;
                    latest
                        .at_version(options, version)
                        .await
                        .map_err(|e| version_refused(name, version, e))?
                }
                Access::Write => {
                    let owned = self.config.owned_buckets.clone();
                    self.registry
                        .open_with(name, options, false, |c| {
                            c.with_manual_maintenance().with_owned_buckets(owned)
                        })
                        .await?
                }
            })
        };
        let named = match until {
            // A read-only open holds nothing when cut short; a writer's open
            // is not cut (it claims the shard).
            Some((at, deadline)) if access != Access::Write => tokio::time::timeout_at(at, open)
                .await
                .map_err(|_| past_deadline(deadline))?,
            _ => open.await,
        };
        let named = named?;
        let store = Arc::new(OpenStore::new(named, self.new_slots()));
        // In a task of its own, as a resident store's operations: a caller
        // going away does not cancel a write half-way, and the work runs
        // on a worker's stack, not nested in the caller's.
        let work = work(store.clone());
        let task = self.tasks.spawn(async move {
            let result = work.await;
            if access == Access::Write {
                // Released even after a failed write; the write's own error
                // comes first.
                let closed = store.named.close().await;
                let value = result?;
                closed?;
                return Ok(value);
            }
            result
        });
        match until {
            Some((at, deadline)) => joined(
                tokio::time::timeout_at(at, task)
                    .await
                    .map_err(|_| past_deadline(deadline))?,
            ),
            None => joined(task.await),
        }
    }
}

/// A store API call's future, boxed: a caller holding one (a task spawned
/// on it, a future of its own awaiting several) neither carries its whole
/// state on the stack nor has the compiler prove `Send` through the
/// engine's deeply nested types again (it is said here, once).
fn boxed<'a, T>(
    future: impl Future<Output = T> + Send + 'a,
) -> std::pin::Pin<Box<dyn Future<Output = T> + Send + 'a>> {
    Box::pin(future)
}

/// An operation's task, ended: its answer, or `internal` when it panicked.
fn joined<T>(ended: Result<Result<T, ApiError>, tokio::task::JoinError>) -> Result<T, ApiError> {
    ended.unwrap_or_else(|e| {
        Err(ApiError::of_kind(
            ErrorKind::Internal,
            format!("the operation failed: {e}"),
        ))
    })
}

/// A read at a version the store does not keep: `not_found` (as a store or
/// key that is not there; the CLI's exit code 3), told apart by
/// `details.as_of`.
fn missing_version(name: &str, version: u64) -> ApiError {
    ApiError::of_kind(
        ErrorKind::NotFound,
        format!(
            "store '{name}' keeps no version {version} of its table (its versions list those kept)"
        ),
    )
    .with_details(serde_json::json!({"as_of": version}))
}

/// A read at a version refused: a version the store does not keep is the
/// caller's mistake; anything else is the engine's error.
fn version_refused(name: &str, version: u64, e: lance_context_store::Error) -> ApiError {
    match e.kind() {
        lance_context_store::ErrorKind::NotFound => missing_version(name, version),
        _ => ApiError::from(e),
    }
}

fn past_deadline(deadline: Duration) -> ApiError {
    ApiError::new(
        status::SERVICE_UNAVAILABLE,
        "deadline",
        format!(
            "the request ran past its deadline of {deadline:?}; a write still running completes. Re-adding the same keys is safe in a store without unique keys (newest wins); in a store with unique keys a resent add or upsert whose first attempt landed is refused with 409 already_exists: look the ids up first and resend only those not found"
        ),
    )
}

/// Each method is the inherent one of the same name (in `stores`,
/// `records`, `queries`, `admin`), its error as the API's, its future boxed
/// (see [`boxed`]).
impl StoreApi for Embedded {
    fn page_limit(&self) -> usize {
        self.config.max_page
    }

    fn create_store(
        &self,
        create: &CreateStore,
    ) -> impl Future<Output = ApiResult<StoreInfo>> + Send {
        // Owned: the future borrows only `self`.
        let create = create.clone();
        boxed(async move { Ok(self.create(create).await?) })
    }

    fn adopt(
        &self,
        name: &str,
        request: &AdoptStore,
    ) -> impl Future<Output = ApiResult<Adopted>> + Send {
        // Owned: the future borrows only `self`.
        let name = name.to_owned();
        let request = request.clone();
        boxed(async move {
            let name = name.as_str();
            Ok(self.adopt_dataset(name, request).await?)
        })
    }

    fn list_stores(&self) -> impl Future<Output = ApiResult<Vec<StoreInfo>>> + Send {
        boxed(async move { Ok(self.stores()?) })
    }

    fn describe_store(&self, name: &str) -> impl Future<Output = ApiResult<StoreInfo>> + Send {
        // Owned: the future borrows only `self`.
        let name = name.to_owned();
        boxed(async move {
            let name = name.as_str();
            Ok(self.describe(name)?)
        })
    }

    fn drop_store(&self, name: &str) -> impl Future<Output = ApiResult<Dropped>> + Send {
        // Owned: the future borrows only `self`.
        let name = name.to_owned();
        boxed(async move {
            let name = name.as_str();
            Ok(self.drop_named(name).await?)
        })
    }

    fn upgrade(
        &self,
        name: &str,
        request: &UpgradeStore,
    ) -> impl Future<Output = ApiResult<Upgraded>> + Send {
        // Owned: the future borrows only `self`.
        let name = name.to_owned();
        let request = request.clone();
        boxed(async move { Ok(self.upgrade_plugin(&name, request).await?) })
    }

    fn add_records(
        &self,
        name: &str,
        records: RecordsBody,
    ) -> impl Future<Output = ApiResult<Added>> + Send {
        // Owned: the future borrows only `self`.
        let name = name.to_owned();
        boxed(async move {
            let name = name.as_str();
            Ok(self.add_body(name, records).await?)
        })
    }

    fn get(&self, name: &str, key: &str) -> impl Future<Output = ApiResult<Option<Value>>> + Send {
        // Owned: the future borrows only `self`.
        let name = name.to_owned();
        let key = key.to_owned();
        boxed(async move {
            let name = name.as_str();
            let key = key.as_str();
            Ok(self.get_one(name, key).await?)
        })
    }

    fn lookup(
        &self,
        name: &str,
        request: &GetMany,
    ) -> impl Future<Output = ApiResult<Rows>> + Send {
        // Owned: the future borrows only `self`.
        let name = name.to_owned();
        let request = request.clone();
        boxed(async move {
            let name = name.as_str();
            Ok(self.lookup_keys(name, request).await?)
        })
    }

    fn count(
        &self,
        name: &str,
        params: &CountParams,
    ) -> impl Future<Output = ApiResult<Counted>> + Send {
        // Owned: the future borrows only `self`.
        let name = name.to_owned();
        let params = params.clone();
        boxed(async move {
            let name = name.as_str();
            Ok(self.count_rows(name, params).await?)
        })
    }

    fn list(
        &self,
        name: &str,
        params: &ListParams,
    ) -> impl Future<Output = ApiResult<Page>> + Send {
        // Owned: the future borrows only `self`.
        let name = name.to_owned();
        let params = params.clone();
        boxed(async move {
            let name = name.as_str();
            Ok(self.page(name, params).await?)
        })
    }

    fn delete(&self, name: &str, key: &str) -> impl Future<Output = ApiResult<Deleted>> + Send {
        // Owned: the future borrows only `self`.
        let name = name.to_owned();
        let key = key.to_owned();
        boxed(async move {
            let name = name.as_str();
            let key = key.as_str();
            Ok(self.delete_one(name, key).await?)
        })
    }

    fn delete_many(
        &self,
        name: &str,
        keys: &[&str],
    ) -> impl Future<Output = ApiResult<Vec<Deleted>>> + Send {
        // Owned: the future borrows only `self`.
        let name = name.to_owned();
        let keys: Vec<String> = keys.iter().map(|k| k.to_string()).collect();
        boxed(async move {
            let name = name.as_str();
            let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
            let keys = keys.as_slice();
            let keys = keys.iter().map(|k| k.to_string()).collect();
            Ok(self.delete_keys(name, keys).await?)
        })
    }

    fn upsert_records(
        &self,
        name: &str,
        records: &[Value],
        dry_run: bool,
    ) -> impl Future<Output = ApiResult<UpsertResult>> + Send {
        // Owned: the future borrows only `self`.
        let name = name.to_owned();
        let records = records.to_vec();
        boxed(async move {
            let name = name.as_str();
            let records = records.as_slice();
            let body = serde_json::to_vec(records)
                .map_err(|e| ApiError::invalid(format!("the records: {e}")))?;
            Ok(self.upsert_body(name, body, dry_run).await?)
        })
    }

    fn patch(
        &self,
        name: &str,
        key: &str,
        fields: &Value,
    ) -> impl Future<Output = ApiResult<Patched>> + Send {
        // Owned: the future borrows only `self`.
        let name = name.to_owned();
        let key = key.to_owned();
        let fields = fields.clone();
        boxed(async move {
            let name = name.as_str();
            let key = key.as_str();
            Ok(self.patch_fields(name, key, fields).await?)
        })
    }

    fn query_with(
        &self,
        name: &str,
        query: &str,
        request: &QueryRequest,
    ) -> impl Future<Output = ApiResult<QueryResult>> + Send {
        // Owned: the future borrows only `self`.
        let name = name.to_owned();
        let query = query.to_owned();
        let request = request.clone();
        boxed(async move {
            let name = name.as_str();
            let query = query.as_str();
            Ok(self.run_query(name, query, request).await?)
        })
    }

    fn search(
        &self,
        name: &str,
        request: &SearchRequest,
    ) -> impl Future<Output = ApiResult<Rows>> + Send {
        // Owned: the future borrows only `self`.
        let name = name.to_owned();
        let request = request.clone();
        boxed(async move {
            let name = name.as_str();
            Ok(self.search_column(name, request).await?)
        })
    }

    fn retrieve(
        &self,
        name: &str,
        request: &RetrieveRequest,
    ) -> impl Future<Output = ApiResult<Rows>> + Send {
        // Owned: the future borrows only `self`.
        let name = name.to_owned();
        let request = request.clone();
        boxed(async move {
            let name = name.as_str();
            Ok(self.retrieve_hybrid(name, request).await?)
        })
    }

    fn merge(&self, name: &str) -> impl Future<Output = ApiResult<MergeReport>> + Send {
        // Owned: the future borrows only `self`.
        let name = name.to_owned();
        boxed(async move {
            let name = name.as_str();
            Ok(self.merge_now(name).await?)
        })
    }

    fn compact(&self, name: &str) -> impl Future<Output = ApiResult<CompactionReport>> + Send {
        // Owned: the future borrows only `self`.
        let name = name.to_owned();
        boxed(async move {
            let name = name.as_str();
            Ok(self.compact_now(name).await?)
        })
    }

    fn index(
        &self,
        name: &str,
        column: Option<&str>,
    ) -> impl Future<Output = ApiResult<Indexed>> + Send {
        // Owned: the future borrows only `self`.
        let name = name.to_owned();
        let column = column.map(str::to_owned);
        boxed(async move {
            let name = name.as_str();
            let column = column.as_deref();
            Ok(self.build_indexes(name, column.map(str::to_string)).await?)
        })
    }

    fn stats(&self, name: &str) -> impl Future<Output = ApiResult<StoreStatus>> + Send {
        // Owned: the future borrows only `self`.
        let name = name.to_owned();
        boxed(async move {
            let name = name.as_str();
            Ok(self.status(name).await?)
        })
    }

    fn versions(&self, name: &str) -> impl Future<Output = ApiResult<Vec<TableVersion>>> + Send {
        // Owned: the future borrows only `self`.
        let name = name.to_owned();
        boxed(async move {
            let name = name.as_str();
            Ok(self.table_versions(name).await?)
        })
    }
}
