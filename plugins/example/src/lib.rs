//! An example third-party plugin: notes with a 4-dimensional embedding (cosine)
//! and a custom rule — `priority` must be 1 to 5.

use std::sync::Arc;

use lance_context_plugin::arrow_array::cast::AsArray;
use lance_context_plugin::arrow_array::types::Int32Type;
use lance_context_plugin::*;

pub struct Notes;

impl Plugin for Notes {
    fn describe(_params: &Params) -> Result<Declaration, InvalidParams> {
        let item = Arc::new(Field::new("item", DataType::Float32, true));
        let schema = Schema::new(vec![
            key_field("id"),
            Field::new("text", DataType::Utf8, false),
            Field::new("priority", DataType::Int32, true),
            Field::new("embedding", DataType::FixedSizeList(item, 4), true),
        ]);
        Ok(Declaration::new("notes", "0.1.0", schema).with_vector("embedding", 4, Metric::Cosine))
    }

    fn validate(batch: &RecordBatch, call: &CallInfo, errors: &mut RowErrors) {
        // The key and every other non-nullable column: `required` row errors.
        if let Ok(declared) = call.declaration::<Self>() {
            require_declared(batch, &declared.schema, errors);
        }
        // (A null text is reported once, above: here only empty strings.)
        let null_text = rows_where_null(batch, "text");
        for row in rows_where_empty(batch, "text")
            .into_iter()
            .filter(|row| !null_text.contains(row))
        {
            errors.push(row, Some("text"), "required", "text must not be empty");
        }
        if let Some(priority) = batch.column_by_name("priority") {
            let priority = priority.as_primitive::<Int32Type>();
            for (row, p) in priority.iter().enumerate() {
                if let Some(p) = p.filter(|p| !(1..=5).contains(p)) {
                    errors.push(
                        row,
                        Some("priority"),
                        "range",
                        format!("priority must be 1 to 5, got {p}"),
                    );
                }
            }
        }
    }
}

#[cfg(target_arch = "wasm32")]
export_plugin!(Notes);
