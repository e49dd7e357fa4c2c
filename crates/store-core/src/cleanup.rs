//! Cleanup of what merges left behind, and version retention.
//!
//! Lance removes neither merged generation directories nor replayed WAL
//! files nor old shard manifests, and keeps every version of the base table.
//! Maintenance (every merge, and compaction) removes them here — in any
//! process, including a short-lived CLI command, because every clock it uses
//! is one every process can read:
//!
//! - **Merged generations** (at or below the shard's marker) are deleted once
//!   merged for `cleanup_grace`: readers holding an older base snapshot may
//!   still open them. When a generation was merged is kept in a small ledger
//!   beside the dataset (`_lance_context/merged/<shard>`: "generation, time"
//!   lines, written by the first maintenance pass that sees the marker move —
//!   normally the merge itself, right after its commit). A ledger lost or
//!   overwritten by a concurrent pass only delays cleanup (the next pass
//!   records "now"), never hastens it.
//! - The shard's **owner** (the handle holding its writer, or a
//!   `SingleWriter` takeover holding the claim it made) drops every merged
//!   generation from the shard manifest's list right after the merge, so the
//!   list holds only unmerged generations. Other handles leave the list
//!   alone (only the epoch holder may commit it; readers skip listed
//!   generations at or below the marker anyway).
//! - **WAL entries** below both of the manifest's replay and last-seen
//!   positions (replay never reads them; the last-seen entry is kept because
//!   Lance's fencing finds the log's tip from it) are deleted once older than
//!   the grace, by their own timestamps.
//! - **Old shard manifest versions** are pruned beyond the newest
//!   [`MANIFEST_VERSIONS_KEPT`] once two hours old (see
//!   [`crate::MergeSettings::manifest_prune_age`]; Lance itself waits a day).
//! - **Old base-table versions** are removed by the retention policy
//!   ([`crate::RetentionSettings`]): a version goes when it is neither among
//!   the newest `keep_versions` nor younger than `keep_for`.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use futures::StreamExt;
use lance::Dataset;
use lance::dataset::cleanup::CleanupPolicy;
use lance::dataset::mem_wal::util::{parse_bit_reversed_filename, shard_base_path};
use lance::io::ObjectStore;
use uuid::Uuid;

use crate::config::RetentionSettings;
use crate::error::{Error, LanceResultExt, Result};
use crate::merge::{MergeContext, MergeFailpoint, MergeStats, latest_manifest};

/// Shard manifest versions kept by cleanup.
pub(crate) const MANIFEST_VERSIONS_KEPT: u64 = 16;

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

/// When the marker of one shard reached each recorded generation.
#[derive(Debug, Default)]
struct Ledger {
    /// (generation, unix ms), increasing in both.
    entries: Vec<(u64, i64)>,
}

impl Ledger {
    fn path(dataset: &Dataset, shard: Uuid) -> object_store::path::Path {
        crate::dataset::engine_dir(dataset)
            .join("merged")
            .join(shard.to_string())
    }

    async fn read(store: &ObjectStore, dataset: &Dataset, shard: Uuid) -> Result<Self> {
        let bytes = match store.read_one_all(&Self::path(dataset, shard)).await {
            Ok(bytes) => bytes,
            Err(e) if e.is_not_found() => return Ok(Self::default()),
            Err(e) => return Err(Error::from_lance("reading the merge ledger", None, e)),
        };
        // A line that does not parse (a torn write) is dropped: that only
        // delays cleanup of what it covered.
        let entries = String::from_utf8_lossy(&bytes)
            .lines()
            .filter_map(|line| {
                let (g, t) = line.split_once(' ')?;
                Some((g.parse().ok()?, t.parse().ok()?))
            })
            .collect();
        Ok(Self { entries })
    }

    async fn write(&self, store: &ObjectStore, dataset: &Dataset, shard: Uuid) -> Result<()> {
        let text: String = self
            .entries
            .iter()
            .map(|(g, t)| format!("{g} {t}\n"))
            .collect();
        store
            .put(&Self::path(dataset, shard), text.as_bytes())
            .await
            .ctx("writing the merge ledger")?;
        Ok(())
    }

    /// Record that the marker stands at `marker` now, unless known already.
    fn observe(&mut self, marker: u64) -> bool {
        if self.entries.last().is_some_and(|(g, _)| *g >= marker) {
            return false;
        }
        self.entries.push((marker, now_ms()));
        true
    }

    /// When `generation` was merged: the earliest entry covering it.
    fn merged_at(&self, generation: u64) -> Option<i64> {
        self.entries
            .iter()
            .find(|(g, _)| *g >= generation)
            .map(|(_, t)| *t)
    }

    /// Forget entries whose generations are all cleaned (keep the newest).
    fn forget_up_to(&mut self, cleaned: u64) -> bool {
        let keep_from = self
            .entries
            .iter()
            .position(|(g, _)| *g > cleaned)
            .unwrap_or(self.entries.len().saturating_sub(1));
        if keep_from == 0 {
            return false;
        }
        self.entries.drain(..keep_from);
        true
    }
}

fn due(grace: Duration, at_ms: i64) -> bool {
    now_ms().saturating_sub(at_ms) >= grace.as_millis() as i64
}

/// Clean up a shard after a merge up to `merged_up_to` (see the module docs).
pub(crate) async fn cleanup_shard(
    ctx: &MergeContext<'_>,
    dataset: &Dataset,
    merged_up_to: Option<u64>,
    stats: &mut MergeStats,
) -> Result<()> {
    let Some(marker) = merged_up_to else {
        return Ok(());
    };
    let grace = ctx.settings.cleanup_grace;
    let store = dataset
        .object_store(None)
        .await
        .ctx("opening the object store")?;
    let mut ledger = Ledger::read(&store, dataset, ctx.shard).await?;
    let mut ledger_changed = ledger.observe(marker);
    let is_due = |g: u64| ledger.merged_at(g).is_some_and(|t| due(grace, t));

    // 1. The owner drops merged generations from the manifest's list at
    //    once: readers skip them by the base's marker, and a reader still on
    //    an older base finds the list starting past its marker (a gap) and
    //    reads the newer base. Their files stay for the grace.
    drop_merged_from_manifest(ctx, marker).await?;
    ctx.failpoint(MergeFailpoint::DuringCleanup)?;

    // 2. Directories of merged generations, once due.
    let shard_dir = shard_base_path(&dataset.branch_location().path, &ctx.shard);
    let entries = match store.read_dir(shard_dir.clone()).await {
        Ok(entries) => entries,
        Err(e) if e.is_not_found() => Vec::new(),
        Err(e) => return Err(Error::from_lance("listing the shard", None, e)),
    };
    let mut oldest_kept = None::<u64>;
    for name in entries {
        let Some(generation) = name
            .trim_end_matches('/')
            .rsplit_once("_gen_")
            .and_then(|(_, n)| n.parse::<u64>().ok())
        else {
            continue;
        };
        if generation <= marker && is_due(generation) {
            // Another handle's cleanup may have removed it first.
            match store
                .remove_dir_all(shard_dir.clone().join(name.trim_end_matches('/')))
                .await
            {
                Ok(()) => stats.generations_removed += 1,
                Err(e) if e.is_not_found() => {}
                Err(e) => return Err(Error::from_lance("removing a merged generation", None, e)),
            }
        } else if generation <= marker {
            oldest_kept = Some(oldest_kept.map_or(generation, |o| o.min(generation)));
        }
    }
    let cleaned = oldest_kept.map_or(marker, |o| o.saturating_sub(1));
    ledger_changed |= ledger.forget_up_to(cleaned);
    if ledger_changed {
        ledger.write(&store, dataset, ctx.shard).await?;
    }

    // 3. WAL entries replay never reads again, once older than the grace.
    if let Some(manifest) = latest_manifest(dataset, ctx.shard).await? {
        stats.wal_files_removed +=
            remove_replayed_wal(&store, &shard_dir, &manifest, grace).await?;

        // 4. Old shard manifest versions.
        if manifest.version > MANIFEST_VERSIONS_KEPT {
            stats.manifest_versions_removed += prune_manifest_versions(
                &store,
                &dataset.branch_location().path,
                ctx.shard,
                manifest.version - MANIFEST_VERSIONS_KEPT,
                ctx.settings.manifest_prune_age,
            )
            .await?;
        }
    }
    Ok(())
}

/// The owner's step of cleanup: drop the generations at or below `marker`
/// from the shard manifest's list (nothing when this handle holds no writer
/// of the shard, or its writer's latch is set: fenced or recovering).
async fn drop_merged_from_manifest(ctx: &MergeContext<'_>, marker: u64) -> Result<()> {
    if let Some(writer) = ctx.writer
        && writer.check_latch().is_ok()
    {
        let (manifest_store, epoch, manifest) = writer.manifest_access().await?;
        if let Some(manifest) = manifest {
            let droppable: HashSet<u64> = manifest
                .sstables
                .iter()
                .map(|s| s.generation)
                .filter(|g| *g <= marker)
                .collect();
            if !droppable.is_empty() {
                manifest_store
                    .commit_update(epoch, |current| {
                        let mut next = current.clone();
                        next.version = current.next_version();
                        next.sstables.retain(|s| !droppable.contains(&s.generation));
                        next
                    })
                    .await
                    .map_err(|e| {
                        Error::from_lance("dropping merged generations", Some(ctx.shard), e)
                    })?;
            }
        }
    }
    Ok(())
}

/// Remove the shard's WAL entries below both of `manifest`'s replay and
/// last-seen positions once older than `grace`; the number removed.
async fn remove_replayed_wal(
    store: &ObjectStore,
    shard_dir: &object_store::path::Path,
    manifest: &lance_index::mem_wal::ShardManifest,
    grace: Duration,
) -> Result<usize> {
    let below = manifest
        .replay_after_wal_entry_position
        .min(manifest.wal_entry_position_last_seen);
    let mut listing = store.list(Some(shard_dir.clone().join("wal")));
    let mut doomed = Vec::new();
    while let Some(meta) = listing.next().await {
        let meta = match meta {
            Ok(meta) => meta,
            Err(e) if e.is_not_found() => break,
            Err(e) => return Err(Error::from_lance("listing the WAL", None, e)),
        };
        let Some(position) = meta
            .location
            .filename()
            .and_then(parse_bit_reversed_filename)
        else {
            continue;
        };
        if position > 0 && position < below && due(grace, meta.last_modified.timestamp_millis()) {
            doomed.push(meta.location);
        }
    }
    let mut removed = 0;
    for path in doomed {
        match store.delete(&path).await {
            Ok(()) => removed += 1,
            Err(e) if e.is_not_found() => {}
            Err(e) => return Err(Error::from_lance("removing a replayed WAL entry", None, e)),
        }
    }
    Ok(removed)
}

/// Remove the shard's manifest versions below `keep_from` written at least
/// `age` ago (see [`crate::MergeSettings::manifest_prune_age`]), oldest first, stopping at the first younger
/// one or the first failure, so the versions left stay contiguous; the
/// number removed.
async fn prune_manifest_versions(
    store: &ObjectStore,
    base_path: &object_store::path::Path,
    shard: Uuid,
    keep_from: u64,
    age: Duration,
) -> Result<usize> {
    let dir = lance::dataset::mem_wal::util::shard_manifest_path(base_path, &shard);
    let mut versions = Vec::new();
    let mut listing = store.list(Some(dir));
    while let Some(meta) = listing.next().await {
        let meta = match meta {
            Ok(meta) => meta,
            Err(e) if e.is_not_found() => break,
            Err(e) => return Err(Error::from_lance("listing shard manifests", Some(shard), e)),
        };
        if let Some(name) = meta.location.filename()
            && name.ends_with(".binpb")
            && let Some(version) = parse_bit_reversed_filename(name)
        {
            versions.push((
                version,
                meta.last_modified.timestamp_millis(),
                meta.location,
            ));
        }
    }
    versions.sort_by_key(|(version, _, _)| *version);
    let mut removed = 0;
    for (version, written_ms, path) in versions {
        if version >= keep_from || !due(age, written_ms) {
            break;
        }
        match store.delete(&path).await {
            Ok(()) => removed += 1,
            Err(e) if e.is_not_found() => {}
            Err(e) => return Err(Error::from_lance("pruning shard manifests", Some(shard), e)),
        }
    }
    Ok(removed)
}

/// Remove base-table versions the retention policy no longer keeps; the
/// number removed.
pub(crate) async fn apply_retention(
    dataset: &Arc<Dataset>,
    retention: &RetentionSettings,
) -> Result<u64> {
    let latest = dataset.version().version;
    if latest <= retention.keep_versions as u64 {
        return Ok(0);
    }
    let keep_for = chrono::Duration::from_std(retention.keep_for)
        .map_err(|_| Error::invalid_argument("retention.keep_for is too long"))?;
    let policy = CleanupPolicy {
        before_timestamp: Some(chrono::Utc::now() - keep_for),
        before_version: Some(latest - retention.keep_versions as u64 + 1),
        ..CleanupPolicy::default()
    };
    let removed = dataset
        .cleanup_with_policy(policy)
        .await
        .ctx("removing old versions")?;
    Ok(removed.old_versions)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ledger_dates_a_generation_by_the_first_marker_covering_it() {
        let mut ledger = Ledger {
            entries: vec![(5, 1_000), (9, 2_000)],
        };
        assert_eq!(ledger.merged_at(3), Some(1_000));
        assert_eq!(ledger.merged_at(6), Some(2_000));
        assert_eq!(ledger.merged_at(10), None);
        assert!(!ledger.observe(9), "known already");
        assert!(ledger.observe(12));
        assert!(ledger.forget_up_to(9));
        assert_eq!(ledger.entries.len(), 1);
        assert!(!ledger.forget_up_to(100), "the newest entry stays");
    }
}
