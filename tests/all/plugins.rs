//! The plugin runtime with real components: the built-in schemas and the
//! example third-party plugin. (The hostile corpus is in `sandbox`.)

use std::sync::Arc;

use arrow_array::{LargeStringArray, RecordBatch, StringArray};
use arrow_schema::{DataType, Field, Schema};
use lance_context_host::built_plugin;
use lance_context_host::spec::Capability;
use lance_context_host::{PluginError, PluginLimits, PluginRuntime};
use lance_context_store::{Store, StoreConfig};

use crate::support::temp_uri;

pub fn runtime(limits: PluginLimits) -> PluginRuntime {
    PluginRuntime::new(limits, Some(crate::support::compile_cache())).unwrap()
}

pub fn bytes(name: &str) -> Vec<u8> {
    let path = built_plugin(name);
    std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

pub fn params(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// A client batch for the rollout schema: only some columns, nullable.
pub fn rollout_rows(ids: &[&str], rollouts: &[Option<&str>]) -> RecordBatch {
    RecordBatch::try_new(
        Arc::new(Schema::new(vec![
            Field::new("id", DataType::Utf8, true),
            Field::new("rollout_id", DataType::Utf8, true),
            Field::new("content", DataType::LargeUtf8, true),
        ])),
        vec![
            Arc::new(StringArray::from(ids.to_vec())),
            Arc::new(StringArray::from(rollouts.to_vec())),
            Arc::new(LargeStringArray::from(vec![Some("hello"); ids.len()])),
        ],
    )
    .unwrap()
}

#[test]
fn the_builtin_plugins_load_and_declare_their_schemas() {
    let rt = runtime(PluginLimits::default());
    let rollout = rt.load("rollout", &bytes("rollout"), vec![]).unwrap();
    let d = rollout.declaration();
    assert_eq!((d.name.as_str(), d.key_column()), ("rollout", "id"));
    assert_eq!(d.schema.fields().len(), 36);
    assert_eq!(d.sha256.len(), 64);
    assert!(d.has_transform);

    let datagen = rt.load("datagen", &bytes("datagen"), vec![]).unwrap();
    assert_eq!(datagen.declaration().key_column(), "event_id");
    assert_eq!(datagen.declaration().schema.fields().len(), 34);

    let context = rt
        .load(
            "context",
            &bytes("context"),
            params(&[("embedding_dim", "8"), ("distance_metric", "\"cosine\"")]),
        )
        .unwrap();
    let d = context.declaration();
    assert_eq!(d.schema.fields().len(), 26);
    assert_eq!(d.spec.vectors.len(), 1);
    assert_eq!(
        (
            d.spec.vectors[0].dimension,
            d.spec.vectors[0].metric.as_str()
        ),
        (8, "cosine")
    );
    assert_eq!(d.spec.secondary_key.as_deref(), Some("external_id"));
    assert_eq!(
        d.spec.capabilities,
        [
            Capability::Tombstones,
            Capability::Supersession,
            Capability::Lifecycle,
            Capability::UniqueKeys
        ]
    );

    // Bad parameters are the plugin's typed refusal, naming the parameter.
    let err = rt
        .load(
            "context",
            &bytes("context"),
            params(&[("embedding_dim", "0")]),
        )
        .unwrap_err();
    assert!(
        matches!(&err, PluginError::InvalidParams { message, .. } if message.contains("embedding_dim")),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rollout_rows_go_through_the_component_into_a_store_and_back() {
    let rt = runtime(PluginLimits::default());
    let rollout = rt.load("rollout", &bytes("rollout"), vec![]).unwrap();

    // Rejected rows come back as data, with row and column.
    let err = rollout
        .validate(&rollout_rows(&["a", "b"], &[Some("r"), None]))
        .unwrap_err();
    let rows = err.row_errors().expect("row errors");
    assert_eq!(rows.len(), 1, "{err}");
    assert_eq!(
        (rows[0].row, rows[0].column.as_deref()),
        (1, Some("rollout_id"))
    );

    // transform applies validate's checks in the same call.
    let err = rollout
        .transform(&rollout_rows(&["a", "b"], &[Some("r"), None]), 1)
        .unwrap_err();
    assert_eq!(err.row_errors().expect("row errors")[0].row, 1);

    let input = rollout_rows(&["a", "b"], &[Some("r1"), Some("r1")]);
    rollout.validate(&input).unwrap();
    let ready = rollout.prepare(&input, 1_700_000_000_000_000).unwrap();
    // The declared columns, in order, with the declared types (nullability is
    // the engine's to check).
    let declared = rollout.declaration().schema.clone();
    let shape = |s: &Schema| {
        s.fields()
            .iter()
            .map(|f| (f.name().clone(), f.data_type().clone()))
            .collect::<Vec<_>>()
    };
    assert_eq!(shape(&ready.schema()), shape(&declared));

    let (_dir, uri) = temp_uri();
    let store = Store::create(
        StoreConfig::new(&uri)
            .with_schema(rollout.declaration().schema.clone())
            .with_manual_maintenance(),
    )
    .await
    .unwrap();
    store.add(&ready).await.unwrap();
    let row = store.get("b").await.unwrap().expect("row b");
    let problem = row
        .column_by_name("problem_id")
        .unwrap()
        .as_any()
        .downcast_ref::<StringArray>()
        .unwrap()
        .value(0)
        .to_string();
    assert_eq!(problem, "r1", "the plugin's default reached the store");
}

#[test]
fn concurrent_callers_each_get_an_instance() {
    let rt = runtime(PluginLimits::default());
    let rollout = Arc::new(rt.load("rollout", &bytes("rollout"), vec![]).unwrap());
    let threads: Vec<_> = (0..4)
        .map(|t| {
            let rollout = rollout.clone();
            std::thread::spawn(move || {
                for i in 0..20 {
                    let id = format!("t{t}-{i}");
                    rollout
                        .validate(&rollout_rows(&[id.as_str()], &[Some("r")]))
                        .unwrap();
                    let out = rollout
                        .transform(&rollout_rows(&[id.as_str()], &[Some("r")]), 1)
                        .unwrap();
                    assert_eq!(out.num_rows(), 1);
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
}

/// The example third-party plugin (`plugins/example`): JSON Lines in, its
/// custom rule enforced, rows stored and searchable by their embedding.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_third_party_plugin_runs_the_whole_add_pipeline() {
    use lance_context_host::PipelineError;
    use lance_context_store::{IndexSettings, Metric, VectorColumn, VectorIndexKind, VectorQuery};

    let rt = runtime(PluginLimits::default());
    let notes = rt.load("example", &bytes("example"), vec![]).unwrap();
    let declared = notes.declaration().clone();
    assert_eq!(declared.spec.vectors[0].metric, Metric::Cosine);

    let (_dir, uri) = temp_uri();
    let store = Store::create(
        StoreConfig::new(&uri)
            .with_schema(declared.schema.clone())
            .with_manual_maintenance()
            .with_indexes(IndexSettings {
                vector_columns: vec![VectorColumn {
                    column: "embedding".into(),
                    dimension: 4,
                    metric: Metric::Cosine,
                    kind: VectorIndexKind::IvfPq,
                }],
                ..IndexSettings::default()
            }),
    )
    .await
    .unwrap();

    let good = br#"{"id": "n1", "text": "buy milk", "priority": 2, "embedding": [1, 0, 0, 0]}
{"id": "n2", "text": "call mum", "embedding": [0, 1, 0, 0]}
"#;
    let batch = lance_context_host::rows_from_json(&notes, &good[..]).unwrap();
    let ready = lance_context_host::prepare(&notes, &batch, 0)
        .await
        .unwrap();
    store.add(&ready).await.unwrap();
    assert_eq!(store.count(None).await.unwrap(), 2);
    let near = store
        .nearest(&VectorQuery::new("embedding", vec![0.9, 0.1, 0.0, 0.0], 1))
        .await
        .unwrap();
    let id = near
        .column_by_name("id")
        .unwrap()
        .as_any()
        .downcast_ref::<StringArray>()
        .unwrap()
        .value(0)
        .to_string();
    assert_eq!(id, "n1");

    // The custom rule, with row and column; nothing is written.
    let bad = br#"{"id": "n3", "text": "ok", "priority": 3}
{"id": "n4", "text": "too urgent", "priority": 9}
"#;
    let batch = lance_context_host::rows_from_json(&notes, &bad[..]).unwrap();
    let err = lance_context_host::prepare(&notes, &batch, 0)
        .await
        .unwrap_err();
    match &err {
        PipelineError::Plugin(e) => {
            let rows = e.row_errors().expect("row errors");
            assert_eq!(
                (
                    rows[0].row,
                    rows[0].column.as_deref(),
                    rows[0].code.as_str()
                ),
                (1, Some("priority"), "range")
            );
        }
        other => panic!("{other}"),
    }
    assert_eq!(
        store.count(None).await.unwrap(),
        2,
        "a rejected batch writes nothing"
    );

    // Unknown fields are rejected, never dropped.
    let unknown = br#"{"id": "n5", "text": "x", "colour": "red"}"#;
    let err = lance_context_host::rows_from_json(&notes, &unknown[..]).unwrap_err();
    assert!(
        matches!(&err, PipelineError::InvalidRecords { problems, total: 1 } if problems[0].column.as_deref() == Some("colour") && problems[0].row == 0),
        "{err}"
    );
}
