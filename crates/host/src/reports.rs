//! The engine's maintenance and status figures as the API's report types
//! (`lance_context_client::{StoreStatus, MergeReport, CompactionReport}`):
//! one JSON form for the REST server and the CLI's `--json`.

use lance_context_client::{
    CompactionReport, IndexStatus, MergePhaseSeconds, MergeReport, PendingShard,
    ShardManifestStatus, StoreStatus,
};
use lance_context_store::{CompactionStats, MergeStats, StoreStats};

/// A store's state: `stats` and the number of records a scan returns.
pub fn store_status(stats: &StoreStats, rows: u64) -> StoreStatus {
    // A bucketed store's shards, by bucket.
    let buckets: std::collections::HashMap<String, u32> = (0..stats.buckets)
        .filter(|_| stats.buckets > 1)
        .map(|b| {
            let shard = lance_context_store::shard_id_for_instance(
                &lance_context_store::bucket_instance_id(b),
            );
            (shard.to_string(), b)
        })
        .collect();
    StoreStatus {
        buckets: stats.buckets,
        owned_buckets: stats.owned_buckets.clone(),
        rows,
        rows_in_base: stats.rows_in_base,
        version: stats.version,
        versions: stats.versions,
        fragments: stats.fragments,
        small_fragments: stats.small_fragments,
        unmerged_rows: stats.unmerged_rows,
        unmerged_bytes: stats.unmerged_bytes,
        bytes_on_disk: stats.bytes_on_disk,
        pending_generations: stats
            .pending_generations
            .iter()
            .map(|(shard, generations)| PendingShard {
                shard: shard.to_string(),
                generations: *generations,
                bucket: buckets.get(&shard.to_string()).copied(),
            })
            .collect(),
        indexes: stats
            .indexes
            .iter()
            .map(|i| IndexStatus {
                name: i.name.clone(),
                kind: i.kind.clone(),
                columns: i.columns.clone(),
                covers_all_rows: i.covers_all_rows,
                unindexed_fragments: i.unindexed_fragments,
                segments: i.segments,
            })
            .collect(),
        last_background_error: stats.last_background_error.clone(),
        maintenance: stats.maintenance.name().to_string(),
        maintenance_reason: stats.maintenance.reason().map(str::to_string),
        shard_manifests: stats
            .shard_manifests
            .iter()
            .map(|m| ShardManifestStatus {
                shard: m.shard.to_string(),
                bucket: buckets.get(&m.shard.to_string()).copied(),
                versions: m.versions,
                bytes: m.bytes,
                newest_version: m.newest_version,
                newest_bytes: m.newest_bytes,
                listed_generations: m.listed_generations,
            })
            .collect(),
    }
}

/// What a merge did, and how long it took.
pub fn merge_report(stats: &MergeStats, seconds: f64) -> MergeReport {
    MergeReport {
        generations_merged: stats.generations_merged,
        merged_up_to: stats.merged_up_to,
        rows_upserted: stats.rows_upserted,
        keys_deleted: stats.keys_deleted,
        passes: stats.passes,
        peak_buffered_bytes: stats.peak_buffered_bytes,
        generations_removed: stats.generations_removed,
        wal_files_removed: stats.wal_files_removed,
        versions_removed: stats.versions_removed,
        seconds,
        phases: MergePhaseSeconds {
            read: stats.phases.read.as_secs_f64(),
            write: stats.phases.write.as_secs_f64(),
            count: stats.phases.count.as_secs_f64(),
            cleanup: stats.phases.cleanup.as_secs_f64(),
            indexes: stats.phases.indexes.as_secs_f64(),
            retention: stats.phases.retention.as_secs_f64(),
        },
    }
}

/// What a compaction did, and how long it took.
pub fn compaction_report(stats: &CompactionStats, seconds: f64) -> CompactionReport {
    CompactionReport {
        fragments_removed: stats.fragments_removed,
        fragments_added: stats.fragments_added,
        files_removed: stats.files_removed,
        files_added: stats.files_added,
        versions_removed: stats.versions_removed,
        indexes_remapped: stats.indexes_remapped,
        fragment_reuse_versions: stats.fragment_reuse_versions,
        seconds,
    }
}
