//! `/api/v1/stores/{name}/records…`, lookup and upsert.

use axum::Json;
use axum::body::Body;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use lance_context_client::{
    Added, CountParams, Counted, DeleteMany, Deleted, DeletedMany, ErrorBody, GetMany, ListParams,
    Page, Patched, Records, RecordsBody, StoreApi as _, UpsertParams, UpsertResult,
};
use serde_json::{Value, json};

use super::{Shared, json_body, read_body};
use crate::ErrorKind;
use crate::server::auth::{Role, authorize};
use crate::server::error::{ApiError, status};

/// An Arrow IPC stream (the bulk form of an add).
#[derive(utoipa::ToSchema)]
#[schema(value_type = String, format = Binary)]
#[allow(dead_code)] // a schema only: bodies are read as bytes
pub(super) struct ArrowStream(Vec<u8>);

/// Where a write came from: the caller's credentials (passed on to the
/// owners of other buckets) and whether another instance sent it.
fn origin(headers: &HeaderMap) -> crate::api::Origin {
    crate::api::Origin {
        authorization: headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string),
        forwarded: headers.contains_key(crate::FORWARDED_HEADER),
        // The sender's time, from another instance only, and only when
        // near this clock (a caller cannot date defaults as it likes).
        now_micros: headers
            .contains_key(crate::FORWARDED_HEADER)
            .then(|| headers.get(crate::NOW_HEADER))
            .flatten()
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<i64>().ok())
            .filter(|t| (t - crate::now_micros()).abs() <= crate::api::members::NOW_SKEW_MICROS),
    }
}

/// The media type, lower case (media types are case-insensitive).
fn content_type(headers: &HeaderMap) -> String {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .map(|v| {
            v.split(';')
                .next()
                .unwrap_or("")
                .trim()
                .to_ascii_lowercase()
        })
        .unwrap_or_else(|| "application/json".into())
}

#[utoipa::path(post, path = "/api/v1/stores/{name}/records", tag = "records", params(("name" = String, Path, description = "the store")), request_body(content((Vec<Object> = "application/json"), (String = "application/x-ndjson"), (ArrowStream = "application/vnd.apache.arrow.stream")), description = "records: a JSON array, JSON Lines, or an Arrow IPC stream"), responses((status = 201, body = Added), (status = 413, description = "body too large", body = ErrorBody), (status = 415, description = "content type", body = ErrorBody), (status = 422, description = "the plugin rejected records (details.row_errors)", body = ErrorBody), (status = 502, description = "the plugin failed", body = ErrorBody)))]
pub(super) async fn add_records(
    State(state): State<Shared>,
    headers: HeaderMap,
    Path(name): Path<String>,
    body: Body,
) -> Result<Response, ApiError> {
    authorize(&state.config.tokens, &headers, Some(&name), Role::Write)?;
    let form: fn(Vec<u8>) -> RecordsBody = match content_type(&headers).as_str() {
        "application/vnd.apache.arrow.stream" => RecordsBody::Arrow,
        "application/x-ndjson" | "application/jsonl" | "application/json-lines" => {
            RecordsBody::JsonLines
        }
        "application/json" | "" => RecordsBody::JsonArray,
        other => {
            return Err(ApiError::new(
                status::UNSUPPORTED_MEDIA_TYPE,
                "invalid_input",
                format!(
                    "content type '{other}': send application/json (an array of records), application/x-ndjson, or application/vnd.apache.arrow.stream"
                ),
            ));
        }
    };
    let bytes = read_body(&state, body).await?;
    let added = state
        .api
        .add_from(&name, form(bytes.to_vec()), origin(&headers))
        .await?;
    Ok((StatusCode::CREATED, Json(added)).into_response())
}

#[utoipa::path(get, path = "/api/v1/stores/{name}/records", tag = "records", params(("name" = String, Path, description = "the store"), ListParams), responses((status = 200, body = Page)))]
pub(super) async fn list_records(
    State(state): State<Shared>,
    headers: HeaderMap,
    Path(name): Path<String>,
    Query(params): Query<ListParams>,
) -> Result<Json<Page>, ApiError> {
    authorize(&state.config.tokens, &headers, Some(&name), Role::Read)?;
    Ok(Json(state.api.list(&name, &params).await?))
}

#[utoipa::path(get, path = "/api/v1/stores/{name}/records/{key}", tag = "records", params(("name" = String, Path, description = "the store"), ("key" = String, Path, description = "the record's key")), responses((status = 200, description = "the record", body = Object)))]
pub(super) async fn get_record(
    State(state): State<Shared>,
    headers: HeaderMap,
    Path((name, key)): Path<(String, String)>,
) -> Result<Json<Value>, ApiError> {
    authorize(&state.config.tokens, &headers, Some(&name), Role::Read)?;
    match state.api.get(&name, &key).await? {
        Some(record) => Ok(Json(record)),
        // `details.key`: the record, not the store, is missing.
        None => Err(ApiError::of_kind(
            ErrorKind::NotFound,
            format!("store '{name}' has no record with key '{key}'"),
        )
        .with_details(json!({"key": key}))),
    }
}

#[utoipa::path(post, path = "/api/v1/stores/{name}/lookup", tag = "records", params(("name" = String, Path, description = "the store")), request_body = GetMany, responses((status = 200, body = Records)))]
pub(super) async fn lookup(
    State(state): State<Shared>,
    headers: HeaderMap,
    Path(name): Path<String>,
    body: Body,
) -> Result<Json<Records>, ApiError> {
    authorize(&state.config.tokens, &headers, Some(&name), Role::Read)?;
    let request: GetMany = json_body(&state, body).await?;
    let records = state.api.lookup(&name, &request).await?;
    Ok(Json(Records { records }))
}

#[utoipa::path(get, path = "/api/v1/stores/{name}/count", tag = "records", params(("name" = String, Path, description = "the store"), CountParams), responses((status = 200, body = Counted)))]
pub(super) async fn count(
    State(state): State<Shared>,
    headers: HeaderMap,
    Path(name): Path<String>,
    Query(params): Query<CountParams>,
) -> Result<Json<Counted>, ApiError> {
    authorize(&state.config.tokens, &headers, Some(&name), Role::Read)?;
    Ok(Json(state.api.count(&name, &params).await?))
}

#[utoipa::path(post, path = "/api/v1/stores/{name}/delete", tag = "records", params(("name" = String, Path, description = "the store")), request_body = DeleteMany, responses((status = 200, description = "what each delete did, in the order given", body = DeletedMany)))]
pub(super) async fn delete_records(
    State(state): State<Shared>,
    headers: HeaderMap,
    Path(name): Path<String>,
    body: Body,
) -> Result<Json<DeletedMany>, ApiError> {
    authorize(&state.config.tokens, &headers, Some(&name), Role::Write)?;
    let request: DeleteMany = json_body(&state, body).await?;
    let deleted = state
        .api
        .delete_from(&name, request.keys, origin(&headers))
        .await?;
    Ok(Json(DeletedMany { deleted }))
}

#[utoipa::path(delete, path = "/api/v1/stores/{name}/records/{key}", tag = "records", params(("name" = String, Path, description = "the store"), ("key" = String, Path, description = "the record's key")), responses((status = 200, body = Deleted)))]
pub(super) async fn delete_record(
    State(state): State<Shared>,
    headers: HeaderMap,
    Path((name, key)): Path<(String, String)>,
) -> Result<Json<Deleted>, ApiError> {
    authorize(&state.config.tokens, &headers, Some(&name), Role::Write)?;
    Ok(Json(
        state
            .api
            .delete_one_from(&name, &key, origin(&headers))
            .await?,
    ))
}

#[utoipa::path(post, path = "/api/v1/stores/{name}/upsert", tag = "records", params(("name" = String, Path, description = "the store"), UpsertParams), request_body(content = Vec<Object>, description = "records to insert or supersede by the secondary key"), responses((status = 200, body = UpsertResult), (status = 422, description = "rejected by the plugin", body = ErrorBody), (status = 502, description = "the plugin failed", body = ErrorBody)))]
pub(super) async fn upsert(
    State(state): State<Shared>,
    headers: HeaderMap,
    Path(name): Path<String>,
    Query(params): Query<UpsertParams>,
    body: Body,
) -> Result<Json<UpsertResult>, ApiError> {
    authorize(&state.config.tokens, &headers, Some(&name), Role::Write)?;
    let bytes = read_body(&state, body).await?;
    let dry_run = params.dry_run.unwrap_or(false);
    Ok(Json(
        state
            .api
            .upsert_body(&name, bytes.to_vec(), dry_run)
            .await?,
    ))
}

#[utoipa::path(patch, path = "/api/v1/stores/{name}/records/{key}", tag = "records", params(("name" = String, Path, description = "the store"), ("key" = String, Path, description = "the record's key")), request_body(content = Object, description = "the fields to change"), responses((status = 200, body = Patched), (status = 409, description = "another version won", body = ErrorBody), (status = 422, description = "rejected by the plugin", body = ErrorBody), (status = 502, description = "the plugin failed", body = ErrorBody)))]
pub(super) async fn patch_record(
    State(state): State<Shared>,
    headers: HeaderMap,
    Path((name, key)): Path<(String, String)>,
    body: Body,
) -> Result<Json<Patched>, ApiError> {
    authorize(&state.config.tokens, &headers, Some(&name), Role::Write)?;
    let bytes = read_body(&state, body).await?;
    let fields: Value = serde_json::from_slice(&bytes)
        .map_err(|e| ApiError::invalid(format!("the body is not JSON: {e}")))?;
    Ok(Json(state.api.patch(&name, &key, &fields).await?))
}
