//! The read path: one view of base table + every shard's unmerged generations.
//!
//! Lance's `LsmScanner` does not discover shards and does not read the
//! "compacted up to" markers, so [`shard_snapshots`] does both: it lists the
//! shards, reads each shard's latest manifest, and keeps only generations above
//! the marker recorded in the base table's MemWAL index. The base version and the
//! markers come from the same dataset snapshot, read *before* the shard
//! manifests, so a merge committing in between can only make a generation appear
//! in both places, where newest-wins dedupe folds it — never in neither.

use std::collections::HashMap;
use std::sync::Arc;

use arrow_array::{Array, FixedSizeListArray, Float32Array, RecordBatch, StringArray};
use arrow_select::concat::concat_batches;
use datafusion::arrow::compute::SortOptions;
use datafusion::common::Column;
use datafusion::logical_expr::{Expr, lit};
use datafusion::physical_expr::expressions::col as physical_col;
use datafusion::physical_expr::{LexOrdering, PhysicalSortExpr};
use datafusion::physical_plan::coalesce_partitions::CoalescePartitionsExec;
use datafusion::physical_plan::limit::GlobalLimitExec;
use datafusion::physical_plan::sorts::sort::SortExec;
use datafusion::physical_plan::{ExecutionPlan, ExecutionPlanProperties};
use datafusion::prelude::SessionContext;
use futures::{StreamExt, TryStreamExt};
use lance::Dataset;
use lance::dataset::mem_wal::scanner::{DISTANCE_COLUMN, SsTableCache, parse_filter_expr};
use lance::dataset::mem_wal::{
    DatasetMemWalExt, LsmScanner, ShardManifestStore, ShardSnapshot, TOMBSTONE,
    arrow_schema_with_field_ids,
};
use lance::deps::datafusion;
use lance_linalg::distance::DistanceType;
use uuid::Uuid;

use crate::config::{Metric, VectorColumn};
use crate::conform::Schemas;
use crate::error::{Error, LanceResultExt, Result};

/// One shard's state as a reader sees it.
#[derive(Debug, Clone)]
pub(crate) struct ShardView {
    pub snapshot: ShardSnapshot,
    /// Generations flushed but not merged into the base table.
    pub unmerged: usize,
    /// Those generations: (generation, directory), oldest first.
    pub sstables: Vec<(u64, String)>,
    /// Their rows and bytes as the writer measured them (0 where unmeasured).
    pub unmerged_rows: u64,
    pub unmerged_bytes: u64,
    /// The manifest no longer lists the generation right after the base's
    /// marker: cleanup removed generations this base snapshot does not hold
    /// yet (the base moved on while this reader paused), or the numbering
    /// skips. The engine re-reads the base when the base has moved.
    pub gap: bool,
}

/// The snapshots of every shard, with merged generations left out.
pub(crate) async fn shard_snapshots(dataset: &Dataset) -> Result<Vec<ShardView>> {
    let Some(details) = dataset
        .mem_wal_index_details()
        .await
        .ctx("reading the MemWAL index")?
    else {
        // Plain Lance dataset (opened read-only): the base table is everything.
        return Ok(Vec::new());
    };
    let compacted: HashMap<Uuid, u64> = details
        .compacted_sstables
        .iter()
        .map(|c| (c.shard_id, c.generation))
        .collect();
    let shard_ids = dataset
        .list_mem_wal_latest_shard_ids()
        .await
        .ctx("listing MemWAL shards")?;
    if shard_ids.is_empty() {
        return Ok(Vec::new());
    }
    let store = dataset
        .object_store(None)
        .await
        .ctx("opening the object store")?;
    let base_path = dataset.branch_location().path;
    let reads = shard_ids.into_iter().map(|shard_id| {
        let store = store.clone();
        let base_path = base_path.clone();
        let merged_up_to = compacted.get(&shard_id).copied().unwrap_or(0);
        async move {
            let manifest = ShardManifestStore::new(store, &base_path, shard_id, 2)
                .latest()
                .await
                .ctx("reading a shard manifest")?;
            let Some(manifest) = manifest else {
                return Ok::<_, Error>(None);
            };
            let mut snapshot = ShardSnapshot::new(shard_id)
                .with_spec_id(manifest.shard_spec_id)
                .with_current_generation(manifest.current_generation);
            let pending: Vec<_> = manifest
                .sstables
                .iter()
                .filter(|s| s.generation > merged_up_to)
                .collect();
            let lowest = manifest
                .sstables
                .iter()
                .map(|s| s.generation)
                .min()
                .unwrap_or(manifest.current_generation);
            let gap = lowest > merged_up_to + 1;
            let unmerged_rows = pending.iter().filter_map(|s| s.physical_rows).sum();
            let unmerged_bytes = pending.iter().filter_map(|s| s.in_memory_bytes).sum();
            let mut sstables: Vec<(u64, String)> = pending
                .iter()
                .map(|s| (s.generation, s.path.clone()))
                .collect();
            sstables.sort();
            for (generation, path) in &sstables {
                snapshot = snapshot.with_sstable(*generation, path.clone());
            }
            Ok(Some(ShardView {
                snapshot,
                unmerged: sstables.len(),
                sstables,
                unmerged_rows,
                unmerged_bytes,
                gap,
            }))
        }
    });
    let views = futures::future::try_join_all(reads).await?;
    Ok(views.into_iter().flatten().collect())
}

/// Every live key's newest version, counted without reading the base table's
/// rows: its fragment metadata, plus the unmerged generations' keys that are
/// new, minus those whose newest version is a tombstone of a base row.
pub(crate) async fn count_all(
    view: &ReadView,
    key: &str,
    opener: &crate::dataset::Opener,
) -> Result<u64> {
    let base = view.dataset.count_rows(None).await.ctx("counting rows")? as u64;
    // Newest version per key in the unmerged tier: live or deleted.
    let mut newest: HashMap<String, bool> = HashMap::new();
    for shard in &view.shards {
        for (_, path) in shard.sstables.iter().rev() {
            let generation = opener
                .open_generation(&view.dataset, &shard.snapshot.shard_id, path)
                .await?;
            let has_tombstones = generation.schema().field(TOMBSTONE).is_some();
            let mut columns = vec![key];
            if has_tombstones {
                columns.push(TOMBSTONE);
            }
            let mut scan = generation.scan();
            scan.project(&columns).ctx("projecting the key")?;
            let mut stream = scan.try_into_stream().await.ctx("reading a generation")?;
            while let Some(batch) = stream.try_next().await.ctx("reading a generation")? {
                let keys = batch
                    .column_by_name(key)
                    .and_then(|c| c.as_any().downcast_ref::<StringArray>())
                    .ok_or_else(|| Error::internal("a generation lacks the key column"))?;
                let deleted = batch
                    .column_by_name(TOMBSTONE)
                    .and_then(|c| c.as_any().downcast_ref::<arrow_array::BooleanArray>());
                for row in 0..batch.num_rows() {
                    if keys.is_null(row) {
                        continue;
                    }
                    let live = !deleted.is_some_and(|d| d.is_valid(row) && d.value(row));
                    newest.entry(keys.value(row).to_string()).or_insert(live);
                }
            }
        }
    }
    if newest.is_empty() {
        return Ok(base);
    }
    // Which of those keys the base table holds (through its key index).
    let mut in_base: std::collections::HashSet<String> = std::collections::HashSet::new();
    let keys: Vec<&str> = newest.keys().map(String::as_str).collect();
    for chunk in keys.chunks(1000) {
        let mut scan = view.dataset.scan();
        scan.project(&[key])
            .ctx("projecting the key")?
            .filter_expr(key_filter(key, chunk));
        let mut stream = scan.try_into_stream().await.ctx("looking up keys")?;
        while let Some(batch) = stream.try_next().await.ctx("looking up keys")? {
            if let Some(col) = batch
                .column_by_name(key)
                .and_then(|c| c.as_any().downcast_ref::<StringArray>())
            {
                in_base.extend(col.iter().flatten().map(str::to_string));
            }
        }
    }
    let added = newest
        .iter()
        .filter(|(k, live)| **live && !in_base.contains(*k))
        .count() as u64;
    let removed = newest
        .iter()
        .filter(|(k, live)| !**live && in_base.contains(*k))
        .count() as u64;
    Ok((base + added).saturating_sub(removed))
}

/// A sort key for [`ScanRequest::order_by`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SortKey {
    /// Column to sort by.
    pub column: String,
    /// Descending instead of ascending.
    pub descending: bool,
    /// Nulls before non-nulls. Default: nulls last ascending, first descending.
    pub nulls_first: bool,
}

impl SortKey {
    /// Ascending, nulls last.
    pub fn asc(column: impl Into<String>) -> Self {
        Self {
            column: column.into(),
            descending: false,
            nulls_first: false,
        }
    }

    /// Descending, nulls first.
    pub fn desc(column: impl Into<String>) -> Self {
        Self {
            column: column.into(),
            descending: true,
            nulls_first: true,
        }
    }
}

/// What to read. Filter, projection, order and limit/offset are all executed
/// inside the scan plan, never by truncating a full result in memory.
#[derive(Debug, Clone, Default)]
pub struct ScanRequest {
    /// A SQL predicate over the store's columns, e.g. `rollout_id = 'r1' AND reward > 0`.
    pub filter: Option<String>,
    /// Columns to return, in this order; `None` = every column.
    pub projection: Option<Vec<String>>,
    /// Sort keys, most significant first. Empty = unspecified order.
    pub order_by: Vec<SortKey>,
    /// At most this many rows.
    pub limit: Option<usize>,
    /// Skip this many rows first.
    pub offset: Option<usize>,
    /// Which rows a store with record capabilities shows (default: only
    /// visible ones). No effect on stores without capabilities.
    pub visibility: Visibility,
}

/// Which rows a read shows, for stores with record capabilities: by default
/// tombstones, expired rows, retired / non-active rows and superseded rows are
/// hidden.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Visibility {
    /// Show tombstone rows.
    pub include_tombstones: bool,
    /// Show rows whose `expires_at` has passed.
    pub include_expired: bool,
    /// Show retired, non-active and superseded rows.
    pub include_retired: bool,
    /// "Now" for expiry, in microseconds since the epoch; `None` = the clock.
    pub now_micros: Option<i64>,
}

impl Visibility {
    /// Every row, tombstones included.
    pub fn all() -> Self {
        Self {
            include_tombstones: true,
            include_expired: true,
            include_retired: true,
            now_micros: None,
        }
    }
}

impl ScanRequest {
    /// Every row, every column.
    pub fn new() -> Self {
        Self::default()
    }

    /// Set the filter.
    pub fn filter(mut self, filter: impl Into<String>) -> Self {
        self.filter = Some(filter.into());
        self
    }

    /// Set the projection.
    pub fn project<S: Into<String>>(mut self, columns: impl IntoIterator<Item = S>) -> Self {
        self.projection = Some(columns.into_iter().map(Into::into).collect());
        self
    }

    /// Add a sort key.
    pub fn order_by(mut self, key: SortKey) -> Self {
        self.order_by.push(key);
        self
    }

    /// Set the limit.
    pub fn limit(mut self, limit: usize) -> Self {
        self.limit = Some(limit);
        self
    }

    /// Set the offset.
    pub fn offset(mut self, offset: usize) -> Self {
        self.offset = Some(offset);
        self
    }

    /// Set which rows a store with record capabilities shows.
    pub fn visibility(mut self, visibility: Visibility) -> Self {
        self.visibility = visibility;
        self
    }
}

/// A stream of result batches in the logical schema.
pub type BatchStream = futures::stream::BoxStream<'static, Result<RecordBatch>>;

/// A consistent view to read from.
pub(crate) struct ReadView {
    pub dataset: Arc<Dataset>,
    pub shards: Vec<ShardView>,
    /// Opened generation datasets, shared by every read of the store.
    pub generations: Arc<SsTableCache>,
}

impl ReadView {
    fn scanner(&self, key: &str) -> LsmScanner {
        LsmScanner::new(
            self.dataset.clone(),
            self.shards.iter().map(|s| s.snapshot.clone()).collect(),
            vec![key.to_string()],
        )
        .with_sstable_cache(self.generations.clone())
    }
}

/// A filter's column references, checked against the logical schema before
/// the filter is planned: an unknown column is an `InvalidArgument` naming it
/// (and listing the columns), not a planner message. Unquoted names match
/// case-insensitively, as the planner treats them. A filter that does not parse
/// is left to the planner's own error.
pub(crate) fn check_filter_columns(schema: &arrow_schema::Schema, filter: &str) -> Result<()> {
    use lance::deps::datafusion::sql::sqlparser::ast::{Expr as SqlExpr, Ident, visit_expressions};
    use lance::deps::datafusion::sql::sqlparser::dialect::GenericDialect;
    use lance::deps::datafusion::sql::sqlparser::parser::Parser;
    use std::ops::ControlFlow;

    let Ok(expr) = Parser::new(&GenericDialect {})
        .try_with_sql(filter)
        .and_then(|mut p| p.parse_expr())
    else {
        return Ok(());
    };
    let known = |id: &Ident| {
        schema.field_with_name(&id.value).is_ok()
            || (id.quote_style.is_none()
                && schema
                    .fields()
                    .iter()
                    .any(|f| f.name().eq_ignore_ascii_case(&id.value)))
    };
    let mut unknown = None;
    let _ = visit_expressions(&expr, |e| {
        let first = match e {
            SqlExpr::Identifier(id) => Some(id),
            SqlExpr::CompoundIdentifier(parts) => parts.first(),
            _ => None,
        };
        match first {
            Some(id) if !known(id) => {
                unknown = Some(id.value.clone());
                ControlFlow::Break(())
            }
            _ => ControlFlow::Continue(()),
        }
    });
    match unknown {
        None => Ok(()),
        Some(column) => Err(Error::invalid_argument(format!(
            "filter '{filter}': unknown column '{column}' (columns: {})",
            schema
                .fields()
                .iter()
                .map(|f| f.name().as_str())
                .collect::<Vec<_>>()
                .join(", ")
        ))),
    }
}

/// The caller's filter parsed on its own (checked against the schema), and
/// the engine's visibility expression `hide` joined to it as an expression —
/// never as text, so no filter string can reach past its own parentheses.
pub(crate) fn combined_filter(
    schemas: &Schemas,
    filter: Option<&str>,
    hide: Option<&Expr>,
) -> Result<Option<Expr>> {
    let user = match filter {
        Some(filter) => {
            check_filter_columns(&schemas.logical, filter)?;
            Some(
                parse_filter_expr(&schemas.stored, filter)
                    .map_err(|e| Error::invalid_argument(format!("filter '{filter}': {e}")))?,
            )
        }
        None => None,
    };
    Ok(match (user, hide) {
        (Some(user), Some(hide)) => Some(user.and(hide.clone())),
        (Some(user), None) => Some(user),
        (None, hide) => hide.cloned(),
    })
}

/// Check that `filter` is a plain predicate — columns, literals,
/// comparisons, `AND`/`OR`/`NOT`, `IN`, `BETWEEN`, `LIKE`, `IS [NOT] NULL` —
/// and nothing else: no function call, cast or subquery. Named queries
/// declared by a plugin are held to this (a plugin must not make the host
/// run arbitrary SQL, e.g. `repeat(id, 50000000)`); the error names what is
/// not allowed.
pub fn check_plain_predicate(filter: &str) -> std::result::Result<(), String> {
    use lance::deps::datafusion::sql::sqlparser::ast::{
        BinaryOperator, Expr as E, UnaryOperator, visit_expressions,
    };
    use lance::deps::datafusion::sql::sqlparser::dialect::GenericDialect;
    use lance::deps::datafusion::sql::sqlparser::parser::Parser;
    use std::ops::ControlFlow;

    let expr = Parser::new(&GenericDialect {})
        .try_with_sql(filter)
        .and_then(|mut p| {
            let e = p.parse_expr()?;
            p.expect_token(&lance::deps::datafusion::sql::sqlparser::tokenizer::Token::EOF)?;
            Ok(e)
        })
        .map_err(|e| format!("not a predicate: {e}"))?;
    let mut refused = None;
    let _ = visit_expressions(&expr, |e| {
        let allowed = match e {
            E::Identifier(_)
            | E::CompoundIdentifier(_)
            | E::Value(_)
            | E::TypedString { .. }
            | E::Nested(_)
            | E::IsNull(_)
            | E::IsNotNull(_)
            | E::IsTrue(_)
            | E::IsFalse(_)
            | E::InList { .. }
            | E::Between { .. }
            | E::Like { .. }
            | E::ILike { .. } => true,
            E::UnaryOp { op, .. } => {
                matches!(
                    op,
                    UnaryOperator::Not | UnaryOperator::Minus | UnaryOperator::Plus
                )
            }
            E::BinaryOp { op, .. } => matches!(
                op,
                BinaryOperator::Eq
                    | BinaryOperator::NotEq
                    | BinaryOperator::Lt
                    | BinaryOperator::LtEq
                    | BinaryOperator::Gt
                    | BinaryOperator::GtEq
                    | BinaryOperator::And
                    | BinaryOperator::Or
            ),
            _ => false,
        };
        if allowed {
            ControlFlow::Continue(())
        } else {
            refused = Some(e.to_string());
            ControlFlow::Break(())
        }
    });
    match refused {
        None => Ok(()),
        Some(what) => Err(format!(
            "`{what}` is not allowed in a named query's filter (columns, literals, comparisons, \
             AND/OR/NOT, IN, BETWEEN, LIKE and IS NULL only)"
        )),
    }
}

/// Validate a request against the schemas and plan it; `hide` is the
/// engine's visibility rule, joined to the caller's filter.
pub(crate) async fn plan_scan(
    view: &ReadView,
    schemas: &Schemas,
    request: &ScanRequest,
    hide: Option<&Expr>,
) -> Result<(Arc<dyn ExecutionPlan>, Option<Vec<String>>)> {
    // Columns the caller wants, checked against the logical schema.
    let wanted: Vec<String> = match &request.projection {
        Some(cols) => {
            if cols.is_empty() {
                return Err(Error::invalid_argument("projection names no column"));
            }
            for c in cols {
                if schemas.logical.field_with_name(c).is_err() {
                    return Err(Error::invalid_argument(format!(
                        "projection: unknown column '{c}'"
                    )));
                }
            }
            cols.clone()
        }
        None => schemas
            .logical
            .fields()
            .iter()
            .map(|f| f.name().clone())
            .collect(),
    };
    for key in &request.order_by {
        if schemas.logical.field_with_name(&key.column).is_err() {
            return Err(Error::invalid_argument(format!(
                "order_by: unknown column '{}'",
                key.column
            )));
        }
    }
    // What the scan reads: wanted ∪ sort columns, restricted to stored columns.
    let mut read_cols: Vec<String> = wanted
        .iter()
        .filter(|c| schemas.stored.field_with_name(c).is_ok())
        .cloned()
        .collect();
    for key in &request.order_by {
        if schemas.stored.field_with_name(&key.column).is_ok() && !read_cols.contains(&key.column) {
            read_cols.push(key.column.clone());
        }
    }
    if read_cols.is_empty() {
        // Only columns the dataset lacks were asked for: read the key so row
        // counts are right; those columns come back null.
        read_cols.push(schemas.key.clone());
    }

    let mut scanner = view
        .scanner(&schemas.key)
        .project(&read_cols)
        .map_err(|e| Error::from_lance("projecting", None, e))?;
    if let Some(expr) = combined_filter(schemas, request.filter.as_deref(), hide)? {
        scanner = scanner.filter_expr(expr);
    }
    let to_i64 = |v: usize, what: &str| {
        i64::try_from(v).map_err(|_| Error::invalid_argument(format!("{what} is too large")))
    };

    // Sort keys on columns the dataset lacks are all-null: they do not order.
    let sort_keys: Vec<&SortKey> = request
        .order_by
        .iter()
        .filter(|k| schemas.stored.field_with_name(&k.column).is_ok())
        .collect();
    if sort_keys.is_empty() {
        let limit = request.limit.map(|l| to_i64(l, "limit")).transpose()?;
        let offset = request.offset.map(|o| to_i64(o, "offset")).transpose()?;
        if limit.is_some() || offset.is_some() {
            scanner = scanner
                .limit(limit, offset)
                .map_err(|e| Error::invalid_argument(format!("limit/offset: {e}")))?;
        }
        let plan = scanner.create_plan().await.ctx("planning the scan")?;
        return Ok((plan, Some(wanted)));
    }

    // Order-by: a top-k sort (bounded by offset + limit) over the deduped scan,
    // then skip/fetch.
    let mut plan = scanner.create_plan().await.ctx("planning the scan")?;
    if plan.output_partitioning().partition_count() > 1 {
        plan = Arc::new(CoalescePartitionsExec::new(plan));
    }
    let schema = plan.schema();
    let exprs = sort_keys
        .iter()
        .map(|k| {
            Ok(PhysicalSortExpr::new(
                physical_col(&k.column, &schema)
                    .map_err(|e| Error::internal(format!("sort column: {e}")))?,
                SortOptions {
                    descending: k.descending,
                    nulls_first: k.nulls_first,
                },
            ))
        })
        .collect::<Result<Vec<_>>>()?;
    let ordering = LexOrdering::new(exprs).ok_or_else(|| Error::internal("empty sort ordering"))?;
    let offset = request.offset.unwrap_or(0);
    let fetch = request.limit.map(|l| l.saturating_add(offset));
    let mut plan: Arc<dyn ExecutionPlan> =
        Arc::new(SortExec::new(ordering, plan).with_fetch(fetch));
    if offset > 0 || request.limit.is_some() {
        plan = Arc::new(GlobalLimitExec::new(plan, offset, request.limit));
    }
    Ok((plan, Some(wanted)))
}

/// Execute a plan, conforming every batch to the logical schema.
pub(crate) fn execute(
    plan: Arc<dyn ExecutionPlan>,
    schemas: Schemas,
    projection: Option<Vec<String>>,
) -> Result<BatchStream> {
    let ctx = SessionContext::new();
    let stream = plan
        .execute(0, ctx.task_ctx())
        .map_err(|e| Error::internal(format!("executing the scan: {e}")))?;
    Ok(stream
        .map_err(|e| Error::internal(format!("reading the scan: {e}")))
        .and_then(move |batch| {
            let out = schemas.conform_for_read(&batch, projection.as_deref());
            futures::future::ready(out)
        })
        .boxed())
}

/// Collect a stream into one batch of `schema`'s shape.
pub(crate) async fn collect(stream: BatchStream) -> Result<Vec<RecordBatch>> {
    stream.try_collect().await
}

/// `key = id` or `key IN (ids)` as an expression the LSM scanner routes to its
/// point-lookup planner (base-table key index + per-generation lookups).
pub(crate) fn key_filter(key: &str, ids: &[&str]) -> Expr {
    let column = Expr::Column(Column::new_unqualified(key));
    if ids.len() == 1 {
        column.eq(lit(ids[0]))
    } else {
        column.in_list(ids.iter().map(|id| lit(*id)).collect(), false)
    }
}

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
    view.scanner(&schemas.key)
        .project(&read_cols)
        .map_err(|e| Error::from_lance("projecting", None, e))?
        .filter_expr(key_filter(&schemas.key, ids))
        .create_plan()
        .await
        .ctx("planning the point lookup")
}

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
    /// Re-rank `refine_factor × k` candidates by exact distance.
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
    let fresh_scanner = || {
        LsmScanner::without_base_table(
            schemas.stored.clone(),
            view.dataset.uri().to_string(),
            fresh_snapshots.clone(),
            vec![schemas.key.clone()],
        )
        .with_identity_schema(Arc::new(arrow_schema_with_field_ids(view.dataset.schema())))
        .with_store_params(store_params.clone())
        .with_session(view.dataset.session())
        .with_sstable_cache(view.generations.clone())
    };
    let mut ranked: Vec<(f32, String, RecordBatch)> = Vec::new();
    if !fresh_snapshots.is_empty() {
        let mut scanner = fresh_scanner()
            .project(&columns)
            .map_err(|e| Error::from_lance("projecting", None, e))?;
        if let Some(expr) = &filter {
            scanner = scanner.filter_expr(expr.clone());
        }
        let mut stream = scanner.try_into_stream().await.ctx("reading generations")?;
        while let Some(batch) = stream
            .try_next()
            .await
            .map_err(|e| Error::internal(format!("reading generations: {e}")))?
        {
            let batch = schemas.conform_for_read(&batch, None)?;
            rank_rows(
                &batch,
                &schemas.key,
                &declared.column,
                &query.vector,
                metric,
                &mut ranked,
            )?;
            ranked.sort_by(|a, b| a.0.total_cmp(&b.0).then_with(|| a.1.cmp(&b.1)));
            ranked.truncate(query.k);
        }
    }

    // Base table, through its index, without rows the fresh tier shadows.
    let base_rows = view.dataset.count_rows(None).await.ctx("counting rows")?;
    let mut fetch = query.k;
    while base_rows > 0 && fetch > 0 {
        let mut scan = view.dataset.scan();
        scan.project(&columns).ctx("projecting")?;
        if let Some(expr) = &filter {
            scan.filter_expr(expr.clone());
            scan.prefilter(true);
        }
        let key = Float32Array::from(query.vector.clone());
        scan.nearest(&declared.column, &key, fetch)
            .map_err(|e| Error::invalid_argument(format!("vector search: {e}")))?;
        scan.distance_metric(metric);
        if let Some(n) = query.nprobes {
            scan.nprobes(n);
        }
        if let Some(r) = query.refine_factor {
            scan.refine(r);
        }
        let found = scan
            .try_into_batch()
            .await
            .ctx("searching the base table")?;
        let returned = found.num_rows();
        let found = if fresh_snapshots.is_empty() || returned == 0 {
            found
        } else {
            let keys = found.project(&[found.schema().index_of(&schemas.key)?])?;
            let shadowed = fresh_scanner()
                .contains_pks(&keys)
                .await
                .ctx("checking keys rewritten since the base")?;
            let keep =
                arrow_array::BooleanArray::from(shadowed.iter().map(|s| !s).collect::<Vec<bool>>());
            arrow_select::filter::filter_record_batch(&found, &keep)?
        };
        let live = found.num_rows();
        let conformed = schemas.conform_for_read(&found, None)?;
        let mut base_ranked = Vec::new();
        rank_rows(
            &conformed,
            &schemas.key,
            &declared.column,
            &query.vector,
            metric,
            &mut base_ranked,
        )?;
        if live >= query.k || returned < fetch || fetch >= base_rows {
            ranked.extend(base_ranked);
            fetch = 0;
        } else {
            fetch = (fetch * 2).min(base_rows);
        }
    }
    ranked.sort_by(|a, b| a.0.total_cmp(&b.0).then_with(|| a.1.cmp(&b.1)));
    ranked.truncate(query.k);
    let distances: Vec<f32> = ranked.iter().map(|r| r.0).collect();
    let rows: Vec<RecordBatch> = ranked.into_iter().map(|r| r.2).collect();
    with_distance(concat_batches(&out_schema, &rows)?, distances)
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
    let mut fields: Vec<arrow_schema::FieldRef> = batch.schema().fields().iter().cloned().collect();
    fields.push(Arc::new(arrow_schema::Field::new(
        DISTANCE_COLUMN,
        arrow_schema::DataType::Float32,
        false,
    )));
    let mut columns = batch.columns().to_vec();
    columns.push(Arc::new(Float32Array::from(distances)));
    Ok(RecordBatch::try_new(
        Arc::new(arrow_schema::Schema::new_with_metadata(
            fields,
            batch.schema().metadata().clone(),
        )),
        columns,
    )?)
}
