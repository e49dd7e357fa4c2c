//! The store API: one trait, [`StoreApi`], for every operation on the
//! registry and on a named store, with two implementations — [`Client`]
//! (the REST/JSON server over HTTP) and the host library's embedded
//! implementation (`lance_context_host::Embedded`, the stores of a data
//! root opened in this process). The server's handlers call the embedded
//! implementation and nothing else, and the `lance-context` CLI calls the
//! trait, so a program written against it runs unchanged in process or
//! against a server.
//!
//! Both implementations answer the same values and the same errors: a
//! failure is [`ClientError::Api`] with the HTTP status and the stable
//! `code` the server would send (`invalid_input`, `rejected`, `not_found`,
//! …; see [`ApiError`]) and the same `details` (e.g. `row_errors`). Only a
//! client can also fail with [`ClientError::Transport`] (the request did
//! not reach the server) or [`ClientError::Unexpected`].
//!
//! What is not in the trait: exporting a whole store as one Arrow or
//! Parquet stream, typed as stored (the API's records are JSON: read a
//! store page by page with [`StoreApi::list`] instead); checking an add
//! without writing it and setting refused records aside (`store add
//! --dry-run`, `--reject-file`: they run the plugin record by record where
//! the data root is); and the authoring tools (`plugin check`, `plugin
//! new`). The CLI does those where the data root is.
//!
//! [`Client`]: crate::Client
//! [`ApiError`]: crate::ApiError

use std::future::Future;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use serde_json::value::RawValue;

use crate::{
    Added, AdoptStore, Adopted, ClientError, CompactionReport, CountParams, Counted, CreateStore,
    Deleted, Dropped, GetMany, Indexed, ListParams, MergeReport, Page, Patched, QueryRequest,
    QueryResult, RetrieveRequest, SearchRequest, StoreInfo, StoreStatus, TableVersion,
    UpgradeStore, Upgraded, UpsertResult,
};

/// What every call answers.
pub type ApiResult<T> = std::result::Result<T, ClientError>;

/// Records as one JSON array of objects, kept as the text the store wrote
/// (binary values base64, timestamps RFC 3339): passed through by the
/// server as is, parsed only when asked ([`Rows::values`],
/// [`Rows::parse`]).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Rows(Box<RawValue>);

impl Rows {
    /// Rows from JSON text, an array of objects (the syntax is checked;
    /// the shape is checked when the rows are parsed).
    pub fn from_json(text: String) -> Result<Self, serde_json::Error> {
        Ok(Self(RawValue::from_string(text)?))
    }

    /// Rows from values (each an object).
    pub fn from_values(values: &[Value]) -> Result<Self, serde_json::Error> {
        Self::from_json(serde_json::to_string(values)?)
    }

    /// No rows.
    pub fn empty() -> Self {
        Self(RawValue::from_string("[]".into()).expect("[] is JSON"))
    }

    /// The records as JSON values.
    pub fn values(&self) -> Result<Vec<Value>, serde_json::Error> {
        serde_json::from_str(self.0.get())
    }

    /// The records as `T`s (e.g. a struct of the columns you read).
    pub fn parse<T: DeserializeOwned>(&self) -> Result<Vec<T>, serde_json::Error> {
        serde_json::from_str(self.0.get())
    }

    /// The JSON text.
    pub fn as_json(&self) -> &str {
        self.0.get()
    }
}

impl PartialEq for Rows {
    fn eq(&self, other: &Self) -> bool {
        match (self.values(), other.values()) {
            (Ok(a), Ok(b)) => a == b,
            _ => self.as_json() == other.as_json(),
        }
    }
}

/// The records of an add: the body the server takes, in one of its three
/// forms. Each is decoded and checked the same way by both
/// implementations (a bad record is named by its zero-based index).
#[derive(Debug, Clone, PartialEq)]
pub enum RecordsBody {
    /// A JSON array of record objects (`application/json`).
    JsonArray(Vec<u8>),
    /// JSON Lines: one record object per line (`application/x-ndjson`).
    JsonLines(Vec<u8>),
    /// An Arrow IPC stream (`application/vnd.apache.arrow.stream`).
    Arrow(Vec<u8>),
}

impl RecordsBody {
    /// The body's media type.
    pub fn content_type(&self) -> &'static str {
        match self {
            Self::JsonArray(_) => "application/json",
            Self::JsonLines(_) => "application/x-ndjson",
            Self::Arrow(_) => "application/vnd.apache.arrow.stream",
        }
    }

    /// The bytes.
    pub fn bytes(&self) -> &[u8] {
        match self {
            Self::JsonArray(b) | Self::JsonLines(b) | Self::Arrow(b) => b,
        }
    }

    /// The bytes, owned.
    pub fn into_bytes(self) -> Vec<u8> {
        match self {
            Self::JsonArray(b) | Self::JsonLines(b) | Self::Arrow(b) => b,
        }
    }
}

/// Every operation on the registry and on a named store (see the
/// [module docs](self) for the two implementations and what is left out).
///
/// Writes are durable and visible when they return. Records go in as JSON
/// or Arrow and come out as JSON objects; a store's blob columns are left
/// out of reads unless named (`ListParams::columns`).
pub trait StoreApi: Send + Sync {
    /// The most records one [`Self::list`] page holds, and the most keys
    /// one [`Self::lookup`] or [`Self::delete_many`] takes: 10,000 through
    /// a server; an embedded implementation's own bound.
    fn page_limit(&self) -> usize {
        10_000
    }

    // --- the registry ---

    /// Create a store from a built-in plugin, a plugin component or a
    /// SchemaSpec.
    fn create_store(
        &self,
        create: &CreateStore,
    ) -> impl Future<Output = ApiResult<StoreInfo>> + Send;

    /// Register an existing dataset as store `name` (or, with `dry_run`,
    /// only report whether it fits). A refusal is `invalid_input` with the
    /// report in `details.adopt_report`.
    fn adopt(
        &self,
        name: &str,
        request: &AdoptStore,
    ) -> impl Future<Output = ApiResult<Adopted>> + Send;

    /// The stores (those the caller may see).
    fn list_stores(&self) -> impl Future<Output = ApiResult<Vec<StoreInfo>>> + Send;

    /// One store's registry entry.
    fn describe_store(&self, name: &str) -> impl Future<Output = ApiResult<StoreInfo>> + Send;

    /// Drop a store: its entry and its data (an adoption that did not
    /// finish keeps the data).
    fn drop_store(&self, name: &str) -> impl Future<Output = ApiResult<Dropped>> + Send;

    /// Replace a store's plugin by a new build declaring the same schema
    /// (refused, with the difference, when it declares another, and when it
    /// fails the probe). The store's operations after it run the new
    /// plugin.
    fn upgrade(
        &self,
        name: &str,
        request: &UpgradeStore,
    ) -> impl Future<Output = ApiResult<Upgraded>> + Send;

    // --- records ---

    /// Add records through the store's plugin; a batch with a bad record is
    /// refused whole (`rejected` with `details.row_errors`, or
    /// `invalid_input` naming the record and column).
    fn add_records(
        &self,
        name: &str,
        records: RecordsBody,
    ) -> impl Future<Output = ApiResult<Added>> + Send;

    /// Add records given as JSON objects.
    fn add(&self, name: &str, records: &[Value]) -> impl Future<Output = ApiResult<Added>> + Send {
        let body = serde_json::to_vec(records).map(RecordsBody::JsonArray);
        async move {
            let body = body.map_err(|e| invalid_json(&e))?;
            self.add_records(name, body).await
        }
    }

    /// The record with this key (`None` when there is none).
    fn get(&self, name: &str, key: &str) -> impl Future<Output = ApiResult<Option<Value>>> + Send;

    /// The records with these keys: those that exist, once each.
    fn get_many(&self, name: &str, keys: &[&str]) -> impl Future<Output = ApiResult<Rows>> + Send {
        let request = GetMany::keys(keys);
        async move { self.lookup(name, &request).await }
    }

    /// The records with these keys (at most 10,000), those that exist, once
    /// each: the columns asked for (the key always), at a table version
    /// when one is given.
    fn lookup(&self, name: &str, request: &GetMany)
    -> impl Future<Output = ApiResult<Rows>> + Send;

    /// Records (the newest version of each key) matching a filter, counted.
    fn count(
        &self,
        name: &str,
        params: &CountParams,
    ) -> impl Future<Output = ApiResult<Counted>> + Send;

    /// A page of records: filtered, ordered, projected; pages in key order
    /// follow `next_cursor`.
    fn list(&self, name: &str, params: &ListParams)
    -> impl Future<Output = ApiResult<Page>> + Send;

    /// Delete the record with this key (a tombstone when the schema
    /// declares them).
    fn delete(&self, name: &str, key: &str) -> impl Future<Output = ApiResult<Deleted>> + Send;

    /// Delete the records with these keys (at most 10,000) in one write:
    /// what each delete did, in the order given.
    fn delete_many(
        &self,
        name: &str,
        keys: &[&str],
    ) -> impl Future<Output = ApiResult<Vec<Deleted>>> + Send;

    /// Insert records, or supersede the current version with the same
    /// secondary key; with `dry_run`, what it would do, nothing written.
    fn upsert_records(
        &self,
        name: &str,
        records: &[Value],
        dry_run: bool,
    ) -> impl Future<Output = ApiResult<UpsertResult>> + Send;

    /// [`Self::upsert_records`], written.
    fn upsert(
        &self,
        name: &str,
        records: &[Value],
    ) -> impl Future<Output = ApiResult<UpsertResult>> + Send {
        self.upsert_records(name, records, false)
    }

    /// [`Self::upsert_records`] as a dry run: nothing written.
    fn check_upsert(
        &self,
        name: &str,
        records: &[Value],
    ) -> impl Future<Output = ApiResult<UpsertResult>> + Send {
        self.upsert_records(name, records, true)
    }

    /// A new version of the record with these fields changed.
    fn patch(
        &self,
        name: &str,
        key: &str,
        fields: &Value,
    ) -> impl Future<Output = ApiResult<Patched>> + Send;

    // --- queries ---

    /// Run one of the schema's named queries.
    fn query(
        &self,
        name: &str,
        query: &str,
        args: &[(&str, &str)],
    ) -> impl Future<Output = ApiResult<QueryResult>> + Send {
        let request = QueryRequest {
            args: args
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            as_of: None,
        };
        async move { self.query_with(name, query, &request).await }
    }

    /// Run one of the schema's named queries with its arguments, at a table
    /// version when one is given.
    fn query_with(
        &self,
        name: &str,
        query: &str,
        request: &QueryRequest,
    ) -> impl Future<Output = ApiResult<QueryResult>> + Send;

    /// Nearest neighbours (`_distance`) or best BM25 matches (`_score`).
    fn search(
        &self,
        name: &str,
        request: &SearchRequest,
    ) -> impl Future<Output = ApiResult<Rows>> + Send;

    /// Hybrid retrieval: a vector and a text leg fused by reciprocal rank
    /// fusion.
    fn retrieve(
        &self,
        name: &str,
        request: &RetrieveRequest,
    ) -> impl Future<Output = ApiResult<Rows>> + Send;

    // --- maintenance ---

    /// Fold the write-ahead tier into the base table now.
    fn merge(&self, name: &str) -> impl Future<Output = ApiResult<MergeReport>> + Send;

    /// Compact the base table's fragments now.
    fn compact(&self, name: &str) -> impl Future<Output = ApiResult<CompactionReport>> + Send;

    /// Build the vector index of one column (every declared one when
    /// `None`).
    fn index(
        &self,
        name: &str,
        column: Option<&str>,
    ) -> impl Future<Output = ApiResult<Indexed>> + Send;

    /// The store's state: rows, fragments, pending generations, indexes.
    fn stats(&self, name: &str) -> impl Future<Output = ApiResult<StoreStatus>> + Send;

    /// The base table's kept versions, oldest first (what `as_of` reads).
    fn versions(&self, name: &str) -> impl Future<Output = ApiResult<Vec<TableVersion>>> + Send;
}

/// Records that cannot be written as JSON (a value serde cannot encode).
fn invalid_json(e: &serde_json::Error) -> ClientError {
    ClientError::api(400, "invalid_input", format!("the records: {e}"))
}
