//! Record semantics a schema opts into ([`RecordCapabilities`]), applied by
//! the engine for any schema that declares them — the old context store's
//! behaviour, made generic:
//!
//! - **Tombstones**: [`Store::tombstone`] / [`Store::tombstone_by_secondary_key`]
//!   find the rows a lookup by key would return (every non-deleted row, hidden
//!   ones — expired, retired, superseded — included) and append, for each, a
//!   row with the same key whose
//!   `content_type` is [`TOMBSTONE_CONTENT_TYPE`] (newest wins, so the record
//!   reads as gone); the tombstone keeps the row's non-nullable columns and its
//!   secondary key, gets `lifecycle_status` "active" (lifecycle) and
//!   `created_at` = now when those columns exist, and nulls elsewhere. Callers
//!   may not write the tombstone value. A key whose newest row is a tombstone
//!   is free to be added again.
//! - **Visibility** (scans and counts; lookups by key only hide tombstones): a
//!   row is shown unless it is a tombstone; or expired (`expires_at` ≤ now); or
//!   retired — `lifecycle_status` other than active/contradicted (null reads as
//!   active), or `retired_at` set; or superseded — `superseded_by_id` set.
//!   Every rule is a predicate on the row itself, so a read never scans the
//!   table to decide what it hides; the rules are joined to the caller's
//!   filter as an expression, never as text. Each rule is lifted by
//!   [`crate::Visibility`].
//! - **Supersession** is kept on both ends: whenever a row names a record in
//!   `supersedes_id` (an upsert, a patch, or a plain add), the same write
//!   rewrites that record with `superseded_by_id` = the new key. The named
//!   record must be current — present, not deleted, not superseded already —
//!   or the write is refused ([`BatchProblem::NotCurrent`]): two concurrent
//!   patches of one record cannot both succeed, and a record never forks into
//!   two visible versions. Deleting the current version leaves its
//!   predecessors hidden.
//! - **Unique keys** on add: a key or secondary key repeated within the batch,
//!   or held by a stored row that is not a tombstone (hidden rows included),
//!   is refused — the first offender in input order.
//! - **Upsert** by the secondary key ([`Store::upsert`]): every row needs one;
//!   among visible records 0 matches → inserted, 1 → the new row supersedes it
//!   (`supersedes_id` = its key), more → refused; a secondary key held only by
//!   hidden non-tombstone rows → "already exists". All or nothing, one write.
//! - **Patch as a new version** ([`Store::patch`]): the visible target (by key
//!   or secondary key) is copied under a new key with `supersedes_id` = the old
//!   key, `superseded_by_id` null, `created_at` = now, and each non-null patch
//!   column overwriting; nothing found → `None`.
//!
//! Check-then-write operations of one store handle are serialised, and the
//! default single-writer policy lets one handle write at a time.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::{Array, ArrayRef, RecordBatch, StringArray, new_null_array};
use arrow_schema::{DataType, Schema, TimeUnit};
use lance::deps::datafusion::logical_expr::Expr;

use super::Store;
use crate::config::RecordCapabilities;
use crate::error::{BatchProblem, Error, Result};
use crate::read::{ReadView, ScanRequest, Visibility};

/// The reserved `content_type` of a tombstone row.
pub use lance_context_spec::TOMBSTONE_CONTENT_TYPE;

pub(super) const CONTENT_TYPE: &str = "content_type";
const SUPERSEDES: &str = "supersedes_id";
pub(super) const SUPERSEDED_BY: &str = "superseded_by_id";
pub(super) const EXPIRES_AT: &str = "expires_at";
pub(super) const STATUS: &str = "lifecycle_status";
pub(super) const RETIRED_AT: &str = "retired_at";
const CREATED_AT: &str = "created_at";

/// What an upsert did with one row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UpsertOutcome {
    /// The new row's key.
    pub id: String,
    /// True when no visible record had the secondary key.
    pub inserted: bool,
    /// The key of the record it replaced (superseded).
    pub replaced_id: Option<String>,
}

/// An upsert checked, not written: see [`Store::plan_upsert`].
struct UpsertPlan {
    rows: RecordBatch,
    visible: RecordBatch,
    outcomes: Vec<UpsertOutcome>,
}

/// Which record a patch targets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PatchTarget {
    /// By key.
    Id(String),
    /// By secondary key.
    SecondaryKey(String),
}

/// A new version built by [`Store::patch_version`], not yet written.
#[derive(Debug, Clone)]
pub struct PatchedVersion {
    /// One row: the new version.
    pub row: RecordBatch,
    /// Its key.
    pub id: String,
    /// The key it supersedes.
    pub replaced_id: String,
}

/// The columns each capability needs, checked when a store opens.
pub(crate) fn check_capabilities(caps: &RecordCapabilities, schema: &Schema) -> Result<()> {
    let need = |column: &str, timestamp: bool, what: &str| -> Result<()> {
        let ok = match schema.field_with_name(column).map(|f| f.data_type()) {
            Ok(DataType::Timestamp(_, _)) => timestamp,
            Ok(DataType::Utf8) => !timestamp,
            _ => false,
        };
        if ok {
            Ok(())
        } else {
            Err(Error::invalid_argument(format!(
                "the {what} capability needs a {} column '{column}'",
                if timestamp { "Timestamp" } else { "Utf8" }
            )))
        }
    };
    if caps.tombstones {
        need(CONTENT_TYPE, false, "tombstones")?;
    }
    if caps.supersession {
        need(SUPERSEDES, false, "supersession")?;
        need(SUPERSEDED_BY, false, "supersession")?;
    }
    if caps.lifecycle {
        need(EXPIRES_AT, true, "lifecycle")?;
        need(STATUS, false, "lifecycle")?;
        need(RETIRED_AT, true, "lifecycle")?;
    }
    if let Some(key) = &caps.secondary_key {
        need(key, false, "secondary key")?;
    }
    Ok(())
}

pub(super) fn now_micros() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_micros() as i64)
        .unwrap_or(0)
}

/// `rows` of a Utf8 column, null for absent columns or null values.
fn strings(batch: &RecordBatch, column: &str) -> Vec<Option<String>> {
    match batch.column_by_name(column) {
        Some(c) if c.data_type() == &DataType::Utf8 => c
            .as_string::<i32>()
            .iter()
            .map(|v| v.map(str::to_string))
            .collect(),
        _ => vec![None; batch.num_rows()],
    }
}

/// A column of `n` copies of a timestamp, in `data_type`'s unit and zone.
fn timestamps(data_type: &DataType, micros: i64, n: usize) -> Result<ArrayRef> {
    let us: ArrayRef = Arc::new(arrow_array::TimestampMicrosecondArray::from(vec![
        micros;
        n
    ]));
    match data_type {
        DataType::Timestamp(TimeUnit::Microsecond, None) => Ok(us),
        other => Ok(arrow_cast::cast(&us, other)?),
    }
}

/// Every record that is not a tombstone: expired, retired and superseded
/// ones included (what uniqueness and deletes look at).
fn undeleted() -> Visibility {
    Visibility {
        include_tombstones: false,
        ..Visibility::all()
    }
}

/// The first row of `keys` (the batch's secondary keys, in `column`) that
/// repeats an earlier one, as the problem it is.
fn first_repeat(column: &str, keys: &[String]) -> Option<BatchProblem> {
    let mut first: HashMap<&str, usize> = HashMap::new();
    let mut repeated = None;
    for (row, k) in keys.iter().enumerate() {
        if let Some(&first_row) = first.get(k.as_str()) {
            repeated = Some(BatchProblem::DuplicateInBatch {
                column: column.to_string(),
                row,
                first_row,
                value: k.clone(),
            });
            break;
        }
        first.insert(k, row);
    }
    repeated
}

/// What an upsert does with each row (secondary key `keys[row]` in
/// `column`, key `ids[row]`): insert, or replace the one visible record
/// `current` names, whose key is the row's `supersedes_id`. A key only
/// hidden records hold (`held_keys`), or that several visible records
/// hold, is refused.
fn upsert_outcomes(
    column: String,
    keys: &[String],
    ids: &[Option<String>],
    current: &HashMap<String, Vec<String>>,
    held_keys: &HashSet<String>,
) -> Result<(Vec<UpsertOutcome>, Vec<Option<String>>)> {
    let mut outcomes = Vec::with_capacity(keys.len());
    let mut supersedes: Vec<Option<String>> = Vec::with_capacity(keys.len());
    for (row, k) in keys.iter().enumerate() {
        let matches: Vec<&String> = current
            .get(k)
            .map(|v| v.iter().collect())
            .unwrap_or_default();
        let id = ids[row].clone().unwrap_or_default();
        match matches.as_slice() {
            [] if held_keys.contains(k) => {
                return Err(Error::batch(BatchProblem::AlreadyExists {
                    column,
                    row,
                    value: k.clone(),
                }));
            }
            [] => {
                supersedes.push(None);
                outcomes.push(UpsertOutcome {
                    id,
                    inserted: true,
                    replaced_id: None,
                });
            }
            [old] => {
                supersedes.push(Some((*old).clone()));
                outcomes.push(UpsertOutcome {
                    id,
                    inserted: false,
                    replaced_id: Some((*old).clone()),
                });
            }
            many => {
                return Err(Error::batch(BatchProblem::Ambiguous {
                    column,
                    row,
                    value: k.clone(),
                    matches: many.len(),
                }));
            }
        }
    }
    Ok((outcomes, supersedes))
}

/// The rows of a batch that supersede another record (`keys[row]` names
/// `named[row]`, not itself): row, key, target. Two rows naming one target
/// are refused.
fn supersession_targets(
    keys: &[Option<String>],
    named: &[Option<String>],
) -> Result<Vec<(usize, String, String)>> {
    let mut targets: Vec<(usize, String, String)> = Vec::new();
    let mut first: HashMap<String, usize> = HashMap::new();
    for (row, (key, target)) in keys.iter().zip(named).enumerate() {
        let (Some(key), Some(target)) = (key, target) else {
            continue;
        };
        if key == target {
            continue;
        }
        if let Some(&first_row) = first.get(target) {
            return Err(Error::batch(BatchProblem::DuplicateInBatch {
                column: SUPERSEDES.into(),
                row,
                first_row,
                value: target.clone(),
            }));
        }
        first.insert(target.clone(), row);
        targets.push((row, key.clone(), target.clone()));
    }
    Ok(targets)
}

impl Store {
    /// The expression that hides what `visibility` does not show, or `None`
    /// (see [`super::visible::Rules::expr`]).
    pub(crate) fn visibility_expr(&self, v: &Visibility) -> Result<Option<Expr>> {
        self.rules.expr(v)
    }

    /// `count()` with the default visibility: the base table's visible rows
    /// (kept per base version, see [`super::visible::Rules`]) adjusted by the
    /// unmerged generations. `None` when that cannot be done (no rule, or a
    /// generation written before a column the rule names existed): the
    /// caller counts through a scan.
    pub(crate) async fn count_visible(&self) -> Result<Option<u64>> {
        let now = now_micros();
        self.on_view(|view| async move {
            let known = self.rules.known(&view.dataset, now).await;
            if let Some(c) = &known
                && view.nothing_unmerged()
            {
                // Nothing unmerged: the rule need not even be parsed.
                return Ok(Some(c.at(now)));
            }
            let Some(hide) = self.visibility_expr(&Visibility {
                now_micros: Some(now),
                ..Visibility::default()
            })?
            else {
                return Ok(None);
            };
            let base = match known {
                Some(c) => c.at(now),
                None => self.rules.counted(&view.dataset, &hide, now).await?,
            };
            crate::read::count_all(
                &view,
                &self.schemas.key,
                &self.engine.opener,
                base,
                Some(&hide),
            )
            .await
        })
        .await
    }

    /// `request` to plan, and the visibility expression to join to its filter.
    pub(crate) fn with_visibility(
        &self,
        mut request: ScanRequest,
    ) -> Result<(ScanRequest, Option<Expr>)> {
        if self.capabilities == RecordCapabilities::default() {
            return Ok((request, None));
        }
        let hide = self.visibility_expr(&request.visibility)?;
        request.visibility = Visibility::all();
        Ok((request, hide))
    }

    /// Rows whose `column` is one of `values`, under `visibility`: the key
    /// and `column` only, or every column with `whole_rows`. Read on `view`
    /// when given (the reads of one record write share a view: one state,
    /// and one listing of the tier), else on a new one.
    async fn rows_where(
        &self,
        view: Option<&ReadView>,
        column: &str,
        values: &[&str],
        visibility: Visibility,
        whole_rows: bool,
    ) -> Result<RecordBatch> {
        let mut request = ScanRequest::new().visibility(visibility);
        if !whole_rows {
            let mut columns = vec![self.schemas.key.as_str()];
            if column != self.schemas.key {
                columns.push(column);
            }
            request = request.project(columns);
        }
        if values.is_empty() {
            let schema = self.output_schema(request.projection.as_deref())?;
            return Ok(RecordBatch::new_empty(schema));
        }
        // Read from the generations held in memory, the base table through
        // its index; else through the LSM scanner.
        let projection = request.projection.clone();
        let stored: Vec<String> = match &projection {
            Some(columns) => columns.clone(),
            None => self.schemas.readable_columns(),
        };
        let held = self
            .held_rows(view, column, values, request.visibility, &stored)
            .await?;
        match held {
            Some(rows) => self.schemas.conform_for_read(&rows, projection.as_deref()),
            None => {
                self.scan_matching(request, Some(crate::read::in_list(column, values)))
                    .await
            }
        }
    }

    /// The rows whose `column` is one of `values` under `visibility`, every
    /// column, read from the held generations and the base table (tests:
    /// compared with a scan). `None` where that path does not apply.
    #[cfg(feature = "failpoints")]
    pub async fn held_rows_matching(
        &self,
        column: &str,
        values: &[&str],
        visibility: Visibility,
    ) -> Result<Option<RecordBatch>> {
        let stored = self.schemas.readable_columns();
        let held = self
            .held_rows(None, column, values, visibility, &stored)
            .await?;
        held.map(|rows| self.schemas.conform_for_read(&rows, None))
            .transpose()
    }

    /// Hold at most `bytes` of unmerged generations for keyed reads (tests
    /// of the fallback to the LSM scanner).
    #[cfg(feature = "failpoints")]
    pub fn set_held_limit(&self, bytes: usize) {
        self.engine.held.set_limit(bytes);
    }

    /// Bytes of unmerged generations held for keyed reads, how many, and
    /// how many loads of one reads have started so far.
    #[cfg(feature = "failpoints")]
    pub fn held_generations(&self) -> (usize, usize, usize) {
        self.engine.held.held()
    }

    /// Whether lookups' background load of unmerged generations is running
    /// (tests wait for it).
    #[cfg(feature = "failpoints")]
    pub fn warming_generations(&self) -> bool {
        self.engine.held.warming()
    }

    /// Keyed reads of the base table so far: through its index alone, and
    /// through a plan (tests: which path a read took).
    #[cfg(feature = "failpoints")]
    pub fn keyed_base_reads(&self) -> (usize, usize) {
        self.engine.held.base_reads()
    }

    /// [`crate::read::keyed_rows`] on a fresh view: the stored columns
    /// `stored` of the rows whose `column` is one of `values`. On a task of
    /// its own, so the two reads of a record write (are the ids new, what do
    /// the secondary keys name) run on two cores, not by turns on one.
    async fn held_rows(
        &self,
        view: Option<&ReadView>,
        column: &str,
        values: &[&str],
        visibility: Visibility,
        stored: &[String],
    ) -> Result<Option<RecordBatch>> {
        let hide = self.visibility_expr(&visibility)?;
        let engine = self.engine.clone();
        let schemas = self.schemas.clone();
        let column = column.to_string();
        let values: Vec<String> = values.iter().map(|v| v.to_string()).collect();
        let stored = stored.to_vec();
        let pause = self.take_read_pause();
        let first = view.cloned();
        let read = tokio::spawn(async move {
            let values: Vec<&str> = values.iter().map(String::as_str).collect();
            let (engine, schemas) = (&engine, &schemas);
            let (column, values, hide, stored) = (&column, &values, hide.as_ref(), &stored);
            super::read_on_view(engine, first, pause, |view| async move {
                let read = crate::read::KeyedRead {
                    column,
                    values,
                    hide,
                    columns: stored,
                    small_tier_only: false,
                };
                crate::read::keyed_rows(&view, schemas, &engine.opener, &engine.held, read).await
            })
            .await
        });
        read.await
            .map_err(|e| Error::internal(format!("a keyed read did not finish: {e}")))?
    }

    /// [`crate::read::keyed_rows`] with this handle's schemas, opener and
    /// held generations.
    pub(crate) async fn keyed(
        &self,
        view: &crate::read::ReadView,
        read: crate::read::KeyedRead<'_>,
    ) -> Result<Option<RecordBatch>> {
        crate::read::keyed_rows(
            view,
            &self.schemas,
            &self.engine.opener,
            &self.engine.held,
            read,
        )
        .await
    }

    /// Lookup by key hiding tombstones.
    pub(crate) async fn lookup_live(
        &self,
        ids: &[&str],
        projection: Option<&[String]>,
    ) -> Result<RecordBatch> {
        let mut wanted: Vec<String> = match projection {
            Some(p) => p.to_vec(),
            None => self
                .schemas
                .logical
                .fields()
                .iter()
                .map(|f| f.name().clone())
                .collect(),
        };
        let added = !wanted.iter().any(|c| c == CONTENT_TYPE);
        if added {
            wanted.push(CONTENT_TYPE.to_string());
        }
        let found = self.lookup_any(ids, Some(&wanted)).await?;
        let keep: arrow_array::BooleanArray = strings(&found, CONTENT_TYPE)
            .iter()
            .map(|c| Some(c.as_deref() != Some(TOMBSTONE_CONTENT_TYPE)))
            .collect();
        let live = arrow_select::filter::filter_record_batch(&found, &keep)?;
        if added {
            return super::without_column(&live, CONTENT_TYPE);
        }
        Ok(live)
    }

    /// The checks on rows about to become new records: the tombstone value
    /// refused; with unique keys, repeats in the batch and keys already held
    /// by non-tombstone rows refused (`check_secondary`: the secondary key too).
    /// Its reads run on `view` when given, else on one view they share.
    pub(crate) async fn check_new_records(
        &self,
        view: Option<&ReadView>,
        batch: &RecordBatch,
        check_secondary: bool,
    ) -> Result<()> {
        let caps = &self.capabilities;
        if caps.tombstones
            && let Some(row) = strings(batch, CONTENT_TYPE)
                .iter()
                .position(|c| c.as_deref() == Some(TOMBSTONE_CONTENT_TYPE))
        {
            return Err(Error::batch(BatchProblem::ReservedValue {
                column: CONTENT_TYPE.into(),
                row,
            }));
        }
        if !caps.unique_keys {
            return Ok(());
        }
        let mut columns = vec![self.schemas.key.clone()];
        if check_secondary && let Some(s) = &caps.secondary_key {
            columns.push(s.clone());
        }
        // Every problem is found, then the first in input order is reported.
        let mut problems: Vec<BatchProblem> = Vec::new();
        let values: Vec<Vec<Option<String>>> = columns.iter().map(|c| strings(batch, c)).collect();
        let mut firsts: Vec<HashMap<&str, usize>> = Vec::with_capacity(columns.len());
        for (column, values) in columns.iter().zip(&values) {
            let mut first: HashMap<&str, usize> = HashMap::new();
            for (row, v) in values.iter().enumerate() {
                let Some(v) = v.as_deref().filter(|v| !v.is_empty()) else {
                    continue;
                };
                if let Some(&first_row) = first.get(v) {
                    problems.push(BatchProblem::DuplicateInBatch {
                        column: column.clone(),
                        row,
                        first_row,
                        value: v.to_string(),
                    });
                } else {
                    first.insert(v, row);
                }
            }
            firsts.push(first);
        }
        // The columns' reads run together, on one view.
        let wanted: Vec<Vec<&str>> = firsts.iter().map(|f| f.keys().copied().collect()).collect();
        let taken;
        let view = match view {
            None if columns.len() > 1 => {
                taken = self.engine.view().await?;
                Some(&taken)
            }
            given => given,
        };
        let reads = columns
            .iter()
            .zip(&wanted)
            .map(|(column, wanted)| self.rows_where(view, column, wanted, undeleted(), false));
        let helds = futures::future::try_join_all(reads).await?;
        for (((column, values), first), held) in
            columns.iter().zip(&values).zip(&firsts).zip(&helds)
        {
            let held: HashSet<String> = strings(held, column).into_iter().flatten().collect();
            for (row, v) in values.iter().enumerate() {
                if let Some(v) = v.as_deref().filter(|v| held.contains(*v))
                    && first.get(v) == Some(&row)
                {
                    problems.push(BatchProblem::AlreadyExists {
                        column: column.clone(),
                        row,
                        value: v.to_string(),
                    });
                }
            }
        }
        match problems.into_iter().min_by_key(|p| p.row()) {
            Some(problem) => Err(Error::batch(problem)),
            None => Ok(()),
        }
    }

    fn need(&self, what: &str, on: bool) -> Result<()> {
        if on {
            Ok(())
        } else {
            Err(Error::invalid_argument(format!(
                "this store's schema does not declare the {what} capability"
            )))
        }
    }

    fn secondary_key(&self) -> Result<&str> {
        self.capabilities
            .secondary_key
            .as_deref()
            .ok_or_else(|| Error::invalid_argument("this store's schema declares no secondary key"))
    }

    /// Delete records by key: a tombstone for each key a lookup returns
    /// (hidden records included). Returns, per key given, whether it was
    /// deleted (false: nothing to delete).
    pub async fn tombstone(&self, ids: &[&str]) -> Result<Vec<bool>> {
        let key = self.schemas.key.clone();
        self.tombstone_where(&key, ids).await
    }

    /// Delete records by secondary key: every non-deleted row holding it,
    /// every version of the record included.
    pub async fn tombstone_by_secondary_key(&self, values: &[&str]) -> Result<Vec<bool>> {
        let column = self.secondary_key()?.to_string();
        self.tombstone_where(&column, values).await
    }

    async fn tombstone_where(&self, column: &str, values: &[&str]) -> Result<Vec<bool>> {
        self.need("tombstones", self.capabilities.tombstones)?;
        super::input::check_key_lengths(column, values)?;
        let _guard = self.record_lock.lock().await;
        let found = self
            .rows_where(None, column, values, undeleted(), true)
            .await?;
        let held: HashSet<String> = strings(&found, column).into_iter().flatten().collect();
        let deleted: Vec<bool> = values.iter().map(|v| held.contains(*v)).collect();
        if found.num_rows() == 0 {
            return Ok(deleted);
        }
        let n = found.num_rows();
        let now = now_micros();
        let schema = self.schemas.logical.clone();
        let mut columns = Vec::with_capacity(schema.fields().len());
        for field in schema.fields() {
            let name = field.name().as_str();
            let given = found
                .column_by_name(name)
                .ok_or_else(|| Error::internal(format!("scan lacks column '{name}'")))?;
            let column: ArrayRef = if name == CONTENT_TYPE {
                Arc::new(StringArray::from(vec![TOMBSTONE_CONTENT_TYPE; n]))
            } else if name == STATUS && self.capabilities.lifecycle {
                Arc::new(StringArray::from(vec!["active"; n]))
            } else if name == CREATED_AT && matches!(field.data_type(), DataType::Timestamp(_, _)) {
                timestamps(field.data_type(), now, n)?
            } else if !field.is_nullable()
                || name == self.schemas.key
                || Some(name) == self.capabilities.secondary_key.as_deref()
            {
                given.clone()
            } else {
                new_null_array(field.data_type(), n)
            };
            columns.push(column);
        }
        let tombstones = RecordBatch::try_new(schema, columns)?;
        let conformed = self.schemas.conform_for_write(&tombstones)?;
        self.write_linked(Linked::unlinked(conformed)).await?;
        Ok(deleted)
    }

    /// Insert or replace records by their secondary key (see the module docs).
    /// Returns what happened to each row, in input order.
    pub async fn upsert(&self, batch: &RecordBatch) -> Result<Vec<UpsertOutcome>> {
        let _guard = self.record_lock.lock().await;
        let plan = self.plan_upsert(batch, true).await?;
        let rows = self
            .with_backlinks_from(plan.rows, Some(&plan.visible))
            .await?;
        self.write_linked(rows).await?;
        Ok(plan.outcomes)
    }

    /// What [`Self::upsert`] of `batch` would do now, checked as it checks
    /// (the batch conforms, every row has a secondary key, the keys are new
    /// and unrepeated, each secondary key names at most one visible record
    /// and is not held by hidden ones only); nothing is written. What only
    /// a write can refuse is not checked: a read-only handle (which may run
    /// this check), backpressure (`Busy`), a fence. The records replaced are
    /// read by key and secondary key alone, where `upsert` reads them whole
    /// to rewrite them: these are the least reads any upsert must make
    /// before writing.
    pub async fn check_upsert(&self, batch: &RecordBatch) -> Result<Vec<UpsertOutcome>> {
        let _guard = self.record_lock.lock().await;
        Ok(self.plan_upsert(batch, false).await?.outcomes)
    }

    /// The checks and reads of an upsert (the caller holds the record lock):
    /// the rows to write, with `supersedes_id` set, and the visible records
    /// they replace — whole with `whole_rows`, else key and secondary key.
    async fn plan_upsert(&self, batch: &RecordBatch, whole_rows: bool) -> Result<UpsertPlan> {
        self.need("supersession", self.capabilities.supersession)?;
        let column = self.secondary_key()?.to_string();
        let conformed = self.schemas.conform_for_write(batch)?;
        self.check_input(&conformed)?;
        let keys = strings(&conformed, &column);
        if let Some(row) = keys
            .iter()
            .position(|k| k.as_deref().is_none_or(str::is_empty))
        {
            return Err(Error::batch(BatchProblem::MissingSecondaryKey {
                column,
                row,
            }));
        }
        let keys: Vec<String> = keys.into_iter().flatten().collect();
        let repeated = first_repeat(&column, &keys);
        let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
        // Two independent reads: the new ids are unique, and the records
        // each key names now (whole for a write: they are the versions this
        // batch supersedes, rewritten with their back-link). The reported
        // problem is the same as checking one after the other: ids first.
        // Both on one view: one state, and one listing of the tier.
        let view = self.engine.view().await?;
        let view = Some(&view);
        let (checked, visible) = futures::join!(
            self.check_new_records(view, &conformed, false),
            self.rows_where(view, &column, &refs, Visibility::default(), whole_rows),
        );
        checked?;
        if let Some(problem) = repeated {
            return Err(Error::batch(problem));
        }
        let visible = visible?;
        let mut current: HashMap<String, Vec<String>> = HashMap::new();
        for (k, id) in strings(&visible, &column)
            .into_iter()
            .zip(strings(&visible, &self.schemas.key))
        {
            if let (Some(k), Some(id)) = (k, id) {
                current.entry(k).or_default().push(id);
            }
        }
        // A key no visible record names may still be held by a hidden one
        // (expired, retired, superseded): only those keys are looked up.
        let unnamed: Vec<&str> = refs
            .iter()
            .copied()
            .filter(|k| !current.contains_key(*k))
            .collect();
        let held = self
            .rows_where(view, &column, &unnamed, undeleted(), false)
            .await?;
        let held_keys: HashSet<String> = strings(&held, &column).into_iter().flatten().collect();
        let ids = strings(&conformed, &self.schemas.key);
        let (outcomes, supersedes) = upsert_outcomes(column, &keys, &ids, &current, &held_keys)?;
        // The caller's supersedes_id is ignored (superseded_by_id was refused).
        let schema = conformed.schema();
        let mut columns = conformed.columns().to_vec();
        if let Ok(i) = schema.index_of(SUPERSEDES) {
            columns[i] = Arc::new(StringArray::from(supersedes));
        }
        if let Ok(i) = schema.index_of(SUPERSEDED_BY) {
            columns[i] = new_null_array(schema.field(i).data_type(), conformed.num_rows());
        }
        Ok(UpsertPlan {
            rows: RecordBatch::try_new(schema, columns)?,
            visible,
            outcomes,
        })
    }

    /// `batch` (conformed) followed by the records its rows supersede,
    /// rewritten with `superseded_by_id` = the superseding row's key, and the
    /// pairs of rows that must become visible together. Each named record
    /// must be current (see the module docs); the caller holds the record
    /// lock.
    pub(crate) async fn with_backlinks(&self, batch: RecordBatch) -> Result<Linked> {
        self.with_backlinks_from(batch, None).await
    }

    /// [`Self::with_backlinks`], with `read`: whole rows (every logical
    /// column) the caller read under the record lock. When they hold every
    /// named record, the records are not looked up again.
    async fn with_backlinks_from(
        &self,
        batch: RecordBatch,
        read: Option<&RecordBatch>,
    ) -> Result<Linked> {
        if !self.capabilities.supersession {
            return Ok(Linked::unlinked(batch));
        }
        let keys = strings(&batch, &self.schemas.key);
        let named = strings(&batch, SUPERSEDES);
        let mut targets = supersession_targets(&keys, &named)?;
        if targets.is_empty() {
            return Ok(Linked::unlinked(batch));
        }
        // Targets written in this same batch are marked in place.
        let in_batch: HashMap<&str, usize> = keys
            .iter()
            .enumerate()
            .filter_map(|(row, k)| k.as_deref().map(|k| (k, row)))
            .collect();
        let mut successors: Vec<Option<String>> = strings(&batch, SUPERSEDED_BY);
        let mut marked_in_batch = false;
        let mut links = Vec::new();
        targets.retain(|(row, key, target)| match in_batch.get(target.as_str()) {
            Some(&at) if at != *row => {
                successors[at] = Some(key.clone());
                marked_in_batch = true;
                links.push((*row, at));
                false
            }
            _ => true,
        });
        let batch = if marked_in_batch {
            let at = batch.schema().index_of(SUPERSEDED_BY)?;
            let mut columns = batch.columns().to_vec();
            columns[at] = Arc::new(StringArray::from(successors));
            RecordBatch::try_new(batch.schema(), columns)?
        } else {
            batch
        };
        if targets.is_empty() {
            return Ok(Linked { batch, links });
        }
        let ids: Vec<&str> = targets.iter().map(|(_, _, t)| t.as_str()).collect();
        let holds_all = read.is_some_and(|read| {
            let held: HashSet<String> = strings(read, &self.schemas.key)
                .into_iter()
                .flatten()
                .collect();
            ids.iter().all(|id| held.contains(*id))
        });
        let found = match read {
            Some(read) if holds_all => read.clone(),
            _ => self.lookup_any(&ids, None).await?,
        };
        let old = self.superseded_rows(&found, &targets)?;
        let new_rows = batch.num_rows();
        links.extend(
            targets
                .iter()
                .enumerate()
                .map(|(j, (row, _, _))| (*row, new_rows + j)),
        );
        Ok(Linked {
            batch: arrow_select::concat::concat_batches(&batch.schema(), &[batch.clone(), old])?,
            links,
        })
    }

    /// The records `targets` (row, its key, the key it supersedes) name,
    /// taken from `found` and rewritten with `superseded_by_id` = the
    /// superseding row's key, conformed for writing. Each must be current.
    fn superseded_rows(
        &self,
        found: &RecordBatch,
        targets: &[(usize, String, String)],
    ) -> Result<RecordBatch> {
        let found_keys = strings(found, &self.schemas.key);
        let content = strings(found, CONTENT_TYPE);
        let successor = strings(found, SUPERSEDED_BY);
        let found_at: HashMap<&str, usize> = found_keys
            .iter()
            .enumerate()
            .filter_map(|(i, k)| k.as_deref().map(|k| (k, i)))
            .collect();
        let mut take = Vec::with_capacity(targets.len());
        let mut new_keys = Vec::with_capacity(targets.len());
        for (row, key, target) in targets {
            let at = found_at.get(target.as_str()).copied();
            let current = at.is_some_and(|i| {
                successor[i].is_none() && content[i].as_deref() != Some(TOMBSTONE_CONTENT_TYPE)
            });
            let Some(i) = at.filter(|_| current) else {
                return Err(Error::batch(BatchProblem::NotCurrent {
                    column: SUPERSEDES.into(),
                    row: *row,
                    value: target.clone(),
                    superseded_by: at.and_then(|i| successor[i].clone()),
                }));
            };
            take.push(i as u32);
            new_keys.push(key.clone());
        }
        let indices = arrow_array::UInt32Array::from(take);
        let mut old = arrow_select::take::take_record_batch(found, &indices)?;
        let at = old.schema().index_of(SUPERSEDED_BY)?;
        let mut columns = old.columns().to_vec();
        columns[at] = Arc::new(StringArray::from(new_keys));
        old = RecordBatch::try_new(old.schema(), columns)?;
        self.schemas.conform_for_write(&old)
    }

    /// Build the new version a patch makes (not written): see the module docs.
    /// `patch` is one row of patchable columns (by name; nulls leave a column
    /// as it was); the key, the secondary key, `supersedes_id`,
    /// `superseded_by_id` and `created_at` are not patchable. `None` when no
    /// visible record matches.
    pub async fn patch_version(
        &self,
        target: &PatchTarget,
        patch: &RecordBatch,
        new_id: &str,
    ) -> Result<Option<PatchedVersion>> {
        self.need("supersession", self.capabilities.supersession)?;
        if patch.num_rows() != 1 {
            return Err(Error::invalid_argument(format!(
                "a patch is one row, got {}",
                patch.num_rows()
            )));
        }
        let fixed = [
            self.schemas.key.as_str(),
            SUPERSEDES,
            SUPERSEDED_BY,
            CREATED_AT,
            self.capabilities.secondary_key.as_deref().unwrap_or(""),
        ];
        let mut changes = 0;
        for (field, column) in patch.schema().fields().iter().zip(patch.columns()) {
            let name = field.name().as_str();
            if fixed.contains(&name) {
                return Err(Error::invalid_argument(format!(
                    "'{name}' cannot be patched"
                )));
            }
            let declared =
                self.schemas.logical.field_with_name(name).map_err(|_| {
                    Error::invalid_argument(format!("patch: unknown column '{name}'"))
                })?;
            if declared.data_type() != column.data_type() {
                return Err(Error::invalid_argument(format!(
                    "patch: column '{name}' has type {}, expected {}",
                    column.data_type(),
                    declared.data_type()
                )));
            }
            if column.is_valid(0) {
                changes += 1;
            }
        }
        if changes == 0 {
            return Err(Error::invalid_argument("the patch changes nothing"));
        }
        let (column, value) = match target {
            PatchTarget::Id(id) => (self.schemas.key.clone(), id.as_str()),
            PatchTarget::SecondaryKey(k) => (self.secondary_key()?.to_string(), k.as_str()),
        };
        let found = self
            .rows_where(None, &column, &[value], Visibility::default(), true)
            .await?;
        let old = match found.num_rows() {
            0 => return Ok(None),
            1 => found,
            n => {
                return Err(Error::invalid_argument(format!(
                    "{column} '{value}' matches {n} visible records"
                )));
            }
        };
        let old_id = strings(&old, &self.schemas.key)[0]
            .clone()
            .unwrap_or_default();
        let now = now_micros();
        let schema = self.schemas.logical.clone();
        let mut columns = Vec::with_capacity(schema.fields().len());
        for field in schema.fields() {
            let name = field.name().as_str();
            let column: ArrayRef = if name == self.schemas.key {
                Arc::new(StringArray::from(vec![new_id]))
            } else if name == SUPERSEDES {
                Arc::new(StringArray::from(vec![old_id.as_str()]))
            } else if name == SUPERSEDED_BY {
                new_null_array(field.data_type(), 1)
            } else if name == CREATED_AT && matches!(field.data_type(), DataType::Timestamp(_, _)) {
                timestamps(field.data_type(), now, 1)?
            } else {
                match patch.column_by_name(name).filter(|c| c.is_valid(0)) {
                    Some(c) => c.clone(),
                    None => old
                        .column_by_name(name)
                        .cloned()
                        .ok_or_else(|| Error::internal(format!("scan lacks column '{name}'")))?,
                }
            };
            columns.push(column);
        }
        Ok(Some(PatchedVersion {
            row: RecordBatch::try_new(schema, columns)?,
            id: new_id.to_string(),
            replaced_id: old_id,
        }))
    }

    /// Write new versions of existing records (rows built by
    /// [`Self::patch_version`], possibly transformed): their keys must be new;
    /// their secondary keys are those of the records they supersede.
    /// The records they supersede must still be current: a concurrent patch
    /// of the same record that committed first makes this one fail with
    /// [`BatchProblem::NotCurrent`] (kind `Conflict`).
    pub async fn add_new_versions(&self, batch: &RecordBatch) -> Result<()> {
        let _guard = self.record_lock.lock().await;
        let conformed = self.schemas.conform_for_write(batch)?;
        self.check_input(&conformed)?;
        self.check_new_records(None, &conformed, false).await?;
        let rows = self.with_backlinks(conformed).await?;
        self.write_linked(rows).await?;
        Ok(())
    }

    /// Records named by another row's `supersedes_id` that lack their
    /// back-link (`superseded_by_id` null) — a dataset written by the
    /// previous implementation, which hid a superseded record by scanning
    /// every `supersedes_id` on each list: these reads hide it by the row's
    /// own back-link. With `write`, each such record is rewritten with
    /// `superseded_by_id` = its successor's key (the newest successor by
    /// `created_at`, then key, when several name it), in one atomic write
    /// per record, and its rows are the same otherwise. A deleted record (a
    /// tombstone) and a self-reference are left alone. Returns the links
    /// found (written, with `write`). No effect without supersession.
    pub async fn link_superseded(&self, write: bool) -> Result<usize> {
        if !self.capabilities.supersession {
            return Ok(0);
        }
        let _guard = self.record_lock.lock().await;
        let key = self.schemas.key.clone();
        let has_created = self.schemas.logical.field_with_name(CREATED_AT).is_ok();
        let mut projection = vec![key.clone(), SUPERSEDES.to_string()];
        if has_created {
            projection.push(CREATED_AT.to_string());
        }
        let successors = self
            .scan(ScanRequest {
                filter: Some(format!("{SUPERSEDES} IS NOT NULL")),
                projection: Some(projection),
                visibility: Visibility::all(),
                ..ScanRequest::default()
            })
            .await?;
        let keys = strings(&successors, &key);
        let named = strings(&successors, SUPERSEDES);
        let created: Vec<Option<i64>> = match successors.column_by_name(CREATED_AT) {
            Some(c) => {
                let c = arrow_cast::cast(c, &DataType::Int64)?;
                let c = c.as_primitive::<arrow_array::types::Int64Type>();
                (0..c.len())
                    .map(|i| c.is_valid(i).then(|| c.value(i)))
                    .collect()
            }
            None => vec![None; successors.num_rows()],
        };
        // target -> (created_at, successor key), the newest kept.
        let mut newest: HashMap<String, (Option<i64>, String)> = HashMap::new();
        for ((k, t), c) in keys.into_iter().zip(named).zip(created) {
            let (Some(k), Some(t)) = (k, t) else { continue };
            if k == t {
                continue;
            }
            let candidate = (c, k);
            match newest.get(&t) {
                Some(held) if *held >= candidate => {}
                _ => {
                    newest.insert(t, candidate);
                }
            }
        }
        if newest.is_empty() {
            return Ok(0);
        }
        let mut targets: Vec<&str> = newest.keys().map(String::as_str).collect();
        targets.sort_unstable();
        let found = self.lookup_any(&targets, None).await?;
        let found_keys = strings(&found, &key);
        let content = strings(&found, CONTENT_TYPE);
        let successor = strings(&found, SUPERSEDED_BY);
        let mut take = Vec::new();
        let mut links = Vec::new();
        for (i, k) in found_keys.iter().enumerate() {
            let Some(k) = k else { continue };
            if successor[i].is_some() || content[i].as_deref() == Some(TOMBSTONE_CONTENT_TYPE) {
                continue;
            }
            if let Some((_, by)) = newest.get(k) {
                take.push(i as u32);
                links.push(Some(by.clone()));
            }
        }
        let found_links = take.len();
        if !write || found_links == 0 {
            return Ok(found_links);
        }
        let indices = arrow_array::UInt32Array::from(take);
        let old = arrow_select::take::take_record_batch(&found, &indices)?;
        let at = old.schema().index_of(SUPERSEDED_BY)?;
        let mut columns = old.columns().to_vec();
        columns[at] = Arc::new(StringArray::from(links));
        let linked = RecordBatch::try_new(old.schema(), columns)?;
        let conformed = self.schemas.conform_for_write(&linked)?;
        self.write_linked(Linked::unlinked(conformed)).await?;
        Ok(found_links)
    }

    /// Patch a record as a new version under a fresh key (UUIDv7):
    /// [`Self::patch_version`] then [`Self::add_new_versions`].
    pub async fn patch(
        &self,
        target: &PatchTarget,
        patch: &RecordBatch,
    ) -> Result<Option<PatchedVersion>> {
        let Some(version) = self
            .patch_version(target, patch, &crate::generate_id())
            .await?
        else {
            return Ok(None);
        };
        self.add_new_versions(&version.row).await?;
        Ok(Some(version))
    }
}

/// A conformed batch to write, and the pairs of its rows that must become
/// visible together: a new version and the rewritten record it supersedes
/// (readers would otherwise see both versions current, or neither).
pub(crate) struct Linked {
    pub batch: RecordBatch,
    pub links: Vec<(usize, usize)>,
}

impl Linked {
    pub fn unlinked(batch: RecordBatch) -> Self {
        Self {
            batch,
            links: Vec::new(),
        }
    }

    /// Cut the batch into writes of at most `max_rows` rows, each holding
    /// every group of linked rows (through `links`, or sharing a key) whole;
    /// groups keep their input order and rows their order within a write.
    /// A group larger than `max_rows` is refused
    /// ([`BatchProblem::LinkedRowsTooMany`]).
    pub fn into_chunks(self, key: &str, max_rows: usize) -> Result<Vec<RecordBatch>> {
        let n = self.batch.num_rows();
        if n <= max_rows {
            return Ok(vec![self.batch]);
        }
        let mut parent: Vec<usize> = (0..n).collect();
        fn root(parent: &mut [usize], mut x: usize) -> usize {
            while parent[x] != x {
                parent[x] = parent[parent[x]];
                x = parent[x];
            }
            x
        }
        let mut join = |a: usize, b: usize| {
            let (ra, rb) = (root(&mut parent, a), root(&mut parent, b));
            if ra != rb {
                parent[ra.max(rb)] = ra.min(rb);
            }
        };
        for &(a, b) in &self.links {
            join(a, b);
        }
        let mut first_with_key: HashMap<String, usize> = HashMap::new();
        for (row, k) in strings(&self.batch, key).into_iter().enumerate() {
            if let Some(k) = k {
                match first_with_key.get(&k) {
                    Some(&first) => join(first, row),
                    None => {
                        first_with_key.insert(k, row);
                    }
                }
            }
        }
        let mut groups: Vec<Vec<u32>> = Vec::new();
        let mut group_of: HashMap<usize, usize> = HashMap::new();
        for row in 0..n {
            let r = root(&mut parent, row);
            let at = *group_of.entry(r).or_insert_with(|| {
                groups.push(Vec::new());
                groups.len() - 1
            });
            groups[at].push(row as u32);
        }
        let mut chunks = Vec::new();
        let mut current: Vec<u32> = Vec::new();
        let mut flush = |current: &mut Vec<u32>| -> Result<()> {
            if current.is_empty() {
                return Ok(());
            }
            current.sort_unstable();
            let indices = arrow_array::UInt32Array::from(std::mem::take(current));
            chunks.push(arrow_select::take::take_record_batch(
                &self.batch,
                &indices,
            )?);
            Ok(())
        };
        for group in groups {
            if group.len() > max_rows {
                return Err(Error::batch(BatchProblem::LinkedRowsTooMany {
                    column: SUPERSEDES.into(),
                    row: group[0] as usize,
                    rows: group.len(),
                    max: max_rows,
                }));
            }
            if current.len() + group.len() > max_rows {
                flush(&mut current)?;
            }
            current.extend(group);
        }
        flush(&mut current)?;
        Ok(chunks)
    }
}
