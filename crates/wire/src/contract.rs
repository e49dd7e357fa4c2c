//! Contract constants and types both sides share.

pub use lance_context_spec::{
    ABI_VERSION, Capability, Metric, PRIMARY_KEY_METADATA, SUPPORTED_ABI_VERSIONS,
    TOMBSTONE_CONTENT_TYPE,
};

/// One problem in one row (rows are zero-based positions in the whole input),
/// as the contract's `row-error` carries it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RowError {
    /// Zero-based row.
    pub row: u32,
    /// The column, when the problem is in one.
    pub column: Option<String>,
    /// A stable machine-readable code, e.g. `required`.
    pub code: String,
    /// A human-readable message.
    pub message: String,
}

impl std::fmt::Display for RowError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.column {
            Some(c) => write!(
                f,
                "row {}, column '{c}': {} ({})",
                self.row, self.message, self.code
            ),
            None => write!(f, "row {}: {} ({})", self.row, self.message, self.code),
        }
    }
}
