//! Records in and out of the API as JSON: objects by column name; binary
//! columns as base64 strings (the JSON Lines reader of the pipeline takes
//! hex, so they are converted on the way in), everything else as the
//! pipeline reads and Arrow's JSON writer writes.

use std::sync::Arc;

use arrow_array::{Array, ArrayRef, LargeStringArray, RecordBatch, StringArray};
use arrow_schema::{DataType, Field, Schema};
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as B64;
use serde_json::Value;

use super::error::ApiError;
use crate::{LoadedPlugin, input_schema, rows_from_json};

/// A request body's records: a JSON array of objects (or JSON Lines when
/// `lines`), as one batch of the plugin's input schema. Errors name the
/// record (zero-based index) and column.
pub(crate) fn batch_from_json(
    plugin: &LoadedPlugin,
    body: &[u8],
    lines: bool,
) -> Result<RecordBatch, ApiError> {
    let mut records: Vec<Value> = if lines {
        let text =
            std::str::from_utf8(body).map_err(|_| ApiError::invalid("the body is not UTF-8"))?;
        text.lines()
            .enumerate()
            .filter(|(_, l)| !l.trim().is_empty())
            .map(|(i, l)| {
                serde_json::from_str(l)
                    .map_err(|e| ApiError::invalid(format!("line {}: not JSON: {e}", i + 1)))
            })
            .collect::<Result<_, _>>()?
    } else {
        match serde_json::from_slice::<Value>(body) {
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
        }
    };
    if records.is_empty() {
        return Err(ApiError::invalid("no records in the body"));
    }
    let schema = input_schema(plugin);
    let binary: Vec<&str> = schema
        .fields()
        .iter()
        .filter(|f| matches!(f.data_type(), DataType::Binary | DataType::LargeBinary))
        .map(|f| f.name().as_str())
        .collect();
    let mut text = Vec::with_capacity(body.len());
    for (i, record) in records.iter_mut().enumerate() {
        let Some(object) = record.as_object_mut() else {
            return Err(
                ApiError::invalid(format!("record {i} is not a JSON object"))
                    .with_details(serde_json::json!({"record": i})),
            );
        };
        for name in &binary {
            if let Some(v) = object.get_mut(*name) {
                match v {
                    Value::Null => {}
                    Value::String(s) => {
                        let bytes = B64.decode(s.as_bytes()).map_err(|e| {
                            ApiError::invalid(format!(
                                "record {i}, column '{name}': not base64: {e}"
                            ))
                            .with_details(serde_json::json!({"record": i, "column": name}))
                        })?;
                        *v = Value::String(hex(&bytes));
                    }
                    _ => {
                        return Err(ApiError::invalid(format!(
                            "record {i}, column '{name}': binary values are base64 strings"
                        ))
                        .with_details(serde_json::json!({"record": i, "column": name})));
                    }
                }
            }
        }
        serde_json::to_writer(&mut text, record)
            .map_err(|e| ApiError::invalid(format!("record {i}: {e}")))?;
        text.push(b'\n');
    }
    rows_from_json(plugin, text.as_slice()).map_err(|e| {
        let at = match &e {
            crate::PipelineError::InvalidInput { row: Some(row), .. } => format!("record {row}: "),
            _ => String::new(),
        };
        let mut err = ApiError::from(e);
        err.message = format!("{at}{}", err.message);
        err
    })
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// A batch as JSON objects, binary columns as base64.
pub(crate) fn to_json(batch: &RecordBatch) -> Result<Vec<Value>, ApiError> {
    let batch = binary_as_base64(batch)?;
    let mut writer = arrow_json::ArrayWriter::new(Vec::new());
    writer.write(&batch).map_err(|e| {
        ApiError::of_kind(crate::ErrorKind::Internal, format!("encoding JSON: {e}"))
    })?;
    writer.finish().map_err(|e| {
        ApiError::of_kind(crate::ErrorKind::Internal, format!("encoding JSON: {e}"))
    })?;
    let bytes = writer.into_inner();
    if bytes.is_empty() {
        return Ok(Vec::new());
    }
    serde_json::from_slice(&bytes)
        .map_err(|e| ApiError::of_kind(crate::ErrorKind::Internal, format!("encoding JSON: {e}")))
}

fn binary_as_base64(batch: &RecordBatch) -> Result<RecordBatch, ApiError> {
    let schema = batch.schema();
    if !schema
        .fields()
        .iter()
        .any(|f| matches!(f.data_type(), DataType::Binary | DataType::LargeBinary))
    {
        return Ok(batch.clone());
    }
    let mut fields = Vec::new();
    let mut columns: Vec<ArrayRef> = Vec::new();
    for (field, column) in schema.fields().iter().zip(batch.columns()) {
        let encoded: Option<ArrayRef> = match field.data_type() {
            DataType::Binary => column
                .as_any()
                .downcast_ref::<arrow_array::BinaryArray>()
                .map(|a| {
                    Arc::new(
                        a.iter()
                            .map(|v| v.map(|b| B64.encode(b)))
                            .collect::<StringArray>(),
                    ) as ArrayRef
                }),
            DataType::LargeBinary => column
                .as_any()
                .downcast_ref::<arrow_array::LargeBinaryArray>()
                .map(|a| {
                    Arc::new(
                        a.iter()
                            .map(|v| v.map(|b| B64.encode(b)))
                            .collect::<LargeStringArray>(),
                    ) as ArrayRef
                }),
            _ => None,
        };
        match encoded {
            Some(c) => {
                fields.push(Field::new(field.name(), c.data_type().clone(), true));
                columns.push(c);
            }
            None => {
                fields.push(field.as_ref().clone());
                columns.push(column.clone());
            }
        }
    }
    RecordBatch::try_new(Arc::new(Schema::new(fields)), columns)
        .map_err(|e| ApiError::of_kind(crate::ErrorKind::Internal, format!("encoding JSON: {e}")))
}
