//! The base table's rows whose column is one of a list of values, read
//! through the column's BTree index without a query plan.
//!
//! A keyed read (a lookup by key, the checks of a record write) asks the base
//! table for `column IN (values)`. Through Lance's scanner that is a plan
//! built for the filter each time — the filter simplified, the index
//! chosen, the fragments split into indexed and unindexed, a DataFusion
//! plan of a scalar-index node, a filtered read and a take — and the plan
//! cost more than the search and the read together. Here the same steps run
//! directly: search the index (every segment of it) and take the rows by
//! address, which leaves out the rows the fragments' deletion files delete
//! (a merge rewriting or deleting a row deletes its old copy; the index
//! still lists it).
//!
//! Only where that is the whole answer: the index's segments cover every
//! fragment of the version (rows merged since the last index refresh are in
//! fragments no segment covers), no fragment carries a data overlay (a value
//! replaced in place after the index was built), every segment is a BTree
//! that answers exactly, every column asked for is in the version, and row
//! ids are addresses. Otherwise [`indexed_rows`] returns `None` and
//! the caller plans a scan as before.

use std::sync::Arc;

use arrow_array::RecordBatch;
use lance::Dataset;
use lance::dataset::ProjectionRequest;
use lance::deps::datafusion::common::ScalarValue;
use lance::index::DatasetIndexExt;
use lance_index::metrics::NoOpMetricsCollector;
use lance_index::scalar::SargableQuery;
use lance_index::scalar::SearchResult;
use lance_index::scalar::expression::ScalarIndexLoader;
use roaring::RoaringBitmap;

use crate::error::{LanceResultExt, Result};

/// The rows of `dataset` whose `column` (Utf8) is one of `values`, with the
/// columns `columns`, in row-address order (the order a scan returns them),
/// read through the BTree index `<column>_idx`. `None` when that index cannot
/// give the whole answer (see the module docs).
pub(crate) async fn indexed_rows(
    dataset: &Arc<Dataset>,
    column: &str,
    values: &[&str],
    columns: &[&str],
) -> Result<Option<RecordBatch>> {
    if dataset.manifest.uses_stable_row_ids() {
        return Ok(None);
    }
    let name = format!("{column}_idx");
    let Some(field) = dataset.schema().field(column) else {
        return Ok(None);
    };
    let segments = dataset
        .load_indices_by_name(&name)
        .await
        .ctx("listing the index's segments")?;
    if segments.is_empty() {
        return Ok(None);
    }
    let mut covered = RoaringBitmap::new();
    for segment in &segments {
        // Only the engine's own kind: another index under the name (one
        // made outside the engine) may answer the query differently or not
        // at all; the planner knows how to use it.
        let btree = segment
            .index_details
            .as_ref()
            .is_some_and(|d| d.type_url.ends_with("BTreeIndexDetails"));
        if segment.fields != [field.id] || !btree {
            return Ok(None);
        }
        match &segment.fragment_bitmap {
            Some(bitmap) => covered |= bitmap,
            None => return Ok(None),
        }
    }
    // (A table without fragments is left to the scanner: Lance opens only
    // segments that cover some fragment, and there is none to open.)
    let fragments = dataset.fragments();
    if fragments.is_empty()
        || fragments
            .iter()
            .any(|f| !covered.contains(f.id as u32) || !f.overlays.is_empty())
    {
        return Ok(None);
    }
    // A column the version lacks (dropped outside the engine since the
    // handle opened) is left to the planner, which reports it.
    let Ok(projection) = dataset.schema().project_preserve_system_columns(columns) else {
        return Ok(None);
    };
    let query = SargableQuery::IsIn(
        values
            .iter()
            .map(|v| ScalarValue::Utf8(Some(v.to_string())))
            .collect(),
    );
    let index =
        ScalarIndexLoader::load_index(dataset.as_ref(), column, &name, &NoOpMetricsCollector)
            .await
            .ctx("opening the index")?;
    let found = index
        .search(&query, &NoOpMetricsCollector)
        .await
        .ctx("searching the index")?;
    let SearchResult::Exact(found) = found else {
        return Ok(None);
    };
    let mut rows = found.true_rows();
    rows.retain_fragments(fragments.iter().map(|f| f.id as u32));
    let Some(addresses) = rows.row_addrs() else {
        return Ok(None);
    };
    // Rows a merge rewrote or deleted are still in the index: the take
    // leaves out what the fragments' deletion files delete.
    let addresses: Vec<u64> = addresses.map(u64::from).collect();
    let rows = dataset
        .take_rows(&addresses, ProjectionRequest::from_schema(projection))
        .await
        .ctx("reading rows by address")?;
    Ok(Some(rows))
}
