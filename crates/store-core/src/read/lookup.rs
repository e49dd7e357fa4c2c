//! Point lookups by key: the base table through its key index, each
//! unmerged generation by key — never a full scan.
//!
//! With nothing unmerged (every shard's generations merged: the steady state
//! after a merge) the base table is the whole answer, and the lookup is
//! planned as a plain indexed scan of it. Lance's LSM point-lookup planner
//! gives the same rows but builds a new DataFusion session for each lookup
//! (registering every built-in function) and wraps the base scan in its
//! newest-first coalescing: about a tenth of a `get`'s CPU at 1M rows.

use std::sync::Arc;

use datafusion::physical_plan::ExecutionPlan;
use lance::deps::datafusion;

use super::{ReadView, key_filter, lookup_shaped};
use crate::conform::Schemas;
use crate::error::{Error, LanceResultExt, Result};

/// Plan a point lookup of `ids`.
pub(crate) async fn plan_lookup(
    view: &ReadView,
    schemas: &Schemas,
    ids: &[&str],
    projection: Option<&[String]>,
) -> Result<Arc<dyn ExecutionPlan>> {
    let read_cols: Vec<String> = match projection {
        Some(cols) => {
            let mut cols: Vec<String> = cols
                .iter()
                .filter(|c| schemas.stored.field_with_name(c).is_ok())
                .cloned()
                .collect();
            if !cols.contains(&schemas.key) {
                cols.push(schemas.key.clone());
            }
            cols
        }
        None => schemas.readable_columns(),
    };
    if view.nothing_unmerged() {
        let mut scan = view.dataset.scan();
        // Every column is Lance's default projection; naming them costs a
        // parse of each name on every lookup.
        let every_column = read_cols.len() == view.dataset.schema().fields.len()
            && view
                .dataset
                .schema()
                .fields
                .iter()
                .all(|f| read_cols.contains(&f.name));
        if !every_column {
            scan.project(&read_cols)
                .map_err(|e| Error::from_lance("projecting", None, e))?;
        }
        scan.filter_expr(key_filter(&schemas.key, ids));
        return scan.create_plan().await.ctx("planning the point lookup");
    }
    view.scanner(&schemas.key)
        .project(&read_cols)
        .map_err(|e| Error::from_lance("projecting", None, e))?
        .filter_expr(lookup_shaped(key_filter(&schemas.key, ids), &schemas.key))
        .create_plan()
        .await
        .ctx("planning the point lookup")
}
