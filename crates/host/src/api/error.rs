//! The store API's errors: `{"error": {"code", "message", "details"}}`,
//! the HTTP status mapped in one place from the host's [`ErrorKind`] — the
//! embedded implementation answers them as the server sends them.

use lance_context_client::{ApiError as Body, ClientError, ErrorBody};
use serde_json::{Value, json};

use crate::{ErrorKind, PipelineError, PluginError, error_kind};

/// HTTP statuses the API answers.
pub(crate) mod status {
    pub const BAD_REQUEST: u16 = 400;
    pub const NOT_FOUND: u16 = 404;
    pub const CONFLICT: u16 = 409;
    pub const UNSUPPORTED_MEDIA_TYPE: u16 = 415;
    pub const UNPROCESSABLE_ENTITY: u16 = 422;
    pub const INTERNAL_SERVER_ERROR: u16 = 500;
    pub const BAD_GATEWAY: u16 = 502;
    pub const SERVICE_UNAVAILABLE: u16 = 503;
}

/// An error answer.
#[derive(Debug)]
pub(crate) struct ApiError {
    pub status: u16,
    pub code: String,
    pub message: String,
    pub details: Value,
    /// The store's writer was fenced (another process claimed its shard):
    /// a resident store is taken back before the next operation.
    pub fenced: bool,
}

/// The HTTP status of each error kind (docs/server.md lists them).
pub(crate) fn status_of(kind: ErrorKind) -> u16 {
    match kind {
        ErrorKind::InvalidInput => status::BAD_REQUEST,
        ErrorKind::Rejected => status::UNPROCESSABLE_ENTITY,
        ErrorKind::NotFound => status::NOT_FOUND,
        ErrorKind::AlreadyExists | ErrorKind::Conflict => status::CONFLICT,
        ErrorKind::Busy | ErrorKind::Unavailable => status::SERVICE_UNAVAILABLE,
        ErrorKind::PluginFault => status::BAD_GATEWAY,
        _ => status::INTERNAL_SERVER_ERROR,
    }
}

impl ApiError {
    pub fn new(status: impl Into<u16>, code: &str, message: impl Into<String>) -> Self {
        Self {
            status: status.into(),
            code: code.to_string(),
            message: message.into(),
            details: Value::Null,
            fenced: false,
        }
    }

    pub fn of_kind(kind: ErrorKind, message: impl Into<String>) -> Self {
        Self::new(status_of(kind), kind.as_str(), message)
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
        // A store API call's answer is already this error (its status and
        // code as the call gave them).
        if let Some(ClientError::Api { status, error }) = err.downcast_ref::<ClientError>() {
            return Self {
                status: *status,
                code: error.code.clone(),
                message: error.message.clone(),
                details: error.details.clone(),
                fenced: false,
            };
        }
        let kind = error_kind(err);
        let mut e = Self::of_kind(kind, full_message(err));
        e.fenced = fenced(err);
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
                e.details = problem_details(problem, row);
                break;
            }
            // A row of a bucket another instance owns: which, so a caller
            // (or a proxy) can send it there.
            if let Some(lance_context_store::Error::NotOwner {
                row,
                key,
                bucket,
                buckets,
                owned,
            }) = store_error
            {
                e.code = "not_owner".to_string();
                e.details = json!({
                    "record": row,
                    "key": key,
                    "bucket": bucket,
                    "buckets": buckets,
                    "owned": owned,
                });
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

/// The engine's refusal of record `row`: which record and column, and
/// the problem in words without the request-relative `row N: ` (a caller
/// names the record its own way: a line of its file); a repeat within the
/// request also names the record it repeats (`first_record`) and the
/// repeated `value`.
fn problem_details(problem: &lance_context_store::BatchProblem, row: usize) -> Value {
    let text = problem.to_string();
    let said = text
        .strip_prefix(&format!("row {row}: "))
        .unwrap_or(&text)
        .to_string();
    let mut details = json!({"record": row, "column": problem.column(), "problem": said});
    if let lance_context_store::BatchProblem::DuplicateInBatch {
        first_row, value, ..
    } = problem
    {
        details["first_record"] = json!(first_row);
        details["value"] = json!(value);
    }
    details
}

/// Whether the engine refused because the store's writer was fenced.
fn fenced(err: &(dyn std::error::Error + 'static)) -> bool {
    let mut next = Some(err);
    while let Some(cause) = next {
        let store_error = match cause.downcast_ref::<PipelineError>() {
            Some(PipelineError::Store(e)) => Some(e),
            _ => cause.downcast_ref::<lance_context_store::Error>(),
        };
        if store_error.is_some_and(lance_context_store::Error::is_fenced) {
            return true;
        }
        next = cause.source();
    }
    false
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

impl From<ApiError> for ClientError {
    fn from(e: ApiError) -> Self {
        ClientError::Api {
            status: e.status,
            error: Body {
                code: e.code,
                message: e.message,
                details: e.details,
            },
        }
    }
}
