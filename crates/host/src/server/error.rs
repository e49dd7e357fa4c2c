//! The API's errors as HTTP answers: the store API's error ([`ApiError`],
//! shared with the embedded implementation) with its status and headers.

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use lance_context_client::{ApiError as Body, ErrorBody};

pub(crate) use crate::api::{ApiError, status};

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let code = StatusCode::from_u16(self.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let body = ErrorBody {
            error: Body {
                code: self.code,
                message: self.message,
                details: self.details,
            },
        };
        let mut response = (code, axum::Json(body)).into_response();
        if code == StatusCode::SERVICE_UNAVAILABLE {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
        }
        if code == StatusCode::UNAUTHORIZED {
            response
                .headers_mut()
                .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        response
    }
}
