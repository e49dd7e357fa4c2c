//! Records in and out of the API as JSON: objects by column name, in the
//! pipeline's JSON form (binary values base64), as the CLI reads and writes
//! them.

use arrow_array::RecordBatch;
use serde_json::Value;

use lance_context_client::Rows;

use super::error::ApiError;
use crate::{LoadedPlugin, json_ready, rows_from_json};

/// A request body's records: a JSON array of objects (or JSON Lines when
/// `lines`), as one batch of the plugin's input schema. Errors name the
/// record (zero-based index) and column.
pub(crate) fn batch_from_json(
    plugin: &LoadedPlugin,
    body: &[u8],
    lines: bool,
) -> Result<RecordBatch, ApiError> {
    if lines {
        return batch_from_lines(plugin, body);
    }
    let records: Vec<Value> = match crate::pipeline::parse_strict(body) {
        Ok(Value::Array(items)) => items,
        Ok(Value::Object(_)) => {
            return Err(ApiError::invalid(
                "the body must be a JSON array of records (one record: wrap it in [ ])",
            ));
        }
        Ok(_) => {
            return Err(ApiError::invalid(
                "the body must be a JSON array of records",
            ));
        }
        Err(e) => return Err(ApiError::invalid(format!("the body is not JSON: {e}"))),
    };
    if records.is_empty() {
        return Err(ApiError::invalid("no records in the body"));
    }
    let not_objects: Vec<usize> = (0..records.len())
        .filter(|&i| !records[i].is_object())
        .collect();
    if let Some(&first) = not_objects.first() {
        return Err(ApiError::invalid(format!(
            "record {first} is not a JSON object{}",
            match not_objects.len() {
                1 => String::new(),
                n => format!(" (and {} more)", n - 1),
            }
        ))
        .with_details(serde_json::json!({
            "record": first,
            "input_errors": not_objects.iter().take(crate::MAX_LISTED_PROBLEMS).map(|i| serde_json::json!({
                "record": i, "column": null, "message": "not a JSON object",
            })).collect::<Vec<_>>(),
            "total": not_objects.len(),
        })));
    }
    let mut text = Vec::with_capacity(body.len());
    for (i, record) in records.iter().enumerate() {
        serde_json::to_writer(&mut text, record)
            .map_err(|e| ApiError::invalid(format!("record {i}: {e}")))?;
        text.push(b'\n');
    }
    rows_from_json(plugin, text.as_slice()).map_err(|e| {
        let at = match &e {
            crate::PipelineError::InvalidInput { row: Some(row), .. } => format!("record {row}: "),
            crate::PipelineError::InvalidRecords { problems, .. } => problems
                .first()
                .map(|p| format!("record {}: ", p.row))
                .unwrap_or_default(),
            _ => String::new(),
        };
        let mut err = ApiError::from(e);
        err.message = format!("{at}{}", err.message);
        err
    })
}

/// [`batch_from_json`] of a JSON Lines body: errors name the body's line.
fn batch_from_lines(plugin: &LoadedPlugin, body: &[u8]) -> Result<RecordBatch, ApiError> {
    // JSON Lines go to the pipeline as they are (every bad line
    // reported); errors name the body's line (blank lines count).
    let text = std::str::from_utf8(body).map_err(|_| ApiError::invalid("the body is not UTF-8"))?;
    let line_of: Vec<usize> = text
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
        .map(|(i, _)| i + 1)
        .collect();
    if line_of.is_empty() {
        return Err(ApiError::invalid("no records in the body"));
    }
    rows_from_json(plugin, text.as_bytes()).map_err(|e| {
        let line = |record: usize| line_of.get(record).copied().unwrap_or(0);
        let first = match &e {
            crate::PipelineError::InvalidInput { row: Some(row), .. } => Some(*row),
            crate::PipelineError::InvalidRecords { problems, .. } => {
                problems.first().map(|p| p.row)
            }
            _ => None,
        };
        let mut err = ApiError::from(e);
        if let Some(record) = first {
            err.message = format!("line {}: {}", line(record), err.message);
        }
        if let Some(listed) = err.details["input_errors"].as_array_mut() {
            for item in listed {
                if let Some(record) = item["record"].as_u64() {
                    item["line"] = line(record as usize).into();
                }
            }
        }
        if let Some(record) = err.details["record"].as_u64() {
            err.details["line"] = line(record as usize).into();
        }
        err
    })
}

/// A batch as rows: one JSON array of objects, written once by Arrow's
/// JSON writer and passed through as is (not parsed into values and
/// written again); binary columns as base64.
pub(crate) fn rows(batch: &RecordBatch) -> Result<Rows, ApiError> {
    let internal =
        |e: String| ApiError::of_kind(crate::ErrorKind::Internal, format!("encoding JSON: {e}"));
    let batch = json_ready(batch).map_err(|e| internal(e.to_string()))?;
    let mut writer = arrow_json::ArrayWriter::new(Vec::new());
    writer.write(&batch).map_err(|e| internal(e.to_string()))?;
    writer.finish().map_err(|e| internal(e.to_string()))?;
    let bytes = writer.into_inner();
    if bytes.is_empty() {
        return Ok(Rows::empty());
    }
    let text = String::from_utf8(bytes).map_err(|e| internal(e.to_string()))?;
    Rows::from_json(text).map_err(|e| internal(e.to_string()))
}

/// The last row's value of the string column `column`, if any.
pub(crate) fn last_string(batch: &RecordBatch, column: &str) -> Option<String> {
    use arrow_array::{Array, LargeStringArray, StringArray, StringViewArray};
    let array = batch.column_by_name(column)?;
    let last = array.len().checked_sub(1)?;
    if array.is_null(last) {
        return None;
    }
    let any = array.as_any();
    if let Some(a) = any.downcast_ref::<StringArray>() {
        return Some(a.value(last).to_string());
    }
    if let Some(a) = any.downcast_ref::<LargeStringArray>() {
        return Some(a.value(last).to_string());
    }
    any.downcast_ref::<StringViewArray>()
        .map(|a| a.value(last).to_string())
}

/// A batch as JSON objects, binary columns as base64.
pub(crate) fn to_json(batch: &RecordBatch) -> Result<Vec<Value>, ApiError> {
    let internal = |e: arrow_schema::ArrowError| {
        ApiError::of_kind(crate::ErrorKind::Internal, format!("encoding JSON: {e}"))
    };
    let batch = json_ready(batch).map_err(internal)?;
    let mut writer = arrow_json::ArrayWriter::new(Vec::new());
    writer.write(&batch).map_err(internal)?;
    writer.finish().map_err(internal)?;
    let bytes = writer.into_inner();
    if bytes.is_empty() {
        return Ok(Vec::new());
    }
    serde_json::from_slice(&bytes)
        .map_err(|e| ApiError::of_kind(crate::ErrorKind::Internal, format!("encoding JSON: {e}")))
}
