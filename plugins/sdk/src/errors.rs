//! Row-level errors.

use arrow_array::{Array, RecordBatch, StringArray};

pub use lance_context_wire::RowError;

/// Why [`crate::Plugin::describe`] refuses its creation parameters (the
/// contract's `describe-error::invalid-params`). The message names the
/// parameter, e.g. `embedding_dim must be an integer > 0, got "x"`.
///
/// Built from a message: `InvalidParams::new(…)`, or `?` / `.into()` on a
/// `String` or `&str`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InvalidParams(String);

impl InvalidParams {
    /// A refusal with this message.
    pub fn new(message: impl Into<String>) -> Self {
        Self(message.into())
    }

    /// The message.
    pub fn message(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Display for InvalidParams {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for InvalidParams {}

impl From<String> for InvalidParams {
    fn from(message: String) -> Self {
        Self(message)
    }
}

impl From<&str> for InvalidParams {
    fn from(message: &str) -> Self {
        Self(message.to_string())
    }
}

impl From<InvalidParams> for RowErrors {
    /// A `params` error on the batch's first row (a transform that cannot
    /// rebuild its declaration from the store's parameters).
    fn from(e: InvalidParams) -> Self {
        let mut errors = RowErrors::default();
        errors.push(0, None, "params", e.0);
        errors
    }
}

/// Collects every problem found in a batch.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct RowErrors {
    errors: Vec<RowError>,
    row_offset: usize,
}

impl RowErrors {
    /// Record a problem in `row` of the batch being checked.
    pub fn push(
        &mut self,
        row: usize,
        column: Option<&str>,
        code: &str,
        message: impl Into<String>,
    ) {
        self.errors.push(RowError {
            row: (row + self.row_offset) as u32,
            column: column.map(str::to_string),
            code: code.to_string(),
            message: message.into(),
        });
    }

    /// Whether nothing was recorded.
    pub fn is_empty(&self) -> bool {
        self.errors.is_empty()
    }

    /// The problems, in row order.
    pub fn into_vec(mut self) -> Vec<RowError> {
        self.errors.sort_by_key(|e| e.row);
        self.errors
    }

    /// Ok when nothing was recorded.
    pub fn into_result(self) -> Result<(), Vec<RowError>> {
        if self.is_empty() {
            Ok(())
        } else {
            Err(self.into_vec())
        }
    }

    pub(crate) fn set_row_offset(&mut self, offset: usize) {
        self.row_offset = offset;
    }

    pub(crate) fn shift_rows(&mut self, offset: usize) {
        for e in &mut self.errors {
            e.row += offset as u32;
        }
    }
}

/// Rows where `column` is null (all rows when the column is absent).
pub fn rows_where_null(batch: &RecordBatch, column: &str) -> Vec<usize> {
    match batch.column_by_name(column) {
        None => (0..batch.num_rows()).collect(),
        Some(array) => (0..array.len()).filter(|&i| array.is_null(i)).collect(),
    }
}

/// Rows where the Utf8 `column` is null or empty (all rows when absent).
pub fn rows_where_empty(batch: &RecordBatch, column: &str) -> Vec<usize> {
    match batch
        .column_by_name(column)
        .and_then(|c| c.as_any().downcast_ref::<StringArray>())
    {
        None => (0..batch.num_rows()).collect(),
        Some(values) => (0..values.len())
            .filter(|&i| values.is_null(i) || values.value(i).is_empty())
            .collect(),
    }
}

/// Every row where a non-nullable column of `declared` is null (or the
/// column absent) is a `required` error naming the column — what the
/// engine would refuse, reported as row errors instead. Call it first in
/// `validate`: `plugin check` warns about a plugin that lets such a record
/// through.
pub fn require_declared(
    batch: &RecordBatch,
    declared: &arrow_schema::Schema,
    errors: &mut RowErrors,
) {
    for field in declared.fields().iter().filter(|f| !f.is_nullable()) {
        for row in rows_where_null(batch, field.name()) {
            errors.push(
                row,
                Some(field.name()),
                "required",
                format!("{} is required", field.name()),
            );
        }
    }
}
