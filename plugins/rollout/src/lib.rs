//! The built-in rollout schema (36 columns; `docs/schemas.md`):
//! one row per message of an RL trajectory.
//!
//! - validate: `id` and `rollout_id` present and non-empty; a `binary_payload`
//!   and its `payload_size` agree, and no `payload_size` is declared without
//!   bytes; every relationship has a `target_id` and a `relation`.
//! - transform (defaults): `problem_id` = `rollout_id`, `sequence_order` = 0,
//!   `role` = "assistant", `content_type` = "text/plain", `created_at` = now.
//!
//! The logic is plain Rust over Arrow; the component export is the last line.

use std::sync::Arc;

use lance_context_plugin::arrow_array::cast::AsArray;
use lance_context_plugin::arrow_array::types::Int64Type;
use lance_context_plugin::*;

/// Plugin version.
pub const VERSION: &str = "0.1.0";

fn utf8(name: &str, nullable: bool) -> Field {
    Field::new(name, DataType::Utf8, nullable)
}

fn large_utf8(name: &str) -> Field {
    Field::new(name, DataType::LargeUtf8, true)
}

fn list_of(name: &str, item: DataType) -> Field {
    Field::new(
        name,
        DataType::List(Arc::new(Field::new("item", item, true))),
        true,
    )
}

/// The rollout schema, column for column.
pub fn schema() -> Schema {
    Schema::new(vec![
        key_field("id"),
        utf8("rollout_id", false),
        utf8("problem_id", false),
        utf8("dataset", true),
        Field::new("sequence_order", DataType::Int32, false),
        Field::new(
            "role",
            DataType::Dictionary(Box::new(DataType::Int8), Box::new(DataType::Utf8)),
            false,
        ),
        Field::new(
            "created_at",
            DataType::Timestamp(TimeUnit::Microsecond, None),
            false,
        ),
        large_utf8("content"),
        utf8("content_type", false),
        large_utf8("model_input_string"),
        large_utf8("model_output_string"),
        large_utf8("rationale"),
        large_utf8("problem_text"),
        large_utf8("user_metadata"),
        list_of("input_tokens", DataType::Int32),
        list_of("output_tokens", DataType::Int32),
        Field::new("num_input_tokens", DataType::Int32, true),
        Field::new("num_output_tokens", DataType::Int32, true),
        list_of("output_logprobs", DataType::Float32),
        list_of("input_logprobs", DataType::Float32),
        list_of("ref_logprobs", DataType::Float32),
        list_of("loss_mask", DataType::Int8),
        Field::new("advantage", DataType::Float32, true),
        Field::new("reward", DataType::Float32, true),
        Field::new("raw_reward", DataType::Float32, true),
        utf8("grader_id", true),
        Field::new("score", DataType::Float32, true),
        Field::new("include_in_training", DataType::Boolean, true),
        utf8("exclude_reason", true),
        utf8("policy_version", true),
        relationships_field(),
        Field::new("binary_payload", DataType::LargeBinary, true),
        Field::new("payload_size", DataType::Int64, true),
        utf8("payload_checksum", true),
        utf8("artifact_type", true),
        large_utf8("metadata"),
    ])
}

/// The rollout plugin.
pub struct Rollout;

impl Plugin for Rollout {
    fn describe(params: &Params) -> Result<Declaration, InvalidParams> {
        if let Some((name, _)) = params.first() {
            return Err(format!("the rollout schema takes no parameters (got '{name}')").into());
        }
        Ok(Declaration::new("rollout", VERSION, schema())
            .with_transform()
            .with_query(
                "trajectory",
                "the rows of one rollout, in trajectory order",
                &["rollout_id"],
                "rollout_id = {rollout_id}",
                &["sequence_order", "id"],
            )
            .with_query(
                "group",
                "the rows of one problem (the GRPO group of its samples)",
                &["problem_id"],
                "problem_id = {problem_id}",
                &["rollout_id", "sequence_order", "id"],
            ))
    }

    fn validate(batch: &RecordBatch, _call: &CallInfo, errors: &mut RowErrors) {
        require_non_empty(batch, &["id", "rollout_id"], errors);
        check_payload(batch, errors);
        check_relationships(batch, errors);
    }

    fn transform(batch: RecordBatch, call: &CallInfo) -> Result<RecordBatch, RowErrors> {
        fill_defaults(batch, call.now_micros)
    }
}

fn check_payload(batch: &RecordBatch, errors: &mut RowErrors) {
    let bytes = batch
        .column_by_name("binary_payload")
        .map(|c| c.as_binary::<i64>());
    let sizes = batch
        .column_by_name("payload_size")
        .map(|c| c.as_primitive::<Int64Type>());
    let Some(sizes) = sizes else { return };
    for row in 0..batch.num_rows() {
        if sizes.is_null(row) {
            continue;
        }
        let declared = sizes.value(row);
        match bytes.filter(|b| b.is_valid(row)) {
            None => errors.push(
                row,
                Some("payload_size"),
                "payload-size-without-bytes",
                format!("payload_size is {declared} but there is no binary_payload"),
            ),
            Some(b) if b.value(row).len() as i64 != declared => errors.push(
                row,
                Some("payload_size"),
                "payload-size",
                format!(
                    "payload_size is {declared} but binary_payload has {} bytes",
                    b.value(row).len()
                ),
            ),
            Some(_) => {}
        }
    }
}

/// Fill the documented defaults; returns the derived columns.
pub fn fill_defaults(batch: RecordBatch, now_micros: i64) -> Result<RecordBatch, RowErrors> {
    let rows = batch.num_rows();
    let rollout_id = batch.column_by_name("rollout_id").cloned();
    defaults::derive(Arc::new(schema()), &batch, |name, given| {
        Ok(match name {
            "problem_id" => Some(defaults::utf8_or_column(given, rollout_id.as_ref(), rows)),
            "sequence_order" => Some(defaults::int32_or(given, rows, 0)),
            "role" => Some(defaults::dictionary_or(given, rows, "assistant", "role")?),
            "content_type" => Some(defaults::utf8_or(given, rows, "text/plain")),
            "created_at" => Some(defaults::timestamp_us_or(given, rows, now_micros, None)),
            _ => None,
        })
    })
}

#[cfg(target_arch = "wasm32")]
export_plugin!(Rollout);

#[cfg(test)]
mod tests;
