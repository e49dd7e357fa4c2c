//! `/api/v1/stores` and `/api/v1/stores/{name}`: the registry (create,
//! adopt, list, describe, drop, upgrade).

use axum::Json;
use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use lance_context_client::{
    AdoptStore, Adopted, CreateStore, Dropped, ErrorBody, StoreApi as _, StoreInfo, StoreList,
    UpgradeStore, Upgraded,
};

use super::{Shared, large_json_body};
use crate::server::auth::{Role, authorize};
use crate::server::error::ApiError;

#[utoipa::path(get, path = "/api/v1/stores", tag = "stores", responses((status = 200, body = StoreList)))]
pub(super) async fn list_stores(
    State(state): State<Shared>,
    headers: HeaderMap,
) -> Result<Json<StoreList>, ApiError> {
    let caller = authorize(&state.config.tokens, &headers, None, Role::Read)?;
    let stores = state
        .api
        .list_stores()
        .await?
        .into_iter()
        .filter(|e| caller.sees(&e.name))
        .collect();
    Ok(Json(StoreList { stores }))
}

#[utoipa::path(post, path = "/api/v1/stores", tag = "stores", request_body = CreateStore, responses((status = 201, body = StoreInfo), (status = 409, description = "exists", body = ErrorBody), (status = 502, description = "the plugin failed", body = ErrorBody)))]
pub(super) async fn create_store(
    State(state): State<Shared>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    // The role first: an anonymous caller gets 401 before its body is read.
    authorize(&state.config.tokens, &headers, None, Role::Admin)?;
    let create: CreateStore = large_json_body(&state, body).await?;
    authorize(
        &state.config.tokens,
        &headers,
        Some(&create.name),
        Role::Admin,
    )?;
    let info = state.api.create_store(&create).await?;
    Ok((StatusCode::CREATED, Json(info)).into_response())
}

#[utoipa::path(post, path = "/api/v1/stores/{name}/adopt", tag = "stores", params(("name" = String, Path, description = "the store's new name")), request_body = AdoptStore, responses((status = 201, description = "adopted and registered", body = Adopted), (status = 200, description = "a dry run's report", body = Adopted), (status = 409, description = "exists", body = ErrorBody), (status = 502, description = "the plugin failed", body = ErrorBody)))]
pub(super) async fn adopt_store(
    State(state): State<Shared>,
    headers: HeaderMap,
    Path(name): Path<String>,
    body: Body,
) -> Result<Response, ApiError> {
    let caller = authorize(&state.config.tokens, &headers, Some(&name), Role::Admin)?;
    // Adopting reaches data that is no store's yet (any dataset under the
    // allowed prefixes), and a drop would then delete it: not for a token
    // limited to named stores.
    if caller.is_scoped() {
        return Err(ApiError::new(
            StatusCode::FORBIDDEN,
            "forbidden",
            "adopting a dataset needs an admin token not limited to named stores (it reaches data that is no store's yet)",
        ));
    }
    let adopt: AdoptStore = large_json_body(&state, body).await?;
    let report = state.api.adopt(&name, &adopt).await?;
    let status = match report.registered {
        true => StatusCode::CREATED,
        false => StatusCode::OK,
    };
    Ok((status, Json(report)).into_response())
}

#[utoipa::path(get, path = "/api/v1/stores/{name}", tag = "stores", params(("name" = String, Path, description = "the store")), responses((status = 200, body = StoreInfo)))]
pub(super) async fn describe_store(
    State(state): State<Shared>,
    headers: HeaderMap,
    Path(name): Path<String>,
) -> Result<Json<StoreInfo>, ApiError> {
    authorize(&state.config.tokens, &headers, Some(&name), Role::Read)?;
    Ok(Json(state.api.describe_store(&name).await?))
}

#[utoipa::path(delete, path = "/api/v1/stores/{name}", tag = "stores", params(("name" = String, Path, description = "the store")), responses((status = 200, description = "dropped: its data and entry", body = Dropped)))]
pub(super) async fn drop_store(
    State(state): State<Shared>,
    headers: HeaderMap,
    Path(name): Path<String>,
) -> Result<Json<Dropped>, ApiError> {
    authorize(&state.config.tokens, &headers, Some(&name), Role::Admin)?;
    Ok(Json(state.api.drop_store(&name).await?))
}

#[utoipa::path(post, path = "/api/v1/stores/{name}/upgrade", tag = "stores", params(("name" = String, Path, description = "the store")), request_body = UpgradeStore, responses((status = 200, description = "the store runs the new plugin", body = Upgraded), (status = 502, description = "the new plugin failed", body = ErrorBody)))]
pub(super) async fn upgrade_store(
    State(state): State<Shared>,
    headers: HeaderMap,
    Path(name): Path<String>,
    body: Body,
) -> Result<Json<Upgraded>, ApiError> {
    // The role first: an anonymous caller gets 401 before its body is read.
    authorize(&state.config.tokens, &headers, Some(&name), Role::Admin)?;
    let request: UpgradeStore = large_json_body(&state, body).await?;
    Ok(Json(state.api.upgrade(&name, &request).await?))
}
