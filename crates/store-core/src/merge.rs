//! WAL → base merge for this instance's shard, and cleanup of what it merged.
//!
//! # Merge
//! 1. From a fresh base snapshot, read the shard's "merged up to" marker
//!    (`compacted_sstables` of the MemWAL index) and the shard's latest
//!    manifest; the generations above the marker are the work.
//! 2. **Deletes carry over.** Lance's LSM scanner drops tombstones, so a merge
//!    built on it alone would resurrect deleted keys in the base. The tombstoned
//!    keys are read from the raw generations; those whose newest version in the
//!    merged range is still a tombstone (a point lookup over the range does not
//!    return them) are deleted from the base.
//! 3. **Streaming upsert.** The range is read through the LSM scanner (newest
//!    version per key), and upserted into the base in passes of at most
//!    `batch_budget_bytes` of rows held in memory — never the whole WAL.
//! 4. **Atomic marker.** Only the last data-changing pass carries
//!    `mark_sstables_as_compacted(shard, max generation)`, committed in the same
//!    transaction as its data. A crash before it leaves the marker where it was:
//!    the next merge redoes the range (upserts and deletes are idempotent), so
//!    no row is lost or duplicated. The marker only ever increases: the range is
//!    computed from the marker read in step 1.
//!
//! The writer keeps accepting adds during a merge; generations flushed after
//! step 1 are left for the next merge.
//!
//! # Cleanup
//! Lance removes neither merged generation directories nor replayed WAL files.
//! Once a merged generation has been merged for at least `cleanup_grace`
//! (readers holding an older base snapshot may still open it), the shard
//! manifest is updated under the writer's epoch to drop it, then its directory
//! and the WAL entries at or before the manifest's replay position are deleted.
//! The grace is measured from when this process first saw the generation
//! merged, so a restart only delays cleanup.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Instant;

use arrow_array::{Array, ArrayRef, RecordBatch, StringArray, UInt32Array};
use arrow_schema::{Schema, SchemaRef};
use arrow_select::take::take_record_batch;
use futures::TryStreamExt;
use lance::Dataset;
use lance::dataset::mem_wal::scanner::SsTableCache;
use lance::dataset::mem_wal::util::{parse_bit_reversed_filename, shard_base_path};
use lance::dataset::mem_wal::{
    DatasetMemWalExt, LsmScanner, ShardSnapshot, TOMBSTONE, arrow_schema_with_field_ids,
};
use lance::dataset::{MergeInsertBuilder, WhenMatched, WhenNotMatched};
use lance::io::ObjectStoreParams;
use lance_index::mem_wal::CompactedSsTable;
use tokio::sync::Mutex;
use uuid::Uuid;

use crate::config::MergeSettings;
use crate::dataset::Opener;
use crate::error::{Error, LanceResultExt, Result};
use crate::read::key_filter;
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
    /// Merge-insert commits made (the last one carries the marker).
    pub passes: usize,
    /// Most bytes of rows the merge held in memory at once.
    pub peak_buffered_bytes: usize,
    /// Merged generation directories removed by cleanup.
    pub generations_removed: usize,
    /// WAL entry files removed by cleanup.
    pub wal_files_removed: usize,
}

/// Per-store merge state: one merge at a time, and the cleanup clock.
#[derive(Debug, Default)]
pub(crate) struct MergeState {
    running: Mutex<()>,
    /// When this process first saw each merged generation / WAL position.
    first_seen_generation: std::sync::Mutex<HashMap<u64, Instant>>,
    first_seen_wal: std::sync::Mutex<HashMap<u64, Instant>>,
    pub last_merge: std::sync::Mutex<Option<std::time::SystemTime>>,
}

/// Everything the merge needs from the store.
pub(crate) struct MergeContext<'a> {
    pub dataset: Arc<Dataset>,
    pub key: &'a str,
    pub shard: Uuid,
    pub writer: &'a Writer,
    pub settings: &'a MergeSettings,
    pub store_params: ObjectStoreParams,
    pub opener: &'a Opener,
    pub generations: Arc<SsTableCache>,
    pub state: &'a MergeState,
    /// Failpoint for crash tests: stop (with an error) at this step.
    pub fail_at: Option<MergeFailpoint>,
}

/// Where a test can make the merge stop, to simulate a crash there.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MergeFailpoint {
    /// After the data passes that carry no marker, before the final commit.
    BeforeCommit,
    /// After the commit that records the marker, before cleanup.
    AfterCommit,
    /// After the shard manifest dropped merged generations, before their files
    /// are deleted.
    DuringCleanup,
}

fn failpoint(ctx: &MergeContext<'_>, at: MergeFailpoint) -> Result<()> {
    if ctx.fail_at == Some(at) {
        return Err(Error::internal(format!("merge failpoint {at:?}")));
    }
    Ok(())
}

pub(crate) async fn merge_shard(ctx: MergeContext<'_>) -> Result<MergeStats> {
    let _one_at_a_time = ctx.state.running.lock().await;
    let mut stats = MergeStats::default();
    let dataset = ctx.dataset.clone();
    let details = dataset
        .mem_wal_index_details()
        .await
        .ctx("reading the MemWAL index")?
        .ok_or_else(|| Error::internal("the dataset has no MemWAL index"))?;
    let marker = details
        .compacted_sstables
        .iter()
        .find(|c| c.shard_id == ctx.shard)
        .map(|c| c.generation);
    let (_, _, manifest) = ctx.writer.manifest_access().await?;
    let mut pending: Vec<(u64, String)> = manifest
        .as_ref()
        .map(|m| {
            m.sstables
                .iter()
                .filter(|s| marker.is_none_or(|g| s.generation > g))
                .map(|s| (s.generation, s.path.clone()))
                .collect()
        })
        .unwrap_or_default();
    pending.sort();
    stats.merged_up_to = marker;

    if let Some(&(max_generation, _)) = pending.last() {
        let mut snapshot = ShardSnapshot::new(ctx.shard);
        if let Some(m) = &manifest {
            snapshot = snapshot
                .with_spec_id(m.shard_spec_id)
                .with_current_generation(m.current_generation);
        }
        for (generation, path) in &pending {
            snapshot = snapshot.with_sstable(*generation, path.clone());
        }
        let merged = fold_range(
            &ctx,
            &dataset,
            snapshot,
            &pending,
            max_generation,
            &mut stats,
        )
        .await?;
        stats.generations_merged = pending.len();
        stats.merged_up_to = Some(max_generation);
        drop(merged);
        *ctx.state
            .last_merge
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = Some(std::time::SystemTime::now());
        failpoint(&ctx, MergeFailpoint::AfterCommit)?;
    }
    if let Some(up_to) = stats.merged_up_to {
        cleanup(&ctx, &dataset, up_to, &mut stats).await?;
    }
    Ok(stats)
}

/// Deletes, then upsert passes; the last commit carries the marker.
async fn fold_range(
    ctx: &MergeContext<'_>,
    dataset: &Arc<Dataset>,
    snapshot: ShardSnapshot,
    pending: &[(u64, String)],
    max_generation: u64,
    stats: &mut MergeStats,
) -> Result<Arc<Dataset>> {
    let schema: SchemaRef = Arc::new(Schema::from(dataset.schema()));
    let identity: SchemaRef = Arc::new(arrow_schema_with_field_ids(dataset.schema()));
    let scanner = || {
        LsmScanner::without_base_table(
            schema.clone(),
            dataset.uri().to_string(),
            vec![snapshot.clone()],
            vec![ctx.key.to_string()],
        )
        .with_identity_schema(identity.clone())
        .with_store_params(ctx.store_params.clone())
        .with_session(dataset.session())
        .with_sstable_cache(ctx.generations.clone())
    };
    let marker = vec![CompactedSsTable::new(ctx.shard, max_generation)];

    // Keys whose newest version in the range is a tombstone.
    let tombstoned = tombstoned_keys(ctx, dataset, pending).await?;
    let mut deleted: Vec<String> = Vec::new();
    if !tombstoned.is_empty() {
        let ids: Vec<&str> = tombstoned.iter().map(String::as_str).collect();
        let alive: HashSet<String> = scanner()
            .project(&[ctx.key])
            .ctx("projecting the key")?
            .filter_expr(key_filter(ctx.key, &ids))
            .try_into_batch()
            .await
            .ctx("looking up tombstoned keys")?
            .column_by_name(ctx.key)
            .and_then(|c| c.as_any().downcast_ref::<StringArray>().cloned())
            .map(|a| a.iter().flatten().map(str::to_string).collect())
            .unwrap_or_default();
        deleted = tombstoned
            .into_iter()
            .filter(|k| !alive.contains(k))
            .collect();
        deleted.sort();
    }

    // Read the range (newest per key) and cut it into passes within the budget.
    let mut stream = scanner()
        .try_into_stream()
        .await
        .ctx("reading the WAL range")?;
    let budget = ctx.settings.batch_budget_bytes.max(1);
    let mut current = dataset.clone();
    let mut buffer: Vec<RecordBatch> = Vec::new();
    let mut buffered = 0usize;
    // A batch not yet fully taken, with its bytes per row measured before it
    // was sliced (a slice reports its parent's whole buffers).
    let mut pending_batch: Option<(RecordBatch, usize)> = None;
    // Deletes go first, in their own pass without the marker, unless there is
    // nothing else to commit (then they carry it).
    let mut deletes_done = deleted.is_empty();
    loop {
        let (batch, per_row) = match pending_batch.take() {
            Some(pending) => pending,
            None => match stream
                .try_next()
                .await
                .map_err(|e| Error::internal(format!("reading the WAL range: {e}")))?
            {
                None => break,
                Some(b) if b.num_rows() == 0 => continue,
                Some(b) => {
                    let per_row = (b.get_array_memory_size() / b.num_rows()).max(1);
                    (b, per_row)
                }
            },
        };
        let room = budget.saturating_sub(buffered);
        let mut take = (room / per_row).clamp(1, batch.num_rows());
        let (owned, size) = loop {
            // `take` allocates compact buffers (a slice, or `concat` of one
            // slice, would keep the scanner's whole batch alive).
            let indices = UInt32Array::from_iter_values(0..take as u32);
            let owned = take_record_batch(&batch, &indices)?;
            let size = owned.get_array_memory_size();
            if size <= room || take == 1 {
                break (owned, size);
            }
            let scaled = (take as u128 * room as u128 / size as u128) as usize;
            take = scaled.clamp(1, take - 1);
        };
        if size > room && !buffer.is_empty() {
            // Not even one row fits next to what is held: commit it, then retry.
            if !deletes_done {
                current = delete_pass(ctx, &current, &deleted, None, stats).await?;
                deletes_done = true;
            }
            current = upsert_pass(ctx, &current, std::mem::take(&mut buffer), None, stats).await?;
            buffered = 0;
            pending_batch = Some((batch, per_row));
            continue;
        }
        // (A single row larger than the whole budget is taken alone.)
        buffered += size;
        stats.peak_buffered_bytes = stats.peak_buffered_bytes.max(buffered);
        buffer.push(owned);
        if take < batch.num_rows() {
            pending_batch = Some((batch.slice(take, batch.num_rows() - take), per_row));
        }
    }
    failpoint(ctx, MergeFailpoint::BeforeCommit)?;
    if buffer.is_empty() {
        // Nothing to upsert: the delete pass (possibly of zero keys' worth of
        // matches) records the marker.
        return delete_pass(ctx, &current, &deleted, Some(marker), stats).await;
    }
    if !deletes_done {
        current = delete_pass(ctx, &current, &deleted, None, stats).await?;
    }
    upsert_pass(ctx, &current, buffer, Some(marker), stats).await
}

async fn upsert_pass(
    ctx: &MergeContext<'_>,
    dataset: &Arc<Dataset>,
    batches: Vec<RecordBatch>,
    marker: Option<Vec<CompactedSsTable>>,
    stats: &mut MergeStats,
) -> Result<Arc<Dataset>> {
    let rows: u64 = batches.iter().map(|b| b.num_rows() as u64).sum();
    let mut builder = MergeInsertBuilder::try_new(dataset.clone(), vec![ctx.key.to_string()])
        .ctx("preparing the merge")?;
    builder
        .when_matched(WhenMatched::UpdateAll)
        .when_not_matched(WhenNotMatched::InsertAll);
    if let Some(marker) = marker {
        builder.mark_sstables_as_compacted(marker);
    }
    let (merged, _) = builder
        .try_build()
        .ctx("preparing the merge")?
        .execute_batches(batches)
        .await
        .ctx("merging WAL rows into the base table")?;
    stats.rows_upserted += rows;
    stats.passes += 1;
    Ok(merged)
}

async fn delete_pass(
    ctx: &MergeContext<'_>,
    dataset: &Arc<Dataset>,
    keys: &[String],
    marker: Option<Vec<CompactedSsTable>>,
    stats: &mut MergeStats,
) -> Result<Arc<Dataset>> {
    let key_field = dataset
        .schema()
        .field(ctx.key)
        .ok_or_else(|| Error::internal("the base table lost its key column"))?;
    let key_schema = Arc::new(Schema::new(vec![arrow_schema::Field::from(key_field)]));
    let column: ArrayRef = Arc::new(StringArray::from_iter_values(keys.iter()));
    let batch = RecordBatch::try_new(key_schema, vec![column])?;
    let mut builder = MergeInsertBuilder::try_new(dataset.clone(), vec![ctx.key.to_string()])
        .ctx("preparing the delete pass")?;
    builder
        .when_matched(WhenMatched::Delete)
        .when_not_matched(WhenNotMatched::DoNothing);
    if let Some(marker) = marker {
        builder.mark_sstables_as_compacted(marker);
    }
    let batches = if batch.num_rows() == 0 {
        vec![]
    } else {
        vec![batch]
    };
    let (merged, merge_stats) = builder
        .try_build()
        .ctx("preparing the delete pass")?
        .execute_batches(batches)
        .await
        .ctx("deleting merged tombstones from the base table")?;
    stats.keys_deleted += merge_stats.num_deleted_rows;
    stats.passes += 1;
    Ok(merged)
}

/// Keys with a tombstone row in any generation of the range.
async fn tombstoned_keys(
    ctx: &MergeContext<'_>,
    dataset: &Dataset,
    pending: &[(u64, String)],
) -> Result<HashSet<String>> {
    let mut keys = HashSet::new();
    for (_, path) in pending {
        let generation = ctx
            .opener
            .open_generation(dataset, &ctx.shard, path)
            .await?;
        if generation.schema().field(TOMBSTONE).is_none() {
            continue;
        }
        let mut scan = generation.scan();
        scan.project(&[ctx.key])
            .ctx("projecting the key")?
            .filter(TOMBSTONE)
            .ctx("filtering tombstones")?;
        let mut stream = scan.try_into_stream().await.ctx("reading tombstones")?;
        while let Some(batch) = stream.try_next().await.ctx("reading tombstones")? {
            if let Some(col) = batch
                .column_by_name(ctx.key)
                .and_then(|c| c.as_any().downcast_ref::<StringArray>())
            {
                keys.extend(col.iter().flatten().map(str::to_string));
            }
        }
    }
    Ok(keys)
}

/// Drop merged generations from the shard manifest and delete their files (and
/// replayed WAL entries) once they have been merged for the grace period.
async fn cleanup(
    ctx: &MergeContext<'_>,
    dataset: &Dataset,
    merged_up_to: u64,
    stats: &mut MergeStats,
) -> Result<()> {
    let grace = ctx.settings.cleanup_grace;
    let now = Instant::now();
    let due = |seen: &mut HashMap<u64, Instant>, id: u64| -> bool {
        let first = *seen.entry(id).or_insert(now);
        now.duration_since(first) >= grace
    };
    let (manifest_store, epoch, manifest) = ctx.writer.manifest_access().await?;
    let Some(manifest) = manifest else {
        return Ok(());
    };

    // 1. The manifest stops listing merged generations that are due.
    let droppable: HashSet<u64> = {
        let mut seen = ctx
            .state
            .first_seen_generation
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        manifest
            .sstables
            .iter()
            .filter(|s| s.generation <= merged_up_to)
            .filter(|s| due(&mut seen, s.generation))
            .map(|s| s.generation)
            .collect()
    };
    let manifest = if droppable.is_empty() {
        manifest
    } else {
        manifest_store
            .commit_update(epoch, |current| {
                let mut next = current.clone();
                next.version = current.next_version();
                next.sstables.retain(|s| !droppable.contains(&s.generation));
                next
            })
            .await
            .map_err(|e| Error::from_lance("dropping merged generations", Some(ctx.shard), e))?
    };
    failpoint(ctx, MergeFailpoint::DuringCleanup)?;

    // 2. Directories of merged generations no longer listed, once due.
    let store = dataset
        .object_store(None)
        .await
        .ctx("opening the object store")?;
    let shard_dir = shard_base_path(&dataset.branch_location().path, &ctx.shard);
    let listed: HashSet<u64> = manifest.sstables.iter().map(|s| s.generation).collect();
    let entries = store
        .read_dir(shard_dir.clone())
        .await
        .ctx("listing the shard")?;
    // Generations still on disk afterwards; the first-seen clock forgets the rest.
    let mut remaining: HashSet<u64> = listed.clone();
    for name in entries {
        let Some(generation) = name
            .rsplit_once("_gen_")
            .and_then(|(_, n)| n.parse::<u64>().ok())
        else {
            continue;
        };
        remaining.insert(generation);
        if generation > merged_up_to || listed.contains(&generation) {
            continue;
        }
        let is_due = {
            let mut seen = ctx
                .state
                .first_seen_generation
                .lock()
                .unwrap_or_else(|p| p.into_inner());
            due(&mut seen, generation)
        };
        if is_due {
            store
                .remove_dir_all(shard_dir.clone().join(name.as_str()))
                .await
                .ctx("removing a merged generation")?;
            stats.generations_removed += 1;
            remaining.remove(&generation);
        }
    }
    ctx.state
        .first_seen_generation
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .retain(|g, _| remaining.contains(g));

    // 3. WAL entries already covered by flushed generations, once due.
    let replayed_up_to = manifest.replay_after_wal_entry_position;
    let wal_dir = shard_dir.clone().join("wal");
    let wal_entries = match store.read_dir(wal_dir.clone()).await {
        Ok(entries) => entries,
        Err(e) if e.is_not_found() => Vec::new(),
        Err(e) => return Err(Error::from_lance("listing the WAL", None, e)),
    };
    let mut remaining_wal: HashSet<u64> = HashSet::new();
    for name in wal_entries {
        let Some(position) = parse_bit_reversed_filename(&name) else {
            continue;
        };
        if position == 0 || position > replayed_up_to {
            continue;
        }
        remaining_wal.insert(position);
        let is_due = {
            let mut seen = ctx
                .state
                .first_seen_wal
                .lock()
                .unwrap_or_else(|p| p.into_inner());
            due(&mut seen, position)
        };
        if is_due {
            store
                .delete(&wal_dir.clone().join(name.as_str()))
                .await
                .ctx("removing a replayed WAL entry")?;
            stats.wal_files_removed += 1;
            remaining_wal.remove(&position);
        }
    }
    ctx.state
        .first_seen_wal
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .retain(|p, _| remaining_wal.contains(p));
    Ok(())
}
