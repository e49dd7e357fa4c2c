//! What status, merge and compaction print, as stable JSON objects (field
//! names are documented in docs/cli.md) and as sentences on a terminal.

use anyhow::Result;
use lance_context_store::{CompactionStats, MergeStats, StoreStats};

use crate::output::Out;

/// `status`: one object ([`lance_context_client::StoreStatus`]).
pub fn status(out: &Out, stats: &StoreStats, rows: u64) -> Result<()> {
    let status = lance_context_host::store_status(stats, rows);
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
                "\nindex {} ({}) on {}: {}, {} segment(s)",
                i.name,
                i.kind,
                i.columns.join(", "),
                if i.covers_all_rows {
                    "covers all rows".to_string()
                } else {
                    format!("{} fragment(s) not indexed yet", i.unindexed_fragments)
                },
                i.segments
            ));
        }
        for m in &status.shard_manifests {
            s.push_str(&format!(
                "\nshard {} manifest: version {} ({} byte(s), {} generation(s) listed); {} version(s) kept, {} byte(s)",
                m.shard, m.newest_version, m.newest_bytes, m.listed_generations, m.versions, m.bytes
            ));
        }
        match &status.maintenance_reason {
            Some(why) => s.push_str(&format!("\nmaintenance:           {} ({why})", status.maintenance)),
            None => s.push_str(&format!("\nmaintenance:           {}", status.maintenance)),
        }
        if let Some(e) = &status.last_background_error {
            s.push_str(&format!("\nlast background error: {e}"));
        }
        s
    })
}

/// `merge`: one object ([`lance_context_client::MergeReport`]).
pub fn merge(out: &Out, stats: &MergeStats, seconds: f64) -> Result<()> {
    let m = lance_context_host::merge_report(stats, seconds);
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

/// `compact`: one object ([`lance_context_client::CompactionReport`]).
pub fn compaction(out: &Out, stats: &CompactionStats, seconds: f64) -> Result<()> {
    let c = lance_context_host::compaction_report(stats, seconds);
    out.item(&c, || {
        let mut line = format!(
            "compacted ({:.2} s): {} fragment(s) removed, {} added; {} file(s) removed, {} added; \
             {} index(es) remapped; {} old version(s) removed",
            c.seconds,
            c.fragments_removed,
            c.fragments_added,
            c.files_removed,
            c.files_added,
            c.indexes_remapped,
            c.versions_removed
        );
        if c.fragment_reuse_versions > 0 {
            line.push_str(&format!(
                "; {} fragment-reuse version(s) left: an index was not remapped, or \
                 another compaction ran meanwhile (reads stay right; the next \
                 compaction retries; LANCE_CONTEXT_LOG=lance=warn shows Lance's reasons)",
                c.fragment_reuse_versions
            ));
        }
        line
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
