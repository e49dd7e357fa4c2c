//! The add path: durable and visible on return, newest wins, group commit, and
//! bad input rejected with a typed error and nothing written.

use std::sync::Arc;

use arrow_array::{Int32Array, Int64Array, RecordBatch, StringArray};
use arrow_schema::{DataType, Field, Schema};
use lance_context_store::{BatchProblem, Error, ErrorKind, ScanRequest, Store, StoreConfig};

use crate::support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn add_is_visible_to_a_fresh_open_after_drop_without_close() {
    let (_dir, uri) = temp_uri();
    let store = create(&uri).await;
    store.add(&batch(&rows("a", "g1", 10))).await.unwrap();
    store.add(&batch(&rows("b", "g2", 5))).await.unwrap();
    drop(store); // no close

    let reader = Store::open_read_only(StoreConfig::new(&uri)).await.unwrap();
    assert_eq!(reader.count(None).await.unwrap(), 15);
    let got = reader.get("b-00003").await.unwrap().expect("row b-00003");
    assert_eq!(decode(&got), vec![Row::new("b-00003", "g2", 3)]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn re_added_id_newest_wins() {
    let (_dir, uri) = temp_uri();
    let store = create(&uri).await;
    store.add(&batch(&[Row::new("x", "old", 1)])).await.unwrap();
    let mut newer = Row::new("x", "new", 2);
    newer.note = Some("second".into());
    store.add(&batch(&[newer.clone()])).await.unwrap();

    assert_eq!(store.count(None).await.unwrap(), 1);
    assert_eq!(
        decode(&store.get("x").await.unwrap().unwrap()),
        vec![newer.clone()]
    );
    // Filters see only the newest version of a key.
    assert_eq!(store.count(Some("grp = 'old'")).await.unwrap(), 0);
    assert_eq!(store.count(Some("grp = 'new'")).await.unwrap(), 1);

    // Within one batch, the later row wins.
    store
        .add(&batch(&[
            Row::new("y", "first", 1),
            Row::new("y", "second", 2),
        ]))
        .await
        .unwrap();
    let y = decode(&store.get("y").await.unwrap().unwrap());
    assert_eq!(y[0].grp, "second");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn columns_are_matched_by_name_and_absent_nullable_ones_filled() {
    let (_dir, uri) = temp_uri();
    let store = create(&uri).await;
    // Reordered columns, `score` and `note` absent.
    let partial = RecordBatch::try_new(
        Arc::new(Schema::new(vec![
            Field::new("n", DataType::Int64, false),
            Field::new("grp", DataType::Utf8, false),
            Field::new("id", DataType::Utf8, false),
        ])),
        vec![
            Arc::new(Int64Array::from(vec![7])),
            Arc::new(StringArray::from(vec!["g"])),
            Arc::new(StringArray::from(vec!["k"])),
        ],
    )
    .unwrap();
    store.add(&partial).await.unwrap();
    let row = decode(&store.get("k").await.unwrap().unwrap());
    assert_eq!(
        row,
        vec![Row {
            id: "k".into(),
            grp: "g".into(),
            n: 7,
            score: None,
            note: None
        }]
    );
}

fn assert_rejected(err: Error, expected: BatchProblem) {
    assert_eq!(err.kind(), ErrorKind::InvalidInput, "{err}");
    assert_eq!(err.batch_problem(), Some(&expected), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_is_rejected_typed_and_writes_nothing() {
    let (_dir, uri) = temp_uri();
    let store = create(&uri).await;
    store.add(&batch(&rows("keep", "g", 3))).await.unwrap();
    let gens = generations(&store).await;

    // Unknown column.
    let mut fields = schema().fields().to_vec();
    fields.push(Arc::new(Field::new("surprise", DataType::Utf8, true)));
    let good = batch(&rows("bad", "g", 2));
    let mut cols = good.columns().to_vec();
    cols.push(Arc::new(StringArray::from(vec!["a", "b"])));
    let unknown = RecordBatch::try_new(Arc::new(Schema::new(fields)), cols).unwrap();
    assert_rejected(
        store.add(&unknown).await.unwrap_err(),
        BatchProblem::UnknownColumn {
            column: "surprise".into(),
        },
    );

    // Wrong type: n as Int32.
    let wrong = RecordBatch::try_new(
        Arc::new(Schema::new(vec![
            Field::new("id", DataType::Utf8, false),
            Field::new("grp", DataType::Utf8, false),
            Field::new("n", DataType::Int32, false),
        ])),
        vec![
            Arc::new(StringArray::from(vec!["bad-1"])),
            Arc::new(StringArray::from(vec!["g"])),
            Arc::new(Int32Array::from(vec![1])),
        ],
    )
    .unwrap();
    assert_rejected(
        store.add(&wrong).await.unwrap_err(),
        BatchProblem::TypeMismatch {
            column: "n".into(),
            expected: "Int64".into(),
            found: "Int32".into(),
        },
    );

    // Null key at row 1 (the schema says non-null; the batch's own field is nullable).
    let null_key = RecordBatch::try_new(
        Arc::new(Schema::new(vec![
            Field::new("id", DataType::Utf8, true),
            Field::new("grp", DataType::Utf8, false),
            Field::new("n", DataType::Int64, false),
        ])),
        vec![
            Arc::new(StringArray::from(vec![Some("bad-2"), None])),
            Arc::new(StringArray::from(vec!["g", "g"])),
            Arc::new(Int64Array::from(vec![1, 2])),
        ],
    )
    .unwrap();
    assert_rejected(
        store.add(&null_key).await.unwrap_err(),
        BatchProblem::NullKey {
            column: "id".into(),
            row: 1,
        },
    );

    // Null in a non-nullable, non-key column at row 2.
    let null_value = RecordBatch::try_new(
        Arc::new(Schema::new(vec![
            Field::new("id", DataType::Utf8, false),
            Field::new("grp", DataType::Utf8, true),
            Field::new("n", DataType::Int64, false),
        ])),
        vec![
            Arc::new(StringArray::from(vec!["bad-3", "bad-4", "bad-5"])),
            Arc::new(StringArray::from(vec![Some("g"), Some("g"), None])),
            Arc::new(Int64Array::from(vec![1, 2, 3])),
        ],
    )
    .unwrap();
    assert_rejected(
        store.add(&null_value).await.unwrap_err(),
        BatchProblem::NullValue {
            column: "grp".into(),
            row: 2,
        },
    );

    // Missing required column.
    let missing = RecordBatch::try_new(
        Arc::new(Schema::new(vec![Field::new("id", DataType::Utf8, false)])),
        vec![Arc::new(StringArray::from(vec!["bad-6"]))],
    )
    .unwrap();
    assert_rejected(
        store.add(&missing).await.unwrap_err(),
        BatchProblem::MissingColumn {
            column: "grp".into(),
        },
    );

    // Empty key.
    assert_rejected(
        store
            .add(&batch(&[Row::new("", "g", 1)]))
            .await
            .unwrap_err(),
        BatchProblem::EmptyKey {
            column: "id".into(),
            row: 0,
        },
    );

    // Empty batch.
    assert_rejected(
        store.add(&batch(&[])).await.unwrap_err(),
        BatchProblem::EmptyBatch,
    );

    // A key longer than the limit, in an add or a delete (a plain store's
    // delete writes the keys it is given).
    let long = "k".repeat(lance_context_store::MAX_KEY_BYTES + 1);
    assert_rejected(
        store
            .add(&batch(&[
                Row::new("bad-1", "g", 1),
                Row::new(&long, "g", 2),
            ]))
            .await
            .unwrap_err(),
        BatchProblem::KeyTooLong {
            column: "id".into(),
            row: 1,
            bytes: long.len(),
            max: lance_context_store::MAX_KEY_BYTES,
        },
    );
    assert_rejected(
        store.delete(&["bad-1", &long]).await.unwrap_err(),
        BatchProblem::KeyTooLong {
            column: "id".into(),
            row: 1,
            bytes: long.len(),
            max: lance_context_store::MAX_KEY_BYTES,
        },
    );

    // Nothing of the rejected batches was written; the good rows are intact.
    assert_eq!(store.count(None).await.unwrap(), 3);
    assert_eq!(store.count(Some("id LIKE 'bad%'")).await.unwrap(), 0);
    assert_eq!(generations(&store).await, gens, "no generation was written");
    drop(store);
    let reopened = Store::open(config(&uri)).await.unwrap();
    assert_eq!(reopened.count(None).await.unwrap(), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_adds_share_generations() {
    let (_dir, uri) = temp_uri();
    let store = Arc::new(create(&uri).await);
    let adds = 16;
    let mut tasks = tokio::task::JoinSet::new();
    for t in 0..adds {
        let store = store.clone();
        tasks.spawn(async move {
            store
                .add(&batch(&rows(&format!("t{t:02}"), "g", 20)))
                .await
                .unwrap()
        });
    }
    while let Some(done) = tasks.join_next().await {
        assert_eq!(done.unwrap().rows, 20);
    }
    assert_eq!(store.count(None).await.unwrap(), (adds * 20) as u64);
    let made = generations(&store).await;
    assert!(
        made >= 1 && made < adds,
        "{adds} concurrent adds made {made} generations; group commit should share freezes"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_large_add_is_split_under_the_memtable_row_cap() {
    let (_dir, uri) = temp_uri();
    let settings = lance_context_store::WriterSettings {
        max_memtable_rows: 1_000,
        ..Default::default()
    };
    let store = Store::create(config(&uri).with_writer(settings))
        .await
        .unwrap();
    store.add(&batch(&rows("big", "g", 3_500))).await.unwrap();
    assert_eq!(store.count(None).await.unwrap(), 3_500);
    let last = store.get("big-03499").await.unwrap().unwrap();
    assert_eq!(decode(&last)[0].n, 3_499);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn create_open_and_config_errors_are_typed() {
    let (_dir, uri) = temp_uri();
    let err = Store::open(config(&uri)).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NotFound, "{err}");

    let store = create(&uri).await;
    store.close().await.unwrap();
    let err = Store::create(config(&uri)).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::AlreadyExists, "{err}");

    // open_or_create opens the existing one.
    let again = Store::open_or_create(config(&uri)).await.unwrap();
    again.close().await.unwrap();
    // After close, adds are refused with a typed error.
    let err = again.add(&batch(&rows("z", "g", 1))).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Unavailable, "{err}");

    // A nullable key is refused at create.
    let (_dir2, uri2) = temp_uri();
    let bad = Arc::new(Schema::new(vec![Field::new("id", DataType::Utf8, true)]));
    let err = Store::create(StoreConfig::new(&uri2).with_schema(bad))
        .await
        .unwrap_err();
    assert!(matches!(err, Error::InvalidArgument { .. }), "{err}");

    // A read-only store refuses adds.
    let reader = Store::open_read_only(StoreConfig::new(&uri)).await.unwrap();
    let err = reader.add(&batch(&rows("z", "g", 1))).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Unavailable, "{err}");
    assert_eq!(reader.scan(ScanRequest::new()).await.unwrap().num_rows(), 0);
}
