//! Vector columns: brute-force search over generations, an IVF index over the
//! base table, and the same top-k as an exact search in memory.

use std::sync::Arc;

use arrow_array::{Array, FixedSizeListArray, Float32Array, RecordBatch, StringArray};
use arrow_schema::{DataType, Field, Schema, SchemaRef};
use lance_context_store::{
    IndexSettings, Metric, Store, StoreConfig, VectorColumn, VectorIndexKind, VectorQuery,
};

use crate::support::{Lcg, temp_uri};

const DIM: i32 = 8;

fn schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("id", DataType::Utf8, false),
        Field::new(
            "embedding",
            DataType::FixedSizeList(Arc::new(Field::new("item", DataType::Float32, true)), DIM),
            true,
        ),
    ]))
}

fn vectors_batch(start: usize, vectors: &[Vec<f32>]) -> RecordBatch {
    let ids: Vec<String> = (start..start + vectors.len())
        .map(|i| format!("v{i:04}"))
        .collect();
    let flat: Vec<f32> = vectors.iter().flatten().copied().collect();
    let embedding = FixedSizeListArray::try_new(
        Arc::new(Field::new("item", DataType::Float32, true)),
        DIM,
        Arc::new(Float32Array::from(flat)),
        None,
    )
    .unwrap();
    RecordBatch::try_new(
        schema(),
        vec![Arc::new(StringArray::from(ids)), Arc::new(embedding)],
    )
    .unwrap()
}

fn config(uri: &str, metric: Metric, kind: VectorIndexKind) -> StoreConfig {
    StoreConfig::new(uri)
        .with_schema(schema())
        .with_manual_maintenance()
        .with_indexes(IndexSettings {
            vector_columns: vec![VectorColumn {
                column: "embedding".into(),
                dimension: DIM as usize,
                metric,
                kind,
            }],
            ..IndexSettings::default()
        })
}

fn distance(metric: Metric, a: &[f32], b: &[f32]) -> f32 {
    match metric {
        Metric::L2 => a.iter().zip(b).map(|(x, y)| (x - y) * (x - y)).sum(),
        Metric::Cosine => {
            let dot: f32 = a.iter().zip(b).map(|(x, y)| x * y).sum();
            let na: f32 = a.iter().map(|x| x * x).sum::<f32>().sqrt();
            let nb: f32 = b.iter().map(|x| x * x).sum::<f32>().sqrt();
            1.0 - dot / (na * nb)
        }
        Metric::Dot => -a.iter().zip(b).map(|(x, y)| x * y).sum::<f32>(),
    }
}

fn brute_force(metric: Metric, all: &[Vec<f32>], query: &[f32], k: usize) -> Vec<String> {
    let mut scored: Vec<(f32, String)> = all
        .iter()
        .enumerate()
        .map(|(i, v)| (distance(metric, v, query), format!("v{i:04}")))
        .collect();
    scored.sort_by(|a, b| a.0.partial_cmp(&b.0).unwrap().then(a.1.cmp(&b.1)));
    scored.into_iter().take(k).map(|(_, id)| id).collect()
}

fn result_ids(batch: &RecordBatch) -> Vec<String> {
    let ids = batch
        .column_by_name("id")
        .unwrap()
        .as_any()
        .downcast_ref::<StringArray>()
        .unwrap();
    (0..ids.len()).map(|i| ids.value(i).to_string()).collect()
}

async fn check(metric: Metric, kind: VectorIndexKind) {
    let (_dir, uri) = temp_uri();
    let store = Store::create(config(&uri, metric, kind)).await.unwrap();
    let mut rng = Lcg(3);
    let all: Vec<Vec<f32>> = (0..400)
        .map(|_| {
            (0..DIM)
                .map(|_| rng.below(1000) as f32 / 100.0 - 5.0)
                .collect()
        })
        .collect();
    for chunk in 0..4 {
        let start = chunk * 100;
        store
            .add(&vectors_batch(start, &all[start..start + 100]))
            .await
            .unwrap();
    }
    let queries: Vec<Vec<f32>> = (0..5)
        .map(|_| {
            (0..DIM)
                .map(|_| rng.below(1000) as f32 / 100.0 - 5.0)
                .collect()
        })
        .collect();
    let search = |q: &Vec<f32>| {
        let mut query = VectorQuery::new("embedding", q.clone(), 10);
        query.nprobes = Some(256);
        query.refine_factor = Some(20);
        query
    };
    // Before any merge: every row is in a generation, searched by brute force.
    for q in &queries {
        let got = result_ids(&store.nearest(&search(q)).await.unwrap());
        assert_eq!(
            got,
            brute_force(metric, &all, q, 10),
            "{metric:?} in generations"
        );
    }
    store.merge().await.unwrap();
    store.build_vector_index("embedding").await.unwrap();
    let stats = store.stats().await.unwrap();
    let index = stats
        .indexes
        .iter()
        .find(|i| i.name == "embedding_idx")
        .expect("vector index");
    assert!(index.covers_all_rows, "{stats:?}");
    for q in &queries {
        let got = result_ids(&store.nearest(&search(q)).await.unwrap());
        assert_eq!(
            got,
            brute_force(metric, &all, q, 10),
            "{metric:?} {kind:?} indexed"
        );
    }
    // New rows after the index: found while in a generation, and after the
    // merge extends the index over them.
    let mut more = all.clone();
    let extra: Vec<Vec<f32>> = (0..50)
        .map(|_| {
            (0..DIM)
                .map(|_| rng.below(1000) as f32 / 100.0 - 5.0)
                .collect()
        })
        .collect();
    store.add(&vectors_batch(400, &extra)).await.unwrap();
    more.extend(extra);
    for q in &queries {
        let got = result_ids(&store.nearest(&search(q)).await.unwrap());
        assert_eq!(
            got,
            brute_force(metric, &more, q, 10),
            "{metric:?} index + generation"
        );
    }
    store.merge().await.unwrap();
    let stats = store.stats().await.unwrap();
    let index = stats
        .indexes
        .iter()
        .find(|i| i.name == "embedding_idx")
        .unwrap();
    assert!(index.covers_all_rows, "kept usable after merge: {stats:?}");
    for q in &queries {
        let got = result_ids(&store.nearest(&search(q)).await.unwrap());
        assert_eq!(
            got,
            brute_force(metric, &more, q, 10),
            "{metric:?} after merge"
        );
    }
    // Compaction keeps the index usable and the answers the same.
    for i in 0..3 {
        let start = 450 + i * 10;
        let extra: Vec<Vec<f32>> = (0..10)
            .map(|_| {
                (0..DIM)
                    .map(|_| rng.below(1000) as f32 / 100.0 - 5.0)
                    .collect()
            })
            .collect();
        store.add(&vectors_batch(start, &extra)).await.unwrap();
        more.extend(extra);
        store.merge().await.unwrap();
    }
    let compacted = store.compact().await.unwrap();
    assert!(compacted.fragments_removed > 1, "{compacted:?}");
    let stats = store.stats().await.unwrap();
    let index = stats
        .indexes
        .iter()
        .find(|i| i.name == "embedding_idx")
        .unwrap();
    assert!(
        index.covers_all_rows,
        "kept usable after compaction: {stats:?}"
    );
    // Remapped to the rows' new places: no fragment-reuse history is left
    // for every later handle to load.
    let fri = lance::Dataset::open(&uri)
        .await
        .unwrap()
        .frag_reuse_index()
        .await
        .unwrap();
    assert_eq!(
        fri.map_or(0, |f| f.details.versions.len()),
        0,
        "{metric:?} {kind:?}: the fragment-reuse history is trimmed"
    );
    for q in &queries {
        let got = result_ids(&store.nearest(&search(q)).await.unwrap());
        assert_eq!(
            got,
            brute_force(metric, &more, q, 10),
            "{metric:?} after compaction"
        );
    }
    // Wrong dimension and undeclared column are typed errors.
    let err = store
        .nearest(&VectorQuery::new("embedding", vec![0.0; 3], 1))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), lance_context_store::ErrorKind::InvalidInput);
    let err = store
        .nearest(&VectorQuery::new("id", vec![0.0; 8], 1))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), lance_context_store::ErrorKind::InvalidInput);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ivf_pq_l2_top_k_matches_brute_force() {
    check(Metric::L2, VectorIndexKind::IvfPq).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ivf_sq_cosine_top_k_matches_brute_force() {
    check(Metric::Cosine, VectorIndexKind::IvfSq).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ivf_hnsw_cosine_top_k_matches_brute_force() {
    check(Metric::Cosine, VectorIndexKind::IvfHnswPq).await;
}

/// With few partitions probed, the base side returns fewer candidates; rows
/// rewritten or deleted in unmerged generations must never be returned with
/// their old vectors, and the k results must still be k when enough exist.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn search_with_few_probes_skips_rows_rewritten_or_deleted_since_the_base() {
    let (_dir, uri) = temp_uri();
    let store = Store::create(config(&uri, Metric::L2, VectorIndexKind::IvfPq))
        .await
        .unwrap();
    let mut rng = Lcg(9);
    let all: Vec<Vec<f32>> = (0..400)
        .map(|_| {
            (0..DIM)
                .map(|_| rng.below(1000) as f32 / 100.0 - 5.0)
                .collect()
        })
        .collect();
    store.add(&vectors_batch(0, &all)).await.unwrap();
    store.merge().await.unwrap();
    store.build_vector_index("embedding").await.unwrap();
    // The query sits on v0007's vector; v0007 then moves far away (rewritten
    // in a generation) and v0011 is deleted.
    let query = all[7].clone();
    let far = vec![1000.0; DIM as usize];
    store.add(&vectors_batch(7, &[far])).await.unwrap();
    store.delete(&["v0011"]).await.unwrap();
    let mut search = VectorQuery::new("embedding", query.clone(), 10);
    search.nprobes = Some(1); // far fewer than the ~20 partitions
    let got = result_ids(&store.nearest(&search).await.unwrap());
    assert_eq!(got.len(), 10, "{got:?}");
    assert!(
        !got.contains(&"v0011".to_string()),
        "a deleted row: {got:?}"
    );
    if let Some(at) = got.iter().position(|id| id == "v0007") {
        assert_eq!(at, 9, "v0007 is far now, never near the top: {got:?}");
    }
    // With every partition probed the answer is exact over what is live.
    search.nprobes = Some(256);
    search.refine_factor = Some(20);
    let mut live = all.clone();
    live[7] = vec![1000.0; DIM as usize];
    let mut exact = brute_force(Metric::L2, &live, &query, 11);
    exact.retain(|id| id != "v0011");
    exact.truncate(10);
    assert_eq!(result_ids(&store.nearest(&search).await.unwrap()), exact);
}

/// Generation directories of every shard (`<shard>/<generation>`).
fn generation_dirs(dir: &std::path::Path) -> std::collections::BTreeSet<std::path::PathBuf> {
    let mut found = std::collections::BTreeSet::new();
    for shard in std::fs::read_dir(dir.join("store/_mem_wal")).unwrap() {
        for entry in std::fs::read_dir(shard.unwrap().path()).unwrap() {
            let path = entry.unwrap().path();
            if path.to_string_lossy().contains("_gen_") {
                found.insert(path);
            }
        }
    }
    found
}

/// The MemWAL writers keep no table index in memory: a vector index (or a
/// key's) is not rebuilt on every add and written into every generation, as
/// it was when the MemWAL kept every index of the table (or the key index).
/// A store made that way (by an earlier build) is narrowed when it opens,
/// and search still sees the new rows exactly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writers_keep_no_table_index_in_memory() {
    use lance::dataset::mem_wal::DatasetMemWalExt;
    let (dir, uri) = temp_uri();
    let store = Store::create(config(&uri, Metric::L2, VectorIndexKind::IvfPq))
        .await
        .unwrap();
    let mut rng = Lcg(11);
    let mut all: Vec<Vec<f32>> = (0..600)
        .map(|_| {
            (0..DIM)
                .map(|_| rng.below(1000) as f32 / 100.0 - 5.0)
                .collect()
        })
        .collect();
    store.add(&vectors_batch(0, &all[..500])).await.unwrap();
    store.merge().await.unwrap();
    store.build_vector_index("embedding").await.unwrap();
    store.close().await.unwrap();
    drop(store);
    // As an earlier build left it: the MemWAL keeps every index.
    let mut dataset = lance::Dataset::open(&uri).await.unwrap();
    dataset
        .update_mem_wal_maintained_indexes(None)
        .await
        .unwrap();
    let store = Store::open(config(&uri, Metric::L2, VectorIndexKind::IvfPq))
        .await
        .unwrap();
    let details = lance::Dataset::open(&uri)
        .await
        .unwrap()
        .mem_wal_index_details()
        .await
        .unwrap()
        .unwrap();
    assert!(!details.maintain_all_indexes, "{details:?}");
    // The store-wide set keeps the key index (for writers of earlier
    // builds); this build's writer keeps no table index in its memtables.
    assert_eq!(details.maintained_indexes, vec!["id_idx".to_string()]);
    let before = generation_dirs(dir.path());
    store.add(&vectors_batch(500, &all[500..])).await.unwrap();
    let new: Vec<_> = generation_dirs(dir.path())
        .difference(&before)
        .cloned()
        .collect();
    assert_eq!(new.len(), 1, "{new:?}");
    assert!(
        !new[0].join("_indices").exists(),
        "no table index in {:?}",
        new[0]
    );
    assert!(new[0].join("_pk_index").is_dir(), "the key sidecar");
    // A row of the new generation rewritten, then the search: exact over
    // what is live, the unmerged rows included.
    all[550] = all[3].clone();
    store
        .add(&vectors_batch(550, &all[550..551]))
        .await
        .unwrap();
    let mut search = VectorQuery::new("embedding", all[3].clone(), 10);
    search.nprobes = Some(256);
    search.refine_factor = Some(20);
    assert_eq!(
        result_ids(&store.nearest(&search).await.unwrap()),
        brute_force(Metric::L2, &all, &all[3], 10)
    );
    assert_eq!(store.count(None).await.unwrap(), 600);
}

/// The `_distance` values of a search result.
fn distances(batch: &RecordBatch) -> Vec<Option<f32>> {
    let d = batch
        .column_by_name("_distance")
        .unwrap()
        .as_any()
        .downcast_ref::<Float32Array>()
        .unwrap();
    (0..d.len())
        .map(|i| d.is_valid(i).then(|| d.value(i)))
        .collect()
}

/// A query vector or a stored one whose distances would overflow Float32
/// (an element not finite, or a sum of squares past the engine's bound) is
/// refused with a typed invalid-input error; before, a query element of
/// 3.4e38 answered with infinite distances (null in JSON).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vectors_whose_distances_would_overflow_are_refused() {
    use lance_context_store::{BatchProblem, ErrorKind, VectorProblem};
    for metric in [Metric::L2, Metric::Cosine, Metric::Dot] {
        let (_dir, uri) = temp_uri();
        let store = Store::create(config(&uri, metric, VectorIndexKind::IvfPq))
            .await
            .unwrap();
        let stored: Vec<Vec<f32>> = (0..6)
            .map(|i| {
                (0..DIM)
                    .map(|j| (i * DIM + j) as f32 / 10.0 - 2.0)
                    .collect()
            })
            .collect();
        store.add(&vectors_batch(0, &stored[..3])).await.unwrap();
        store.merge().await.unwrap();
        store.add(&vectors_batch(3, &stored[3..])).await.unwrap();

        let mut huge = vec![0.5; DIM as usize];
        huge[2] = 3.4e38;
        for (query, element) in [
            (huge.clone(), 2),
            (vec![f32::NAN; DIM as usize], 0),
            (
                {
                    let mut v = vec![1.0; DIM as usize];
                    v[5] = f32::INFINITY;
                    v
                },
                5,
            ),
            (
                {
                    // Finite, its square too, but its distances overflow.
                    let mut v = vec![1.0; DIM as usize];
                    v[7] = 1e19;
                    v
                },
                7,
            ),
        ] {
            let err = store
                .nearest(&VectorQuery::new("embedding", query.clone(), 3))
                .await
                .expect_err(&format!("{metric:?}: {query:?} was searched"));
            assert_eq!(err.kind(), ErrorKind::InvalidInput, "{err}");
            assert!(
                err.to_string().contains(&format!("element {element}")),
                "{err}"
            );
        }
        // A zero vector has no cosine distance (NaN); under the other
        // metrics it is a vector like any other.
        let zero = store
            .nearest(&VectorQuery::new("embedding", vec![0.0; DIM as usize], 3))
            .await;
        match metric {
            Metric::Cosine => {
                let err = zero.unwrap_err();
                assert_eq!(err.kind(), ErrorKind::InvalidInput, "{err}");
                assert!(err.to_string().contains("zero"), "{err}");
            }
            _ => assert_eq!(zero.unwrap().num_rows(), 3),
        }
        // Large but within the bound: every distance finite.
        let mut large = vec![0.25; DIM as usize];
        large[1] = 1e18;
        let found = store
            .nearest(&VectorQuery::new("embedding", large, 6))
            .await
            .unwrap();
        assert_eq!(found.num_rows(), 6);
        assert!(
            distances(&found)
                .iter()
                .all(|d| d.is_some_and(f32::is_finite)),
            "{metric:?}: {:?}",
            distances(&found)
        );

        // Stored vectors: the first bad row is named, nothing is written.
        let mut bad = stored[..3].to_vec();
        bad[1][4] = f32::MAX;
        let err = store.add(&vectors_batch(10, &bad)).await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidInput, "{err}");
        assert_eq!(
            err.batch_problem(),
            Some(&BatchProblem::BadVector {
                column: "embedding".into(),
                row: 1,
                problem: VectorProblem::TooLarge { element: 4 },
            }),
            "{err}"
        );
        bad[1][4] = 0.0;
        bad[2][0] = f32::NEG_INFINITY;
        let err = store.add(&vectors_batch(10, &bad)).await.unwrap_err();
        assert_eq!(
            err.batch_problem(),
            Some(&BatchProblem::BadVector {
                column: "embedding".into(),
                row: 2,
                problem: VectorProblem::NotFinite { element: 0 },
            }),
            "{err}"
        );
        bad[2][0] = 0.0;
        bad[0] = vec![0.0; DIM as usize];
        let zero = store.add(&vectors_batch(10, &bad)).await;
        match metric {
            Metric::Cosine => assert_eq!(
                zero.unwrap_err().batch_problem(),
                Some(&BatchProblem::BadVector {
                    column: "embedding".into(),
                    row: 0,
                    problem: VectorProblem::ZeroUnderCosine,
                }),
            ),
            _ => {
                zero.unwrap();
                store.delete(&["v0010", "v0011", "v0012"]).await.unwrap();
            }
        }
        assert_eq!(store.count(None).await.unwrap(), 6, "nothing written");
    }
}
