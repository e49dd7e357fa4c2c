//! The routes under `/api/v1`, `/health` and `/ready`: one module per
//! resource (stores, records, queries, admin). Each handler authorises the
//! caller, reads the request, calls the embedded store API
//! ([`crate::Embedded`]) and answers its value or error; nothing else.

mod admin;
mod queries;
mod records;
mod stores;

use std::sync::Arc;

use axum::Json;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use lance_context_client::ErrorBody;
use serde_json::{Value, json};

use super::AppState;
use super::error::ApiError;
use crate::ErrorKind;

use admin::*;
use queries::*;
use records::*;
use stores::*;

type Shared = Arc<AppState>;

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
        .routes(routes!(upgrade_store))
        .routes(routes!(list_records, add_records))
        .routes(routes!(get_record, delete_record, patch_record))
        .routes(routes!(lookup))
        .routes(routes!(count))
        .routes(routes!(delete_records))
        .routes(routes!(upsert))
        .routes(routes!(query))
        .routes(routes!(search))
        .routes(routes!(retrieve))
        .routes(routes!(merge))
        .routes(routes!(compact))
        .routes(routes!(index))
        .routes(routes!(stats))
        .routes(routes!(versions))
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

#[utoipa::path(get, path = "/ready", tag = "health", security(()), responses((status = 200, description = "the registry is readable (and, with --advertise, every store was opened once)", body = Object), (status = 500, description = "it is not", body = ErrorBody), (status = 503, description = "a scale-out instance still opening its stores", body = ErrorBody)))]
async fn ready(State(state): State<Shared>) -> Result<Json<Value>, ApiError> {
    if !state.opened.load(std::sync::atomic::Ordering::Acquire) {
        return Err(ApiError::of_kind(
            ErrorKind::Unavailable,
            "opening the stores (claiming this instance's buckets)",
        ));
    }
    let stores = state.api.registry().list()?.len();
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

/// Why a body was not read whole.
#[derive(Debug, thiserror::Error)]
enum BodyTooLarge {
    /// More than the limit: this many bytes or more.
    #[error("{0} bytes or more")]
    Over(usize),
    /// The body stopped arriving (the connection failed).
    #[error("{0}")]
    Cut(String),
}

/// The body if it is at most `limit` bytes. An oversized body is still read
/// (and dropped) up to a bound, so that the client finishes sending and
/// reads the 413 instead of a reset connection.
async fn bounded_body(body: Body, limit: usize) -> Result<Bytes, BodyTooLarge> {
    use futures::StreamExt as _;
    let drain_to = limit.saturating_mul(4).clamp(limit, 64 << 20);
    let mut stream = body.into_data_stream();
    let mut kept = Vec::new();
    let mut seen = 0usize;
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.map_err(|e| BodyTooLarge::Cut(e.to_string()))?;
        seen = seen.saturating_add(chunk.len());
        if seen <= limit {
            kept.extend_from_slice(&chunk);
        } else if seen > drain_to {
            break;
        }
    }
    match seen > limit {
        true => Err(BodyTooLarge::Over(seen)),
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

/// A body that must be one of a handler's declared request types, parsed
/// off the async workers (a create's or adoption's body may carry a
/// component: megabytes of base64).
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
