//! Vector search over a declared vector column, composed over the base
//! table's index and an exact ranking of the unmerged tier.

use std::sync::Arc;

use arrow_array::{Array, FixedSizeListArray, Float32Array, RecordBatch, StringArray};
use arrow_select::concat::concat_batches;
use datafusion::logical_expr::Expr;
use futures::TryStreamExt;
use lance::dataset::mem_wal::scanner::DISTANCE_COLUMN;
use lance::dataset::mem_wal::{LsmScanner, ShardSnapshot, arrow_schema_with_field_ids};
use lance::deps::datafusion;
use lance_linalg::distance::DistanceType;

use super::{ReadView, combined_filter};
use crate::config::{Metric, VectorColumn};
use crate::conform::Schemas;
use crate::error::{Error, LanceResultExt, Result};

/// Candidates re-ranked by exact distance per row asked, unless a query says
/// otherwise: see docs/search.md for the recall it buys.
pub const DEFAULT_REFINE_FACTOR: u32 = 10;

/// The distance column of a vector search.
pub(crate) const DISTANCE: &str = DISTANCE_COLUMN;

/// A nearest-neighbour query over a declared vector column.
#[derive(Debug, Clone, PartialEq)]
pub struct VectorQuery {
    /// The vector column.
    pub column: String,
    /// The query vector (its length must be the column's dimension).
    pub vector: Vec<f32>,
    /// How many rows to return.
    pub k: usize,
    /// SQL predicate applied before ranking.
    pub filter: Option<String>,
    /// IVF partitions searched in the base table's index (default: Lance's).
    /// More partitions: better recall, slower.
    pub nprobes: Option<usize>,
    /// Re-rank `refine_factor × k` candidates by exact distance (default
    /// [`DEFAULT_REFINE_FACTOR`]: product quantisation alone ranks too
    /// coarsely for a good recall; `Some(0)` turns re-ranking off).
    pub refine_factor: Option<u32>,
}

impl VectorQuery {
    /// The `k` nearest rows to `vector` in `column`.
    pub fn new(column: impl Into<String>, vector: Vec<f32>, k: usize) -> Self {
        Self {
            column: column.into(),
            vector,
            k,
            filter: None,
            nprobes: None,
            refine_factor: None,
        }
    }
}

/// Nearest neighbours of `query` in a declared vector column.
///
/// Lance's LSM vector planner searches generations only through their own
/// in-memory vector index, which generations flushed before the base table had
/// one do not carry. So the search is composed here:
/// - the fresh tier (every unmerged generation, newest version per key,
///   `filter` applied) is ranked exactly, by brute force — merges keep it small;
/// - the base table is searched with Lance's scanner (its vector index when
///   built, with `nprobes` / `refine_factor`), and rows whose key was rewritten
///   or deleted in the fresh tier are dropped (fetching more until `k` remain);
/// - both are merged by distance (ties by key). Distances are Lance's own
///   functions for the metric, so the two sides compare.
pub(crate) async fn nearest(
    view: &ReadView,
    schemas: &Schemas,
    declared: &VectorColumn,
    query: &VectorQuery,
    store_params: &lance::io::ObjectStoreParams,
    hide: Option<&Expr>,
) -> Result<RecordBatch> {
    let metric = match declared.metric {
        Metric::L2 => DistanceType::L2,
        Metric::Cosine => DistanceType::Cosine,
        Metric::Dot => DistanceType::Dot,
    };
    let out_schema = schemas
        .conform_for_read(&RecordBatch::new_empty(schemas.stored.clone()), None)?
        .schema();
    if query.k == 0 {
        return with_distance(RecordBatch::new_empty(out_schema), Vec::new());
    }
    let filter = combined_filter(schemas, query.filter.as_deref(), hide)?;
    let columns = schemas.readable_columns();

    // Fresh tier, exactly.
    let fresh_snapshots: Vec<ShardSnapshot> = view
        .shards
        .iter()
        .filter(|s| s.unmerged > 0)
        .map(|s| s.snapshot.clone())
        .collect();
    let search = VectorSearch {
        view,
        schemas,
        declared,
        query,
        store_params,
        metric,
        filter,
        columns,
        fresh_snapshots,
    };
    let mut ranked = search.fresh_ranked().await?;

    // Base table, through its index, without rows the fresh tier shadows.
    ranked.extend(search.base_ranked().await?);
    ranked.sort_by(|a, b| a.0.total_cmp(&b.0).then_with(|| a.1.cmp(&b.1)));
    ranked.truncate(query.k);
    let distances: Vec<f32> = ranked.iter().map(|r| r.0).collect();
    let rows: Vec<RecordBatch> = ranked.into_iter().map(|r| r.2).collect();
    with_distance(concat_batches(&out_schema, &rows)?, distances)
}

/// One vector search's inputs, shared by its reads of the two tiers.
struct VectorSearch<'a> {
    view: &'a ReadView,
    schemas: &'a Schemas,
    declared: &'a VectorColumn,
    query: &'a VectorQuery,
    store_params: &'a lance::io::ObjectStoreParams,
    metric: DistanceType,
    /// The caller's filter and the visibility rule.
    filter: Option<Expr>,
    /// The readable columns.
    columns: Vec<String>,
    /// The shards with unmerged rows.
    fresh_snapshots: Vec<ShardSnapshot>,
}

impl VectorSearch<'_> {
    /// A scanner of the unmerged tier alone.
    fn fresh_scanner(&self) -> LsmScanner {
        let (view, schemas) = (self.view, self.schemas);
        LsmScanner::without_base_table(
            schemas.stored.clone(),
            view.dataset.uri().to_string(),
            self.fresh_snapshots.clone(),
            vec![schemas.key.clone()],
        )
        .with_identity_schema(Arc::new(arrow_schema_with_field_ids(view.dataset.schema())))
        .with_store_params(self.store_params.clone())
        .with_session(view.dataset.session())
        .with_sstable_cache(view.generations.clone())
    }

    /// The fresh tier's `k` nearest rows (the filter's), ranked exactly.
    async fn fresh_ranked(&self) -> Result<Vec<(f32, String, RecordBatch)>> {
        let (schemas, declared, query) = (self.schemas, self.declared, self.query);
        let mut ranked: Vec<(f32, String, RecordBatch)> = Vec::new();
        if !self.fresh_snapshots.is_empty() {
            let mut scanner = self
                .fresh_scanner()
                .project(&self.columns)
                .map_err(|e| Error::from_lance("projecting", None, e))?;
            if let Some(expr) = &self.filter {
                scanner = scanner.filter_expr(expr.clone());
            }
            let mut stream = scanner.try_into_stream().await.ctx("reading generations")?;
            while let Some(batch) = stream
                .try_next()
                .await
                .map_err(|e| Error::from_datafusion("reading generations", e))?
            {
                let batch = schemas.conform_for_read(&batch, None)?;
                rank_rows(
                    &batch,
                    &schemas.key,
                    &declared.column,
                    &query.vector,
                    self.metric,
                    &mut ranked,
                )?;
                ranked.sort_by(|a, b| a.0.total_cmp(&b.0).then_with(|| a.1.cmp(&b.1)));
                ranked.truncate(query.k);
            }
        }
        Ok(ranked)
    }

    /// The base table's nearest rows the fresh tier does not shadow, fetching
    /// more until `k` remain (or the table is exhausted).
    async fn base_ranked(&self) -> Result<Vec<(f32, String, RecordBatch)>> {
        let (view, schemas, declared, query) = (self.view, self.schemas, self.declared, self.query);
        let mut ranked = Vec::new();
        let base_rows = view.dataset.count_rows(None).await.ctx("counting rows")?;
        let mut fetch = query.k;
        while base_rows > 0 && fetch > 0 {
            let (found, returned) = self.base_candidates(fetch).await?;
            let live = found.num_rows();
            let conformed = schemas.conform_for_read(&found, None)?;
            let mut base_ranked = Vec::new();
            rank_rows(
                &conformed,
                &schemas.key,
                &declared.column,
                &query.vector,
                self.metric,
                &mut base_ranked,
            )?;
            if live >= query.k || returned < fetch || fetch >= base_rows {
                ranked.extend(base_ranked);
                fetch = 0;
            } else {
                fetch = (fetch * 2).min(base_rows);
            }
        }
        Ok(ranked)
    }

    /// The base table's `fetch` nearest rows by its index, less those the
    /// fresh tier shadows, and how many the search returned.
    async fn base_candidates(&self, fetch: usize) -> Result<(RecordBatch, usize)> {
        let (view, schemas, declared, query) = (self.view, self.schemas, self.declared, self.query);
        let mut scan = view.dataset.scan();
        scan.project(&self.columns).ctx("projecting")?;
        if let Some(expr) = &self.filter {
            scan.filter_expr(expr.clone());
            scan.prefilter(true);
        }
        let key = Float32Array::from(query.vector.clone());
        scan.nearest(&declared.column, &key, fetch)
            .map_err(|e| Error::invalid_argument(format!("vector search: {e}")))?;
        scan.distance_metric(self.metric);
        if let Some(n) = query.nprobes {
            scan.nprobes(n);
        }
        match query.refine_factor.unwrap_or(DEFAULT_REFINE_FACTOR) {
            0 => {}
            r => {
                scan.refine(r);
            }
        }
        let found = scan
            .try_into_batch()
            .await
            .ctx("searching the base table")?;
        let returned = found.num_rows();
        let found = if self.fresh_snapshots.is_empty() || returned == 0 {
            found
        } else {
            let keys = found.project(&[found.schema().index_of(&schemas.key)?])?;
            let shadowed = self
                .fresh_scanner()
                .contains_pks(&keys)
                .await
                .ctx("checking keys rewritten since the base")?;
            let keep =
                arrow_array::BooleanArray::from(shadowed.iter().map(|s| !s).collect::<Vec<bool>>());
            arrow_select::filter::filter_record_batch(&found, &keep)?
        };
        Ok((found, returned))
    }
}

/// Score every row of `batch` (logical schema) and append `(distance, key, row)`.
fn rank_rows(
    batch: &RecordBatch,
    key: &str,
    column: &str,
    query: &[f32],
    metric: DistanceType,
    out: &mut Vec<(f32, String, RecordBatch)>,
) -> Result<()> {
    let keys = batch
        .column_by_name(key)
        .and_then(|c| c.as_any().downcast_ref::<StringArray>())
        .ok_or_else(|| Error::internal("vector search lost the key column"))?;
    let vectors = batch
        .column_by_name(column)
        .and_then(|c| c.as_any().downcast_ref::<FixedSizeListArray>())
        .ok_or_else(|| {
            Error::invalid_argument(format!("'{column}' is not a FixedSizeList<Float32> column"))
        })?;
    let values = vectors
        .values()
        .as_any()
        .downcast_ref::<Float32Array>()
        .ok_or_else(|| Error::invalid_argument(format!("'{column}' is not Float32")))?;
    let dim = vectors.value_length() as usize;
    let distance = metric.func::<f32>();
    for row in 0..batch.num_rows() {
        if vectors.is_null(row) {
            continue;
        }
        let start = (vectors.offset() + row) * dim;
        let v = &values.values()[start..start + dim];
        out.push((
            distance(query, v),
            keys.value(row).to_string(),
            batch.slice(row, 1),
        ));
    }
    Ok(())
}

fn with_distance(batch: RecordBatch, distances: Vec<f32>) -> Result<RecordBatch> {
    with_column(batch, DISTANCE_COLUMN, distances)
}

/// `batch` with a non-null Float32 column `name` of `values` appended.
pub(crate) fn with_column(batch: RecordBatch, name: &str, values: Vec<f32>) -> Result<RecordBatch> {
    let mut fields: Vec<arrow_schema::FieldRef> = batch.schema().fields().iter().cloned().collect();
    fields.push(Arc::new(arrow_schema::Field::new(
        name,
        arrow_schema::DataType::Float32,
        false,
    )));
    let mut columns = batch.columns().to_vec();
    columns.push(Arc::new(Float32Array::from(values)));
    Ok(RecordBatch::try_new(
        Arc::new(arrow_schema::Schema::new_with_metadata(
            fields,
            batch.schema().metadata().clone(),
        )),
        columns,
    )?)
}
