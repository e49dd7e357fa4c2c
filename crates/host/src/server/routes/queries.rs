//! Named queries, search and hybrid retrieval.

use axum::Json;
use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::HeaderMap;
use lance_context_client::{
    ErrorBody, QueryRequest, QueryResult, Records, RetrieveRequest, SearchRequest, StoreApi as _,
};

use super::{Shared, json_body};
use crate::server::auth::{Role, authorize};
use crate::server::error::ApiError;

#[utoipa::path(post, path = "/api/v1/stores/{name}/queries/{query}", tag = "queries", params(("name" = String, Path, description = "the store"), ("query" = String, Path, description = "a named query of the schema")), request_body = QueryRequest, responses((status = 200, body = QueryResult), (status = 502, description = "the plugin failed (a reducing query)", body = ErrorBody)))]
pub(super) async fn query(
    State(state): State<Shared>,
    headers: HeaderMap,
    Path((name, query)): Path<(String, String)>,
    body: Body,
) -> Result<Json<QueryResult>, ApiError> {
    authorize(&state.config.tokens, &headers, Some(&name), Role::Read)?;
    let request: QueryRequest = json_body(&state, body).await?;
    Ok(Json(state.api.query_with(&name, &query, &request).await?))
}

#[utoipa::path(post, path = "/api/v1/stores/{name}/search", tag = "queries", params(("name" = String, Path, description = "the store")), request_body = SearchRequest, responses((status = 200, description = "vector search: rows with `_distance`, nearest first; text search: rows with `_score` (BM25), best first", body = Records)))]
pub(super) async fn search(
    State(state): State<Shared>,
    headers: HeaderMap,
    Path(name): Path<String>,
    body: Body,
) -> Result<Json<Records>, ApiError> {
    authorize(&state.config.tokens, &headers, Some(&name), Role::Read)?;
    let request: SearchRequest = json_body(&state, body).await?;
    let records = state.api.search(&name, &request).await?;
    Ok(Json(Records { records }))
}

#[utoipa::path(post, path = "/api/v1/stores/{name}/retrieve", tag = "queries", params(("name" = String, Path, description = "the store")), request_body = RetrieveRequest, responses((status = 200, description = "hits fused by reciprocal rank fusion, best first, each with `_rrf_score`, `_vector_rank`, `_distance`, `_text_rank` and `_score`", body = Records)))]
pub(super) async fn retrieve(
    State(state): State<Shared>,
    headers: HeaderMap,
    Path(name): Path<String>,
    body: Body,
) -> Result<Json<Records>, ApiError> {
    authorize(&state.config.tokens, &headers, Some(&name), Role::Read)?;
    let request: RetrieveRequest = json_body(&state, body).await?;
    let records = state.api.retrieve(&name, &request).await?;
    Ok(Json(Records { records }))
}
