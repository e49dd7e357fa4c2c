//! The shared state behind a [`crate::Store`] and its maintenance: merge,
//! compaction, indexes, stats, and the background task that triggers them.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime};

use lance::Dataset;
use lance::dataset::mem_wal::scanner::SsTableCache;
use lance::dataset::optimize::{CompactionOptions, compact_files};
use lance::index::DatasetIndexExt;
use lance::index::vector::VectorIndexParams;
use lance_index::IndexType;
use lance_index::optimize::OptimizeOptions;
use lance_index::scalar::ScalarIndexParams;
use lance_linalg::distance::MetricType;
use roaring::RoaringBitmap;
use tokio::sync::{Mutex, Notify, RwLock};
use uuid::Uuid;

use crate::config::{
    CompactionSettings, IndexSettings, MergeSettings, Metric, RetentionSettings, VectorIndexKind,
    WriterSettings,
};
use crate::dataset::{Opener, ensure_mem_wal};
use crate::error::{Error, LanceResultExt, Result};
#[cfg(feature = "failpoints")]
use crate::merge::MergeHook;
use crate::merge::{MergeContext, MergeFailpoint, MergeState, MergeStats, merge_shard};
use crate::read::{ManifestCache, ReadView, list_shards, shard_snapshots};
use crate::writer::Writer;

/// Settings the maintenance needs.
#[derive(Debug, Clone)]
pub(crate) struct Settings {
    pub merge: MergeSettings,
    pub compaction: CompactionSettings,
    pub indexes: IndexSettings,
    pub retention: RetentionSettings,
    pub writer: WriterSettings,
    pub shard_policy: crate::config::ShardPolicy,
}

/// Attempts [`Engine::compact`] makes when its commit loses a race.
const COMPACTION_ATTEMPTS: u32 = 5;

/// The pause before a compaction's next attempt, times the attempts made.
const COMPACTION_RETRY_PAUSE: Duration = Duration::from_millis(50);

/// Compaction bookkeeping.
#[derive(Debug, Default)]
pub(crate) struct CompactionState {
    running: Mutex<()>,
    last: std::sync::Mutex<Option<SystemTime>>,
    total: AtomicU64,
}

/// What a compaction did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CompactionStats {
    /// Fragments rewritten away.
    pub fragments_removed: usize,
    /// Fragments written.
    pub fragments_added: usize,
    /// Data and deletion files removed.
    pub files_removed: usize,
    /// Data files added.
    pub files_added: usize,
    /// Old versions removed by the retention policy afterwards.
    pub versions_removed: u64,
    /// Indexes remapped to the rows' new places (Lance compacts with the
    /// index remap deferred; see [`Engine::compact`]).
    pub indexes_remapped: usize,
    /// Versions of the fragment-reuse history left after the remap: 0 once
    /// every index is remapped. More means an index was not remapped (the
    /// engine logs why; Lance logs its own reasons, e.g. an index it cannot
    /// open, under the `lance` target) or another compaction raced this
    /// one: reads stay right, and every new handle rebuilds the row-address
    /// map of the rows those versions moved; the next compaction tries
    /// again.
    pub fragment_reuse_versions: usize,
}

/// One index, as operators see it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IndexStats {
    /// Index name.
    pub name: String,
    /// Indexed columns.
    pub columns: Vec<String>,
    /// Kind (`BTree`, `ZoneMap`, `Vector`, …) from the index's details type.
    pub kind: String,
    /// Fragments of the base table the index does not cover (their rows are
    /// still found, by scanning).
    pub unindexed_fragments: usize,
    /// Whether the index covers every row of the base table.
    pub covers_all_rows: bool,
    /// Segments: one from the build, one more per extension over new
    /// fragments (each merge) until a fold or a compaction. A search reads
    /// every segment; key indexes are folded past four.
    pub segments: usize,
}

/// Operator statistics of a store.
#[derive(Debug, Clone, PartialEq)]
pub struct StoreStats {
    /// Dataset version.
    pub version: u64,
    /// Rows in the base table (excluding unmerged generations).
    pub rows_in_base: u64,
    /// Fragments of the base table.
    pub fragments: usize,
    /// Fragments smaller than the compaction target.
    pub small_fragments: usize,
    /// Unmerged generations per shard.
    pub pending_generations: Vec<(Uuid, usize)>,
    /// Indexes of the base table (system indexes left out).
    pub indexes: Vec<IndexStats>,
    /// Last merge finished by this instance.
    pub last_merge: Option<SystemTime>,
    /// Last compaction finished by this instance.
    pub last_compaction: Option<SystemTime>,
    /// Compactions finished by this instance.
    pub compactions: u64,
    /// The last error of a background merge or compaction, if any.
    pub last_background_error: Option<String>,
    /// Versions of the base table kept (see the retention settings).
    pub versions: usize,
    /// Bytes of every object under the store's location: base table, indexes,
    /// old versions, WAL, generations.
    pub bytes_on_disk: u64,
    /// Rows (as flushed, duplicates included) in unmerged generations.
    pub unmerged_rows: u64,
    /// Bytes (as the writer measured them) of unmerged generations.
    pub unmerged_bytes: u64,
    /// Bytes of the data files the base table's current version references:
    /// what the store would hold with no history, WAL or indexes.
    pub base_data_bytes: u64,
    /// Each shard's manifest: how many versions are kept and their bytes,
    /// the newest one's size and how many generations it lists. Merges trim
    /// the list to unmerged generations and cleanup keeps old versions
    /// bounded, so these stay small however long the store lives.
    pub shard_manifests: Vec<ShardManifestStats>,
    /// Whether this handle's background maintenance (merges, compactions,
    /// cleanup on their triggers) runs, and if not, why.
    pub maintenance: MaintenanceState,
    /// Buckets of a bucketed store (1: no bucket sharding; see
    /// [`crate::StoreConfig::with_buckets`]). Each bucket's shard is in
    /// `pending_generations` and `shard_manifests` under the shard id of
    /// its instance id (`bucket-0000`, …).
    pub buckets: u32,
    /// The buckets this handle writes (empty without buckets).
    pub owned_buckets: Vec<u32>,
}

/// One shard's manifest on storage (see [`StoreStats::shard_manifests`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShardManifestStats {
    /// The shard.
    pub shard: Uuid,
    /// Manifest versions kept on storage.
    pub versions: usize,
    /// Their bytes.
    pub bytes: u64,
    /// The newest version's number.
    pub newest_version: u64,
    /// The newest version's bytes: what every read of the shard's state reads.
    pub newest_bytes: u64,
    /// Generations the newest version lists (merged ones included until a
    /// merge trims them).
    pub listed_generations: usize,
}

/// Background maintenance of one store handle (see [`StoreStats::maintenance`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MaintenanceState {
    /// Merges, compactions and cleanup run on their configured triggers.
    Running,
    /// The task runs but skips every trigger, for the reason given: the
    /// writer was fenced by another instance (until `reclaim` or a reopen) or
    /// is taking its shard back after a failed WAL write (it resumes by
    /// itself).
    Paused {
        /// Why.
        reason: String,
    },
    /// No maintenance runs on this handle, for the reason given (opened
    /// read-only, no trigger configured, closed, or the task ended).
    Off {
        /// Why.
        reason: String,
    },
}

impl MaintenanceState {
    /// A short name: `running`, `paused` or `off`.
    pub fn name(&self) -> &'static str {
        match self {
            Self::Running => "running",
            Self::Paused { .. } => "paused",
            Self::Off { .. } => "off",
        }
    }

    /// Why it is paused or off.
    pub fn reason(&self) -> Option<&str> {
        match self {
            Self::Running => None,
            Self::Paused { reason } | Self::Off { reason } => Some(reason),
        }
    }
}

impl std::fmt::Display for MaintenanceState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.reason() {
            None => f.write_str(self.name()),
            Some(reason) => write!(f, "{} ({reason})", self.name()),
        }
    }
}

impl StoreStats {
    /// The index named `name` (`<column>_idx` for the engine's own).
    pub fn index(&self, name: &str) -> Option<&IndexStats> {
        self.indexes.iter().find(|i| i.name == name)
    }
}

pub(crate) struct Engine {
    pub opener: Opener,
    pub key: String,
    pub dataset: RwLock<Arc<Dataset>>,
    pub generations: Arc<SsTableCache>,
    /// Unmerged generations held whole, for keyed reads (see
    /// [`crate::read::keyed_rows`]).
    pub held: Arc<crate::read::HeldGenerations>,
    /// The shard manifests this handle read last (see [`ManifestCache`]).
    pub manifests: ManifestCache,
    pub shard: Uuid,
    pub writer: Option<Writer>,
    pub settings: Settings,
    pub merge_state: MergeState,
    pub compaction_state: CompactionState,
    /// Wakes the background task after an add (count trigger).
    pub kick: Notify,
    pub last_background_error: std::sync::Mutex<Option<String>>,
    /// When this handle last applied the retention policy.
    pub last_retention: std::sync::Mutex<Option<std::time::Instant>>,
    /// The store's visibility rules when it has record capabilities (merges
    /// carry the visible count).
    pub rules: Option<Arc<crate::store::visible::Rules>>,
    /// What the merges of other shards' generations taken over at a claim
    /// did (`merged_up_to` unset: they are of other shards).
    pub taken_over: std::sync::Mutex<MergeStats>,
    /// Views taken so far (tests: how many a write's checks take).
    #[cfg(feature = "failpoints")]
    pub views: std::sync::atomic::AtomicUsize,
    /// Awaited by the next compaction attempt after it read the version it
    /// compacts, before it compacts (tests: a commit racing it).
    #[cfg(feature = "failpoints")]
    pub compaction_pause: std::sync::Mutex<Option<crate::merge::ReclaimHook>>,
    /// Awaited by the next view after it read the base table, before it
    /// reads the shard manifests (tests: a takeover between the two).
    #[cfg(feature = "failpoints")]
    pub view_pause: std::sync::Mutex<Option<crate::merge::ReclaimHook>>,
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine")
            .field("opener", &self.opener)
            .field("shard", &self.shard)
            .finish_non_exhaustive()
    }
}

impl Engine {
    pub fn writer(&self) -> Result<&Writer> {
        self.writer
            .as_ref()
            .ok_or_else(|| Error::WriterUnavailable {
                message: "the store was opened read-only".to_string(),
            })
    }

    /// The newest base version, kept as this store's handle.
    pub async fn fresh_dataset(&self) -> Result<Arc<Dataset>> {
        let current = self.dataset.read().await.clone();
        let fresh = self.opener.refresh(&current).await?;
        if !Arc::ptr_eq(&fresh, &current) {
            self.publish(fresh.clone()).await;
        }
        Ok(fresh)
    }

    async fn publish(&self, dataset: Arc<Dataset>) {
        let mut slot = self.dataset.write().await;
        if slot.version().version < dataset.version().version {
            *slot = dataset;
        }
    }

    /// A consistent read view: base snapshot, then shard manifests.
    ///
    /// The two reads are not atomic: a reader that pauses between them longer
    /// than the cleanup grace could see a base without a merge and a manifest
    /// without the generations it merged. A shard whose listing starts past
    /// the base's marker says so; the view is then taken again if the base
    /// has moved meanwhile.
    pub async fn view(&self) -> Result<ReadView> {
        // A version (time travel) is the base table alone.
        if self.opener.is_pinned() {
            return Ok(ReadView {
                dataset: self.fresh_dataset().await?,
                shards: Vec::new(),
                generations: self.generations.clone(),
            });
        }
        #[cfg(feature = "failpoints")]
        self.views
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let mut attempts = 0;
        loop {
            // The shard listing does not depend on the base version: it runs
            // beside the refresh. The manifests are read after it.
            let current = self.dataset.read().await.clone();
            let (dataset, shard_ids) =
                futures::try_join!(self.fresh_dataset(), list_shards(&current))?;
            #[cfg(feature = "failpoints")]
            crate::merge::await_pause(&self.view_pause).await;
            let shards = shard_snapshots(&dataset, shard_ids, &self.manifests).await?;
            attempts += 1;
            // Lance dedupes a key within a shard only. Under `SingleWriter`,
            // two shards holding unmerged rows against this base means a
            // takeover merged one after this base was read and then wrote
            // the same keys through the other: the base has moved, and the
            // view is taken again, so a key is never read twice. (Under
            // `PartitionedKeys` keys never cross shards: no check, no I/O.)
            let crossing = self.settings.shard_policy == crate::config::ShardPolicy::SingleWriter
                && shards.iter().filter(|s| s.unmerged > 0).count() > 1;
            if attempts < 4 && (crossing || shards.iter().any(|s| s.gap)) {
                let latest = dataset
                    .latest_version_id()
                    .await
                    .ctx("checking for a newer dataset version")?;
                if latest != dataset.version().version {
                    continue;
                }
            }
            return Ok(ReadView {
                dataset,
                shards,
                generations: self.generations.clone(),
            });
        }
    }

    /// Every shard's unmerged generations as of `dataset` (listed, then their
    /// manifests read).
    async fn shards(&self, dataset: &Dataset) -> Result<Vec<crate::read::ShardView>> {
        let shard_ids = list_shards(dataset).await?;
        shard_snapshots(dataset, shard_ids, &self.manifests).await
    }

    /// A fresh dataset for the writer's persistence-failure retry.
    pub async fn reopen_for_writer(&self) -> Result<Dataset> {
        let mut dataset = self.opener.open().await?;
        ensure_mem_wal(&mut dataset, None).await?;
        Ok(dataset)
    }

    fn merge_context<'a>(
        &'a self,
        dataset: Arc<Dataset>,
        shard: Uuid,
        writer: Option<&'a Writer>,
        fail_at: Option<MergeFailpoint>,
    ) -> MergeContext<'a> {
        MergeContext {
            dataset,
            key: &self.key,
            shard,
            writer,
            settings: &self.settings.merge,
            store_params: self.opener.store_params(),
            opener: &self.opener,
            generations: self.generations.clone(),
            rules: self.rules.as_deref(),
            state: &self.merge_state,
            fail_at,
            #[cfg(feature = "failpoints")]
            hook: None,
        }
    }

    /// Merge this instance's shard into the base table (see [`crate::merge`]),
    /// then extend the indexes and apply the retention policy. A fenced
    /// handle does not merge.
    pub async fn merge(
        &self,
        fail_at: Option<MergeFailpoint>,
        #[cfg(feature = "failpoints")] hook: Option<MergeHook>,
    ) -> Result<MergeStats> {
        let writer = self.writer()?;
        writer.check_latch()?;
        let dataset = self.fresh_dataset().await?;
        #[allow(unused_mut)]
        let mut ctx = self.merge_context(dataset, self.shard, Some(writer), fail_at);
        #[cfg(feature = "failpoints")]
        {
            ctx.hook = hook;
        }
        let mut stats = Box::pin(merge_shard(ctx)).await?;
        if stats.generations_merged > 0 {
            // New base fragments: bring the indexes over them.
            let started = std::time::Instant::now();
            self.refresh_indexes().await?;
            stats.phases.indexes += started.elapsed();
        }
        let started = std::time::Instant::now();
        stats.versions_removed = self.retain(false).await?;
        stats.phases.retention += started.elapsed();
        Ok(stats)
    }

    /// The single-writer takeover (see [`crate::ShardPolicy::SingleWriter`]):
    /// claim every other shard (fencing a writer still on it, replaying and
    /// flushing its WAL tail), then merge it, so that nothing written through
    /// another shard is left unmerged when this one writes.
    pub async fn take_over_other_shards(&self, dataset: &Dataset) -> Result<()> {
        for view in self.shards(dataset).await? {
            let other = view.snapshot.shard_id;
            if other == self.shard {
                continue;
            }
            let conflict = |e: Error| {
                tracing::warn!(shard = %other, "taking over a shard failed: {e}");
                Error::ShardConflict {
                    ours: self.shard,
                    other,
                    generations: view.unmerged,
                }
            };
            let claimed = Writer::open(dataset, other, self.settings.writer.clone())
                .await
                .map_err(conflict)?;
            // Merged under the claim, so that its cleanup may trim the
            // shard's list as the owner's would. A merge the shard's former
            // owner committed first (it merged before it saw the fence)
            // makes ours stale: merging is idempotent, so go again on the
            // newer base.
            let mut attempt = 0;
            let merged = loop {
                attempt += 1;
                let fresh = Arc::new(self.opener.open().await?);
                let merged = Box::pin(merge_shard(self.merge_context(
                    fresh,
                    other,
                    Some(&claimed),
                    None,
                )))
                .await;
                match merged {
                    Err(Error::Conflict { .. }) if attempt < 3 => continue,
                    other => break other,
                }
            };
            let closed = claimed.close().await;
            let merged = merged.map_err(conflict)?;
            closed.map_err(conflict)?;
            self.taken_over
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .absorb(&merged);
        }
        Ok(())
    }

    /// Apply the retention policy (at most once per its interval unless
    /// `now`); the versions removed.
    pub async fn retain(&self, now: bool) -> Result<u64> {
        {
            let mut last = self
                .last_retention
                .lock()
                .unwrap_or_else(|p| p.into_inner());
            if !now && last.is_some_and(|t| t.elapsed() < self.settings.retention.interval) {
                return Ok(0);
            }
            *last = Some(std::time::Instant::now());
        }
        let dataset = self.fresh_dataset().await?;
        crate::cleanup::apply_retention(&dataset, &self.settings.retention).await
    }

    /// `Busy` when this shard has more unmerged generations than
    /// `merge.max_unmerged_generations` (merges failing or falling behind).
    /// Counted from the writer's own manifest against the cached marker; the
    /// marker is re-read only near the bound.
    pub async fn check_backpressure(&self) -> Result<()> {
        let Some(bound) = self.settings.merge.max_unmerged_generations else {
            return Ok(());
        };
        let writer = self.writer()?;
        let listed = writer.listed_generations().await?;
        let unmerged = |marker: Option<u64>| {
            listed
                .iter()
                .filter(|g| marker.is_none_or(|m| **g > m))
                .count()
        };
        let cached = self.dataset.read().await.clone();
        let marker = crate::merge::recorded_marker(&cached, self.shard).await?;
        if unmerged(marker) < bound {
            return Ok(());
        }
        let fresh = self.fresh_dataset().await?;
        let marker = crate::merge::recorded_marker(&fresh, self.shard).await?;
        let pending = unmerged(marker);
        if pending >= bound {
            self.kick.notify_one();
            return Err(Error::Busy {
                message: format!(
                    "{pending} generations are waiting to be merged (the bound is {bound}); \
                     merges are failing or falling behind — see stats().last_background_error"
                ),
            });
        }
        Ok(())
    }

    /// Unmerged generations of this instance's shard.
    pub async fn own_pending_generations(&self) -> Result<usize> {
        let dataset = self.fresh_dataset().await?;
        Ok(self
            .shards(&dataset)
            .await?
            .iter()
            .find(|s| s.snapshot.shard_id == self.shard)
            .map(|s| s.unmerged)
            .unwrap_or(0))
    }

    /// Compact the base table's fragments. A second concurrent request gets
    /// [`Error::CompactionInProgress`]. A commit that loses the race to a
    /// concurrent one (a merge rewriting rows of the fragments compacted,
    /// another handle's index work) is redone on the newer version, up to
    /// [`COMPACTION_ATTEMPTS`] attempts in all with a short pause between:
    /// the caller sees [`Error::Conflict`] only when every attempt lost.
    pub async fn compact(&self) -> Result<CompactionStats> {
        let _one = self
            .compaction_state
            .running
            .try_lock()
            .map_err(|_| Error::CompactionInProgress)?;
        let mut attempt: u32 = 1;
        let (before, mut dataset, metrics) = loop {
            match self.compact_files_once().await {
                Err(Error::Conflict { message }) if attempt < COMPACTION_ATTEMPTS => {
                    tracing::debug!("compaction attempt {attempt} lost a commit race: {message}");
                    tokio::time::sleep(COMPACTION_RETRY_PAUSE * attempt).await;
                    attempt += 1;
                }
                other => break other?,
            }
        };
        // Only when every commit since the version it read kept the rows:
        // the compaction's own (it reserves fragment ids, then rewrites),
        // another compaction's, index commits.
        if let Some(rules) = &self.rules
            && rows_kept(&dataset, before.version().version).await
        {
            rules.carry_rewrite(&before, &dataset).await;
        }
        let (indexes_remapped, fragment_reuse_versions) = remap_indexes(&mut dataset).await;
        self.publish(Arc::new(dataset)).await;
        self.refresh_indexes().await?;
        *self
            .compaction_state
            .last
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = Some(SystemTime::now());
        self.compaction_state.total.fetch_add(1, Ordering::SeqCst);
        let versions_removed = self.retain(false).await?;
        Ok(CompactionStats {
            versions_removed,
            indexes_remapped,
            fragment_reuse_versions,
            fragments_removed: metrics.fragments_removed,
            fragments_added: metrics.fragments_added,
            files_removed: metrics.files_removed,
            files_added: metrics.files_added,
        })
    }

    /// One attempt of [`Self::compact`] up to its commit, on the newest
    /// version: fold the index segments, compact the fragments. The version
    /// compacted, the compacted one, and what the compaction did.
    async fn compact_files_once(
        &self,
    ) -> Result<(
        Dataset,
        Dataset,
        lance::dataset::optimize::CompactionMetrics,
    )> {
        let settings = &self.settings.compaction;
        let mut dataset = self.fresh_dataset().await?.as_ref().clone();
        // Lance only compacts neighbouring fragments that the same index
        // segments cover; the per-merge delta segments would keep every
        // fragment apart, so fold each index into one segment first.
        if has_delta_segments(&dataset).await? {
            dataset
                .optimize_indices(&OptimizeOptions::merge(usize::MAX))
                .await
                .map_err(|e| Error::from_lance("merging index segments", None, e))?;
        }
        #[cfg(feature = "failpoints")]
        crate::merge::await_pause(&self.compaction_pause).await;
        // The version compacted: its visible count carries over.
        let before = dataset.clone();
        let metrics = compact_files(
            &mut dataset,
            CompactionOptions {
                target_rows_per_fragment: settings.target_rows_per_fragment,
                max_rows_per_group: settings.max_rows_per_group,
                materialize_deletions: settings.materialize_deletions,
                materialize_deletions_threshold: settings.deletion_threshold,
                // The MemWAL index cannot be remapped inline.
                defer_index_remap: true,
                ..Default::default()
            },
            None,
        )
        .await
        .map_err(|e| Error::from_lance("compacting the base table", None, e))?;
        Ok((before, dataset, metrics))
    }

    /// Create the key column's index (and the secondary key's) if missing.
    pub async fn ensure_key_index(&self) -> Result<()> {
        let dataset = self.fresh_dataset().await?;
        if let Some(dataset) =
            ensure_scalar_indexes(&dataset, &self.key, &self.settings.indexes).await?
        {
            self.publish(Arc::new(dataset)).await;
        }
        Ok(())
    }

    /// After a merge or compaction: create the key index if missing, and extend
    /// every index over fragments it does not cover yet.
    /// Index work is idempotent: a commit that lost a race with another
    /// handle's (typed `Conflict`) is redone on the newer version, a few times.
    pub async fn refresh_indexes(&self) -> Result<()> {
        let mut attempt = 0;
        loop {
            match self.refresh_indexes_once().await {
                Err(Error::Conflict { .. }) if attempt < 4 => {
                    attempt += 1;
                    tokio::time::sleep(Duration::from_millis(20 * attempt)).await;
                }
                other => return other,
            }
        }
    }

    async fn refresh_indexes_once(&self) -> Result<()> {
        self.ensure_key_index().await?;
        let dataset = self.fresh_dataset().await?;
        let stats = index_stats(&dataset).await?;
        let mut next: Option<Dataset> = None;
        if !stats.iter().all(|s| s.covers_all_rows) {
            let mut extended = dataset.as_ref().clone();
            extended
                .optimize_indices(&OptimizeOptions::append())
                .await
                .map_err(|e| Error::from_lance("extending indexes over new fragments", None, e))?;
            next = Some(extended);
        }
        // Each extension adds a segment; a keyed read searches every one.
        // Folding is an optimisation: a failure is logged, never raised
        // (the merge that asked has committed its data).
        let current = next.as_ref().unwrap_or(dataset.as_ref());
        for (name, trailing) in self.crowded_key_indexes(current).await? {
            let mut folded = next.clone().unwrap_or_else(|| dataset.as_ref().clone());
            let mut options = OptimizeOptions::merge(trailing);
            options.index_names = Some(vec![name.clone()]);
            match folded.optimize_indices(&options).await {
                Ok(()) => next = Some(folded),
                Err(e) => {
                    tracing::warn!("folding the segments of {name}: {e}");
                    break;
                }
            }
        }
        if let Some(next) = next {
            self.publish(Arc::new(next)).await;
        }
        Ok(())
    }

    /// The key indexes (the key's, the secondary key's) and the full-text ones with more than
    /// [`MAX_KEY_INDEX_SEGMENTS`] segments, and how many of their trailing
    /// segments to fold (see [`segments_to_fold`]).
    async fn crowded_key_indexes(&self, dataset: &Dataset) -> Result<Vec<(String, usize)>> {
        let mut names = vec![format!("{}_idx", self.key)];
        if let Some(column) = &self.settings.indexes.secondary_key_index
            && column != &self.key
        {
            names.push(format!("{column}_idx"));
        }
        // A text search reads every segment of its index too.
        names.extend(
            self.settings
                .indexes
                .text_columns
                .iter()
                .map(|t| text_index_name(&t.column)),
        );
        let indices = dataset.load_indices().await.ctx("listing indexes")?;
        let rows: HashMap<u64, u64> = dataset
            .fragments()
            .iter()
            .map(|f| (f.id, f.physical_rows.unwrap_or(0) as u64))
            .collect();
        Ok(names
            .into_iter()
            .filter_map(|name| {
                let sizes: Vec<u64> = indices
                    .iter()
                    .filter(|i| i.name == name)
                    .map(|i| {
                        i.fragment_bitmap.as_ref().map_or(0, |b| {
                            b.iter()
                                .map(|f| rows.get(&u64::from(f)).copied().unwrap_or(0))
                                .sum()
                        })
                    })
                    .collect();
                if sizes.len() <= MAX_KEY_INDEX_SEGMENTS {
                    return None;
                }
                segments_to_fold(&sizes).map(|n| (name, n))
            })
            .collect())
    }

    /// Build (or rebuild) the index of a declared vector column.
    pub async fn build_vector_index(&self, column: &str) -> Result<()> {
        let declared = self
            .settings
            .indexes
            .vector_columns
            .iter()
            .find(|v| v.column == column)
            .ok_or_else(|| {
                Error::invalid_argument(format!("'{column}' is not a declared vector column"))
            })?;
        let metric = match declared.metric {
            Metric::L2 => MetricType::L2,
            Metric::Cosine => MetricType::Cosine,
            Metric::Dot => MetricType::Dot,
        };
        let dataset = self.fresh_dataset().await?;
        let rows = dataset.count_rows(None).await.ctx("counting rows")?;
        if rows == 0 {
            return Err(Error::invalid_argument(
                "the base table has no rows to train a vector index on; merge first",
            ));
        }
        // Partitions ~ sqrt(rows), at least 1. Sub-vectors as Lance
        // recommends: 16 (else 8) dimensions each, which its distance kernels
        // vectorise; one sub-vector when the dimension is not a multiple of 8.
        let partitions = ((rows as f64).sqrt() as usize).clamp(1, 256);
        let sub_vectors = pq_sub_vectors(declared.dimension);
        let params = match declared.kind {
            VectorIndexKind::IvfSq => VectorIndexParams::with_ivf_sq_params(
                metric,
                lance_index::vector::ivf::IvfBuildParams::new(partitions),
                lance_index::vector::sq::builder::SQBuildParams::default(),
            ),
            VectorIndexKind::IvfPq => {
                VectorIndexParams::ivf_pq(partitions, 8, sub_vectors, metric, 50)
            }
            VectorIndexKind::IvfHnswPq => VectorIndexParams::with_ivf_hnsw_pq_params(
                metric,
                lance_index::vector::ivf::IvfBuildParams::new(partitions),
                lance_index::vector::hnsw::builder::HnswBuildParams::default(),
                lance_index::vector::pq::PQBuildParams::new(sub_vectors, 8),
            ),
        };
        let mut dataset = dataset.as_ref().clone();
        dataset
            .create_index(
                &[column],
                IndexType::Vector,
                Some(format!("{column}_idx")),
                &params,
                true,
            )
            .await
            .map_err(|e| Error::from_lance("building the vector index", None, e))?;
        self.publish(Arc::new(dataset)).await;
        Ok(())
    }

    pub async fn stats(&self, maintenance: MaintenanceState) -> Result<StoreStats> {
        let dataset = self.fresh_dataset().await?;
        let target = self.settings.compaction.target_rows_per_fragment;
        let fragments = dataset.fragments();
        let small = fragments
            .iter()
            .filter(|f| f.physical_rows.unwrap_or(0) < target)
            .count();
        let shards = self.shards(&dataset).await?;
        let versions = dataset.versions().await.ctx("listing versions")?.len();
        let store = dataset
            .object_store(None)
            .await
            .ctx("opening the object store")?;
        let current: std::collections::HashSet<&str> = fragments
            .iter()
            .flat_map(|f| f.files.iter().map(|file| file.path.as_str()))
            .collect();
        let root = dataset.branch_location().path;
        let data_dir = root.clone().join("data");
        let (mut bytes_on_disk, mut base_data_bytes) = (0u64, 0u64);
        let mut manifests: HashMap<Uuid, ShardManifestStats> = HashMap::new();
        let mut listing = store.list(Some(root.clone()));
        while let Some(meta) = futures::StreamExt::next(&mut listing).await {
            let meta = meta.ctx("listing the store's objects")?;
            bytes_on_disk += meta.size;
            if let Some((shard, version)) = manifest_object(&root, &meta.location) {
                let entry = manifests.entry(shard).or_insert(ShardManifestStats {
                    shard,
                    versions: 0,
                    bytes: 0,
                    newest_version: 0,
                    newest_bytes: 0,
                    listed_generations: 0,
                });
                entry.versions += 1;
                entry.bytes += meta.size;
                if version >= entry.newest_version {
                    entry.newest_version = version;
                    entry.newest_bytes = meta.size;
                }
            }
            if let Some(mut rest) = meta.location.prefix_match(&data_dir)
                && let (Some(name), None) = (rest.next(), rest.next())
                && current.contains(name.as_ref())
            {
                base_data_bytes += meta.size;
            }
        }
        for shard in &shards {
            if let Some(entry) = manifests.get_mut(&shard.snapshot.shard_id) {
                entry.listed_generations = shard.listed;
            }
        }
        let mut shard_manifests: Vec<ShardManifestStats> = manifests.into_values().collect();
        shard_manifests.sort_by_key(|m| m.shard);
        let (last_merge, last_compaction, compactions, last_background_error) =
            self.stats_of_maintenance();
        Ok(StoreStats {
            buckets: 1,
            owned_buckets: Vec::new(),
            versions,
            bytes_on_disk,
            shard_manifests,
            maintenance,
            base_data_bytes,
            unmerged_rows: shards.iter().map(|s| s.unmerged_rows).sum(),
            unmerged_bytes: shards.iter().map(|s| s.unmerged_bytes).sum(),
            version: dataset.version().version,
            rows_in_base: dataset.count_rows(None).await.ctx("counting rows")? as u64,
            fragments: fragments.len(),
            small_fragments: small,
            pending_generations: shards
                .iter()
                .map(|s| (s.snapshot.shard_id, s.unmerged))
                .collect(),
            indexes: index_stats(&dataset).await?,
            last_merge,
            last_compaction,
            compactions,
            last_background_error,
        })
    }

    /// What this handle's maintenance did: the last merge and compaction,
    /// the compactions, the last background error.
    pub fn stats_of_maintenance(
        &self,
    ) -> (Option<SystemTime>, Option<SystemTime>, u64, Option<String>) {
        (
            *self
                .merge_state
                .last_merge
                .lock()
                .unwrap_or_else(|p| p.into_inner()),
            *self
                .compaction_state
                .last
                .lock()
                .unwrap_or_else(|p| p.into_inner()),
            self.compaction_state.total.load(Ordering::SeqCst),
            self.last_background_error
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .clone(),
        )
    }

    fn record_background(&self, what: &str, result: Result<()>) {
        if let Err(err) = result {
            tracing::warn!(shard = %self.shard, "background {what} failed: {err}");
            *self
                .last_background_error
                .lock()
                .unwrap_or_else(|p| p.into_inner()) = Some(format!("{what}: {err}"));
        }
    }

    /// Whether the background compaction should run now.
    async fn compaction_due(&self) -> Result<bool> {
        let dataset = self.fresh_dataset().await?;
        let s = &self.settings.compaction;
        let fragments = dataset.fragments();
        if fragments.len() < 2 {
            return Ok(false);
        }
        let small = fragments
            .iter()
            .filter(|f| f.physical_rows.unwrap_or(0) < s.target_rows_per_fragment)
            .count();
        Ok(fragments.len() >= s.min_fragments
            || small as f32 / fragments.len() as f32 >= s.small_fragment_ratio)
    }
}

/// After a compaction (Lance's, with the index remap deferred: the MemWAL
/// index cannot be remapped inline): remap every user index to the rows'
/// new places, then trim the fragment-reuse history no index needs any
/// more. Left in place, that history made every new handle rebuild a
/// row-address map of every row any compaction had moved (5 ms per new
/// handle at 1M rows after one compaction, more after each further one),
/// and every indexed read translate old addresses through it.
///
/// Best effort: the compaction has committed, and reads stay right through
/// the history; a failure is logged and the history's size reported. It
/// also catches up what an earlier compaction left (a store compacted by an
/// older build, a remap that lost a race). Returns the indexes remapped and
/// the history's versions left.
async fn remap_indexes(dataset: &mut Dataset) -> (usize, usize) {
    let versions = async |dataset: &Dataset| match dataset.frag_reuse_index().await {
        Ok(fri) => fri.map_or(0, |f| f.details.versions.len()),
        Err(e) => {
            tracing::warn!("reading the fragment-reuse history: {e}");
            0
        }
    };
    if versions(dataset).await == 0 {
        return (0, 0);
    }
    let indices = match dataset.load_indices().await {
        Ok(indices) => indices,
        Err(e) => {
            tracing::warn!("listing indexes to remap after a compaction: {e}");
            return (0, versions(dataset).await);
        }
    };
    let mut named: Vec<(String, String)> = Vec::new();
    for index in indices.iter() {
        if lance_table::system_index::is_system_index(index)
            || named.iter().any(|(n, _)| *n == index.name)
        {
            continue;
        }
        let column = match index.fields.as_slice() {
            [field] => dataset.schema().field_path(*field),
            _ => continue,
        };
        match column {
            Ok(column) => named.push((index.name.clone(), column)),
            Err(e) => tracing::warn!("the column of index {}: {e}", index.name),
        }
    }
    // Lance returns Ok for an index it left as it was (already caught up,
    // not covering the moved rows, or one it cannot open, which it drops):
    // an index counts as remapped when a segment of it is new.
    let before: std::collections::HashSet<uuid::Uuid> = indices.iter().map(|i| i.uuid).collect();
    for (name, column) in &named {
        if let Err(e) = lance::dataset::optimize::remapping::remap_column_index(
            dataset,
            &[column.as_str()],
            Some(name.clone()),
        )
        .await
        {
            tracing::warn!("remapping index {name} after a compaction: {e}");
        }
    }
    let remapped = match dataset.load_indices().await {
        Ok(after) => named
            .iter()
            .filter(|(name, _)| {
                after
                    .iter()
                    .any(|i| i.name == *name && !before.contains(&i.uuid))
            })
            .count(),
        Err(e) => {
            tracing::warn!("listing indexes after their remap: {e}");
            0
        }
    };
    if let Err(e) = lance::dataset::index::frag_reuse::cleanup_frag_reuse_index(dataset).await {
        tracing::warn!("trimming the fragment-reuse history: {e}");
    }
    (remapped, versions(dataset).await)
}

/// The shard and version of a shard manifest object
/// (`_mem_wal/<shard>/manifest/<bit-reversed version>.binpb` under `root`).
fn manifest_object(
    root: &object_store::path::Path,
    location: &object_store::path::Path,
) -> Option<(Uuid, u64)> {
    let parts: Vec<_> = location.prefix_match(root)?.collect();
    match parts.as_slice() {
        [wal, shard, dir, file] if wal.as_ref() == "_mem_wal" && dir.as_ref() == "manifest" => {
            let name = file.as_ref();
            if !name.ends_with(".binpb") {
                return None;
            }
            let version = lance::dataset::mem_wal::util::parse_bit_reversed_filename(name)?;
            Some((shard.as_ref().parse().ok()?, version))
        }
        _ => None,
    }
}

/// Whether any user index has more than one segment.
async fn has_delta_segments(dataset: &Dataset) -> Result<bool> {
    let indices = dataset.load_indices().await.ctx("listing indexes")?;
    let mut seen = std::collections::HashSet::new();
    Ok(indices
        .iter()
        .filter(|i| !i.name.starts_with("__"))
        .any(|i| !seen.insert(i.name.clone())))
}

/// BTree parameters of the key indexes: `page_rows` keys per page (see
/// [`IndexSettings::key_index_page_rows`]).
fn key_index_params(page_rows: u64) -> ScalarIndexParams {
    ScalarIndexParams {
        params: Some(format!("{{\"zone_size\": {}}}", page_rows.max(1))),
        ..ScalarIndexParams::default()
    }
}

/// Whether every commit after version `since` up to `dataset`'s kept the
/// base table's rows as they were: fragment id reservations, rewrites
/// (compactions move rows into new files) and index commits only. A commit
/// whose transaction cannot be read counts as one that changed rows.
async fn rows_kept(dataset: &Dataset, since: u64) -> bool {
    use lance::dataset::transaction::Operation;
    let latest = dataset.version().version;
    if latest <= since {
        return false;
    }
    for version in since + 1..=latest {
        match dataset.read_transaction_by_version(version).await {
            Ok(Some(t)) => match t.operation {
                Operation::ReserveFragments { .. }
                | Operation::Rewrite { .. }
                | Operation::CreateIndex { .. } => {}
                _ => return false,
            },
            _ => return false,
        }
    }
    true
}

/// Segments a key index may have before a refresh folds its newest ones
/// into one (see [`segments_to_fold`]). Every merge extends the indexes
/// over the fragments it wrote with a segment of their own, and a keyed read
/// (a lookup, an upsert's or a unique add's check) searches each segment:
/// ten segments made an upsert of 1,000 rows at 1M rows ~37 ms, one ~27 ms.
/// A compaction folds every segment.
const MAX_KEY_INDEX_SEGMENTS: usize = 4;

/// How many trailing segments of an index with these sizes (rows covered,
/// oldest first) to fold, if any. From the newest back, a segment joins
/// while it covers no more rows than the ones after it together (the first
/// never joins): small segments fold often and cheaply, a large one only
/// once as much has gathered after it, so a row is rewritten a few times,
/// not at every merge. Fewer than two joining folds nothing, until the
/// index has more than twice [`MAX_KEY_INDEX_SEGMENTS`] segments, when all
/// but the first fold.
fn segments_to_fold(sizes: &[u64]) -> Option<usize> {
    let n = sizes.len();
    if n < 3 {
        return None;
    }
    let (mut joined, mut rows) = (1, sizes[n - 1]);
    while joined < n - 1 {
        let size = sizes[n - 1 - joined];
        if size > rows {
            break;
        }
        rows += size;
        joined += 1;
    }
    if joined >= 2 {
        Some(joined)
    } else if n > 2 * MAX_KEY_INDEX_SEGMENTS {
        Some(n - 1)
    } else {
        None
    }
}

/// Create the BTree index of the key column (`<key>_idx`) and of the
/// secondary key, where missing; the newer dataset when one was created.
///
/// On a table without rows an index is created as a definition that covers
/// nothing yet (the first merge trains it). Created before a writer opens:
/// an older build of this engine has its writers maintain it in memory,
/// which is what made its flushes wait for each generation's key sidecar
/// (`_pk_index`; a generation flushed without it cannot be read, one with
/// part of it lets older versions through — seen in crash trials under
/// load, `docs/reliability.md`). This build's writer freezes only with no
/// put running instead (`crate::writer`).
pub(crate) async fn ensure_scalar_indexes(
    dataset: &Dataset,
    key: &str,
    settings: &IndexSettings,
) -> Result<Option<Dataset>> {
    let mut wanted = vec![key.to_string()];
    if let Some(column) = &settings.secondary_key_index
        && column != key
    {
        wanted.push(column.clone());
    }
    let mut current: Option<Dataset> = None;
    for column in wanted {
        let name = format!("{column}_idx");
        let base = current.as_ref().unwrap_or(dataset);
        let existing = base
            .load_indices_by_name(&name)
            .await
            .ctx("listing indexes")?;
        if !existing.is_empty() {
            continue;
        }
        let mut next = base.clone();
        let created = next
            .create_index(
                &[column.as_str()],
                IndexType::BTree,
                Some(name.clone()),
                &key_index_params(
                    settings
                        .key_index_page_rows
                        .unwrap_or(crate::config::DEFAULT_KEY_INDEX_PAGE_ROWS),
                ),
                false,
            )
            .await;
        if let Err(e) = created {
            // Another handle created it first: take the version that has it.
            next.checkout_latest()
                .await
                .ctx("reloading after creating an index")?;
            let there = next
                .load_indices_by_name(&name)
                .await
                .ctx("listing indexes")?;
            if there.is_empty() {
                return Err(Error::from_lance(
                    format!("creating the index on {column}"),
                    None,
                    e,
                ));
            }
        }
        current = Some(next);
    }
    for text in &settings.text_columns {
        let base = current.as_ref().unwrap_or(dataset);
        if let Some(next) = ensure_text_index(base, text).await? {
            current = Some(next);
        }
    }
    Ok(current)
}

/// The full-text index of a declared text column.
pub(crate) fn text_index_name(column: &str) -> String {
    format!("{column}_fts")
}

/// Lance's inverted-index parameters for a declared text column.
pub(crate) fn text_index_params(
    text: &crate::config::TextColumn,
) -> Result<lance_index::scalar::InvertedIndexParams> {
    let params = lance_index::scalar::InvertedIndexParams::new(
        text.tokenizer.clone(),
        lance_index::scalar::inverted::Language::English,
    )
    .language(&text.language)
    .map_err(|e| {
        Error::invalid_argument(format!(
            "text column '{}': language '{}': {e}",
            text.column, text.language
        ))
    })?
    .lower_case(text.lower_case)
    .stem(text.stem)
    .remove_stop_words(text.remove_stop_words)
    .ascii_folding(text.ascii_folding)
    .max_token_length(text.max_token_length.map(|n| n as usize));
    Ok(params)
}

/// Create the full-text index of `text` when the dataset has none: a new
/// dataset version, or `None` when it exists already.
async fn ensure_text_index(
    dataset: &Dataset,
    text: &crate::config::TextColumn,
) -> Result<Option<Dataset>> {
    let name = text_index_name(&text.column);
    if !dataset
        .load_indices_by_name(&name)
        .await
        .ctx("listing indexes")?
        .is_empty()
    {
        return Ok(None);
    }
    let params = text_index_params(text)?;
    let mut next = dataset.clone();
    let created = next
        .create_index(
            &[text.column.as_str()],
            IndexType::Inverted,
            Some(name.clone()),
            &params,
            false,
        )
        .await;
    if let Err(e) = created {
        next.checkout_latest()
            .await
            .ctx("reloading after creating an index")?;
        if next
            .load_indices_by_name(&name)
            .await
            .ctx("listing indexes")?
            .is_empty()
        {
            return Err(Error::from_lance(
                format!("creating the full-text index on {}", text.column),
                None,
                e,
            ));
        }
    }
    Ok(Some(next))
}

/// Coverage of every user index.
pub(crate) async fn index_stats(dataset: &Dataset) -> Result<Vec<IndexStats>> {
    let indices = dataset.load_indices().await.ctx("listing indexes")?;
    let existing: RoaringBitmap = dataset.fragments().iter().map(|f| f.id as u32).collect();
    let mut by_name: HashMap<String, (Vec<String>, String, RoaringBitmap, usize)> = HashMap::new();
    for index in indices.iter() {
        if index.name.starts_with("__") {
            continue; // system indexes (MemWAL, fragment reuse)
        }
        let columns = index
            .fields
            .iter()
            .filter_map(|id| dataset.schema().field_by_id(*id).map(|f| f.name.clone()))
            .collect();
        let kind = index
            .index_details
            .as_ref()
            .map(|d| {
                let name = d.type_url.rsplit('.').next().unwrap_or(&d.type_url);
                name.trim_end_matches("IndexDetails").to_string()
            })
            .unwrap_or_else(|| "unknown".to_string());
        let entry = by_name
            .entry(index.name.clone())
            .or_insert_with(|| (columns, kind, RoaringBitmap::new(), 0));
        entry.3 += 1;
        if let Some(bitmap) = index.effective_fragment_bitmap(&existing) {
            entry.2 |= bitmap;
        }
    }
    let mut out: Vec<IndexStats> = by_name
        .into_iter()
        .map(|(name, (columns, kind, covered, segments))| {
            let unindexed = dataset
                .fragments()
                .iter()
                .filter(|f| !covered.contains(f.id as u32))
                .count();
            IndexStats {
                name,
                columns,
                kind,
                unindexed_fragments: unindexed,
                covers_all_rows: unindexed == 0,
                segments,
            }
        })
        .collect();
    out.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(out)
}

/// The background maintenance task of a writable store.
#[derive(Debug)]
pub(crate) struct Background {
    stop: Arc<Notify>,
    handle: tokio::task::JoinHandle<()>,
}

impl Background {
    /// Whether any trigger is configured (a writable store then runs the task).
    pub fn wanted(engine: &Engine) -> bool {
        let merge = &engine.settings.merge;
        merge.generation_threshold.is_some()
            || merge.interval.is_some()
            || engine.settings.compaction.interval.is_some()
    }

    /// Whether the task has ended (stopped, or panicked).
    pub fn is_finished(&self) -> bool {
        self.handle.is_finished()
    }

    /// Start the task when any trigger is configured.
    pub fn start(engine: &Arc<Engine>) -> Option<Self> {
        if !Self::wanted(engine) {
            return None;
        }
        let handle = tokio::runtime::Handle::try_current().ok()?;
        let stop = Arc::new(Notify::new());
        let engine = engine.clone();
        let task_stop = stop.clone();
        let handle = handle.spawn(async move { run(engine, task_stop).await });
        Some(Self { stop, handle })
    }

    /// Stop and wait for the task (a merge in progress finishes first).
    pub async fn stop(self) {
        self.stop.notify_one();
        let _ = self.handle.await;
    }

    /// Stop without waiting (from `Drop`).
    pub fn abort(self) {
        self.handle.abort();
    }
}

fn ticker(every: Option<Duration>) -> Option<tokio::time::Interval> {
    every.map(|d| {
        let mut t = tokio::time::interval_at(tokio::time::Instant::now() + d, d);
        t.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        t
    })
}

async fn tick(t: &mut Option<tokio::time::Interval>) {
    match t {
        Some(t) => {
            t.tick().await;
        }
        None => std::future::pending().await,
    }
}

/// What the count trigger does after an add.
enum CountTrigger {
    /// Below the threshold: nothing.
    Skip,
    Merge,
    /// The task was asked to stop while it waited.
    Stop,
}

/// The count trigger: merge when this instance's shard holds at least
/// `threshold` unmerged generations — once no add has come for
/// `quiet_before_merge`, or at once when they reach `merge_without_pause_at`
/// (see [`crate::MergeSettings`]). Each add wakes the wait (`kick`).
async fn count_trigger(engine: &Engine, stop: &Notify, threshold: usize) -> Result<CountTrigger> {
    let merge = &engine.settings.merge;
    // Where adds are refused as busy (`max_unmerged_generations`), the merge
    // does not wait either: refused adds retried within the pause would
    // otherwise put it off for good.
    let without_pause = [merge.merge_without_pause_at, merge.max_unmerged_generations]
        .into_iter()
        .flatten()
        .min();
    let at_once = |pending: usize| {
        merge.quiet_before_merge.is_zero() || without_pause.is_some_and(|at| pending >= at)
    };
    let mut pending = engine.own_pending_generations().await?;
    if pending < threshold {
        return Ok(CountTrigger::Skip);
    }
    // Adds that never pause are merged at the latest after the time
    // trigger's interval (this wait holds the task's other triggers).
    let latest = merge
        .interval
        .map(|every| tokio::time::Instant::now() + every);
    let no_later_than = async {
        match latest {
            Some(at) => tokio::time::sleep_until(at).await,
            None => std::future::pending().await,
        }
    };
    tokio::pin!(no_later_than);
    loop {
        if at_once(pending) {
            return Ok(CountTrigger::Merge);
        }
        tokio::select! {
            _ = stop.notified() => return Ok(CountTrigger::Stop),
            _ = tokio::time::sleep(merge.quiet_before_merge) => return Ok(CountTrigger::Merge),
            _ = &mut no_later_than => return Ok(CountTrigger::Merge),
            _ = engine.kick.notified() => pending = engine.own_pending_generations().await?,
        }
    }
}

async fn run(engine: Arc<Engine>, stop: Arc<Notify>) {
    let mut merge_tick = ticker(engine.settings.merge.interval);
    let mut compact_tick = ticker(engine.settings.compaction.interval);
    // A fenced handle's shard belongs to another writer, and a writer that
    // recovers from a failed WAL write owns nothing for a moment: while the
    // writer is latched each trigger is skipped, and the task keeps waiting
    // for the next one, so maintenance resumes by itself once the writer
    // takes its shard back (a recovery, a `reclaim`).
    let latched = || {
        engine
            .writer
            .as_ref()
            .is_some_and(|w| w.check_latch().is_err())
    };
    loop {
        tokio::select! {
            _ = stop.notified() => break,
            _ = engine.kick.notified() => {
                if latched() { continue }
                let Some(threshold) = engine.settings.merge.generation_threshold else { continue };
                let result = async {
                    match count_trigger(&engine, &stop, threshold).await? {
                        CountTrigger::Merge if !latched() => {
                            Box::pin(engine.merge(None, #[cfg(feature = "failpoints")] None)).await?;
                        }
                        CountTrigger::Stop => return Ok(true),
                        _ => {}
                    }
                    Ok(false)
                }.await;
                if let Ok(true) = result { break }
                engine.record_background("merge (generation count)", result.map(|_| ()));
            }
            _ = tick(&mut merge_tick) => {
                if latched() { continue }
                let result = async {
                    if engine.own_pending_generations().await? > 0 {
                        Box::pin(engine.merge(None, #[cfg(feature = "failpoints")] None)).await?;
                    }
                    Ok(())
                }.await;
                engine.record_background("merge (timer)", result);
            }
            _ = tick(&mut compact_tick) => {
                if latched() { continue }
                let result = async {
                    if engine.compaction_due().await? {
                        match engine.compact().await {
                            Ok(_) | Err(Error::CompactionInProgress) => {}
                            Err(e) => return Err(e),
                        }
                    }
                    Ok(())
                }.await;
                engine.record_background("compaction", result);
            }
        }
    }
}

/// PQ sub-vectors for a vector of `dimension`: 16 dimensions per sub-vector
/// when the dimension divides by 16, else 8, else one sub-vector (Lance's
/// recommendation: 8 or 16 values per sub-vector use its SIMD kernels).
fn pq_sub_vectors(dimension: usize) -> usize {
    match dimension {
        d if d >= 16 && d % 16 == 0 => d / 16,
        d if d >= 8 && d % 8 == 0 => d / 8,
        _ => 1,
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow_array::{Int64Array, RecordBatch, RecordBatchIterator};
    use arrow_schema::{DataType, Field, Schema};
    use lance::Dataset;
    use lance::dataset::optimize::{CompactionOptions, compact_files};

    /// Only commits that keep the rows let a compaction carry the count: an
    /// append (or any other change of rows) in between stops it.
    #[test]
    fn the_segments_after_the_largest_are_folded() {
        use super::segments_to_fold as fold;
        assert_eq!(fold(&[0, 1000, 5, 5, 5]), Some(3), "the large one kept");
        assert_eq!(fold(&[1000, 5, 5, 5, 5]), Some(4));
        assert_eq!(fold(&[5, 5, 5, 5, 5]), Some(4), "all but the first");
        assert_eq!(
            fold(&[0, 10, 30, 60, 1]),
            None,
            "the 60 not rewritten for 1"
        );
        assert_eq!(fold(&[0, 10, 30, 60, 1, 1]), Some(2));
        assert_eq!(
            fold(&[0, 10, 30, 10, 40]),
            Some(4),
            "as much gathered after"
        );
        assert_eq!(fold(&[0, 1000, 300, 5, 5]), Some(2), "the 300 waits");
        assert_eq!(
            fold(&[0, 1, 2, 3, 4, 5, 6, 7, 8]),
            Some(8),
            "past twice the bound"
        );
    }

    #[tokio::test]
    async fn rows_are_kept_across_a_compaction_but_not_an_append() {
        let dir = tempfile::tempdir().unwrap();
        let uri = dir.path().join("t").to_str().unwrap().to_string();
        let schema = Arc::new(Schema::new(vec![Field::new("x", DataType::Int64, false)]));
        let rows = |v: i64| {
            let batch =
                RecordBatch::try_new(schema.clone(), vec![Arc::new(Int64Array::from(vec![v]))])
                    .unwrap();
            RecordBatchIterator::new(vec![Ok(batch)], schema.clone())
        };
        let mut dataset = Dataset::write(rows(1), uri.as_str(), None).await.unwrap();
        dataset.append(rows(2), None).await.unwrap();
        let appended = dataset.version().version;
        assert!(!super::rows_kept(&dataset, appended).await, "nothing since");
        let metrics = compact_files(&mut dataset, CompactionOptions::default(), None)
            .await
            .unwrap();
        assert_eq!(metrics.fragments_removed, 2);
        assert!(
            dataset.version().version > appended + 1,
            "reserve, then rewrite"
        );
        assert!(super::rows_kept(&dataset, appended).await);
        assert!(
            !super::rows_kept(&dataset, appended - 1).await,
            "the append"
        );
    }

    #[test]
    fn pq_sub_vectors_keep_eight_or_sixteen_dimensions_each() {
        for (dimension, expected) in [
            (768, 48),
            (1536, 96),
            (32, 2),
            (24, 3),
            (8, 1),
            (4, 1),
            (12, 1),
            (1000, 125),
        ] {
            assert_eq!(
                super::pq_sub_vectors(dimension),
                expected,
                "dimension {dimension}"
            );
        }
    }
}
