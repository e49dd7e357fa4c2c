//! Concurrency soak: adds, deletes, reads, vector searches, merges and
//! compactions from many tasks of one process for a bounded time, while a
//! second handle on the same instance keeps taking the shard over (as a
//! second process would) and the first reclaims it. Only documented, typed
//! errors may occur (fenced, a compaction already running, a stale merge,
//! busy); at the end every task's acknowledged writes are read back.
//! `LC_SOAK_SECONDS` lengthens it (default 15).

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use arrow_array::{FixedSizeListArray, Float32Array, Int64Array, RecordBatch, StringArray};
use arrow_schema::{DataType, Field, Schema, SchemaRef};
use lance_context_store::{
    Error, ErrorKind, IndexSettings, Metric, ScanRequest, Store, StoreConfig, VectorColumn,
    VectorIndexKind, VectorQuery,
};

use crate::support::{Lcg, temp_uri};

const DIM: i32 = 4;

fn schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("id", DataType::Utf8, false),
        Field::new("v", DataType::Int64, false),
        Field::new(
            "e",
            DataType::FixedSizeList(Arc::new(Field::new("item", DataType::Float32, true)), DIM),
            true,
        ),
    ]))
}

fn rows(keys: &[String], v: i64) -> RecordBatch {
    let flat: Vec<f32> = keys
        .iter()
        .flat_map(|k| {
            let h = k.bytes().map(u32::from).sum::<u32>() as f32;
            [h % 7.0, h % 11.0, h % 13.0, (v % 17) as f32]
        })
        .collect();
    RecordBatch::try_new(
        schema(),
        vec![
            Arc::new(StringArray::from_iter_values(keys)),
            Arc::new(Int64Array::from(vec![v; keys.len()])),
            Arc::new(
                FixedSizeListArray::try_new(
                    Arc::new(Field::new("item", DataType::Float32, true)),
                    DIM,
                    Arc::new(Float32Array::from(flat)),
                    None,
                )
                .unwrap(),
            ),
        ],
    )
    .unwrap()
}

fn config(uri: &str) -> StoreConfig {
    let mut c = StoreConfig::new(uri)
        .with_schema(schema())
        .with_indexes(IndexSettings {
            vector_columns: vec![VectorColumn {
                column: "e".into(),
                dimension: DIM as usize,
                metric: Metric::L2,
                kind: VectorIndexKind::IvfPq,
            }],
            ..IndexSettings::default()
        });
    c.merge.generation_threshold = Some(6);
    c.merge.quiet_before_merge = Duration::ZERO;
    c.merge.interval = Some(Duration::from_millis(500));
    c.merge.cleanup_grace = Duration::from_millis(300);
    c.compaction.interval = Some(Duration::from_secs(2));
    c
}

/// The documented errors a busy, shared store may answer with.
fn expected(e: &Error) -> bool {
    matches!(e.kind(), ErrorKind::Conflict | ErrorKind::Busy)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_tasks_and_a_second_handle_for_a_bounded_time() {
    let seconds: u64 = std::env::var("LC_SOAK_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(15);
    let (_dir, uri) = temp_uri();
    let store = Arc::new(Store::create(config(&uri)).await.unwrap());
    let stop = Arc::new(AtomicBool::new(false));
    let deadline = Instant::now() + Duration::from_secs(seconds);
    let mut tasks = tokio::task::JoinSet::new();
    // Writers on disjoint key ranges; each keeps its own model.
    for w in 0..4u64 {
        let (store, stop) = (store.clone(), stop.clone());
        tasks.spawn(async move {
            let mut rng = Lcg(w + 1);
            let mut model: HashMap<String, Option<i64>> = HashMap::new();
            let mut pending: HashMap<String, Vec<Option<i64>>> = HashMap::new();
            let mut v = 0i64;
            while !stop.load(Ordering::Relaxed) {
                v += 1;
                let s = &store;
                let keys: Vec<String> = (0..1 + rng.below(20))
                    .map(|_| format!("w{w}-{:03}", rng.below(120)))
                    .collect();
                let mut keys = keys;
                keys.sort();
                keys.dedup();
                let delete = rng.below(5) == 0;
                let result = if delete {
                    let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
                    s.delete(&refs).await.map(drop)
                } else {
                    s.add(&rows(&keys, v)).await.map(drop)
                };
                let effect = if delete { None } else { Some(v) };
                match result {
                    Ok(()) => {
                        for k in &keys {
                            model.insert(k.clone(), effect);
                            pending.remove(k);
                        }
                    }
                    Err(e) if expected(&e) => {
                        // Outcome unknown (e.g. fenced after a durable put).
                        for k in &keys {
                            pending.entry(k.clone()).or_default().push(effect);
                        }
                        if e.is_fenced() {
                            let _ = s.reclaim().await;
                        } else {
                            tokio::time::sleep(Duration::from_millis(20)).await;
                        }
                    }
                    Err(e) => panic!("writer {w}: undocumented error: {e}"),
                }
            }
            (model, pending)
        });
    }
    // Readers: lookups, filtered scans, counts, vector searches.
    for r in 0..2u64 {
        let (store, stop) = (store.clone(), stop.clone());
        tasks.spawn(async move {
            let mut rng = Lcg(100 + r);
            while !stop.load(Ordering::Relaxed) {
                let s = &store;
                let id = format!("w{}-{:03}", rng.below(4), rng.below(120));
                let outcome = match rng.below(4) {
                    0 => s.get(&id).await.map(drop),
                    1 => s
                        .scan(ScanRequest::new().filter("v > 3").limit(20))
                        .await
                        .map(drop),
                    2 => s.count(None).await.map(drop),
                    _ => s
                        .nearest(&VectorQuery::new("e", vec![1.0, 2.0, 3.0, 4.0], 5))
                        .await
                        .map(drop),
                };
                if let Err(e) = outcome {
                    panic!("reader {r}: a read failed: {e}");
                }
            }
            (HashMap::new(), HashMap::new())
        });
    }
    // Maintenance: merges, compactions, a vector index build.
    {
        let (store, stop) = (store.clone(), stop.clone());
        tasks.spawn(async move {
            let mut rng = Lcg(7);
            while !stop.load(Ordering::Relaxed) {
                let s = &store;
                let outcome = match rng.below(4) {
                    0 | 1 => s.merge().await.map(drop),
                    2 => s.compact().await.map(drop),
                    _ => match s.build_vector_index("e").await {
                        Err(Error::InvalidArgument { .. }) => Ok(()), // nothing merged yet
                        other => other,
                    },
                };
                match outcome {
                    Ok(()) => {}
                    Err(e) if expected(&e) || e.kind() == ErrorKind::Unavailable => {}
                    Err(e) => panic!("maintenance: undocumented error: {e}"),
                }
                tokio::time::sleep(Duration::from_millis(50 + rng.below(200))).await;
            }
            (HashMap::new(), HashMap::new())
        });
    }
    // A second handle on the same instance takes the shard over now and
    // then; the first reclaims it on its next fenced write.
    {
        let (uri, stop) = (uri.clone(), stop.clone());
        tasks.spawn(async move {
            let mut rng = Lcg(99);
            while !stop.load(Ordering::Relaxed) {
                tokio::time::sleep(Duration::from_millis(400 + rng.below(800))).await;
                let other = Store::open(config(&uri).with_manual_maintenance())
                    .await
                    .expect("a second handle opens");
                // The first handle may take the shard back meanwhile.
                match other.add(&rows(&["other".to_string()], 1)).await {
                    Ok(_) => {}
                    Err(e) if e.is_fenced() => {}
                    Err(e) => panic!("second handle: undocumented error: {e}"),
                }
                let _ = other.close().await;
            }
            (HashMap::new(), HashMap::new())
        });
    }
    tokio::time::sleep_until(deadline.into()).await;
    stop.store(true, Ordering::Relaxed);
    let mut models = Vec::new();
    while let Some(done) = tasks.join_next().await {
        models.push(done.unwrap());
    }

    // Final check from a fresh writer (replaying whatever was in flight),
    // once the first handle's background maintenance has stopped.
    store.close().await.unwrap();
    let s = Store::open(config(&uri).with_manual_maintenance())
        .await
        .unwrap();
    s.merge().await.unwrap();
    let all = s
        .scan(ScanRequest::new().project(["id", "v"]))
        .await
        .unwrap();
    let ids = all
        .column(0)
        .as_any()
        .downcast_ref::<StringArray>()
        .unwrap();
    let vs = all.column(1).as_any().downcast_ref::<Int64Array>().unwrap();
    let mut seen: HashMap<String, i64> = HashMap::new();
    for i in 0..all.num_rows() {
        assert!(
            seen.insert(ids.value(i).to_string(), vs.value(i)).is_none(),
            "{} twice",
            ids.value(i)
        );
    }
    assert_eq!(s.count(None).await.unwrap(), all.num_rows() as u64);
    let mut checked = 0;
    for (model, pending) in models {
        for (k, acked) in model {
            let actual = seen.get(&k).copied();
            let mut allowed = vec![acked];
            allowed.extend(pending.get(&k).cloned().unwrap_or_default());
            assert!(
                allowed.contains(&actual),
                "{k}: reads {actual:?}, allowed {allowed:?}"
            );
            checked += 1;
        }
    }
    assert!(checked > 100, "the soak wrote too little: {checked} keys");
}
