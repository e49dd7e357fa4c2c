//! Pieces several schemas share: the `relationships` column and common checks.

use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::{Array, RecordBatch};
use arrow_schema::{DataType, Field};

use crate::{RowErrors, rows_where_empty};

/// `relationships`: List<Struct{target_id: Utf8, relation: Utf8, weight: Float32}>,
/// every level nullable, the list item named `item` (the rollout and context schemas, docs/schemas.md).
pub fn relationships_field() -> Field {
    let relationship = DataType::Struct(
        vec![
            Field::new("target_id", DataType::Utf8, true),
            Field::new("relation", DataType::Utf8, true),
            Field::new("weight", DataType::Float32, true),
        ]
        .into(),
    );
    Field::new(
        "relationships",
        DataType::List(Arc::new(Field::new("item", relationship, true))),
        true,
    )
}

/// Every row where one of `columns` is null or empty is a `required` error.
pub fn require_non_empty(batch: &RecordBatch, columns: &[&str], errors: &mut RowErrors) {
    for column in columns {
        for row in rows_where_empty(batch, column) {
            errors.push(
                row,
                Some(column),
                "required",
                format!("{column} is required"),
            );
        }
    }
}

/// Every relationship needs a `target_id` and a `relation` (by field name).
pub fn check_relationships(batch: &RecordBatch, errors: &mut RowErrors) {
    let Some(lists) = batch.column_by_name("relationships") else {
        return;
    };
    let lists = lists.as_list::<i32>();
    for row in 0..lists.len() {
        if lists.is_null(row) {
            continue;
        }
        let items = lists.value(row);
        let items = items.as_struct();
        for field in ["target_id", "relation"] {
            // By field name, never by position.
            let Some(values) = items.column_by_name(field) else {
                errors.push(
                    row,
                    Some("relationships"),
                    "relationship",
                    format!("relationships lack '{field}'"),
                );
                continue;
            };
            for i in 0..items.len() {
                if items.is_valid(i) && values.is_null(i) {
                    errors.push(
                        row,
                        Some("relationships"),
                        "relationship",
                        format!("relationship {i} has no {field}"),
                    );
                }
            }
        }
    }
}
