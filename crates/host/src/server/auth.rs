//! Bearer tokens, each with a role and optionally limited to named stores.

use axum::http::{HeaderMap, StatusCode, header};
use serde::Deserialize;

use super::error::ApiError;

/// What a token may do; each role includes the ones before it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// Reads: get, list, query, search, stats, describe.
    Read,
    /// Reads and record writes: add, upsert, patch, delete.
    Write,
    /// Everything: create and drop stores, merge, compact, index.
    Admin,
}

/// One configured token.
#[derive(Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Token {
    /// The secret the client sends as `Authorization: Bearer …`.
    pub token: String,
    /// Its role.
    pub role: Role,
    /// The stores it may use; every store when absent.
    #[serde(default)]
    pub stores: Option<Vec<String>>,
}

impl std::fmt::Debug for Token {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the secret.
        f.debug_struct("Token")
            .field("role", &self.role)
            .field("stores", &self.stores)
            .finish()
    }
}

/// The tokens file: `{"tokens": [{"token", "role", "stores"}]}`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TokensFile {
    /// The tokens.
    pub tokens: Vec<Token>,
}

/// Who is calling (when tokens are configured).
#[derive(Debug, Clone)]
pub(crate) struct Caller {
    token: Option<Token>,
}

impl Caller {
    /// Whether the caller's token is limited to named stores (a server
    /// without tokens has no scoped callers).
    pub fn is_scoped(&self) -> bool {
        self.token.as_ref().is_some_and(|t| t.stores.is_some())
    }

    /// Whether the caller may use `store` at all.
    pub fn sees(&self, store: &str) -> bool {
        match &self.token {
            None => true,
            Some(t) => t
                .stores
                .as_ref()
                .is_none_or(|s| s.iter().any(|n| n == store)),
        }
    }
}

/// Constant-time comparison (a token's bytes are not revealed by timing):
/// the SHA-256 digests of both are compared, so that neither a length
/// mismatch nor the first differing byte ends the comparison early.
fn same(a: &[u8], b: &[u8]) -> bool {
    use sha2::{Digest, Sha256};
    let (a, b) = (Sha256::digest(a), Sha256::digest(b));
    let difference = a.iter().zip(&b).fold(0u8, |acc, (x, y)| acc | (x ^ y));
    // Kept opaque so that the fold is not turned into an early exit.
    std::hint::black_box(difference) == 0
}

/// Check the request's token for `role` (and `store`, when the request is
/// about one). With no tokens configured every request is allowed (the
/// server then listens on loopback only).
pub(crate) fn authorize(
    tokens: &[Token],
    headers: &HeaderMap,
    store: Option<&str>,
    role: Role,
) -> Result<Caller, ApiError> {
    if tokens.is_empty() {
        return Ok(Caller { token: None });
    }
    let given = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        // The scheme is case-insensitive (RFC 7235).
        .and_then(|v| v.trim().split_once(' '))
        .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
        .map(|(_, token)| token.trim())
        .ok_or_else(|| {
            ApiError::new(
                StatusCode::UNAUTHORIZED,
                "unauthorized",
                "an Authorization: Bearer token is required",
            )
        })?;
    // Every token is compared (no early exit on a match).
    let mut found: Option<&Token> = None;
    for t in tokens {
        if same(t.token.as_bytes(), given.as_bytes()) && found.is_none() {
            found = Some(t);
        }
    }
    let token = found
        .ok_or_else(|| ApiError::new(StatusCode::UNAUTHORIZED, "unauthorized", "unknown token"))?;
    if token.role < role {
        return Err(ApiError::new(
            StatusCode::FORBIDDEN,
            "forbidden",
            format!(
                "this token's role is {:?}; the request needs {role:?}",
                token.role
            )
            .to_lowercase(),
        ));
    }
    let caller = Caller {
        token: Some(token.clone()),
    };
    if let Some(store) = store
        && !caller.sees(store)
    {
        return Err(ApiError::new(
            StatusCode::FORBIDDEN,
            "forbidden",
            format!("this token may not use store '{store}'"),
        ));
    }
    Ok(caller)
}
