//! The index-only keyed read of the base table (`read/indexed.rs`): every
//! keyed read here is compared with a brute-force oracle — a full,
//! unfiltered scan of the base Lance dataset filtered in the test — and, where
//! useful, with the planned `scan` with a filter. Several tests change the
//! dataset with Lance directly, as another process or tool could.

use super::*;
use arrow_array::RecordBatchIterator;
use lance::dataset::{MergeInsertBuilder, MergeInsertWriteMode, WhenMatched, WhenNotMatched};
use lance::index::DatasetIndexExt;

/// A row as `id|external_id|text`.
fn render_row(b: &RecordBatch, i: usize) -> String {
    let get = |c: &str| -> String {
        let a = b.column_by_name(c).unwrap().as_string::<i32>();
        if a.is_null(i) {
            "<null>".to_string()
        } else {
            a.value(i).to_string()
        }
    };
    format!("{}|{}|{}", get("id"), get("external_id"), get("text"))
}

fn render(b: &RecordBatch) -> Vec<String> {
    let mut v: Vec<String> = (0..b.num_rows()).map(|i| render_row(b, i)).collect();
    v.sort();
    v
}

/// The oracle: every row of the base table whose `column` is in `values`,
/// from a full scan without a filter (no index involved).
async fn brute(uri: &str, column: &str, values: &[&str]) -> Vec<String> {
    let batches = crate::support::base_table(uri, &["id", "external_id", "text"]).await;
    let mut out = vec![];
    for b in &batches {
        let col = b.column_by_name(column).unwrap().as_string::<i32>();
        for i in 0..b.num_rows() {
            if !col.is_null(i) && values.contains(&col.value(i)) {
                out.push(render_row(b, i));
            }
        }
    }
    out.sort();
    out
}

/// The planned scan with a filter (the other oracle).
async fn planned(store: &Store, column: &str, values: &[&str]) -> Vec<String> {
    let quoted: Vec<String> = values
        .iter()
        .map(|v| format!("'{}'", v.replace('\'', "''")))
        .collect();
    render(
        &store
            .scan(
                ScanRequest::new()
                    .filter(format!("{column} IN ({})", quoted.join(", ")))
                    .visibility(Visibility::all()),
            )
            .await
            .unwrap(),
    )
}

/// Check the keyed reads of `values` through both key columns against the
/// oracle; returns how many base reads went through the index alone.
async fn check(store: &Store, uri: &str, what: &str, ids: &[&str], exts: &[&str]) -> usize {
    let before = store.keyed_base_reads();
    let by_id = brute(uri, "id", ids).await;
    let got = store.get_many(ids).await.unwrap();
    assert_eq!(render(&got), by_id, "{what}: get_many {ids:?}");
    let got = store
        .held_rows_matching("id", ids, Visibility::all())
        .await
        .unwrap()
        .expect("held path");
    assert_eq!(render(&got), by_id, "{what}: id IN {ids:?}");
    let got = store
        .held_rows_matching("external_id", exts, Visibility::all())
        .await
        .unwrap()
        .expect("held path");
    let oracle = brute(uri, "external_id", exts).await;
    assert_eq!(
        planned(store, "external_id", exts).await,
        oracle,
        "{what}: the planned scan disagrees with the brute-force oracle"
    );
    assert_eq!(render(&got), oracle, "{what}: external_id IN {exts:?}");
    let after = store.keyed_base_reads();
    eprintln!("{what}: keyed base reads {before:?} -> {after:?}");
    after.0 - before.0
}

/// (id, external_id, text) rows `prefix0..prefixN`.
fn batch(prefix: &str, n: usize, text: &str) -> RecordBatch {
    let rows: Vec<(String, String)> = (0..n)
        .map(|i| (format!("{prefix}{i}"), format!("e{prefix}{i}")))
        .collect();
    let refs: Vec<(&str, Option<&str>, &str)> = rows
        .iter()
        .map(|(id, ext)| (id.as_str(), Some(ext.as_str()), text))
        .collect();
    records(&refs, &[])
}

async fn segments(uri: &str, name: &str) -> String {
    let ds = lance::Dataset::open(uri).await.unwrap();
    let segs = ds.load_indices_by_name(name).await.unwrap();
    let frags: Vec<(u64, bool, usize)> = ds
        .fragments()
        .iter()
        .map(|f| (f.id, f.deletion_file.is_some(), f.overlays.len()))
        .collect();
    format!(
        "v{} fragments (id, has deletions, overlays) {frags:?}; {name} segments {:?}",
        ds.version().version,
        segs.iter()
            .map(|s| s
                .fragment_bitmap
                .as_ref()
                .map(|b| b.iter().collect::<Vec<_>>()))
            .collect::<Vec<_>>()
    )
}

/// Several merges (one fragment and one index segment each), deletes in
/// several fragments, a compaction (deferred remap + FRI, then the index
/// refresh), then more merges and deletes over the compacted fragments and a
/// second compaction.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compaction_and_deletes_match_the_oracle() {
    let (_dir, uri) = temp_uri();
    let store = store(&uri).await;
    for p in ["a", "b", "c", "d"] {
        store.add(&batch(p, 6, "t")).await.unwrap();
        store.merge().await.unwrap();
    }
    store.delete(&["a2", "b0", "c5"]).await.unwrap();
    store.merge().await.unwrap();
    let ids = ["a1", "a2", "a3", "b0", "b1", "c4", "c5", "d0", "zz"];
    let exts = [
        "ea1", "ea2", "ea3", "eb0", "eb1", "ec4", "ec5", "ed0", "ezz",
    ];
    eprintln!("{}", segments(&uri, "id_idx").await);
    let n = check(&store, &uri, "before compaction", &ids, &exts).await;
    assert!(n > 0, "never indexed");
    store.compact().await.unwrap();
    eprintln!("{}", segments(&uri, "id_idx").await);
    let n = check(&store, &uri, "after compaction", &ids, &exts).await;
    assert!(n > 0, "never indexed after compaction");
    // Deletes and re-adds over the compacted fragment.
    store.delete(&["a1", "d0"]).await.unwrap();
    store.merge().await.unwrap();
    // a1, a2 and d0 again (deleted keys re-added), and a new a9.
    store
        .add(&records(
            &[
                ("a1", Some("ea1"), "again"),
                ("a2", Some("ea2"), "again"),
                ("d0", Some("ed0"), "again"),
                ("a9", Some("ea9"), "t"),
            ],
            &[],
        ))
        .await
        .unwrap();
    store.merge().await.unwrap();
    eprintln!("{}", segments(&uri, "id_idx").await);
    check(
        &store,
        &uri,
        "deletes and re-adds after compaction",
        &ids,
        &exts,
    )
    .await;
    store.compact().await.unwrap();
    eprintln!("{}", segments(&uri, "id_idx").await);
    check(&store, &uri, "second compaction", &ids, &exts).await;
    // Every single key alone too (a one-address take is the contiguous path).
    for id in ids {
        let got = store.get_many(&[id]).await.unwrap();
        assert_eq!(render(&got), brute(&uri, "id", &[id]).await, "get {id}");
    }
}

/// A compaction committed by another process (Lance directly, deferred index
/// remap, no index refresh afterwards): the fragment reuse index is the only
/// link from the index's addresses to the new fragments.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn outside_compaction_without_index_refresh() {
    let (_dir, uri) = temp_uri();
    let store = store(&uri).await;
    for p in ["a", "b", "c"] {
        store.add(&batch(p, 5, "t")).await.unwrap();
        store.merge().await.unwrap();
    }
    store.delete(&["a0", "b3"]).await.unwrap();
    store.merge().await.unwrap();
    let mut ds = lance::Dataset::open(&uri).await.unwrap();
    // Fold the segments first (as Store::compact does) so Lance compacts.
    ds.optimize_indices(&lance_index::optimize::OptimizeOptions::merge(usize::MAX))
        .await
        .unwrap();
    let metrics = lance::dataset::optimize::compact_files(
        &mut ds,
        lance::dataset::optimize::CompactionOptions {
            defer_index_remap: true,
            materialize_deletions: true,
            materialize_deletions_threshold: 0.0,
            ..Default::default()
        },
        None,
    )
    .await
    .unwrap();
    eprintln!("outside compaction: {metrics:?}");
    eprintln!("{}", segments(&uri, "id_idx").await);
    eprintln!("{}", segments(&uri, "external_id_idx").await);
    let ids = ["a0", "a1", "a4", "b2", "b3", "b4", "c0", "c4", "nobody"];
    let exts = [
        "ea0", "ea1", "ea4", "eb2", "eb3", "eb4", "ec0", "ec4", "enobody",
    ];
    let n = check(&store, &uri, "outside compaction", &ids, &exts).await;
    eprintln!("indexed reads after the outside compaction: {n}");
    // A merge after it: deletes in the compacted fragment.
    store.delete(&["a1", "c4"]).await.unwrap();
    store.merge().await.unwrap();
    eprintln!("{}", segments(&uri, "id_idx").await);
    check(&store, &uri, "merge after outside compaction", &ids, &exts).await;
}

fn id_ext(ids: &[&str], exts: &[&str]) -> (RecordBatch, SchemaRef) {
    let schema = Arc::new(Schema::new(vec![
        Field::new("id", DataType::Utf8, false),
        Field::new("external_id", DataType::Utf8, true),
    ]));
    let b = RecordBatch::try_new(
        schema.clone(),
        vec![
            Arc::new(StringArray::from(ids.to_vec())),
            Arc::new(StringArray::from(exts.to_vec())),
        ],
    )
    .unwrap();
    (b, schema)
}

/// The secondary key rewritten in place by a partial-schema merge_insert
/// done with Lance directly (RewriteColumns: the same fragment ids, a new
/// data file for `external_id`), then an index refresh through a merge, then
/// a compaction.
async fn rewrite_in_place(mode: MergeInsertWriteMode) {
    let (_dir, uri) = temp_uri();
    let store = store(&uri).await;
    store.add(&batch("r", 6, "t")).await.unwrap();
    store.merge().await.unwrap();
    store.add(&batch("s", 6, "t")).await.unwrap();
    store.merge().await.unwrap();
    eprintln!("{}", segments(&uri, "external_id_idx").await);
    let ds = Arc::new(lance::Dataset::open(&uri).await.unwrap());
    let (src, schema) = id_ext(&["r1", "s2"], &["x1", "es3-moved"]);
    let mut b = MergeInsertBuilder::try_new(ds, vec!["id".into()]).unwrap();
    b.when_matched(WhenMatched::UpdateAll)
        .when_not_matched(WhenNotMatched::DoNothing)
        .write_mode(mode);
    let (_, stats) = b
        .try_build()
        .unwrap()
        .execute_reader(RecordBatchIterator::new([Ok(src)], schema))
        .await
        .unwrap();
    eprintln!("merge_insert {mode:?}: {stats:?}");
    eprintln!("{}", segments(&uri, "external_id_idx").await);
    let ids = ["r0", "r1", "s2", "s3"];
    let exts = ["er1", "x1", "es2", "es3", "es3-moved", "er0"];
    check(&store, &uri, "rewritten in place", &ids, &exts).await;
    // A merge refreshes the indexes (a segment over what is not covered).
    store.add(&batch("t", 2, "t")).await.unwrap();
    store.merge().await.unwrap();
    eprintln!("{}", segments(&uri, "external_id_idx").await);
    let n = check(
        &store,
        &uri,
        "rewritten in place, indexes refreshed",
        &ids,
        &exts,
    )
    .await;
    eprintln!("indexed: {n}");
    store.compact().await.unwrap();
    eprintln!("{}", segments(&uri, "external_id_idx").await);
    check(&store, &uri, "rewritten in place, compacted", &ids, &exts).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn secondary_key_rewritten_in_place_rewrite_columns() {
    rewrite_in_place(MergeInsertWriteMode::RewriteColumns).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn secondary_key_rewritten_in_place_auto() {
    rewrite_in_place(MergeInsertWriteMode::Auto).await;
}

/// `external_id` changed by a Lance `update` done directly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn secondary_key_changed_by_lance_update() {
    let (_dir, uri) = temp_uri();
    let store = store(&uri).await;
    store.add(&batch("r", 6, "t")).await.unwrap();
    store.merge().await.unwrap();
    let ds = Arc::new(lance::Dataset::open(&uri).await.unwrap());
    let result = lance::dataset::UpdateBuilder::new(ds)
        .update_where("id = 'r2'")
        .unwrap()
        .set("external_id", "'x2'")
        .unwrap()
        .build()
        .unwrap()
        .execute()
        .await
        .unwrap();
    eprintln!("updated {}", result.rows_updated);
    eprintln!("{}", segments(&uri, "external_id_idx").await);
    let ids = ["r1", "r2"];
    let exts = ["er2", "x2", "er1"];
    check(&store, &uri, "lance update", &ids, &exts).await;
    store.add(&batch("t", 2, "t")).await.unwrap();
    store.merge().await.unwrap();
    eprintln!("{}", segments(&uri, "external_id_idx").await);
    check(&store, &uri, "lance update, refreshed", &ids, &exts).await;
}

/// Deleted rows inside a contiguous run of addresses (the take's
/// `read_range` path) and a deleted row asked alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleted_rows_in_contiguous_takes() {
    let (_dir, uri) = temp_uri();
    let store = store(&uri).await;
    store.add(&batch("r", 10, "t")).await.unwrap();
    store.merge().await.unwrap();
    store.delete(&["r3", "r4", "r9"]).await.unwrap();
    store.merge().await.unwrap();
    eprintln!("{}", segments(&uri, "id_idx").await);
    for ids in [
        vec!["r2", "r3", "r4", "r5"],
        vec!["r3"],
        vec!["r9"],
        vec!["r3", "r4"],
        vec!["r0", "r1", "r2", "r3", "r4", "r5", "r6", "r7", "r8", "r9"],
    ] {
        let exts: Vec<String> = ids.iter().map(|i| format!("e{i}")).collect();
        let exts: Vec<&str> = exts.iter().map(String::as_str).collect();
        let n = check(&store, &uri, "contiguous", &ids, &exts).await;
        assert!(n > 0, "not through the index");
    }
    assert!(store.get("r3").await.unwrap().is_none());
}

/// Odd values: quotes, unicode, the empty string as a secondary key, values
/// repeated in the list, a list with no match, and > 10,000 values.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn odd_and_many_values() {
    let (_dir, uri) = temp_uri();
    let store = store(&uri).await;
    let odd = [
        ("o'brien", "it's"),
        ("ünï©ødé-🎉", "ключ"),
        ("tab\there", " lead"),
        ("per%cent", "under_score"),
        ("back\\slash", "NULL"),
    ];
    let rows: Vec<(&str, Option<&str>, &str)> =
        odd.iter().map(|(i, e)| (*i, Some(*e), "t")).collect();
    store.add(&records(&rows, &[])).await.unwrap();
    store
        .add(&records(
            &[("empty-ext", Some(""), "t"), ("null-ext", None, "t")],
            &[],
        ))
        .await
        .unwrap();
    store.add(&batch("m", 12_000, "t")).await.unwrap();
    store.merge().await.unwrap();
    let ids: Vec<&str> = odd.iter().map(|(i, _)| *i).collect();
    let exts: Vec<&str> = odd.iter().map(|(_, e)| *e).collect();
    check(&store, &uri, "odd", &ids, &exts).await;
    check(&store, &uri, "empty ext", &["empty-ext", "null-ext"], &[""]).await;
    check(
        &store,
        &uri,
        "repeated",
        &["m1", "m1", "m2", "m1"],
        &["em5", "em5"],
    )
    .await;
    check(&store, &uri, "none", &["nope"], &["nope"]).await;
    let many: Vec<String> = (0..12_500).map(|i| format!("m{i}")).collect();
    let many: Vec<&str> = many.iter().map(String::as_str).collect();
    let got = store.get_many(&many).await.unwrap();
    assert_eq!(got.num_rows(), 12_000);
    assert_eq!(ids_in_order(&got), many[..12_000].to_vec(), "order");
    let exts: Vec<String> = (0..12_500).map(|i| format!("em{i}")).collect();
    let exts: Vec<&str> = exts.iter().map(String::as_str).collect();
    let got = store
        .held_rows_matching("external_id", &exts, Visibility::all())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(render(&got), brute(&uri, "external_id", &exts).await);
}

/// A column of the stored schema dropped from the dataset by another
/// process while a handle is open (its stored schema still names it): a
/// lookup reports an error and does not panic; a handle opened afterwards
/// reads the rows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_column_dropped_outside_fails_a_lookup_without_a_panic() {
    let (_dir, uri) = temp_uri();
    let store = store(&uri).await;
    store.add(&batch("r", 4, "t")).await.unwrap();
    store.merge().await.unwrap();
    let mut ds = lance::Dataset::open(&uri).await.unwrap();
    ds.drop_columns(&["retired_at"]).await.unwrap();
    let got =
        tokio::spawn(async move { store.get("r1").await.map(|b| b.map(|b| b.num_rows())) }).await;
    let Ok(got) = got else {
        panic!("the lookup panicked: {got:?}");
    };
    assert!(got.is_err(), "{got:?}");
    let reopened = Store::open(caps_config(&uri)).await.unwrap();
    let found = reopened.get("r1").await.unwrap().expect("r1");
    assert_eq!(found.num_rows(), 1);
}

/// One index segment covering two fragments; the secondary key of a row in
/// one of them rewritten in place by Lance directly (the segment's coverage
/// loses that fragment, its entries for it stay); then the indexes are
/// refreshed by a merge (a new segment over the rewritten fragment), so the
/// union of the segments covers every fragment again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn partial_in_place_rewrite_under_a_shared_segment() {
    let (_dir, uri) = temp_uri();
    let store = store(&uri).await;
    store.add(&batch("r", 6, "t")).await.unwrap();
    store.merge().await.unwrap();
    store.add(&batch("s", 6, "t")).await.unwrap();
    store.merge().await.unwrap();
    // Fold the segments: one segment over fragments 0 and 1.
    let mut ds = lance::Dataset::open(&uri).await.unwrap();
    ds.optimize_indices(&lance_index::optimize::OptimizeOptions::merge(usize::MAX))
        .await
        .unwrap();
    eprintln!("{}", segments(&uri, "external_id_idx").await);
    let ids = ["r0", "r1", "s2", "s3"];
    let exts = ["er1", "x1", "es2", "er0", "es3"];
    check(&store, &uri, "folded", &ids, &exts).await;
    let ds = Arc::new(lance::Dataset::open(&uri).await.unwrap());
    let (src, schema) = id_ext(&["r1"], &["x1"]);
    let mut b = MergeInsertBuilder::try_new(ds, vec!["id".into()]).unwrap();
    b.when_matched(WhenMatched::UpdateAll)
        .when_not_matched(WhenNotMatched::DoNothing)
        .write_mode(MergeInsertWriteMode::RewriteColumns);
    b.try_build()
        .unwrap()
        .execute_reader(RecordBatchIterator::new([Ok(src)], schema))
        .await
        .unwrap();
    eprintln!("{}", segments(&uri, "external_id_idx").await);
    check(&store, &uri, "rewritten, not refreshed", &ids, &exts).await;
    store.add(&batch("t", 2, "t")).await.unwrap();
    store.merge().await.unwrap();
    eprintln!("{}", segments(&uri, "external_id_idx").await);
    let n = check(&store, &uri, "rewritten, refreshed", &ids, &exts).await;
    eprintln!("indexed reads: {n}");
    // The unique check of a record write: er1 is free again, x1 is taken.
    let fresh = store
        .add(&records(&[("fresh", Some("er1"), "t")], &[]))
        .await;
    assert!(fresh.is_ok(), "er1 reported taken: {fresh:?}");
    let taken = store
        .add(&records(&[("fresh2", Some("x1"), "t")], &[]))
        .await
        .expect_err("x1 not reported taken");
    assert!(matches!(taken.kind(), ErrorKind::AlreadyExists), "{taken}");
}

/// A keyed read whose view was taken before a delete, a merge and a
/// compaction by the same handle committed: it answers from its snapshot
/// (or, retried, from the newest version), never a mix.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn read_paused_across_merge_and_compaction() {
    let (_dir, uri) = temp_uri();
    let store = Arc::new(store(&uri).await);
    for p in ["a", "b"] {
        store.add(&batch(p, 5, "t")).await.unwrap();
        store.merge().await.unwrap();
    }
    let ids = ["a1", "a2", "b3", "b4"];
    let old = brute(&uri, "id", &ids).await;
    let (paused_rx, go_tx) = crate::support::pause_next_read(&store);
    let reader = {
        let store = store.clone();
        tokio::spawn(async move { store.get_many(&ids).await })
    };
    paused_rx.await.unwrap();
    store.delete(&["a2", "b3"]).await.unwrap();
    store.merge().await.unwrap();
    store.compact().await.unwrap();
    store.apply_retention().await.unwrap();
    let new = brute(&uri, "id", &ids).await;
    go_tx.send(()).unwrap();
    let got = render(&reader.await.unwrap().unwrap());
    eprintln!("paused read: {got:?}; old {old:?}; new {new:?}");
    assert!(got == old || got == new, "a mix: {got:?}");
}

/// A store of [`schema`] without record capabilities, merged by hand.
async fn plain_store(uri: &str) -> Store {
    Store::create(
        StoreConfig::new(uri)
            .with_schema(schema())
            .with_manual_maintenance(),
    )
    .await
    .unwrap()
}

/// A store without record capabilities (lookups by key only), where every
/// lookup now tries the index-only read even with nothing unmerged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plain_store_lookups() {
    let (_dir, uri) = temp_uri();
    let store = plain_store(&uri).await;
    for p in ["a", "b", "c"] {
        store.add(&batch(p, 5, "t")).await.unwrap();
        store.merge().await.unwrap();
    }
    // Rewritten rows: the same keys again with new text (a plain add replaces).
    store.add(&batch("a", 3, "v2")).await.unwrap();
    store.merge().await.unwrap();
    store.delete(&["b1", "c4"]).await.unwrap();
    store.merge().await.unwrap();
    let ids = ["a0", "a1", "a4", "b1", "b2", "c4", "zz", "a0"];
    let before = store.keyed_base_reads();
    let got = store.get_many(&ids).await.unwrap();
    assert_eq!(render(&got), brute(&uri, "id", &ids).await);
    assert_eq!(ids_in_order(&got), ["a0", "a1", "a4", "b2"]);
    store.compact().await.unwrap();
    let got = store.get_many(&ids).await.unwrap();
    assert_eq!(render(&got), brute(&uri, "id", &ids).await);
    for id in ids {
        let got = store.get_many(&[id]).await.unwrap();
        assert_eq!(render(&got), brute(&uri, "id", &[id]).await, "get {id}");
    }
    eprintln!("plain: {before:?} -> {:?}", store.keyed_base_reads());
}

/// Projections: one that omits the key, one naming a column the schema
/// lacks, one with only the key; compared between a merged store (the
/// index-only read) and the same rows still unmerged (the held generations,
/// the keyed path before this change too).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lookup_projections() {
    let (_dir, uri) = temp_uri();
    let store = plain_store(&uri).await;
    store.add(&batch("a", 3, "t")).await.unwrap();
    let ids = ["a2", "a0", "zz"];
    let p = |c: &[&str]| c.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    let cases = [
        p(&["text"]),
        p(&["id"]),
        p(&["text", "id"]),
        p(&["nope"]),
        p(&["text", "nope"]),
    ];
    let show = |r: &lance_context_store::Result<RecordBatch>| match r {
        Ok(b) => format!(
            "{:?} {:?}",
            b.schema()
                .fields()
                .iter()
                .map(|f| f.name().clone())
                .collect::<Vec<_>>(),
            (0..b.num_rows())
                .map(|i| b
                    .columns()
                    .iter()
                    .map(|c| arrow_cast::display::array_value_to_string(c, i).unwrap())
                    .collect::<Vec<_>>()
                    .join("|"))
                .collect::<Vec<_>>()
        ),
        Err(e) => format!("Err({e})"),
    };
    let mut unmerged = vec![];
    for c in &cases {
        unmerged.push(show(&store.lookup(&ids, Some(c)).await));
    }
    store.merge().await.unwrap();
    let before = store.keyed_base_reads();
    let mut merged = vec![];
    for c in &cases {
        merged.push(show(&store.lookup(&ids, Some(c)).await));
    }
    eprintln!("reads {before:?} -> {:?}", store.keyed_base_reads());
    for (c, (u, m)) in cases.iter().zip(unmerged.iter().zip(&merged)) {
        eprintln!("{c:?}: unmerged {u} / merged {m}");
    }
    assert_eq!(unmerged, merged);
    // Without the key: the rows still in the order asked, the key left out.
    assert_eq!(merged[0], r#"["text"] ["t", "t"]"#);
    assert_eq!(merged[1], r#"["id"] ["a2", "a0"]"#);
    assert_eq!(merged[2], r#"["text", "id"] ["t|a2", "t|a0"]"#);
    assert!(merged[3].starts_with("Err("), "{}", merged[3]);
}

/// The secondary key's index replaced outside the engine by another kind of
/// scalar index under the same name.
async fn replaced_index(kind: lance_index::IndexType) {
    let (_dir, uri) = temp_uri();
    let store = store(&uri).await;
    store.add(&batch("r", 6, "t")).await.unwrap();
    store.merge().await.unwrap();
    let mut ds = lance::Dataset::open(&uri).await.unwrap();
    ds.drop_index("external_id_idx").await.unwrap();
    let params = lance_index::scalar::ScalarIndexParams::for_builtin(match kind {
        lance_index::IndexType::Bitmap => lance_index::scalar::BuiltinIndexType::Bitmap,
        lance_index::IndexType::ZoneMap => lance_index::scalar::BuiltinIndexType::ZoneMap,
        _ => lance_index::scalar::BuiltinIndexType::NGram,
    });
    ds.create_index(
        &["external_id"],
        kind,
        Some("external_id_idx".into()),
        &params,
        true,
    )
    .await
    .unwrap();
    eprintln!("{}", segments(&uri, "external_id_idx").await);
    let n = check(
        &store,
        &uri,
        &format!("{kind:?}"),
        &["r1"],
        &["er1", "er2", "nope"],
    )
    .await;
    eprintln!("{kind:?}: indexed {n}");
    let refused = store
        .add(&records(&[("fresh", Some("er1"), "t")], &[]))
        .await
        .expect_err("er1 not reported taken");
    assert!(
        matches!(refused.kind(), ErrorKind::AlreadyExists),
        "{kind:?}: {refused}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replaced_index_bitmap() {
    replaced_index(lance_index::IndexType::Bitmap).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replaced_index_zonemap() {
    replaced_index(lance_index::IndexType::ZoneMap).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replaced_index_ngram() {
    replaced_index(lance_index::IndexType::NGram).await;
}
