//! Record capabilities applied by the engine to any schema that declares them
//! (here a small context-like schema, no plugin): tombstones, supersession,
//! lifecycle visibility, unique keys, upsert, patch as a new version.

use std::collections::HashMap;
use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::{Array, ArrayRef, RecordBatch, StringArray, TimestampMicrosecondArray};
use arrow_schema::{DataType, Field, Schema, SchemaRef, TimeUnit};
use lance_context_store::{
    BatchProblem, Error, ErrorKind, PRIMARY_KEY_METADATA, PatchTarget, RecordCapabilities,
    ScanRequest, SortKey, Store, StoreConfig, TOMBSTONE_CONTENT_TYPE, Visibility,
};

use crate::support::temp_uri;

const NOW: i64 = 1_800_000_000_000_000;

fn schema() -> SchemaRef {
    let ts = |n: &str, nullable| {
        Field::new(
            n,
            DataType::Timestamp(TimeUnit::Microsecond, None),
            nullable,
        )
    };
    let s = |n: &str, nullable| Field::new(n, DataType::Utf8, nullable);
    Arc::new(Schema::new(vec![
        Field::new("id", DataType::Utf8, false).with_metadata(HashMap::from([(
            PRIMARY_KEY_METADATA.to_string(),
            "true".to_string(),
        )])),
        s("external_id", true),
        s("run_id", false),
        ts("created_at", false),
        s("text", true),
        ts("expires_at", true),
        s("lifecycle_status", false),
        ts("retired_at", true),
        s("supersedes_id", true),
        s("superseded_by_id", true),
        s("content_type", false),
    ]))
}

/// The clock, in microseconds since the epoch.
fn clock_micros() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_micros() as i64
}

fn caps_config(uri: &str) -> StoreConfig {
    StoreConfig::new(uri)
        .with_schema(schema())
        .with_manual_maintenance()
        .with_capabilities(RecordCapabilities {
            tombstones: true,
            supersession: true,
            lifecycle: true,
            unique_keys: true,
            secondary_key: Some("external_id".into()),
        })
}

async fn store(uri: &str) -> Store {
    Store::create(caps_config(uri)).await.unwrap()
}

/// Add records (key, secondary key, text "t") and merge them.
async fn add_merged(store: &Store, rows: &[(String, String)]) {
    let refs: Vec<(&str, Option<&str>, &str)> = rows
        .iter()
        .map(|(id, ext)| (id.as_str(), Some(ext.as_str()), "t"))
        .collect();
    store.add(&records(&refs, &[])).await.unwrap();
    store.merge().await.unwrap();
}

/// A record: (id, external_id, text) and optional overrides by column.
fn records(rows: &[(&str, Option<&str>, &str)], set: &[(&str, Vec<Option<&str>>)]) -> RecordBatch {
    let n = rows.len();
    let col = |name: &str, default: Vec<Option<String>>| -> ArrayRef {
        match set.iter().find(|(c, _)| *c == name) {
            Some((_, v)) => Arc::new(StringArray::from(v.clone())),
            None => Arc::new(StringArray::from(default)),
        }
    };
    let ts = |name: &str| -> ArrayRef {
        match set.iter().find(|(c, _)| *c == name) {
            Some((_, v)) => Arc::new(TimestampMicrosecondArray::from(
                v.iter()
                    .map(|x| x.map(|x| x.parse::<i64>().unwrap()))
                    .collect::<Vec<_>>(),
            )),
            None => Arc::new(TimestampMicrosecondArray::from(vec![None::<i64>; n])),
        }
    };
    let some = |f: &dyn Fn(usize) -> String| (0..n).map(|i| Some(f(i))).collect::<Vec<_>>();
    RecordBatch::try_new(
        schema(),
        vec![
            col("id", some(&|i| rows[i].0.to_string())),
            col(
                "external_id",
                rows.iter().map(|r| r.1.map(str::to_string)).collect(),
            ),
            col("run_id", some(&|_| "run".to_string())),
            Arc::new(TimestampMicrosecondArray::from(vec![NOW - 10; n])),
            col("text", some(&|i| rows[i].2.to_string())),
            ts("expires_at"),
            col("lifecycle_status", some(&|_| "active".to_string())),
            ts("retired_at"),
            col("supersedes_id", vec![None; n]),
            col("superseded_by_id", vec![None; n]),
            col("content_type", some(&|_| "text/plain".to_string())),
        ],
    )
    .unwrap()
}

/// The ids of a result, in its order.
fn ids_in_order(batch: &RecordBatch) -> Vec<String> {
    batch
        .column_by_name("id")
        .unwrap()
        .as_string::<i32>()
        .iter()
        .map(|s| s.unwrap().to_string())
        .collect()
}

fn ids(batch: &RecordBatch) -> Vec<String> {
    let mut v = ids_in_order(batch);
    v.sort();
    v
}

async fn visible(store: &Store, v: Visibility) -> Vec<String> {
    ids(&store
        .scan(
            ScanRequest::new()
                .order_by(SortKey::asc("id"))
                .visibility(v),
        )
        .await
        .unwrap())
}

fn problem(err: &Error) -> &BatchProblem {
    match err {
        Error::InvalidBatch { problem } => problem,
        other => panic!("{other}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tombstones_hide_a_record_and_free_its_key() {
    let (_dir, uri) = temp_uri();
    let store = store(&uri).await;
    store
        .add(&records(
            &[("a", Some("ea"), "one"), ("b", Some("eb"), "two")],
            &[],
        ))
        .await
        .unwrap();
    assert_eq!(
        store.tombstone(&["a", "missing"]).await.unwrap(),
        [true, false]
    );
    assert!(
        store.get("a").await.unwrap().is_none(),
        "a deleted key reads as absent"
    );
    assert_eq!(visible(&store, Visibility::default()).await, ["b"]);
    assert_eq!(store.count(None).await.unwrap(), 1);
    // The tombstone row is there for whoever asks, keeping the key, the
    // secondary key and the non-null columns, nulls elsewhere.
    let all = store
        .scan(
            ScanRequest::new()
                .filter("id = 'a'")
                .visibility(Visibility::all()),
        )
        .await
        .unwrap();
    let s = |c: &str| all.column_by_name(c).unwrap().as_string::<i32>().clone();
    assert_eq!(s("content_type").value(0), TOMBSTONE_CONTENT_TYPE);
    assert_eq!(s("external_id").value(0), "ea");
    assert_eq!(s("run_id").value(0), "run");
    assert!(s("text").is_null(0));
    // By secondary key; deleting twice finds nothing the second time.
    assert_eq!(
        store.tombstone_by_secondary_key(&["eb"]).await.unwrap(),
        [true]
    );
    assert_eq!(store.tombstone(&["b"]).await.unwrap(), [false]);
    assert_eq!(store.count(None).await.unwrap(), 0);
    // A key whose only row is a tombstone is free again, and so is its
    // secondary key.
    store
        .add(&records(&[("a", Some("ea"), "again")], &[]))
        .await
        .unwrap();
    assert_eq!(visible(&store, Visibility::default()).await, ["a"]);
    // Callers may not write the tombstone value.
    let err = store
        .add(&records(
            &[("c", None, "x")],
            &[("content_type", vec![Some(TOMBSTONE_CONTENT_TYPE)])],
        ))
        .await
        .unwrap_err();
    assert!(
        matches!(problem(&err), BatchProblem::ReservedValue { row: 0, column } if column == "content_type"),
        "{err}"
    );
    store.close().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lifecycle_and_supersession_decide_what_reads_show() {
    let (_dir, uri) = temp_uri();
    let store = store(&uri).await;
    let past = (NOW - 1).to_string();
    let future = (NOW + 1_000_000).to_string();
    store
        .add(&records(
            &[
                ("expired", None, ""),
                ("later", None, ""),
                ("retired", None, ""),
                ("archived", None, ""),
                ("contradicted", None, ""),
                ("retired_at", None, ""),
                ("superseded_by", None, ""),
                ("old", None, ""),
                ("new", None, ""),
                ("self", None, ""),
                ("successor", None, ""),
            ],
            &[
                (
                    "expires_at",
                    vec![
                        Some(past.as_str()),
                        Some(future.as_str()),
                        None,
                        None,
                        None,
                        None,
                        None,
                        None,
                        None,
                        None,
                        None,
                    ],
                ),
                (
                    "lifecycle_status",
                    vec![
                        Some("active"),
                        Some("active"),
                        Some("retired"),
                        Some("archived"),
                        Some("contradicted"),
                        Some("active"),
                        Some("active"),
                        Some("active"),
                        Some("active"),
                        Some("active"),
                        Some("active"),
                    ],
                ),
                (
                    "retired_at",
                    vec![
                        None,
                        None,
                        None,
                        None,
                        None,
                        Some("5"),
                        None,
                        None,
                        None,
                        None,
                        None,
                    ],
                ),
                (
                    "superseded_by_id",
                    vec![
                        None, None, None, None, None, None, None, None, None, None, None,
                    ],
                ),
                (
                    "supersedes_id",
                    vec![
                        None,
                        None,
                        None,
                        None,
                        None,
                        None,
                        None,
                        None,
                        Some("old"),
                        Some("self"),
                        Some("superseded_by"),
                    ],
                ),
            ],
        ))
        .await
        .unwrap();
    let at = |v: Visibility| Visibility {
        now_micros: Some(NOW),
        ..v
    };
    assert_eq!(
        visible(&store, at(Visibility::default())).await,
        ["contradicted", "later", "new", "self", "successor"]
    );
    assert_eq!(
        visible(
            &store,
            at(Visibility {
                include_expired: true,
                ..Visibility::default()
            })
        )
        .await,
        [
            "contradicted",
            "expired",
            "later",
            "new",
            "self",
            "successor"
        ]
    );
    assert_eq!(
        visible(
            &store,
            at(Visibility {
                include_retired: true,
                ..Visibility::default()
            })
        )
        .await,
        [
            "archived",
            "contradicted",
            "later",
            "new",
            "old",
            "retired",
            "retired_at",
            "self",
            "successor",
            "superseded_by"
        ]
    );
    // Later than `later`'s expiry it is gone too.
    let much_later = Visibility {
        now_micros: Some(NOW + 2_000_000),
        ..Visibility::default()
    };
    assert_eq!(
        visible(&store, much_later).await,
        ["contradicted", "new", "self", "successor"]
    );
    // Lookups by key apply no lifecycle rule.
    assert!(store.get("old").await.unwrap().is_some());
    // The user's filter is combined with the rules, and checked.
    let f = store
        .scan(
            ScanRequest::new()
                .filter("id >= 'n'")
                .visibility(at(Visibility::default())),
        )
        .await
        .unwrap();
    assert_eq!(ids(&f), ["new", "self", "successor"]);
    let err = store
        .scan(ScanRequest::new().filter("nope = 1"))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidInput);
    store.close().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unique_keys_reject_in_input_order_and_write_nothing() {
    let (_dir, uri) = temp_uri();
    let store = store(&uri).await;
    store
        .add(&records(&[("a", Some("ea"), ""), ("b", None, "")], &[]))
        .await
        .unwrap();
    // Retired and superseded rows still hold their keys.
    store.tombstone(&["b"]).await.unwrap();
    let cases: Vec<(RecordBatch, BatchProblem)> = vec![
        (
            records(&[("x", None, ""), ("a", None, ""), ("x", None, "")], &[]),
            BatchProblem::AlreadyExists {
                column: "id".into(),
                row: 1,
                value: "a".into(),
            },
        ),
        (
            records(&[("x", None, ""), ("y", None, ""), ("x", None, "")], &[]),
            BatchProblem::DuplicateInBatch {
                column: "id".into(),
                row: 2,
                first_row: 0,
                value: "x".into(),
            },
        ),
        (
            records(&[("x", Some("ex"), ""), ("y", Some("ea"), "")], &[]),
            BatchProblem::AlreadyExists {
                column: "external_id".into(),
                row: 1,
                value: "ea".into(),
            },
        ),
        (
            records(&[("x", Some("e"), ""), ("y", Some("e"), "")], &[]),
            BatchProblem::DuplicateInBatch {
                column: "external_id".into(),
                row: 1,
                first_row: 0,
                value: "e".into(),
            },
        ),
    ];
    for (batch, expected) in cases {
        let err = store.add(&batch).await.unwrap_err();
        assert_eq!(problem(&err), &expected, "{err}");
    }
    let err = store
        .add(&records(&[("a", None, "")], &[]))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::AlreadyExists);
    assert_eq!(visible(&store, Visibility::all()).await, ["a", "b"]);
    // b's only row is a tombstone: free.
    store.add(&records(&[("b", None, "")], &[])).await.unwrap();
    store.close().await.unwrap();
}

/// The reads of one record write (are the ids new, the secondary keys;
/// what the upserted keys name) run on one view: one state, one listing of
/// the unmerged tier (before: one view each).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_record_writes_reads_share_one_view() {
    let (_dir, uri) = temp_uri();
    let store = store(&uri).await;
    store
        .add(&records(&[("a1", Some("ea"), "v1")], &[]))
        .await
        .unwrap();
    store.merge().await.unwrap();
    let views = |before: usize| store.views_taken() - before;
    let before = store.views_taken();
    store
        .add(&records(&[("b1", Some("eb"), "b")], &[]))
        .await
        .unwrap();
    assert_eq!(views(before), 1, "an add's checks of two keys");
    let before = store.views_taken();
    store
        .upsert(&records(
            &[("a2", Some("ea"), "v2"), ("c1", Some("ec"), "c")],
            &[],
        ))
        .await
        .unwrap();
    assert_eq!(views(before), 1, "an upsert's reads");
    let before = store.views_taken();
    store
        .check_upsert(&records(&[("a3", Some("ea"), "v3")], &[]))
        .await
        .unwrap();
    assert_eq!(views(before), 1, "check_upsert's reads");
    assert_eq!(
        visible(&store, Visibility::default()).await,
        ["a2", "b1", "c1"]
    );
    store.close().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_upsert_reports_what_an_upsert_would_do_and_writes_nothing() {
    let (_dir, uri) = temp_uri();
    let store = store(&uri).await;
    store
        .upsert(&records(&[("a1", Some("ea"), "v1")], &[]))
        .await
        .unwrap();
    store.merge().await.unwrap();
    // One replaced (its record in the base table), one inserted.
    let batch = records(&[("a2", Some("ea"), "v2"), ("b1", Some("eb"), "b")], &[]);
    let checked = store.check_upsert(&batch).await.unwrap();
    assert_eq!(
        checked
            .iter()
            .map(|o| (o.id.as_str(), o.inserted, o.replaced_id.as_deref()))
            .collect::<Vec<_>>(),
        [("a2", false, Some("a1")), ("b1", true, None)]
    );
    // A read-only handle can check too.
    let reader = Store::open_read_only(caps_config(&uri)).await.unwrap();
    assert_eq!(reader.check_upsert(&batch).await.unwrap(), checked);
    assert!(
        reader.upsert(&batch).await.is_err(),
        "a read-only handle wrote"
    );
    // Nothing written: a1 is still the current version, a2 and b1 absent.
    assert_eq!(visible(&store, Visibility::default()).await, ["a1"]);
    assert!(store.get("a2").await.unwrap().is_none());
    // The upsert itself does what the check said.
    assert_eq!(store.upsert(&batch).await.unwrap(), checked);
    assert_eq!(visible(&store, Visibility::default()).await, ["a2", "b1"]);
    // And the check refuses what the upsert refuses, with the same problem.
    for bad in [
        records(&[("a2", Some("ez"), "")], &[]),
        records(&[("c", None, "")], &[]),
        records(&[("c1", Some("ec"), ""), ("c2", Some("ec"), "")], &[]),
    ] {
        let checked = store.check_upsert(&bad).await.unwrap_err();
        let upserted = store.upsert(&bad).await.unwrap_err();
        assert_eq!(problem(&checked), problem(&upserted), "{checked}");
    }
    assert_eq!(visible(&store, Visibility::default()).await, ["a2", "b1"]);
    store.close().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upsert_inserts_or_replaces_by_secondary_key_and_patch_makes_a_new_version() {
    let (_dir, uri) = temp_uri();
    let store = store(&uri).await;
    let out = store
        .upsert(&records(&[("a1", Some("ea"), "v1")], &[]))
        .await
        .unwrap();
    assert!(out[0].inserted && out[0].replaced_id.is_none());
    // The caller's supersedes_id is ignored.
    let out = store
        .upsert(&records(
            &[("a2", Some("ea"), "v2"), ("b1", Some("eb"), "b")],
            &[("supersedes_id", vec![Some("zzz"), Some("zzz")])],
        ))
        .await
        .unwrap();
    assert_eq!(
        (out[0].inserted, out[0].replaced_id.as_deref()),
        (false, Some("a1"))
    );
    assert!(out[1].inserted);
    assert_eq!(visible(&store, Visibility::default()).await, ["a2", "b1"]);
    // Every row needs its secondary key; ids must be new.
    let err = store
        .upsert(&records(&[("c", None, "")], &[]))
        .await
        .unwrap_err();
    assert!(
        matches!(
            problem(&err),
            BatchProblem::MissingSecondaryKey { row: 0, .. }
        ),
        "{err}"
    );
    let err = store
        .upsert(&records(&[("a2", Some("ez"), "")], &[]))
        .await
        .unwrap_err();
    assert!(
        matches!(problem(&err), BatchProblem::AlreadyExists { .. }),
        "{err}"
    );
    // A secondary key held only by a hidden (retired) non-tombstone row.
    store
        .add(&records(
            &[("r", Some("er"), "")],
            &[("lifecycle_status", vec![Some("retired")])],
        ))
        .await
        .unwrap();
    let err = store
        .upsert(&records(&[("r2", Some("er"), "")], &[]))
        .await
        .unwrap_err();
    assert!(
        matches!(problem(&err), BatchProblem::AlreadyExists { value, .. } if value == "er"),
        "{err}"
    );

    // Patch: a new version under a new key, the old one superseded.
    let patch = RecordBatch::try_new(
        Arc::new(Schema::new(vec![Field::new("text", DataType::Utf8, true)])),
        vec![Arc::new(StringArray::from(vec![Some("patched")]))],
    )
    .unwrap();
    let v = store
        .patch(&PatchTarget::SecondaryKey("ea".into()), &patch)
        .await
        .unwrap()
        .expect("found");
    assert_eq!(v.replaced_id, "a2");
    let now = store.get(&v.id).await.unwrap().unwrap();
    let s = |c: &str| {
        now.column_by_name(c)
            .unwrap()
            .as_string::<i32>()
            .value(0)
            .to_string()
    };
    assert_eq!(
        (s("text"), s("supersedes_id"), s("external_id")),
        ("patched".into(), "a2".into(), "ea".into())
    );
    let mut expected = vec!["b1".to_string(), v.id.clone()];
    expected.sort();
    assert_eq!(visible(&store, Visibility::default()).await, expected);
    // Nothing visible to patch; bad patches.
    assert!(
        store
            .patch(&PatchTarget::Id("a1".into()), &patch)
            .await
            .unwrap()
            .is_none()
    );
    let key_patch = RecordBatch::try_new(
        Arc::new(Schema::new(vec![Field::new("id", DataType::Utf8, true)])),
        vec![Arc::new(StringArray::from(vec![Some("z")]))],
    )
    .unwrap();
    let err = store
        .patch(&PatchTarget::Id("b1".into()), &key_patch)
        .await
        .unwrap_err();
    assert!(err.to_string().contains("cannot be patched"), "{err}");
    let empty = RecordBatch::try_new(
        Arc::new(Schema::new(vec![Field::new("text", DataType::Utf8, true)])),
        vec![Arc::new(StringArray::from(vec![None::<&str>]))],
    )
    .unwrap();
    let err = store
        .patch(&PatchTarget::Id("b1".into()), &empty)
        .await
        .unwrap_err();
    assert!(err.to_string().contains("changes nothing"), "{err}");
    store.close().await.unwrap();
}

fn text_patch(text: &str) -> RecordBatch {
    RecordBatch::try_new(
        Arc::new(Schema::new(vec![Field::new("text", DataType::Utf8, true)])),
        vec![Arc::new(StringArray::from(vec![Some(text)]))],
    )
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleting_the_current_version_keeps_its_predecessors_hidden() {
    let (_dir, uri) = temp_uri();
    let store = store(&uri).await;
    store
        .upsert(&records(&[("v1", Some("e"), "one")], &[]))
        .await
        .unwrap();
    store
        .upsert(&records(&[("v2", Some("e"), "two")], &[]))
        .await
        .unwrap();
    let v3 = store
        .patch(&PatchTarget::Id("v2".into()), &text_patch("three"))
        .await
        .unwrap()
        .unwrap()
        .id;
    assert_eq!(
        visible(&store, Visibility::default()).await,
        std::slice::from_ref(&v3)
    );
    // Delete the current version: the chain stays hidden, nothing comes back.
    assert_eq!(store.tombstone(&[&v3]).await.unwrap(), [true]);
    assert!(visible(&store, Visibility::default()).await.is_empty());
    assert_eq!(store.count(None).await.unwrap(), 0);
    // An older version is still deletable by key (a lookup returns it).
    assert!(store.get("v1").await.unwrap().is_some());
    assert_eq!(store.tombstone(&["v1"]).await.unwrap(), [true]);
    assert!(store.get("v1").await.unwrap().is_none());
    // After a merge, the same.
    store.merge().await.unwrap();
    assert!(visible(&store, Visibility::default()).await.is_empty());
    store.close().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_patches_of_one_record_never_fork_it() {
    let (_dir, uri) = temp_uri();
    let store = Arc::new(store(&uri).await);
    store
        .add(&records(&[("x", Some("ex"), "base")], &[]))
        .await
        .unwrap();
    // Both build their version from the same current record, then write.
    let a = store
        .patch_version(&PatchTarget::Id("x".into()), &text_patch("a"), "xa")
        .await
        .unwrap()
        .unwrap();
    let b = store
        .patch_version(&PatchTarget::Id("x".into()), &text_patch("b"), "xb")
        .await
        .unwrap()
        .unwrap();
    let (ra, rb) = tokio::join!(
        store.add_new_versions(&a.row),
        store.add_new_versions(&b.row)
    );
    let (won, lost) = match (ra, rb) {
        (Ok(()), Err(e)) => ("xa", e),
        (Err(e), Ok(())) => ("xb", e),
        other => panic!("exactly one patch wins: {other:?}"),
    };
    assert_eq!(lost.kind(), ErrorKind::Conflict, "{lost}");
    assert!(
        matches!(problem(&lost), BatchProblem::NotCurrent { superseded_by: Some(by), .. } if by == won),
        "{lost}"
    );
    assert_eq!(visible(&store, Visibility::default()).await, [won]);
    // A plain add naming a superseded record is refused the same way.
    let err = store
        .add(&records(
            &[("y", None, "")],
            &[("supersedes_id", vec![Some("x")])],
        ))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Conflict, "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_filter_string_reveals_a_hidden_row_before_or_after_a_merge() {
    let (_dir, uri) = temp_uri();
    let store = store(&uri).await;
    let past = (NOW - 1).to_string();
    store
        .add(&records(
            &[
                ("live", None, ""),
                ("expired", None, ""),
                ("retired", None, ""),
                ("old", None, ""),
                ("new", None, ""),
                ("gone", None, ""),
            ],
            &[
                (
                    "expires_at",
                    vec![None, Some(past.as_str()), None, None, None, None],
                ),
                (
                    "lifecycle_status",
                    vec![
                        Some("active"),
                        Some("active"),
                        Some("retired"),
                        Some("active"),
                        Some("active"),
                        Some("active"),
                    ],
                ),
                (
                    "supersedes_id",
                    vec![None, None, None, None, Some("old"), None],
                ),
            ],
        ))
        .await
        .unwrap();
    store.tombstone(&["gone"]).await.unwrap();
    let hostile = [
        "id = 'a') OR (1=1",
        "1=1) OR (1=1",
        "id = 'live' OR true",
        "(id = 'x') OR content_type = 'application/vnd.lance-context.tombstone'",
        "id IN ('expired', 'retired', 'old', 'gone')",
    ];
    for merged in [false, true] {
        if merged {
            store.merge().await.unwrap();
        }
        for filter in hostile {
            let shown = store
                .scan(ScanRequest::new().filter(filter).visibility(Visibility {
                    now_micros: Some(NOW),
                    ..Visibility::default()
                }))
                .await
                .map(|b| ids(&b))
                .unwrap_or_default();
            for hidden in ["expired", "retired", "old", "gone"] {
                assert!(
                    !shown.contains(&hidden.to_string()),
                    "merged {merged}: {filter:?} showed {hidden}: {shown:?}"
                );
            }
        }
        assert_eq!(
            visible(
                &store,
                Visibility {
                    now_micros: Some(NOW),
                    ..Visibility::default()
                }
            )
            .await,
            ["live", "new"],
            "merged {merged}"
        );
    }
    store.close().await.unwrap();
}

/// With a filter of its own, a scan applies the visibility rule to the rows
/// the filter selects (the scan reads fewer columns that way): the rows, the
/// count, and limit and offset — which count visible rows — must be those of
/// the rule applied to the newest version of each key, in generations and
/// after a merge.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_filtered_scan_pages_and_counts_visible_rows_only() {
    let (_dir, uri) = temp_uri();
    let store = store(&uri).await;
    // Past for `NOW` and for the clock `count` uses.
    let past = (clock_micros() - 1_000_000).to_string();
    let names: Vec<String> = (0..20).map(|i| format!("r{i:02}")).collect();
    let exts: Vec<String> = (0..20).map(|i| format!("e{i:02}")).collect();
    let rows: Vec<(&str, Option<&str>, &str)> = names
        .iter()
        .zip(&exts)
        .map(|(n, e)| (n.as_str(), Some(e.as_str()), "x"))
        .collect();
    // Even rows retired; r07 expired.
    let status: Vec<Option<&str>> = (0..20)
        .map(|i| Some(if i % 2 == 0 { "retired" } else { "active" }))
        .collect();
    let expires: Vec<Option<&str>> = (0..20).map(|i| (i == 7).then_some(past.as_str())).collect();
    store
        .add(&records(
            &rows,
            &[("lifecycle_status", status), ("expires_at", expires)],
        ))
        .await
        .unwrap();
    let at_now = Visibility {
        now_micros: Some(NOW),
        ..Visibility::default()
    };
    let filtered = |limit: Option<usize>, offset: Option<usize>, sorted: bool| {
        let mut request = ScanRequest::new().filter("text = 'x'").visibility(at_now);
        if let Some(limit) = limit {
            request = request.limit(limit);
        }
        if let Some(offset) = offset {
            request = request.offset(offset);
        }
        if sorted {
            request = request.order_by(SortKey::asc("id"));
        }
        let store = &store;
        async move {
            let batch = store.scan(request).await.unwrap();
            if sorted {
                ids_in_order(&batch)
            } else {
                ids(&batch)
            }
        }
    };
    for step in ["merged", "rewritten in generations", "merged again"] {
        match step {
            "merged" | "merged again" => {
                store.merge().await.unwrap();
            }
            _ => {
                // The newest version hides r03 (tombstone) and r05
                // (superseded by n05, which matches the filter too).
                store.tombstone(&["r03"]).await.unwrap();
                store
                    .upsert(&records(&[("n05", Some("e05"), "x")], &[]))
                    .await
                    .unwrap();
            }
        }
        let expected: Vec<&str> = if step == "merged" {
            vec![
                "r01", "r03", "r05", "r09", "r11", "r13", "r15", "r17", "r19",
            ]
        } else {
            vec!["n05", "r01", "r09", "r11", "r13", "r15", "r17", "r19"]
        };
        assert_eq!(filtered(None, None, false).await, expected, "{step}");
        assert_eq!(
            store.count(Some("text = 'x'")).await.unwrap() as usize,
            expected.len(),
            "{step}: count"
        );
        // Unsorted pages: any visible rows, as many as asked for.
        let page = filtered(Some(3), None, false).await;
        assert_eq!(page.len(), 3, "{step}: {page:?}");
        assert!(
            page.iter().all(|id| expected.contains(&id.as_str())),
            "{step}: {page:?}"
        );
        let tail = filtered(Some(5), Some(expected.len() - 2), false).await;
        assert_eq!(tail.len(), 2, "{step}: {tail:?}");
        // Sorted pages: exactly these.
        assert_eq!(
            filtered(Some(3), Some(1), true).await,
            expected[1..4].to_vec(),
            "{step}"
        );
    }
    store.close().await.unwrap();
}

fn all_capabilities() -> RecordCapabilities {
    RecordCapabilities {
        tombstones: true,
        supersession: true,
        lifecycle: true,
        unique_keys: true,
        secondary_key: Some("external_id".into()),
    }
}

/// A store whose writes hold at most 10 rows per put (one memtable).
fn small_puts(uri: &str) -> StoreConfig {
    let mut config = StoreConfig::new(uri)
        .with_schema(schema())
        .with_manual_maintenance()
        .with_capabilities(all_capabilities());
    config.writer.max_memtable_rows = 10;
    config
}

/// An upsert of 8 records (16 rows with the rewritten versions they
/// supersede, over the 10 one put holds) cut by a crash after its first put:
/// every record still has exactly one current version — never the new one and
/// the old one both, nor neither.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_supersession_cut_between_puts_never_forks_or_loses_a_record() {
    let (_dir, uri) = temp_uri();
    let store = Store::create(small_puts(&uri)).await.unwrap();
    let n = 8;
    let old: Vec<(String, String)> = (0..n).map(|i| (format!("o{i}"), format!("e{i}"))).collect();
    let new: Vec<(String, String)> = (0..n).map(|i| (format!("n{i}"), format!("e{i}"))).collect();
    let rows = |v: &[(String, String)]| {
        let refs: Vec<(&str, Option<&str>, &str)> = v
            .iter()
            .map(|(id, e)| (id.as_str(), Some(e.as_str()), "text"))
            .collect();
        records(&refs, &[])
    };
    store.add(&rows(&old)).await.unwrap();
    store.fail_write_after_puts(1).unwrap();
    store.upsert(&rows(&new)).await.unwrap_err();
    drop(store);

    let store = Store::open(small_puts(&uri)).await.unwrap();
    let current = visible(&store, Visibility::default()).await;
    for i in 0..n {
        let versions: Vec<&String> = current
            .iter()
            .filter(|id| **id == format!("o{i}") || **id == format!("n{i}"))
            .collect();
        assert_eq!(versions.len(), 1, "e{i}: {versions:?} of {current:?}");
    }
    // The rest of the upsert goes through when retried.
    let rest: Vec<(String, String)> = new
        .iter()
        .filter(|(id, _)| !current.contains(id))
        .cloned()
        .collect();
    store.upsert(&rows(&rest)).await.unwrap();
    let current = visible(&store, Visibility::default()).await;
    assert_eq!(
        current,
        new.iter().map(|(id, _)| id.clone()).collect::<Vec<_>>()
    );
}

/// A chain of versions written in one batch must become visible together: a
/// chain longer than one put holds is refused, naming where it starts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chain_of_versions_longer_than_one_put_is_refused() {
    let (_dir, uri) = temp_uri();
    let store = Store::create(small_puts(&uri)).await.unwrap();
    let ids: Vec<String> = (0..12).map(|i| format!("c{i:02}")).collect();
    let refs: Vec<(&str, Option<&str>, &str)> =
        ids.iter().map(|id| (id.as_str(), None, "t")).collect();
    let supersedes: Vec<Option<&str>> = (0..12)
        .map(|i| (i > 0).then(|| ids[i - 1].as_str()))
        .collect();
    let err = store
        .add(&records(&refs, &[("supersedes_id", supersedes.clone())]))
        .await
        .unwrap_err();
    assert!(
        matches!(
            problem(&err),
            BatchProblem::LinkedRowsTooMany {
                row: 0,
                rows: 12,
                max: 10,
                ..
            }
        ),
        "{err}"
    );
    assert!(store.scan(ScanRequest::new()).await.unwrap().num_rows() == 0);
    // Unlinked rows over several puts are fine, and so is a short chain.
    let plain: Vec<String> = (0..25).map(|i| format!("p{i:02}")).collect();
    let refs: Vec<(&str, Option<&str>, &str)> =
        plain.iter().map(|id| (id.as_str(), None, "t")).collect();
    let mut links: Vec<Option<&str>> = vec![None; 25];
    links[24] = Some("p00");
    store
        .add(&records(&refs, &[("supersedes_id", links)]))
        .await
        .unwrap();
    let current = visible(&store, Visibility::default()).await;
    assert_eq!(current.len(), 24);
    assert!(!current.contains(&"p00".to_string()));
}

/// A delete racing an add that supersedes the deleted record: in either
/// order the record stays deleted (the add must not rewrite it after the
/// delete was acknowledged).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_delete_racing_a_supersession_is_never_undone() {
    let (_dir, uri) = temp_uri();
    let store = std::sync::Arc::new(store(&uri).await);
    for round in 0..20 {
        let (x, y) = (format!("x{round}"), format!("y{round}"));
        store
            .add(&records(&[(&x, None, "old")], &[]))
            .await
            .unwrap();
        let next = records(&[(&y, None, "new")], &[("supersedes_id", vec![Some(&x)])]);
        let (added, deleted) = tokio::join!(
            {
                let store = store.clone();
                async move { store.add(&next).await }
            },
            {
                let (store, x) = (store.clone(), x.clone());
                async move { store.delete(&[&x]).await }
            }
        );
        deleted.unwrap();
        if let Err(e) = added {
            assert_eq!(e.kind(), ErrorKind::Conflict, "{e}");
        }
        assert!(
            store.get(&x).await.unwrap().is_none(),
            "round {round}: {x} came back after its delete was acknowledged"
        );
    }
}

/// `count()` of a store with record capabilities counts the base table's
/// visible rows on their own and adjusts them by the unmerged generations;
/// it must agree with the scan through every kind of change — deletes, new
/// versions, rows added hidden — before and after a merge, and as rows
/// expire with the clock (the base count is remembered only until the next
/// row expires).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn count_agrees_with_the_scan_as_records_change_and_expire() {
    let (_dir, uri) = temp_uri();
    let store = store(&uri).await;
    let clock = clock_micros();
    let past = (clock - 1_000_000).to_string();
    // Under load the steps before the wait can outlast `soon`: until then
    // a count may be one lower, and must still agree with the scan.
    let soon_at = clock + 6_000_000;
    let soon = soon_at.to_string();
    let about = |count: u64, before_expiry: u64| {
        assert!(
            count == before_expiry || count + 1 == before_expiry,
            "count {count}, {before_expiry} before `soon` expires"
        )
    };
    let later = (clock + 86_400_000_000).to_string();
    let shown = async |store: &Store| {
        store
            .scan(ScanRequest::new().project(["id"]))
            .await
            .unwrap()
            .num_rows() as u64
    };
    store
        .add(&records(
            &[
                ("a1", Some("ea1"), ""),
                ("a2", Some("ea2"), ""),
                ("a3", Some("ea3"), ""),
                ("expired", Some("ex"), ""),
                ("soon", Some("so"), ""),
                ("later", Some("la"), ""),
                ("retired", Some("re"), ""),
                ("retired_at", Some("rt"), ""),
            ],
            &[
                (
                    "expires_at",
                    vec![
                        None,
                        None,
                        None,
                        Some(past.as_str()),
                        Some(soon.as_str()),
                        Some(later.as_str()),
                        None,
                        None,
                    ],
                ),
                (
                    "lifecycle_status",
                    vec![
                        Some("active"),
                        Some("active"),
                        Some("active"),
                        Some("active"),
                        Some("active"),
                        Some("active"),
                        Some("retired"),
                        Some("active"),
                    ],
                ),
                (
                    "retired_at",
                    vec![None, None, None, None, None, None, None, Some("5")],
                ),
            ],
        ))
        .await
        .unwrap();
    // In the unmerged tier only, then in the base table.
    about(store.count(None).await.unwrap(), 5);
    assert_eq!(store.count(None).await.unwrap(), shown(&store).await);
    store.merge().await.unwrap();
    about(store.count(None).await.unwrap(), 5);
    assert_eq!(store.count(None).await.unwrap(), shown(&store).await);

    // Unmerged changes to base rows: a delete, a new version (the old one
    // hidden), a new record, a new record already expired.
    store.delete(&["a1"]).await.unwrap();
    store
        .upsert(&records(&[("a2v2", Some("ea2"), "v2")], &[]))
        .await
        .unwrap();
    store
        .add(&records(
            &[("new", Some("nw"), ""), ("gone", Some("gn"), "")],
            &[("expires_at", vec![None, Some(past.as_str())])],
        ))
        .await
        .unwrap();
    // a3, soon, later, a2v2 (a2 is superseded), new.
    about(store.count(None).await.unwrap(), 5);
    assert_eq!(store.count(None).await.unwrap(), shown(&store).await);

    // The clock passes `soon`'s expiry: the remembered base count no longer holds.
    let left = (soon_at + 200_000).saturating_sub(clock_micros());
    tokio::time::sleep(std::time::Duration::from_micros(left.max(0) as u64)).await;
    assert_eq!(store.count(None).await.unwrap(), 4);
    assert_eq!(store.count(None).await.unwrap(), shown(&store).await);
    store.merge().await.unwrap();
    assert_eq!(store.count(None).await.unwrap(), 4);
    assert_eq!(store.count(None).await.unwrap(), shown(&store).await);
    // A filter takes the scan path; it agrees too.
    assert_eq!(store.count(Some("run_id = 'run'")).await.unwrap(), 4);
}

/// The base table's visible count is shared through the store: the next
/// handle (every CLI command is a new process) reads it instead of counting
/// again — for the same rows (data fingerprint) and rule only.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_count_is_shared_with_the_next_handle_for_that_version_only() {
    let (_dir, uri) = temp_uri();
    let store = store(&uri).await;
    let clock = clock_micros();
    let past = (clock - 1_000_000).to_string();
    store
        .add(&records(
            &[
                ("a1", Some("ea1"), ""),
                ("a2", Some("ea2"), ""),
                ("a3", Some("ea3"), ""),
                ("gone", Some("gn"), ""),
            ],
            &[("expires_at", vec![None, None, None, Some(past.as_str())])],
        ))
        .await
        .unwrap();
    store.merge().await.unwrap();
    assert_eq!(store.count(None).await.unwrap(), 3);

    let path = std::path::Path::new(&uri).join("_lance_context/visible_count");
    let written = std::fs::read_to_string(&path).expect("the count is shared");
    // v3 <version> <data fingerprint> <from> <until> <visible> <expiring> <rule>
    let fields: Vec<&str> = written.trim_end().splitn(8, ' ').collect();
    assert_eq!(fields[5], "3", "{written}");
    let with = |changes: &[(usize, &str)]| {
        let mut f = fields.clone();
        for (index, value) in changes {
            f[*index] = value;
        }
        format!("{}\n", f.join(" "))
    };
    let count_on_a_new_handle = async || {
        let handle = Store::open_read_only(caps_config(&uri)).await.unwrap();
        handle.count(None).await.unwrap()
    };

    // A doctored number shows that a new handle takes the shared count...
    std::fs::write(&path, with(&[(5, "1003")])).unwrap();
    assert_eq!(count_on_a_new_handle().await, 1003);
    // ...but not for other rows (a dataset recreated in place), another
    // rule, or a torn line.
    std::fs::write(&path, with(&[(5, "1003"), (2, "00000000000012ab")])).unwrap();
    assert_eq!(count_on_a_new_handle().await, 3);
    std::fs::write(&path, with(&[(5, "1003"), (7, "superseded_by_id IS NULL")])).unwrap();
    assert_eq!(count_on_a_new_handle().await, 3);
    std::fs::write(&path, &with(&[(5, "1003")])[..written.len() - 3]).unwrap();
    assert_eq!(count_on_a_new_handle().await, 3);
    // A count that expired (a row's expiry passed since) is taken again.
    let expired = (clock - 10).to_string();
    std::fs::write(&path, with(&[(5, "1003"), (4, &expired)])).unwrap();
    assert_eq!(count_on_a_new_handle().await, 3);
    // A listed expiry that passed takes its row off, with no count taken.
    let (listed_from, listed) = ((clock - 20).to_string(), (clock - 10).to_string());
    std::fs::write(&path, with(&[(5, "1003"), (3, &listed_from), (6, &listed)])).unwrap();
    assert_eq!(count_on_a_new_handle().await, 1002);

    // The base moves on: the next count is of the new version, and shared.
    std::fs::write(&path, with(&[(5, "1003")])).unwrap();
    store.delete(&["a1"]).await.unwrap();
    store.merge().await.unwrap();
    assert_eq!(count_on_a_new_handle().await, 2);
    let rewritten = std::fs::read_to_string(&path).unwrap();
    let version: u64 = rewritten.split(' ').nth(1).unwrap().parse().unwrap();
    assert!(version > fields[1].parse::<u64>().unwrap(), "{rewritten}");
    // A handle pinned to the older version does not replace the newer count.
    let old = Store::open_read_only(caps_config(&uri).with_as_of(fields[1].parse().unwrap()))
        .await
        .unwrap();
    assert_eq!(old.count(None).await.unwrap(), 3);
    assert_eq!(std::fs::read_to_string(&path).unwrap(), rewritten);
}

/// The fields of the shared count file at `path`: `v3 <version> <data
/// fingerprint> <from> <until> <visible> <expiring> <rule>`.
fn shared_count_fields(path: &std::path::Path) -> Vec<String> {
    std::fs::read_to_string(path)
        .expect("a count is shared")
        .trim_end()
        .splitn(8, ' ')
        .map(str::to_string)
        .collect()
}

/// A merge carries the visible count to the version it makes: the count of
/// the version it merged into, adjusted by the generations it merged, shared
/// before any `count()` — so the first count of a new base version, in any
/// process, reads no base rows. Proven with a doctored count before the
/// merge: the carried one is off by the same amount.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_merge_carries_the_visible_count_to_the_version_it_makes() {
    let (_dir, uri) = temp_uri();
    let clock = clock_micros();
    let past = (clock - 1_000_000).to_string();
    let soon = (clock + 3_600_000_000).to_string();
    let later = (clock + 7_200_000_000).to_string();
    let path = std::path::Path::new(&uri).join("_lance_context/visible_count");
    let fields = || shared_count_fields(&path);
    {
        let store = store(&uri).await;
        store
            .add(&records(
                &[
                    ("a1", Some("ea1"), ""),
                    ("a2", Some("ea2"), ""),
                    ("a3", Some("ea3"), ""),
                    ("later", Some("la"), ""),
                ],
                &[("expires_at", vec![None, None, None, Some(later.as_str())])],
            ))
            .await
            .unwrap();
        // The first merge, into an empty table, already carries a count.
        store.merge().await.unwrap();
        let first = fields();
        assert_eq!(first[5], "4", "{first:?}");
        assert_eq!(first[6], later, "the expiries ahead: {first:?}");
        assert_eq!(first[4], "-", "every expiry listed: {first:?}");
        store.close().await.unwrap();
    }
    // Doctor the shared count: the next merge starts from it.
    let mut doctored = fields();
    doctored[5] = "1004".into();
    std::fs::write(&path, format!("{}\n", doctored.join(" "))).unwrap();

    let store = Store::open(caps_config(&uri)).await.unwrap();
    // Unmerged: a base row deleted, one superseded, a new record, a new one
    // already expired, a new one expiring sooner than any before.
    store.delete(&["a1"]).await.unwrap();
    store
        .upsert(&records(&[("a2v2", Some("ea2"), "v2")], &[]))
        .await
        .unwrap();
    store
        .add(&records(
            &[
                ("new", Some("nw"), ""),
                ("gone", Some("gn"), ""),
                ("soon", Some("so"), ""),
            ],
            &[(
                "expires_at",
                vec![None, Some(past.as_str()), Some(soon.as_str())],
            )],
        ))
        .await
        .unwrap();
    let stats = store.merge().await.unwrap();
    assert!(stats.generations_merged > 0);
    let carried = fields();
    assert!(
        carried[1].parse::<u64>().unwrap() > doctored[1].parse::<u64>().unwrap(),
        "{carried:?}"
    );
    assert_ne!(carried[2], doctored[2], "other rows: {carried:?}");
    // 1004 - a1 + (a2 -> a2v2) + new + soon (gone had expired).
    assert_eq!(
        carried[5], "1005",
        "carried from the doctored count: {carried:?}"
    );
    // The merged rows' expiries join the list (gone had expired).
    assert_eq!(
        carried[6],
        format!("{soon},{later}"),
        "the expiries ahead: {carried:?}"
    );

    // The truth, counted afresh, and through the scan path.
    std::fs::remove_file(&path).unwrap();
    let fresh = Store::open_read_only(caps_config(&uri)).await.unwrap();
    assert_eq!(fresh.count(None).await.unwrap(), 5);
    assert_eq!(fresh.count(Some("id IS NOT NULL")).await.unwrap(), 5);
    // A merge that knows no count for the version it merged into (a new
    // writer, the shared count gone) carries none: it does not scan the
    // base table; the next count does, once, and shares it.
    store.close().await.unwrap();
    std::fs::remove_file(&path).unwrap();
    let store = Store::open(caps_config(&uri)).await.unwrap();
    store.delete(&["a3"]).await.unwrap();
    store.merge().await.unwrap();
    assert!(!path.exists(), "nothing carried: {:?}", fields());
    let fresh = Store::open_read_only(caps_config(&uri)).await.unwrap();
    assert_eq!(fresh.count(None).await.unwrap(), 4);
    assert_eq!(fields()[5], "4");
    assert_eq!(fresh.count(Some("id IS NOT NULL")).await.unwrap(), 4);
}

/// Every merge extends the key indexes (the key's and the secondary key's)
/// with a segment of its own, and a keyed read searches each; past four
/// segments a refresh folds all but the first into one. The folded indexes
/// still find every key: lookups, the unique check of an add and an upsert
/// by secondary key all answer from them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn key_index_segments_are_folded_past_four() {
    let (_dir, uri) = temp_uri();
    let store = store(&uri).await;
    let mut most = 0;
    let mut ids: Vec<String> = Vec::new();
    for round in 0..9 {
        let rows: Vec<(String, String)> = (0..3)
            .map(|i| (format!("r{round}-{i}"), format!("e{round}-{i}")))
            .collect();
        add_merged(&store, &rows).await;
        ids.extend(rows.into_iter().map(|(id, _)| id));
        let stats = store.stats().await.unwrap();
        for name in ["id_idx", "external_id_idx"] {
            let index = stats
                .indexes
                .iter()
                .find(|i| i.name == name)
                .unwrap_or_else(|| panic!("no {name}: {:?}", stats.indexes));
            assert!(index.covers_all_rows, "round {round}: {index:?}");
            assert!(index.segments <= 4, "round {round}: {index:?}");
            most = most.max(index.segments);
        }
    }
    assert!(
        most >= 3,
        "the indexes were never extended ({most} segments)"
    );
    let refs: Vec<&str> = ids.iter().map(String::as_str).collect();
    assert_eq!(store.get_many(&refs).await.unwrap().num_rows(), ids.len());
    let taken = store
        .add(&records(&[("fresh", Some("e0-1"), "t")], &[]))
        .await
        .unwrap_err();
    assert_eq!(taken.kind(), ErrorKind::AlreadyExists, "{taken}");
    let outcome = store
        .upsert(&records(&[("v2", Some("e4-2"), "t")], &[]))
        .await
        .unwrap();
    assert_eq!(outcome[0].replaced_id.as_deref(), Some("r4-2"));
}

/// A compaction carries the visible count: the compacted version holds the
/// same rows in new files, so the count of the version it compacted — its
/// listed expiries too — is shared for it, and the first `count()` after a
/// compaction, in any process, reads no base rows. Proven with a doctored
/// count: a new handle counts the doctored number.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_compaction_carries_the_visible_count() {
    let (_dir, uri) = temp_uri();
    let path = std::path::Path::new(&uri).join("_lance_context/visible_count");
    let fields = || shared_count_fields(&path);
    let later = (clock_micros() + 3_600_000_000).to_string();
    let store = store(&uri).await;
    // Three merges: three fragments, one row deleted (a deletion file the
    // compaction materialises), one row with an expiry ahead.
    for round in 0..3 {
        let (a, b) = (format!("a{round}"), format!("b{round}"));
        let (ea, eb) = (format!("ea{round}"), format!("eb{round}"));
        store
            .add(&records(
                &[
                    (a.as_str(), Some(ea.as_str()), ""),
                    (b.as_str(), Some(eb.as_str()), ""),
                ],
                &[(
                    "expires_at",
                    vec![None, (round == 1).then_some(later.as_str())],
                )],
            ))
            .await
            .unwrap();
        store.merge().await.unwrap();
    }
    store.delete(&["a0"]).await.unwrap();
    store.merge().await.unwrap();
    let before = fields();
    assert_eq!(before[5], "5", "{before:?}");
    assert_eq!(before[6], later, "{before:?}");
    // Doctored, and a new handle (the old one remembers the true count).
    store.close().await.unwrap();
    let mut doctored = before.clone();
    doctored[5] = "1005".into();
    std::fs::write(&path, format!("{}\n", doctored.join(" "))).unwrap();
    let store = Store::open(caps_config(&uri)).await.unwrap();

    let stats = store.compact().await.unwrap();
    assert!(stats.fragments_removed > 1, "{stats:?}");
    let after = fields();
    assert!(
        after[1].parse::<u64>().unwrap() > before[1].parse::<u64>().unwrap(),
        "the compacted version: {after:?}"
    );
    assert_ne!(after[2], before[2], "other data files: {after:?}");
    assert_eq!(
        after[5], "1005",
        "carried from the doctored count: {after:?}"
    );
    assert_eq!(after[6], later, "the expiries ahead: {after:?}");
    let fresh = Store::open_read_only(caps_config(&uri)).await.unwrap();
    assert_eq!(
        fresh.count(None).await.unwrap(),
        1005,
        "the count read no rows"
    );

    // The truth, counted afresh. A compaction with no count known for the
    // version it compacted carries none (it never scans for one).
    std::fs::remove_file(&path).unwrap();
    let fresh = Store::open_read_only(caps_config(&uri)).await.unwrap();
    assert_eq!(fresh.count(None).await.unwrap(), 5);
    for round in 3..5 {
        let (a, ea) = (format!("a{round}"), format!("ea{round}"));
        store
            .add(&records(&[(a.as_str(), Some(ea.as_str()), "")], &[]))
            .await
            .unwrap();
        store.merge().await.unwrap();
    }
    store.close().await.unwrap();
    std::fs::remove_file(&path).unwrap();
    let store = Store::open(caps_config(&uri)).await.unwrap();
    assert!(store.compact().await.unwrap().fragments_removed > 1);
    assert!(!path.exists(), "nothing carried: {:?}", fields());
    let fresh = Store::open_read_only(caps_config(&uri)).await.unwrap();
    assert_eq!(fresh.count(None).await.unwrap(), 7);
    assert_eq!(fields()[5], "7");
}

/// A count lists the expiries of the rows it counts: when one passes, the
/// count drops by that row without reading the table (the shared count is
/// not taken again) — and a merge that replaces a row with a listed expiry
/// takes it off the list. Proven with a doctored count: the drop applies to
/// it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_count_follows_its_listed_expiries_without_reading_the_table() {
    let (_dir, uri) = temp_uri();
    let path = std::path::Path::new(&uri).join("_lance_context/visible_count");
    let fields = || shared_count_fields(&path);
    let store = store(&uri).await;
    let clock = clock_micros();
    // Far enough ahead for what comes before the wait, on a loaded machine.
    let soon = (clock + 8_000_000).to_string();
    let later = (clock + 3_600_000_000).to_string();
    store
        .add(&records(
            &[
                ("a1", Some("e1"), ""),
                ("s1", Some("s1"), ""),
                ("s2", Some("s2"), ""),
                ("l1", Some("l1"), ""),
            ],
            &[(
                "expires_at",
                vec![
                    None,
                    Some(soon.as_str()),
                    Some(soon.as_str()),
                    Some(later.as_str()),
                ],
            )],
        ))
        .await
        .unwrap();
    store.merge().await.unwrap();
    assert_eq!(store.count(None).await.unwrap(), 4);
    assert_eq!(fields()[6], format!("{soon}*2,{later}"), "carried");
    // A count taken by a scan lists them too.
    std::fs::remove_file(&path).unwrap();
    let scanned = Store::open_read_only(caps_config(&uri)).await.unwrap();
    assert_eq!(scanned.count(None).await.unwrap(), 4);
    let listed = fields();
    assert_eq!(listed[6], format!("{soon}*2,{later}"), "scanned");
    assert_eq!(listed[4], "-", "every expiry listed");
    // Replace l1 (a listed expiry) by a version that never expires: the
    // merge takes l1's expiry off the list.
    store
        .upsert(&records(&[("l1v2", Some("l1"), "v2")], &[]))
        .await
        .unwrap();
    store.merge().await.unwrap();
    let carried = fields();
    assert_eq!(carried[5], "4", "{carried:?}");
    assert_eq!(carried[6], format!("{soon}*2"), "{carried:?}");
    // Doctor the count (+1000): what follows is computed from it.
    let mut doctored = carried.clone();
    doctored[5] = "1004".into();
    let doctored = format!("{}\n", doctored.join(" "));
    std::fs::write(&path, &doctored).unwrap();
    while clock_micros() <= clock + 8_100_000 {
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    let handle = Store::open_read_only(caps_config(&uri)).await.unwrap();
    assert_eq!(handle.count(None).await.unwrap(), 1002, "s1, s2 expired");
    assert_eq!(
        std::fs::read_to_string(&path).unwrap(),
        doctored,
        "no count taken again"
    );
    // The truth, through the scan path and counted afresh.
    assert_eq!(handle.count(Some("id IS NOT NULL")).await.unwrap(), 2);
    std::fs::remove_file(&path).unwrap();
    let fresh = Store::open_read_only(caps_config(&uri)).await.unwrap();
    assert_eq!(fresh.count(None).await.unwrap(), 2);
    assert_eq!(fields()[6], "-", "nothing left to expire");
}

/// `expires_at` in a time zone expires at the same instant as in UTC: one
/// hour ahead is still visible and one hour ago is hidden, in zones ahead of
/// and behind UTC, in a scan, a count (counted, then carried by a merge) and
/// through the unmerged tier. (The clock was once text, read as the
/// column zone's local time: five hours off.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_zoned_expiry_column_expires_at_the_same_instant() {
    for zone in ["+05:00", "-05:00", "America/New_York"] {
        let (_dir, uri) = temp_uri();
        let expires_type = DataType::Timestamp(TimeUnit::Microsecond, Some(zone.into()));
        let schema = Arc::new(Schema::new(vec![
            Field::new("id", DataType::Utf8, false).with_metadata(HashMap::from([(
                PRIMARY_KEY_METADATA.to_string(),
                "true".to_string(),
            )])),
            Field::new("expires_at", expires_type.clone(), true),
            Field::new("lifecycle_status", DataType::Utf8, true),
            Field::new(
                "retired_at",
                DataType::Timestamp(TimeUnit::Microsecond, None),
                true,
            ),
        ]));
        let config = StoreConfig::new(uri.as_str())
            .with_schema(schema.clone())
            .with_manual_maintenance()
            .with_capabilities(RecordCapabilities {
                lifecycle: true,
                ..RecordCapabilities::default()
            });
        let store = Store::create(config.clone()).await.unwrap();
        let hour = 3_600_000_000;
        let rows = |ids: &[&str], expiries: Vec<Option<i64>>| {
            let expires = TimestampMicrosecondArray::from(expiries).with_timezone(zone);
            RecordBatch::try_new(
                schema.clone(),
                vec![
                    Arc::new(StringArray::from(ids.to_vec())),
                    Arc::new(expires),
                    Arc::new(StringArray::from(vec![Some("active"); ids.len()])),
                    Arc::new(TimestampMicrosecondArray::from(vec![
                        None::<i64>;
                        ids.len()
                    ])),
                ],
            )
            .unwrap()
        };
        let clock = clock_micros();
        store
            .add(&rows(
                &["ahead", "ago", "never"],
                vec![Some(clock + hour), Some(clock - hour), None],
            ))
            .await
            .unwrap();
        let shown = async |store: &Store| {
            let mut ids = ids_in_order(&store.scan(ScanRequest::new()).await.unwrap());
            ids.sort();
            ids
        };
        let want = vec!["ahead".to_string(), "never".to_string()];
        assert_eq!(shown(&store).await, want, "{zone}, unmerged");
        assert_eq!(store.count(None).await.unwrap(), 2, "{zone}, unmerged");
        store.merge().await.unwrap();
        assert_eq!(shown(&store).await, want, "{zone}, merged");
        assert_eq!(store.count(None).await.unwrap(), 2, "{zone}, carried");
        let path = std::path::Path::new(&uri).join("_lance_context/visible_count");
        std::fs::remove_file(&path).unwrap();
        let fresh = Store::open_read_only(config.clone()).await.unwrap();
        assert_eq!(fresh.count(None).await.unwrap(), 2, "{zone}, counted");
        // Over the unmerged tier, and carried by a second merge.
        store
            .add(&rows(
                &["ahead2", "ago2"],
                vec![Some(clock + 2 * hour), Some(clock - 2 * hour)],
            ))
            .await
            .unwrap();
        assert_eq!(
            fresh.count(None).await.unwrap(),
            3,
            "{zone}, with a generation"
        );
        store.merge().await.unwrap();
        let fresh = Store::open_read_only(config).await.unwrap();
        assert_eq!(fresh.count(None).await.unwrap(), 3, "{zone}, carried again");
        assert_eq!(
            fresh.count(Some("id IS NOT NULL")).await.unwrap(),
            3,
            "{zone}, scan path"
        );
    }
}

/// The kept count — listed expiries, carried by merges, shared with new
/// handles — agrees with a count through the scan path at every step of a
/// random history of adds (some rows expiring within the test), deletes,
/// upserts, merges and pauses. A step is not compared when one of the rows'
/// expiries falls between the two counts (either answer is right then).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_kept_count_agrees_with_a_scan_through_a_random_history() {
    let (_dir, uri) = temp_uri();
    let store = store(&uri).await;
    let mut rng: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut next = move || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    let mut expiries: Vec<i64> = Vec::new();
    // Records that never expire within the test, by secondary key: their
    // current id (upserts and deletes pick among them).
    let mut stable: Vec<(String, String)> = Vec::new();
    let (mut written, mut compared) = (0, 0);
    for step in 0..48 {
        let clock = clock_micros();
        match next() % 7 {
            0..=2 => {
                let mut rows = Vec::new();
                let mut expires = Vec::new();
                for _ in 0..4 {
                    let (id, ext) = (format!("r{written}"), format!("e{written}"));
                    written += 1;
                    let expiry = match next() % 4 {
                        0 => None,
                        1 => Some(clock - 1_000_000),
                        2 => Some(clock + 100_000 + (next() % 1_500_000) as i64),
                        _ => Some(clock + 3_600_000_000),
                    };
                    if expiry.is_none_or(|e| e > clock + 60_000_000) {
                        stable.push((ext.clone(), id.clone()));
                    }
                    expiries.extend(expiry);
                    rows.push((id, ext));
                    expires.push(expiry.map(|e| e.to_string()));
                }
                let refs: Vec<(&str, Option<&str>, &str)> = rows
                    .iter()
                    .map(|(id, ext)| (id.as_str(), Some(ext.as_str()), ""))
                    .collect();
                let expires: Vec<Option<&str>> = expires.iter().map(|e| e.as_deref()).collect();
                store
                    .add(&records(&refs, &[("expires_at", expires)]))
                    .await
                    .unwrap();
            }
            3 if !stable.is_empty() => {
                let (_, id) = stable.remove((next() % stable.len() as u64) as usize);
                store.delete(&[id.as_str()]).await.unwrap();
            }
            4 if !stable.is_empty() => {
                let at = (next() % stable.len() as u64) as usize;
                let id = format!("v{written}");
                written += 1;
                let ext = stable[at].0.clone();
                store
                    .upsert(&records(&[(id.as_str(), Some(ext.as_str()), "v")], &[]))
                    .await
                    .unwrap();
                stable[at].1 = id;
            }
            5 => {
                store.merge().await.unwrap();
            }
            _ => tokio::time::sleep(std::time::Duration::from_millis(150)).await,
        }
        let from = clock_micros();
        let kept = store.count(None).await.unwrap();
        let fresh = Store::open_read_only(caps_config(&uri)).await.unwrap();
        let shared = fresh.count(None).await.unwrap();
        let scanned = store.count(Some("id IS NOT NULL")).await.unwrap();
        let until = clock_micros();
        if expiries
            .iter()
            .any(|&e| e >= from - 1_000 && e <= until + 1_000)
        {
            continue;
        }
        compared += 1;
        assert_eq!(kept, scanned, "step {step}: this handle's count");
        assert_eq!(shared, scanned, "step {step}: a new handle's count");
    }
    assert!(compared >= 24, "only {compared} steps compared");
}

/// Every row of a batch as text, sorted.
fn sorted_rows(b: &RecordBatch) -> Vec<String> {
    let mut rows: Vec<String> = (0..b.num_rows())
        .map(|i| {
            b.columns()
                .iter()
                .map(|c| arrow_cast::display::array_value_to_string(c, i).unwrap())
                .collect::<Vec<_>>()
                .join("|")
        })
        .collect();
    rows.sort();
    rows
}

/// The keyed reads of record writes (are these ids new, which record does
/// each secondary key name) read the unmerged generations from memory and
/// the base table through its index. Through a random history of adds (some
/// expired or retired), upserts, tombstones, Lance deletes, a key deleted
/// and re-added under another secondary key, and merges, they return the
/// same rows as a scan with the same `IN` filter and visibility.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keyed_reads_from_held_generations_agree_with_the_scan() {
    let (_dir, uri) = temp_uri();
    let store = store(&uri).await;
    // The writer holds what it wrote; this reader reads the generations.
    let reader = Store::open_read_only(caps_config(&uri)).await.unwrap();
    let mut rng: u64 = 0x2545_f491_4f6c_dd1d;
    let mut next = move || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    let clock = clock_micros();
    // Every (id, secondary key) written, whatever became of it.
    let mut written: Vec<(String, String)> = Vec::new();
    let visibilities = [
        Visibility::default(),
        Visibility {
            include_expired: true,
            include_retired: true,
            ..Visibility::default()
        },
        Visibility::all(),
    ];
    let mut compared_rows = 0;
    let mut merged_once = false;
    for step in 0..40 {
        let n = written.len();
        match next() % 8 {
            0..=2 => {
                let mut rows = Vec::new();
                let (mut expires, mut status) = (Vec::new(), Vec::new());
                for _ in 0..3 {
                    let k = written.len();
                    let (id, ext) = (format!("r{k}"), format!("e{k}"));
                    rows.push((id.clone(), ext.clone()));
                    written.push((id, ext));
                    expires.push(match next() % 3 {
                        0 => Some((clock - 1_000_000).to_string()),
                        1 => Some((clock + 3_600_000_000).to_string()),
                        _ => None,
                    });
                    status.push(if next() % 4 == 0 { "retired" } else { "active" });
                }
                let refs: Vec<(&str, Option<&str>, &str)> = rows
                    .iter()
                    .map(|(id, ext)| (id.as_str(), Some(ext.as_str()), "t"))
                    .collect();
                let expires: Vec<Option<&str>> = expires.iter().map(|e| e.as_deref()).collect();
                let status: Vec<Option<&str>> = status.into_iter().map(Some).collect();
                store
                    .add(&records(
                        &refs,
                        &[("expires_at", expires), ("lifecycle_status", status)],
                    ))
                    .await
                    .unwrap();
            }
            3 if n > 0 => {
                // Replace whatever record the secondary key names now, if any.
                let ext = written[(next() % n as u64) as usize].1.clone();
                let id = format!("u{step}");
                let outcome = store
                    .upsert(&records(&[(id.as_str(), Some(ext.as_str()), "u")], &[]))
                    .await;
                if outcome.is_ok() {
                    written.push((id, ext));
                }
            }
            4 if n > 0 => {
                let id = written[(next() % n as u64) as usize].0.clone();
                store.tombstone(&[id.as_str()]).await.unwrap();
            }
            5 if n > 0 => {
                let id = written[(next() % n as u64) as usize].0.clone();
                store.delete(&[id.as_str()]).await.unwrap();
            }
            6 if n > 0 => {
                // A key deleted and written again under a new secondary key:
                // its old row in an older generation or the base table must
                // not answer for the old secondary key.
                let id = written[(next() % n as u64) as usize].0.clone();
                store.delete(&[id.as_str()]).await.unwrap();
                let ext = format!("x{step}");
                let added = store
                    .add(&records(&[(id.as_str(), Some(ext.as_str()), "x")], &[]))
                    .await;
                if added.is_ok() {
                    written.push((id, ext));
                }
            }
            _ => {
                store.merge().await.unwrap();
                merged_once = true;
            }
        }
        if written.is_empty() {
            continue;
        }
        // A random sample of secondary keys and ids, some never written.
        let mut exts: Vec<String> = vec!["nothing".into()];
        let mut ids: Vec<String> = vec!["nobody".into()];
        for _ in 0..6 {
            let (id, ext) = &written[(next() % written.len() as u64) as usize];
            exts.push(ext.clone());
            ids.push(id.clone());
        }
        // Lookups by key (through the held generations while the unmerged
        // tier is small) show what a scan shows with every rule but
        // tombstones off, in the order asked.
        let id_refs: Vec<&str> = ids.iter().map(String::as_str).collect();
        let looked_up = store.get_many(&id_refs).await.unwrap();
        let quoted: Vec<String> = ids.iter().map(|v| format!("'{v}'")).collect();
        let lookup_rules = Visibility {
            include_expired: true,
            include_retired: true,
            ..Visibility::default()
        };
        let scanned = store
            .scan(
                ScanRequest::new()
                    .filter(format!("id IN ({})", quoted.join(", ")))
                    .visibility(lookup_rules),
            )
            .await
            .unwrap();
        assert_eq!(
            sorted_rows(&looked_up),
            sorted_rows(&scanned),
            "step {step}: get_many({ids:?})"
        );
        let found = ids_in_order(&scanned);
        let mut asked: Vec<String> = Vec::new();
        for id in &ids {
            if !asked.contains(id) && found.contains(id) {
                asked.push(id.clone());
            }
        }
        assert_eq!(ids_in_order(&looked_up), asked, "step {step}: lookup order");
        for (column, values) in [("external_id", &exts), ("id", &ids)] {
            let refs: Vec<&str> = values.iter().map(String::as_str).collect();
            let quoted: Vec<String> = values.iter().map(|v| format!("'{v}'")).collect();
            for v in visibilities {
                let held = store
                    .held_rows_matching(column, &refs, v)
                    .await
                    .unwrap()
                    .expect("the held path applies");
                let scanned = store
                    .scan(
                        ScanRequest::new()
                            .filter(format!("{column} IN ({})", quoted.join(", ")))
                            .visibility(v),
                    )
                    .await
                    .unwrap();
                assert_eq!(
                    sorted_rows(&held),
                    sorted_rows(&scanned),
                    "step {step}: {column} IN {values:?} under {v:?}"
                );
                let read = reader
                    .held_rows_matching(column, &refs, v)
                    .await
                    .unwrap()
                    .expect("the held path applies");
                assert_eq!(
                    sorted_rows(&read),
                    sorted_rows(&scanned),
                    "step {step}, reader: {column} IN {values:?} under {v:?}"
                );
                compared_rows += held.num_rows();
            }
        }
    }
    assert!(merged_once, "the history never merged");
    assert!(compared_rows > 100, "only {compared_rows} rows compared");
    let (_, _, loads) = reader.held_generations();
    assert!(loads > 0, "the reader never read a generation");
    let (indexed, _) = store.keyed_base_reads();
    assert!(indexed > 0, "no keyed read went through the index alone");
}

/// A keyed read on a view taken before a merge still reads the generations
/// that view lists, but does not hold again what a newer read saw merged
/// (before: a slow read, or a lookups' background load, put them back until
/// the next read).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_on_an_older_view_does_not_hold_merged_generations() {
    let (_dir, uri) = temp_uri();
    let store = store(&uri).await;
    for i in 0..3 {
        let (id, ext) = (format!("r{i}"), format!("e{i}"));
        store
            .add(&records(&[(id.as_str(), Some(ext.as_str()), "t")], &[]))
            .await
            .unwrap();
    }
    // Another handle: it holds nothing it did not read itself.
    let reader = Arc::new(Store::open_read_only(caps_config(&uri)).await.unwrap());
    let (paused_rx, go_tx) = crate::support::pause_next_read(&reader);
    let slow = {
        let reader = reader.clone();
        tokio::spawn(async move {
            reader
                .held_rows_matching("external_id", &["e1", "e2"], Visibility::default())
                .await
        })
    };
    paused_rx.await.unwrap();
    store.merge().await.unwrap();
    // A read on the newer view: nothing unmerged, nothing held.
    let now = reader
        .held_rows_matching("external_id", &["e1", "e2"], Visibility::default())
        .await
        .unwrap()
        .expect("the held path applies");
    assert_eq!(now.num_rows(), 2);
    assert_eq!(reader.held_generations().1, 0);
    go_tx.send(()).unwrap();
    let old = slow.await.unwrap().unwrap().expect("the held path applies");
    assert_eq!(sorted_rows(&old), sorted_rows(&now));
    let (bytes, held, loads) = reader.held_generations();
    assert!(loads >= 3, "the slow read did not read its generations");
    assert_eq!(
        (bytes, held),
        (0, 0),
        "the slow read held merged generations again"
    );
    store.close().await.unwrap();
}

/// The generations held for keyed reads are bounded and let go: dropped once
/// merged, all dropped when they would pass the limit — the reads then go
/// through the LSM scanner, with the same outcome.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn held_generations_are_bounded_and_dropped_once_merged() {
    let (_dir, uri) = temp_uri();
    let store = store(&uri).await;
    let add = |i: usize| {
        let (id, ext) = (format!("r{i}"), format!("e{i}"));
        records(&[(id.as_str(), Some(ext.as_str()), "t")], &[])
    };
    for i in 0..3 {
        store.add(&add(i)).await.unwrap();
    }
    let read = || store.held_rows_matching("external_id", &["e1", "e4"], Visibility::default());
    assert_eq!(read().await.unwrap().unwrap().num_rows(), 1);
    // The writing handle holds its adds' generations as it wrote them;
    // another handle reads them.
    let (bytes, held, loads) = store.held_generations();
    assert_eq!((held, loads), (3, 0), "the writer read back its own writes");
    assert!(bytes > 0);
    let reader = Store::open_read_only(caps_config(&uri)).await.unwrap();
    let from_disk = reader
        .held_rows_matching("external_id", &["e1", "e4"], Visibility::default())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        sorted_rows(&from_disk),
        sorted_rows(&read().await.unwrap().unwrap())
    );
    let (read_bytes, held, loads) = reader.held_generations();
    assert_eq!((held, loads), (3, 3));
    assert!(read_bytes > 0);
    // Held: a second read loads nothing.
    assert_eq!(read().await.unwrap().unwrap().num_rows(), 1);
    assert_eq!(store.held_generations().2, 0);
    store.merge().await.unwrap();
    assert_eq!(read().await.unwrap().unwrap().num_rows(), 1);
    assert_eq!(store.held_generations().1, 0, "merged generations held");

    for i in 3..6 {
        store.add(&add(i)).await.unwrap();
    }
    assert_eq!(read().await.unwrap().unwrap().num_rows(), 2);
    assert_eq!(store.held_generations().1, 3);
    // Just below what three such generations hold (their writers measured
    // less): loading passes the limit, nothing is held, the read falls back,
    // and an upsert through the fallback replaces the record.
    store.set_held_limit(bytes - 1);
    assert!(read().await.unwrap().is_none());
    let (_, held, loads) = store.held_generations();
    assert_eq!(held, 0);
    // The refusal is remembered while those generations are unmerged: the
    // next reads load nothing.
    assert!(read().await.unwrap().is_none());
    assert_eq!(
        store.held_generations().2,
        loads,
        "loaded again after a refusal"
    );
    let outcome = store
        .upsert(&records(&[("v4", Some("e4"), "v")], &[]))
        .await
        .unwrap();
    assert_eq!(outcome[0].replaced_id.as_deref(), Some("r4"));
    let shown = store
        .scan(ScanRequest::new().filter("external_id = 'e4'"))
        .await
        .unwrap();
    assert_eq!(ids(&shown), vec!["v4"]);
    assert!(
        store
            .add(&records(&[("w", Some("e5"), "t")], &[]))
            .await
            .is_err(),
        "a held secondary key is refused through the fallback too"
    );
    store.set_held_limit(usize::MAX);
    let found = read().await.unwrap().unwrap();
    assert_eq!(ids(&found), vec!["r1", "v4"]);
}

/// Upserts from several tasks while merges and their cleanup run beside
/// them and a second handle reads: the held generations are loaded, shared,
/// pruned and found removed under the writes. Every secondary key ends with
/// exactly one visible record, one an upsert acknowledged, and the held
/// reads agree with the scan.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upserts_racing_merges_and_cleanup_never_fork_a_record() {
    use std::collections::HashSet;
    use std::time::{Duration, Instant};
    let (_dir, uri) = temp_uri();
    let mut config = caps_config(&uri);
    config.merge.cleanup_grace = Duration::from_millis(50);
    let store = Arc::new(Store::create(config).await.unwrap());
    let deadline = Instant::now() + Duration::from_secs(6);
    let mut tasks = tokio::task::JoinSet::new();
    for t in 0..3u64 {
        let store = store.clone();
        tasks.spawn(async move {
            let mut rng = 0x9e37_79b9_7f4a_7c15u64 ^ (t + 1);
            let mut acked: Vec<(String, String)> = Vec::new();
            let mut n = 0;
            while Instant::now() < deadline {
                rng ^= rng << 13;
                rng ^= rng >> 7;
                rng ^= rng << 17;
                let ext = format!("e{}", rng % 40);
                let id = format!("t{t}-{n}");
                n += 1;
                let outcome = store
                    .upsert(&records(&[(id.as_str(), Some(ext.as_str()), "u")], &[]))
                    .await;
                match outcome {
                    Ok(_) => acked.push((ext, id)),
                    Err(e) => panic!("upsert {id} of {ext}: {e}"),
                }
            }
            acked
        });
    }
    {
        let store = store.clone();
        tasks.spawn(async move {
            while Instant::now() < deadline {
                match store.merge().await {
                    Ok(_) => {}
                    Err(e) if matches!(e.kind(), ErrorKind::Conflict | ErrorKind::Busy) => {}
                    Err(e) => panic!("merge: {e}"),
                }
                tokio::time::sleep(Duration::from_millis(60)).await;
            }
            Vec::new()
        });
    }
    {
        let uri = uri.clone();
        tasks.spawn(async move {
            let reader = Store::open_read_only(caps_config(&uri)).await.unwrap();
            while Instant::now() < deadline {
                reader
                    .scan(ScanRequest::new().filter("external_id >= 'e'"))
                    .await
                    .unwrap_or_else(|e| panic!("reader: {e}"));
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Vec::new()
        });
    }
    let mut acked: Vec<(String, String)> = Vec::new();
    while let Some(done) = tasks.join_next().await {
        acked.extend(done.unwrap());
    }
    assert!(acked.len() > 10, "only {} upserts", acked.len());
    let exts: HashSet<&str> = acked.iter().map(|(e, _)| e.as_str()).collect();
    let acked_ids: HashSet<&str> = acked.iter().map(|(_, i)| i.as_str()).collect();
    let shown = store.scan(ScanRequest::new()).await.unwrap();
    let shown_exts = shown
        .column_by_name("external_id")
        .unwrap()
        .as_string::<i32>()
        .clone();
    let shown_ids = ids_in_order(&shown);
    let mut seen = HashSet::new();
    for (i, id) in shown_ids.iter().enumerate() {
        let ext = shown_exts.value(i);
        assert!(seen.insert(ext.to_string()), "{ext} shows twice");
        assert!(
            acked_ids.contains(id.as_str()),
            "{id} was never acknowledged"
        );
    }
    assert_eq!(seen.len(), exts.len(), "a secondary key lost its record");
    assert_eq!(store.count(None).await.unwrap() as usize, exts.len());
    let values: Vec<&str> = exts.iter().copied().collect();
    let held = store
        .held_rows_matching("external_id", &values, Visibility::default())
        .await
        .unwrap()
        .expect("the held path applies");
    assert_eq!(ids(&held), ids(&shown));
}

/// A lookup reads the held generations, and loads one it does not hold
/// itself only when that is small: a large generation another handle wrote
/// is looked up through Lance's planner (its key index), and from the
/// handle's second such lookup on it is loaded in the background for the
/// lookups after. The writing handle holds what it wrote, and reads none of
/// it back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lookup_loads_a_large_generation_it_does_not_hold_only_in_the_background() {
    let (_dir, uri) = temp_uri();
    let store = store(&uri).await;
    let reader = Store::open_read_only(caps_config(&uri)).await.unwrap();
    store
        .add(&records(&[("a", Some("ea"), "small")], &[]))
        .await
        .unwrap();
    assert!(reader.get("a").await.unwrap().is_some());
    let (_, held, loads) = reader.held_generations();
    assert_eq!((held, loads), (1, 1), "a small generation is held");
    // Over a megabyte in one generation.
    let text = "x".repeat(1000);
    let keys: Vec<(String, String)> = (0..1500)
        .map(|i| (format!("big-{i}"), format!("ebig-{i}")))
        .collect();
    let rows: Vec<(&str, Option<&str>, &str)> = keys
        .iter()
        .map(|(id, ext)| (id.as_str(), Some(ext.as_str()), text.as_str()))
        .collect();
    store.add(&records(&rows, &[])).await.unwrap();
    for id in ["a", "big-7", "big-1499"] {
        let found = reader.get(id).await.unwrap().expect(id);
        assert_eq!(ids(&found), vec![id]);
    }
    assert!(reader.get("big-1500").await.unwrap().is_none());
    let started = std::time::Instant::now();
    while reader.warming_generations() || reader.held_generations().1 < 2 {
        assert!(
            started.elapsed() < std::time::Duration::from_secs(60),
            "the large generation was not loaded in the background: {:?}",
            reader.held_generations()
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    assert_eq!(reader.held_generations().1, 2);
    let (indexed, planned) = reader.keyed_base_reads();
    // Now held: a lookup reads both held generations and the base table.
    let found = reader.get("big-1499").await.unwrap().expect("big-1499");
    assert_eq!(ids(&found), vec!["big-1499"]);
    let (i, p) = reader.keyed_base_reads();
    assert_eq!(
        i + p,
        indexed + planned + 1,
        "not read from the held generations"
    );
    assert_eq!(reader.held_generations().1, 2);
    // The writer looks up from what it wrote, the upsert's own write too.
    store
        .upsert(&records(&[("v", Some("ebig-7"), "v")], &[]))
        .await
        .unwrap();
    let found = store.get("big-7").await.unwrap().unwrap();
    let superseded_by = found
        .column_by_name("superseded_by_id")
        .unwrap()
        .as_string::<i32>()
        .value(0)
        .to_string();
    assert_eq!(superseded_by, "v");
    // The small one, the large one, and the upsert's own: none read back.
    let (_, held, loads) = store.held_generations();
    assert_eq!((held, loads), (3, 0));
}

/// Keyed reads (lookups, the checks of record writes) read the base table
/// through its key indexes alone, without a query plan, where the indexes
/// cover every fragment: rows a merge rewrote or deleted are left out by the
/// fragments' deletion files, not by the index. A fragment no index covers
/// (written outside the engine here; a merge's rows before its index
/// refresh) sends the read through Lance's planner, which scans it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keyed_reads_use_the_index_alone_where_it_covers_the_table() {
    let (_dir, uri) = temp_uri();
    let store = store(&uri).await;
    let rows: Vec<(String, String)> = (0..10)
        .map(|i| (format!("r{i}"), format!("e{i}")))
        .collect();
    add_merged(&store, &rows).await;
    // r3 superseded by u3 (r3 rewritten with its back-link: the old copy is
    // deleted from the base by the merge), r5 deleted (tombstone, merged).
    store
        .upsert(&records(&[("u3", Some("e3"), "new")], &[]))
        .await
        .unwrap();
    store.tombstone(&["r5"]).await.unwrap();
    store.merge().await.unwrap();
    store.delete(&["r7"]).await.unwrap();
    store.merge().await.unwrap();

    // The reads of the rows above, by key and by secondary key.
    async fn read_back(store: &Store, extra: &[&str]) -> RecordBatch {
        let mut asked = vec!["r3", "r5", "u3", "r1", "r7", "nobody"];
        asked.extend_from_slice(extra);
        let found = store.get_many(&asked).await.unwrap();
        let current = store
            .held_rows_matching(
                "external_id",
                &["e3", "e5", "e7", "e9"],
                Visibility::default(),
            )
            .await
            .unwrap()
            .unwrap();
        assert_eq!(ids(&current), ["r9", "u3"]);
        found
    }

    let before = store.keyed_base_reads();
    let found = read_back(&store, &[]).await;
    assert_eq!(ids_in_order(&found), ["r3", "u3", "r1"]);
    let superseded_by = found
        .column_by_name("superseded_by_id")
        .unwrap()
        .as_string::<i32>();
    assert_eq!(superseded_by.value(0), "u3", "the rewritten copy of r3");
    let every = store
        .held_rows_matching("external_id", &["e3"], Visibility::all())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(ids(&every), ["r3", "u3"], "one copy of r3");
    let after = store.keyed_base_reads();
    assert_eq!(
        after.1, before.1,
        "a keyed read was planned: {before:?} -> {after:?}"
    );
    assert!(after.0 >= before.0 + 3, "{before:?} -> {after:?}");
    // A unique-key check through the index: e3 and r9 are held.
    let refused = store
        .add(&records(&[("fresh", Some("e9"), "t")], &[]))
        .await
        .unwrap_err();
    assert!(
        matches!(refused.kind(), ErrorKind::AlreadyExists),
        "{refused}"
    );

    // A fragment the indexes do not cover: appended to the base table
    // directly. The read is planned and finds its row.
    let dataset = lance::Dataset::open(&uri).await.unwrap();
    let stored: arrow_schema::Schema = dataset.schema().into();
    let logical = records(&[("outside", Some("e-out"), "t")], &[]);
    let columns: Vec<ArrayRef> = stored
        .fields()
        .iter()
        .map(|f| logical.column_by_name(f.name()).unwrap().clone())
        .collect();
    let batch = RecordBatch::try_new(Arc::new(stored.clone()), columns).unwrap();
    let params = lance::dataset::WriteParams {
        mode: lance::dataset::WriteMode::Append,
        ..Default::default()
    };
    lance::Dataset::write(
        arrow_array::RecordBatchIterator::new([Ok(batch)], Arc::new(stored)),
        uri.as_str(),
        Some(params),
    )
    .await
    .unwrap();
    let before = store.keyed_base_reads();
    let found = store.get_many(&["outside", "r1"]).await.unwrap();
    assert_eq!(ids_in_order(&found), ["outside", "r1"]);
    let held = store
        .held_rows_matching("external_id", &["e-out"], Visibility::default())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(ids(&held), ["outside"]);
    let after = store.keyed_base_reads();
    assert!(after.1 >= before.1 + 2, "{before:?} -> {after:?}");

    // A compaction rewrites the fragments and folds the indexes over them:
    // reads go through the index alone again and see the same rows.
    store.compact().await.unwrap();
    let before = store.keyed_base_reads();
    let found = read_back(&store, &["outside"]).await;
    assert_eq!(ids_in_order(&found), ["r3", "u3", "r1", "outside"]);
    let after = store.keyed_base_reads();
    assert_eq!(
        after.1, before.1,
        "planned after a compaction: {before:?} -> {after:?}"
    );
}

// The index-only keyed read against a brute-force oracle: compactions,
// rewrites in place, odd values, changes made outside the engine.
mod indexed;

/// The fragment-reuse history a compaction leaves (Lance compacts with the
/// index remap deferred: the MemWAL index cannot be remapped inline) once
/// the indexes are remapped. Before, it was never trimmed: every new
/// handle rebuilt a row-address map of every row each compaction had moved
/// (5 ms per `count()` on a new handle at 1M rows, 22x the plain store's),
/// and each compaction added another.
async fn fragment_reuse_versions(uri: &str) -> usize {
    let dataset = lance::Dataset::open(uri).await.unwrap();
    dataset
        .frag_reuse_index()
        .await
        .unwrap()
        .map_or(0, |fri| fri.details.versions.len())
}

/// A compaction remaps the indexes (the key's, the secondary key's) to the
/// rows' new places and trims the fragment-reuse history: none is left
/// after each of three compactions, and the keyed reads stay right (every
/// record found by key, a taken secondary key refused, an upsert finds the
/// record it replaces, a deleted record stays deleted).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_compaction_leaves_no_fragment_reuse_history() {
    let (_dir, uri) = temp_uri();
    let store = store(&uri).await;
    let mut live: Vec<String> = Vec::new();
    for cycle in 0..3 {
        for round in 0..3 {
            let rows: Vec<(String, String)> = (0..4)
                .map(|i| {
                    (
                        format!("r{cycle}-{round}-{i}"),
                        format!("e{cycle}-{round}-{i}"),
                    )
                })
                .collect();
            add_merged(&store, &rows).await;
            live.extend(rows.into_iter().map(|(id, _)| id));
        }
        // A delete and a new version: rows the compaction drops or moves.
        let gone = format!("r{cycle}-0-0");
        store.delete(&[gone.as_str()]).await.unwrap();
        live.retain(|id| *id != gone);
        let (new, ext) = (format!("v{cycle}"), format!("e{cycle}-1-1"));
        let outcome = store
            .upsert(&records(&[(new.as_str(), Some(ext.as_str()), "t2")], &[]))
            .await
            .unwrap();
        assert_eq!(
            outcome[0].replaced_id.as_deref(),
            Some(format!("r{cycle}-1-1").as_str())
        );
        live.retain(|id| *id != format!("r{cycle}-1-1"));
        live.push(new);
        store.merge().await.unwrap();

        let stats = store.compact().await.unwrap();
        assert!(stats.fragments_removed > 1, "cycle {cycle}: {stats:?}");
        // The key's index and the secondary key's, both over moved rows.
        assert_eq!(stats.indexes_remapped, 2, "cycle {cycle}: {stats:?}");
        assert_eq!(stats.fragment_reuse_versions, 0, "cycle {cycle}: {stats:?}");
        assert_eq!(
            fragment_reuse_versions(&uri).await,
            0,
            "cycle {cycle}: the fragment-reuse history is trimmed"
        );
        // Nothing left to move: nothing remapped.
        let again = store.compact().await.unwrap();
        assert_eq!(
            (again.fragments_removed, again.indexes_remapped),
            (0, 0),
            "cycle {cycle}: {again:?}"
        );
        let fresh = Store::open_read_only(caps_config(&uri)).await.unwrap();
        for reader in [&store, &fresh] {
            let refs: Vec<&str> = live.iter().map(String::as_str).collect();
            let found = reader.get_many(&refs).await.unwrap();
            assert_eq!(found.num_rows(), live.len(), "cycle {cycle}");
            assert_eq!(reader.count(None).await.unwrap(), live.len() as u64);
            assert!(reader.get(&gone).await.unwrap().is_none(), "cycle {cycle}");
        }
        let taken = store
            .add(&records(&[("fresh", Some("e0-2-2"), "t")], &[]))
            .await
            .unwrap_err();
        assert_eq!(taken.kind(), ErrorKind::AlreadyExists, "{taken}");
    }
}

/// A one-row patch setting one Utf8 column.
fn utf8_patch(column: &str, value: &str) -> RecordBatch {
    RecordBatch::try_new(
        Arc::new(Schema::new(vec![Field::new(column, DataType::Utf8, true)])),
        vec![Arc::new(StringArray::from(vec![Some(value)]))],
    )
    .unwrap()
}

/// `superseded_by_id` (supersession) and the `lifecycle_status` "deleted"
/// (lifecycle) are the engine's to write: a caller's add, upsert or patch
/// giving them is refused with the row and column, and writes nothing;
/// the engine's own writes (a back-link, a tombstone) still happen. Before,
/// an add stored both, hiding the record without deleting it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn engine_managed_values_are_refused_on_every_write_path() {
    let (_dir, uri) = temp_uri();
    let store = store(&uri).await;
    let managed = |err: &Error, column: &str, row: usize, reserved: Option<&str>| {
        assert_eq!(err.kind(), ErrorKind::InvalidInput, "{err}");
        assert_eq!(
            problem(err),
            &BatchProblem::EngineManaged {
                column: column.into(),
                row,
                reserved: reserved.map(str::to_string),
            },
            "{err}"
        );
    };
    let three = [
        ("a", Some("ea"), ""),
        ("b", Some("eb"), ""),
        ("c", None, ""),
    ];
    let err = store
        .add(&records(
            &three,
            &[("superseded_by_id", vec![None, Some("x"), None])],
        ))
        .await
        .unwrap_err();
    managed(&err, "superseded_by_id", 1, None);
    let err = store
        .add(&records(
            &three,
            &[(
                "lifecycle_status",
                vec![Some("active"), Some("retired"), Some("deleted")],
            )],
        ))
        .await
        .unwrap_err();
    managed(&err, "lifecycle_status", 2, Some("deleted"));
    let err = store
        .upsert(&records(
            &[("u", Some("eu"), "")],
            &[("superseded_by_id", vec![Some("x")])],
        ))
        .await
        .unwrap_err();
    managed(&err, "superseded_by_id", 0, None);
    let err = store
        .upsert(&records(
            &[("u", Some("eu"), "")],
            &[("lifecycle_status", vec![Some("deleted")])],
        ))
        .await
        .unwrap_err();
    managed(&err, "lifecycle_status", 0, Some("deleted"));
    assert_eq!(
        visible(&store, Visibility::all()).await,
        Vec::<String>::new()
    );

    // Other statuses are the caller's: a retired record is hidden.
    store
        .add(&records(
            &three,
            &[(
                "lifecycle_status",
                vec![Some("active"), Some("active"), Some("retired")],
            )],
        ))
        .await
        .unwrap();
    let err = store
        .patch(
            &PatchTarget::Id("a".into()),
            &utf8_patch("lifecycle_status", "deleted"),
        )
        .await
        .unwrap_err();
    managed(&err, "lifecycle_status", 0, Some("deleted"));
    let err = store
        .patch(
            &PatchTarget::Id("a".into()),
            &utf8_patch("superseded_by_id", "x"),
        )
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidInput, "{err}");
    assert_eq!(visible(&store, Visibility::default()).await, ["a", "b"]);

    // The engine's own writes: a back-link, a new version, a tombstone.
    store
        .add(&records(
            &[("a2", None, "")],
            &[("supersedes_id", vec![Some("a")])],
        ))
        .await
        .unwrap();
    let a = store.get("a").await.unwrap().unwrap();
    assert_eq!(
        a.column_by_name("superseded_by_id")
            .unwrap()
            .as_string::<i32>()
            .value(0),
        "a2"
    );
    let v = store
        .patch(&PatchTarget::Id("b".into()), &text_patch("b2"))
        .await
        .unwrap()
        .expect("b is visible");
    assert_eq!(store.tombstone(&[v.id.as_str()]).await.unwrap(), [true]);
    assert_eq!(visible(&store, Visibility::default()).await, ["a2"]);
    store.close().await.unwrap();
}

/// A store with the lifecycle capability alone writes adds without the
/// record lock (no read is needed): the reserved status is refused there too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lifecycle_only_store_refuses_the_reserved_status() {
    let (_dir, uri) = temp_uri();
    let store = Store::create(caps_config(&uri).with_capabilities(RecordCapabilities {
        lifecycle: true,
        ..RecordCapabilities::default()
    }))
    .await
    .unwrap();
    let err = store
        .add(&records(
            &[("a", None, ""), ("b", None, "")],
            &[("lifecycle_status", vec![Some("retired"), Some("deleted")])],
        ))
        .await
        .unwrap_err();
    assert!(
        matches!(problem(&err), BatchProblem::EngineManaged { column, row: 1, .. } if column == "lifecycle_status"),
        "{err}"
    );
    // Without supersession, superseded_by_id is an ordinary column.
    store
        .add(&records(
            &[("a", None, "")],
            &[("superseded_by_id", vec![Some("x")])],
        ))
        .await
        .unwrap();
    store.close().await.unwrap();
}

/// Keys and secondary keys hold at most `MAX_KEY_BYTES` bytes of UTF-8 on
/// every write path (add, upsert, delete by either key); before, a 10 MB id
/// was stored.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_and_secondary_keys_longer_than_the_limit_are_refused() {
    use lance_context_store::MAX_KEY_BYTES;
    let (_dir, uri) = temp_uri();
    let store = store(&uri).await;
    // Counted in bytes: 513 two-byte characters are 1,026 bytes.
    let long = "é".repeat(MAX_KEY_BYTES / 2 + 1);
    let longest = "k".repeat(MAX_KEY_BYTES);
    let too_long = |err: &Error, column: &str, row: usize, bytes: usize| {
        assert_eq!(err.kind(), ErrorKind::InvalidInput, "{err}");
        assert_eq!(
            problem(err),
            &BatchProblem::KeyTooLong {
                column: column.into(),
                row,
                bytes,
                max: MAX_KEY_BYTES,
            },
            "{err}"
        );
    };
    let err = store
        .add(&records(&[("a", None, ""), (long.as_str(), None, "")], &[]))
        .await
        .unwrap_err();
    too_long(&err, "id", 1, long.len());
    let err = store
        .add(&records(&[("a", Some(long.as_str()), "")], &[]))
        .await
        .unwrap_err();
    too_long(&err, "external_id", 0, long.len());
    let err = store
        .upsert(&records(
            &[("u", Some("eu"), ""), ("v", Some(long.as_str()), "")],
            &[],
        ))
        .await
        .unwrap_err();
    too_long(&err, "external_id", 1, long.len());
    let err = store.tombstone(&["a", long.as_str()]).await.unwrap_err();
    too_long(&err, "id", 1, long.len());
    let err = store
        .tombstone_by_secondary_key(&[long.as_str()])
        .await
        .unwrap_err();
    too_long(&err, "external_id", 0, long.len());
    assert_eq!(
        visible(&store, Visibility::all()).await,
        Vec::<String>::new()
    );
    // The limit itself is accepted.
    store
        .add(&records(
            &[(longest.as_str(), Some(longest.as_str()), "")],
            &[],
        ))
        .await
        .unwrap();
    assert!(store.get(&longest).await.unwrap().is_some());
    store.close().await.unwrap();
}

/// Item 4 of the takeover review: T1's upsert checked (secondary key `s` →
/// r1) and is about to write; another handle of the same instance claims
/// the shard and supersedes r1 itself; T2 meets the fence and reclaims. T1
/// must not then write under the new claim what it checked under the old
/// one (r1 superseded twice: two current versions of `s`). The reclaim
/// waits for the record write in flight, which fails on the fenced writer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_record_write_whose_checks_a_reclaim_overtook_is_refused() {
    let (_dir, uri) = temp_uri();
    let first = std::sync::Arc::new(store(&uri).await);
    first
        .add(&records(&[("r1", Some("s"), "one")], &[]))
        .await
        .unwrap();
    let (hook, paused_rx, go_tx) = crate::support::pause();
    first.pause_next_record_write(hook);
    let t1 = {
        let store = first.clone();
        tokio::spawn(async move {
            store
                .upsert(&records(&[("r2", Some("s"), "two")], &[]))
                .await
        })
    };
    paused_rx.await.unwrap();

    // The same instance elsewhere (a CLI upsert) claims the shard.
    let cli = Store::open(caps_config(&uri)).await.unwrap();
    cli.upsert(&records(&[("r3", Some("s"), "three")], &[]))
        .await
        .unwrap();
    cli.close().await.unwrap();

    // T2 (which met the fence; its own write waits for T1's record lock
    // here) reclaims while T1 is still paused.
    let reclaim = {
        let store = first.clone();
        tokio::spawn(async move { store.reclaim().await })
    };
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    go_tx.send(()).unwrap();
    let t1 = t1.await.unwrap();
    reclaim.await.unwrap().unwrap();
    assert!(
        t1.as_ref().is_err_and(|e| e.is_fenced()),
        "T1 wrote under the new claim: {t1:?}"
    );
    let current = visible(&first, Visibility::default()).await;
    assert_eq!(current, ["r3"], "current versions of s: {current:?}");
    // After the reclaim, record writes go on.
    first
        .upsert(&records(&[("r4", Some("s"), "four")], &[]))
        .await
        .unwrap();
    assert_eq!(visible(&first, Visibility::default()).await, ["r4"]);
}
