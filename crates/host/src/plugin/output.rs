//! What the host does with a plugin's outputs once they are read: check a
//! transform's columns against the declaration and assemble the declared
//! batch; check that a reduce result is JSON without building it in memory.

use std::collections::HashSet;
use std::sync::Arc;

use arrow_array::RecordBatch;
use arrow_schema::{ArrowError, DataType, Schema, SchemaRef};
use serde::de::IgnoredAny;
use serde_json::value::RawValue;

/// What is wrong with a plugin's output (the message of the
/// [`super::PluginError`] it becomes).
#[derive(Debug, thiserror::Error)]
pub(crate) enum OutputProblem {
    #[error("column '{0}' is returned twice")]
    Repeated(String),
    #[error("column '{0}' is not declared")]
    Undeclared(String),
    #[error("column '{column}' is {got}, declared {declared}")]
    WrongType {
        column: String,
        got: DataType,
        declared: DataType,
    },
    #[error(transparent)]
    Arrow(#[from] ArrowError),
    #[error("not JSON: {0}")]
    NotJson(#[from] serde_json::Error),
}

/// A transform's output columns must be declared, once each, with the
/// declared type (nullability is the engine's to check, row by row).
pub(crate) fn check_derived(declared: &Schema, got: &Schema) -> Result<(), OutputProblem> {
    let mut seen = HashSet::new();
    for field in got.fields() {
        if !seen.insert(field.name()) {
            return Err(OutputProblem::Repeated(field.name().clone()));
        }
        match declared.field_with_name(field.name()) {
            Err(_) => return Err(OutputProblem::Undeclared(field.name().clone())),
            Ok(d) if d.data_type() != field.data_type() => {
                return Err(OutputProblem::WrongType {
                    column: field.name().clone(),
                    got: field.data_type().clone(),
                    declared: d.data_type().clone(),
                });
            }
            Ok(_) => {}
        }
    }
    Ok(())
}

/// The declared columns in declared order: derived, else input, else nulls.
/// Fields keep the declared type and are nullable here; the engine checks
/// nullability and names the row. (A declared type's null array is bounded:
/// the spec rules cap list widths and bytes per row.)
pub(crate) fn assemble(
    declared: &SchemaRef,
    input: &RecordBatch,
    derived: &RecordBatch,
) -> Result<RecordBatch, OutputProblem> {
    let rows = input.num_rows();
    let mut fields = Vec::with_capacity(declared.fields().len());
    let mut columns = Vec::with_capacity(declared.fields().len());
    for field in declared.fields() {
        let column = derived
            .column_by_name(field.name())
            .or_else(|| input.column_by_name(field.name()))
            .cloned()
            .unwrap_or_else(|| arrow_array::new_null_array(field.data_type(), rows));
        if column.data_type() != field.data_type() {
            return Err(OutputProblem::WrongType {
                column: field.name().clone(),
                got: column.data_type().clone(),
                declared: field.data_type().clone(),
            });
        }
        fields.push(field.as_ref().clone().with_nullable(true));
        columns.push(column);
    }
    Ok(RecordBatch::try_new(
        Arc::new(Schema::new_with_metadata(
            fields,
            declared.metadata().clone(),
        )),
        columns,
    )?)
}

/// Check that `text` is one JSON document — walked without building it (a
/// `[[],[],…]` of 256 MiB would otherwise become gigabytes of values;
/// nesting is bounded by the parser's recursion limit) — and keep it as raw
/// JSON.
pub(crate) fn json_document(text: String) -> Result<Box<RawValue>, OutputProblem> {
    serde_json::from_str::<IgnoredAny>(&text)?;
    Ok(RawValue::from_string(text)?)
}

/// The panic message in a guest's console output: from the last "panicked
/// at" on, without the backtrace hint, on one line.
pub(crate) fn panic_message(console: &str) -> String {
    let start = console.rfind("panicked at").unwrap_or(0);
    let message: Vec<&str> = console[start..]
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with("note: run with"))
        .collect();
    if message.is_empty() {
        "(no message)".to_string()
    } else {
        message.join(" ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_is_checked_without_being_built() {
        assert!(json_document(r#"{"a": [1, 2]}"#.into()).is_ok());
        assert!(json_document("{".into()).is_err());
        assert!(json_document("1 2".into()).is_err());
        // serde_json skips values iteratively: deep nesting costs no stack.
        let deep = "[".repeat(100_000) + &"]".repeat(100_000);
        assert!(json_document(deep).is_ok());
        let wide = format!("[{}[]]", "[],".repeat(1_000_000));
        assert_eq!(json_document(wide.clone()).unwrap().get(), wide);
    }

    #[test]
    fn the_panic_message_is_the_last_panic() {
        let console = "debug line\nthread '<unnamed>' panicked at src/lib.rs:1:2:\nboom\nnote: run with `RUST_BACKTRACE=1`";
        assert_eq!(panic_message(console), "panicked at src/lib.rs:1:2: boom");
        assert_eq!(panic_message(""), "(no message)");
    }
}
