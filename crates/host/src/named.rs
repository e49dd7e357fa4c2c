//! A store opened by name: its registry entry, its plugin and its engine
//! handle, together — and the only way the host writes.
//!
//! Every write that carries records (`add`, `upsert`, `patch`) goes through
//! [`crate::pipeline::prepare`] (the plugin validates and may transform)
//! before the one engine call that writes; the engine handle is private, so
//! no caller — the CLI, the REST server, a test — can add rows the plugin has
//! not seen. Deletes carry keys only and go straight to the engine. Reads and
//! maintenance are plain delegations.

use lance_context_store::{
    AddOutcome, BatchStream, CompactionStats, MergeStats, PatchTarget, PatchedVersion, ScanRequest,
    Store, StoreStats, UpsertOutcome, VectorQuery, WalStatus,
};

use arrow_array::RecordBatch;

use crate::pipeline::{self, PipelineError};
use crate::plugin::{LoadedPlugin, PluginError};
use crate::query::QueryError;
use crate::registry::StoreEntry;
use crate::spec::{Capability, SchemaSpec};

/// A store opened through the [`crate::Registry`].
#[derive(Debug)]
pub struct NamedStore {
    entry: StoreEntry,
    plugin: LoadedPlugin,
    store: Store,
    /// What the probe before pinning warned about (a store just created).
    probe_warnings: Vec<String>,
}

/// Records the plugin prepared for an add ([`NamedStore::prepare`]): only
/// [`NamedStore::add_prepared`] writes them.
#[derive(Debug)]
pub struct Prepared {
    ready: RecordBatch,
    /// The bucket of each row (bucketed stores written here).
    buckets: Option<Vec<u32>>,
}

impl Prepared {
    /// The bucket of each row, in input order (`None`: not bucketed).
    pub fn buckets(&self) -> Option<&[u32]> {
        self.buckets.as_deref()
    }

    /// How many rows.
    pub fn rows(&self) -> usize {
        self.ready.num_rows()
    }
}

/// A named query that could not run: bad name or arguments, or the engine.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum QueryFailure {
    /// The query's name or arguments are wrong.
    #[error(transparent)]
    Query(#[from] QueryError),
    /// The engine failed.
    #[error(transparent)]
    Store(#[from] lance_context_store::Error),
    /// The plugin's reduce failed.
    #[error(transparent)]
    Plugin(#[from] PluginError),
}

impl NamedStore {
    pub(crate) fn new(entry: StoreEntry, plugin: LoadedPlugin, store: Store) -> Self {
        Self {
            entry,
            plugin,
            store,
            probe_warnings: Vec::new(),
        }
    }

    pub(crate) fn with_probe_warnings(mut self, warnings: Vec<String>) -> Self {
        self.probe_warnings = warnings;
        self
    }

    /// For a store [`crate::Registry::create`] just made: what the probe of
    /// its plugin warned about (empty for a store opened later).
    pub fn probe_warnings(&self) -> &[String] {
        &self.probe_warnings
    }

    /// The same store read at table version `version`: its entry and its
    /// loaded plugin as they are (nothing loaded again), the dataset opened
    /// read-only at that version.
    pub async fn at_version(
        &self,
        storage_options: &std::collections::HashMap<String, String>,
        version: u64,
    ) -> Result<NamedStore, lance_context_store::Error> {
        let config = crate::registry::store_config(&self.entry, &self.plugin, storage_options)
            .with_as_of(version);
        let store = Store::open_read_only(config).await?;
        Ok(NamedStore::new(
            self.entry.clone(),
            self.plugin.clone(),
            store,
        ))
    }

    /// The store's registry entry (name, uri, pinned plugin, spec).
    pub fn entry(&self) -> &StoreEntry {
        &self.entry
    }

    /// The store's name.
    pub fn name(&self) -> &str {
        &self.entry.name
    }

    /// The schema declaration the store was created with.
    pub fn spec(&self) -> &SchemaSpec {
        &self.entry.spec
    }

    /// The store's plugin (to read its declaration, or build input batches
    /// with [`pipeline::rows_from_json`]).
    pub fn plugin(&self) -> &LoadedPlugin {
        &self.plugin
    }

    /// Whether the store was opened without a writer.
    pub fn is_read_only(&self) -> bool {
        self.store.is_read_only()
    }

    // ---- writes: through the plugin ----

    /// Add records: the plugin validates (and may transform) them, then the
    /// engine writes them — durable and visible on return.
    pub async fn add(&self, batch: &RecordBatch) -> Result<AddOutcome, PipelineError> {
        self.add_at(batch, crate::now_micros()).await
    }

    /// [`Self::add`], the plugin's defaults taking the time `now_micros`
    /// (rows another instance sent: its time).
    pub async fn add_at(
        &self,
        batch: &RecordBatch,
        now_micros: i64,
    ) -> Result<AddOutcome, PipelineError> {
        let ready = pipeline::prepare(&self.plugin, batch, now_micros).await?;
        Ok(self.store.add(&ready).await?)
    }

    /// The checks a delete makes of its keys, without deleting.
    pub fn check_keys(&self, ids: &[&str]) -> Result<(), lance_context_store::Error> {
        self.store.check_keys(ids)
    }

    /// The plugin's part of an add alone (validate, transform), and the
    /// bucket of each prepared row when the store is bucketed and written
    /// here: what [`Self::add_prepared`] writes, whole or in part. A store
    /// with scale-out peers writes the rows of its own buckets and sends
    /// the others' input rows to their owners (`crate::members`).
    ///
    /// `now_micros`: the time the plugin's defaults take (the receiving
    /// instance's, passed on with rows sent to their owners, so one request
    /// has one time). The engine's checks of the whole batch run here too
    /// (keys, vectors), so a batch split between instances is refused whole
    /// before any part is written.
    pub async fn prepare(
        &self,
        batch: &RecordBatch,
        now_micros: i64,
    ) -> Result<Prepared, PipelineError> {
        let ready = pipeline::prepare(&self.plugin, batch, now_micros).await?;
        if self.store.bucket_count().is_some() {
            self.store.check_batch(&ready)?;
        }
        let buckets = match self.store.bucket_count() {
            Some(_) if ready.num_rows() == batch.num_rows() => {
                let keys = ready
                    .column_by_name(&self.entry.spec.key)
                    .and_then(|c| c.as_any().downcast_ref::<arrow_array::StringArray>());
                match keys {
                    Some(keys) if arrow_array::Array::null_count(keys) == 0 => {
                        let keys: Vec<&str> = keys.iter().flatten().collect();
                        self.store.buckets_of_keys(&keys)?
                    }
                    _ => None,
                }
            }
            _ => None,
        };
        Ok(Prepared { ready, buckets })
    }

    /// Write the rows `rows` of a batch [`Self::prepare`] made (all: `None`).
    pub async fn add_prepared(
        &self,
        prepared: &Prepared,
        rows: Option<&[u32]>,
    ) -> Result<AddOutcome, PipelineError> {
        let Some(rows) = rows else {
            return Ok(self.store.add(&prepared.ready).await?);
        };
        let indices = arrow_array::UInt32Array::from(rows.to_vec());
        let columns = prepared
            .ready
            .columns()
            .iter()
            .map(|c| arrow_select::take::take(c.as_ref(), &indices, None))
            .collect::<Result<Vec<_>, _>>()
            .map_err(lance_context_store::Error::from)?;
        let part = RecordBatch::try_new(prepared.ready.schema(), columns)
            .map_err(lance_context_store::Error::from)?;
        Ok(self.store.add(&part).await?)
    }

    /// A bucketed store's bucket count (`None`: not bucketed).
    pub fn bucket_count(&self) -> Option<u32> {
        self.store.bucket_count()
    }

    /// The buckets this handle writes.
    pub fn owned_buckets(&self) -> Vec<u32> {
        self.store.owned_buckets()
    }

    /// The bucket of each key (`None`: not bucketed, or read-only).
    pub fn buckets_of_keys(
        &self,
        keys: &[&str],
    ) -> Result<Option<Vec<u32>>, lance_context_store::Error> {
        self.store.buckets_of_keys(keys)
    }

    /// Each owned bucket and the epoch its shard is held at.
    pub fn bucket_epochs(&self) -> Vec<(u32, Option<u64>)> {
        self.store.bucket_epochs()
    }

    /// The engine handle's notes (`_lance_context/…` kept with the data):
    /// the scale-out membership records (`crate::members`).
    pub(crate) fn engine(&self) -> &Store {
        &self.store
    }

    /// Insert or replace records by the schema's secondary key: the plugin
    /// validates (and may transform) them, then the engine's upsert
    /// (supersession). Per row, what happened, in input order.
    pub async fn upsert(&self, batch: &RecordBatch) -> Result<Vec<UpsertOutcome>, PipelineError> {
        let ready = pipeline::prepare(&self.plugin, batch, crate::now_micros()).await?;
        Ok(self.store.upsert(&ready).await?)
    }

    /// What [`Self::upsert`] of `batch` would do now: the plugin validates
    /// (and may transform) the records, the engine checks them as an upsert
    /// does; nothing is written.
    pub async fn check_upsert(
        &self,
        batch: &RecordBatch,
    ) -> Result<Vec<UpsertOutcome>, PipelineError> {
        let ready = pipeline::prepare(&self.plugin, batch, crate::now_micros()).await?;
        Ok(self.store.check_upsert(&ready).await?)
    }

    /// Patch a record as a new version under a fresh key: the engine builds
    /// the version, the plugin validates (and may transform) it, the engine
    /// writes it if the record is still current. `None` when no visible
    /// record matches.
    pub async fn patch(
        &self,
        target: &PatchTarget,
        patch: &RecordBatch,
    ) -> Result<Option<PatchedVersion>, PipelineError> {
        let Some(mut version) = self
            .store
            .patch_version(target, patch, &lance_context_store::generate_id())
            .await?
        else {
            return Ok(None);
        };
        version.row = pipeline::prepare(&self.plugin, &version.row, crate::now_micros()).await?;
        self.store.add_new_versions(&version.row).await?;
        Ok(Some(version))
    }

    /// Delete records by key; per key given, whether a visible record was
    /// deleted. A schema with tombstones writes a tombstone per record (the
    /// key is free again); others delete the key.
    pub async fn delete(&self, ids: &[&str]) -> Result<Vec<bool>, lance_context_store::Error> {
        if self.entry.spec.has(Capability::Tombstones) {
            return self.store.tombstone(ids).await;
        }
        let key = self.store.key_column().to_string();
        let found = self
            .store
            .lookup(ids, Some(std::slice::from_ref(&key)))
            .await?;
        let held: std::collections::HashSet<String> = found
            .column_by_name(&key)
            .and_then(|c| c.as_any().downcast_ref::<arrow_array::StringArray>())
            .map(|a| a.iter().flatten().map(str::to_string).collect())
            .unwrap_or_default();
        if !ids.is_empty() {
            self.store.delete(ids).await?;
        }
        Ok(ids.iter().map(|id| held.contains(*id)).collect())
    }

    // ---- reads ----

    /// The record with key `id` (newest version), as a one-row batch.
    pub async fn get(&self, id: &str) -> Result<Option<RecordBatch>, lance_context_store::Error> {
        self.store.get(id).await
    }

    /// The records with these keys, `projection`'s columns (all when `None`).
    pub async fn lookup(
        &self,
        ids: &[&str],
        projection: Option<&[String]>,
    ) -> Result<RecordBatch, lance_context_store::Error> {
        self.store.lookup(ids, projection).await
    }

    /// Scan into one batch (visible records only unless the request says).
    pub async fn scan(
        &self,
        request: ScanRequest,
    ) -> Result<RecordBatch, lance_context_store::Error> {
        self.store.scan(request).await
    }

    /// Scan as a stream of batches.
    pub async fn scan_stream(
        &self,
        request: ScanRequest,
    ) -> Result<BatchStream, lance_context_store::Error> {
        self.store.scan_stream(request).await
    }

    /// Visible records, optionally matching a SQL filter.
    pub async fn count(&self, filter: Option<&str>) -> Result<u64, lance_context_store::Error> {
        self.store.count(filter).await
    }

    /// Nearest neighbours in a declared vector column.
    pub async fn nearest(
        &self,
        query: &VectorQuery,
    ) -> Result<RecordBatch, lance_context_store::Error> {
        self.store.nearest(query).await
    }

    /// The best BM25 matches in a declared text column.
    pub async fn search_text(
        &self,
        query: &lance_context_store::TextQuery,
    ) -> Result<RecordBatch, lance_context_store::Error> {
        self.store.search_text(query).await
    }

    /// Vector and text legs fused by reciprocal rank fusion.
    pub async fn retrieve(
        &self,
        query: &lance_context_store::RetrieveQuery,
    ) -> Result<RecordBatch, lance_context_store::Error> {
        self.store.retrieve(query).await
    }

    /// A SQL predicate and typed conditions as one predicate over this
    /// store's columns.
    pub fn filter_of(
        &self,
        sql: Option<&str>,
        conditions: &[lance_context_store::Condition],
    ) -> Result<Option<String>, lance_context_store::Error> {
        self.store.filter_of(sql, conditions)
    }

    /// Run one of the schema's named queries (see [`crate::query`]); for a
    /// reducing query, the rows it reduces.
    pub async fn query(
        &self,
        name: &str,
        args: &[(String, String)],
    ) -> Result<RecordBatch, QueryFailure> {
        let request = crate::query::named_request(&self.entry.spec, name, args)?;
        Ok(self.store.scan(request).await?)
    }

    /// Run a named query declared with `reduce`: its rows, reduced to JSON by
    /// the plugin (e.g. datagen's `item_state`, the fold of an item's events).
    pub async fn reduce(
        &self,
        name: &str,
        args: &[(String, String)],
    ) -> Result<Box<serde_json::value::RawValue>, QueryFailure> {
        let query = self
            .entry
            .spec
            .queries
            .iter()
            .find(|q| q.name == name && q.reduce)
            .ok_or_else(|| {
                QueryError::Arguments(format!(
                    "'{name}' is not a reducing query of schema '{}'",
                    self.entry.spec.name
                ))
            })?;
        let request = crate::query::named_request(&self.entry.spec, &query.name, args)?;
        let rows = self.store.scan(request).await?;
        Ok(self
            .plugin
            .reduce_async(name.to_string(), rows, crate::now_micros())
            .await?)
    }

    // ---- maintenance ----

    /// Fold unmerged generations into the base table now (then cleanup and
    /// retention).
    pub async fn merge(&self) -> Result<MergeStats, lance_context_store::Error> {
        self.store.merge().await
    }

    /// Compact the base table's small fragments (needs no writer).
    pub async fn compact(&self) -> Result<CompactionStats, lance_context_store::Error> {
        self.store.compact().await
    }

    /// Build (or rebuild) the vector index of a declared vector column.
    pub async fn build_vector_index(&self, column: &str) -> Result<(), lance_context_store::Error> {
        self.store.build_vector_index(column).await
    }

    /// Remove old base-table versions by the retention policy now.
    pub async fn apply_retention(&self) -> Result<u64, lance_context_store::Error> {
        self.store.apply_retention().await
    }

    /// Version, fragments, indexes, unmerged tier, bytes on disk.
    pub async fn stats(&self) -> Result<StoreStats, lance_context_store::Error> {
        self.store.stats().await
    }

    /// The base table's kept versions, oldest first (time travel targets).
    pub async fn versions(
        &self,
    ) -> Result<Vec<lance_context_store::VersionInfo>, lance_context_store::Error> {
        self.store.versions().await
    }

    /// The write-ahead tier: unmerged generations per shard.
    pub async fn wal_status(&self) -> Result<WalStatus, lance_context_store::Error> {
        self.store.wal_status().await
    }

    /// Take the store back after `Fenced` (see the engine's `reclaim`).
    pub async fn reclaim(&self) -> Result<(), lance_context_store::Error> {
        self.store.reclaim().await
    }

    /// Flush and release the writer; stop background maintenance.
    pub async fn close(&self) -> Result<(), lance_context_store::Error> {
        self.store.close().await
    }
}
