//! Schema-driven queries: the named queries a schema declares (rollout's
//! `trajectory`, datagen's `item_events`, …) turned into engine scans. The
//! engine checks every column a request names against the schema (an unknown
//! column is an error naming it); blob columns are left out of the default
//! projection.

use lance_context_store::{ScanRequest, SortKey};

use crate::spec::SchemaSpec;

/// Why a named query could not be run.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum QueryError {
    /// The schema declares no query of that name.
    #[error("schema '{schema}' has no query '{name}' (queries: {})", if available.is_empty() { "none".to_string() } else { available.join(", ") })]
    UnknownQuery {
        /// The schema's name.
        schema: String,
        /// The store name.
        name: String,
        /// The queries the schema declares.
        available: Vec<String>,
    },
    /// Missing, extra or empty arguments.
    #[error(transparent)]
    Bind(#[from] crate::spec::BindError),
    /// The query is not one this call can run (e.g. not a reducing query).
    #[error("{0}")]
    Arguments(String),
}

/// The columns of a default read: every column but the blob columns.
pub fn default_projection(spec: &SchemaSpec) -> Vec<String> {
    spec.columns
        .iter()
        .filter(|c| !spec.blob_columns.contains(&c.name))
        .map(|c| c.name.clone())
        .collect()
}

/// The scan for query `name` with `args` (`(param, value)` pairs), projecting
/// the default columns.
pub fn named_request(
    spec: &SchemaSpec,
    name: &str,
    args: &[(String, String)],
) -> Result<ScanRequest, QueryError> {
    let query = spec
        .queries
        .iter()
        .find(|q| q.name == name)
        .ok_or_else(|| QueryError::UnknownQuery {
            schema: spec.name.clone(),
            name: name.to_string(),
            available: spec.queries.iter().map(|q| q.name.clone()).collect(),
        })?;
    let filter = query.bind(args)?;
    let mut request = ScanRequest::new()
        .filter(filter)
        .project(default_projection(spec));
    for (column, desc) in query.order() {
        request = request.order_by(if desc {
            SortKey::desc(column)
        } else {
            SortKey::asc(column)
        });
    }
    Ok(request)
}
