//! The built-in datagen schema (34 columns, keyed by `event_id`;
//! `docs/schemas.md`): an append-only checkpoint event log from which item
//! state is folded.
//!
//! validate, per event: non-empty `event_id`, `item_id`, `root_item_id`,
//! `checkpoint_id`, `run_id`, `writer_epoch`; `item_seq` ≥ 0, `attempt` ≥ 0,
//! `schema_version` > 0; enum values of `event_type`, `step_kind`, `status`,
//! `value_kind`; FIELD_* events carry `field_name`, `field_type`,
//! `codec_version` and exactly the value column their `value_kind` names;
//! STEP_*, FIELD_* and FAILED carry `step_name`, `step_kind`, `step_index`;
//! FAILED carries `error_type`; TERMINAL has status completed or filtered; a blob
//! value's bytes match its `payload_size`. Per batch: one `event_id` never has
//! two different contents, and one (`item_id`, `item_seq`) never two event ids.
//!
//! transform (defaults): `attempt` = 0, `event_ts` = now.
//!
//! reduce: the fold of an item's events ([`fold`]) for the `item_state` and
//! `item_trajectory` named queries.

pub mod fold;

use std::collections::HashMap;
use std::sync::Arc;

use lance_context_plugin::arrow_array::cast::AsArray;
use lance_context_plugin::arrow_array::types::{Int32Type, Int64Type};
use lance_context_plugin::*;

/// Plugin version.
pub const VERSION: &str = "0.1.0";

/// `event_type` values.
pub const EVENT_TYPES: &[&str] = &[
    "ITEM_CREATED",
    "STEP_STARTED",
    "FIELD_SET",
    "FIELD_APPEND",
    "STEP_COMPLETED",
    "FAILED",
    "TERMINAL",
];
/// `step_kind` values.
pub const STEP_KINDS: &[&str] = &[
    "root",
    "leaf",
    "sequence",
    "loop",
    "map_reduce",
    "branch",
    "sub_pipeline",
    "conditional",
    "router",
];
/// `status` values.
pub const STATUSES: &[&str] = &["running", "completed", "filtered", "failed"];
/// `value_kind` values and the column each one uses.
pub const VALUE_KINDS: &[(&str, &str)] = &[
    ("int", "value_i64"),
    ("float", "value_f64"),
    ("bool", "value_bool"),
    ("str", "value_str"),
    ("json", "value_json"),
    ("blob", "value_blob"),
];

fn f(name: &str, ty: DataType, nullable: bool) -> Field {
    Field::new(name, ty, nullable)
}

/// The datagen schema, column for column.
pub fn schema() -> Schema {
    use DataType::*;
    Schema::new(vec![
        key_field("event_id"),
        f("item_id", Utf8, false),
        f("root_item_id", Utf8, false),
        f("parent_item_id", Utf8, true),
        f("item_seq", Int64, false),
        f("checkpoint_id", Utf8, false),
        f("event_type", Utf8, false),
        f("step_name", Utf8, true),
        f("step_kind", Utf8, true),
        f("step_index", Int64, true),
        f("enclosing_step", Utf8, true),
        f("selector_step", Utf8, true),
        f("attempt", Int32, false),
        f("run_id", Utf8, false),
        f("writer_epoch", Utf8, false),
        f("field_name", Utf8, true),
        f("field_type", Utf8, true),
        f("codec_version", Int32, true),
        f("value_kind", Utf8, true),
        f("value_i64", Int64, true),
        f("value_f64", Float64, true),
        f("value_bool", Boolean, true),
        f("value_str", LargeUtf8, true),
        f("value_json", LargeUtf8, true),
        f("value_blob", LargeBinary, true),
        f("payload_size", Int64, true),
        f("payload_checksum", Utf8, true),
        f("query_tags_json", LargeUtf8, true),
        f("status", Utf8, true),
        f("error_type", Utf8, true),
        f("error_dump", LargeUtf8, true),
        f("traceback", LargeUtf8, true),
        f(
            "event_ts",
            Timestamp(TimeUnit::Microsecond, Some("UTC".into())),
            false,
        ),
        f("schema_version", Int32, false),
    ])
}

/// The datagen plugin.
pub struct Datagen;

impl Plugin for Datagen {
    fn describe(params: &Params) -> Result<Declaration, InvalidParams> {
        if let Some((name, _)) = params.first() {
            return Err(format!("the datagen schema takes no parameters (got '{name}')").into());
        }
        Ok(Declaration::new("datagen", VERSION, schema())
            .with_key("event_id")
            .with_blob("value_blob")
            .with_transform()
            .with_reduce_query(
                "item_state",
                "one item's state folded from its events: status, fields, steps started and completed, trajectory, failures",
                &["item_id"],
                "item_id = {item_id}",
                &["item_seq", "event_id"],
            )
            .with_reduce_query(
                "item_trajectory",
                "one item's trajectory: its completed steps in order ({position, item_seq, step_name, step_index})",
                &["item_id"],
                "item_id = {item_id}",
                &["item_seq", "event_id"],
            )
            .with_query(
                "item_events",
                "the events of one item, in fold order (the input of its fold)",
                &["item_id"],
                "item_id = {item_id}",
                &["item_seq", "event_id"],
            )
            .with_query(
                "root_events",
                "the events of a root item and its fan-out sub-items",
                &["root_item_id"],
                "root_item_id = {root_item_id}",
                &["item_id", "item_seq", "event_id"],
            )
            .with_query(
                "failures",
                "FAILED events of one run",
                &["run_id"],
                "event_type = 'FAILED' AND run_id = {run_id}",
                &["item_id", "item_seq", "event_id"],
            ))
    }

    fn validate(batch: &RecordBatch, _call: &CallInfo, errors: &mut RowErrors) {
        validate_events(batch, errors);
    }

    fn transform(batch: RecordBatch, call: &CallInfo) -> Result<RecordBatch, RowErrors> {
        fill_defaults(batch, call.now_micros)
    }

    fn reduce(query: &str, rows: &RecordBatch, _call: &CallInfo) -> Result<String, CallError> {
        let state = fold::fold(rows)?;
        let out = match query {
            "item_state" => state,
            "item_trajectory" => state
                .get("item")
                .and_then(|i| i.get("trajectory"))
                .cloned()
                .unwrap_or(serde_json::Value::Null),
            other => {
                return Err(CallError::Malformed(format!(
                    "the datagen schema reduces no query '{other}'"
                )));
            }
        };
        Ok(out.to_string())
    }
}

/// Read access to a batch's columns by name, tolerant of absent columns.
pub(crate) struct Cols<'a>(pub(crate) &'a RecordBatch);

impl Cols<'_> {
    pub(crate) fn str(&self, name: &str, row: usize) -> Option<&str> {
        let c = self.0.column_by_name(name)?;
        if c.is_null(row) {
            return None;
        }
        match c.data_type() {
            DataType::Utf8 => Some(c.as_string::<i32>().value(row)),
            DataType::LargeUtf8 => Some(c.as_string::<i64>().value(row)),
            _ => None,
        }
    }

    pub(crate) fn i64(&self, name: &str, row: usize) -> Option<i64> {
        let c = self.0.column_by_name(name)?;
        if c.is_null(row) {
            return None;
        }
        match c.data_type() {
            DataType::Int64 => Some(c.as_primitive::<Int64Type>().value(row)),
            DataType::Int32 => Some(c.as_primitive::<Int32Type>().value(row) as i64),
            _ => None,
        }
    }

    fn is_set(&self, name: &str, row: usize) -> bool {
        self.0.column_by_name(name).is_some_and(|c| c.is_valid(row))
    }

    fn bytes_len(&self, name: &str, row: usize) -> Option<usize> {
        let c = self.0.column_by_name(name)?;
        (c.is_valid(row) && c.data_type() == &DataType::LargeBinary)
            .then(|| c.as_binary::<i64>().value(row).len())
    }
}

fn validate_events(batch: &RecordBatch, errors: &mut RowErrors) {
    let cols = Cols(batch);
    for row in 0..batch.num_rows() {
        for name in [
            "event_id",
            "item_id",
            "root_item_id",
            "checkpoint_id",
            "run_id",
            "writer_epoch",
        ] {
            if cols.str(name, row).is_none_or(str::is_empty) {
                errors.push(row, Some(name), "required", format!("{name} is required"));
            }
        }
        match cols.i64("item_seq", row) {
            None => errors.push(row, Some("item_seq"), "required", "item_seq is required"),
            Some(v) if v < 0 => errors.push(
                row,
                Some("item_seq"),
                "range",
                format!("item_seq must be >= 0, got {v}"),
            ),
            _ => {}
        }
        if let Some(v) = cols.i64("attempt", row).filter(|v| *v < 0) {
            errors.push(
                row,
                Some("attempt"),
                "range",
                format!("attempt must be >= 0, got {v}"),
            );
        }
        match cols.i64("schema_version", row) {
            None => errors.push(
                row,
                Some("schema_version"),
                "required",
                "schema_version is required",
            ),
            Some(v) if v <= 0 => errors.push(
                row,
                Some("schema_version"),
                "range",
                format!("schema_version must be > 0, got {v}"),
            ),
            _ => {}
        }
        check_enum(&cols, row, "step_kind", STEP_KINDS, errors);
        check_enum(&cols, row, "status", STATUSES, errors);
        let kinds: Vec<&str> = VALUE_KINDS.iter().map(|(k, _)| *k).collect();
        check_enum(&cols, row, "value_kind", &kinds, errors);

        let Some(event_type) = cols.str("event_type", row) else {
            errors.push(
                row,
                Some("event_type"),
                "required",
                "event_type is required",
            );
            continue;
        };
        if !EVENT_TYPES.contains(&event_type) {
            errors.push(
                row,
                Some("event_type"),
                "enum",
                format!(
                    "event_type '{event_type}' is not one of {}",
                    EVENT_TYPES.join(", ")
                ),
            );
            continue;
        }
        let is_field = event_type.starts_with("FIELD_");
        let require = |names: [&str; 3], errors: &mut RowErrors| {
            for name in names {
                if !cols.is_set(name, row) {
                    errors.push(
                        row,
                        Some(name),
                        "required",
                        format!("{event_type} needs {name}"),
                    );
                }
            }
        };
        if is_field || event_type.starts_with("STEP_") || event_type == "FAILED" {
            require(["step_name", "step_kind", "step_index"], errors);
        }
        if is_field {
            require(["field_name", "field_type", "codec_version"], errors);
            check_value(&cols, row, event_type, errors);
        }
        if event_type == "FAILED" && cols.str("error_type", row).is_none_or(str::is_empty) {
            errors.push(
                row,
                Some("error_type"),
                "required",
                "FAILED needs error_type",
            );
        }
        if event_type == "TERMINAL"
            && !matches!(cols.str("status", row), Some("completed" | "filtered"))
        {
            errors.push(
                row,
                Some("status"),
                "terminal-status",
                "TERMINAL needs status completed or filtered",
            );
        }
    }
    check_batch_consistency(batch, &cols, errors);
}

fn check_enum(cols: &Cols<'_>, row: usize, name: &str, allowed: &[&str], errors: &mut RowErrors) {
    if let Some(v) = cols.str(name, row)
        && !allowed.contains(&v)
    {
        errors.push(
            row,
            Some(name),
            "enum",
            format!("{name} '{v}' is not one of {}", allowed.join(", ")),
        );
    }
}

/// The value: a known kind, its column set, no other value column set, and a
/// blob's bytes matching its size.
fn check_value(cols: &Cols<'_>, row: usize, event_type: &str, errors: &mut RowErrors) {
    let Some(kind) = cols.str("value_kind", row) else {
        errors.push(
            row,
            Some("value_kind"),
            "required",
            format!("{event_type} needs a value"),
        );
        return;
    };
    let Some((_, column)) = VALUE_KINDS.iter().find(|(k, _)| *k == kind) else {
        return; // reported by the enum check
    };
    if !cols.is_set(column, row) {
        errors.push(
            row,
            Some(column),
            "value",
            format!("value_kind '{kind}' needs {column}"),
        );
    }
    for (_, other) in VALUE_KINDS.iter().filter(|(_, c)| c != column) {
        if cols.is_set(other, row) {
            errors.push(
                row,
                Some(other),
                "value",
                format!("value_kind '{kind}' sets only {column}, but {other} is set too"),
            );
        }
    }
    if kind == "blob"
        && let Some(len) = cols.bytes_len("value_blob", row)
    {
        match cols.i64("payload_size", row) {
            Some(size) if size as usize == len => {}
            Some(size) => errors.push(
                row,
                Some("payload_size"),
                "payload-size",
                format!("payload_size is {size} but value_blob has {len} bytes"),
            ),
            None => errors.push(
                row,
                Some("payload_size"),
                "required",
                "a blob value needs payload_size",
            ),
        }
    }
}

/// One event id, one content; one (item, seq), one event id.
fn check_batch_consistency(batch: &RecordBatch, cols: &Cols<'_>, errors: &mut RowErrors) {
    let mut by_event: HashMap<&str, usize> = HashMap::new();
    let mut by_seq: HashMap<(&str, i64), &str> = HashMap::new();
    for row in 0..batch.num_rows() {
        let Some(event_id) = cols.str("event_id", row).filter(|e| !e.is_empty()) else {
            continue;
        };
        match by_event.get(event_id) {
            Some(&first) => {
                if batch.slice(first, 1) != batch.slice(row, 1) {
                    errors.push(
                        row,
                        Some("event_id"),
                        "conflict",
                        format!(
                            "event_id '{event_id}' appears in row {first} with different content"
                        ),
                    );
                }
            }
            None => {
                by_event.insert(event_id, row);
            }
        }
        if let (Some(item), Some(seq)) = (cols.str("item_id", row), cols.i64("item_seq", row)) {
            match by_seq.get(&(item, seq)) {
                Some(other) if *other != event_id => errors.push(
                    row,
                    Some("item_seq"),
                    "conflict",
                    format!("item '{item}' seq {seq} already belongs to event '{other}'"),
                ),
                Some(_) => {}
                None => {
                    by_seq.insert((item, seq), event_id);
                }
            }
        }
    }
}

/// `attempt` = 0 and `event_ts` = now where null; returns the derived columns.
pub fn fill_defaults(batch: RecordBatch, now_micros: i64) -> Result<RecordBatch, RowErrors> {
    let rows = batch.num_rows();
    defaults::derive(Arc::new(schema()), &batch, |name, given| {
        Ok(match name {
            "attempt" => Some(defaults::int32_or(given, rows, 0)),
            "event_ts" => Some(defaults::timestamp_us_or(
                given,
                rows,
                now_micros,
                Some("UTC"),
            )),
            _ => None,
        })
    })
}

#[cfg(target_arch = "wasm32")]
export_plugin!(Datagen);

#[cfg(test)]
mod tests;
