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
mod queries;
mod records;
mod stores;

use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use lance_context_client::{
    Added, AdoptStore, Adopted, ApiResult, CompactionReport, CreateStore, Deleted, Dropped,
    Indexed, ListParams, MergeReport, Page, Patched, QueryResult, RecordsBody, RetrieveRequest,
    Rows, SearchRequest, StoreApi, StoreInfo, StoreStatus, UpsertResult,
};
use serde_json::Value;
use tokio::sync::{Mutex, OnceCell, Semaphore};
use tokio_util::task::TaskTracker;

pub(crate) use error::{ApiError, status};

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
    /// Writes (claims the writer when stores are opened per call).
    Write,
}

impl Default for EmbeddedConfig {
    /// 32 operations per store, a 2 s queue wait, no deadline, any uri,
    /// stores kept open.
    fn default() -> Self {
        Self {
            storage_options: HashMap::new(),
            store_concurrency: 32,
            queue_wait: Duration::from_secs(2),
            deadline: None,
            allowed_uri_prefixes: None,
            residency: Residency::Resident,
        }
    }
}

/// A store held open.
#[derive(Debug)]
pub(crate) struct OpenStore {
    pub named: NamedStore,
    pub slots: Arc<Semaphore>,
}

type Cell = Arc<OnceCell<Arc<OpenStore>>>;

/// The stores held open, and the names being dropped.
#[derive(Debug, Default)]
struct Stores {
    /// A cell per store, filled by the first operation (or by its create).
    open: HashMap<String, Cell>,
    /// Names being dropped: no operation opens them meanwhile.
    dropping: std::collections::HashSet<String>,
}

impl Stores {
    /// The cell of store `name`, made when there is none; `not_found`
    /// while the store is being dropped.
    fn cell(&mut self, name: &str) -> Result<Cell, ApiError> {
        if self.dropping.contains(name) {
            return Err(being_dropped(name));
        }
        Ok(self.open.entry(name.to_string()).or_default().clone())
    }

    /// Forget `cell` of `name` when it is still the one kept and empty (an
    /// open or create that failed: nothing is remembered).
    fn forget_empty(&mut self, name: &str, cell: &Cell) {
        if self
            .open
            .get(name)
            .is_some_and(|c| Arc::ptr_eq(c, cell) && c.get().is_none())
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
}

impl Embedded {
    /// The store API over `registry`'s stores.
    pub fn new(registry: Registry, config: EmbeddedConfig) -> Self {
        Self {
            registry,
            stores: Mutex::new(Stores::default()),
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
            .filter_map(|(_, cell)| cell.get().cloned())
            .collect();
        let mut first_error = None;
        for store in stores {
            if let Err(e) = store.named.close().await {
                tracing::warn!(store = store.named.name(), error = %e, "closing a store");
                first_error.get_or_insert(e);
            }
        }
        match first_error {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    fn new_slots(&self) -> Arc<Semaphore> {
        Arc::new(Semaphore::new(self.config.store_concurrency))
    }

    /// The store, opened (with its writer) on first use and kept. The map
    /// is locked only to find the store's cell: opening one store does not
    /// hold operations on the others.
    async fn open(&self, name: &str) -> Result<Arc<OpenStore>, ApiError> {
        let cell = self.stores.lock().await.cell(name)?;
        let store = cell
            .get_or_try_init(|| async {
                let named = self
                    .registry
                    .open(name, &self.config.storage_options)
                    .await?;
                Ok::<_, ApiError>(Arc::new(OpenStore {
                    named,
                    slots: self.new_slots(),
                }))
            })
            .await;
        match store {
            Ok(store) => Ok(store.clone()),
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
    ) -> Result<crate::StoreEntry, ApiError> {
        if self.config.residency == Residency::PerCall {
            let named = self.registry.create(name, options).await?;
            let entry = named.entry().clone();
            named.close().await?;
            return Ok(entry);
        }
        let cell = self.stores.lock().await.cell(name)?;
        let mut options = Some(options);
        let mut created = None;
        let filled = cell
            .get_or_try_init(|| async {
                let options = options.take().expect("taken once");
                let named = self.registry.create(name, options).await?;
                created = Some(named.entry().clone());
                Ok::<_, ApiError>(Arc::new(OpenStore {
                    named,
                    slots: self.new_slots(),
                }))
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
                let entry = named.entry().clone();
                named.close().await?;
                Ok(entry)
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

    /// Drop store `name`: no operation opens it meanwhile; its running
    /// operations end first, those queued are refused (`not_found`), its
    /// writer is released, then `drop` runs.
    async fn dropping<T>(
        &self,
        name: &str,
        drop: impl Future<Output = Result<T, ApiError>>,
    ) -> Result<T, ApiError> {
        let cell = {
            let mut stores = self.stores.lock().await;
            if !stores.dropping.insert(name.to_string()) {
                return Err(being_dropped(name));
            }
            stores.open.remove(name)
        };
        let result = async {
            // An open of this cell under way ends first (its handle is
            // closed here); none is started.
            let open = match cell {
                Some(cell) => cell
                    .get_or_try_init(|| async { Err::<Arc<OpenStore>, ()>(()) })
                    .await
                    .ok()
                    .cloned(),
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
                open.named.close().await?;
            }
            drop.await
        }
        .await;
        self.stores.lock().await.dropping.remove(name);
        result
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
        if self.config.residency == Residency::PerCall {
            return self.once(name, access, work).await;
        }
        let store = self.open(name).await?;
        let permit =
            tokio::time::timeout(self.config.queue_wait, store.slots.clone().acquire_owned())
                .await
                .map_err(|_| {
                    ApiError::of_kind(
                        ErrorKind::Busy,
                        format!(
                            "store '{name}' is running {} operations; retry later",
                            self.config.store_concurrency
                        ),
                    )
                })?
                .map_err(|_| being_dropped(name))?;
        let handle = store.clone();
        let work = work(store);
        let task = self.tasks.spawn(async move {
            let _slot = permit;
            work.await
        });
        let ended = match self.config.deadline {
            Some(deadline) => tokio::time::timeout(deadline, task)
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
    /// this operation (a writer only for a write), closed after it.
    async fn once<T, F, Fut>(&self, name: &str, access: Access, work: F) -> Result<T, ApiError>
    where
        F: FnOnce(Arc<OpenStore>) -> Fut,
        Fut: Future<Output = Result<T, ApiError>> + Send + 'static,
        T: Send + 'static,
    {
        let options = &self.config.storage_options;
        let named = match access {
            Access::Read => self.registry.open_with(name, options, true, |c| c).await?,
            Access::Write => {
                self.registry
                    .open_with(name, options, false, |c| c.with_manual_maintenance())
                    .await?
            }
        };
        let store = Arc::new(OpenStore {
            named,
            slots: self.new_slots(),
        });
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
        joined(task.await)
    }
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
/// `records`, `queries`, `admin`), its error as the API's.
impl StoreApi for Embedded {
    async fn create_store(&self, create: &CreateStore) -> ApiResult<StoreInfo> {
        Ok(self.create(create.clone()).await?)
    }

    async fn adopt(&self, name: &str, request: &AdoptStore) -> ApiResult<Adopted> {
        Ok(self.adopt_dataset(name, request.clone()).await?)
    }

    async fn list_stores(&self) -> ApiResult<Vec<StoreInfo>> {
        Ok(self.stores()?)
    }

    async fn describe_store(&self, name: &str) -> ApiResult<StoreInfo> {
        Ok(self.describe(name)?)
    }

    async fn drop_store(&self, name: &str) -> ApiResult<Dropped> {
        Ok(self.drop_named(name).await?)
    }

    async fn add_records(&self, name: &str, records: RecordsBody) -> ApiResult<Added> {
        Ok(self.add_body(name, records).await?)
    }

    async fn get(&self, name: &str, key: &str) -> ApiResult<Option<Value>> {
        Ok(self.get_one(name, key).await?)
    }

    async fn get_many(&self, name: &str, keys: &[&str]) -> ApiResult<Rows> {
        let keys = keys.iter().map(|k| k.to_string()).collect();
        Ok(self.lookup(name, keys).await?)
    }

    async fn list(&self, name: &str, params: &ListParams) -> ApiResult<Page> {
        Ok(self.page(name, params.clone()).await?)
    }

    async fn delete(&self, name: &str, key: &str) -> ApiResult<Deleted> {
        Ok(self.delete_one(name, key).await?)
    }

    async fn upsert_records(
        &self,
        name: &str,
        records: &[Value],
        dry_run: bool,
    ) -> ApiResult<UpsertResult> {
        let body = serde_json::to_vec(records)
            .map_err(|e| ApiError::invalid(format!("the records: {e}")))?;
        Ok(self.upsert_body(name, body, dry_run).await?)
    }

    async fn patch(&self, name: &str, key: &str, fields: &Value) -> ApiResult<Patched> {
        Ok(self.patch_fields(name, key, fields.clone()).await?)
    }

    async fn query(
        &self,
        name: &str,
        query: &str,
        args: &[(&str, &str)],
    ) -> ApiResult<QueryResult> {
        let args = args
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Ok(self.run_query(name, query, args).await?)
    }

    async fn search(&self, name: &str, request: &SearchRequest) -> ApiResult<Rows> {
        Ok(self.search_column(name, request.clone()).await?)
    }

    async fn retrieve(&self, name: &str, request: &RetrieveRequest) -> ApiResult<Rows> {
        Ok(self.retrieve_hybrid(name, request.clone()).await?)
    }

    async fn merge(&self, name: &str) -> ApiResult<MergeReport> {
        Ok(self.merge_now(name).await?)
    }

    async fn compact(&self, name: &str) -> ApiResult<CompactionReport> {
        Ok(self.compact_now(name).await?)
    }

    async fn index(&self, name: &str, column: Option<&str>) -> ApiResult<Indexed> {
        Ok(self.build_indexes(name, column.map(str::to_string)).await?)
    }

    async fn stats(&self, name: &str) -> ApiResult<StoreStatus> {
        Ok(self.status(name).await?)
    }
}
