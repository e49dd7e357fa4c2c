//! Scans: a request (filter, projection, order, limit, visibility) planned
//! over the base table and every unmerged generation.

use std::sync::Arc;

use datafusion::arrow::compute::SortOptions;
use datafusion::logical_expr::Expr;
use datafusion::physical_expr::expressions::col as physical_col;
use datafusion::physical_expr::{LexOrdering, PhysicalSortExpr};
use datafusion::physical_plan::coalesce_partitions::CoalescePartitionsExec;
use datafusion::physical_plan::filter::FilterExec;
use datafusion::physical_plan::limit::GlobalLimitExec;
use datafusion::physical_plan::sorts::sort::SortExec;
use datafusion::physical_plan::{ExecutionPlan, ExecutionPlanProperties};
use lance::deps::datafusion;

use super::ReadView;
use crate::conform::Schemas;
use crate::error::{Error, Result};

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
                super::parse_filter(&schemas.stored, filter)
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
pub fn check_plain_predicate(filter: &str) -> Result<()> {
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
        .map_err(|e| Error::invalid_argument(format!("not a predicate: {e}")))?;
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
        Some(what) => Err(Error::invalid_argument(format!(
            "`{what}` is not allowed in this filter (columns, literals, comparisons, \
             AND/OR/NOT, IN, BETWEEN, LIKE and IS NULL only)"
        ))),
    }
}

/// Validate a request against the schemas and plan it; `hide` is the
/// engine's visibility rule, joined to the caller's filter.
/// A scan that could not be planned: when the same scan without the
/// caller's filter plans, the filter is at fault (a type mismatch such as
/// `id > 5` on a string column, a placeholder): invalid input naming it.
/// Otherwise the failure is the storage's — as is any read failure: Lance
/// plans a filter on the key by looking the keys up, so planning reads data.
async fn blame(
    view: &ReadView,
    schemas: &Schemas,
    read_cols: &[String],
    request: &ScanRequest,
    e: lance::Error,
) -> Error {
    let read_failed = e.is_not_found()
        || matches!(
            e.find_root(),
            lance::Error::IO { .. }
                | lance::Error::NotFound { .. }
                | lance::Error::CorruptFile { .. }
                | lance::Error::Timeout { .. }
        );
    if read_failed {
        return Error::from_lance("planning the scan", None, e);
    }
    if let Some(filter) = request.filter.as_deref() {
        let without = match view.scanner(&schemas.key).project(read_cols) {
            Ok(scanner) => scanner.create_plan().await.is_ok(),
            Err(_) => false,
        };
        if without {
            return Error::invalid_argument(format!("filter '{filter}': {e}"));
        }
    }
    Error::from_lance("planning the scan", None, e)
}

/// `plan`'s rows that `predicate` (an engine expression) keeps.
fn filtered(plan: Arc<dyn ExecutionPlan>, predicate: &Expr) -> Result<Arc<dyn ExecutionPlan>> {
    let schema = datafusion::common::DFSchema::try_from(plan.schema().as_ref().clone())
        .map_err(|e| Error::internal(format!("the scan's schema: {e}")))?;
    let planning = |e| Error::internal(format!("planning the visibility rule: {e}"));
    let predicate = super::session()
        .create_physical_expr(predicate.clone(), &schema)
        .map_err(planning)?;
    Ok(Arc::new(
        FilterExec::try_new(predicate, plan).map_err(planning)?,
    ))
}

/// Plan `request`, with `matching` (an engine-built predicate) joined to the
/// caller's filter, and `hide` (the visibility rule) applied to what both
/// select.
pub(crate) async fn plan_scan(
    view: &ReadView,
    schemas: &Schemas,
    request: &ScanRequest,
    matching: Option<&Expr>,
    hide: Option<&Expr>,
) -> Result<(Arc<dyn ExecutionPlan>, Option<Vec<String>>)> {
    let wanted = wanted_columns(schemas, request)?;
    let mut read_cols = read_columns(schemas, request, &wanted);

    // The filter the scan pushes down: the caller's and the engine's own.
    // With one, the visibility rule is applied above the scan, to the rows
    // it selects: the scan reads only the filter's columns for every row,
    // not the rule's too. The rows are the same — the LSM scan filters the
    // newest version of each key, so a conjunction can be split.
    let pushed = match (
        combined_filter(schemas, request.filter.as_deref(), None)?,
        matching,
    ) {
        (Some(user), Some(m)) => Some(user.and(m.clone())),
        (user, m) => user.or_else(|| m.cloned()),
    };
    let (pushed, above) = match (pushed, hide) {
        (Some(pushed), Some(hide)) => (Some(pushed), Some(hide)),
        (None, hide) => (hide.cloned(), None),
        (pushed, None) => (pushed, None),
    };
    if let Some(above) = above {
        let mut named: Vec<String> = above
            .column_refs()
            .into_iter()
            .map(|c| c.name.clone())
            .collect();
        named.sort();
        for name in named {
            if !read_cols.contains(&name) {
                read_cols.push(name);
            }
        }
    }
    // Bounded well inside i64: Lance adds limit and offset.
    let to_i64 = |v: usize, what: &str| {
        i64::try_from(v)
            .ok()
            .filter(|v| *v <= 1 << 53)
            .ok_or_else(|| Error::invalid_argument(format!("{what} {v} is too large")))
    };
    // Sort keys on columns the dataset lacks are all-null: they do not order.
    let sort_keys: Vec<&SortKey> = request
        .order_by
        .iter()
        .filter(|k| schemas.stored.field_with_name(&k.column).is_ok())
        .collect();
    // Pushed into the scan only without an order (a sort takes them).
    let (limit, offset) = match sort_keys.is_empty() {
        true => (
            request.limit.map(|l| to_i64(l, "limit")).transpose()?,
            request.offset.map(|o| to_i64(o, "offset")).transpose()?,
        ),
        false => (None, None),
    };

    let scan = ScanShape {
        view,
        schemas,
        request,
        read_cols: &read_cols,
    };
    let (mut plan, ruled_above) = scan.plan(pushed, above, limit, offset).await?;
    if sort_keys.is_empty() {
        if ruled_above {
            if plan.output_partitioning().partition_count() > 1 {
                plan = Arc::new(CoalescePartitionsExec::new(plan));
            }
            if request.limit.is_some() || request.offset.is_some() {
                plan = Arc::new(GlobalLimitExec::new(
                    plan,
                    request.offset.unwrap_or(0),
                    request.limit,
                ));
            }
        }
        return Ok((plan, Some(wanted)));
    }
    Ok((sorted(plan, &sort_keys, request)?, Some(wanted)))
}

/// The columns the caller wants, in order, checked against the logical
/// schema; the sort keys are checked too.
fn wanted_columns(schemas: &Schemas, request: &ScanRequest) -> Result<Vec<String>> {
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
    Ok(wanted)
}

/// The columns the scan reads for `wanted`: never empty.
fn read_columns(schemas: &Schemas, request: &ScanRequest, wanted: &[String]) -> Vec<String> {
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
    read_cols
}

/// What every attempt at planning one scan shares.
struct ScanShape<'a> {
    view: &'a ReadView,
    schemas: &'a Schemas,
    request: &'a ScanRequest,
    read_cols: &'a [String],
}

impl ScanShape<'_> {
    /// The scan with `pushed` pushed down and `above` (the visibility rule)
    /// over it, and whether the rule sits above the scan (else it was pushed
    /// in with the filter).
    async fn plan(
        &self,
        pushed: Option<Expr>,
        above: Option<&Expr>,
        limit: Option<i64>,
        offset: Option<i64>,
    ) -> Result<(Arc<dyn ExecutionPlan>, bool)> {
        let Self {
            view,
            schemas,
            request,
            read_cols,
        } = *self;
        // The rule above the scan, or — when it cannot be planned there (a
        // FilterExec asks its input for statistics, which a fragment without
        // row counts cannot give) — pushed into the scan with the filter.
        let mut split = above.is_some();
        let (plan, ruled_above) = loop {
            let (pushed, above) = match (split, pushed.clone(), above) {
                (true, pushed, above) => (pushed, above),
                (false, Some(pushed), Some(above)) => (Some(pushed.and(above.clone())), None),
                (false, pushed, _) => (pushed, None),
            };
            let mut scanner = view
                .scanner(&schemas.key)
                .project(read_cols)
                .map_err(|e| Error::from_lance("projecting", None, e))?;
            if let Some(expr) = pushed {
                scanner = scanner.filter_expr(super::lookup_shaped(expr, &schemas.key));
            }
            // Limit and offset count visible rows: with the rule applied above
            // the scan, they are applied above it too; with an order, above the
            // sort.
            if above.is_none() && (limit.is_some() || offset.is_some()) {
                scanner = scanner
                    .limit(limit, offset)
                    .map_err(|e| Error::invalid_argument(format!("limit/offset: {e}")))?;
            }
            let plan = match scanner.create_plan().await {
                Ok(plan) => plan,
                Err(e) => return Err(blame(view, schemas, read_cols, request, e).await),
            };
            let Some(above) = above else {
                break (plan, false);
            };
            match filtered(plan, above) {
                Ok(plan) => break (plan, true),
                Err(e) => {
                    tracing::debug!("the visibility rule is pushed into the scan: {e}");
                    split = false;
                }
            }
        };
        Ok((plan, ruled_above))
    }
}

/// `plan` in `sort_keys`' order, then the request's offset and limit.
fn sorted(
    mut plan: Arc<dyn ExecutionPlan>,
    sort_keys: &[&SortKey],
    request: &ScanRequest,
) -> Result<Arc<dyn ExecutionPlan>> {
    // Order-by: a top-k sort (bounded by offset + limit) over the deduped scan,
    // then skip/fetch.
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
    Ok(plan)
}
