//! WAL → base merge of one shard.
//!
//! # The rule: every commit is a unit that is refused when stale
//! Lance records, per shard, "merged up to generation N" in the MemWAL index
//! (`compacted_sstables`), and refuses a commit whose marker is not strictly
//! greater than the one recorded *at commit time* (checked against the latest
//! version, on every commit attempt). A merge therefore commits in passes cut
//! at generation boundaries, and **every pass carries its own marker** — the
//! last generation it covers — in the same transaction as its data. Two
//! handles merging one shard (a blue/green deploy, an operator's `merge`
//! beside a service, a fenced writer whose merge is still running) can each
//! commit only passes that move the marker forward: a pass whose last
//! generation another handle has since merged past is refused as a whole, so
//! it can neither overwrite a newer row nor delete a key re-added later. A
//! pass that only partly overlaps a pass committed meanwhile (its last
//! generation is past the recorded marker) is accepted, and is harmless: it
//! writes the newest version of each key up to its own last generation, which
//! is newer than anything the other pass wrote.
//!
//! # A pass
//! 1. The pass's generations (consecutive, above the marker, together within
//!    `batch_budget_bytes` by the sizes the writer recorded, scaled by what
//!    the decoded rows of the earlier passes took over their recorded sizes
//!    — 2× before the first; a generation larger than the budget goes alone —
//!    its size is bounded by the writer's memtable limits) are read one by
//!    one through the LSM scanner without the base table (live rows under the
//!    base schema), newest first, keeping each key the first time it is met:
//!    the newest version of each key in the pass.
//! 2. **Deletes carry over.** The scanner drops tombstones, so the tombstoned
//!    keys are read from the raw generations; a tombstoned key not written
//!    again by a newer generation of the pass is deleted from the base table
//!    (and hides the key's older versions in the pass).
//! 3. One merge-insert commits it all with the marker: upserts only
//!    (`UpdateAll`/`InsertAll`, through the key index); deletes only
//!    (`WhenMatched::Delete`, through the key index); or both at once
//!    (`WhenNotMatchedBySource::DeleteIf(key IN …)`, which joins the whole base
//!    table — generations are cut so that passes mix them only when one
//!    generation holds both, i.e. a delete group-committed with adds).
//!
//! A crash between passes leaves the marker after the last committed pass;
//! the next merge continues from there (upserts and deletes are idempotent).
//! A fenced writer's handle does not merge (and its background merges stop).
//!
//! Cleanup of what was merged is in the `cleanup` module.

use std::collections::HashSet;
use std::sync::Arc;

use arrow_array::{Array, ArrayRef, BooleanArray, RecordBatch, StringArray};
use arrow_schema::{Schema, SchemaRef};
use futures::future::BoxFuture;
use futures::{StreamExt, TryStreamExt};
use lance::Dataset;
use lance::dataset::mem_wal::scanner::SsTableCache;
use lance::dataset::mem_wal::{
    DatasetMemWalExt, LsmScanner, ShardManifestStore, ShardSnapshot, TOMBSTONE,
    arrow_schema_with_field_ids,
};
use lance::dataset::{MergeInsertBuilder, WhenMatched, WhenNotMatched, WhenNotMatchedBySource};
use lance::deps::datafusion::logical_expr::{Expr, col, lit};
use lance::io::ObjectStoreParams;
use lance_index::mem_wal::{CompactedSsTable, ShardManifest, SsTable};
use tokio::sync::Mutex;
use uuid::Uuid;

use crate::config::MergeSettings;
use crate::dataset::Opener;
use crate::error::{Error, ErrorKind, LanceResultExt, Result};
use crate::writer::Writer;

/// What a merge did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MergeStats {
    /// Generations folded into the base table.
    pub generations_merged: usize,
    /// The shard's marker after the merge (`None` if nothing was ever merged).
    pub merged_up_to: Option<u64>,
    /// Rows written into the base (inserted or replaced).
    pub rows_upserted: u64,
    /// Keys deleted from the base.
    pub keys_deleted: u64,
    /// Commits made, each carrying its own marker.
    pub passes: usize,
    /// Most bytes of rows the merge held in memory at once.
    pub peak_buffered_bytes: usize,
    /// Merged generation directories removed by cleanup.
    pub generations_removed: usize,
    /// WAL entry files removed by cleanup.
    pub wal_files_removed: usize,
    /// Old shard manifest versions removed by cleanup.
    pub manifest_versions_removed: usize,
    /// Old base-table versions removed by the retention policy.
    pub versions_removed: u64,
    /// Where the merge's time went.
    pub phases: MergePhases,
}

/// Where a merge's time went, phase by phase (summed over its passes and,
/// for a merge of several shards, over the shards).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MergePhases {
    /// Reading the generations: the newest version of each key, and the
    /// keys deleted.
    pub read: std::time::Duration,
    /// Writing them into the base table (the merge-insert commits).
    pub write: std::time::Duration,
    /// Carrying the visible count over to the new base version (record
    /// stores with visibility rules), so that the first `count()` after the
    /// merge need not read the table.
    pub count: std::time::Duration,
    /// Cleanup: removing generations and WAL files merged at least the
    /// grace ago, and old shard manifest versions.
    pub cleanup: std::time::Duration,
    /// Extending the indexes over the new base fragments.
    pub indexes: std::time::Duration,
    /// Removing old base-table versions (the retention policy).
    pub retention: std::time::Duration,
}

impl MergePhases {
    fn absorb(&mut self, other: &MergePhases) {
        self.read += other.read;
        self.write += other.write;
        self.count += other.count;
        self.cleanup += other.cleanup;
        self.indexes += other.indexes;
        self.retention += other.retention;
    }
}

impl MergeStats {
    /// Add what `other` (a merge of another shard) did: the counts summed,
    /// the peak the larger; `merged_up_to` (of one shard) left as it is.
    pub fn absorb(&mut self, other: &MergeStats) {
        self.generations_merged += other.generations_merged;
        self.rows_upserted += other.rows_upserted;
        self.keys_deleted += other.keys_deleted;
        self.passes += other.passes;
        self.peak_buffered_bytes = self.peak_buffered_bytes.max(other.peak_buffered_bytes);
        self.generations_removed += other.generations_removed;
        self.wal_files_removed += other.wal_files_removed;
        self.manifest_versions_removed += other.manifest_versions_removed;
        self.versions_removed += other.versions_removed;
        self.phases.absorb(&other.phases);
    }
}

/// Per-store merge state: one merge at a time, and when the last one ended.
#[derive(Debug, Default)]
pub(crate) struct MergeState {
    pub running: Mutex<()>,
    pub last_merge: std::sync::Mutex<Option<std::time::SystemTime>>,
}

/// Where a test can make the merge stop, to simulate a crash there.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MergeFailpoint {
    /// Before the last pass commits (earlier passes, each with its own
    /// marker, have committed).
    BeforeCommit,
    /// After the last pass committed, before cleanup.
    AfterCommit,
    /// After the owner's shard manifest dropped merged generations, before
    /// their files are deleted.
    DuringCleanup,
}

/// A pause a test can put before each pass's commit (failpoints feature):
/// called with the pass's first and last generation, awaited before the commit.
#[cfg(feature = "failpoints")]
pub type MergeHook = Arc<
    dyn Fn(u64, u64) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>
        + Send
        + Sync,
>;

/// A pause a test can put inside `reclaim` (failpoints feature): awaited
/// after the shard is claimed, before the other shards are taken over; also
/// the pause of `Store::pause_next_read`.
pub type ReclaimHook =
    Box<dyn FnOnce() -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>> + Send>;

/// A pause a test put in `slot` (failpoints), taken and awaited; nothing
/// when none is set.
#[cfg(feature = "failpoints")]
pub(crate) async fn await_pause(slot: &std::sync::Mutex<Option<ReclaimHook>>) {
    let pause = slot.lock().unwrap_or_else(|p| p.into_inner()).take();
    if let Some(pause) = pause {
        pause().await;
    }
}

/// Everything the merge needs from the store.
pub(crate) struct MergeContext<'a> {
    pub dataset: Arc<Dataset>,
    pub key: &'a str,
    pub shard: Uuid,
    /// The shard's writer when this handle owns it (then cleanup also prunes
    /// the shard manifest's list of merged generations).
    pub writer: Option<&'a Writer>,
    pub settings: &'a MergeSettings,
    pub store_params: ObjectStoreParams,
    pub opener: &'a Opener,
    pub generations: Arc<SsTableCache>,
    pub state: &'a MergeState,
    /// Failpoint for crash tests: stop (with an error) at this step.
    pub fail_at: Option<MergeFailpoint>,
    #[cfg(feature = "failpoints")]
    pub hook: Option<MergeHook>,
    /// The store's visibility rules (record capabilities): a merge carries
    /// the count of visible base rows to the version it makes.
    pub rules: Option<&'a crate::store::visible::Rules>,
}

/// What a merge did to the base table, when nothing else changed it
/// meanwhile: `after` holds exactly `before`'s rows with the generations
/// `sstables` of `shard` folded in.
pub(crate) struct Merged {
    pub before: Arc<Dataset>,
    pub after: Arc<Dataset>,
    pub shard: Uuid,
    /// (generation, directory), oldest first.
    pub sstables: Vec<(u64, String)>,
    pub opener: Opener,
    pub generations: Arc<SsTableCache>,
}

impl MergeContext<'_> {
    pub(crate) fn failpoint(&self, at: MergeFailpoint) -> Result<()> {
        if self.fail_at == Some(at) {
            return Err(Error::internal(format!("merge failpoint {at:?}")));
        }
        Ok(())
    }
}

/// The shard's marker recorded in `dataset`.
pub(crate) async fn recorded_marker(dataset: &Dataset, shard: Uuid) -> Result<Option<u64>> {
    let details = dataset
        .mem_wal_index_details()
        .await
        .ctx("reading the MemWAL index")?
        .ok_or_else(|| Error::internal("the dataset has no MemWAL index"))?;
    Ok(details
        .compacted_sstables
        .iter()
        .find(|c| c.shard_id == shard)
        .map(|c| c.generation))
}

/// The shard's latest manifest, read from storage (never a cached position).
pub(crate) async fn latest_manifest(
    dataset: &Dataset,
    shard: Uuid,
) -> Result<Option<ShardManifest>> {
    let store = dataset
        .object_store(None)
        .await
        .ctx("opening the object store")?;
    ShardManifestStore::new(store, &dataset.branch_location().path, shard, 2)
        .latest()
        .await
        .map_err(|e| Error::from_lance("reading the shard manifest", Some(shard), e))
}

/// What a generation holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Rows,
    Deletes,
    Both,
}

/// A pending generation: its manifest entry and what it holds.
#[derive(Debug, Clone)]
struct Pending {
    sstable: SsTable,
    kind: Kind,
}

/// Merge the shard's unmerged generations (see the module docs). A merge
/// that fails on storage (a generation not found, a manifest commit refused)
/// because another handle merged the same generations meanwhile and cleaned
/// them up, or because this handle's writer was fenced and not latched yet,
/// says so: [`Error::Conflict`] or [`Error::Fenced`], as when the race is
/// seen at the commit.
pub(crate) async fn merge_shard(ctx: MergeContext<'_>) -> Result<MergeStats> {
    let _one_at_a_time = ctx.state.running.lock().await;
    let before = recorded_marker(&ctx.dataset, ctx.shard)
        .await
        .ok()
        .flatten();
    match merge_shard_locked(&ctx).await {
        Err(err) if matches!(err.kind(), ErrorKind::NotFound | ErrorKind::Storage) => {
            Err(explain_failure(&ctx, before, err).await)
        }
        other => other,
    }
}

/// Why a merge failed on storage: a fence of the writer, or a merge by
/// another handle that moved the shard's marker past where this one began;
/// else the error itself.
async fn explain_failure(ctx: &MergeContext<'_>, before: Option<u64>, err: Error) -> Error {
    if let Some(writer) = ctx.writer
        && let Err(fenced) = writer.check_fenced_now().await
    {
        return fenced;
    }
    if let Ok(latest) = ctx.opener.open().await
        && let Ok(Some(now)) = recorded_marker(&latest, ctx.shard).await
        && before.is_none_or(|b| now > b)
    {
        tracing::debug!(shard = %ctx.shard, "merge failed after another merge moved the marker: {err}");
        return Error::Conflict {
            message: format!(
                "shard {}: another handle merged up to generation {now} while this merge ran \
                 (it failed with: {:?})",
                ctx.shard,
                err.kind()
            ),
        };
    }
    err
}

async fn merge_shard_locked(ctx: &MergeContext<'_>) -> Result<MergeStats> {
    if let Some(writer) = ctx.writer {
        // A fenced handle does not merge: its shard belongs to another.
        writer.check_latch()?;
    }
    let mut stats = MergeStats::default();
    // The dataset as of now: a merge that waited for another merge of this
    // handle (the background one) must see what that one committed, or it
    // would try the same generations again and be refused as stale.
    let mut dataset = ctx.opener.refresh(&ctx.dataset).await?;
    let marker = recorded_marker(&dataset, ctx.shard).await?;
    stats.merged_up_to = marker;
    let manifest = latest_manifest(&dataset, ctx.shard).await?;
    let pending = pending_generations(ctx, &dataset, marker, manifest.as_ref()).await?;
    // Passes are cut by the sizes the writer recorded, scaled by how much
    // more the decoded rows of the passes so far took (about 1.5× here);
    // before the first pass, a guess of 2×.
    let budget = ctx.settings.batch_budget_bytes.max(1);
    let mut scale = 2.0f64;
    let before = dataset.clone();
    // Whether each pass's commit came right after the previous one (nothing
    // else changed the base table in between).
    let mut only_ours = true;
    let mut rest: &[Pending] = &pending;
    while !rest.is_empty() {
        let cut = (budget as f64 / scale).max(1.0) as usize;
        let (pass, after) = rest.split_at(pass_len(rest, cut));
        if after.is_empty() {
            ctx.failpoint(MergeFailpoint::BeforeCommit)?;
        }
        let previous = dataset.version().version;
        // Boxed: the pass's future is large, and merges run on worker threads.
        let (merged, held) = Box::pin(merge_pass(
            ctx,
            dataset,
            pass,
            manifest.as_ref(),
            &mut stats,
        ))
        .await?;
        only_ours &= merged.version().version == previous + 1;
        dataset = merged;
        let recorded: u64 = pass
            .iter()
            .map(|p| p.sstable.in_memory_bytes.unwrap_or(0))
            .sum();
        if recorded > 0 && held > 0 {
            scale = (held as f64 / recorded as f64).max(1.0);
        }
        stats.generations_merged += pass.len();
        stats.merged_up_to = pass.last().map(|p| p.sstable.generation);
        rest = after;
    }
    if !pending.is_empty() {
        *ctx.state
            .last_merge
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = Some(std::time::SystemTime::now());
        ctx.failpoint(MergeFailpoint::AfterCommit)?;
        if let Some(rules) = ctx.rules
            && only_ours
        {
            // Before cleanup: the carry reads the merged generations.
            let merged = Merged {
                before,
                after: dataset.clone(),
                shard: ctx.shard,
                sstables: pending
                    .iter()
                    .map(|p| (p.sstable.generation, p.sstable.path.clone()))
                    .collect(),
                opener: ctx.opener.clone(),
                generations: ctx.generations.clone(),
            };
            let started = std::time::Instant::now();
            rules.carry(&merged).await;
            stats.phases.count += started.elapsed();
        }
    }
    let started = std::time::Instant::now();
    Box::pin(crate::cleanup::cleanup_shard(
        ctx,
        &dataset,
        stats.merged_up_to,
        &mut stats,
    ))
    .await?;
    stats.phases.cleanup += started.elapsed();
    Ok(stats)
}

/// The generations of `manifest` above `marker`, oldest first, each with
/// what it holds.
async fn pending_generations(
    ctx: &MergeContext<'_>,
    dataset: &Dataset,
    marker: Option<u64>,
    manifest: Option<&ShardManifest>,
) -> Result<Vec<Pending>> {
    let mut sstables: Vec<SsTable> = manifest
        .map(|m| {
            m.sstables
                .iter()
                .filter(|s| marker.is_none_or(|g| s.generation > g))
                .cloned()
                .collect()
        })
        .unwrap_or_default();
    sstables.sort_by_key(|s| s.generation);
    let mut pending = Vec::with_capacity(sstables.len());
    for sstable in sstables {
        let kind = generation_kind(ctx, dataset, &sstable).await?;
        pending.push(Pending { sstable, kind });
    }
    Ok(pending)
}

/// Whether a generation holds live rows, tombstones, or both.
async fn generation_kind(ctx: &MergeContext<'_>, dataset: &Dataset, s: &SsTable) -> Result<Kind> {
    let generation = ctx
        .opener
        .open_generation(dataset, &ctx.shard, &s.path)
        .await?;
    if generation.schema().field(TOMBSTONE).is_none() {
        return Ok(Kind::Rows);
    }
    let total = generation.count_rows(None).await.ctx("counting rows")?;
    let tombstones = generation
        .count_rows(Some(TOMBSTONE.to_string()))
        .await
        .ctx("counting tombstones")?;
    Ok(match (tombstones, total - tombstones) {
        (0, _) => Kind::Rows,
        (_, 0) => Kind::Deletes,
        _ => Kind::Both,
    })
}

/// The length of the next pass: consecutive generations of one kind within
/// the budget (at least one).
fn pass_len(pending: &[Pending], budget: usize) -> usize {
    let Some(first) = pending.first() else {
        return 0;
    };
    let mut bytes = first.sstable.in_memory_bytes.unwrap_or(0) as usize;
    let mut n = 1;
    for p in &pending[1..] {
        let size = p.sstable.in_memory_bytes.unwrap_or(0) as usize;
        if p.kind != first.kind || bytes.saturating_add(size) > budget {
            break;
        }
        bytes += size;
        n += 1;
    }
    n
}

/// Whether a pass of `pass_rows` finds its keys in a base of `base_rows`
/// through the key index (see [`crate::MergeSettings::key_lookup_below`]).
fn key_lookup(pass_rows: u64, base_rows: u64, below: f64) -> bool {
    (pass_rows as f64) < (base_rows as f64) * below
}

/// Read a pass, then commit it as one merge-insert carrying its marker.
async fn merge_pass(
    ctx: &MergeContext<'_>,
    dataset: Arc<Dataset>,
    pass: &[Pending],
    manifest: Option<&ShardManifest>,
    stats: &mut MergeStats,
) -> Result<(Arc<Dataset>, usize)> {
    let first = pass[0].sstable.generation;
    let last = pass[pass.len() - 1].sstable.generation;
    // Someone merged past this pass already: stop before doing the work.
    let latest = ctx.opener.refresh(&dataset).await?;
    if let Some(recorded) = recorded_marker(&latest, ctx.shard).await?
        && recorded >= first
    {
        return Err(stale(ctx.shard, first, recorded));
    }
    let started = std::time::Instant::now();
    let PassRows { rows, deletes } = read_pass(ctx, &dataset, pass, manifest).await?;
    stats.phases.read += started.elapsed();
    let held: usize = rows
        .iter()
        .map(RecordBatch::get_array_memory_size)
        .sum::<usize>()
        + deletes.iter().map(String::len).sum::<usize>();
    stats.peak_buffered_bytes = stats.peak_buffered_bytes.max(held);

    #[cfg(feature = "failpoints")]
    if let Some(hook) = &ctx.hook {
        hook(first, last).await;
    }
    let upserted: u64 = rows.iter().map(|b| b.num_rows() as u64).sum();
    let marker = vec![CompactedSsTable::new(ctx.shard, last)];
    let mut builder = MergeInsertBuilder::try_new(dataset.clone(), vec![ctx.key.to_string()])
        .ctx("preparing the merge")?;
    builder.mark_sstables_as_compacted(marker);
    // Lookups through the key index for a small pass into a large base; a
    // hash join over the base's key column otherwise (one lookup per row
    // is far slower once the pass is large).
    let base_rows: u64 = dataset
        .fragments()
        .iter()
        .map(|f| f.physical_rows.unwrap_or(0) as u64)
        .sum();
    let pass_rows = upserted.max(deletes.len() as u64);
    builder.use_index(key_lookup(
        pass_rows,
        base_rows,
        ctx.settings.key_lookup_below,
    ));
    let source = if deletes.is_empty() {
        builder
            .when_matched(WhenMatched::UpdateAll)
            .when_not_matched(WhenNotMatched::InsertAll);
        rows
    } else if rows.is_empty() {
        builder
            .when_matched(WhenMatched::Delete)
            .when_not_matched(WhenNotMatched::DoNothing);
        vec![key_batch(&dataset, ctx.key, &deletes)?]
    } else {
        let doomed: Vec<Expr> = deletes.iter().map(|k| lit(k.as_str())).collect();
        builder
            .when_matched(WhenMatched::UpdateAll)
            .when_not_matched(WhenNotMatched::InsertAll)
            .when_not_matched_by_source(WhenNotMatchedBySource::DeleteIf(
                col(ctx.key).in_list(doomed, false),
            ));
        rows
    };
    let started = std::time::Instant::now();
    let committed = builder
        .try_build()
        .ctx("preparing the merge")?
        .execute_batches(source)
        .await;
    let (merged, merge_stats) = match committed {
        Ok(done) => done,
        Err(e) => {
            // Refused because another handle merged past this pass (Lance
            // checks the marker at commit), or failed for another reason.
            let latest = ctx.opener.refresh(&dataset).await?;
            if let Some(recorded) = recorded_marker(&latest, ctx.shard).await?
                && recorded >= last
            {
                return Err(stale(ctx.shard, first, recorded));
            }
            return Err(Error::from_lance(
                "merging WAL rows into the base table",
                None,
                e,
            ));
        }
    };
    stats.phases.write += started.elapsed();
    stats.rows_upserted += upserted;
    stats.keys_deleted += merge_stats.num_deleted_rows;
    stats.passes += 1;
    Ok((merged, held))
}

/// Generations of a pass read at once (newest first, consumed in order).
const READ_AHEAD: usize = 4;

/// What a pass writes: the newest live version of each key in its
/// generations (empty batches left out), and the keys it deletes — those
/// whose newest version in the pass is a tombstone — sorted.
struct PassRows {
    rows: Vec<RecordBatch>,
    deletes: Vec<String>,
}

/// Read `pass`: each generation through the LSM scanner on its own (live
/// rows under the base table's schema, a generation frozen before a column
/// was added reconciled, a key written twice within it collapsed by its
/// deletion vector), newest generation first, keeping a key only the first
/// time it is met. A key tombstoned in a generation hides it in the older
/// ones, and is deleted unless a newer generation wrote it again.
///
/// Lance's scanner can dedupe across generations itself, but it does so by
/// probing each older row against the key index of every newer generation:
/// for a pass of G generations, about G/2 index probes per row (3.4 µs a
/// record at 110 generations). One hash set does the same in one probe.
async fn read_pass(
    ctx: &MergeContext<'_>,
    dataset: &Dataset,
    pass: &[Pending],
    manifest: Option<&ShardManifest>,
) -> Result<PassRows> {
    let schema: SchemaRef = Arc::new(Schema::from(dataset.schema()));
    let identity: SchemaRef = Arc::new(arrow_schema_with_field_ids(dataset.schema()));
    // Type-erased before they are streamed: a stream over a closure that
    // borrows the pass defeats the proof that the merge's future is `Send`.
    type Read<'r> = BoxFuture<'r, Result<(Vec<RecordBatch>, Vec<String>)>>;
    let reads: Vec<Read<'_>> = pass
        .iter()
        .rev()
        .map(|p| {
            Box::pin(read_generation(
                ctx,
                dataset,
                p,
                manifest,
                schema.clone(),
                identity.clone(),
            )) as Read<'_>
        })
        .collect();
    let mut generations = futures::stream::iter(reads).buffered(READ_AHEAD);
    let mut seen: HashSet<String> = HashSet::new();
    let mut out = PassRows {
        rows: Vec::new(),
        deletes: Vec::new(),
    };
    while let Some((live, tombstoned)) = generations.try_next().await? {
        // Lance's deletion vector leaves one row per key in a generation
        // (its newest, live or tombstone); should two ever be left, the
        // later row is the newer, so the walk goes backwards.
        for batch in live.iter().rev() {
            if let Some(kept) = newest_unseen(batch, ctx.key, &mut seen)? {
                out.rows.push(kept);
            }
        }
        for key in tombstoned {
            if !seen.contains(key.as_str()) {
                seen.insert(key.clone());
                out.deletes.push(key);
            }
        }
    }
    out.deletes.sort();
    Ok(out)
}

/// One generation of a pass: its live rows (none for a generation of
/// tombstones only) and its tombstoned keys (none for one of rows only).
async fn read_generation(
    ctx: &MergeContext<'_>,
    dataset: &Dataset,
    pending: &Pending,
    manifest: Option<&ShardManifest>,
    schema: SchemaRef,
    identity: SchemaRef,
) -> Result<(Vec<RecordBatch>, Vec<String>)> {
    let tombstoned = match pending.kind {
        Kind::Rows => Vec::new(),
        Kind::Deletes | Kind::Both => tombstoned_keys(ctx, dataset, &pending.sstable).await?,
    };
    if pending.kind == Kind::Deletes {
        return Ok((Vec::new(), tombstoned));
    }
    let mut snapshot = ShardSnapshot::new(ctx.shard);
    if let Some(m) = manifest {
        snapshot = snapshot
            .with_spec_id(m.shard_spec_id)
            .with_current_generation(m.current_generation);
    }
    snapshot = snapshot.with_sstable(pending.sstable.generation, pending.sstable.path.clone());
    let rows: Vec<RecordBatch> = LsmScanner::without_base_table(
        schema,
        dataset.uri().to_string(),
        vec![snapshot],
        vec![ctx.key.to_string()],
    )
    .with_identity_schema(identity)
    .with_store_params(ctx.store_params.clone())
    .with_session(dataset.session())
    .with_sstable_cache(ctx.generations.clone())
    .try_into_stream()
    .await
    .ctx("reading the WAL range")?
    .try_collect()
    .await
    .map_err(|e| Error::from_datafusion("reading the WAL range", e))?;
    Ok((rows, tombstoned))
}

/// The rows of `batch` whose key is not in `seen`, the later of two rows
/// with one key winning; their keys are added to `seen`. `None` when no row
/// is kept.
fn newest_unseen(
    batch: &RecordBatch,
    key: &str,
    seen: &mut HashSet<String>,
) -> Result<Option<RecordBatch>> {
    let keys = batch
        .column_by_name(key)
        .and_then(|c| c.as_any().downcast_ref::<StringArray>())
        .ok_or_else(|| Error::internal("a WAL generation's key column is not Utf8"))?;
    let mut keep = vec![false; batch.num_rows()];
    let mut kept = 0;
    for i in (0..batch.num_rows()).rev() {
        if keys.is_null(i) {
            continue;
        }
        let k = keys.value(i);
        if !seen.contains(k) {
            seen.insert(k.to_string());
            keep[i] = true;
            kept += 1;
        }
    }
    Ok(match kept {
        0 => None,
        n if n == batch.num_rows() => Some(batch.clone()),
        _ => Some(arrow_select::filter::filter_record_batch(
            batch,
            &BooleanArray::from(keep),
        )?),
    })
}

fn stale(shard: Uuid, first: u64, recorded: u64) -> Error {
    Error::Conflict {
        message: format!(
            "shard {shard}: generation {first} was merged by another handle meanwhile \
             (marker at {recorded}); this merge stopped without committing it"
        ),
    }
}

/// A batch of the key column holding `keys`.
fn key_batch(dataset: &Dataset, key: &str, keys: &[String]) -> Result<RecordBatch> {
    let field = dataset
        .schema()
        .field(key)
        .ok_or_else(|| Error::internal("the base table lost its key column"))?;
    let schema = Arc::new(Schema::new(vec![arrow_schema::Field::from(field)]));
    let column: ArrayRef = Arc::new(StringArray::from_iter_values(keys.iter()));
    Ok(RecordBatch::try_new(schema, vec![column])?)
}

/// Keys with a tombstone row in one generation.
async fn tombstoned_keys(
    ctx: &MergeContext<'_>,
    dataset: &Dataset,
    sstable: &SsTable,
) -> Result<Vec<String>> {
    let generation = ctx
        .opener
        .open_generation(dataset, &ctx.shard, &sstable.path)
        .await?;
    let mut scan = generation.scan();
    scan.project(&[ctx.key])
        .ctx("projecting the key")?
        .filter(TOMBSTONE)
        .ctx("filtering tombstones")?;
    let mut stream = scan.try_into_stream().await.ctx("reading tombstones")?;
    let mut keys = Vec::new();
    while let Some(batch) = stream.try_next().await.ctx("reading tombstones")? {
        if let Some(col) = batch
            .column_by_name(ctx.key)
            .and_then(|c| c.as_any().downcast_ref::<StringArray>())
        {
            keys.extend(col.iter().flatten().map(str::to_string));
        }
    }
    Ok(keys)
}

#[cfg(test)]
mod tests {
    use super::key_lookup;

    #[test]
    fn a_pass_uses_the_key_index_only_when_small_against_the_base() {
        // A first merge (empty base) and a bulk load join in memory.
        assert!(!key_lookup(1, 0, 0.01));
        assert!(!key_lookup(1_000_000, 0, 0.01));
        assert!(!key_lookup(100_000, 1_000_000, 0.01));
        // A few records into a large base look their keys up.
        assert!(key_lookup(16, 1_000_000, 0.01));
        assert!(key_lookup(9_999, 1_000_000, 0.01));
        assert!(!key_lookup(10_000, 1_000_000, 0.01));
        // 0: never.
        assert!(!key_lookup(1, u64::MAX, 0.0));
    }
}
