//! What status, merge and compaction print, as stable JSON objects (field
//! names are documented in docs/cli.md) and as sentences on a terminal.

use anyhow::Result;
use lance_context_store::{CompactionStats, MergeStats, StoreStats};
use serde::Serialize;

use crate::output::Out;

/// `status`: one object.
#[derive(Debug, Serialize)]
pub struct Status {
    pub rows: u64,
    pub rows_in_base: u64,
    pub version: u64,
    pub versions: usize,
    pub fragments: usize,
    pub small_fragments: usize,
    pub unmerged_rows: u64,
    pub unmerged_bytes: u64,
    pub bytes_on_disk: u64,
    pub pending_generations: Vec<PendingShard>,
    pub indexes: Vec<Index>,
    pub last_background_error: Option<String>,
}

#[derive(Debug, Serialize)]
pub struct PendingShard {
    pub shard: String,
    pub generations: usize,
}

#[derive(Debug, Serialize)]
pub struct Index {
    pub name: String,
    pub kind: String,
    pub columns: Vec<String>,
    pub covers_all_rows: bool,
    pub unindexed_fragments: usize,
}

pub fn status(out: &Out, stats: &StoreStats, rows: u64) -> Result<()> {
    let status = Status {
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
            })
            .collect(),
        indexes: stats
            .indexes
            .iter()
            .map(|i| Index {
                name: i.name.clone(),
                kind: i.kind.clone(),
                columns: i.columns.clone(),
                covers_all_rows: i.covers_all_rows,
                unindexed_fragments: i.unindexed_fragments,
            })
            .collect(),
        last_background_error: stats.last_background_error.clone(),
    };
    out.item(&status, || {
        let mut s = format!(
            "rows (newest per key): {}\nrows in base table:    {}\ndataset version:       {} ({} kept)\n\
             fragments:             {} ({} below the compaction target)\n\
             unmerged:              {} row(s), {} byte(s)\nbytes on disk:         {}",
            status.rows,
            status.rows_in_base,
            status.version,
            status.versions,
            status.fragments,
            status.small_fragments,
            status.unmerged_rows,
            status.unmerged_bytes,
            status.bytes_on_disk
        );
        for p in &status.pending_generations {
            s.push_str(&format!(
                "\nshard {}: {} unmerged generation(s)",
                p.shard, p.generations
            ));
        }
        for i in &status.indexes {
            s.push_str(&format!(
                "\nindex {} ({}) on {}: {}",
                i.name,
                i.kind,
                i.columns.join(", "),
                if i.covers_all_rows {
                    "covers all rows".to_string()
                } else {
                    format!("{} fragment(s) not indexed yet", i.unindexed_fragments)
                }
            ));
        }
        if let Some(e) = &status.last_background_error {
            s.push_str(&format!("\nlast background error: {e}"));
        }
        s
    })
}

/// `merge`: one object.
#[derive(Debug, Serialize)]
pub struct Merge {
    pub generations_merged: usize,
    pub merged_up_to: Option<u64>,
    pub rows_upserted: u64,
    pub keys_deleted: u64,
    pub passes: usize,
    pub peak_buffered_bytes: usize,
    pub generations_removed: usize,
    pub wal_files_removed: usize,
    pub versions_removed: u64,
    pub seconds: f64,
}

pub fn merge(out: &Out, stats: &MergeStats, seconds: f64) -> Result<()> {
    let m = Merge {
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
    };
    out.item(&m, || {
        format!(
            "merged {} generation(s): {} row(s) upserted, {} key(s) deleted in {} pass(es) ({:.2} s); \
             removed {} merged generation(s), {} WAL file(s), {} old version(s)",
            m.generations_merged,
            m.rows_upserted,
            m.keys_deleted,
            m.passes,
            m.seconds,
            m.generations_removed,
            m.wal_files_removed,
            m.versions_removed
        )
    })
}

/// `compact`: one object.
#[derive(Debug, Serialize)]
pub struct Compaction {
    pub fragments_removed: usize,
    pub fragments_added: usize,
    pub files_removed: usize,
    pub files_added: usize,
    pub versions_removed: u64,
    pub seconds: f64,
}

pub fn compaction(out: &Out, stats: &CompactionStats, seconds: f64) -> Result<()> {
    let c = Compaction {
        fragments_removed: stats.fragments_removed,
        fragments_added: stats.fragments_added,
        files_removed: stats.files_removed,
        files_added: stats.files_added,
        versions_removed: stats.versions_removed,
        seconds,
    };
    out.item(&c, || {
        format!(
            "compacted ({:.2} s): {} fragment(s) removed, {} added; {} file(s) removed, {} added; {} old version(s) removed",
            c.seconds,
            c.fragments_removed,
            c.fragments_added,
            c.files_removed,
            c.files_added,
            c.versions_removed
        )
    })
}

/// Print the rows a lookup found; then, if some asked keys were not found,
/// fail with a not-found error naming them (exit code 3).
pub fn found(out: &Out, batch: &arrow_array::RecordBatch, key: &str, ids: &[&str]) -> Result<()> {
    use arrow_array::Array;
    out.rows(batch)?;
    let found: std::collections::HashSet<&str> = batch
        .column_by_name(key)
        .and_then(|c| c.as_any().downcast_ref::<arrow_array::StringArray>())
        .map(|c| c.iter().flatten().collect())
        .unwrap_or_default();
    let mut seen = std::collections::HashSet::new();
    let missing: Vec<&str> = ids
        .iter()
        .copied()
        .filter(|id| !found.contains(id) && seen.insert(*id))
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    Err(lance_context_store::Error::NotFound {
        what: format!("no record with {key} {}", missing.join(", ")),
    }
    .into())
}
