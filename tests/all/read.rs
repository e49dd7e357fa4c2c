//! The read path: point lookups over base and generations, pushdown of
//! filter/order/limit/offset checked against an in-memory reference, and
//! datasets created with fewer columns.

use std::collections::BTreeMap;
use std::sync::Arc;

use arrow_array::{RecordBatch, RecordBatchIterator, StringArray};
use arrow_schema::{DataType, Field, Schema};
use lance::Dataset;
use lance_context_store::{
    BatchProblem, ErrorKind, PRIMARY_KEY_METADATA, ScanRequest, ShardPolicy, SortKey, Store,
    StoreConfig,
};

use crate::support::*;

/// Write `rows` straight into a plain Lance dataset (the base table), as an
/// older writer or a merge would have left them.
async fn write_base(uri: &str, schema: Arc<Schema>, batch: RecordBatch) {
    let fields: Vec<Field> = schema
        .fields()
        .iter()
        .map(|f| {
            let f = f.as_ref().clone();
            if f.name() == "id" {
                f.with_metadata([(PRIMARY_KEY_METADATA.to_string(), "true".to_string())].into())
            } else {
                f
            }
        })
        .collect();
    let schema = Arc::new(Schema::new(fields));
    let batch = RecordBatch::try_new(schema.clone(), batch.columns().to_vec()).unwrap();
    let reader = RecordBatchIterator::new(vec![Ok(batch)], schema);
    Dataset::write(reader, uri, None).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn point_lookup_finds_rows_in_base_and_in_generations() {
    let (_dir, uri) = temp_uri();
    write_base(&uri, schema(), batch(&rows("base", "b", 50))).await;
    let store = Store::open(config(&uri)).await.unwrap();
    store.add(&batch(&rows("wal", "w", 20))).await.unwrap();
    // An update of a base row lives in a generation and must win.
    store
        .add(&batch(&[Row::new("base-00007", "updated", 700)]))
        .await
        .unwrap();

    let from_base = store.get("base-00042").await.unwrap().expect("base row");
    assert_eq!(decode(&from_base), vec![Row::new("base-00042", "b", 42)]);
    let from_wal = store
        .get("wal-00013")
        .await
        .unwrap()
        .expect("generation row");
    assert_eq!(decode(&from_wal), vec![Row::new("wal-00013", "w", 13)]);
    let updated = store.get("base-00007").await.unwrap().unwrap();
    assert_eq!(
        decode(&updated),
        vec![Row::new("base-00007", "updated", 700)]
    );
    assert!(store.get("nope").await.unwrap().is_none());

    // get_many: in the order asked, missing skipped, repeats once.
    let many = store
        .get_many(&["wal-00001", "nope", "base-00007", "base-00001", "wal-00001"])
        .await
        .unwrap();
    let got: Vec<String> = decode(&many).into_iter().map(|r| r.id).collect();
    assert_eq!(got, vec!["wal-00001", "base-00007", "base-00001"]);
    assert_eq!(decode(&many)[1].grp, "updated");

    // The lookup is planned as a point lookup, not a scan of everything.
    let plan = store
        .explain(ScanRequest::new().filter("id = 'base-00042'"))
        .await
        .unwrap();
    assert!(!plan.contains("UnionExec"), "point lookup plan:\n{plan}");
    // …whereas a filter on another column unions and scans every source.
    let scan_plan = store
        .explain(ScanRequest::new().filter("grp = 'b'"))
        .await
        .unwrap();
    assert!(scan_plan.contains("UnionExec"), "scan plan:\n{scan_plan}");
    assert_eq!(store.count(None).await.unwrap(), 70);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lookup_of_many_keys_is_one_scan_and_answers_as_single_gets_do() {
    let (_dir, uri) = temp_uri();
    write_base(&uri, schema(), batch(&rows("base", "b", 60))).await;
    let store = Store::open(config(&uri)).await.unwrap();
    // In generations: rewrites of base rows, deletes of base rows and of a
    // generation row, new rows.
    store.add(&batch(&rows("wal", "w", 20))).await.unwrap();
    let rewritten: Vec<Row> = (0..10)
        .map(|i| Row::new(format!("base-{i:05}"), "rewritten", 1000 + i))
        .collect();
    store.add(&batch(&rewritten)).await.unwrap();
    let deleted: Vec<String> = (10..20)
        .map(|i| format!("base-{i:05}"))
        .chain(["wal-00003".to_string()])
        .collect();
    let refs: Vec<&str> = deleted.iter().map(String::as_str).collect();
    store.delete(&refs).await.unwrap();

    let mut keys: Vec<String> = (0..60).map(|i| format!("base-{i:05}")).collect();
    keys.extend((0..20).map(|i| format!("wal-{i:05}")));
    keys.extend((0..5).map(|i| format!("missing-{i}")));
    keys.reverse();
    let asked: Vec<&str> = keys.iter().map(String::as_str).collect();
    let many = decode(&store.get_many(&asked).await.unwrap());
    let mut one_by_one = Vec::new();
    for key in &asked {
        if let Some(b) = store.get(key).await.unwrap() {
            one_by_one.extend(decode(&b));
        }
    }
    assert_eq!(many, one_by_one);
    assert_eq!(many.len(), 60 + 20 - 11);
    assert!(many.iter().any(|r| r.grp == "rewritten"));

    // Many keys are one (indexed) scan of every source, not a lookup per key.
    let list = asked
        .iter()
        .map(|k| format!("'{k}'"))
        .collect::<Vec<_>>()
        .join(", ");
    let plan = store
        .explain(ScanRequest::new().filter(format!("id IN ({list})")))
        .await
        .unwrap();
    assert!(plan.contains("UnionExec"), "many-key plan:\n{plan}");
    let scanned = store
        .scan(ScanRequest::new().filter(format!("id IN ({list})")))
        .await
        .unwrap();
    assert_eq!(scanned.num_rows(), many.len());
}

/// The reference: newest row per key, in memory.
fn reference_query(
    rows: &BTreeMap<String, Row>,
    filter: impl Fn(&Row) -> bool,
    order: &[(&str, bool)],
    offset: usize,
    limit: Option<usize>,
) -> Vec<String> {
    let mut hits: Vec<&Row> = rows.values().filter(|r| filter(r)).collect();
    hits.sort_by(|a, b| {
        for (col, desc) in order {
            let ord = match *col {
                "n" => a.n.cmp(&b.n),
                "grp" => a.grp.cmp(&b.grp),
                "id" => a.id.cmp(&b.id),
                other => panic!("no reference order for {other}"),
            };
            let ord = if *desc { ord.reverse() } else { ord };
            if ord != std::cmp::Ordering::Equal {
                return ord;
            }
        }
        std::cmp::Ordering::Equal
    });
    hits.into_iter()
        .skip(offset)
        .take(limit.unwrap_or(usize::MAX))
        .map(|r| r.id.clone())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn filter_order_limit_offset_match_a_reference() {
    let (_dir, uri) = temp_uri();
    let store = create(&uri).await;
    let mut rng = Lcg(7);
    let mut reference: BTreeMap<String, Row> = BTreeMap::new();
    // Ten adds over 300 keys with overlaps: later adds update earlier keys.
    for _ in 0..10 {
        let mut batch_rows = Vec::new();
        let mut in_batch = std::collections::HashSet::new();
        for _ in 0..60 {
            let key = format!("k{:03}", rng.below(300));
            if !in_batch.insert(key.clone()) {
                continue;
            }
            let grp = ["red", "green", "blue"][rng.below(3) as usize];
            let row = Row::new(key.clone(), grp, rng.below(1000) as i64);
            reference.insert(key, row.clone());
            batch_rows.push(row);
        }
        store.add(&batch(&batch_rows)).await.unwrap();
    }
    assert_eq!(store.count(None).await.unwrap(), reference.len() as u64);

    // Order by n desc, id asc; page through with limit/offset.
    for (offset, limit) in [
        (0, Some(10)),
        (5, Some(17)),
        (100, Some(50)),
        (0, None),
        (250, Some(100)),
    ] {
        let mut req = ScanRequest::new()
            .order_by(SortKey::desc("n"))
            .order_by(SortKey::asc("id"))
            .offset(offset);
        if let Some(l) = limit {
            req = req.limit(l);
        }
        let got = scan_ids(&store, req).await;
        let want = reference_query(
            &reference,
            |_| true,
            &[("n", true), ("id", false)],
            offset,
            limit,
        );
        assert_eq!(got, want, "offset {offset} limit {limit:?}");
    }
    // Filter + order + limit, with a projection that leaves out the sort column.
    let req = ScanRequest::new()
        .filter("grp = 'green' AND n >= 250")
        .project(["id", "grp"])
        .order_by(SortKey::asc("n"))
        .order_by(SortKey::asc("id"))
        .offset(3)
        .limit(20);
    let got_batch = store.scan(req.clone()).await.unwrap();
    assert_eq!(got_batch.num_columns(), 2);
    let got: Vec<String> = decode(&got_batch).into_iter().map(|r| r.id).collect();
    let want = reference_query(
        &reference,
        |r| r.grp == "green" && r.n >= 250,
        &[("n", false), ("id", false)],
        3,
        Some(20),
    );
    assert_eq!(got, want);
    // The sort is a bounded top-k inside the plan, not a truncation afterwards.
    let plan = store.explain(req).await.unwrap();
    assert!(
        plan.contains("TopK") || plan.contains("fetch=23"),
        "plan:\n{plan}"
    );

    // Limit/offset without order: the right number of distinct, matching rows.
    let page = store
        .scan(
            ScanRequest::new()
                .filter("grp = 'red'")
                .offset(10)
                .limit(25),
        )
        .await
        .unwrap();
    let reds = reference.values().filter(|r| r.grp == "red").count();
    assert_eq!(page.num_rows(), 25.min(reds.saturating_sub(10)));
    for row in decode(&page) {
        assert_eq!(reference[&row.id], row, "a page row is the newest version");
    }
    // Unknown columns are typed errors.
    let err = store
        .scan(ScanRequest::new().order_by(SortKey::asc("nope")))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidInput);
    let err = store
        .scan(ScanRequest::new().filter("nope = 1"))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidInput, "{err}");
    let err = store
        .scan(ScanRequest::new().project(["id", "nope"]))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidInput);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dataset_created_with_fewer_columns_reads_and_writes() {
    let (_dir, uri) = temp_uri();
    // An older version's dataset: no `score`, no `note`.
    let old_schema = Arc::new(Schema::new(vec![
        Field::new("id", DataType::Utf8, false),
        Field::new("grp", DataType::Utf8, false),
        Field::new("n", DataType::Int64, false),
    ]));
    let old_rows = RecordBatch::try_new(
        old_schema.clone(),
        vec![
            Arc::new(StringArray::from(vec!["old-1", "old-2"])),
            Arc::new(StringArray::from(vec!["g", "g"])),
            Arc::new(arrow_array::Int64Array::from(vec![1, 2])),
        ],
    )
    .unwrap();
    write_base(&uri, old_schema, old_rows).await;

    let store = Store::open(config(&uri)).await.unwrap();
    assert_eq!(store.schema(), schema(), "reads use the expected schema");
    let old = store.get("old-2").await.unwrap().unwrap();
    assert_eq!(old.schema().fields().len(), 5);
    assert_eq!(
        decode(&old),
        vec![Row {
            id: "old-2".into(),
            grp: "g".into(),
            n: 2,
            score: None,
            note: None
        }]
    );
    // Rows without values for the missing columns are accepted…
    let mut new_row = Row::new("new-1", "g", 3);
    new_row.score = None;
    store.add(&batch(&[new_row.clone()])).await.unwrap();
    assert_eq!(
        decode(&store.get("new-1").await.unwrap().unwrap()),
        vec![new_row]
    );
    // …a value in one is refused with its column and row.
    let mut rows2 = vec![Row::new("new-2", "g", 4), Row::new("new-3", "g", 5)];
    rows2[0].score = None;
    let err = store.add(&batch(&rows2)).await.unwrap_err();
    assert_eq!(
        err.batch_problem(),
        Some(&BatchProblem::ColumnNotInDataset {
            column: "score".into(),
            row: 1
        })
    );
    // A scan ordered by a column the dataset lacks still returns every row.
    let all = store
        .scan(
            ScanRequest::new()
                .order_by(SortKey::asc("note"))
                .order_by(SortKey::asc("id")),
        )
        .await
        .unwrap();
    assert_eq!(ids(&all), vec!["new-1", "old-1", "old-2"]);
    // Opening without an expected schema uses the dataset's own.
    let plain = Store::open_read_only(StoreConfig::new(&uri)).await.unwrap();
    assert_eq!(plain.schema().fields().len(), 3);
}

async fn scan_ids(store: &Store, req: ScanRequest) -> Vec<String> {
    let batch = store.scan(req).await.unwrap();
    decode(&batch).into_iter().map(|r| r.id).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_columns_in_a_query_are_named() {
    let (_dir, uri) = temp_uri();
    let store = create(&uri).await;
    store.add(&batch(&rows("a", "g", 3))).await.unwrap();
    let cases = [
        (
            ScanRequest::new().filter("grp = 'g' AND colour = 'red'"),
            "colour",
        ),
        (ScanRequest::new().filter("upper(nope) = 'X'"), "nope"),
        (ScanRequest::new().order_by(SortKey::asc("when")), "when"),
        (ScanRequest::new().project(["id", "missing"]), "missing"),
    ];
    for (request, column) in cases {
        let err = store.scan(request).await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidInput, "{err}");
        assert!(
            err.to_string()
                .contains(&format!("unknown column '{column}'")),
            "{err}"
        );
    }
    let err = store.count(Some("size > 3")).await.unwrap_err();
    assert!(err.to_string().contains("unknown column 'size'"), "{err}");
    // Known columns, any case when unquoted, and string literals are fine.
    assert_eq!(store.count(Some("GRP = 'colour'")).await.unwrap(), 0);
    assert_eq!(store.count(Some("grp = 'g'")).await.unwrap(), 3);
    store.close().await.unwrap();
}

/// A reader handle keeps each shard's manifest between reads and checks only
/// whether a newer one exists: it must still see every add, every merge and
/// a new instance's shard as soon as they are acknowledged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_lived_reader_sees_every_new_generation_merge_and_shard() {
    let (_dir, uri) = temp_uri();
    let writer = Store::create(config(&uri).with_shard_policy(ShardPolicy::PartitionedKeys))
        .await
        .unwrap();
    writer.add(&batch(&rows("a", "x", 1))).await.unwrap();
    let reader = Store::open_read_only(StoreConfig::new(&uri)).await.unwrap();
    assert_eq!(reader.count(None).await.unwrap(), 1);
    for round in 1..=6i64 {
        let id = format!("r{round}");
        writer
            .add(&batch(&[Row::new(id.as_str(), "x", round)]))
            .await
            .unwrap();
        // A rewrite of the first row: newest wins in the reader too.
        writer
            .add(&batch(&[Row::new("a-00000", "x", 100 + round)]))
            .await
            .unwrap();
        let got = reader.get(&id).await.unwrap().expect("the new row");
        assert_eq!(decode(&got), vec![Row::new(id.as_str(), "x", round)]);
        let first = reader.get("a-00000").await.unwrap().unwrap();
        assert_eq!(decode(&first)[0].n, 100 + round, "round {round}");
        assert_eq!(reader.count(None).await.unwrap(), 1 + round as u64);
        if round % 2 == 0 {
            writer.merge().await.unwrap();
            assert_eq!(reader.count(None).await.unwrap(), 1 + round as u64);
            let first = reader.get("a-00000").await.unwrap().unwrap();
            assert_eq!(decode(&first)[0].n, 100 + round, "after merge {round}");
        }
    }
    // Another instance writes through a shard of its own.
    let other = Store::open(
        config(&uri)
            .with_instance_id("other")
            .with_shard_policy(ShardPolicy::PartitionedKeys),
    )
    .await
    .unwrap();
    other.add(&batch(&[Row::new("o1", "y", 7)])).await.unwrap();
    let got = reader
        .get("o1")
        .await
        .unwrap()
        .expect("the other shard's row");
    assert_eq!(decode(&got), vec![Row::new("o1", "y", 7)]);
    assert_eq!(reader.count(None).await.unwrap(), 8);
    other.close().await.unwrap();
    writer.close().await.unwrap();
}

/// A filter of the key shape is planned through Lance's point lookup, which
/// reads the generations while the plan is built: when that read fails, the
/// failure is the storage's — not the caller's filter (an invalid argument
/// would not be retried, and would tell the caller to fix a good filter).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_storage_failure_while_planning_a_filter_is_not_blamed_on_the_filter() {
    let (_dir, uri) = temp_uri();
    let store = Store::create(config(&uri).with_manual_maintenance())
        .await
        .unwrap();
    store.add(&batch(&rows("k", "g", 10))).await.unwrap();
    let shard = std::path::Path::new(&uri)
        .join("_mem_wal")
        .join(store.shard_id().to_string());
    store.close().await.unwrap();
    // The generation's data files vanish; its manifest stays.
    let mut removed = 0;
    for entry in std::fs::read_dir(&shard).unwrap() {
        let path = entry.unwrap().path();
        if path.to_string_lossy().contains("_gen_") && path.join("data").is_dir() {
            for file in std::fs::read_dir(path.join("data")).unwrap() {
                std::fs::remove_file(file.unwrap().path()).unwrap();
                removed += 1;
            }
        }
    }
    assert!(removed > 0, "no generation data files under {shard:?}");
    let reader = Store::open_read_only(config(&uri)).await.unwrap();
    for filter in ["id = 'k-00003'", "id IN ('k-00003', 'k-00004')"] {
        let err = reader
            .scan(ScanRequest::new().filter(filter))
            .await
            .expect_err("the rows are gone");
        assert_ne!(err.kind(), ErrorKind::InvalidInput, "{filter}: {err}");
    }
}

/// A burst of adds leaves more unmerged than a lookup loads itself (1 MiB
/// not held): lookups go through the planner, one lookup per generation.
/// From a handle's second such lookup on, the generations are loaded in the
/// background, and the lookups after it read them held; a one-shot lookup
/// (a CLI `get`) loads nothing. The answers are the same on both paths.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lookups_after_a_burst_of_adds_load_the_generations_in_the_background() {
    use std::time::{Duration, Instant};
    let (_dir, uri) = temp_uri();
    // No merge may take the generations away while the test waits.
    let store = Store::create(config(&uri).with_manual_maintenance())
        .await
        .unwrap();
    let wide = "x".repeat(400);
    for g in 0..4 {
        let mut rows = rows(&format!("g{g}"), &wide, 1000);
        // Each generation rewrites a key of the one before it.
        if g > 0 {
            rows.push(Row::new(format!("g{}-00007", g - 1), "rewritten", g));
        }
        store.add(&batch(&rows)).await.unwrap();
    }
    store.delete(&["g0-00003"]).await.unwrap();
    let keys = ["g0-00003", "g0-00007", "g2-00999", "g3-00500", "nope"];
    let expected = |label: &str, found: &RecordBatch| {
        let got: Vec<(String, String)> = decode(found)
            .into_iter()
            .map(|r| (r.id, r.grp.chars().take(9).collect()))
            .collect();
        let want: Vec<(String, String)> = [
            ("g0-00007", "rewritten"),
            ("g2-00999", "xxxxxxxxx"),
            ("g3-00500", "xxxxxxxxx"),
        ]
        .iter()
        .map(|(a, b)| (a.to_string(), b.to_string()))
        .collect();
        assert_eq!(got, want, "{label}");
    };
    let keyed = |s: &Store| {
        let (indexed, planned) = s.keyed_base_reads();
        indexed + planned
    };
    for handle in ["writer", "reader"] {
        let reader;
        let s = if handle == "writer" {
            &store
        } else {
            reader = Store::open_read_only(config(&uri).with_manual_maintenance())
                .await
                .unwrap();
            &reader
        };
        // A plain store's adds are not held: nothing is, and the first
        // lookup goes through the planner and loads nothing.
        expected(handle, &s.get_many(&keys).await.unwrap());
        assert_eq!(
            keyed(s),
            0,
            "{handle}: the first lookup read held generations"
        );
        assert_eq!(
            s.held_generations().1,
            0,
            "{handle}: a one-shot lookup loaded"
        );
        assert!(!s.warming_generations());
        // The second one also goes through the planner, and starts the load.
        expected(handle, &s.get_many(&keys).await.unwrap());
        assert_eq!(keyed(s), 0);
        let started = Instant::now();
        while s.warming_generations() || s.held_generations().1 < 5 {
            assert!(
                started.elapsed() < Duration::from_secs(60),
                "{handle}: the generations were not loaded: {:?}",
                s.held_generations()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert_eq!(
            s.held_generations().1,
            5,
            "{handle}: four adds and a delete"
        );
        // Now held: the lookup reads them, and only the base table from disk.
        let loads = s.held_generations().2;
        expected(handle, &s.get_many(&keys).await.unwrap());
        assert_eq!(
            keyed(s),
            1,
            "{handle}: the lookup did not read the held generations"
        );
        for key in keys {
            let one = s.get(key).await.unwrap();
            let many = s.get_many(&[key]).await.unwrap();
            assert_eq!(one.map(|b| decode(&b)).unwrap_or_default(), decode(&many));
        }
        assert_eq!(s.held_generations().2, loads, "{handle}: loaded again");
    }
}
