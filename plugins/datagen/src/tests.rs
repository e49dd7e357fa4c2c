use std::sync::Arc;

use lance_context_plugin::arrow_array::{
    Int64Array, LargeBinaryArray, LargeStringArray, StringArray,
};

use lance_context_plugin::arrow_array::Int32Array;
use lance_context_plugin::arrow_array::types::TimestampMicrosecondType;

use super::*;

#[test]
fn schema_matches_the_spec_column_for_column() {
    let s = schema();
    let expect: &[(&str, &str, bool)] = &[
        ("event_id", "Utf8", false),
        ("item_id", "Utf8", false),
        ("root_item_id", "Utf8", false),
        ("parent_item_id", "Utf8", true),
        ("item_seq", "Int64", false),
        ("checkpoint_id", "Utf8", false),
        ("event_type", "Utf8", false),
        ("step_name", "Utf8", true),
        ("step_kind", "Utf8", true),
        ("step_index", "Int64", true),
        ("enclosing_step", "Utf8", true),
        ("selector_step", "Utf8", true),
        ("attempt", "Int32", false),
        ("run_id", "Utf8", false),
        ("writer_epoch", "Utf8", false),
        ("field_name", "Utf8", true),
        ("field_type", "Utf8", true),
        ("codec_version", "Int32", true),
        ("value_kind", "Utf8", true),
        ("value_i64", "Int64", true),
        ("value_f64", "Float64", true),
        ("value_bool", "Boolean", true),
        ("value_str", "LargeUtf8", true),
        ("value_json", "LargeUtf8", true),
        ("value_blob", "LargeBinary", true),
        ("payload_size", "Int64", true),
        ("payload_checksum", "Utf8", true),
        ("query_tags_json", "LargeUtf8", true),
        ("status", "Utf8", true),
        ("error_type", "Utf8", true),
        ("error_dump", "LargeUtf8", true),
        ("traceback", "LargeUtf8", true),
        ("event_ts", "Timestamp(µs, UTC)", false),
        ("schema_version", "Int32", false),
    ];
    assert_eq!(s.fields().len(), 34);
    for (field, (name, ty, nullable)) in s.fields().iter().zip(expect) {
        assert_eq!(field.name(), name);
        assert_eq!(field.is_nullable(), *nullable, "{name}");
        let got = match field.data_type() {
            DataType::Timestamp(TimeUnit::Microsecond, Some(tz)) if tz.as_ref() == "UTC" => {
                "Timestamp(µs, UTC)".to_string()
            }
            other => other.to_string(),
        };
        assert_eq!(&got, ty, "{name}");
    }
    let key = s.field_with_name("event_id").unwrap();
    assert_eq!(
        key.metadata().get(PRIMARY_KEY_METADATA).map(String::as_str),
        Some("true")
    );
    let declared = Datagen::describe(&[]).unwrap();
    assert_eq!(declared.key_column, "event_id");
}

/// One event, with the columns the tests vary.
#[derive(Clone, Default)]
struct Event {
    event_id: Option<&'static str>,
    item_seq: Option<i64>,
    event_type: Option<&'static str>,
    step: bool,
    step_kind: Option<&'static str>,
    field: bool,
    value_kind: Option<&'static str>,
    value_i64: Option<i64>,
    value_str: Option<&'static str>,
    value_blob: Option<&'static [u8]>,
    payload_size: Option<i64>,
    status: Option<&'static str>,
    error_type: Option<&'static str>,
    schema_version: Option<i64>,
}

fn ev(event_id: &'static str, seq: i64, event_type: &'static str) -> Event {
    Event {
        event_id: Some(event_id),
        item_seq: Some(seq),
        event_type: Some(event_type),
        schema_version: Some(2),
        ..Event::default()
    }
}

fn batch(events: &[Event]) -> RecordBatch {
    let n = events.len();
    let s = |v: Vec<Option<&str>>| Arc::new(StringArray::from(v)) as ArrayRef;
    let col = |f: &dyn Fn(&Event) -> Option<&'static str>| s(events.iter().map(f).collect());
    let fields = vec![
        ("event_id", col(&|e| e.event_id)),
        ("item_id", s(vec![Some("item-1"); n])),
        ("root_item_id", s(vec![Some("item-1"); n])),
        (
            "item_seq",
            Arc::new(Int64Array::from(
                events.iter().map(|e| e.item_seq).collect::<Vec<_>>(),
            )) as ArrayRef,
        ),
        ("checkpoint_id", s(vec![Some("item\0created"); n])),
        ("event_type", col(&|e| e.event_type)),
        ("step_name", col(&|e| e.step.then_some("generate"))),
        (
            "step_kind",
            col(&|e| {
                if e.step {
                    e.step_kind.or(Some("leaf"))
                } else {
                    e.step_kind
                }
            }),
        ),
        (
            "step_index",
            Arc::new(Int64Array::from(
                events
                    .iter()
                    .map(|e| e.step.then_some(0))
                    .collect::<Vec<_>>(),
            )) as ArrayRef,
        ),
        ("run_id", s(vec![Some("run-1"); n])),
        ("writer_epoch", s(vec![Some("epoch-1"); n])),
        ("field_name", col(&|e| e.field.then_some("answer"))),
        ("field_type", col(&|e| e.field.then_some("str"))),
        (
            "codec_version",
            Arc::new(Int32Array::from(
                events
                    .iter()
                    .map(|e| e.field.then_some(1))
                    .collect::<Vec<_>>(),
            )) as ArrayRef,
        ),
        ("value_kind", col(&|e| e.value_kind)),
        (
            "value_i64",
            Arc::new(Int64Array::from(
                events.iter().map(|e| e.value_i64).collect::<Vec<_>>(),
            )) as ArrayRef,
        ),
        (
            "value_str",
            Arc::new(LargeStringArray::from(
                events.iter().map(|e| e.value_str).collect::<Vec<_>>(),
            )) as ArrayRef,
        ),
        (
            "value_blob",
            Arc::new(LargeBinaryArray::from(
                events.iter().map(|e| e.value_blob).collect::<Vec<_>>(),
            )) as ArrayRef,
        ),
        (
            "payload_size",
            Arc::new(Int64Array::from(
                events.iter().map(|e| e.payload_size).collect::<Vec<_>>(),
            )) as ArrayRef,
        ),
        ("status", col(&|e| e.status)),
        ("error_type", col(&|e| e.error_type)),
        (
            "schema_version",
            Arc::new(Int32Array::from(
                events
                    .iter()
                    .map(|e| e.schema_version.map(|v| v as i32))
                    .collect::<Vec<_>>(),
            )) as ArrayRef,
        ),
    ];
    let schema = Schema::new(
        fields
            .iter()
            .map(|(name, array)| Field::new(*name, array.data_type().clone(), true))
            .collect::<Vec<_>>(),
    );
    RecordBatch::try_new(
        Arc::new(schema),
        fields.into_iter().map(|(_, a)| a).collect(),
    )
    .unwrap()
}

fn good_stream() -> Vec<Event> {
    vec![
        Event {
            status: Some("running"),
            ..ev("e0", 1, "ITEM_CREATED")
        },
        Event {
            step: true,
            step_kind: Some("sequence"),
            ..ev("e1", 2, "STEP_STARTED")
        },
        Event {
            step: true,
            field: true,
            value_kind: Some("int"),
            value_i64: Some(7),
            ..ev("e2", 3, "FIELD_SET")
        },
        Event {
            step: true,
            field: true,
            value_kind: Some("str"),
            value_str: Some("x"),
            ..ev("e3", 4, "FIELD_APPEND")
        },
        Event {
            step: true,
            field: true,
            value_kind: Some("blob"),
            value_blob: Some(b"abcd"),
            payload_size: Some(4),
            ..ev("e4", 5, "FIELD_SET")
        },
        Event {
            step: true,
            ..ev("e5", 6, "STEP_COMPLETED")
        },
        Event {
            step: true,
            error_type: Some("Timeout"),
            ..ev("e6", 7, "FAILED")
        },
        Event {
            status: Some("completed"),
            ..ev("e7", 8, "TERMINAL")
        },
    ]
}

fn problems(events: &[Event]) -> Vec<(u32, Option<String>, String)> {
    let mut errors = RowErrors::default();
    Datagen::validate(&batch(events), &CallInfo::default(), &mut errors);
    errors
        .into_vec()
        .into_iter()
        .map(|e| (e.row, e.column, e.code))
        .collect()
}

fn one(events: Vec<Event>) -> (u32, Option<String>, String) {
    let found = problems(&events);
    assert_eq!(found.len(), 1, "{found:?}");
    found.into_iter().next().unwrap()
}

#[test]
fn a_well_formed_stream_passes() {
    assert_eq!(problems(&good_stream()), vec![]);
}

#[test]
fn each_rule_rejects_its_row_and_column() {
    let col = |c: &str| Some(c.to_string());
    let mut s = good_stream();
    s[2].event_id = Some("");
    assert_eq!(one(s), (2, col("event_id"), "required".into()));

    let mut s = good_stream();
    s[3].item_seq = Some(-1);
    assert_eq!(one(s), (3, col("item_seq"), "range".into()));

    let mut s = good_stream();
    s[0].schema_version = Some(0);
    assert_eq!(one(s), (0, col("schema_version"), "range".into()));

    let mut s = good_stream();
    s[1].event_type = Some("STEP_PAUSED");
    assert_eq!(one(s), (1, col("event_type"), "enum".into()));

    let mut s = good_stream();
    s[1].step_kind = Some("spiral");
    assert_eq!(one(s), (1, col("step_kind"), "enum".into()));

    let mut s = good_stream();
    s[5].step = false;
    let found = problems(&s);
    assert_eq!(found.len(), 3, "{found:?}");
    assert!(
        found
            .iter()
            .all(|(row, _, code)| *row == 5 && code == "required")
    );

    let mut s = good_stream();
    s[2].value_i64 = None;
    assert_eq!(one(s), (2, col("value_i64"), "value".into()));

    let mut s = good_stream();
    s[2].value_str = Some("also");
    assert_eq!(one(s), (2, col("value_str"), "value".into()));

    let mut s = good_stream();
    s[4].payload_size = Some(5);
    assert_eq!(one(s), (4, col("payload_size"), "payload-size".into()));

    let mut s = good_stream();
    s[6].error_type = None;
    assert_eq!(one(s), (6, col("error_type"), "required".into()));

    let mut s = good_stream();
    s[7].status = Some("failed");
    assert_eq!(one(s), (7, col("status"), "terminal-status".into()));

    // The same event id with other content, and one (item, seq) under two ids.
    let mut s = good_stream();
    let mut again = s[2].clone();
    again.value_i64 = Some(8);
    s.push(again);
    assert_eq!(one(s), (8, col("event_id"), "conflict".into()));

    let mut s = good_stream();
    s.push(ev("e99", 3, "ITEM_CREATED"));
    assert_eq!(one(s), (8, col("item_seq"), "conflict".into()));

    // An identical retry of an event is fine (idempotent ids).
    let mut s = good_stream();
    s.push(s[2].clone());
    assert_eq!(problems(&s), vec![]);
}

#[test]
fn transform_fills_attempt_and_event_ts() {
    let input = batch(&good_stream());
    let derived = fill_defaults(input.clone(), 99).unwrap();
    let out = defaults::apply(Arc::new(schema()), &input, &derived).unwrap();
    assert_eq!(out.schema().as_ref(), &schema());
    let attempt = out
        .column_by_name("attempt")
        .unwrap()
        .as_primitive::<Int32Type>()
        .clone();
    assert_eq!(attempt.value(3), 0);
    let ts = out
        .column_by_name("event_ts")
        .unwrap()
        .as_primitive::<TimestampMicrosecondType>()
        .clone();
    assert_eq!(ts.value(0), 99);
}

fn folded(events: &[Event]) -> Result<serde_json::Value, CallError> {
    fold::fold(&batch(events))
}

#[test]
fn the_fold_builds_item_state() {
    let mut s = good_stream();
    // One field, appended twice (the fixture names every field "answer").
    s.retain(|e| !matches!(e.event_id, Some("e2") | Some("e4")));
    s.insert(
        2,
        Event {
            step: true,
            field: true,
            value_kind: Some("str"),
            value_str: Some("w"),
            ..ev("e2", 3, "FIELD_APPEND")
        },
    );
    let state = folded(&s).unwrap();
    let item = &state["item"];
    assert_eq!(item["status"], "completed");
    assert_eq!(item["last_item_seq"], 8);
    assert_eq!(item["fields"]["answer"]["mode"], "append");
    assert_eq!(
        item["fields"]["answer"]["value"],
        serde_json::json!(["w", "x"])
    );
    assert_eq!(item["started"], serde_json::json!(["generate"]));
    assert_eq!(item["completed"], serde_json::json!(["generate"]));
    assert_eq!(item["trajectory"][0]["item_seq"], 6);
    assert_eq!(item["trajectory"][0]["position"], 0);
    assert_eq!(item["failures"][0]["error_type"], "Timeout");

    // Blob bytes are not carried: the field names the event holding them.
    let blob = vec![good_stream()[0].clone(), good_stream()[4].clone()];
    let state = folded(&blob).unwrap();
    assert_eq!(state["item"]["blob_event_ids"]["answer"], "e4");
    assert_eq!(state["item"]["status"], "running");
}

#[test]
fn the_fold_refuses_inconsistent_streams() {
    // Never started.
    assert_eq!(
        folded(&good_stream()[1..]).unwrap(),
        serde_json::json!({"item": null})
    );
    let code = |r: Result<serde_json::Value, CallError>| match r {
        Err(CallError::Rows(e)) => (e[0].row, e[0].column.clone().unwrap()),
        other => panic!("{other:?}"),
    };
    // A field's kind changes (int, then str via append → also mixes modes;
    // kind is checked first).
    assert_eq!(code(folded(&good_stream()[..4])), (3, "value_kind".into()));
    // FIELD_SET then FIELD_APPEND of the same kind.
    let mut s = good_stream()[..3].to_vec();
    s.push(Event {
        step: true,
        field: true,
        value_kind: Some("int"),
        value_i64: Some(8),
        ..ev("e9", 4, "FIELD_APPEND")
    });
    assert_eq!(code(folded(&s)), (3, "event_type".into()));
    // Two different events at one item_seq.
    let mut s = good_stream()[..2].to_vec();
    s.push(Event {
        step: true,
        ..ev("e8", 2, "STEP_STARTED")
    });
    assert_eq!(code(folded(&s)), (2, "item_seq".into()));
}
