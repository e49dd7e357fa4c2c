//! Search and retrieval: full-text (BM25) search over the base table and the
//! unmerged generations with one set of statistics, hybrid retrieval fused by
//! RRF, typed filters, and the typed errors of a wrong request.

use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::types::{Float32Type, UInt32Type};
use arrow_array::{Array, FixedSizeListArray, Float32Array, RecordBatch, StringArray};
use arrow_schema::{DataType, Field, Schema, SchemaRef};
use lance_context_host::spec::SchemaSpec;
use lance_context_host::{CreateOptions, PluginLimits, PluginRuntime, Registry, SchemaSource};
use lance_context_store::{
    Condition, ErrorKind, FilterValue, IndexSettings, Metric, RetrieveQuery, Store, StoreConfig,
    TextColumn, TextOperator, TextQuery, VectorColumn, VectorIndexKind, VectorQuery, exact_bm25,
};

use crate::support::temp_uri;

fn schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("id", DataType::Utf8, false),
        Field::new("body", DataType::Utf8, true),
        Field::new("tag", DataType::Utf8, true),
        Field::new(
            "emb",
            DataType::FixedSizeList(Arc::new(Field::new("item", DataType::Float32, true)), 2),
            true,
        ),
    ]))
}

fn config(uri: &str) -> StoreConfig {
    StoreConfig::new(uri)
        .with_schema(schema())
        .with_manual_maintenance()
        .with_indexes(IndexSettings {
            vector_columns: vec![VectorColumn {
                column: "emb".into(),
                dimension: 2,
                metric: Metric::L2,
                kind: VectorIndexKind::IvfPq,
            }],
            text_columns: vec![TextColumn::new("body")],
            ..IndexSettings::default()
        })
}

/// Rows `(id, body, tag, [x, y])`.
fn batch(rows: &[(&str, &str, &str, [f32; 2])]) -> RecordBatch {
    let flat: Vec<f32> = rows.iter().flat_map(|r| r.3).collect();
    let emb = FixedSizeListArray::try_new(
        Arc::new(Field::new("item", DataType::Float32, true)),
        2,
        Arc::new(Float32Array::from(flat)),
        None,
    )
    .unwrap();
    RecordBatch::try_new(
        schema(),
        vec![
            Arc::new(StringArray::from(
                rows.iter().map(|r| r.0).collect::<Vec<_>>(),
            )),
            Arc::new(StringArray::from(
                rows.iter().map(|r| r.1).collect::<Vec<_>>(),
            )),
            Arc::new(StringArray::from(
                rows.iter().map(|r| r.2).collect::<Vec<_>>(),
            )),
            Arc::new(emb),
        ],
    )
    .unwrap()
}

fn strings(batch: &RecordBatch, column: &str) -> Vec<String> {
    let a = batch.column_by_name(column).unwrap().as_string::<i32>();
    (0..a.len()).map(|i| a.value(i).to_string()).collect()
}

fn floats(batch: &RecordBatch, column: &str) -> Vec<Option<f32>> {
    let a = batch
        .column_by_name(column)
        .unwrap()
        .as_primitive::<Float32Type>();
    (0..a.len())
        .map(|i| (!a.is_null(i)).then(|| a.value(i)))
        .collect()
}

const BODIES: &[&str] = &[
    "the quick brown fox jumps over the lazy dog",
    "a fox and a hound became friends",
    "lazy afternoons by the river",
    "foxes are quick and clever animals",
    "the dog sleeps all day",
    "rivers flow to the sea",
    "the brown bear eats honey",
    "clever dogs learn quickly",
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn text_search_scores_base_and_fresh_rows_as_one_corpus() {
    let (_dir, uri) = temp_uri();
    let store = Store::create(config(&uri)).await.unwrap();
    // Half the rows merged into the base table (indexed), half left in
    // generations.
    let rows: Vec<(String, &str)> = BODIES
        .iter()
        .enumerate()
        .map(|(i, b)| (format!("d{i}"), *b))
        .collect();
    for (id, body) in &rows[..4] {
        store
            .add(&batch(&[(id, body, "a", [0.0, 1.0])]))
            .await
            .unwrap();
    }
    store.merge().await.unwrap();
    for (id, body) in &rows[4..] {
        store
            .add(&batch(&[(id, body, "b", [1.0, 0.0])]))
            .await
            .unwrap();
    }
    assert!(crate::support::generations(&store).await > 0);

    let query = "quick fox dog";
    let found = store
        .search_text(&TextQuery::new("body", query, 10))
        .await
        .unwrap();
    // Exact BM25 over every row, computed apart.
    let all = batch(
        &rows
            .iter()
            .map(|(id, b)| (id.as_str(), *b, "", [0.0, 0.0]))
            .collect::<Vec<_>>(),
    );
    let exact = exact_bm25(&TextColumn::new("body"), query, TextOperator::Or, &all).unwrap();
    let mut expected: Vec<(f32, String)> = exact
        .iter()
        .enumerate()
        .filter_map(|(i, s)| s.map(|s| (s, format!("d{i}"))))
        .collect();
    expected.sort_by(|a, b| b.0.total_cmp(&a.0).then_with(|| a.1.cmp(&b.1)));
    let ids = strings(&found, "id");
    assert_eq!(
        ids,
        expected.iter().map(|e| e.1.clone()).collect::<Vec<_>>(),
        "{found:?}"
    );
    for (got, (want, id)) in floats(&found, "_score").iter().zip(&expected) {
        let got = got.unwrap();
        assert!(
            (got - want).abs() < 1e-4 * want.max(1.0),
            "{id}: score {got}, exact {want}"
        );
    }
    // Both tiers are in the answer.
    assert!(ids.iter().any(|i| i == "d0") && ids.iter().any(|i| i == "d7"));
    // Merging keeps the full-text index covering every row, and the scores
    // stay the exact ones.
    store.merge().await.unwrap();
    let stats = store.stats().await.unwrap();
    let fts = stats.index("body_fts").expect("the text index");
    assert!(fts.covers_all_rows, "{fts:?}");
    let merged = store
        .search_text(&TextQuery::new("body", query, 10))
        .await
        .unwrap();
    assert_eq!(strings(&merged, "id"), ids);
    for (a, b) in floats(&merged, "_score")
        .iter()
        .zip(floats(&found, "_score"))
    {
        assert!((a.unwrap() - b.unwrap()).abs() < 1e-4, "{a:?} {b:?}");
    }

    // `and`: every term.
    let mut and = TextQuery::new("body", "quick fox", 10);
    and.operator = TextOperator::And;
    let mut got = strings(&store.search_text(&and).await.unwrap(), "id");
    got.sort();
    // d3's "foxes" stems to "fox"; d1 has no "quick".
    assert_eq!(got, ["d0", "d3"]);

    // Stop words only: nothing to find, no error.
    let none = store
        .search_text(&TextQuery::new("body", "the and a", 10))
        .await
        .unwrap();
    assert_eq!(none.num_rows(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rewritten_or_deleted_row_never_shows_its_old_text() {
    let (_dir, uri) = temp_uri();
    let store = Store::create(config(&uri)).await.unwrap();
    store
        .add(&batch(&[
            ("k1", "zebra stripes", "a", [0.0, 1.0]),
            ("k2", "zebra crossing", "a", [0.0, 2.0]),
            ("k3", "zebra herd", "a", [0.0, 3.0]),
        ]))
        .await
        .unwrap();
    store.merge().await.unwrap();
    // k1 rewritten in a generation (no zebra any more); k2 deleted.
    store
        .add(&batch(&[("k1", "plain horse", "a", [0.0, 1.0])]))
        .await
        .unwrap();
    store.delete(&["k2"]).await.unwrap();
    for round in ["fresh", "merged"] {
        let got = strings(
            &store
                .search_text(&TextQuery::new("body", "zebra", 10))
                .await
                .unwrap(),
            "id",
        );
        assert_eq!(got, ["k3"], "{round}");
        let horse = store
            .search_text(&TextQuery::new("body", "horse", 10))
            .await
            .unwrap();
        assert_eq!(strings(&horse, "id"), ["k1"], "{round}");
        assert_eq!(strings(&horse, "body"), ["plain horse"], "{round}");
        store.merge().await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hybrid_ranks_match_a_hand_computed_rrf_and_filters_apply_in_every_leg() {
    let (_dir, uri) = temp_uri();
    let store = Store::create(config(&uri)).await.unwrap();
    // Vector ranks from [0, 0]: a (1), b (2), c (3), d (4, tag y).
    // Text ranks for "apple": c holds it three times, a once; b never.
    store
        .add(&batch(&[
            (
                "a",
                "apple pie and other things to eat today",
                "x",
                [0.1, 0.0],
            ),
            ("b", "banana bread", "x", [0.2, 0.0]),
            ("c", "apple apple apple", "x", [0.3, 0.0]),
            ("d", "apple", "y", [0.4, 0.0]),
        ]))
        .await
        .unwrap();
    let mut query = RetrieveQuery::new(
        Some(VectorQuery::new("emb", vec![0.0, 0.0], 3)),
        Some(TextQuery::new("body", "apple", 3)),
        10,
    );
    query.filter = Some("tag = 'x'".into());
    let got = store.retrieve(&query).await.unwrap();
    // RRF with k = 60: a = 1/61 + 1/62, c = 1/63 + 1/61, b = 1/62.
    let expected = [
        ("a", 1.0 / 61.0 + 1.0 / 62.0),
        ("c", 1.0 / 63.0 + 1.0 / 61.0),
        ("b", 1.0 / 62.0),
    ];
    assert_eq!(
        strings(&got, "id"),
        expected.iter().map(|e| e.0).collect::<Vec<_>>()
    );
    for (score, (id, want)) in floats(&got, "_rrf_score").iter().zip(expected) {
        assert!((score.unwrap() - want as f32).abs() < 1e-6, "{id}");
    }
    let ranks = |column: &str| -> Vec<Option<u32>> {
        let a = got
            .column_by_name(column)
            .unwrap()
            .as_primitive::<UInt32Type>();
        (0..a.len())
            .map(|i| (!a.is_null(i)).then(|| a.value(i)))
            .collect()
    };
    assert_eq!(ranks("_vector_rank"), [Some(1), Some(3), Some(2)]);
    assert_eq!(ranks("_text_rank"), [Some(2), Some(1), None]);
    assert!(floats(&got, "_score")[2].is_none());
    assert!(floats(&got, "_distance")[0].is_some());

    // Typed conditions, the same as the SQL: d is tag y.
    let only_y = store
        .filter_of(
            None,
            &[Condition::Eq {
                column: "tag".into(),
                value: FilterValue::Text("y".into()),
            }],
        )
        .unwrap();
    let mut query = RetrieveQuery::new(
        Some(VectorQuery::new("emb", vec![0.0, 0.0], 3)),
        Some(TextQuery::new("body", "apple", 3)),
        10,
    );
    query.filter = only_y;
    assert_eq!(strings(&store.retrieve(&query).await.unwrap(), "id"), ["d"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_search_requests_are_typed_errors() {
    let (_dir, uri) = temp_uri();
    let store = Store::create(config(&uri)).await.unwrap();
    store
        .add(&batch(&[("a", "apple", "x", [0.1, 0.0])]))
        .await
        .unwrap();
    let kind = |e: lance_context_store::Error| (e.kind(), e.to_string());
    let cases = [
        kind(
            store
                .search_text(&TextQuery::new("nope", "apple", 3))
                .await
                .unwrap_err(),
        ),
        kind(
            store
                .search_text(&TextQuery::new("emb", "apple", 3))
                .await
                .unwrap_err(),
        ),
        kind(
            store
                .nearest(&VectorQuery::new("body", vec![0.0, 0.0], 3))
                .await
                .unwrap_err(),
        ),
        kind(
            store
                .nearest(&VectorQuery::new("emb", vec![0.0, 0.0, 0.0], 3))
                .await
                .unwrap_err(),
        ),
        kind(
            store
                .nearest(&VectorQuery::new("emb", vec![f32::NAN, 0.0], 3))
                .await
                .unwrap_err(),
        ),
        kind(
            store
                .retrieve(&RetrieveQuery::new(None, None, 3))
                .await
                .unwrap_err(),
        ),
    ];
    for (kind, message) in &cases {
        assert_eq!(*kind, ErrorKind::InvalidInput, "{message}");
    }
    assert!(
        cases[0].1.contains("not a declared text column"),
        "{}",
        cases[0].1
    );
    assert!(cases[3].1.contains("dimensions"), "{}", cases[3].1);
}

fn registry(root: &std::path::Path) -> Registry {
    let runtime = Arc::new(
        PluginRuntime::new(
            PluginLimits::default(),
            Some(crate::support::compile_cache()),
        )
        .unwrap(),
    );
    Registry::at(root, runtime).unwrap()
}

const TWO_OF_EACH: &str = r#"{
  "name": "articles",
  "key": "id",
  "columns": [
    {"name": "id", "type": "Utf8", "nullable": false},
    {"name": "title", "type": "Utf8"},
    {"name": "summary", "type": "LargeUtf8"},
    {"name": "title_vec", "type": "FixedSizeList(2 x Float32)"},
    {"name": "summary_vec", "type": "FixedSizeList(3 x Float32)"}
  ],
  "vectors": [
    {"column": "title_vec", "dimension": 2, "metric": "l2"},
    {"column": "summary_vec", "dimension": 3, "metric": "cosine"}
  ],
  "text_columns": [
    {"column": "title"},
    {"column": "summary", "stem": false}
  ]
}"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spec_with_two_vector_and_two_text_columns_searches_each_apart() {
    let root = tempfile::tempdir().unwrap();
    let reg = registry(root.path());
    let spec = SchemaSpec::from_json(TWO_OF_EACH).unwrap();
    let store = reg
        .create("articles", CreateOptions::new(SchemaSource::Spec(spec)))
        .await
        .unwrap();
    assert_eq!(store.spec().text_columns.len(), 2);
    let lines = r#"{"id": "1", "title": "rust storage", "summary": "columnar files for agents", "title_vec": [0, 1], "summary_vec": [1, 0, 0]}
{"id": "2", "title": "agents remember", "summary": "rust programs running", "title_vec": [1, 0], "summary_vec": [0, 1, 0]}"#;
    let rows = lance_context_host::rows_from_json(store.plugin(), lines.as_bytes()).unwrap();
    store.add(&rows).await.unwrap();
    let title = |q: &str| lance_context_client::SearchRequest::text("title", q, 5);
    let summary = |q: &str| lance_context_client::SearchRequest::text("summary", q, 5);
    let ids = |b: RecordBatch| strings(&b, "id");
    let run = |r| lance_context_host::search::search(&store, r);
    assert_eq!(ids(run(title("rust")).await.unwrap()), ["1"]);
    assert_eq!(ids(run(summary("rust")).await.unwrap()), ["2"]);
    // `summary` is not stemmed: "program" does not find "programs".
    assert_eq!(run(summary("program")).await.unwrap().num_rows(), 0);
    assert_eq!(ids(run(title("remembering")).await.unwrap()), ["2"]);
    let near = lance_context_client::SearchRequest::vector("summary_vec", vec![0.0, 1.0, 0.0], 1);
    assert_eq!(ids(run(near).await.unwrap()), ["2"]);
    let near = lance_context_client::SearchRequest::vector("title_vec", vec![0.0, 1.0], 1);
    assert_eq!(ids(run(near).await.unwrap()), ["1"]);
    // A vector column asked for text, text with a vector: typed.
    let e = run(lance_context_client::SearchRequest::text(
        "title_vec",
        "x",
        1,
    ))
    .await
    .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidInput, "{e}");
    let e = run(lance_context_client::SearchRequest::vector(
        "title",
        vec![0.0, 1.0],
        1,
    ))
    .await
    .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidInput, "{e}");
    // A bad declaration is refused with the problem named.
    let bad = TWO_OF_EACH.replace(r#"{"column": "title"}"#, r#"{"column": "title_vec"}"#);
    let e = SchemaSpec::from_json(&bad)
        .unwrap()
        .check(lance_context_host::spec::KeyRule::IdOnly)
        .unwrap_err();
    assert!(e.to_string().contains("text_columns[0]"), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn context_stores_search_their_text_and_hide_what_capabilities_hide() {
    let root = tempfile::tempdir().unwrap();
    let reg = registry(root.path());
    let mut options = CreateOptions::new(SchemaSource::Builtin("context".into()));
    options.params = vec![("embedding_dim".into(), "2".into())];
    let store = reg.create("memories", options).await.unwrap();
    assert_eq!(store.spec().text_columns[0].column, "text_payload");
    let lines = r#"{"id": "m1", "run_id": "r", "text_payload": "the user likes green tea", "embedding": [1, 0]}
{"id": "m2", "run_id": "r", "text_payload": "the user likes black coffee", "embedding": [0, 1]}"#;
    let rows = lance_context_host::rows_from_json(store.plugin(), lines.as_bytes()).unwrap();
    store.add(&rows).await.unwrap();
    let found = |q: &'static str| {
        let store = &store;
        async move {
            strings(
                &lance_context_host::search::search(
                    store,
                    lance_context_client::SearchRequest::text("text_payload", q, 5),
                )
                .await
                .unwrap(),
                "id",
            )
        }
    };
    assert_eq!(found("likes").await, ["m1", "m2"]);
    // Typed conditions on a timestamp, a text and the key, compiled to
    // predicates Lance evaluates in every tier.
    use lance_context_client::Condition as C;
    let with = |conditions: Vec<C>| {
        let store = &store;
        async move {
            let mut request = lance_context_client::SearchRequest::text("text_payload", "likes", 5);
            request.conditions = conditions;
            strings(
                &lance_context_host::search::search(store, request)
                    .await
                    .unwrap(),
                "id",
            )
        }
    };
    let since = |t: &str| C {
        column: "created_at".into(),
        gte: Some(t.into()),
        ..C::default()
    };
    assert_eq!(with(vec![since("2000-01-01")]).await, ["m1", "m2"]);
    assert_eq!(
        with(vec![since("2999-01-01T00:00:00Z")]).await,
        Vec::<String>::new()
    );
    assert_eq!(
        with(vec![C::contains("text_payload", "green")]).await,
        ["m1"]
    );
    let one_of = C {
        column: "id".into(),
        one_of: Some(vec!["m2".into(), "zz".into()]),
        ..C::default()
    };
    assert_eq!(with(vec![one_of]).await, ["m2"]);
    let e = lance_context_host::search::search(&store, {
        let mut r = lance_context_client::SearchRequest::text("text_payload", "likes", 5);
        r.conditions = vec![C {
            column: "created_at".into(),
            gte: Some("yesterday".into()),
            ..C::default()
        }];
        r
    })
    .await
    .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidInput, "{e}");
    assert!(
        e.to_string().contains("where[0]") || e.to_string().contains("condition 0"),
        "{e}"
    );
    store.delete(&["m1"]).await.unwrap();
    assert_eq!(found("tea").await, Vec::<String>::new());
    assert_eq!(found("likes").await, ["m2"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_abi1_component_built_against_0_1_0_loads_unchanged() {
    let root = tempfile::tempdir().unwrap();
    let reg = registry(root.path());
    let bytes = std::fs::read(lance_context_host::built_plugin("test-abi1")).unwrap();
    let store = reg
        .create(
            "old",
            CreateOptions::new(SchemaSource::Plugin {
                label: "abi1.wasm".into(),
                bytes,
            }),
        )
        .await
        .unwrap();
    assert_eq!(store.plugin().declaration().abi_version, 1);
    assert!(store.spec().text_columns.is_empty());
    let rows = lance_context_host::rows_from_json(
        store.plugin(),
        &br#"{"id": "a", "text": "hello", "embedding": [1, 2]}"#[..],
    )
    .unwrap();
    store.add(&rows).await.unwrap();
    let near = lance_context_client::SearchRequest::vector("embedding", vec![1.0, 2.0], 1);
    let got = lance_context_host::search::search(&store, near)
        .await
        .unwrap();
    assert_eq!(strings(&got, "id"), ["a"]);
    // No text column declared: a text search says so.
    let e = lance_context_host::search::search(
        &store,
        lance_context_client::SearchRequest::text("text", "hello", 1),
    )
    .await
    .unwrap_err();
    assert!(e.to_string().contains("not a declared text column"), "{e}");
}
