//! Maintenance and state: merge, compact, index, stats, versions.

use axum::Json;
use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::HeaderMap;
use lance_context_client::{
    CompactionReport, IndexRequest, Indexed, MergeReport, StoreApi as _, StoreStatus, Versions,
};

use super::{Shared, json_body};
use crate::server::auth::{Role, authorize};
use crate::server::error::ApiError;

#[utoipa::path(post, path = "/api/v1/stores/{name}/merge", tag = "admin", params(("name" = String, Path, description = "the store")), responses((status = 200, description = "what the merge did", body = MergeReport)))]
pub(super) async fn merge(
    State(state): State<Shared>,
    headers: HeaderMap,
    Path(name): Path<String>,
) -> Result<Json<MergeReport>, ApiError> {
    authorize(&state.config.tokens, &headers, Some(&name), Role::Admin)?;
    Ok(Json(state.api.merge(&name).await?))
}

#[utoipa::path(post, path = "/api/v1/stores/{name}/compact", tag = "admin", params(("name" = String, Path, description = "the store")), responses((status = 200, description = "what the compaction did", body = CompactionReport)))]
pub(super) async fn compact(
    State(state): State<Shared>,
    headers: HeaderMap,
    Path(name): Path<String>,
) -> Result<Json<CompactionReport>, ApiError> {
    authorize(&state.config.tokens, &headers, Some(&name), Role::Admin)?;
    Ok(Json(state.api.compact(&name).await?))
}

#[utoipa::path(post, path = "/api/v1/stores/{name}/index", tag = "admin", params(("name" = String, Path, description = "the store")), request_body = IndexRequest, responses((status = 200, description = "the columns indexed", body = Indexed)))]
pub(super) async fn index(
    State(state): State<Shared>,
    headers: HeaderMap,
    Path(name): Path<String>,
    body: Body,
) -> Result<Json<Indexed>, ApiError> {
    authorize(&state.config.tokens, &headers, Some(&name), Role::Admin)?;
    let request: IndexRequest = json_body(&state, body).await?;
    Ok(Json(
        state.api.index(&name, request.column.as_deref()).await?,
    ))
}

#[utoipa::path(get, path = "/api/v1/stores/{name}/stats", tag = "admin", params(("name" = String, Path, description = "the store")), responses((status = 200, description = "the store's state", body = StoreStatus)))]
pub(super) async fn stats(
    State(state): State<Shared>,
    headers: HeaderMap,
    Path(name): Path<String>,
) -> Result<Json<StoreStatus>, ApiError> {
    authorize(&state.config.tokens, &headers, Some(&name), Role::Read)?;
    Ok(Json(state.api.stats(&name).await?))
}

#[utoipa::path(get, path = "/api/v1/stores/{name}/versions", tag = "admin", params(("name" = String, Path, description = "the store")), responses((status = 200, description = "the base table's kept versions, oldest first (what `as_of` reads)", body = Versions)))]
pub(super) async fn versions(
    State(state): State<Shared>,
    headers: HeaderMap,
    Path(name): Path<String>,
) -> Result<Json<Versions>, ApiError> {
    authorize(&state.config.tokens, &headers, Some(&name), Role::Read)?;
    Ok(Json(Versions {
        versions: state.api.versions(&name).await?,
    }))
}
