//! The spec's rules, each naming its field.

use super::*;
use crate::check::*;
use crate::query::*;
use std::collections::BTreeMap;

fn good() -> SchemaSpec {
    SchemaSpec::from_json(
        r#"{
          "name": "notes",
          "key": "id",
          "columns": [
            {"name": "id", "type": "Utf8", "nullable": false},
            {"name": "text", "type": "Utf8", "nullable": false, "rules": {"non_empty": true}},
            {"name": "priority", "type": "Int32", "rules": {"min": 1, "max": 5}},
            {"name": "at", "type": "Timestamp(µs)"},
            {"name": "tags", "type": "List(Utf8)"},
            {"name": "embedding", "type": "FixedSizeList(4 x Float32)"}
          ],
          "vectors": [{"column": "embedding", "dimension": 4, "metric": "cosine"}]
        }"#,
    )
    .unwrap()
}

#[test]
fn a_good_spec_gives_a_keyed_schema_and_round_trips() {
    let spec = good();
    let schema = spec.check(KeyRule::IdOnly).unwrap();
    assert_eq!(
        schema.field(0).metadata().get(PRIMARY_KEY_METADATA),
        Some(&"true".to_string())
    );
    // Back from Arrow: the same columns (value rules live in the spec only).
    let back = SchemaSpec::from_arrow("notes", "id", &schema);
    let shape = |s: &SchemaSpec| {
        s.columns
            .iter()
            .map(|c| (c.name.clone(), c.data_type.clone(), c.nullable))
            .collect::<Vec<_>>()
    };
    assert_eq!(shape(&back), shape(&spec));
    assert_eq!(SchemaSpec::from_json(&spec.to_json()).unwrap(), spec);
}

fn problems(spec: &SchemaSpec) -> Vec<String> {
    spec.check(KeyRule::IdOnly)
        .unwrap_err()
        .problems
        .iter()
        .map(|p| p.field.clone())
        .collect()
}

#[test]
fn every_problem_is_reported_naming_its_field() {
    let mut spec = good();
    spec.key = "event_id".into();
    spec.columns[2].data_type = "Float16".into();
    spec.columns[3].name = "_rowid".into();
    spec.columns.push(spec.columns[1].clone());
    spec.vectors[0].dimension = 0;
    spec.capabilities = vec![Capability::Tombstones, Capability::Tombstones];
    assert_eq!(
        problems(&spec),
        [
            "columns[2].type",
            "columns[3].name",
            "columns[6].name",
            "key",
            "key",
            "vectors[0].dimension",
            "vectors[0].column",
            "capabilities[0]",
            "capabilities[1]",
            "capabilities[1]"
        ]
    );
}

#[test]
fn unknown_metrics_and_capabilities_are_refused_where_they_enter() {
    let mut json: serde_json::Value = serde_json::from_str(&good().to_json()).unwrap();
    json["vectors"][0]["metric"] = "manhattan".into();
    json["capabilities"] = serde_json::json!(["unique_keys", "telepathy", "psychic"]);
    let err = SchemaSpec::from_json(&json.to_string()).unwrap_err();
    let fields: Vec<&str> = err.problems.iter().map(|p| p.field.as_str()).collect();
    assert_eq!(
        fields,
        ["vectors[0].metric", "capabilities[1]", "capabilities[2]"],
        "{err}"
    );
    assert!(
        err.to_string()
            .contains("unknown metric 'manhattan' (known: l2, cosine, dot)"),
        "{err}"
    );
    assert_eq!("unique_keys".parse(), Ok(Capability::UniqueKeys));
    assert_eq!(Metric::Cosine.to_string(), "cosine");
    for m in Metric::ALL {
        assert_eq!(m.as_str().parse(), Ok(*m));
    }
    for c in Capability::ALL {
        assert_eq!(c.as_str().parse(), Ok(*c));
    }
}

#[test]
fn each_rule_names_its_field() {
    type Mutation = Box<dyn Fn(&mut SchemaSpec)>;
    let cases: Vec<(&str, Mutation, &str)> = vec![
        (
            "nullable key",
            Box::new(|s| s.columns[0].nullable = true),
            "columns[0].nullable",
        ),
        (
            "key not Utf8",
            Box::new(|s| s.columns[0].data_type = "Int64".into()),
            "columns[0].type",
        ),
        (
            "_mem_wal",
            Box::new(|s| s.columns[1].name = "_mem_wal".into()),
            "columns[1].name",
        ),
        (
            "_anything",
            Box::new(|s| s.columns[1].name = "_x".into()),
            "columns[1].name",
        ),
        (
            "not a type",
            Box::new(|s| s.columns[1].data_type = "Text".into()),
            "columns[1].type",
        ),
        (
            "blob not binary",
            Box::new(|s| s.blob_columns = vec!["text".into()]),
            "blob_columns[0]",
        ),
        (
            "blob missing",
            Box::new(|s| s.blob_columns = vec!["nope".into()]),
            "blob_columns[0]",
        ),
        (
            "vector width",
            Box::new(|s| s.vectors[0].dimension = 8),
            "vectors[0].column",
        ),
        (
            "secondary key missing",
            Box::new(|s| s.secondary_key = Some("external_id".into())),
            "secondary_key",
        ),
        (
            "capability without its columns",
            Box::new(|s| s.capabilities = vec![Capability::Tombstones]),
            "capabilities[0]",
        ),
        (
            "tombstones without content_type",
            Box::new(|s| s.capabilities = vec![Capability::Tombstones]),
            "capabilities[0]",
        ),
        (
            "tombstone value",
            Box::new(|s| s.columns[1].rules.one_of = Some(vec![TOMBSTONE_CONTENT_TYPE.into()])),
            "columns[1].rules.one_of",
        ),
        (
            "min on a string",
            Box::new(|s| s.columns[1].rules.min = Some(1.0)),
            "columns[1].rules",
        ),
        (
            "zoned timestamp",
            Box::new(|s| s.columns[3].data_type = "Timestamp(µs, \"+08:00\")".into()),
            "columns[3].type",
        ),
    ];
    for (what, mutate, field) in cases {
        let mut spec = good();
        mutate(&mut spec);
        assert_eq!(problems(&spec), [field], "{what}");
    }
}

#[test]
fn named_queries_bind_their_params_and_are_checked() {
    let mut spec = good();
    spec.queries = vec![QuerySpec {
        name: "by_text".into(),
        description: String::new(),
        params: vec!["text".into()],
        filter: "text = {text} AND priority > 1".into(),
        order_by: vec!["priority desc".into(), "id".into()],
        reduce: false,
    }];
    assert!(spec.check(KeyRule::IdOnly).is_ok());
    let q = &spec.queries[0];
    assert_eq!(
        q.bind(&[("text".into(), "it's".into())]).unwrap(),
        "text = 'it''s' AND priority > 1"
    );
    assert!(matches!(
        q.bind(&[]),
        Err(BindError::MissingParam { param, .. }) if param == "text"
    ));
    assert!(q.bind(&[("text".into(), String::new())]).is_err());
    assert!(q.bind(&[("x".into(), "1".into())]).is_err());
    assert_eq!(
        q.order(),
        [("priority".to_string(), true), ("id".to_string(), false)]
    );
    // Two parameters: a value that looks like a placeholder, or like SQL,
    // stays inside its own literal (the template is filled in one pass).
    let two = QuerySpec {
        name: "two".into(),
        description: String::new(),
        params: vec!["t".into(), "i".into()],
        filter: "tenant = {t} AND item = {i}".into(),
        order_by: vec![],
        reduce: false,
    };
    assert_eq!(
        two.bind(&[
            ("t".into(), "{i}".into()),
            ("i".into(), " OR 1=1 OR tenant=".into())
        ])
        .unwrap(),
        "tenant = '{i}' AND item = ' OR 1=1 OR tenant='"
    );
    // Braces inside quotes are text, not placeholders.
    let braces = QuerySpec {
        name: "braces".into(),
        description: String::new(),
        params: vec!["t".into()],
        filter: "note = '{literal}' AND tenant = {t}".into(),
        order_by: vec![],
        reduce: false,
    };
    assert_eq!(
        braces.bind(&[("t".into(), "a".into())]).unwrap(),
        "note = '{literal}' AND tenant = 'a'"
    );
    spec.queries.push(QuerySpec {
        name: "by text".into(),
        description: String::new(),
        params: vec!["unused".into()],
        filter: "text = {other}".into(),
        order_by: vec!["nope".into(), "id sideways".into()],
        reduce: false,
    });
    spec.queries.push(QuerySpec {
        name: "quoted".into(),
        description: String::new(),
        params: vec!["t".into()],
        filter: "text = '{t}'".into(),
        order_by: vec![],
        reduce: false,
    });
    assert_eq!(
        problems(&spec),
        [
            "queries[1].name",
            "queries[1].filter",
            "queries[1].params",
            "queries[1].order_by[0]",
            "queries[1].order_by[1]",
            "queries[2].filter",
            "queries[2].params"
        ]
    );
}

#[test]
fn the_datagen_key_is_for_builtins_only() {
    let mut spec = good();
    spec.columns[0].name = "event_id".into();
    spec.key = "event_id".into();
    assert!(spec.check(KeyRule::Builtin).is_ok());
    assert_eq!(problems(&spec), ["key"]);
}

#[test]
fn syntax_errors_name_the_line() {
    let err = SchemaSpec::from_json("{\n \"name\": 3\n}").unwrap_err();
    assert!(err.problems[0].field.starts_with("line 2"), "{err}");
    let err =
        SchemaSpec::from_json(r#"{"name":"a","key":"id","columns":[],"extra":1}"#).unwrap_err();
    assert!(err.to_string().contains("extra"), "{err}");
}

/// `good()` with column 1 of type `t` (and no rules), checked.
fn with_type(t: &str) -> Result<(), SpecErrors> {
    let mut spec = good();
    spec.columns[1].data_type = t.to_string();
    spec.columns[1].rules = ColumnRules::default();
    spec.check(KeyRule::IdOnly).map(|_| ())
}

#[test]
fn declared_types_are_bounded_before_and_after_parsing() {
    // 100,000 nested `List(` would overflow Arrow's recursive parser: the
    // text is refused before it is parsed.
    let deep = format!("{}Int32{}", "List(".repeat(100_000), ")".repeat(100_000));
    let err = with_type(&deep).unwrap_err();
    assert!(err.to_string().contains("bytes long"), "{err}");
    let nine = format!("{}Int32{}", "List(".repeat(9), ")".repeat(9));
    let err = with_type(&nine).unwrap_err();
    assert!(err.to_string().contains("levels deep"), "{err}");
    assert!(with_type(&format!("{}Int32{}", "List(".repeat(7), ")".repeat(7))).is_ok());
    // A giant fixed-size list (a column of nulls would be n x rows).
    let err = with_type("FixedSizeList(2147483647 x Float32)").unwrap_err();
    assert!(err.to_string().contains("at most 65536"), "{err}");
    let err = with_type("FixedSizeList(65536 x FixedSizeList(65536 x Float32))").unwrap_err();
    assert!(err.to_string().contains("bytes"), "{err}");
    assert!(with_type("FixedSizeList(4096 x Float32)").is_ok());
    // Names are printable.
    let mut spec = good();
    spec.columns[1].name = "bad\u{1b}[2J".into();
    assert!(problems(&spec).contains(&"columns[1].name".to_string()));
    let mut spec = good();
    spec.columns = (0..2000)
        .map(|i| ColumnSpec {
            name: if i == 0 { "id".into() } else { format!("c{i}") },
            data_type: "Utf8".into(),
            nullable: i != 0,
            rules: ColumnRules::default(),
            metadata: BTreeMap::new(),
        })
        .collect();
    assert!(problems(&spec).contains(&"columns".to_string()));
}

/// Every type spelling the docs list (docs/plugins.md) is accepted and
/// means what they say.
#[test]
fn documented_type_spellings_parse() {
    use arrow_schema::{DataType, TimeUnit};
    use std::str::FromStr;
    let utc = || Some("UTC".into());
    for (text, expected) in [
        (
            "Timestamp(µs)",
            DataType::Timestamp(TimeUnit::Microsecond, None),
        ),
        (
            "Timestamp(µs, \"UTC\")",
            DataType::Timestamp(TimeUnit::Microsecond, utc()),
        ),
        (
            "Timestamp(Microsecond, None)",
            DataType::Timestamp(TimeUnit::Microsecond, None),
        ),
        (
            "Timestamp(Microsecond, Some(\"UTC\"))",
            DataType::Timestamp(TimeUnit::Microsecond, utc()),
        ),
        (
            "Timestamp(ms)",
            DataType::Timestamp(TimeUnit::Millisecond, None),
        ),
        (
            "Timestamp(s, \"UTC\")",
            DataType::Timestamp(TimeUnit::Second, utc()),
        ),
        (
            "Timestamp(ns)",
            DataType::Timestamp(TimeUnit::Nanosecond, None),
        ),
        ("Date32", DataType::Date32),
        (
            "Dictionary(Int8, Utf8)",
            DataType::Dictionary(Box::new(DataType::Int8), Box::new(DataType::Utf8)),
        ),
        (
            "FixedSizeList(4 x Float32)",
            DataType::new_fixed_size_list(DataType::Float32, 4, true),
        ),
        ("List(Utf8)", DataType::new_list(DataType::Utf8, true)),
    ] {
        let parsed = DataType::from_str(text).unwrap_or_else(|e| panic!("{text}: {e}"));
        assert_eq!(parsed, expected, "{text}");
        assert!(with_type(text).is_ok(), "{text}: {:?}", with_type(text));
    }
}

#[test]
fn the_previous_generic_store_declaration_reads_as_it_is() {
    // As a user passes it to GenericStore.open(uri, schema=...).
    let mapping = r#"{
        "id": {"type": "string", "nullable": false},
        "user": "string",
        "notes": {"type": "string", "large": true},
        "score": "float32",
        "turns": "int64",
        "ok": "bool",
        "at": "timestamp",
        "tags": {"type": "list", "item": {"type": "string"}},
        "vec": {"type": "vector", "dim": 4, "metric": "cosine"},
        "plain": {"type": "vector", "dim": 2},
        "raw": {"type": "binary", "blob": true}
    }"#;
    let spec = SchemaSpec::from_json(mapping).expect("the previous form parses");
    assert_eq!(spec.name, PREVIOUS_FORM_NAME);
    assert_eq!(spec.key, "id");
    let types: Vec<(&str, &str, bool)> = spec
        .columns
        .iter()
        .map(|c| (c.name.as_str(), c.data_type.as_str(), c.nullable))
        .collect();
    assert_eq!(
        types,
        vec![
            ("id", "Utf8", false),
            ("user", "Utf8", true),
            ("notes", "LargeUtf8", true),
            ("score", "Float32", true),
            ("turns", "Int64", true),
            ("ok", "Boolean", true),
            ("at", "Timestamp(µs)", true),
            ("tags", "List(Utf8)", true),
            ("vec", "FixedSizeList(4 x Float32)", true),
            ("plain", "FixedSizeList(2 x Float32)", true),
            ("raw", "LargeBinary", true),
        ]
    );
    assert_eq!(spec.blob_columns, vec!["raw".to_string()]);
    assert_eq!(
        spec.columns[10]
            .metadata
            .get(BLOB_FIELD_METADATA)
            .map(String::as_str),
        Some("true")
    );
    let metrics: Vec<(&str, i64, Metric)> = spec
        .vectors
        .iter()
        .map(|v| (v.column.as_str(), v.dimension, v.metric))
        .collect();
    assert_eq!(
        metrics,
        vec![("vec", 4, Metric::Cosine), ("plain", 2, Metric::L2)]
    );
    spec.check(KeyRule::IdOnly).expect("a valid spec");

    // The form the previous store recorded in its dataset's metadata.
    let recorded = r#"{"columns":[["id",{"type":"string","large":false,"nullable":false}],["user",{"type":"string","large":false,"nullable":true}],["score",{"type":"float32","nullable":true}],["tags",{"type":"list","item":{"type":"string","large":false},"nullable":true}],["vec",{"type":"vector","dim":4,"metric":null,"nullable":true}]]}"#;
    let spec = SchemaSpec::from_json(recorded).expect("the recorded form parses");
    assert_eq!(spec.columns.len(), 5);
    assert_eq!(spec.columns[3].data_type, "List(Utf8)");
    assert_eq!(spec.vectors[0].metric, Metric::L2);

    // Every bad column is named.
    let bad = r#"{"id": {"type": "string", "nullable": false}, "a": "float16", "b": {"type": "vector"}, "c": {"type": "list"}}"#;
    let errors = SchemaSpec::from_json(bad).unwrap_err();
    let fields: Vec<&str> = errors.problems.iter().map(|p| p.field.as_str()).collect();
    assert_eq!(fields, vec!["a", "b", "c"], "{errors}");
    assert!(
        errors.to_string().contains("unknown type 'float16'"),
        "{errors}"
    );

    // This host's own form is not mistaken for it.
    let own = r#"{"name": "n", "key": "id", "columns": [{"name": "id", "type": "Utf8", "nullable": false}]}"#;
    assert_eq!(SchemaSpec::from_json(own).unwrap().name, "n");
}
