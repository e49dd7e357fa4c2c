//! The built-in context schema (26 columns; `docs/schemas.md`):
//! agent context records with lifecycle, supersession, tombstones,
//! an optional caller key (`external_id`) and an embedding.
//!
//! Parameters (JSON values): `embedding_dim` (integer > 0, default 1536),
//! `distance_metric` ("l2" | "cosine" | "dot", default "l2"), `blob_columns`
//! (a subset of ["text_payload", "binary_payload"], default none; a blob
//! `text_payload` is stored as LargeBinary). Unknown parameters are refused.
//!
//! validate: `id` and `run_id` present and non-empty; `external_id` non-empty
//! when given; no duplicate `id`, nor duplicate non-null `external_id`, in a
//! batch; `content_type` is not the reserved tombstone value; every
//! relationship has a `target_id` and a `relation`.
//!
//! transform (defaults where null): `role` "user", `content_type` "text/plain",
//! `lifecycle_status` "active", `created_at` now.

use std::collections::HashMap;
use std::sync::Arc;

use lance_context_plugin::arrow_array::StringArray;
use lance_context_plugin::arrow_array::cast::AsArray;
use lance_context_plugin::*;

/// Plugin version.
pub const VERSION: &str = "0.2.0";

/// The reserved `content_type` of a tombstone record. Callers may not write it.
pub use lance_context_plugin::TOMBSTONE_CONTENT_TYPE;

/// Schema metadata key holding the distance metric.
pub const METRIC_METADATA: &str = "lance-context:distance_metric";

/// Field metadata marking a blob column.
pub const BLOB_METADATA: &str = "lance-context:blob";

/// The columns that may be blob columns.
pub const BLOB_CAPABLE: &[&str] = &["text_payload", "binary_payload"];

/// The store's creation parameters, parsed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContextParams {
    pub embedding_dim: u32,
    pub metric: Metric,
    pub blob_columns: Vec<String>,
}

impl Default for ContextParams {
    fn default() -> Self {
        Self {
            embedding_dim: 1536,
            metric: Metric::L2,
            blob_columns: Vec::new(),
        }
    }
}

/// Parse and check the parameters; an error names the parameter.
pub fn parse_params(params: &Params) -> Result<ContextParams, InvalidParams> {
    let mut out = ContextParams::default();
    for (name, value) in params {
        let json: serde_json::Value = serde_json::from_str(value).map_err(|e| {
            format!(
                "{name}: not valid JSON ({e}); parameter values are JSON: text in \
                     double quotes (e.g. \"cosine\"), numbers and lists as they are"
            )
        })?;
        match name.as_str() {
            "embedding_dim" => {
                let dim = json
                    .as_u64()
                    .filter(|d| *d > 0 && *d <= u32::MAX as u64)
                    .ok_or_else(|| format!("embedding_dim must be an integer > 0, got {json}"))?;
                out.embedding_dim = dim as u32;
            }
            "distance_metric" => {
                out.metric = match json.as_str() {
                    Some("l2") => Metric::L2,
                    Some("cosine") => Metric::Cosine,
                    Some("dot") => Metric::Dot,
                    _ => {
                        return Err(format!(
                            "distance_metric must be \"l2\", \"cosine\" or \"dot\", got {json}"
                        )
                        .into());
                    }
                }
            }
            "blob_columns" => {
                let list = json
                    .as_array()
                    .ok_or_else(|| format!("blob_columns must be a list, got {json}"))?;
                let mut columns = Vec::new();
                for item in list {
                    match item.as_str() {
                        Some(c) if BLOB_CAPABLE.contains(&c) => {
                            if !columns.iter().any(|x: &String| x == c) {
                                columns.push(c.to_string());
                            }
                        }
                        _ => {
                            return Err(format!(
                                "blob_columns: {item} cannot be a blob column (only {})",
                                BLOB_CAPABLE.join(", ")
                            )
                            .into());
                        }
                    }
                }
                out.blob_columns = columns;
            }
            other => return Err(format!("unknown parameter '{other}'").into()),
        }
    }
    Ok(out)
}

fn utf8(name: &str) -> Field {
    Field::new(name, DataType::Utf8, true)
}

fn timestamp(name: &str, nullable: bool) -> Field {
    Field::new(
        name,
        DataType::Timestamp(TimeUnit::Microsecond, None),
        nullable,
    )
}

fn blob_mark(field: Field, params: &ContextParams) -> Field {
    if params.blob_columns.iter().any(|c| c == field.name()) {
        field.with_metadata(HashMap::from([(
            BLOB_METADATA.to_string(),
            "true".to_string(),
        )]))
    } else {
        field
    }
}

/// The context schema for these parameters, column for column.
pub fn schema(params: &ContextParams) -> Schema {
    let state = DataType::Struct(
        vec![
            Field::new("step", DataType::Int32, true),
            Field::new("active_plan_id", DataType::Utf8, true),
            Field::new("tokens_used", DataType::Int32, true),
            Field::new("custom", DataType::Utf8, true),
        ]
        .into(),
    );
    let text_is_blob = params.blob_columns.iter().any(|c| c == "text_payload");
    let metric = match params.metric {
        Metric::L2 => "l2",
        Metric::Cosine => "cosine",
        Metric::Dot => "dot",
    };
    Schema::new_with_metadata(
        vec![
            key_field("id"),
            utf8("external_id"),
            Field::new("run_id", DataType::Utf8, false),
            utf8("bot_id"),
            utf8("session_id"),
            utf8("tenant"),
            utf8("source"),
            timestamp("created_at", false),
            Field::new(
                "role",
                DataType::Dictionary(Box::new(DataType::Int8), Box::new(DataType::Utf8)),
                false,
            ),
            Field::new("state_metadata", state, true),
            Field::new("metadata", DataType::LargeUtf8, true),
            relationships_field(),
            timestamp("expires_at", true),
            utf8("retention_policy"),
            Field::new("lifecycle_status", DataType::Utf8, false),
            timestamp("retired_at", true),
            utf8("retired_reason"),
            utf8("supersedes_id"),
            utf8("superseded_by_id"),
            Field::new("content_type", DataType::Utf8, false),
            blob_mark(
                Field::new(
                    "text_payload",
                    if text_is_blob {
                        DataType::LargeBinary
                    } else {
                        DataType::LargeUtf8
                    },
                    true,
                ),
                params,
            ),
            blob_mark(
                Field::new("binary_payload", DataType::LargeBinary, true),
                params,
            ),
            utf8("payload_uri"),
            Field::new("payload_size", DataType::Int64, true),
            utf8("payload_checksum"),
            Field::new(
                "embedding",
                DataType::FixedSizeList(
                    Arc::new(Field::new("item", DataType::Float32, true)),
                    params.embedding_dim as i32,
                ),
                true,
            ),
        ],
        HashMap::from([(METRIC_METADATA.to_string(), metric.to_string())]),
    )
}

/// The context plugin.
pub struct Context;

impl Plugin for Context {
    fn describe(params: &Params) -> Result<Declaration, InvalidParams> {
        let params = parse_params(params)?;
        let mut declaration = Declaration::new("context", VERSION, schema(&params))
            .with_vector("embedding", params.embedding_dim, params.metric)
            .with_transform()
            .with_query(
                "run",
                "the records of one add call",
                &["run_id"],
                "run_id = {run_id}",
                &["created_at", "id"],
            )
            .with_query(
                "session",
                "the records of one session, oldest first",
                &["session_id"],
                "session_id = {session_id}",
                &["created_at", "id"],
            );
        // The text is searchable by its words unless it is stored as a blob.
        if !params.blob_columns.iter().any(|c| c == "text_payload") {
            declaration = declaration.with_text("text_payload");
        }
        for column in &params.blob_columns {
            declaration = declaration.with_blob(column);
        }
        declaration.secondary_key = Some("external_id".to_string());
        declaration.capabilities = Capabilities {
            tombstones: true,
            supersession: true,
            lifecycle: true,
            unique_keys: true,
        };
        Ok(declaration)
    }

    fn validate(batch: &RecordBatch, _call: &CallInfo, errors: &mut RowErrors) {
        require_non_empty(batch, &["id", "run_id"], errors);
        let strings = |name: &str| {
            batch
                .column_by_name(name)
                .filter(|c| c.data_type() == &DataType::Utf8)
                .map(|c| c.as_string::<i32>().clone())
        };
        if let Some(external) = strings("external_id") {
            for row in 0..external.len() {
                if external.is_valid(row) && external.value(row).is_empty() {
                    errors.push(
                        row,
                        Some("external_id"),
                        "required",
                        "external_id must not be empty when given",
                    );
                }
            }
            duplicates(&external, "external_id", errors);
        }
        if let Some(ids) = strings("id") {
            duplicates(&ids, "id", errors);
        }
        if let Some(types) = strings("content_type") {
            for row in 0..types.len() {
                if types.is_valid(row) && types.value(row) == TOMBSTONE_CONTENT_TYPE {
                    errors.push(
                        row,
                        Some("content_type"),
                        "reserved",
                        format!(
                            "content_type '{TOMBSTONE_CONTENT_TYPE}' is reserved for tombstones"
                        ),
                    );
                }
            }
        }
        check_relationships(batch, errors);
    }

    fn transform(batch: RecordBatch, call: &CallInfo) -> Result<RecordBatch, RowErrors> {
        let params = parse_params(&call.params).map_err(|e| {
            let mut errors = RowErrors::default();
            errors.push(0, None, "params", e.to_string());
            errors
        })?;
        fill_defaults(batch, &params, call.now_micros)
    }
}

/// Report every row repeating an earlier non-null value of `column`.
fn duplicates(values: &StringArray, column: &str, errors: &mut RowErrors) {
    let mut first: HashMap<&str, usize> = HashMap::new();
    for row in 0..values.len() {
        if values.is_null(row) || values.value(row).is_empty() {
            continue;
        }
        let v = values.value(row);
        if let Some(&earlier) = first.get(v) {
            errors.push(
                row,
                Some(column),
                "duplicate",
                format!("{column} '{v}' repeats an earlier record of the batch (batch row {earlier}, counted from 0)"),
            );
        } else {
            first.insert(v, row);
        }
    }
}

/// Fill the defaults where null; returns the derived columns.
pub fn fill_defaults(
    batch: RecordBatch,
    params: &ContextParams,
    now_micros: i64,
) -> Result<RecordBatch, RowErrors> {
    let rows = batch.num_rows();
    defaults::derive(Arc::new(schema(params)), &batch, |name, given| {
        Ok(match name {
            "content_type" => Some(defaults::utf8_or(given, rows, "text/plain")),
            "lifecycle_status" => Some(defaults::utf8_or(given, rows, "active")),
            "role" => Some(defaults::dictionary_or(given, rows, "user", "role")?),
            "created_at" => Some(defaults::timestamp_us_or(given, rows, now_micros, None)),
            _ => None,
        })
    })
}

#[cfg(target_arch = "wasm32")]
export_plugin!(Context);

#[cfg(test)]
mod tests;
