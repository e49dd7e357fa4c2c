//! The fold of one item's events into its state (docs/schemas.md, "The item fold"), the reducer of the
//! `item_state` and `item_trajectory` named queries. Input: the item's events
//! in `(item_seq, event_id)` order (the query's order; one row per `event_id`,
//! the store's key). Blob bytes are not read (the host leaves blob columns
//! out); a blob field records the event id holding it.

use std::collections::{BTreeMap, BTreeSet};

use lance_context_plugin::arrow_array::cast::AsArray;
use lance_context_plugin::arrow_array::types::Float64Type;
use lance_context_plugin::*;
use serde_json::{Value, json};

use crate::Cols;

/// A fold problem in a row.
fn problem(row: usize, column: &str, message: String) -> CallError {
    let mut errors = RowErrors::default();
    errors.push(row, Some(column), "fold", message);
    CallError::Rows(errors.into_vec())
}

/// A FIELD_* event's value, by its kind (blob bytes are not read).
fn value(c: &Cols, kind: &str, row: usize) -> Value {
    let text = |name: &str| c.str(name, row).map(str::to_string);
    match kind {
        "int" => c.i64("value_i64", row).map_or(Value::Null, Value::from),
        "float" => {
            c.0.column_by_name("value_f64")
                .filter(|a| a.is_valid(row))
                .map_or(Value::Null, |a| {
                    json!(a.as_primitive::<Float64Type>().value(row))
                })
        }
        "bool" => {
            c.0.column_by_name("value_bool")
                .filter(|a| a.is_valid(row))
                .map_or(Value::Null, |a| json!(a.as_boolean().value(row)))
        }
        "str" => text("value_str").map_or(Value::Null, Value::from),
        "json" => text("value_json").map_or(Value::Null, |t| {
            serde_json::from_str(&t).unwrap_or(Value::String(t))
        }),
        _ => Value::Null,
    }
}

struct Field {
    kind: String,
    append: bool,
    value: Value,
}

/// The item's state, or `{"item": null}` when its first event is not
/// ITEM_CREATED ("never started").
pub fn fold(rows: &RecordBatch) -> Result<Value, CallError> {
    let c = Cols(rows);
    let str_at = |name: &str, row: usize| c.str(name, row).map(str::to_string);
    let n = rows.num_rows();
    if n == 0 || str_at("event_type", 0).as_deref() != Some("ITEM_CREATED") {
        return Ok(json!({ "item": null }));
    }
    let mut status = str_at("status", 0).unwrap_or_else(|| "running".into());
    let mut last_seq = i64::MIN;
    let mut last_attempt = 0i64;
    let mut fields: BTreeMap<String, Field> = BTreeMap::new();
    let mut blob_events: BTreeMap<String, String> = BTreeMap::new();
    let mut started: BTreeSet<String> = BTreeSet::new();
    let mut completed: BTreeSet<String> = BTreeSet::new();
    let mut trajectory: Vec<Value> = Vec::new();
    let mut failures: Vec<Value> = Vec::new();
    let query_tags = str_at("query_tags_json", 0)
        .map(|t| serde_json::from_str(&t).unwrap_or(Value::String(t)))
        .unwrap_or(Value::Null);
    let mut previous: Option<(i64, String)> = None;
    for row in 0..n {
        let seq = c.i64("item_seq", row).unwrap_or(0);
        let event_id = str_at("event_id", row).unwrap_or_default();
        if let Some((p_seq, p_id)) = &previous {
            if *p_seq == seq && *p_id != event_id {
                return Err(problem(
                    row,
                    "item_seq",
                    format!("two different events at item_seq {seq} ('{p_id}' and '{event_id}')"),
                ));
            }
            if *p_seq > seq {
                return Err(problem(
                    row,
                    "item_seq",
                    "events are not in item_seq order".to_string(),
                ));
            }
        }
        previous = Some((seq, event_id.clone()));
        last_seq = last_seq.max(seq);
        last_attempt = last_attempt.max(c.i64("attempt", row).unwrap_or(0));
        let step = str_at("step_name", row);
        match c.str("event_type", row).unwrap_or_default() {
            "STEP_STARTED" => {
                started.extend(step);
            }
            "STEP_COMPLETED" => {
                trajectory.push(json!({
                    "position": trajectory.len(),
                    "item_seq": seq,
                    "step_name": step,
                    "step_index": c.i64("step_index", row),
                }));
                completed.extend(step);
            }
            "FAILED" => failures.push(json!({
                "item_seq": seq,
                "step_name": step,
                "error_type": str_at("error_type", row),
                "attempt": c.i64("attempt", row),
            })),
            "TERMINAL" => {
                if let Some(s) = str_at("status", row) {
                    status = s;
                }
            }
            t @ ("FIELD_SET" | "FIELD_APPEND") => {
                let name = str_at("field_name", row).unwrap_or_default();
                let kind = str_at("value_kind", row).unwrap_or_default();
                let append = t == "FIELD_APPEND";
                let value = value(&c, &kind, row);
                if kind == "blob" {
                    blob_events.insert(name.clone(), event_id.clone());
                }
                match fields.get_mut(&name) {
                    None => {
                        let value = if append { json!([value]) } else { value };
                        fields.insert(
                            name,
                            Field {
                                kind,
                                append,
                                value,
                            },
                        );
                    }
                    Some(f) => {
                        if f.kind != kind {
                            return Err(problem(
                                row,
                                "value_kind",
                                format!(
                                    "field '{name}' was {}, now {kind}: a field's kind cannot change",
                                    f.kind
                                ),
                            ));
                        }
                        if f.append != append {
                            return Err(problem(
                                row,
                                "event_type",
                                format!(
                                    "field '{name}': FIELD_SET and FIELD_APPEND cannot be mixed"
                                ),
                            ));
                        }
                        if append {
                            if let Value::Array(items) = &mut f.value {
                                items.push(value);
                            }
                        } else {
                            f.value = value;
                        }
                    }
                }
            }
            _ => {}
        }
    }
    let fields: serde_json::Map<String, Value> = fields
        .into_iter()
        .map(|(name, f)| {
            (
                name,
                json!({
                    "kind": f.kind,
                    "mode": if f.append { "append" } else { "set" },
                    "value": f.value,
                }),
            )
        })
        .collect();
    Ok(json!({
        "item": {
            "item_id": str_at("item_id", 0),
            "root_item_id": str_at("root_item_id", 0),
            "status": status,
            "last_item_seq": last_seq,
            "last_attempt": last_attempt,
            "query_tags": query_tags,
            "fields": fields,
            "started": started,
            "completed": completed,
            "trajectory": trajectory,
            "failures": failures,
            "blob_event_ids": blob_events,
        }
    }))
}
