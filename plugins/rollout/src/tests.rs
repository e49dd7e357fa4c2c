use std::sync::Arc;

use lance_context_plugin::arrow_array::builder::{
    Float32Builder, ListBuilder, StringBuilder, StructBuilder,
};
use lance_context_plugin::arrow_array::{Int64Array, LargeBinaryArray};
use lance_context_plugin::ipc;

use lance_context_plugin::arrow_array::StringArray;
use lance_context_plugin::arrow_array::types::{Int8Type, Int32Type};

use super::*;

/// The rollout schema's columns (docs/schemas.md): name, type, nullable.
#[test]
fn schema_matches_the_spec_column_for_column() {
    let s = schema();
    assert_eq!(s.fields().len(), 36);
    let expect: &[(&str, &str, bool)] = &[
        ("id", "Utf8", false),
        ("rollout_id", "Utf8", false),
        ("problem_id", "Utf8", false),
        ("dataset", "Utf8", true),
        ("sequence_order", "Int32", false),
        ("role", "Dictionary(Int8, Utf8)", false),
        ("created_at", "Timestamp(µs)", false),
        ("content", "LargeUtf8", true),
        ("content_type", "Utf8", false),
        ("model_input_string", "LargeUtf8", true),
        ("model_output_string", "LargeUtf8", true),
        ("rationale", "LargeUtf8", true),
        ("problem_text", "LargeUtf8", true),
        ("user_metadata", "LargeUtf8", true),
        ("input_tokens", "List(Int32)", true),
        ("output_tokens", "List(Int32)", true),
        ("num_input_tokens", "Int32", true),
        ("num_output_tokens", "Int32", true),
        ("output_logprobs", "List(Float32)", true),
        ("input_logprobs", "List(Float32)", true),
        ("ref_logprobs", "List(Float32)", true),
        ("loss_mask", "List(Int8)", true),
        ("advantage", "Float32", true),
        ("reward", "Float32", true),
        ("raw_reward", "Float32", true),
        ("grader_id", "Utf8", true),
        ("score", "Float32", true),
        ("include_in_training", "Boolean", true),
        ("exclude_reason", "Utf8", true),
        ("policy_version", "Utf8", true),
        ("relationships", "List(Struct)", true),
        ("binary_payload", "LargeBinary", true),
        ("payload_size", "Int64", true),
        ("payload_checksum", "Utf8", true),
        ("artifact_type", "Utf8", true),
        ("metadata", "LargeUtf8", true),
    ];
    for (field, (name, ty, nullable)) in s.fields().iter().zip(expect) {
        assert_eq!(field.name(), name);
        assert_eq!(field.is_nullable(), *nullable, "{name}");
        let got = match field.data_type() {
            DataType::Timestamp(TimeUnit::Microsecond, None) => "Timestamp(µs)".to_string(),
            DataType::List(item) => match item.data_type() {
                DataType::Struct(children) => {
                    let names: Vec<&str> = children.iter().map(|c| c.name().as_str()).collect();
                    assert_eq!(names, ["target_id", "relation", "weight"]);
                    assert_eq!(item.name(), "item");
                    assert!(item.is_nullable());
                    "List(Struct)".to_string()
                }
                other => format!("List({other})"),
            },
            other => other.to_string(),
        };
        assert_eq!(&got, ty, "{name}");
    }
    let key = s.field_with_name("id").unwrap();
    assert_eq!(
        key.metadata().get(PRIMARY_KEY_METADATA).map(String::as_str),
        Some("true")
    );
    assert!(s.metadata().is_empty(), "no schema-level metadata");
}

/// A minimal client batch: ids, rollout ids, content; everything else absent.
fn client_batch(ids: &[Option<&str>], rollouts: &[Option<&str>]) -> RecordBatch {
    RecordBatch::try_new(
        Arc::new(Schema::new(vec![
            Field::new("id", DataType::Utf8, true),
            Field::new("rollout_id", DataType::Utf8, true),
            Field::new("content", DataType::LargeUtf8, true),
        ])),
        vec![
            Arc::new(StringArray::from(ids.to_vec())),
            Arc::new(StringArray::from(rollouts.to_vec())),
            Arc::new(arrow_array::LargeStringArray::from(vec![
                Some("hi");
                ids.len()
            ])),
        ],
    )
    .unwrap()
}

fn errors_of(batch: &RecordBatch) -> Vec<RowError> {
    let mut errors = RowErrors::default();
    Rollout::validate(batch, &CallInfo::default(), &mut errors);
    errors.into_vec()
}

#[test]
fn good_rows_pass_and_missing_required_fields_are_named() {
    assert!(
        errors_of(&client_batch(
            &[Some("a"), Some("b")],
            &[Some("r"), Some("r")]
        ))
        .is_empty()
    );
    let errors = errors_of(&client_batch(
        &[Some("a"), Some(""), None],
        &[Some("r"), Some("r"), None],
    ));
    let found: Vec<(u32, Option<&str>, &str)> = errors
        .iter()
        .map(|e| (e.row, e.column.as_deref(), e.code.as_str()))
        .collect();
    assert_eq!(
        found,
        vec![
            (1, Some("id"), "required"),
            (2, Some("id"), "required"),
            (2, Some("rollout_id"), "required"),
        ]
    );
}

#[test]
fn payload_size_must_match_the_bytes() {
    let batch = RecordBatch::try_new(
        Arc::new(Schema::new(vec![
            Field::new("id", DataType::Utf8, false),
            Field::new("rollout_id", DataType::Utf8, false),
            Field::new("binary_payload", DataType::LargeBinary, true),
            Field::new("payload_size", DataType::Int64, true),
        ])),
        vec![
            Arc::new(StringArray::from(vec!["a", "b", "c", "d"])),
            Arc::new(StringArray::from(vec!["r"; 4])),
            Arc::new(LargeBinaryArray::from(vec![
                Some(b"abc".as_slice()),
                Some(b"abc".as_slice()),
                None,
                None,
            ])),
            Arc::new(Int64Array::from(vec![Some(3), Some(4), Some(2), None])),
        ],
    )
    .unwrap();
    let errors = errors_of(&batch);
    let found: Vec<(u32, &str)> = errors.iter().map(|e| (e.row, e.code.as_str())).collect();
    assert_eq!(
        found,
        vec![(1, "payload-size"), (2, "payload-size-without-bytes")]
    );
    assert!(
        errors
            .iter()
            .all(|e| e.column.as_deref() == Some("payload_size"))
    );
}

#[test]
fn relationships_need_a_target_and_a_relation() {
    let fields = vec![
        Field::new("target_id", DataType::Utf8, true),
        Field::new("relation", DataType::Utf8, true),
        Field::new("weight", DataType::Float32, true),
    ];
    let mut list = ListBuilder::new(StructBuilder::new(
        fields.clone(),
        vec![
            Box::new(StringBuilder::new()),
            Box::new(StringBuilder::new()),
            Box::new(Float32Builder::new()),
        ],
    ));
    // Row 0: one complete relationship. Row 1: one without a relation.
    for (target, relation) in [(Some("t"), Some("parent")), (Some("t"), None)] {
        let s = list.values();
        s.field_builder::<StringBuilder>(0)
            .unwrap()
            .append_option(target);
        s.field_builder::<StringBuilder>(1)
            .unwrap()
            .append_option(relation);
        s.field_builder::<Float32Builder>(2).unwrap().append_null();
        s.append(true);
        list.append(true);
    }
    let relationships = list.finish();
    let batch = RecordBatch::try_new(
        Arc::new(Schema::new(vec![
            Field::new("id", DataType::Utf8, false),
            Field::new("rollout_id", DataType::Utf8, false),
            Field::new("relationships", relationships.data_type().clone(), true),
        ])),
        vec![
            Arc::new(StringArray::from(vec!["a", "b"])),
            Arc::new(StringArray::from(vec!["r", "r"])),
            Arc::new(relationships),
        ],
    )
    .unwrap();
    let errors = errors_of(&batch);
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert_eq!(
        (errors[0].row, errors[0].code.as_str()),
        (1, "relationship")
    );
}

#[test]
fn transform_fills_the_documented_defaults() {
    let input = client_batch(&[Some("a"), Some("b")], &[Some("r1"), Some("r2")]);
    let derived = fill_defaults(input.clone(), 42).unwrap();
    let out = defaults::apply(Arc::new(schema()), &input, &derived).unwrap();
    assert_eq!(out.schema().as_ref(), &schema());
    let col = |name: &str| out.column_by_name(name).unwrap().clone();
    assert_eq!(col("problem_id").as_string::<i32>().value(1), "r2");
    assert_eq!(
        col("sequence_order").as_primitive::<Int32Type>().value(0),
        0
    );
    let roles = col("role");
    let roles = roles.as_dictionary::<Int8Type>();
    let values = roles.values().as_string::<i32>();
    assert_eq!(values.value(roles.keys().value(1) as usize), "assistant");
    assert_eq!(
        col("content_type").as_string::<i32>().value(0),
        "text/plain"
    );
    assert_eq!(
        col("created_at")
            .as_primitive::<arrow_array::types::TimestampMicrosecondType>()
            .value(0),
        42
    );
    assert!(col("reward").is_null(0));
}

#[test]
fn the_ipc_entry_points_round_trip_and_report_rows_across_batches() {
    let good = client_batch(&[Some("a")], &[Some("r")]);
    let bad = client_batch(&[Some("b"), None], &[Some("r"), Some("r")]);
    let bytes = ipc::encode(&[good.clone(), bad]).unwrap();
    match run_validate::<Rollout>(bytes, &CallInfo::default()) {
        Err(CallError::Rows(errors)) => {
            assert_eq!(errors.len(), 1);
            assert_eq!(errors[0].row, 2, "row numbers run across batches");
        }
        other => panic!("{other:?}"),
    }
    let call = CallInfo {
        now_micros: 7,
        params: Vec::new(),
    };
    let out = run_transform::<Rollout>(ipc::encode(&[good]).unwrap(), &call).unwrap();
    let back = ipc::decode(out).unwrap();
    let names: Vec<_> = back[0]
        .schema()
        .fields()
        .iter()
        .map(|f| f.name().clone())
        .collect();
    assert_eq!(
        names,
        [
            "problem_id",
            "sequence_order",
            "role",
            "created_at",
            "content_type"
        ]
    );
    // transform applies validate's checks: a bad row fails it too.
    let bad = client_batch(&[Some("b"), None], &[Some("r"), Some("r")]);
    match run_transform::<Rollout>(ipc::encode(&[bad]).unwrap(), &call) {
        Err(CallError::Rows(errors)) => assert_eq!(
            (errors[0].row, errors[0].column.as_deref()),
            (1, Some("id"))
        ),
        other => panic!("{other:?}"),
    }
    assert!(matches!(
        run_validate::<Rollout>(b"garbage".to_vec(), &CallInfo::default()),
        Err(CallError::Malformed(_))
    ));
    assert!(Rollout::describe(&[("x".into(), "1".into())]).is_err());
    let declared = Rollout::describe(&[]).unwrap();
    assert!(declared.has_transform);
    assert_eq!(declared.key_column, "id");
}
