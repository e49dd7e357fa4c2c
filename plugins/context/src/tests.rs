use std::sync::Arc;

use lance_context_plugin::arrow_array::types::{Int8Type, TimestampMicrosecondType};
use lance_context_plugin::arrow_array::{FixedSizeListArray, Float32Array};

use super::*;

fn p(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

#[test]
fn schema_matches_the_spec_column_for_column() {
    let s = schema(&ContextParams::default());
    let names: Vec<&str> = s.fields().iter().map(|f| f.name().as_str()).collect();
    assert_eq!(
        names,
        [
            "id",
            "external_id",
            "run_id",
            "bot_id",
            "session_id",
            "tenant",
            "source",
            "created_at",
            "role",
            "state_metadata",
            "metadata",
            "relationships",
            "expires_at",
            "retention_policy",
            "lifecycle_status",
            "retired_at",
            "retired_reason",
            "supersedes_id",
            "superseded_by_id",
            "content_type",
            "text_payload",
            "binary_payload",
            "payload_uri",
            "payload_size",
            "payload_checksum",
            "embedding",
        ]
    );
    let non_null: Vec<&str> = s
        .fields()
        .iter()
        .filter(|f| !f.is_nullable())
        .map(|f| f.name().as_str())
        .collect();
    assert_eq!(
        non_null,
        [
            "id",
            "run_id",
            "created_at",
            "role",
            "lifecycle_status",
            "content_type"
        ]
    );
    let ty = |n: &str| s.field_with_name(n).unwrap().data_type().clone();
    assert_eq!(ty("text_payload"), DataType::LargeUtf8);
    assert_eq!(ty("metadata"), DataType::LargeUtf8);
    assert_eq!(
        ty("embedding"),
        DataType::FixedSizeList(Arc::new(Field::new("item", DataType::Float32, true)), 1536)
    );
    match ty("state_metadata") {
        DataType::Struct(children) => {
            let c: Vec<(&str, &DataType)> = children
                .iter()
                .map(|f| (f.name().as_str(), f.data_type()))
                .collect();
            assert_eq!(
                c,
                [
                    ("step", &DataType::Int32),
                    ("active_plan_id", &DataType::Utf8),
                    ("tokens_used", &DataType::Int32),
                    ("custom", &DataType::Utf8),
                ]
            );
        }
        other => panic!("{other}"),
    }
    assert_eq!(
        s.metadata().get(METRIC_METADATA).map(String::as_str),
        Some("l2")
    );
}

#[test]
fn parameters_shape_the_schema_and_bad_ones_are_named() {
    let declared = Context::describe(&p(&[
        ("embedding_dim", "8"),
        ("distance_metric", "\"cosine\""),
        ("blob_columns", "[\"text_payload\"]"),
    ]))
    .unwrap();
    let s = &declared.schema;
    assert_eq!(
        s.metadata().get(METRIC_METADATA).map(String::as_str),
        Some("cosine")
    );
    let text = s.field_with_name("text_payload").unwrap();
    assert_eq!(text.data_type(), &DataType::LargeBinary);
    assert_eq!(
        text.metadata().get(BLOB_METADATA).map(String::as_str),
        Some("true")
    );
    assert_eq!(declared.blob_columns, ["text_payload"]);
    assert_eq!(declared.vector_columns[0].dimension, 8);
    assert_eq!(declared.vector_columns[0].metric, Metric::Cosine);
    assert_eq!(declared.secondary_key.as_deref(), Some("external_id"));
    assert!(declared.capabilities.tombstones && declared.capabilities.lifecycle);

    for (params, needle) in [
        (p(&[("embedding_dim", "0")]), "embedding_dim"),
        (p(&[("embedding_dim", "\"8\"")]), "embedding_dim"),
        (
            p(&[("distance_metric", "\"manhattan\"")]),
            "distance_metric",
        ),
        (p(&[("blob_columns", "[\"metadata\"]")]), "blob_columns"),
        (p(&[("colour", "\"blue\"")]), "colour"),
        (p(&[("embedding_dim", "{")]), "embedding_dim"),
    ] {
        let err = Context::describe(&params).unwrap_err();
        assert!(err.message().contains(needle), "{params:?}: {err}");
    }
}

fn records(ids: &[&str], external: &[Option<&str>], content_types: &[Option<&str>]) -> RecordBatch {
    let schema = Schema::new(vec![
        Field::new("id", DataType::Utf8, true),
        Field::new("run_id", DataType::Utf8, true),
        Field::new("external_id", DataType::Utf8, true),
        Field::new("content_type", DataType::Utf8, true),
        Field::new(
            "embedding",
            DataType::FixedSizeList(Arc::new(Field::new("item", DataType::Float32, true)), 2),
            true,
        ),
    ]);
    let n = ids.len();
    let embedding = FixedSizeListArray::try_new(
        Arc::new(Field::new("item", DataType::Float32, true)),
        2,
        Arc::new(Float32Array::from(vec![0.5; n * 2])),
        None,
    )
    .unwrap();
    RecordBatch::try_new(
        Arc::new(schema),
        vec![
            Arc::new(StringArray::from(ids.to_vec())),
            Arc::new(StringArray::from(vec!["run"; n])),
            Arc::new(StringArray::from(external.to_vec())),
            Arc::new(StringArray::from(content_types.to_vec())),
            Arc::new(embedding),
        ],
    )
    .unwrap()
}

fn problems(batch: &RecordBatch) -> Vec<(u32, Option<String>, String)> {
    let mut errors = RowErrors::default();
    Context::validate(batch, &CallInfo::default(), &mut errors);
    errors
        .into_vec()
        .into_iter()
        .map(|e| (e.row, e.column, e.code))
        .collect()
}

#[test]
fn validation_rules_name_row_and_column() {
    let ok = records(&["a", "b"], &[Some("x"), None], &[None, Some("text/plain")]);
    assert_eq!(problems(&ok), vec![]);
    let bad = records(
        &["a", "a", "", "d"],
        &[Some("x"), Some("x"), None, Some("")],
        &[None, Some(TOMBSTONE_CONTENT_TYPE), None, None],
    );
    let col = |c: &str| Some(c.to_string());
    assert_eq!(
        problems(&bad),
        vec![
            (1, col("external_id"), "duplicate".to_string()),
            (1, col("id"), "duplicate".to_string()),
            (1, col("content_type"), "reserved".to_string()),
            (2, col("id"), "required".to_string()),
            (3, col("external_id"), "required".to_string()),
        ]
    );
}

#[test]
fn transform_fills_defaults_for_the_store_params() {
    let call = CallInfo {
        now_micros: 5,
        params: p(&[("embedding_dim", "2"), ("distance_metric", "\"dot\"")]),
    };
    let input = records(&["a"], &[None], &[None]);
    let derived = Context::transform(input.clone(), &call).unwrap();
    let params = parse_params(&call.params).unwrap();
    let out = defaults::apply(Arc::new(schema(&params)), &input, &derived).unwrap();
    assert_eq!(out.schema().as_ref(), &schema(&params));
    let col = |n: &str| out.column_by_name(n).unwrap().clone();
    assert_eq!(
        col("content_type").as_string::<i32>().value(0),
        "text/plain"
    );
    assert_eq!(
        col("lifecycle_status").as_string::<i32>().value(0),
        "active"
    );
    let role = col("role");
    let role = role.as_dictionary::<Int8Type>();
    assert_eq!(
        role.values()
            .as_string::<i32>()
            .value(role.keys().value(0) as usize),
        "user"
    );
    assert_eq!(
        col("created_at")
            .as_primitive::<TimestampMicrosecondType>()
            .value(0),
        5
    );
    // Only the filled columns cross back.
    assert_eq!(
        derived
            .schema()
            .fields()
            .iter()
            .map(|f| f.name().as_str())
            .collect::<Vec<_>>(),
        ["created_at", "role", "lifecycle_status", "content_type"]
    );
    // An embedding of the wrong width does not fit the declared schema.
    let wide = parse_params(&p(&[("embedding_dim", "3")])).unwrap();
    assert!(defaults::apply(Arc::new(schema(&wide)), &input, &derived).is_err());
}
