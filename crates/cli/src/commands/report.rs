//! What the engine-level commands print (`dataset …`: the same objects as
//! the store commands, see `through`), and what a lookup found.

use anyhow::Result;
use lance_context_store::{CompactionStats, MergeStats, StoreStats};

use crate::output::Out;

/// `status` of an engine store (`dataset status`): as `store status`
/// prints it.
pub fn status(out: &Out, stats: &StoreStats, rows: u64) -> Result<()> {
    super::through::print_status(out, &lance_context_host::store_status(stats, rows))
}

/// `merge` of an engine store (`dataset merge`).
pub fn merge(out: &Out, stats: &MergeStats, seconds: f64) -> Result<()> {
    super::through::print_merge(out, &lance_context_host::merge_report(stats, seconds))
}

/// `compact` of an engine store (`dataset compact`).
pub fn compaction(out: &Out, stats: &CompactionStats, seconds: f64) -> Result<()> {
    super::through::print_compaction(out, &lance_context_host::compaction_report(stats, seconds))
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
    missing(key, ids, &found)
}

/// Fail with a not-found error naming the asked keys not `found` (exit
/// code 3), each once.
pub fn missing(key: &str, ids: &[&str], found: &std::collections::HashSet<&str>) -> Result<()> {
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
