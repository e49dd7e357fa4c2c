//! The routes under `/api/v1`, `/health` and `/ready`.

use std::future::Future;
use std::sync::Arc;

use axum::Json;
use axum::body::{Body, Bytes};
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use base64::Engine as _;
use lance_context_client::{
    Added, AdoptStore, Adopted, CompactionReport, CreateStore, Deleted, Dropped, ErrorBody,
    GetMany, IndexRequest, Indexed, ListParams, MergeReport, Page, Patched, PluginInfo,
    QueryRequest, QueryResult, Records, RetrieveRequest, SearchRequest, StoreInfo, StoreList,
    StoreStatus, UpsertParams, UpsertResult, Upserted,
};
use lance_context_store::{PatchTarget, ScanRequest, SortKey};
use serde_json::{Value, json};
use tokio::sync::Semaphore;

use super::auth::{Role, authorize};
use super::error::ApiError;
use super::records::{RawRecords, batch_from_json, last_string, to_json};
use super::{AppState, OpenStore};
use crate::spec::{Capability, SchemaSpec};
use crate::{CreateOptions, ErrorKind, SchemaSource, StoreEntry, conform, default_projection};

type Shared = Arc<AppState>;

/// Largest page of `GET …/records`.
const MAX_PAGE: usize = 10_000;

/// Most bytes of header fields (names and values) a request may send
/// (more: 431). hyper refuses a head over its buffer before this runs.
const MAX_HEADER_BYTES: usize = 64 << 10;

/// The API's OpenAPI document and its routes, from the same annotations:
/// every route is in the document by construction.
#[derive(utoipa::OpenApi)]
#[openapi(
    info(
        title = "lance-context",
        description = "Every store of a registry: records through the store's schema plugin, named queries, vector search, maintenance. Errors are {\"error\": {\"code\", \"message\", \"details\"}}."
    ),
    modifiers(&BearerAuth)
)]
struct ApiDoc;

struct BearerAuth;

impl utoipa::Modify for BearerAuth {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(HttpBuilder::new().scheme(HttpAuthScheme::Bearer).build()),
        );
        openapi.security = Some(vec![utoipa::openapi::security::SecurityRequirement::new(
            "bearer",
            Vec::<String>::new(),
        )]);
    }
}

/// The routes and the OpenAPI document describing them.
pub(crate) fn routes() -> (axum::Router<Shared>, utoipa::openapi::OpenApi) {
    use utoipa::OpenApi as _;
    use utoipa_axum::router::OpenApiRouter;
    use utoipa_axum::routes;
    let (router, api) = OpenApiRouter::with_openapi(ApiDoc::openapi())
        .routes(routes!(health))
        .routes(routes!(ready))
        .routes(routes!(list_stores, create_store))
        .routes(routes!(describe_store, drop_store))
        .routes(routes!(adopt_store))
        .routes(routes!(list_records, add_records))
        .routes(routes!(get_record, delete_record, patch_record))
        .routes(routes!(lookup))
        .routes(routes!(upsert))
        .routes(routes!(query))
        .routes(routes!(search))
        .routes(routes!(retrieve))
        .routes(routes!(merge))
        .routes(routes!(compact))
        .routes(routes!(index))
        .routes(routes!(stats))
        .split_for_parts();
    (router, document(api))
}

/// An Arrow IPC stream (the bulk form of an add).
#[derive(utoipa::ToSchema)]
#[schema(value_type = String, format = Binary)]
#[allow(dead_code)] // a schema only: bodies are read as bytes
struct ArrowStream(Vec<u8>);

/// The errors every `/api/v1` route can answer, added to each operation
/// here rather than repeated in every annotation (a route's own errors —
/// 409, 413, 415, 422, 502 — are in its annotation), and the document's
/// own route.
fn document(mut api: utoipa::openapi::OpenApi) -> utoipa::openapi::OpenApi {
    use utoipa::openapi::path::{HttpMethod, OperationBuilder, PathItem};
    use utoipa::openapi::{ContentBuilder, Ref, ResponseBuilder, ResponsesBuilder};
    let error = |description: &str| {
        ResponseBuilder::new()
            .description(description)
            .content(
                "application/json",
                ContentBuilder::new()
                    .schema(Some(Ref::from_schema_name("ErrorBody")))
                    .build(),
            )
            .build()
    };
    let common = [
        ("400", "invalid input: the message says what and where"),
        ("401", "no or unknown token (when the server has tokens)"),
        ("403", "the token's role or stores do not allow this"),
        ("404", "no such store (or record, route)"),
        (
            "408",
            "the request's body did not arrive within the deadline",
        ),
        ("414", "the URI is too long"),
        ("431", "the request's header fields or head are too large"),
        ("500", "an internal or storage error"),
        (
            "503",
            "busy (backpressure, the store's concurrency bound), past the deadline, or unavailable: retry after Retry-After",
        ),
    ];
    for (path, item) in api.paths.paths.iter_mut() {
        if !path.starts_with("/api/v1/") {
            continue;
        }
        for (method_writes, operation) in [
            (false, &mut item.get),
            (true, &mut item.post),
            (true, &mut item.put),
            (true, &mut item.patch),
            (true, &mut item.delete),
        ] {
            let Some(operation) = operation else { continue };
            let mut own: Vec<(&str, &str)> = Vec::new();
            if operation.request_body.is_some() {
                own.push(("413", "the body exceeds the server's limit"));
            }
            // Reads sent as POST (a body of keys, a query, a vector) write nothing.
            let reads = matches!(
                operation.operation_id.as_deref(),
                Some("lookup" | "search" | "retrieve" | "query")
            );
            if method_writes && !reads {
                own.push((
                    "409",
                    "conflict: another writer or a concurrent commit won; retry",
                ));
            }
            for (status, description) in common.into_iter().chain(own) {
                operation
                    .responses
                    .responses
                    .entry(status.to_string())
                    .or_insert_with(|| error(description).into());
            }
        }
    }
    let own = OperationBuilder::new()
        .tag("health")
        .summary(Some("This document (OpenAPI 3.1)"))
        .security(utoipa::openapi::security::SecurityRequirement::default())
        .responses(
            ResponsesBuilder::new()
                .response(
                    "200",
                    ResponseBuilder::new()
                        .description("the API's OpenAPI document")
                        .content("application/json", ContentBuilder::new().build()),
                )
                .build(),
        )
        .build();
    api.paths.paths.insert(
        "/api/v1/openapi.json".into(),
        PathItem::new(HttpMethod::Get, own),
    );
    api
}

pub(crate) fn router(state: Shared) -> axum::Router {
    let (routes, api) = routes();
    let document = std::sync::Arc::new(api);
    routes
        .route(
            "/api/v1/openapi.json",
            get(move || {
                let document = document.clone();
                async move { Json(document.as_ref().clone()) }
            }),
        )
        .fallback(not_found)
        // Bodies are read by the handlers under the configured limit.
        .layer(axum::extract::DefaultBodyLimit::disable())
        // Errors axum answers itself (a wrong method, a query string or path
        // that does not parse) get the API's JSON error body too.
        .layer(axum::middleware::map_response(json_errors))
        .layer(axum::middleware::map_request(bounded_headers))
        .with_state(state)
}

/// A request whose header fields exceed [`MAX_HEADER_BYTES`]: 431.
async fn bounded_headers(
    request: axum::extract::Request,
) -> Result<axum::extract::Request, ApiError> {
    let bytes: usize = request
        .headers()
        .iter()
        .map(|(name, value)| name.as_str().len() + value.len())
        .sum();
    if bytes > MAX_HEADER_BYTES {
        return Err(ApiError::new(
            StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
            "headers_too_large",
            format!(
                "the header fields take {bytes} bytes; at most {MAX_HEADER_BYTES} are accepted"
            ),
        ));
    }
    Ok(request)
}

async fn json_errors(response: Response) -> Response {
    let status = response.status();
    let is_json = response
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/json"));
    if !(status.is_client_error() || status.is_server_error()) || is_json {
        return response;
    }
    let (parts, body) = response.into_parts();
    let text = axum::body::to_bytes(body, 64 << 10)
        .await
        .map(|b| String::from_utf8_lossy(&b).trim().to_string())
        .unwrap_or_default();
    let code = match status {
        StatusCode::METHOD_NOT_ALLOWED => "method_not_allowed",
        StatusCode::NOT_FOUND => "not_found",
        StatusCode::PAYLOAD_TOO_LARGE => "payload_too_large",
        StatusCode::REQUEST_TIMEOUT => "deadline",
        StatusCode::UNAUTHORIZED => "unauthorized",
        StatusCode::FORBIDDEN => "forbidden",
        s if s.is_server_error() => "internal",
        _ => "invalid_input",
    };
    let message = if text.is_empty() {
        status
            .canonical_reason()
            .unwrap_or("error")
            .to_ascii_lowercase()
    } else {
        text
    };
    let mut answer = ApiError::new(status, code, message).into_response();
    for (name, value) in &parts.headers {
        if name != header::CONTENT_TYPE && name != header::CONTENT_LENGTH {
            answer.headers_mut().insert(name.clone(), value.clone());
        }
    }
    answer
}

async fn not_found() -> ApiError {
    ApiError::of_kind(ErrorKind::NotFound, "no such route")
}

#[utoipa::path(get, path = "/health", tag = "health", security(()), responses((status = 200, description = "the server runs", body = Object)))]
async fn health() -> Json<Value> {
    Json(json!({"status": "ok"}))
}

#[utoipa::path(get, path = "/ready", tag = "health", security(()), responses((status = 200, description = "the registry is readable", body = Object), (status = 500, description = "it is not", body = ErrorBody)))]
async fn ready(State(state): State<Shared>) -> Result<Json<Value>, ApiError> {
    let stores = state.registry.list()?.len();
    Ok(Json(json!({"status": "ready", "stores": stores})))
}

/// The body, at most the configured limit (413 beyond).
async fn read_body(state: &Shared, body: Body) -> Result<Bytes, ApiError> {
    // A client that stops sending does not hold the request (or shutdown).
    let read = tokio::time::timeout(
        state.config.request_timeout,
        bounded_body(body, state.config.body_limit),
    )
    .await
    .map_err(|_| {
        ApiError::new(
            StatusCode::REQUEST_TIMEOUT,
            "deadline",
            format!(
                "the body did not arrive within {:?}",
                state.config.request_timeout
            ),
        )
    })?;
    read.map_err(|e| {
        ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "payload_too_large",
            format!(
                "the body exceeds the limit of {} bytes ({e})",
                state.config.body_limit
            ),
        )
    })
}

/// The body if it is at most `limit` bytes. An oversized body is still read
/// (and dropped) up to a bound, so that the client finishes sending and
/// reads the 413 instead of a reset connection.
async fn bounded_body(body: Body, limit: usize) -> Result<Bytes, String> {
    use futures::StreamExt as _;
    let drain_to = limit.saturating_mul(4).clamp(limit, 64 << 20);
    let mut stream = body.into_data_stream();
    let mut kept = Vec::new();
    let mut seen = 0usize;
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.map_err(|e| e.to_string())?;
        seen = seen.saturating_add(chunk.len());
        if seen <= limit {
            kept.extend_from_slice(&chunk);
        } else if seen > drain_to {
            break;
        }
    }
    match seen > limit {
        true => Err(format!("{seen} bytes or more")),
        false => Ok(Bytes::from(kept)),
    }
}

/// A JSON body of type `T` (unknown fields refused where `T` says so).
async fn json_body<T: serde::de::DeserializeOwned>(
    state: &Shared,
    body: Body,
) -> Result<T, ApiError> {
    let bytes = read_body(state, body).await?;
    if bytes.is_empty() {
        return serde_json::from_slice(b"{}")
            .map_err(|e| ApiError::invalid(format!("a JSON body is required: {e}")));
    }
    serde_json::from_slice(&bytes).map_err(|e| ApiError::invalid(format!("the body: {e}")))
}

fn info(entry: StoreEntry) -> StoreInfo {
    let spec = serde_json::to_value(entry.spec_as_written()).unwrap_or(Value::Null);
    StoreInfo {
        name: entry.name,
        state: format!("{:?}", entry.state).to_lowercase(),
        uri: entry.uri,
        plugin: PluginInfo {
            name: entry.plugin.name,
            version: entry.plugin.version,
            sha256: entry.plugin.sha256,
            source: entry.plugin.source,
        },
        spec,
        created_at: entry.created_at,
    }
}

/// The store, opened (with its writer) on first use and kept. The map is
/// locked only to find the store's cell: opening one store does not hold
/// requests to the others.
async fn open(state: &Shared, name: &str) -> Result<Arc<OpenStore>, ApiError> {
    let cell = state
        .stores
        .lock()
        .await
        .entry(name.to_string())
        .or_default()
        .clone();
    let store = cell
        .get_or_try_init(|| async {
            let named = state
                .registry
                .open(name, &state.config.storage_options)
                .await?;
            Ok::<_, ApiError>(Arc::new(OpenStore {
                named,
                slots: Arc::new(Semaphore::new(state.config.store_concurrency)),
            }))
        })
        .await;
    match store {
        Ok(store) => Ok(store.clone()),
        Err(e) => {
            // Not kept: a store that does not exist (yet) is not remembered.
            let mut stores = state.stores.lock().await;
            if stores
                .get(name)
                .is_some_and(|c| Arc::ptr_eq(c, &cell) && c.get().is_none())
            {
                stores.remove(name);
            }
            Err(e)
        }
    }
}

/// Run `work` on store `name`: in a slot of the store (waiting at most the
/// queue wait: 503 `busy`), in a task of its own (a client going away does
/// not cancel it), within the request deadline (503 `deadline`; the task
/// still finishes).
async fn on_store<T, F, Fut>(state: &Shared, name: &str, work: F) -> Result<T, ApiError>
where
    F: FnOnce(Arc<OpenStore>) -> Fut,
    Fut: Future<Output = Result<T, ApiError>> + Send + 'static,
    T: Send + 'static,
{
    let store = open(state, name).await?;
    let permit = tokio::time::timeout(state.config.queue_wait, store.slots.clone().acquire_owned())
        .await
        .map_err(|_| {
            ApiError::of_kind(
                ErrorKind::Busy,
                format!(
                    "store '{name}' is running {} operations; retry later",
                    state.config.store_concurrency
                ),
            )
        })?
        .map_err(|_| ApiError::of_kind(ErrorKind::Unavailable, "the server is shutting down"))?;
    let work = work(store);
    let task = state.tasks.spawn(async move {
        let _slot = permit;
        work.await
    });
    match tokio::time::timeout(state.config.request_timeout, task).await {
        Ok(Ok(result)) => result,
        Ok(Err(e)) => Err(ApiError::of_kind(
            ErrorKind::Internal,
            format!("the operation failed: {e}"),
        )),
        Err(_) => Err(ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "deadline",
            format!(
                "the request ran past its deadline of {:?}; a write still running completes. Re-adding the same keys is safe in a store without unique keys (newest wins); in a store with unique keys a resent add or upsert whose first attempt landed is refused with 409 already_exists: look the ids up first and resend only those not found",
                state.config.request_timeout
            ),
        )),
    }
}

#[utoipa::path(get, path = "/api/v1/stores", tag = "stores", responses((status = 200, body = StoreList)))]
async fn list_stores(
    State(state): State<Shared>,
    headers: HeaderMap,
) -> Result<Json<StoreList>, ApiError> {
    let caller = authorize(&state.config.tokens, &headers, None, Role::Read)?;
    let stores = state
        .registry
        .list()?
        .into_iter()
        .filter(|e| caller.sees(&e.name))
        .map(info)
        .collect();
    Ok(Json(StoreList { stores }))
}

#[utoipa::path(post, path = "/api/v1/stores", tag = "stores", request_body = CreateStore, responses((status = 201, body = StoreInfo), (status = 409, description = "exists", body = ErrorBody), (status = 502, description = "the plugin failed", body = ErrorBody)))]
async fn create_store(
    State(state): State<Shared>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    // The role first: an anonymous caller gets 401 before its body is read.
    authorize(&state.config.tokens, &headers, None, Role::Admin)?;
    // A create's body carries a component (megabytes of base64): parsed
    // and decoded off the async workers, as the load is.
    let create: CreateStore = large_json_body(&state, body).await?;
    authorize(
        &state.config.tokens,
        &headers,
        Some(&create.name),
        Role::Admin,
    )?;
    // A caller of the API goes only where the operator allows.
    if let Some(uri) = &create.uri {
        check_request_uri(&state, uri)?;
    }
    let source = schema_source(
        &create.name,
        create.plugin,
        create.plugin_wasm_base64,
        create.spec,
    )
    .await?
    .ok_or_else(|| ApiError::invalid("give exactly one of plugin, plugin_wasm_base64, spec"))?;
    let mut options = CreateOptions::new(source);
    options.params = create
        .params
        .into_iter()
        .map(|(k, v)| (k, v.to_string()))
        .collect();
    options.uri = create.uri;
    options.storage_options = state.config.storage_options.clone();
    // The registry serialises creates of one name; other stores' requests
    // go on meanwhile.
    let named = state.registry.create(&create.name, options).await?;
    let entry = named.entry().clone();
    let cell = Arc::new(tokio::sync::OnceCell::new_with(Some(Arc::new(OpenStore {
        named,
        slots: Arc::new(Semaphore::new(state.config.store_concurrency)),
    }))));
    state.stores.lock().await.insert(create.name.clone(), cell);
    Ok((StatusCode::CREATED, Json(info(entry))).into_response())
}

/// [`json_body`] parsed off the async workers: a create's or adoption's
/// body may carry a component (megabytes of base64).
async fn large_json_body<T: serde::de::DeserializeOwned + Send + 'static>(
    state: &Shared,
    body: Body,
) -> Result<T, ApiError> {
    let bytes = read_body(state, body).await?;
    tokio::task::spawn_blocking(move || {
        serde_json::from_slice::<T>(&bytes).map_err(|e| ApiError::invalid(format!("the body: {e}")))
    })
    .await
    .map_err(|e| ApiError::of_kind(ErrorKind::Internal, format!("reading the body: {e}")))?
}

/// The schema source of a create or adopt body: at most one of a built-in
/// plugin, a component (base64, decoded off the async workers), a spec;
/// `None` when none is given.
async fn schema_source(
    name: &str,
    plugin: Option<String>,
    plugin_wasm_base64: Option<String>,
    spec: Option<serde_json::Value>,
) -> Result<Option<SchemaSource>, ApiError> {
    Ok(match (plugin, plugin_wasm_base64, spec) {
        (None, None, None) => None,
        (Some(p), None, None) => Some(SchemaSource::Builtin(p)),
        (None, Some(b64), None) => Some(SchemaSource::Plugin {
            label: format!("{name}.wasm"),
            bytes: tokio::task::spawn_blocking(move || {
                base64::engine::general_purpose::STANDARD
                    .decode(b64.as_bytes())
                    .map_err(|e| ApiError::invalid(format!("plugin_wasm_base64: not base64: {e}")))
            })
            .await
            .map_err(|e| {
                ApiError::of_kind(ErrorKind::Internal, format!("decoding the plugin: {e}"))
            })??,
        }),
        (None, None, Some(spec)) => Some(SchemaSource::Spec(
            SchemaSpec::from_json(&spec.to_string()).map_err(ApiError::from)?,
        )),
        _ => {
            return Err(ApiError::invalid(
                "give exactly one of plugin, plugin_wasm_base64, spec",
            ));
        }
    })
}

/// A uri from a request: absolute, and inside the prefixes the operator
/// allows (the registry then keeps it off every other store's data).
fn check_request_uri(state: &Shared, uri: &str) -> Result<(), ApiError> {
    if !uri.contains("://") && !std::path::Path::new(uri).is_absolute() {
        return Err(ApiError::invalid(format!(
            "uri '{uri}': give an absolute path or a URL (a store without uri goes under the data root)"
        )));
    }
    let allowed = state.config.uri_prefixes(state.registry.root());
    crate::check_uri_allowed(uri, &allowed)?;
    Ok(())
}

#[utoipa::path(post, path = "/api/v1/stores/{name}/adopt", tag = "stores", params(("name" = String, Path, description = "the store's new name")), request_body = AdoptStore, responses((status = 201, description = "adopted and registered", body = Adopted), (status = 200, description = "a dry run's report", body = Adopted), (status = 409, description = "exists", body = ErrorBody), (status = 502, description = "the plugin failed", body = ErrorBody)))]
async fn adopt_store(
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
    check_request_uri(&state, &adopt.uri)?;
    let source = schema_source(&name, adopt.plugin, adopt.plugin_wasm_base64, adopt.spec).await?;
    let options = crate::AdoptOptions {
        uri: adopt.uri,
        source,
        params: adopt
            .params
            .into_iter()
            .map(|(k, v)| (k, v.to_string()))
            .collect(),
        storage_options: state.config.storage_options.clone(),
        dry_run: adopt.dry_run,
    };
    let report = state.registry.adopt(&name, options).await?;
    let status = match report.registered {
        true => StatusCode::CREATED,
        false => StatusCode::OK,
    };
    let body: Adopted = serde_json::to_value(&report)
        .and_then(serde_json::from_value)
        .map_err(|e| ApiError::of_kind(ErrorKind::Internal, format!("the report: {e}")))?;
    Ok((status, Json(body)).into_response())
}

#[utoipa::path(get, path = "/api/v1/stores/{name}", tag = "stores", params(("name" = String, Path, description = "the store")), responses((status = 200, body = StoreInfo)))]
async fn describe_store(
    State(state): State<Shared>,
    headers: HeaderMap,
    Path(name): Path<String>,
) -> Result<Json<StoreInfo>, ApiError> {
    authorize(&state.config.tokens, &headers, Some(&name), Role::Read)?;
    Ok(Json(info(state.registry.describe(&name)?)))
}

#[utoipa::path(delete, path = "/api/v1/stores/{name}", tag = "stores", params(("name" = String, Path, description = "the store")), responses((status = 200, description = "dropped: its data and entry", body = Dropped)))]
async fn drop_store(
    State(state): State<Shared>,
    headers: HeaderMap,
    Path(name): Path<String>,
) -> Result<Json<Dropped>, ApiError> {
    authorize(&state.config.tokens, &headers, Some(&name), Role::Admin)?;
    let open = state.stores.lock().await.remove(&name);
    if let Some(open) = open.and_then(|cell| cell.get().cloned()) {
        // Wait for its running operations, then release its writer.
        let _all = open
            .slots
            .acquire_many(state.config.store_concurrency as u32)
            .await;
        open.named.close().await?;
    }
    let report = state
        .registry
        .drop_store(&name, &state.config.storage_options)
        .await?;
    Ok(Json(Dropped {
        store: report.name,
        uri: report.uri,
        data_deleted: report.data_deleted,
    }))
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
async fn add_records(
    State(state): State<Shared>,
    headers: HeaderMap,
    Path(name): Path<String>,
    body: Body,
) -> Result<Response, ApiError> {
    authorize(&state.config.tokens, &headers, Some(&name), Role::Write)?;
    let kind = match content_type(&headers).as_str() {
        "application/vnd.apache.arrow.stream" => Input::Arrow,
        "application/x-ndjson" | "application/jsonl" | "application/json-lines" => Input::Lines,
        "application/json" | "" => Input::Array,
        other => {
            return Err(ApiError::new(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "invalid_input",
                format!(
                    "content type '{other}': send application/json (an array of records), application/x-ndjson, or application/vnd.apache.arrow.stream"
                ),
            ));
        }
    };
    let bytes = read_body(&state, body).await?;
    let added = on_store(&state, &name, move |store| async move {
        let batch = match kind {
            Input::Array => batch_from_json(store.named.plugin(), &bytes, false)?,
            Input::Lines => batch_from_json(store.named.plugin(), &bytes, true)?,
            Input::Arrow => arrow_batch(&store, bytes.to_vec())?,
        };
        let outcome = store.named.add(&batch).await?;
        Ok(Added {
            added: outcome.rows,
        })
    })
    .await?;
    Ok((StatusCode::CREATED, Json(added)).into_response())
}

#[derive(Clone, Copy)]
enum Input {
    Array,
    Lines,
    Arrow,
}

/// An Arrow IPC stream body: decoded by the bounded decoder (untrusted
/// bytes), matched to the input schema like a Parquet or Arrow file.
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
/// subqueries: a request must not make the server run arbitrary SQL).
fn checked_filter(filter: Option<String>) -> Result<Option<String>, ApiError> {
    match filter.filter(|f| !f.trim().is_empty()) {
        Some(f) => {
            lance_context_store::check_plain_predicate(&f)?;
            Ok(Some(f))
        }
        None => Ok(None),
    }
}

fn literal(s: &str) -> String {
    format!("'{}'", s.replace('\'', "''"))
}

#[utoipa::path(get, path = "/api/v1/stores/{name}/records", tag = "records", params(("name" = String, Path, description = "the store"), ListParams), responses((status = 200, body = Page)))]
async fn list_records(
    State(state): State<Shared>,
    headers: HeaderMap,
    Path(name): Path<String>,
    Query(params): Query<ListParams>,
) -> Result<Json<RawRecords>, ApiError> {
    authorize(&state.config.tokens, &headers, Some(&name), Role::Read)?;
    let limit = params.limit.unwrap_or(100);
    if limit == 0 || limit > MAX_PAGE {
        return Err(ApiError::invalid(format!(
            "limit must be 1..={MAX_PAGE}, got {limit}"
        )));
    }
    if params.offset.is_some_and(|o| o > 1 << 53) {
        return Err(ApiError::invalid("offset is too large"));
    }
    let filter = checked_filter(params.filter)?;
    let mut order = sort_keys(params.order_by.as_deref())?;
    let columns: Option<Vec<String>> = params
        .columns
        .as_deref()
        .map(|c| c.split(',').map(|s| s.trim().to_string()).collect());
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
    let offset = params.offset;
    let page = on_store(&state, &name, move |store| async move {
        let key = store.named.spec().key.clone();
        let paging = order.is_empty() && offset.is_none();
        if paging {
            order.push(SortKey::asc(&key));
        }
        let filter = match (&filter, &cursor) {
            // The newline ends a trailing `--` comment of the caller's filter.
            (Some(f), Some(c)) => Some(format!("({f}\n) AND {key} > {}", literal(c))),
            (None, Some(c)) => Some(format!("{key} > {}", literal(c))),
            (f, None) => f.clone(),
        };
        let mut projection = columns.unwrap_or_else(|| default_projection(store.named.spec()));
        if paging && !projection.contains(&key) {
            projection.push(key.clone());
        }
        let request = ScanRequest {
            filter,
            projection: Some(projection),
            order_by: order,
            limit: Some(limit),
            offset,
            ..ScanRequest::default()
        };
        let batch = match store.named.scan(request.clone()).await {
            Ok(batch) => batch,
            Err(e) => return Err(blame_filter(&store, request.filter.is_some(), e).await),
        };
        let next_cursor = (paging && batch.num_rows() == limit)
            .then(|| last_string(&batch, &key))
            .flatten()
            .map(|k| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(k.as_bytes()));
        Ok(RawRecords {
            next_cursor,
            ..RawRecords::of(&batch)?
        })
    })
    .await?;
    Ok(Json(page))
}

#[utoipa::path(get, path = "/api/v1/stores/{name}/records/{key}", tag = "records", params(("name" = String, Path, description = "the store"), ("key" = String, Path, description = "the record's key")), responses((status = 200, description = "the record", body = Object)))]
async fn get_record(
    State(state): State<Shared>,
    headers: HeaderMap,
    Path((name, key)): Path<(String, String)>,
) -> Result<Json<Value>, ApiError> {
    authorize(&state.config.tokens, &headers, Some(&name), Role::Read)?;
    let record = on_store(&state, &name, move |store| async move {
        let projection = default_projection(store.named.spec());
        let batch = store
            .named
            .lookup(&[key.as_str()], Some(&projection))
            .await?;
        match to_json(&batch)?.into_iter().next() {
            Some(r) => Ok(r),
            None => Err(ApiError::of_kind(
                ErrorKind::NotFound,
                format!(
                    "store '{}' has no record with key '{key}'",
                    store.named.name()
                ),
            )
            .with_details(json!({"key": key}))),
        }
    })
    .await?;
    Ok(Json(record))
}

#[utoipa::path(post, path = "/api/v1/stores/{name}/lookup", tag = "records", params(("name" = String, Path, description = "the store")), request_body = GetMany, responses((status = 200, body = Records)))]
async fn lookup(
    State(state): State<Shared>,
    headers: HeaderMap,
    Path(name): Path<String>,
    body: Body,
) -> Result<Json<RawRecords>, ApiError> {
    authorize(&state.config.tokens, &headers, Some(&name), Role::Read)?;
    let request: GetMany = json_body(&state, body).await?;
    if request.keys.len() > MAX_PAGE {
        return Err(ApiError::invalid(format!(
            "at most {MAX_PAGE} keys per lookup"
        )));
    }
    let records = on_store(&state, &name, move |store| async move {
        let projection = default_projection(store.named.spec());
        let keys: Vec<&str> = request.keys.iter().map(String::as_str).collect();
        let batch = store.named.lookup(&keys, Some(&projection)).await?;
        RawRecords::of(&batch)
    })
    .await?;
    Ok(Json(records))
}

#[utoipa::path(delete, path = "/api/v1/stores/{name}/records/{key}", tag = "records", params(("name" = String, Path, description = "the store"), ("key" = String, Path, description = "the record's key")), responses((status = 200, body = Deleted)))]
async fn delete_record(
    State(state): State<Shared>,
    headers: HeaderMap,
    Path((name, key)): Path<(String, String)>,
) -> Result<Json<Deleted>, ApiError> {
    authorize(&state.config.tokens, &headers, Some(&name), Role::Write)?;
    let deleted = on_store(&state, &name, move |store| async move {
        let done = store.named.delete(&[key.as_str()]).await?;
        Ok(Deleted {
            key,
            deleted: done.first().copied().unwrap_or(false),
        })
    })
    .await?;
    Ok(Json(deleted))
}

/// A read that failed with a filter: when the store reads fine without
/// it (a one-row scan), the filter is at fault (e.g. `id > 5` on a string
/// column): 400 naming it, not a server error.
async fn blame_filter(
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

#[utoipa::path(post, path = "/api/v1/stores/{name}/upsert", tag = "records", params(("name" = String, Path, description = "the store"), UpsertParams), request_body(content = Vec<Object>, description = "records to insert or supersede by the secondary key"), responses((status = 200, body = UpsertResult), (status = 422, description = "rejected by the plugin", body = ErrorBody), (status = 502, description = "the plugin failed", body = ErrorBody)))]
async fn upsert(
    State(state): State<Shared>,
    headers: HeaderMap,
    Path(name): Path<String>,
    Query(params): Query<UpsertParams>,
    body: Body,
) -> Result<Json<UpsertResult>, ApiError> {
    authorize(&state.config.tokens, &headers, Some(&name), Role::Write)?;
    let bytes = read_body(&state, body).await?;
    let dry_run = params.dry_run.unwrap_or(false);
    let result = on_store(&state, &name, move |store| async move {
        needs(&store, Capability::Supersession, "upsert")?;
        let batch = batch_from_json(store.named.plugin(), &bytes, false)?;
        let outcomes = if dry_run {
            store.named.check_upsert(&batch).await?
        } else {
            store.named.upsert(&batch).await?
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
    .await?;
    Ok(Json(result))
}

#[utoipa::path(patch, path = "/api/v1/stores/{name}/records/{key}", tag = "records", params(("name" = String, Path, description = "the store"), ("key" = String, Path, description = "the record's key")), request_body(content = Object, description = "the fields to change"), responses((status = 200, body = Patched), (status = 409, description = "another version won", body = ErrorBody), (status = 422, description = "rejected by the plugin", body = ErrorBody), (status = 502, description = "the plugin failed", body = ErrorBody)))]
async fn patch_record(
    State(state): State<Shared>,
    headers: HeaderMap,
    Path((name, key)): Path<(String, String)>,
    body: Body,
) -> Result<Json<Patched>, ApiError> {
    authorize(&state.config.tokens, &headers, Some(&name), Role::Write)?;
    let bytes = read_body(&state, body).await?;
    let patched = on_store(&state, &name, move |store| async move {
        needs(&store, Capability::Supersession, "patch")?;
        let fields: Value = serde_json::from_slice(&bytes)
            .map_err(|e| ApiError::invalid(format!("the body is not JSON: {e}")))?;
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
            None => Err(ApiError::of_kind(
                ErrorKind::NotFound,
                format!(
                    "store '{}' has no visible record with key '{key}'",
                    store.named.name()
                ),
            )
            .with_details(json!({"key": key}))),
        }
    })
    .await?;
    Ok(Json(patched))
}

/// A named query's answer: records, or a reducing query's result.
#[derive(serde::Serialize)]
#[serde(untagged)]
enum QueryAnswer {
    Records(RawRecords),
    Reduced {
        result: Box<serde_json::value::RawValue>,
    },
}

#[utoipa::path(post, path = "/api/v1/stores/{name}/queries/{query}", tag = "queries", params(("name" = String, Path, description = "the store"), ("query" = String, Path, description = "a named query of the schema")), request_body = QueryRequest, responses((status = 200, body = QueryResult), (status = 502, description = "the plugin failed (a reducing query)", body = ErrorBody)))]
async fn query(
    State(state): State<Shared>,
    headers: HeaderMap,
    Path((name, query)): Path<(String, String)>,
    body: Body,
) -> Result<Json<QueryAnswer>, ApiError> {
    authorize(&state.config.tokens, &headers, Some(&name), Role::Read)?;
    let request: QueryRequest = json_body(&state, body).await?;
    let result = on_store(&state, &name, move |store| async move {
        let args: Vec<(String, String)> = request.args.into_iter().collect();
        let reduces = store
            .named
            .spec()
            .queries
            .iter()
            .any(|q| q.name == query && q.reduce);
        if reduces {
            // Valid JSON by construction (the host parsed the plugin's output).
            let result = store.named.reduce(&query, &args).await?;
            return Ok(QueryAnswer::Reduced { result });
        }
        let batch = store.named.query(&query, &args).await?;
        Ok(QueryAnswer::Records(RawRecords::of(&batch)?))
    })
    .await?;
    Ok(Json(result))
}

#[utoipa::path(post, path = "/api/v1/stores/{name}/search", tag = "queries", params(("name" = String, Path, description = "the store")), request_body = SearchRequest, responses((status = 200, description = "vector search: rows with `_distance`, nearest first; text search: rows with `_score` (BM25), best first", body = Records)))]
async fn search(
    State(state): State<Shared>,
    headers: HeaderMap,
    Path(name): Path<String>,
    body: Body,
) -> Result<Json<RawRecords>, ApiError> {
    authorize(&state.config.tokens, &headers, Some(&name), Role::Read)?;
    let mut request: SearchRequest = json_body(&state, body).await?;
    request.filter = checked_filter(request.filter)?;
    if let Some(i) = request.vector.iter().flatten().position(|v| !v.is_finite()) {
        return Err(ApiError::invalid(format!(
            "vector: element {i} is not a finite Float32"
        )));
    }
    let records = on_store(&state, &name, move |store| async move {
        let had_filter = request.filter.is_some() || !request.conditions.is_empty();
        match crate::search::search(&store.named, request).await {
            Ok(batch) => RawRecords::of(&batch),
            Err(e) => Err(blame_filter(&store, had_filter, e).await),
        }
    })
    .await?;
    Ok(Json(records))
}

#[utoipa::path(post, path = "/api/v1/stores/{name}/retrieve", tag = "queries", params(("name" = String, Path, description = "the store")), request_body = RetrieveRequest, responses((status = 200, description = "hits fused by reciprocal rank fusion, best first, each with `_rrf_score`, `_vector_rank`, `_distance`, `_text_rank` and `_score`", body = Records)))]
async fn retrieve(
    State(state): State<Shared>,
    headers: HeaderMap,
    Path(name): Path<String>,
    body: Body,
) -> Result<Json<RawRecords>, ApiError> {
    authorize(&state.config.tokens, &headers, Some(&name), Role::Read)?;
    let mut request: RetrieveRequest = json_body(&state, body).await?;
    request.filter = checked_filter(request.filter)?;
    if let Some(i) = request
        .vector
        .iter()
        .flat_map(|leg| leg.vector.iter())
        .position(|v| !v.is_finite())
    {
        return Err(ApiError::invalid(format!(
            "vector: element {i} is not a finite Float32"
        )));
    }
    let records = on_store(&state, &name, move |store| async move {
        let had_filter = request.filter.is_some() || !request.conditions.is_empty();
        match crate::search::retrieve(&store.named, request).await {
            Ok(batch) => RawRecords::of(&batch),
            Err(e) => Err(blame_filter(&store, had_filter, e).await),
        }
    })
    .await?;
    Ok(Json(records))
}

#[utoipa::path(post, path = "/api/v1/stores/{name}/merge", tag = "admin", params(("name" = String, Path, description = "the store")), responses((status = 200, description = "what the merge did", body = MergeReport)))]
async fn merge(
    State(state): State<Shared>,
    headers: HeaderMap,
    Path(name): Path<String>,
) -> Result<Json<MergeReport>, ApiError> {
    authorize(&state.config.tokens, &headers, Some(&name), Role::Admin)?;
    let report = on_store(&state, &name, |store| async move {
        let t = std::time::Instant::now();
        let s = store.named.merge().await?;
        Ok(crate::merge_report(&s, t.elapsed().as_secs_f64()))
    })
    .await?;
    Ok(Json(report))
}

#[utoipa::path(post, path = "/api/v1/stores/{name}/compact", tag = "admin", params(("name" = String, Path, description = "the store")), responses((status = 200, description = "what the compaction did", body = CompactionReport)))]
async fn compact(
    State(state): State<Shared>,
    headers: HeaderMap,
    Path(name): Path<String>,
) -> Result<Json<CompactionReport>, ApiError> {
    authorize(&state.config.tokens, &headers, Some(&name), Role::Admin)?;
    let report = on_store(&state, &name, |store| async move {
        let t = std::time::Instant::now();
        let s = store.named.compact().await?;
        Ok(crate::compaction_report(&s, t.elapsed().as_secs_f64()))
    })
    .await?;
    Ok(Json(report))
}

#[utoipa::path(post, path = "/api/v1/stores/{name}/index", tag = "admin", params(("name" = String, Path, description = "the store")), request_body = IndexRequest, responses((status = 200, description = "the columns indexed", body = Indexed)))]
async fn index(
    State(state): State<Shared>,
    headers: HeaderMap,
    Path(name): Path<String>,
    body: Body,
) -> Result<Json<Indexed>, ApiError> {
    authorize(&state.config.tokens, &headers, Some(&name), Role::Admin)?;
    let request: IndexRequest = json_body(&state, body).await?;
    let built = on_store(&state, &name, move |store| async move {
        let columns: Vec<String> = match request.column {
            Some(c) => vec![c],
            None => store
                .named
                .spec()
                .vectors
                .iter()
                .map(|v| v.column.clone())
                .collect(),
        };
        if columns.is_empty() {
            return Err(ApiError::invalid(format!(
                "store '{}' declares no vector column to index",
                store.named.name()
            )));
        }
        for column in &columns {
            store.named.build_vector_index(column).await?;
        }
        Ok(Indexed { indexed: columns })
    })
    .await?;
    Ok(Json(built))
}

#[utoipa::path(get, path = "/api/v1/stores/{name}/stats", tag = "admin", params(("name" = String, Path, description = "the store")), responses((status = 200, description = "the store's state", body = StoreStatus)))]
async fn stats(
    State(state): State<Shared>,
    headers: HeaderMap,
    Path(name): Path<String>,
) -> Result<Json<StoreStatus>, ApiError> {
    authorize(&state.config.tokens, &headers, Some(&name), Role::Read)?;
    let status = on_store(&state, &name, |store| async move {
        let s = store.named.stats().await?;
        let rows = store.named.count(None).await?;
        Ok(crate::store_status(&s, rows))
    })
    .await?;
    Ok(Json(status))
}
