//! The API's errors: `{"error": {"code", "message", "details"}}`, the status
//! mapped in one place from the host's [`ErrorKind`].

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use lance_context_client::{ApiError as Body, ErrorBody};
use serde_json::{Value, json};

use crate::{ErrorKind, PipelineError, PluginError, error_kind};

/// An error answer.
#[derive(Debug)]
pub(crate) struct ApiError {
    pub status: StatusCode,
    pub code: String,
    pub message: String,
    pub details: Value,
}

/// The HTTP status of each error kind (docs/server.md lists them).
pub(crate) fn status(kind: ErrorKind) -> StatusCode {
    match kind {
        ErrorKind::InvalidInput => StatusCode::BAD_REQUEST,
        ErrorKind::Rejected => StatusCode::UNPROCESSABLE_ENTITY,
        ErrorKind::NotFound => StatusCode::NOT_FOUND,
        ErrorKind::AlreadyExists | ErrorKind::Conflict => StatusCode::CONFLICT,
        ErrorKind::Busy | ErrorKind::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
        ErrorKind::PluginFault => StatusCode::BAD_GATEWAY,
        _ => StatusCode::INTERNAL_SERVER_ERROR,
    }
}

impl ApiError {
    pub fn new(status: StatusCode, code: &str, message: impl Into<String>) -> Self {
        Self {
            status,
            code: code.to_string(),
            message: message.into(),
            details: Value::Null,
        }
    }

    pub fn of_kind(kind: ErrorKind, message: impl Into<String>) -> Self {
        Self::new(status(kind), kind.as_str(), message)
    }

    pub fn invalid(message: impl Into<String>) -> Self {
        Self::of_kind(ErrorKind::InvalidInput, message)
    }

    pub fn with_details(mut self, details: Value) -> Self {
        self.details = details;
        self
    }

    /// Any typed error of the host or engine, by its kind; plugin row
    /// errors go into `details.row_errors` (`record` is the zero-based index
    /// in the request).
    pub fn from_error(err: &(dyn std::error::Error + 'static)) -> Self {
        let kind = error_kind(err);
        let mut e = Self::of_kind(kind, full_message(err));
        let mut next = Some(err);
        while let Some(cause) = next {
            let rows = cause
                .downcast_ref::<PluginError>()
                .and_then(PluginError::row_errors)
                .or_else(|| match cause.downcast_ref::<PipelineError>() {
                    Some(PipelineError::Plugin(p)) => p.row_errors(),
                    _ => None,
                });
            if let Some(rows) = rows {
                e.details = json!({"row_errors": rows.iter().map(|r| json!({
                    "record": r.row,
                    "column": r.column,
                    "code": r.code,
                    "message": r.message,
                })).collect::<Vec<_>>()});
                break;
            }
            if let Some(PipelineError::InvalidInput { column, row, .. }) =
                cause.downcast_ref::<PipelineError>()
            {
                e.details = json!({"record": row, "column": column});
                break;
            }
            // The engine's refusal of one record (a key that exists, a
            // repeat in the request): which record and column.
            let store_error = match cause.downcast_ref::<PipelineError>() {
                Some(PipelineError::Store(e)) => Some(e),
                _ => cause.downcast_ref::<lance_context_store::Error>(),
            };
            if let Some(problem) = store_error.and_then(lance_context_store::Error::batch_problem)
                && let Some(row) = problem.row()
            {
                e.details = json!({"record": row, "column": problem.column()});
                break;
            }
            // An adoption refused: the whole column-by-column report.
            if let Some(crate::RegistryError::AdoptRefused { report, .. }) =
                cause.downcast_ref::<crate::RegistryError>()
            {
                e.details = json!({ "adopt_report": report });
                break;
            }
            // Every refused record (the first listed in `record`/`column`).
            if let Some(PipelineError::InvalidRecords { problems, total }) =
                cause.downcast_ref::<PipelineError>()
            {
                let first = problems.first();
                e.details = json!({
                    "record": first.map(|p| p.row),
                    "column": first.and_then(|p| p.column.clone()),
                    "input_errors": problems.iter().map(|p| json!({
                        "record": p.row,
                        "column": p.column,
                        "message": p.message,
                    })).collect::<Vec<_>>(),
                    "total": total,
                });
                break;
            }
            next = cause.source();
        }
        e
    }
}

/// The error and its causes, as one line (a cause already in the message
/// is not repeated), without the source locations Lance's errors carry
/// (they show the build's file paths, nothing a client can act on).
fn full_message(err: &(dyn std::error::Error + 'static)) -> String {
    lance_context_store::without_source_locations(&chained(err))
}

/// The error and its causes, as one line.
fn chained(err: &(dyn std::error::Error + 'static)) -> String {
    let mut message = err.to_string();
    let mut next = err.source();
    while let Some(cause) = next {
        let text = cause.to_string();
        if !message.contains(&text) {
            message.push_str(": ");
            message.push_str(&text);
        }
        next = cause.source();
    }
    message
}

impl<E: std::error::Error + 'static> From<E> for ApiError {
    fn from(e: E) -> Self {
        Self::from_error(&e)
    }
}

impl ApiError {
    /// The error body as JSON bytes (for answers written below the router).
    pub fn to_json(&self) -> Vec<u8> {
        let body = ErrorBody {
            error: Body {
                code: self.code.clone(),
                message: self.message.clone(),
                details: self.details.clone(),
            },
        };
        // Strings and a JSON value: serialising cannot fail.
        serde_json::to_vec(&body).unwrap_or_default()
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let retry = self.status == StatusCode::SERVICE_UNAVAILABLE;
        let challenge = self.status == StatusCode::UNAUTHORIZED;
        let body = ErrorBody {
            error: Body {
                code: self.code,
                message: self.message,
                details: self.details,
            },
        };
        let mut response = (self.status, axum::Json(body)).into_response();
        if retry {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
        }
        if challenge {
            response
                .headers_mut()
                .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        response
    }
}
