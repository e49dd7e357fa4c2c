//! # lance-context-client
//!
//! The request and response types of the lance-context REST/JSON API
//! (`lance-context serve`, routes under `/api/v1`) — the server is built on
//! the same types — and an async [`Client`] for it.
//!
//! ```no_run
//! # async fn demo() -> Result<(), lance_context_client::ClientError> {
//! use lance_context_client::{Client, CreateStore, StoreApi};
//! let client = Client::new("http://127.0.0.1:8080").with_token("secret");
//! client.create_store(&CreateStore::builtin("runs", "rollout")).await?;
//! client
//!     .add("runs", &[serde_json::json!({"id": "m1", "rollout_id": "r1"})])
//!     .await?;
//! let row = client.get("runs", "m1").await?;
//! # Ok(()) }
//! ```
//!
//! Records are JSON objects: columns by name, binary values as base64
//! strings, timestamps RFC 3339, vectors arrays of the declared dimension.
//! Every error is `{"error": {"code", "message", "details"}}` with the
//! status the server's docs list; [`ClientError::Api`] carries all of it.

#![warn(missing_docs)]

mod api;

use std::collections::BTreeMap;

pub use api::{ApiResult, RecordsBody, Rows, StoreApi};

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// The API's error body: `{"error": {"code", "message", "details"}}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ErrorBody {
    /// The error.
    pub error: ApiError,
}

/// One API error.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ApiError {
    /// A stable code: the error kind (`invalid_input`, `rejected`,
    /// `not_found`, `already_exists`, `conflict`, `busy`, `unavailable`,
    /// `plugin_fault`, `storage`, `corrupt`, `internal`), or
    /// `unauthorized`, `forbidden`, `method_not_allowed`, `payload_too_large`,
    /// `uri_too_long`, `headers_too_large`, `deadline`.
    pub code: String,
    /// What went wrong, for a person.
    pub message: String,
    /// Structured details: e.g. `{"row_errors": [{"record", "column", "code", "message"}]}`.
    #[serde(default, skip_serializing_if = "Value::is_null")]
    #[cfg_attr(feature = "openapi", schema(value_type = Object))]
    pub details: Value,
}

/// `POST /api/v1/stores`: create a store from a built-in plugin, a plugin
/// component (base64), or a SchemaSpec.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct CreateStore {
    /// The store's name.
    pub name: String,
    /// A built-in plugin: `rollout`, `context` or `datagen`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub plugin: Option<String>,
    /// A plugin component's bytes, base64.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub plugin_wasm_base64: Option<String>,
    /// A SchemaSpec (JSON), run by the built-in generic plugin.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<Object>))]
    pub spec: Option<Value>,
    /// Creation parameters for the plugin, by name (JSON values).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[cfg_attr(feature = "openapi", schema(value_type = Object))]
    pub params: BTreeMap<String, Value>,
    /// Where the data goes (default: `<root>/stores/<name>` on the server).
    /// It must be inside a prefix the server allows (`serve
    /// --allow-uri-prefix`; by default the root's `stores/`) and reach no
    /// other store's data, else 400.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uri: Option<String>,
    /// The plugin component's file name, recorded in the pin as
    /// `file:NAME` (default `<store>.wasm`; a file name, not a path: at most
    /// 128 characters, no `/`, `\\` or control characters, not starting
    /// with `.`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub plugin_file_name: Option<String>,
    /// Records the plugin should accept: the probe run before the plugin
    /// is pinned checks its output on them too.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[cfg_attr(feature = "openapi", schema(value_type = Vec<Object>))]
    pub samples: Vec<Value>,
    /// Bucket sharding for scale-out (1 to 1024; default 1, none): the
    /// key is hashed into this many buckets, each written through a shard
    /// of its own, so several servers can write the store at once, each
    /// owning a set of buckets (`serve --owns`). Fixed at create. A schema
    /// with record capabilities cannot be bucketed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub buckets: Option<u32>,
}

impl CreateStore {
    /// A store from a built-in plugin.
    pub fn builtin(name: &str, plugin: &str) -> Self {
        Self {
            name: name.into(),
            plugin: Some(plugin.into()),
            ..Self::default()
        }
    }

    /// A store from a SchemaSpec.
    pub fn spec(name: &str, spec: Value) -> Self {
        Self {
            name: name.into(),
            spec: Some(spec),
            ..Self::default()
        }
    }

    /// With a creation parameter.
    pub fn param(mut self, name: &str, value: Value) -> Self {
        self.params.insert(name.into(), value);
        self
    }
}

/// `POST /api/v1/stores/{name}/adopt`: register an existing dataset (one
/// the previous implementation or plain Lance wrote) as a store. Give at
/// most one of `plugin`, `plugin_wasm_base64`, `spec`; none infers the
/// schema from the dataset.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct AdoptStore {
    /// The dataset's location: inside a prefix the server allows (`serve
    /// --allow-uri-prefix`), reaching no other store's data, else 400.
    pub uri: String,
    /// A built-in plugin: `rollout`, `context` or `datagen`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub plugin: Option<String>,
    /// A plugin component's bytes, base64.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub plugin_wasm_base64: Option<String>,
    /// A SchemaSpec, or the previous GenericStore's schema mapping as it is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<Object>))]
    pub spec: Option<Value>,
    /// Creation parameters for the plugin, by name (JSON values).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[cfg_attr(feature = "openapi", schema(value_type = Object))]
    pub params: BTreeMap<String, Value>,
    /// Report only: nothing registered, replayed or written.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub dry_run: bool,
    /// The plugin component's file name, recorded in the pin as
    /// `file:NAME` (as `CreateStore::plugin_file_name`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub plugin_file_name: Option<String>,
}

impl AdoptStore {
    /// Adopt the dataset at `uri`, inferring its schema.
    pub fn new(uri: &str) -> Self {
        Self {
            uri: uri.into(),
            ..Self::default()
        }
    }
}

/// What an adoption found and did (also in a refusal's
/// `details.adopt_report`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Adopted {
    /// The store name.
    pub store: String,
    /// The dataset's location.
    pub uri: String,
    /// The schema's source: `builtin:<name>`, `spec` or `file:<label>`.
    pub plugin: String,
    /// Why this schema, when it was inferred.
    pub inferred_from: Option<String>,
    /// The plugin's creation parameters, `[name, json]` pairs.
    #[cfg_attr(feature = "openapi", schema(value_type = Vec<Vec<String>>))]
    pub params: Vec<(String, String)>,
    /// Every column of either side.
    pub columns: Vec<AdoptedColumn>,
    /// Keys the base table holds more than once (a conflict; at most 10).
    pub duplicate_keys: Vec<String>,
    /// Whether repeated keys were checked for (not above 50M rows).
    pub duplicates_checked: bool,
    /// No column conflicts and no repeated key.
    pub compatible: bool,
    /// The old writers' shards and their unmerged generations.
    pub shards: Vec<AdoptedShard>,
    /// Rows a read showed before.
    pub rows_before: u64,
    /// Rows a read shows after (absent on a dry run).
    pub rows_after: Option<u64>,
    /// Old generations merged into the base table.
    pub generations_merged: u64,
    /// Superseded records given their back-link (to be, on a dry run).
    pub supersession_links: u64,
    /// The store was registered.
    pub registered: bool,
    /// A dry run.
    pub dry_run: bool,
}

/// One column of an adoption's comparison.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct AdoptedColumn {
    /// The column.
    pub column: String,
    /// Its type in the dataset (absent: not there), `… not null` when required.
    pub dataset: Option<String>,
    /// Its type in the plugin's declaration (absent: not declared).
    pub plugin: Option<String>,
    /// `same`, `missing_nullable` (compatible), or `undeclared`,
    /// `missing_required`, `type_conflict`,
    /// `nullability_conflict`, `key_not_tagged`, `extra_key_tag`,
    /// `blob_encoding` (conflicts).
    pub verdict: String,
    /// What it means.
    pub note: String,
}

/// A MemWAL shard of an adopted dataset.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct AdoptedShard {
    /// The shard id.
    pub shard: String,
    /// Its generations not merged into the base table.
    pub unmerged_generations: u64,
}

/// A store: its registry entry.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct StoreInfo {
    /// The name.
    pub name: String,
    /// `ready` (or `creating` for a create that did not finish).
    pub state: String,
    /// Where its data is.
    pub uri: String,
    /// The pinned plugin.
    pub plugin: PluginInfo,
    /// The schema declaration (SchemaSpec JSON).
    #[cfg_attr(feature = "openapi", schema(value_type = Object))]
    pub spec: Value,
    /// When it was created (RFC 3339).
    pub created_at: String,
    /// The creation parameters, each value JSON (a SchemaSpec store's spec
    /// is in `spec`, not here).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[cfg_attr(feature = "openapi", schema(value_type = Object))]
    pub params: BTreeMap<String, Value>,
    /// The storage option keys given when it was created (values are never
    /// recorded).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub storage_option_keys: Vec<String>,
    /// Whether it was adopted: an existing dataset registered where it is
    /// (dropping it keeps the dataset when the adoption did not finish).
    #[serde(default)]
    pub adopted: bool,
    /// What the probe said about the plugin of a store just created (for
    /// its author; the probe passed). Only in a create's answer.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub probe_warnings: Vec<String>,
}

/// The plugin a store pins.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct PluginInfo {
    /// Its declared name.
    pub name: String,
    /// Its version.
    pub version: String,
    /// Hex sha256 of its component.
    pub sha256: String,
    /// `builtin:NAME`, `spec`, or `file:LABEL`.
    pub source: String,
}

/// `GET /api/v1/stores`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct StoreList {
    /// The stores the caller may see.
    pub stores: Vec<StoreInfo>,
}

/// The answer of an add.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Added {
    /// Records written (durable and visible).
    pub added: usize,
}

/// A page of records (`GET /api/v1/stores/{name}/records`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Page {
    /// The records.
    #[cfg_attr(feature = "openapi", schema(value_type = Vec<Object>))]
    pub records: Rows,
    /// Pass as `cursor` for the next page; absent on the last one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_cursor: Option<String>,
}

/// Records (`POST …/lookup`, search, a named query).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Records {
    /// The records.
    #[cfg_attr(feature = "openapi", schema(value_type = Vec<Object>))]
    pub records: Rows,
}

/// `POST …/lookup`: records by key.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct GetMany {
    /// The keys.
    pub keys: Vec<String>,
    /// The columns to read (default: all but blob columns); the key is
    /// always read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub columns: Option<Vec<String>>,
    /// Read at this table version (as `ListParams::as_of`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub as_of: Option<u64>,
}

impl GetMany {
    /// The records with these keys, default columns, newest data.
    pub fn keys(keys: &[&str]) -> Self {
        Self {
            keys: keys.iter().map(|k| k.to_string()).collect(),
            columns: None,
            as_of: None,
        }
    }
}

/// What a delete did.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Deleted {
    /// The key.
    pub key: String,
    /// Whether a visible record was deleted.
    pub deleted: bool,
}

/// The outcome of one upserted record.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Upserted {
    /// The new record's key.
    pub id: String,
    /// True when no visible record had the secondary key.
    pub inserted: bool,
    /// The key of the record it superseded.
    pub replaced_id: Option<String>,
}

/// `POST …/upsert`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct UpsertResult {
    /// Per record, in input order.
    pub outcomes: Vec<Upserted>,
    /// True when nothing was written (`?dry_run=true`): the outcomes are
    /// what the upsert would do now.
    #[serde(default)]
    pub dry_run: bool,
}

/// `POST …/upsert` query parameters.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::IntoParams))]
#[cfg_attr(feature = "openapi", into_params(parameter_in = Query))]
#[serde(deny_unknown_fields)]
pub struct UpsertParams {
    /// Check the records (the plugin's validate and transform, the
    /// upsert's checks) and report the outcomes without writing anything.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dry_run: Option<bool>,
}

/// `PATCH …/records/{key}`: the new version.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Patched {
    /// The new version's key.
    pub id: String,
    /// The key of the version it superseded.
    pub supersedes: String,
}

/// `POST …/queries/{query}`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct QueryRequest {
    /// The query's arguments by parameter name.
    #[serde(default)]
    pub args: BTreeMap<String, String>,
    /// Run at this table version (as `ListParams::as_of`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub as_of: Option<u64>,
}

/// The answer of a named query: records, or a reducing query's JSON.
#[derive(Debug, Clone, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(untagged)]
pub enum QueryResult {
    /// A reducing query's JSON (e.g. datagen `item_state`).
    Reduced {
        /// The plugin's JSON.
        #[cfg_attr(feature = "openapi", schema(value_type = Object))]
        result: Box<serde_json::value::RawValue>,
    },
    /// The rows of the query.
    Records {
        /// The records.
        #[cfg_attr(feature = "openapi", schema(value_type = Vec<Object>))]
        records: Rows,
    },
}

impl QueryResult {
    /// The records, when the query answers records.
    pub fn records(&self) -> Option<&Rows> {
        match self {
            Self::Records { records } => Some(records),
            Self::Reduced { .. } => None,
        }
    }

    /// The reduced JSON, when the query reduces.
    pub fn reduced(&self) -> Option<Value> {
        match self {
            Self::Reduced { result } => serde_json::from_str(result.get()).ok(),
            Self::Records { .. } => None,
        }
    }
}

impl PartialEq for QueryResult {
    fn eq(&self, other: &Self) -> bool {
        match (self, other) {
            (Self::Records { records: a }, Self::Records { records: b }) => a == b,
            (Self::Reduced { .. }, Self::Reduced { .. }) => self.reduced() == other.reduced(),
            _ => false,
        }
    }
}

// Untagged, by hand: a raw value cannot be read through serde's buffered
// untagged form.
impl<'de> Deserialize<'de> for QueryResult {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        use serde::de::Error as _;
        let value = Value::deserialize(d)?;
        let raw = |v: &Value| serde_json::value::RawValue::from_string(v.to_string());
        match (value.get("result"), value.get("records")) {
            (Some(result), None) => Ok(Self::Reduced {
                result: raw(result).map_err(D::Error::custom)?,
            }),
            (None, Some(records)) => Ok(Self::Records {
                records: Rows::from_json(records.to_string()).map_err(D::Error::custom)?,
            }),
            _ => Err(D::Error::custom(
                "a query's answer has exactly one of `result` and `records`",
            )),
        }
    }
}

/// `POST …/search`: nearest neighbours in a vector column (`vector`), or the
/// best BM25 matches in a text column (`text`); exactly one of the two.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct SearchRequest {
    /// The vector or text column (named explicitly: a store may have several).
    pub column: String,
    /// The query vector, of the column's dimension (a vector search).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vector: Option<Vec<f32>>,
    /// The query text (a full-text search of a declared text column).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
    /// Text search: `or` (any term, the default) or `and` (every term).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub operator: Option<TextOperator>,
    /// How many rows (default 10, at most 10,000).
    #[serde(default = "ten")]
    #[cfg_attr(
        feature = "openapi",
        schema(minimum = 1, maximum = 10000, default = 10)
    )]
    pub k: usize,
    /// SQL predicate applied before ranking.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub filter: Option<String>,
    /// Typed conditions, all of which must hold (with `filter`, if any).
    #[serde(default, rename = "where", skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    /// IVF partitions to probe (vector search).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(minimum = 1))]
    pub nprobes: Option<usize>,
}

/// The first element of `vector` that is not a finite number, as the
/// API's message.
fn non_finite<'a>(what: &str, mut vector: impl Iterator<Item = &'a f32>) -> Option<String> {
    vector
        .position(|v| !v.is_finite())
        .map(|i| format!("{what}: element {i} is not a finite Float32"))
}

impl SearchRequest {
    /// What JSON cannot carry: a query vector element that is not a finite
    /// number (NaN, ±∞). Every implementation refuses it with this message
    /// (`invalid_input`), the client before sending.
    pub fn non_finite(&self) -> Option<String> {
        non_finite("vector", self.vector.iter().flatten())
    }

    /// The `k` nearest rows to `vector` in `column`.
    pub fn vector(column: &str, vector: Vec<f32>, k: usize) -> Self {
        Self {
            column: column.to_string(),
            vector: Some(vector),
            text: None,
            operator: None,
            k,
            filter: None,
            conditions: Vec::new(),
            nprobes: None,
        }
    }

    /// The `k` best BM25 matches of `text` in `column`.
    pub fn text(column: &str, text: &str, k: usize) -> Self {
        Self {
            column: column.to_string(),
            vector: None,
            text: Some(text.to_string()),
            operator: None,
            k,
            filter: None,
            conditions: Vec::new(),
            nprobes: None,
        }
    }
}

/// How the terms of a text query combine.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "lowercase")]
pub enum TextOperator {
    /// Any term matches (ranked by BM25).
    Or,
    /// Every term must match.
    And,
}

/// A typed condition on one column: `column` and exactly one test — `eq`,
/// `in`, a range (`gt`/`gte`/`lt`/`lte`, any of them) or `contains` (an
/// element of a list column, a substring of a text column such as JSON
/// metadata). Values are JSON booleans, numbers or strings; a timestamp
/// column takes an RFC 3339 time or a date.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct Condition {
    /// The column.
    pub column: String,
    /// Equal to this.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<Object>))]
    pub eq: Option<Value>,
    /// One of these.
    #[serde(default, rename = "in", skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<Vec<Object>>))]
    pub one_of: Option<Vec<Value>>,
    /// Greater than this.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<Object>))]
    pub gt: Option<Value>,
    /// At least this.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<Object>))]
    pub gte: Option<Value>,
    /// Less than this.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<Object>))]
    pub lt: Option<Value>,
    /// At most this.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<Object>))]
    pub lte: Option<Value>,
    /// Holds this (list element or substring).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<Object>))]
    pub contains: Option<Value>,
}

impl Condition {
    /// `column = value`.
    pub fn eq(column: &str, value: impl Into<Value>) -> Self {
        Self {
            column: column.to_string(),
            eq: Some(value.into()),
            ..Self::default()
        }
    }

    /// `column` holds `value`.
    pub fn contains(column: &str, value: impl Into<Value>) -> Self {
        Self {
            column: column.to_string(),
            contains: Some(value.into()),
            ..Self::default()
        }
    }
}

/// `POST …/retrieve`: a vector leg and a text leg fused by reciprocal rank
/// fusion. Each hit carries `_rrf_score` and its rank and score in each leg
/// (`_vector_rank`, `_distance`, `_text_rank`, `_score`; null where the leg
/// did not find it).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct RetrieveRequest {
    /// The vector leg.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vector: Option<VectorLeg>,
    /// The text leg.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub text: Option<TextLeg>,
    /// Fused hits returned (default 10, at most 10,000).
    #[serde(default = "ten")]
    #[cfg_attr(
        feature = "openapi",
        schema(minimum = 1, maximum = 10000, default = 10)
    )]
    pub k: usize,
    /// The RRF constant (default 60): a hit's score is the sum over legs of
    /// 1 / (rrf_k + rank).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rrf_k: Option<f32>,
    /// SQL predicate applied in every leg.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub filter: Option<String>,
    /// Typed conditions applied in every leg.
    #[serde(default, rename = "where", skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
}

impl RetrieveRequest {
    /// What JSON cannot carry: a non-finite element of the vector leg, or a
    /// non-finite `rrf_k`. Every implementation refuses it with this message
    /// (`invalid_input`), the client before sending.
    pub fn non_finite(&self) -> Option<String> {
        if let Some(k) = self.rrf_k.filter(|k| !k.is_finite()) {
            return Some(format!("rrf_k must be a finite number ≥ 0, got {k}"));
        }
        non_finite(
            "vector",
            self.vector.iter().flat_map(|leg| leg.vector.iter()),
        )
    }
}

/// The vector leg of a retrieval.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct VectorLeg {
    /// The vector column.
    pub column: String,
    /// The query vector.
    pub vector: Vec<f32>,
    /// Candidates this leg ranks (default: twice the final k, at least 20).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub k: Option<usize>,
}

/// The text leg of a retrieval.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct TextLeg {
    /// The text column.
    pub column: String,
    /// The query text.
    pub text: String,
    /// `or` (default) or `and`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub operator: Option<TextOperator>,
    /// Candidates this leg ranks (default: twice the final k, at least 20).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub k: Option<usize>,
}

fn ten() -> usize {
    10
}

/// A store's state (`GET …/stats`; the CLI's `store status`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct StoreStatus {
    /// Records a scan returns (the newest version of each key).
    pub rows: u64,
    /// Rows in the base table (merged).
    pub rows_in_base: u64,
    /// The base table's version.
    pub version: u64,
    /// Versions kept.
    pub versions: usize,
    /// Fragments of the base table.
    pub fragments: usize,
    /// Fragments below the compaction target.
    pub small_fragments: usize,
    /// Rows written but not merged yet.
    pub unmerged_rows: u64,
    /// Their bytes.
    pub unmerged_bytes: u64,
    /// Bytes of the dataset on disk.
    pub bytes_on_disk: u64,
    /// Shards with unmerged generations.
    pub pending_generations: Vec<PendingShard>,
    /// The base table's indexes.
    pub indexes: Vec<IndexStatus>,
    /// The last failure of background maintenance, if any.
    pub last_background_error: Option<String>,
    /// Background maintenance on the answering instance: `running`,
    /// `paused` (the writer was fenced, or is taking its shard back after a
    /// failed WAL write) or `off`.
    #[serde(default)]
    pub maintenance: String,
    /// Why maintenance is paused or off.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub maintenance_reason: Option<String>,
    /// Each shard's manifest on storage.
    #[serde(default)]
    pub shard_manifests: Vec<ShardManifestStatus>,
    /// Buckets of a bucketed store (`store create --buckets`); 1: none.
    #[serde(default = "one_bucket")]
    pub buckets: u32,
    /// The buckets the instance answering writes (empty without buckets).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub owned_buckets: Vec<u32>,
}

fn one_bucket() -> u32 {
    1
}

/// One shard's manifest on storage: versions kept and their bytes, and the
/// newest version (what every read of the shard's state reads).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ShardManifestStatus {
    /// The shard (a UUID).
    pub shard: String,
    /// The bucket the shard writes, on a bucketed store.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bucket: Option<u32>,
    /// Manifest versions kept.
    pub versions: usize,
    /// Their bytes.
    pub bytes: u64,
    /// The newest version's number.
    pub newest_version: u64,
    /// The newest version's bytes.
    pub newest_bytes: u64,
    /// Generations the newest version lists (only unmerged ones after a merge).
    pub listed_generations: usize,
}

/// A shard's unmerged generations.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct PendingShard {
    /// The shard (a UUID).
    pub shard: String,
    /// Generations not merged yet.
    pub generations: usize,
    /// The bucket the shard writes, on a bucketed store.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bucket: Option<u32>,
}

/// One index of the base table.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct IndexStatus {
    /// Its name.
    pub name: String,
    /// Its kind (e.g. `BTree`, `IVF_PQ`).
    pub kind: String,
    /// The columns it covers.
    pub columns: Vec<String>,
    /// Whether every fragment is indexed.
    pub covers_all_rows: bool,
    /// Fragments written since it was built.
    pub unindexed_fragments: usize,
    /// Segments a search reads (one per extension over new fragments until
    /// a fold or a compaction; 0 from a server that does not report them).
    #[serde(default)]
    pub segments: usize,
}

/// What a merge did (`POST …/merge`; the CLI's `store merge`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct MergeReport {
    /// Generations folded into the base table.
    pub generations_merged: usize,
    /// The newest generation merged.
    pub merged_up_to: Option<u64>,
    /// Rows inserted or replaced in the base table.
    pub rows_upserted: u64,
    /// Keys deleted from it.
    pub keys_deleted: u64,
    /// Commits the merge made.
    pub passes: usize,
    /// The most bytes it held at once.
    pub peak_buffered_bytes: usize,
    /// Merged generations removed afterwards.
    pub generations_removed: usize,
    /// WAL files removed afterwards.
    pub wal_files_removed: usize,
    /// Old versions removed by the retention policy.
    pub versions_removed: u64,
    /// How long it took.
    pub seconds: f64,
    /// Where that time went (absent from servers older than this field).
    #[serde(default)]
    pub phases: MergePhaseSeconds,
}

/// Where a merge's time went, in seconds ([`MergeReport::phases`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct MergePhaseSeconds {
    /// Reading the generations (the newest version of each key, the keys
    /// deleted).
    pub read: f64,
    /// Writing them into the base table (the merge-insert commits).
    pub write: f64,
    /// Carrying the visible count over to the new version (stores with
    /// visibility rules).
    pub count: f64,
    /// Removing what earlier merges left once their grace passed.
    pub cleanup: f64,
    /// Extending the indexes over the new rows.
    pub indexes: f64,
    /// Removing old versions (the retention policy).
    pub retention: f64,
}

/// What a compaction did (`POST …/compact`; the CLI's `store compact`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct CompactionReport {
    /// Fragments rewritten.
    pub fragments_removed: usize,
    /// Fragments written.
    pub fragments_added: usize,
    /// Data files removed.
    pub files_removed: usize,
    /// Data files written.
    pub files_added: usize,
    /// Old versions removed by the retention policy.
    pub versions_removed: u64,
    /// Indexes remapped to the rows' new places (rewritten by this
    /// compaction; an index no moved row is in is left as it is).
    #[serde(default)]
    pub indexes_remapped: usize,
    /// Versions of the fragment-reuse history left: 0 once every index is
    /// remapped (more: an index was not remapped, or another compaction ran
    /// meanwhile; the next compaction retries).
    #[serde(default)]
    pub fragment_reuse_versions: usize,
    /// How long it took.
    pub seconds: f64,
}

/// The columns a `POST …/index` indexed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Indexed {
    /// The vector columns indexed.
    pub indexed: Vec<String>,
    /// Each index built, in the same order.
    #[serde(default)]
    pub indexes: Vec<IndexBuilt>,
}

/// One vector index built by `POST …/index`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct IndexBuilt {
    /// The vector column.
    pub column: String,
    /// How long the build took.
    pub seconds: f64,
    /// Whether it covers every row of the base table. It does not when the
    /// base table had too few rows to train it (it then covers none, and
    /// searches stay exact until a merge brings enough), or when fragments
    /// were written meanwhile (the next merge extends it).
    pub covers_all_rows: bool,
    /// Base-table fragments it does not cover.
    pub unindexed_fragments: u64,
    /// Base-table fragments in all.
    pub fragments: u64,
    /// Rows in the base table.
    pub rows_in_base: u64,
}

/// What `DELETE /api/v1/stores/{name}` removed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Dropped {
    /// The store.
    pub store: String,
    /// Its data's location.
    pub uri: String,
    /// Whether the data was deleted (not for an adoption that did not
    /// finish: the dataset was there before).
    #[serde(default = "deleted_by_default")]
    pub data_deleted: bool,
    /// Whether the store's plugin file was removed (no other store pins
    /// it; built-in plugins and specs have none).
    #[serde(default)]
    pub plugin_file_removed: bool,
}

fn deleted_by_default() -> bool {
    true
}

/// `POST …/index`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct IndexRequest {
    /// The vector column; all declared ones when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub column: Option<String>,
}

/// What `list` reads (`GET …/records` query parameters).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::IntoParams))]
#[cfg_attr(feature = "openapi", into_params(parameter_in = Query))]
pub struct ListParams {
    /// SQL predicate (a plain predicate: columns, literals, comparisons,
    /// AND/OR/NOT, IN, BETWEEN, LIKE, IS NULL).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub filter: Option<String>,
    /// Comma-separated `column` or `column:desc` (not with `cursor`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub order_by: Option<String>,
    /// Comma-separated columns.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub columns: Option<String>,
    /// Page size (default 100, at most 10,000).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", param(minimum = 1, maximum = 10000))]
    pub limit: Option<usize>,
    /// Rows to skip (not with `cursor`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub offset: Option<usize>,
    /// The `next_cursor` of the previous page (pages in key order).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cursor: Option<String>,
    /// Read the base table as it was at this version (`versions` lists
    /// them); rows then in the write-ahead tier are not part of a version.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub as_of: Option<u64>,
}

/// What `count` counts (`GET …/count` query parameters).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::IntoParams))]
#[cfg_attr(feature = "openapi", into_params(parameter_in = Query))]
#[serde(deny_unknown_fields)]
pub struct CountParams {
    /// SQL predicate (as `ListParams::filter`); all records without one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub filter: Option<String>,
    /// Count at this table version (as `ListParams::as_of`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub as_of: Option<u64>,
}

/// The answer of `count`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Counted {
    /// Records (the newest version per key) matching the filter.
    pub count: u64,
}

/// `POST …/upgrade`: a new build of a store's plugin, declaring the same
/// schema (give exactly one of `plugin`, `plugin_wasm_base64`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct UpgradeStore {
    /// A built-in plugin by name (`rollout`, `context`, `datagen`): the
    /// host's own build of it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub plugin: Option<String>,
    /// A plugin component's bytes, base64.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub plugin_wasm_base64: Option<String>,
    /// The component's file name, recorded in the pin as `file:NAME` (as
    /// `CreateStore::plugin_file_name`; default `<store>.wasm`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub plugin_file_name: Option<String>,
    /// Records the new plugin should accept (checked by the probe before it
    /// is pinned).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[cfg_attr(feature = "openapi", schema(value_type = Vec<Object>))]
    pub samples: Vec<Value>,
}

/// A plugin pin: which build a store runs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct PinnedPlugin {
    /// Its declared name.
    pub plugin: String,
    /// Its version.
    pub version: String,
    /// Hex sha256 of its component.
    pub sha256: String,
}

/// The answer of an upgrade.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Upgraded {
    /// The store.
    pub store: String,
    /// The plugin it ran.
    pub from: PinnedPlugin,
    /// The plugin it runs now (the schema is unchanged).
    pub to: PinnedPlugin,
    /// Whether the old plugin's file was removed (no store pins it any more).
    pub removed_plugin_file: bool,
    /// What the probe said about the new plugin (for its author).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub probe_warnings: Vec<String>,
}

/// `POST …/delete`: records to delete by key.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct DeleteMany {
    /// The keys (at most 10,000).
    pub keys: Vec<String>,
}

/// The answer of a delete by keys: one entry per key, in the order given.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct DeletedMany {
    /// What each delete did.
    pub deleted: Vec<Deleted>,
}

/// One kept version of a store's base table.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct TableVersion {
    /// The version (what `as_of` takes).
    pub version: u64,
    /// When it was committed (RFC 3339, UTC).
    pub timestamp: Option<String>,
    /// Whether it is the current version.
    pub current: bool,
}

/// `GET …/versions`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Versions {
    /// The kept versions, oldest first.
    pub versions: Vec<TableVersion>,
}

/// Why a client call failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ClientError {
    /// The server answered with an error.
    #[error("HTTP {status} {}: {}", .error.code, .error.message)]
    Api {
        /// The HTTP status.
        status: u16,
        /// The error body.
        error: ApiError,
    },
    /// The request did not reach the server or its answer was cut.
    #[error("transport: {0}")]
    Transport(#[from] reqwest::Error),
    /// The answer is not what the API documents.
    #[error("unexpected answer (HTTP {status}): {message}")]
    Unexpected {
        /// The HTTP status.
        status: u16,
        /// What was wrong.
        message: String,
    },
}

impl ClientError {
    /// An API error (what the embedded implementation answers, as the
    /// server would).
    pub fn api(status: u16, code: &str, message: impl Into<String>) -> Self {
        Self::Api {
            status,
            error: ApiError {
                code: code.to_string(),
                message: message.into(),
                details: Value::Null,
            },
        }
    }

    /// The HTTP status, when the server answered.
    pub fn status(&self) -> Option<u16> {
        match self {
            Self::Api { status, .. } | Self::Unexpected { status, .. } => Some(*status),
            Self::Transport(e) => e.status().map(|s| s.as_u16()),
        }
    }

    /// The API error code, when the server answered with one.
    pub fn code(&self) -> Option<&str> {
        match self {
            Self::Api { error, .. } => Some(&error.code),
            _ => None,
        }
    }
}

/// An async client of one server.
#[derive(Debug, Clone)]
pub struct Client {
    base: String,
    token: Option<String>,
    http: reqwest::Client,
}

type Result<T> = std::result::Result<T, ClientError>;

/// Path segment escaping (store names and keys may hold any character).
fn seg(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                out.push(b as char)
            }
            _ => out.push_str(&format!("%{b:02X}")),
        }
    }
    out
}

/// A key as a URL path segment. `.` and `..` cannot be one (a URL parser
/// reads them, escaped or not, as path steps), nor can the empty key.
fn key_seg(key: &str) -> Result<String> {
    match path_step(key) {
        true => Err(ClientError::api(
            400,
            "invalid_input",
            format!(
                "the key {key:?} cannot travel in a URL path (a URL reads it as a path step): \
                 read it with get_many (a lookup); it cannot be deleted or patched over HTTP"
            ),
        )),
        false => Ok(seg(key)),
    }
}

/// Whether a URL would read `key` as a path step rather than a segment.
fn path_step(key: &str) -> bool {
    matches!(key, "" | "." | "..")
}

impl Client {
    /// A client of the server at `base` (e.g. `http://127.0.0.1:8080`).
    pub fn new(base: &str) -> Self {
        Self {
            base: base.trim_end_matches('/').to_string(),
            token: None,
            http: reqwest::Client::new(),
        }
    }

    /// Send this bearer token with every request.
    pub fn with_token(mut self, token: &str) -> Self {
        self.token = Some(token.to_string());
        self
    }

    fn url(&self, path: &str) -> String {
        format!("{}/api/v1{path}", self.base)
    }

    fn store(&self, name: &str, rest: &str) -> String {
        self.url(&format!("/stores/{}{rest}", seg(name)))
    }

    fn auth(&self, req: reqwest::RequestBuilder) -> reqwest::RequestBuilder {
        match &self.token {
            Some(t) => req.bearer_auth(t),
            None => req,
        }
    }

    async fn send<T: serde::de::DeserializeOwned>(
        &self,
        req: reqwest::RequestBuilder,
    ) -> Result<T> {
        let response = self.auth(req).send().await?;
        let status = response.status().as_u16();
        let bytes = response.bytes().await?;
        if (200..300).contains(&status) {
            return serde_json::from_slice(&bytes).map_err(|e| ClientError::Unexpected {
                status,
                message: format!(
                    "{e}: {}",
                    String::from_utf8_lossy(&bytes[..bytes.len().min(200)])
                ),
            });
        }
        match serde_json::from_slice::<ErrorBody>(&bytes) {
            Ok(body) => Err(ClientError::Api {
                status,
                error: body.error,
            }),
            Err(_) => Err(ClientError::Unexpected {
                status,
                message: String::from_utf8_lossy(&bytes[..bytes.len().min(200)]).into_owned(),
            }),
        }
    }

    /// `GET /health`.
    pub async fn health(&self) -> Result<Value> {
        self.send(self.http.get(format!("{}/health", self.base)))
            .await
    }

    /// The raw response of any request (tests of malformed bodies).
    pub async fn raw(
        &self,
        method: &str,
        path: &str,
        content_type: &str,
        body: Vec<u8>,
    ) -> Result<(u16, Vec<u8>)> {
        let method = reqwest::Method::from_bytes(method.as_bytes()).map_err(|e| {
            ClientError::Unexpected {
                status: 0,
                message: e.to_string(),
            }
        })?;
        let response = self
            .auth(
                self.http
                    .request(method, format!("{}{path}", self.base))
                    .header("content-type", content_type)
                    .body(body),
            )
            .send()
            .await?;
        let status = response.status().as_u16();
        Ok((status, response.bytes().await?.to_vec()))
    }
}

impl StoreApi for Client {
    async fn create_store(&self, create: &CreateStore) -> Result<StoreInfo> {
        self.send(self.http.post(self.url("/stores")).json(create))
            .await
    }

    async fn adopt(&self, name: &str, request: &AdoptStore) -> Result<Adopted> {
        self.send(self.http.post(self.store(name, "/adopt")).json(request))
            .await
    }

    async fn list_stores(&self) -> Result<Vec<StoreInfo>> {
        let list: StoreList = self.send(self.http.get(self.url("/stores"))).await?;
        Ok(list.stores)
    }

    async fn describe_store(&self, name: &str) -> Result<StoreInfo> {
        self.send(self.http.get(self.store(name, ""))).await
    }

    async fn drop_store(&self, name: &str) -> Result<Dropped> {
        self.send(self.http.delete(self.store(name, ""))).await
    }

    async fn add_records(&self, name: &str, records: RecordsBody) -> Result<Added> {
        self.send(
            self.http
                .post(self.store(name, "/records"))
                .header("content-type", records.content_type())
                .body(records.into_bytes()),
        )
        .await
    }

    async fn get(&self, name: &str, key: &str) -> Result<Option<Value>> {
        if path_step(key) {
            // By a lookup: the key travels in the body.
            let rows = self.get_many(name, &[key]).await?;
            let rows = rows.values().map_err(|e| ClientError::Unexpected {
                status: 200,
                message: format!("the lookup's records: {e}"),
            })?;
            return Ok(rows.into_iter().next());
        }
        match self
            .send(
                self.http
                    .get(self.store(name, &format!("/records/{}", seg(key)))),
            )
            .await
        {
            Ok(v) => Ok(Some(v)),
            Err(ClientError::Api { status: 404, error }) if error.code == "not_found" => {
                if error.details.get("key").is_some() {
                    Ok(None)
                } else {
                    Err(ClientError::Api { status: 404, error })
                }
            }
            Err(e) => Err(e),
        }
    }

    async fn lookup(&self, name: &str, request: &GetMany) -> Result<Rows> {
        let records: Records = self
            .send(self.http.post(self.store(name, "/lookup")).json(request))
            .await?;
        Ok(records.records)
    }

    async fn count(&self, name: &str, params: &CountParams) -> Result<Counted> {
        self.send(self.http.get(self.store(name, "/count")).query(params))
            .await
    }

    async fn list(&self, name: &str, params: &ListParams) -> Result<Page> {
        self.send(self.http.get(self.store(name, "/records")).query(params))
            .await
    }

    async fn delete(&self, name: &str, key: &str) -> Result<Deleted> {
        self.send(
            self.http
                .delete(self.store(name, &format!("/records/{}", key_seg(key)?))),
        )
        .await
    }

    async fn delete_many(&self, name: &str, keys: &[&str]) -> Result<Vec<Deleted>> {
        let body = DeleteMany {
            keys: keys.iter().map(|k| k.to_string()).collect(),
        };
        let done: DeletedMany = self
            .send(self.http.post(self.store(name, "/delete")).json(&body))
            .await?;
        Ok(done.deleted)
    }

    async fn upsert_records(
        &self,
        name: &str,
        records: &[Value],
        dry_run: bool,
    ) -> Result<UpsertResult> {
        let params = UpsertParams {
            dry_run: dry_run.then_some(true),
        };
        self.send(
            self.http
                .post(self.store(name, "/upsert"))
                .query(&params)
                .json(records),
        )
        .await
    }

    async fn patch(&self, name: &str, key: &str, fields: &Value) -> Result<Patched> {
        self.send(
            self.http
                .patch(self.store(name, &format!("/records/{}", key_seg(key)?)))
                .json(fields),
        )
        .await
    }

    async fn query_with(
        &self,
        name: &str,
        query: &str,
        request: &QueryRequest,
    ) -> Result<QueryResult> {
        self.send(
            self.http
                .post(self.store(name, &format!("/queries/{}", seg(query))))
                .json(request),
        )
        .await
    }

    async fn search(&self, name: &str, request: &SearchRequest) -> Result<Rows> {
        if let Some(message) = request.non_finite() {
            return Err(ClientError::api(400, "invalid_input", message));
        }
        let records: Records = self
            .send(self.http.post(self.store(name, "/search")).json(request))
            .await?;
        Ok(records.records)
    }

    async fn retrieve(&self, name: &str, request: &RetrieveRequest) -> Result<Rows> {
        if let Some(message) = request.non_finite() {
            return Err(ClientError::api(400, "invalid_input", message));
        }
        let records: Records = self
            .send(self.http.post(self.store(name, "/retrieve")).json(request))
            .await?;
        Ok(records.records)
    }

    async fn merge(&self, name: &str) -> Result<MergeReport> {
        self.send(self.http.post(self.store(name, "/merge"))).await
    }

    async fn compact(&self, name: &str) -> Result<CompactionReport> {
        self.send(self.http.post(self.store(name, "/compact")))
            .await
    }

    async fn index(&self, name: &str, column: Option<&str>) -> Result<Indexed> {
        let body = IndexRequest {
            column: column.map(str::to_string),
        };
        self.send(self.http.post(self.store(name, "/index")).json(&body))
            .await
    }

    async fn stats(&self, name: &str) -> Result<StoreStatus> {
        self.send(self.http.get(self.store(name, "/stats"))).await
    }

    async fn upgrade(&self, name: &str, request: &UpgradeStore) -> Result<Upgraded> {
        self.send(self.http.post(self.store(name, "/upgrade")).json(request))
            .await
    }

    async fn versions(&self, name: &str) -> Result<Vec<TableVersion>> {
        let versions: Versions = self
            .send(self.http.get(self.store(name, "/versions")))
            .await?;
        Ok(versions.versions)
    }
}
