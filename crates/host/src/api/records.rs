//! Records: add, get, lookup, list pages, delete, upsert, patch.

use base64::Engine as _;
use lance_context_client::{
    Added, CountParams, Counted, Deleted, GetMany, ListParams, Page, Patched, RecordsBody, Rows,
    UpsertResult, Upserted,
};
use lance_context_store::{PatchTarget, ScanRequest, SortKey};
use serde_json::{Value, json};

use super::json::{batch_from_json, last_string, rows, to_json};
use super::members::Membership;
use super::{Access, ApiError, Embedded, OpenStore};
use crate::spec::Capability;
use crate::{ErrorKind, conform, default_projection};

/// Where a write came from: the server passes the caller's credentials on
/// when it sends rows to their owners, and marks what another instance sent
/// it (written here or refused, never sent on).
#[derive(Debug, Clone, Default)]
pub(crate) struct Origin {
    /// The request's `Authorization` header.
    pub authorization: Option<String>,
    /// Sent by another instance (the `x-lance-context-forwarded` header).
    pub forwarded: bool,
    /// The sending instance's time for the plugin's defaults (rows it sent;
    /// the `x-lance-context-now` header, within minutes of this clock).
    pub now_micros: Option<i64>,
}

/// Write the rows of the buckets owned here, send the others' to their
/// owners, all at once; every record is validated here first, so a batch
/// the plugin refuses writes nothing anywhere.
async fn routed_add(
    store: &OpenStore,
    membership: &Membership,
    batch: &arrow_array::RecordBatch,
    auth: Option<&str>,
) -> Result<Added, ApiError> {
    let now = crate::now_micros();
    let prepared = store.named.prepare(batch, now).await?;
    let owned: std::collections::BTreeSet<u32> = store.named.owned_buckets().into_iter().collect();
    let Some(buckets) = prepared.buckets() else {
        let outcome = store.named.add_prepared(&prepared, None).await?;
        return Ok(Added {
            added: outcome.rows,
        });
    };
    let mut here = Vec::new();
    let mut away: std::collections::BTreeMap<u32, Vec<u32>> = Default::default();
    for (row, bucket) in buckets.iter().enumerate() {
        match owned.contains(bucket) {
            true => here.push(row as u32),
            false => away.entry(*bucket).or_default().push(row as u32),
        }
    }
    if away.is_empty() {
        let outcome = store.named.add_prepared(&prepared, None).await?;
        return Ok(Added {
            added: outcome.rows,
        });
    }
    // A bucket without a live owner refuses the request before any part
    // of it is written.
    membership.check_owners(store, away.keys().copied()).await?;
    let local = async {
        match here.is_empty() {
            true => Ok(0),
            false => store
                .named
                .add_prepared(&prepared, Some(&here))
                .await
                .map(|o| o.rows)
                .map_err(|e| renumbered(ApiError::from_error(&e), &here)),
        }
    };
    let sends = away.iter().map(|(bucket, rows)| async move {
        let part = take_rows(batch, rows)?;
        let arrow = lance_context_wire::encode(&[part])
            .map_err(|e| ApiError::of_kind(ErrorKind::Internal, format!("encoding rows: {e}")))?;
        membership
            .send_add(store, *bucket, arrow, auth, now)
            .await
            .map_err(|e| renumbered(e.into_error(), rows))
    });
    let (local, sent) = futures::join!(local, futures::future::join_all(sends));
    let mut added = 0;
    let mut failed = None;
    for result in std::iter::once(local).chain(sent) {
        match result {
            Ok(n) => added += n,
            Err(e) => {
                failed.get_or_insert(e);
            }
        }
    }
    match failed {
        None => Ok(Added { added }),
        Some(e) => Err(partly_done(e, added, "written", || {
            format!(
                "{added} of the request's {} records were written by their owners; \
                 sending the whole request again is safe: the newest write of a key wins",
                batch.num_rows()
            )
        })),
    }
}

/// A routed write's error after `done` parts of it were done elsewhere:
/// the message says so (`said`), `details.<detail>` counts them.
fn partly_done(
    mut e: ApiError,
    done: usize,
    detail: &str,
    said: impl FnOnce() -> String,
) -> ApiError {
    if done > 0 {
        e.message = format!("{} ({})", e.message, said());
        if let Value::Object(details) = &mut e.details {
            details.insert(detail.into(), json!(done));
        }
    }
    e
}

/// Delete the keys of buckets owned here, send the others to their owners;
/// what each key's delete did, in `keys`' order.
async fn routed_delete(
    store: &OpenStore,
    membership: &Membership,
    keys: &[&str],
    auth: Option<&str>,
) -> Result<Vec<bool>, ApiError> {
    let Some(buckets) = store.named.buckets_of_keys(keys)? else {
        return Ok(store.named.delete(keys).await?);
    };
    // Refused whole before any part is deleted.
    store.named.check_keys(keys)?;
    let owned: std::collections::BTreeSet<u32> = store.named.owned_buckets().into_iter().collect();
    let mut here = Vec::new();
    let mut away: std::collections::BTreeMap<u32, Vec<usize>> = Default::default();
    for (i, bucket) in buckets.iter().enumerate() {
        match owned.contains(bucket) {
            true => here.push(i),
            false => away.entry(*bucket).or_default().push(i),
        }
    }
    membership.check_owners(store, away.keys().copied()).await?;
    let local = async {
        if here.is_empty() {
            return Ok(Vec::new());
        }
        let ours: Vec<&str> = here.iter().map(|i| keys[*i]).collect();
        store
            .named
            .delete(&ours)
            .await
            .map_err(|e| ApiError::from_error(&e))
    };
    let sends = away.iter().map(|(bucket, at)| async move {
        let theirs = at.iter().map(|i| keys[*i].to_string()).collect();
        membership
            .send_delete(store, *bucket, theirs, auth)
            .await
            .map_err(|e| e.into_error())
    });
    let (local, sent) = futures::join!(local, futures::future::join_all(sends));
    let mut done = vec![false; keys.len()];
    let mut failed = None;
    let mut applied = 0;
    match local {
        Ok(local) => {
            applied += here.len();
            for (i, d) in here.iter().zip(local) {
                done[*i] = d;
            }
        }
        Err(e) => failed = Some(e),
    }
    for ((_, at), result) in away.iter().zip(sent) {
        match result {
            Ok(deleted) => {
                applied += at.len();
                for (i, d) in at.iter().zip(deleted) {
                    done[*i] = d.deleted;
                }
            }
            Err(e) => {
                failed.get_or_insert(e);
            }
        }
    }
    match failed {
        None => Ok(done),
        Some(e) => Err(partly_done(e, applied, "deleted_keys", || {
            format!(
                "the deletes of {applied} of the request's {} keys were done by their owners; \
                 sending the whole request again is safe",
                keys.len()
            )
        })),
    }
}

/// Rows `rows` of `batch`.
fn take_rows(
    batch: &arrow_array::RecordBatch,
    rows: &[u32],
) -> Result<arrow_array::RecordBatch, ApiError> {
    let indices = arrow_array::UInt32Array::from(rows.to_vec());
    let columns = batch
        .columns()
        .iter()
        .map(|c| arrow_select::take::take(c.as_ref(), &indices, None))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| ApiError::of_kind(ErrorKind::Internal, format!("taking rows: {e}")))?;
    arrow_array::RecordBatch::try_new(batch.schema(), columns)
        .map_err(|e| ApiError::of_kind(ErrorKind::Internal, format!("taking rows: {e}")))
}

/// An owner's error about the part it was sent: its record numbers made
/// the request's (`rows[i]` is part row `i`).
fn renumbered(mut e: ApiError, rows: &[u32]) -> ApiError {
    let map = |v: &mut Value| {
        if let Some(i) = v.as_u64()
            && let Some(row) = rows.get(i as usize)
        {
            *v = json!(row);
        }
    };
    if let Value::Object(details) = &mut e.details {
        if let Some(v) = details.get_mut("record") {
            map(v);
        }
        if let Some(Value::Array(errors)) = details.get_mut("row_errors") {
            for error in errors {
                if let Some(v) = error.get_mut("record") {
                    map(v);
                }
            }
        }
    }
    e
}

/// Largest page of a list, and most keys of one lookup or delete, unless
/// the configuration says otherwise ([`super::EmbeddedConfig::max_page`]).
pub const MAX_PAGE: usize = 10_000;

/// Most columns one read may name (a schema has tens).
const MAX_COLUMNS: usize = 1_000;

/// Columns a caller names: each once, at most [`MAX_COLUMNS`] (a request
/// must not make the engine project one column millions of times).
fn checked_columns(columns: &[String]) -> Result<(), ApiError> {
    if columns.len() > MAX_COLUMNS {
        return Err(ApiError::invalid(format!(
            "{} columns named; at most {MAX_COLUMNS}",
            columns.len()
        )));
    }
    let mut seen = std::collections::HashSet::with_capacity(columns.len());
    for c in columns {
        if c.is_empty() {
            return Err(ApiError::invalid("columns: an empty column name"));
        }
        if !seen.insert(c.as_str()) {
            return Err(ApiError::invalid(format!("columns: '{c}' is named twice"))
                .with_details(serde_json::json!({"column": c})));
        }
    }
    Ok(())
}

impl Embedded {
    pub(super) async fn add_body(&self, name: &str, body: RecordsBody) -> Result<Added, ApiError> {
        self.add_from(name, body, Origin::default()).await
    }

    /// An add as the server receives it: with scale-out peers, the rows of
    /// buckets other instances own are sent to them (see `members`).
    pub(crate) async fn add_from(
        &self,
        name: &str,
        body: RecordsBody,
        origin: Origin,
    ) -> Result<Added, ApiError> {
        self.on_store(name, Access::Write, move |store| async move {
            let batch = match &body {
                RecordsBody::JsonArray(bytes) => {
                    batch_from_json(store.named.plugin(), bytes, false)?
                }
                RecordsBody::JsonLines(bytes) => {
                    batch_from_json(store.named.plugin(), bytes, true)?
                }
                RecordsBody::Arrow(_) => arrow_batch(&store, body.into_bytes())?,
            };
            let membership = match origin.forwarded {
                // Sent by another instance: written here or refused.
                true => None,
                false => store.membership.get().cloned(),
            };
            let Some(membership) = membership else {
                let now = origin.now_micros.unwrap_or_else(crate::now_micros);
                let outcome = store.named.add_at(&batch, now).await?;
                return Ok(Added {
                    added: outcome.rows,
                });
            };
            routed_add(&store, &membership, &batch, origin.authorization.as_deref()).await
        })
        .await
    }

    pub(super) async fn get_one(&self, name: &str, key: &str) -> Result<Option<Value>, ApiError> {
        let key = key.to_string();
        self.on_store(name, Access::Read, move |store| async move {
            let projection = default_projection(store.named.spec());
            let batch = store
                .named
                .lookup(&[key.as_str()], Some(&projection))
                .await?;
            Ok(to_json(&batch)?.into_iter().next())
        })
        .await
    }

    pub(super) async fn lookup_keys(&self, name: &str, request: GetMany) -> Result<Rows, ApiError> {
        let most = self.config.max_page;
        if request.keys.len() > most {
            return Err(ApiError::invalid(format!("at most {most} keys per lookup")));
        }
        if let Some(columns) = &request.columns {
            checked_columns(columns)?;
        }
        let GetMany {
            keys,
            columns,
            as_of,
        } = request;
        self.on_store(name, Access::read(as_of), move |store| async move {
            let spec = store.named.spec();
            let mut projection = columns.unwrap_or_else(|| default_projection(spec));
            // The key is always there: it says which records were found.
            if !projection.contains(&spec.key) {
                projection.insert(0, spec.key.clone());
            }
            let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
            let batch = store.named.lookup(&keys, Some(&projection)).await?;
            rows(&batch)
        })
        .await
    }

    pub(super) async fn count_rows(
        &self,
        name: &str,
        params: CountParams,
    ) -> Result<Counted, ApiError> {
        let filter = checked_filter(params.filter, self.config.trusted_filters)?;
        self.on_store(name, Access::read(params.as_of), move |store| async move {
            match store.named.count(filter.as_deref()).await {
                Ok(count) => Ok(Counted { count }),
                Err(e) => Err(blame_filter(&store, filter.is_some(), e).await),
            }
        })
        .await
    }

    pub(super) async fn page(&self, name: &str, params: ListParams) -> Result<Page, ApiError> {
        let access = Access::read(params.as_of);
        let plan = PagePlan::of(params, self.config.trusted_filters, self.config.max_page)?;
        self.on_store(
            name,
            access,
            move |store| async move { plan.run(&store).await },
        )
        .await
    }

    pub(super) async fn delete_keys(
        &self,
        name: &str,
        keys: Vec<String>,
    ) -> Result<Vec<Deleted>, ApiError> {
        self.delete_from(name, keys, Origin::default()).await
    }

    /// Deletes as the server receives them: with scale-out peers, the keys
    /// of buckets other instances own are sent to them.
    pub(crate) async fn delete_from(
        &self,
        name: &str,
        keys: Vec<String>,
        origin: Origin,
    ) -> Result<Vec<Deleted>, ApiError> {
        let most = self.config.max_page;
        if keys.len() > most {
            return Err(ApiError::invalid(format!("at most {most} keys per delete")));
        }
        self.on_store(name, Access::Write, move |store| async move {
            // Each key deleted once: a repeat deletes nothing more.
            let mut first = std::collections::HashSet::with_capacity(keys.len());
            let unique: Vec<&str> = keys
                .iter()
                .map(String::as_str)
                .filter(|k| first.insert(*k))
                .collect();
            let membership = match origin.forwarded {
                true => None,
                false => store.membership.get().cloned(),
            };
            let done = match membership {
                Some(membership) if !unique.is_empty() => {
                    routed_delete(
                        &store,
                        &membership,
                        &unique,
                        origin.authorization.as_deref(),
                    )
                    .await?
                }
                _ => store.named.delete(&unique).await?,
            };
            let mut deleted: std::collections::HashMap<&str, bool> =
                unique.into_iter().zip(done).collect();
            Ok(keys
                .iter()
                .map(|key| Deleted {
                    key: key.clone(),
                    deleted: deleted.insert(key.as_str(), false).unwrap_or(false),
                })
                .collect())
        })
        .await
    }

    pub(super) async fn delete_one(&self, name: &str, key: &str) -> Result<Deleted, ApiError> {
        self.delete_one_from(name, key, Origin::default()).await
    }

    /// One delete as the server receives it (routed as [`Self::delete_from`]).
    pub(crate) async fn delete_one_from(
        &self,
        name: &str,
        key: &str,
        origin: Origin,
    ) -> Result<Deleted, ApiError> {
        let mut deleted = self
            .delete_from(name, vec![key.to_string()], origin)
            .await?;
        deleted
            .pop()
            .ok_or_else(|| ApiError::of_kind(ErrorKind::Internal, "a delete answered nothing"))
    }

    pub(crate) async fn upsert_body(
        &self,
        name: &str,
        body: Vec<u8>,
        dry_run: bool,
    ) -> Result<UpsertResult, ApiError> {
        self.on_store(name, Access::Write, move |store| async move {
            needs(&store, Capability::Supersession, "upsert")?;
            let batch = batch_from_json(store.named.plugin(), &body, false)?;
            let outcomes = match dry_run {
                true => store.named.check_upsert(&batch).await?,
                false => store.named.upsert(&batch).await?,
            };
            Ok(UpsertResult {
                dry_run,
                outcomes: outcomes
                    .into_iter()
                    .map(|o| Upserted {
                        id: o.id,
                        inserted: o.inserted,
                        replaced_id: o.replaced_id,
                    })
                    .collect(),
            })
        })
        .await
    }

    pub(super) async fn patch_fields(
        &self,
        name: &str,
        key: &str,
        fields: Value,
    ) -> Result<Patched, ApiError> {
        let key = key.to_string();
        self.on_store(name, Access::Write, move |store| async move {
            needs(&store, Capability::Supersession, "patch")?;
            if !fields.is_object() {
                return Err(ApiError::invalid(
                    "the body must be a JSON object of the fields to change",
                ));
            }
            let array = serde_json::to_vec(&[fields]).unwrap_or_default();
            let full = batch_from_json(store.named.plugin(), &array, false)?;
            // Only the fields given: absent ones are not changes.
            let patch = crate::to_input(store.named.plugin(), &full)?;
            match store
                .named
                .patch(&PatchTarget::Id(key.clone()), &patch)
                .await?
            {
                Some(version) => Ok(Patched {
                    id: version.id,
                    supersedes: key,
                }),
                None => Err(no_record(&store, &key, "visible record")),
            }
        })
        .await
    }
}

/// `not_found` naming the key (`details.key`: the record, not the store,
/// is missing).
pub(super) fn no_record(store: &OpenStore, key: &str, what: &str) -> ApiError {
    ApiError::of_kind(
        ErrorKind::NotFound,
        format!(
            "store '{}' has no {what} with key '{key}'",
            store.named.name()
        ),
    )
    .with_details(json!({"key": key}))
}

/// An Arrow IPC stream: decoded by the bounded decoder (untrusted bytes),
/// matched to the input schema like a Parquet or Arrow file.
fn arrow_batch(store: &OpenStore, bytes: Vec<u8>) -> Result<arrow_array::RecordBatch, ApiError> {
    let decoded = lance_context_wire::decode_with(bytes, &lance_context_wire::Limits::default())
        .map_err(|e| {
            ApiError::invalid(format!(
                "the body is not an acceptable Arrow IPC stream: {e}"
            ))
        })?;
    let batch = arrow_select::concat::concat_batches(&decoded.schema, &decoded.batches)
        .map_err(|e| ApiError::invalid(format!("the Arrow stream: {e}")))?;
    if batch.num_rows() == 0 {
        return Err(ApiError::invalid("no records in the body"));
    }
    Ok(conform(store.named.plugin(), &batch)?)
}

/// Refuse a write the schema's capabilities do not allow, saying why.
fn needs(store: &OpenStore, capability: Capability, what: &str) -> Result<(), ApiError> {
    if store.named.spec().has(capability) {
        return Ok(());
    }
    Err(ApiError::invalid(format!(
        "store '{}' does not declare the {} capability, which {what} needs",
        store.named.name(),
        capability.as_str()
    ))
    .with_details(json!({"capability": capability.as_str()})))
}

/// A list request, checked before the store is touched.
struct PagePlan {
    limit: usize,
    offset: Option<usize>,
    filter: Option<String>,
    order: Vec<SortKey>,
    columns: Option<Vec<String>>,
    cursor: Option<String>,
}

impl PagePlan {
    fn of(params: ListParams, trusted: bool, max_page: usize) -> Result<Self, ApiError> {
        let limit = params.limit.unwrap_or(100);
        if limit == 0 || limit > max_page {
            return Err(ApiError::invalid(format!(
                "limit must be 1..={max_page}, got {limit}"
            )));
        }
        if params.offset.is_some_and(|o| o > 1 << 53) {
            return Err(ApiError::invalid("offset is too large"));
        }
        let order = sort_keys(params.order_by.as_deref())?;
        let cursor = match params.cursor {
            Some(c) => {
                if !order.is_empty() || params.offset.is_some() {
                    return Err(ApiError::invalid(
                        "cursor pages in key order: give neither order_by nor offset with it",
                    ));
                }
                let key = base64::engine::general_purpose::URL_SAFE_NO_PAD
                    .decode(c.as_bytes())
                    .ok()
                    .and_then(|k| String::from_utf8(k).ok())
                    .ok_or_else(|| ApiError::invalid("cursor: not one this server gave"))?;
                Some(key)
            }
            None => None,
        };
        let columns: Option<Vec<String>> = params
            .columns
            .as_deref()
            .map(|c| c.split(',').map(|s| s.trim().to_string()).collect());
        if let Some(columns) = &columns {
            checked_columns(columns)?;
        }
        Ok(Self {
            limit,
            offset: params.offset,
            filter: checked_filter(params.filter, trusted)?,
            order,
            columns,
            cursor,
        })
    }

    async fn run(self, store: &OpenStore) -> Result<Page, ApiError> {
        let key = store.named.spec().key.clone();
        let mut order = self.order;
        // A page as large as the store (a tool reading a whole store where
        // it lies) is one read, in no order unless one is asked for;
        // otherwise pages without an order or offset follow the key.
        let unbounded = self.limit == usize::MAX;
        let paging = order.is_empty() && self.offset.is_none() && !unbounded;
        // Rows equal in the given order are taken in key order: pages by
        // offset in that order neither repeat nor skip a row.
        if (paging || !order.is_empty()) && !order.iter().any(|k| k.column == key) {
            order.push(SortKey::asc(&key));
        }
        let filter = match (self.filter, &self.cursor) {
            // The newline ends a trailing `--` comment of the caller's filter.
            (Some(f), Some(c)) => Some(format!("({f}\n) AND {key} > {}", literal(c))),
            (None, Some(c)) => Some(format!("{key} > {}", literal(c))),
            (f, None) => f,
        };
        let mut projection = self
            .columns
            .unwrap_or_else(|| default_projection(store.named.spec()));
        // The key read for the cursor, and left out of the page when it
        // was not asked for.
        let key_added = paging && !projection.contains(&key);
        if key_added {
            projection.push(key.clone());
        }
        let request = ScanRequest {
            filter,
            projection: Some(projection),
            order_by: order,
            // No bound when the page may be as large as the store.
            limit: (!unbounded).then_some(self.limit),
            offset: self.offset,
            ..ScanRequest::default()
        };
        let batch = match store.named.scan(request.clone()).await {
            Ok(batch) => batch,
            Err(e) => return Err(blame_filter(store, request.filter.is_some(), e).await),
        };
        let next_cursor = (paging && batch.num_rows() == self.limit)
            .then(|| last_string(&batch, &key))
            .flatten()
            .map(|k| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(k.as_bytes()));
        let batch = match batch.schema().index_of(&key) {
            Ok(at) if key_added => {
                let mut batch = batch;
                batch.remove_column(at);
                batch
            }
            _ => batch,
        };
        Ok(Page {
            records: rows(&batch)?,
            next_cursor,
        })
    }
}

fn sort_keys(order_by: Option<&str>) -> Result<Vec<SortKey>, ApiError> {
    let Some(order_by) = order_by.filter(|s| !s.trim().is_empty()) else {
        return Ok(Vec::new());
    };
    order_by
        .split(',')
        .map(|s| match s.trim().split_once(':') {
            None => Ok(SortKey::asc(s.trim())),
            Some((c, "asc")) => Ok(SortKey::asc(c)),
            Some((c, "desc")) => Ok(SortKey::desc(c)),
            Some((_, d)) => Err(ApiError::invalid(format!(
                "order_by: direction must be asc or desc, got '{d}'"
            ))),
        })
        .collect()
}

/// A caller's filter: a plain predicate only (no function calls, casts or
/// subqueries: a request must not make the host run arbitrary SQL), unless
/// the filters are `trusted` ([`super::EmbeddedConfig::trusted_filters`]).
pub(super) fn checked_filter(
    filter: Option<String>,
    trusted: bool,
) -> Result<Option<String>, ApiError> {
    match filter.filter(|f| !f.trim().is_empty()) {
        Some(f) => {
            if !trusted {
                lance_context_store::check_plain_predicate(&f)?;
            }
            Ok(Some(f))
        }
        None => Ok(None),
    }
}

fn literal(s: &str) -> String {
    format!("'{}'", s.replace('\'', "''"))
}

/// A read that failed with a filter: when the store reads fine without
/// it (a one-row scan), the filter is at fault (e.g. `id > 5` on a string
/// column): `invalid_input` naming it, not an internal error.
pub(super) async fn blame_filter(
    store: &OpenStore,
    had_filter: bool,
    e: lance_context_store::Error,
) -> ApiError {
    use lance_context_store::ErrorKind as K;
    if had_filter && matches!(e.kind(), K::Internal | K::Storage) {
        let probe = ScanRequest {
            projection: Some(vec![store.named.spec().key.clone()]),
            limit: Some(1),
            ..ScanRequest::default()
        };
        if store.named.scan(probe).await.is_ok() {
            return ApiError::invalid(format!("the filter cannot be evaluated on this store: {e}"));
        }
    }
    ApiError::from(e)
}
