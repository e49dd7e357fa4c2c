//! The engine's promises under concurrent operators: two handles merging one
//! shard, a fenced handle, a killed merge, cleanup by short-lived processes,
//! readers holding an older snapshot, backpressure, retention, lookups
//! through the key index, group commit, a persistence failure.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use lance_context_store::{
    ErrorKind, MergeHook, RetentionSettings, ScanRequest, SortKey, Store, StoreConfig,
};
use tokio::sync::Notify;

use crate::support::*;

const GRACE: Duration = Duration::from_millis(50);

fn manual(uri: &str) -> StoreConfig {
    let mut config = config(uri).with_manual_maintenance();
    config.merge.cleanup_grace = GRACE;
    config
}

/// A hook that pauses the merge before the commit of the pass ending at
/// `generation`: `reached` is notified there, and the merge waits for
/// `resume`.
fn pause_before(generation: u64, reached: Arc<Notify>, resume: Arc<Notify>) -> MergeHook {
    Arc::new(move |_first, last| {
        let (reached, resume) = (reached.clone(), resume.clone());
        Box::pin(async move {
            if last == generation {
                reached.notify_one();
                resume.notified().await;
            }
        })
    })
}

async fn value(store: &Store, id: &str) -> Option<Row> {
    store.get(id).await.unwrap().map(|b| decode(&b).remove(0))
}

/// The sequence of the review: handle A merges generations 1..2 (2 deletes
/// K) and stops before committing the delete; K is re-added (3) through
/// handle B, which claims the instance (fencing A) and merges everything;
/// then A's commit goes ahead. It must be refused as a whole: K stays, with
/// its newest value.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_merge_commit_cannot_undo_an_acknowledged_write() {
    let (_dir, uri) = temp_uri();
    let a = Arc::new(Store::create(manual(&uri)).await.unwrap());
    a.add(&batch(&[Row::new("K", "v1", 1)])).await.unwrap(); // generation 1
    a.delete(&["K"]).await.unwrap(); // generation 2

    let (reached, resume) = (Arc::new(Notify::new()), Arc::new(Notify::new()));
    let merging = tokio::spawn({
        let a = a.clone();
        let hook = pause_before(2, reached.clone(), resume.clone());
        async move { a.merge_with_hook(hook).await }
    });
    reached.notified().await; // A: pass 1..1 committed, the delete pass waits

    let b = Store::open(manual(&uri)).await.unwrap(); // same instance: A is fenced
    b.add(&batch(&[Row::new("K", "v2", 2)])).await.unwrap(); // generation 3
    let merged = b.merge().await.unwrap();
    assert_eq!(merged.merged_up_to, Some(3), "{merged:?}");
    assert_eq!(value(&b, "K").await.unwrap().grp, "v2");

    resume.notify_one();
    let stale = merging.await.unwrap().unwrap_err();
    assert_eq!(stale.kind(), ErrorKind::Conflict, "{stale}");
    let reader = Store::open_read_only(StoreConfig::new(&uri)).await.unwrap();
    assert_eq!(
        value(&reader, "K").await.map(|r| r.grp),
        Some("v2".to_string()),
        "the acknowledged re-add survived"
    );
    // A fenced handle does not merge at all any more.
    assert!(a.merge().await.unwrap_err().is_fenced());
}

/// The same without deletes: a range merged in several passes, the later
/// pass stale.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_upsert_pass_cannot_overwrite_a_newer_value() {
    let (_dir, uri) = temp_uri();
    let mut config = manual(&uri);
    config.merge.batch_budget_bytes = 1; // one generation per pass
    let a = Arc::new(Store::create(config.clone()).await.unwrap());
    for g in 1..=3 {
        a.add(&batch(&[Row::new(format!("k{g}"), "old", g)]))
            .await
            .unwrap();
    }
    let (reached, resume) = (Arc::new(Notify::new()), Arc::new(Notify::new()));
    let merging = tokio::spawn({
        let a = a.clone();
        let hook = pause_before(3, reached.clone(), resume.clone());
        async move { a.merge_with_hook(hook).await }
    });
    reached.notified().await;
    let b = Store::open(config).await.unwrap();
    b.add(&batch(&[Row::new("k3", "new", 9)])).await.unwrap();
    b.merge().await.unwrap();
    resume.notify_one();
    assert_eq!(
        merging.await.unwrap().unwrap_err().kind(),
        ErrorKind::Conflict
    );
    let reader = Store::open_read_only(StoreConfig::new(&uri)).await.unwrap();
    assert_eq!(value(&reader, "k3").await.unwrap().grp, "new");
    assert_eq!(reader.count(None).await.unwrap(), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_deleted_from_the_base_before_a_merge_is_gone_from_scan_and_count() {
    let (_dir, uri) = temp_uri();
    let store = Store::create(manual(&uri)).await.unwrap();
    store.add(&batch(&rows("b", "g", 10))).await.unwrap();
    store.merge().await.unwrap();
    store.delete(&["b-00003", "b-00007"]).await.unwrap();
    assert_eq!(store.count(None).await.unwrap(), 8);
    assert_eq!(store.count(Some("grp = 'g'")).await.unwrap(), 8);
    let all = ids(&store.scan(ScanRequest::new()).await.unwrap());
    assert!(!all.contains(&"b-00003".to_string()) && all.len() == 8);
    // Re-added after the delete, before any merge: counted once.
    store
        .add(&batch(&[Row::new("b-00003", "back", 1)]))
        .await
        .unwrap();
    assert_eq!(store.count(None).await.unwrap(), 9);
    store.merge().await.unwrap();
    assert_eq!(store.count(None).await.unwrap(), 9);
}

/// `get` itself probes the base table through the key index: it reads a
/// small fraction of what the same lookup reads as a scan whose predicate the
/// index cannot answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lookups_go_through_the_key_index() {
    let (_dir, uri) = temp_uri();
    let store = Store::create(manual(&uri)).await.unwrap();
    let mut all = rows("k", "g", 20_000);
    for r in &mut all {
        r.note = Some("n".repeat(100));
    }
    store.add(&batch(&all)).await.unwrap();
    store.merge().await.unwrap();
    store.get("k-00001").await.unwrap(); // warm metadata caches
    store.base_read_bytes().await;
    let row = store.get("k-17007").await.unwrap().expect("found");
    assert_eq!(decode(&row)[0].n, 17007);
    let indexed = store.base_read_bytes().await;
    let scanned_row = store
        .scan(ScanRequest::new().filter("id || '' = 'k-17007'"))
        .await
        .unwrap();
    assert_eq!(decode(&scanned_row)[0].n, 17007);
    let scanned = store.base_read_bytes().await;
    eprintln!("lookup read {indexed} bytes through the index, {scanned} as a scan");
    assert!(
        indexed * 5 < scanned,
        "through the index {indexed} bytes, as a scan {scanned} bytes"
    );
}

/// The key index keeps small pages (512 keys) from its creation on an
/// empty table through the merges that train and extend it: a lookup whose
/// page is not cached reads, decodes and sorts one page.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_key_index_keeps_small_pages_through_merges() {
    let (_dir, uri) = temp_uri();
    let store = Store::create(manual(&uri)).await.unwrap();
    store.add(&batch(&rows("a", "g", 5_000))).await.unwrap();
    store.merge().await.unwrap();
    store.add(&batch(&rows("b", "g", 5_000))).await.unwrap();
    store.merge().await.unwrap();
    use lance::index::DatasetIndexExt;
    let dataset = lance::Dataset::open(&uri).await.unwrap();
    let stats: serde_json::Value =
        serde_json::from_str(&dataset.index_statistics("id_idx").await.unwrap()).unwrap();
    let pages: u64 = stats["indices"]
        .as_array()
        .unwrap_or_else(|| panic!("{stats}"))
        .iter()
        .map(|i| i["num_pages"].as_u64().unwrap_or_else(|| panic!("{stats}")))
        .sum();
    // 10,000 keys: 20 pages of 512 (3 of Lance's default 4,096).
    assert!(pages >= 19, "{pages} pages: {stats}");
    assert!(store.get("b-04999").await.unwrap().is_some());
}

/// The generation directories of every shard of the store at `dir`.
fn generation_dirs(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for shard in std::fs::read_dir(dir.join("store/_mem_wal")).unwrap() {
        for entry in std::fs::read_dir(shard.unwrap().path()).unwrap() {
            let path = entry.unwrap().path();
            if path.to_string_lossy().contains("_gen_") {
                out.push(path);
            }
        }
    }
    out
}

/// The key index exists from the start (base reads use it), but no writer
/// keeps a table index in memory: each generation carries its key sidecar
/// (which reads use to keep only a key's newest version) and no index of
/// its own, which cost every flush a dataset open, an index and a manifest
/// that nothing read (1.3–1.9 ms of a single-record add).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_generation_is_flushed_with_its_key_sidecar_and_no_table_index() {
    let (dir, uri) = temp_uri();
    let store = Store::create(manual(&uri)).await.unwrap();
    let stats = store.stats().await.unwrap();
    assert!(
        stats.indexes.iter().any(|i| i.name == "id_idx"),
        "the key index exists before the first row: {stats:?}"
    );
    store.add(&batch(&rows("a", "g", 300))).await.unwrap();
    store.add(&batch(&rows("b", "g", 5))).await.unwrap();
    let generations = generation_dirs(dir.path());
    assert!(generations.len() >= 2, "{generations:?}");
    for path in &generations {
        assert!(
            path.join("_pk_index").is_dir(),
            "{path:?} has no key sidecar"
        );
        assert!(
            !path.join("_indices").exists(),
            "{path:?} carries a table index nothing reads"
        );
    }
    assert_eq!(store.count(None).await.unwrap(), 305);
}

/// Every freeze is the writer's own, made with no put running: Lance's
/// writer asks to freeze a full memtable and is told no, the put is refused
/// before it writes, and the writer freezes and puts again. Concurrent adds
/// rewriting their keys into memtables of 10 rows (each add of 7 fills one
/// or two): every generation has its key sidecar, and reads see each key
/// once, at its newest version. A generation flushed while a put's rows
/// were not yet in the memtable's key index would have a partial sidecar,
/// and an older version would show through.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn full_memtables_are_frozen_by_the_writer_with_no_put_running() {
    let (dir, uri) = temp_uri();
    let mut config = manual(&uri);
    config.writer.max_memtable_rows = 10;
    let store = Arc::new(Store::create(config).await.unwrap());
    let tasks: Vec<_> = (0..6)
        .map(|t| {
            let store = store.clone();
            tokio::spawn(async move {
                for round in 0..12i64 {
                    let rows: Vec<Row> = (0..7)
                        .map(|k| Row::new(format!("t{t}-k{k}"), "g", round))
                        .collect();
                    store.add(&batch(&rows)).await.unwrap();
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.unwrap();
    }
    let all = decode(&store.scan(ScanRequest::new()).await.unwrap());
    assert_eq!(all.len(), 42, "each key once");
    let stale: Vec<_> = all.iter().filter(|r| r.n != 11).collect();
    assert!(stale.is_empty(), "older versions read: {stale:?}");
    for t in 0..6 {
        let got = decode(&store.get(&format!("t{t}-k3")).await.unwrap().unwrap());
        assert_eq!(got[0].n, 11);
    }
    let generations = generation_dirs(dir.path());
    assert!(generations.len() >= 12, "{} generations", generations.len());
    for path in &generations {
        assert!(
            path.join("_pk_index").is_dir(),
            "{path:?} has no key sidecar"
        );
    }
    // The same after the merge folds them into the base.
    store.merge().await.unwrap();
    let all = decode(&store.scan(ScanRequest::new()).await.unwrap());
    assert_eq!(all.len(), 42);
    assert!(all.iter().all(|r| r.n == 11));
}

/// An add whose caller stops waiting (a timeout, a dropped future) part-way
/// through its put does not let a freeze run ahead of Lance's index task
/// over its rows: the put runs on in a task of its own, holding the gate.
/// Adds cut short at random beside adds that complete, each rewriting its
/// task's keys: every key is read once, at a version no older than the last
/// acknowledged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn adds_cut_short_by_their_callers_leave_every_sidecar_whole() {
    let (dir, uri) = temp_uri();
    let mut config = manual(&uri);
    config.writer.max_memtable_rows = 12;
    let store = Arc::new(Store::create(config).await.unwrap());
    let tasks: Vec<_> = (0..6)
        .map(|t| {
            let store = store.clone();
            tokio::spawn(async move {
                let mut acknowledged = -1;
                for round in 0..16i64 {
                    let rows: Vec<Row> = (0..5)
                        .map(|k| Row::new(format!("t{t}-k{k}"), "g", round))
                        .collect();
                    let written = batch(&rows);
                    let add = store.add(&written);
                    if (round + t) % 3 == 0 {
                        // Cut short: the caller stops waiting at once.
                        let cut = Duration::from_micros(50 * (round as u64 % 7 + 1));
                        if let Ok(done) = tokio::time::timeout(cut, add).await {
                            done.unwrap();
                            acknowledged = round;
                        }
                    } else {
                        add.await.unwrap();
                        acknowledged = round;
                    }
                }
                (t, acknowledged)
            })
        })
        .collect();
    let mut last = BTreeMap::new();
    for task in tasks {
        let (t, acknowledged) = task.await.unwrap();
        last.insert(t, acknowledged);
    }
    // Let the puts whose callers left finish (each runs on in its task).
    tokio::time::sleep(Duration::from_millis(500)).await;
    let all = decode(&store.scan(ScanRequest::new()).await.unwrap());
    assert_eq!(all.len(), 30, "each key once");
    for row in &all {
        let t: i64 = row.id[1..row.id.find('-').unwrap()].parse().unwrap();
        assert!(
            row.n >= last[&t],
            "{row:?}: older than the last acknowledged version {}",
            last[&t]
        );
    }
    for path in generation_dirs(dir.path()) {
        assert!(
            path.join("_pk_index").is_dir(),
            "{path:?} has no key sidecar"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_adds_share_one_generation() {
    let (_dir, uri) = temp_uri();
    let mut config = manual(&uri);
    // Every put waits for the same WAL flush, so all are durable before the
    // first freeze: one freeze (one generation) covers them all.
    config.writer.wal_flush_interval = Duration::from_millis(200);
    let store = Arc::new(Store::create(config).await.unwrap());
    let before = generations(&store).await;
    let adds: Vec<_> = (0..8)
        .map(|i| {
            let store = store.clone();
            tokio::spawn(async move {
                store
                    .add(&batch(&rows(&format!("c{i}"), "g", 5)))
                    .await
                    .unwrap()
            })
        })
        .collect();
    for add in adds {
        add.await.unwrap();
    }
    assert_eq!(generations(&store).await - before, 1);
    assert_eq!(store.count(None).await.unwrap(), 40);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_wal_write_is_reclaimed_and_retried_once() {
    let (_dir, uri) = temp_uri();
    let store = Store::create(manual(&uri)).await.unwrap();
    store.fail_next_wal_write().unwrap();
    store.add(&batch(&rows("p", "g", 3))).await.unwrap();
    assert_eq!(store.count(None).await.unwrap(), 3);
    store.add(&batch(&rows("q", "g", 2))).await.unwrap();
    let reader = Store::open_read_only(StoreConfig::new(&uri)).await.unwrap();
    assert_eq!(reader.count(None).await.unwrap(), 5);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cleanup_waits_for_a_reader_holding_an_older_snapshot() {
    let (_dir, uri) = temp_uri();
    let mut config = manual(&uri);
    config.merge.cleanup_grace = Duration::from_secs(2);
    let store = Store::create(config).await.unwrap();
    for i in 0..4 {
        store
            .add(&batch(&rows(&format!("s{i}"), "g", 300)))
            .await
            .unwrap();
    }
    // A reader's view: base + the four generations, read slowly.
    let mut stream = store
        .scan_stream(ScanRequest::new().order_by(SortKey::asc("id")))
        .await
        .unwrap();
    let first = stream.next().await.unwrap().unwrap();
    let merged = store.merge().await.unwrap();
    assert_eq!(merged.generations_removed, 0, "inside the grace");
    let mut seen = first.num_rows();
    while let Some(batch) = stream.next().await {
        seen += batch.unwrap().num_rows();
    }
    assert_eq!(seen, 1200, "the reader finished on its snapshot");
}

/// A reader slower than the cleanup grace: its view lists generations that
/// a merge folds into the base and cleanup then removes before the reader
/// reads them. The read is taken again on a fresh view (the base moved on),
/// never answered with a missing file or without those rows.
///
/// With `half_removed`, cleanup is caught half-way through a generation (it
/// removes a generation's files one by one): its manifest is still there,
/// so the reader opens it, and only its data files are gone. The missing
/// file then shows while the plan runs, not while it is made.
async fn a_read_outlived_by_cleanup(half_removed: bool) {
    let (_dir, uri) = temp_uri();
    let writer = Arc::new(Store::create(manual(&uri)).await.unwrap());
    for (r, read) in ["get", "scan", "filtered scan", "count", "filtered count"]
        .into_iter()
        .enumerate()
    {
        for i in 0..3 {
            writer
                .add(&batch(&rows(&format!("s{r}{i}"), "g", 10)))
                .await
                .unwrap();
        }
        let before = writer.count(None).await.unwrap() as usize;
        // A new reader each time: a reader keeps the generations it has
        // opened (and their files) open, so the read that pauses must be the
        // first to open those in its view.
        let reader = Store::open_read_only(config(&uri)).await.unwrap();
        let (reached, resume) = (Arc::new(Notify::new()), Arc::new(Notify::new()));
        reader.pause_next_read(Box::new({
            let (reached, resume) = (reached.clone(), resume.clone());
            move || {
                Box::pin(async move {
                    reached.notify_one();
                    resume.notified().await;
                })
            }
        }));
        let reading = {
            let reader = &reader;
            async move {
                match read {
                    "get" => reader
                        .get(&format!("s{r}1-00003"))
                        .await
                        .map(|r| r.map_or(0, |b| b.num_rows())),
                    "scan" => reader.scan(ScanRequest::new()).await.map(|b| b.num_rows()),
                    "filtered scan" => reader
                        .scan(ScanRequest::new().filter("id >= 's'"))
                        .await
                        .map(|b| b.num_rows()),
                    "filtered count" => reader.count(Some("n >= 0")).await.map(|n| n as usize),
                    _ => reader.count(None).await.map(|n| n as usize),
                }
            }
        };
        let meanwhile = async {
            reached.notified().await;
            // The reader holds a view listing unmerged generations: merge
            // them, then remove them as cleanup would.
            let i = 10 + read.len();
            writer
                .add(&batch(&rows(&format!("t{i}"), "g", 1)))
                .await
                .unwrap();
            writer.merge().await.unwrap();
            if half_removed {
                let removed = remove_generation_data(&uri);
                assert!(removed > 0, "no generation data to remove");
            } else {
                tokio::time::sleep(GRACE * 3).await;
                writer
                    .add(&batch(&rows(&format!("u{i}"), "g", 1)))
                    .await
                    .unwrap();
                let merged = writer.merge().await.unwrap();
                assert!(merged.generations_removed > 0, "{merged:?}");
            }
            resume.notify_one();
        };
        let (got, ()) = tokio::join!(reading, meanwhile);
        let got = got.unwrap_or_else(|e| panic!("{read}: {e}"));
        // Read again on a view taken after the merge: with the rows added
        // meanwhile.
        let added = if half_removed { 1 } else { 2 };
        let expected = if read == "get" { 1 } else { before + added };
        assert_eq!(got, expected, "{read}");
    }
}

/// Remove the data files of every generation of the store at `uri`, leaving
/// their manifests (as cleanup caught half-way would). How many it removed.
fn remove_generation_data(uri: &str) -> usize {
    let mut removed = 0;
    let mut dirs = vec![std::path::PathBuf::from(uri).join("_mem_wal")];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).unwrap().flatten() {
            let path = entry.path();
            if entry.file_type().unwrap().is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "lance")
                && path.parent().is_some_and(|p| p.ends_with("data"))
            {
                std::fs::remove_file(&path).unwrap();
                removed += 1;
            }
        }
    }
    removed
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_outlived_by_cleanup_is_read_again_on_a_fresh_view() {
    a_read_outlived_by_cleanup(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_whose_generations_lost_their_data_meanwhile_is_read_again() {
    a_read_outlived_by_cleanup(true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn short_lived_processes_clean_up_after_the_grace() {
    let (_dir, uri) = temp_uri();
    // Each "process" opens, works, and closes (as every CLI command does).
    for i in 0..3 {
        let store = Store::open_or_create(manual(&uri)).await.unwrap();
        store
            .add(&batch(&rows(&format!("r{i}"), "g", 5)))
            .await
            .unwrap();
        store.merge().await.unwrap();
        store.close().await.unwrap();
    }
    tokio::time::sleep(GRACE * 3).await;
    let store = Store::open(manual(&uri)).await.unwrap();
    store.merge().await.unwrap();
    // Every merged generation is gone, each removed by a later process.
    let shard_dir = std::path::Path::new(&uri)
        .join("_mem_wal")
        .join(store.shard_id().to_string());
    let left: Vec<String> = std::fs::read_dir(&shard_dir)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains("_gen_"))
        .collect();
    assert!(left.is_empty(), "{left:?}");
    assert_eq!(store.count(None).await.unwrap(), 15);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn adds_are_told_busy_when_merges_fall_behind() {
    let (_dir, uri) = temp_uri();
    let mut config = manual(&uri);
    config.merge.max_unmerged_generations = Some(3);
    let store = Store::create(config).await.unwrap();
    for i in 0..3 {
        store
            .add(&batch(&rows(&format!("b{i}"), "g", 2)))
            .await
            .unwrap();
    }
    let err = store.add(&batch(&rows("late", "g", 1))).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Busy, "{err}");
    assert_eq!(store.count(None).await.unwrap(), 6, "nothing written");
    store.merge().await.unwrap();
    store.add(&batch(&rows("late", "g", 1))).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retention_keeps_the_versions_it_promises() {
    let (_dir, uri) = temp_uri();
    let config = manual(&uri).with_retention(RetentionSettings {
        keep_versions: 3,
        keep_for: Duration::ZERO,
        interval: Duration::ZERO,
    });
    let store = Store::create(config).await.unwrap();
    for i in 0..6 {
        store
            .add(&batch(&rows(&format!("v{i}"), "g", 5)))
            .await
            .unwrap();
        store.merge().await.unwrap();
    }
    let stats = store.stats().await.unwrap();
    assert!(stats.versions <= 4, "{stats:?}");
    assert!(stats.bytes_on_disk > 0);
    assert_eq!(store.count(None).await.unwrap(), 30);
}

/// Child entry point for `a_merge_killed_in_a_child_process_loses_nothing`:
/// adds and merges forever, printing `ACK <prefix>` after each add.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "child-process entry point; spawned by the merge-kill test"]
async fn child_merger_entry() {
    let uri = std::env::var("LC_TEST_MERGE_URI").expect("run by the merge-kill test");
    let store = Store::open(manual(&uri)).await.unwrap();
    for i in 0.. {
        let prefix = format!("m{i:04}");
        store
            .add(&batch(&rows(&prefix, "child", 20)))
            .await
            .unwrap();
        println!("ACK {prefix}");
        if i % 2 == 1 {
            store.merge().await.unwrap();
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_merge_killed_in_a_child_process_loses_nothing() {
    let (_dir, uri) = temp_uri();
    Store::create(manual(&uri))
        .await
        .unwrap()
        .close()
        .await
        .unwrap();
    let mut acked: BTreeMap<usize, Vec<String>> = BTreeMap::new();
    for (round, kill_after) in [5usize, 8, 11].into_iter().enumerate() {
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "promises::child_merger_entry",
                "--ignored",
                "--nocapture",
                "--test-threads=1",
            ])
            .env("LC_TEST_MERGE_URI", &uri)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let stdout = BufReader::new(child.stdout.take().unwrap());
        for line in stdout.lines() {
            if let Some(prefix) = line.unwrap().strip_prefix("ACK ") {
                acked.entry(round).or_default().push(prefix.to_string());
                if acked[&round].len() == kill_after {
                    break;
                }
            }
        }
        // Killed mid-add or mid-merge (every other add is followed by one).
        child.kill().unwrap();
        child.wait().unwrap();
        // Each round reuses the prefixes: newest wins, still 20 rows each.
        let store = Store::open(manual(&uri)).await.unwrap();
        let total = store.count(None).await.unwrap();
        for prefix in &acked[&round] {
            let n = store
                .count(Some(&format!("id LIKE '{prefix}-%'")))
                .await
                .unwrap();
            assert_eq!(n, 20, "round {round}: {prefix} after the kill");
        }
        assert_eq!(total % 20, 0, "adds are whole: {total}");
        store.merge().await.unwrap();
        assert_eq!(store.count(None).await.unwrap(), total);
        let scanned = store
            .scan(ScanRequest::new().project(["id"]))
            .await
            .unwrap();
        assert_eq!(scanned.num_rows() as u64, total, "no key twice");
        store.close().await.unwrap();
    }
}

/// The minor point of the takeover review: handle A's merge commits while
/// another handle of the same instance has claimed the shard but A has not
/// noticed (not latched). The merge's data is committed (newest-wins keeps
/// it right); its cleanup's manifest commit under A's old epoch is refused.
/// A must hear the typed fence (`Conflict` kind), not a storage error, and
/// latch.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_merge_whose_owner_was_fenced_meanwhile_says_so() {
    let (_dir, uri) = temp_uri();
    let a = Arc::new(Store::create(manual(&uri)).await.unwrap());
    a.add(&batch(&[Row::new("k1", "v", 1)])).await.unwrap(); // generation 1
    let (reached, resume) = (Arc::new(Notify::new()), Arc::new(Notify::new()));
    let merging = tokio::spawn({
        let a = a.clone();
        let hook = pause_before(1, reached.clone(), resume.clone());
        async move { a.merge_with_hook(hook).await }
    });
    reached.notified().await;
    let b = Store::open(manual(&uri)).await.unwrap(); // same instance: A is fenced
    resume.notify_one();
    let err = merging.await.unwrap().unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Conflict, "{err:?}");
    assert!(err.is_fenced(), "{err:?}");
    assert!(
        a.add(&batch(&[Row::new("x", "v", 1)]))
            .await
            .unwrap_err()
            .is_fenced()
    );
    // What the merge committed is there, and B goes on.
    b.add(&batch(&[Row::new("k2", "v", 2)])).await.unwrap();
    assert_eq!(b.count(None).await.unwrap(), 2);
}
