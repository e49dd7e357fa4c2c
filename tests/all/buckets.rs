//! Bucket sharding (scale-out): a store created with buckets is written by
//! several instances at once, each owning a set of buckets; a key always
//! goes through its bucket's shard, whichever instance writes it, so no key
//! is read twice; taking a bucket over fences its old owner and keeps what
//! it acknowledged; a merge per bucket leaves every key once in the base.

use std::collections::{BTreeMap, BTreeSet};

use lance::dataset::mem_wal::{DatasetMemWalExt, evaluate_sharding_spec};
use lance_context_store::{
    Error, ErrorKind, RecordCapabilities, ScanRequest, Store, StoreConfig, bucket_instance_id,
    parse_buckets, shard_id_for_instance,
};

use crate::support::*;

const BUCKETS: u32 = 4;

fn owning(uri: &str, owned: &[u32]) -> StoreConfig {
    config(uri)
        .with_buckets(BUCKETS)
        .with_owned_buckets(Some(owned.to_vec()))
        .with_manual_maintenance()
}

/// Each key's bucket as Lance itself evaluates the dataset's recorded spec
/// (not through the engine).
async fn lance_buckets(uri: &str, keys: &[Row]) -> Vec<u32> {
    let dataset = lance::Dataset::open(uri).await.unwrap();
    let details = dataset.mem_wal_index_details().await.unwrap().unwrap();
    let spec = &details.sharding_specs[0];
    assert_eq!(spec.fields[0].transform.as_deref(), Some("bucket"));
    assert_eq!(
        spec.fields[0]
            .parameters
            .get("num_buckets")
            .map(String::as_str),
        Some("4")
    );
    let evaluated = evaluate_sharding_spec(&batch(keys), spec, dataset.schema()).unwrap();
    let column = evaluated
        .column(0)
        .as_any()
        .downcast_ref::<arrow_array::Int32Array>()
        .unwrap();
    column.values().iter().map(|b| *b as u32).collect()
}

async fn all_rows(store: &Store) -> Vec<Row> {
    decode(&store.scan(ScanRequest::default()).await.unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn instances_owning_disjoint_buckets_write_at_once_and_no_key_is_read_twice() {
    let (_dir, uri) = temp_uri();
    let a = Store::create(owning(&uri, &[0, 1])).await.unwrap();
    let b = Store::open(owning(&uri, &[2, 3])).await.unwrap();
    assert_eq!(a.bucket_count(), Some(BUCKETS));
    assert_eq!(a.owned_buckets(), vec![0, 1]);
    assert_eq!(b.owned_buckets(), vec![2, 3]);
    assert!(!a.is_read_only() && !b.is_read_only());

    let keys = rows("k", "v1", 60);
    let expected = lance_buckets(&uri, &keys).await;
    let mut per_bucket: BTreeMap<u32, usize> = BTreeMap::new();
    for bucket in &expected {
        *per_bucket.entry(*bucket).or_default() += 1;
    }
    assert_eq!(
        per_bucket.len(),
        4,
        "60 keys fill every bucket: {per_bucket:?}"
    );

    // The whole batch through a: refused at the first row of b's buckets,
    // naming the bucket Lance gives it; nothing written.
    let first_foreign = expected.iter().position(|b| *b >= 2).unwrap();
    match a.add(&batch(&keys)).await.unwrap_err() {
        Error::NotOwner {
            row,
            key,
            bucket,
            buckets,
            owned,
        } => {
            assert_eq!(row, first_foreign);
            assert_eq!(key, keys[first_foreign].id);
            assert_eq!(bucket, expected[first_foreign]);
            assert_eq!(buckets, BUCKETS);
            assert_eq!(owned, vec![0, 1]);
        }
        other => panic!("expected NotOwner, got {other:?}"),
    }
    assert_eq!(
        a.count(None).await.unwrap(),
        0,
        "a refused add wrote nothing"
    );
    assert_eq!(
        Error::NotOwner {
            row: 0,
            key: String::new(),
            bucket: 2,
            buckets: 4,
            owned: vec![0, 1, 3],
        }
        .kind(),
        ErrorKind::Conflict
    );

    // Each instance writes its own keys, both at once; then rewrites them.
    for version in ["v1", "v2"] {
        let mine = |lo: u32, hi: u32| -> Vec<Row> {
            keys.iter()
                .zip(&expected)
                .filter(|(_, b)| (lo..=hi).contains(*b))
                .map(|(r, _)| Row::new(&r.id, version, r.n))
                .collect()
        };
        let (of_a, of_b) = (batch(&mine(0, 1)), batch(&mine(2, 3)));
        let (ra, rb) = tokio::join!(a.add(&of_a), b.add(&of_b));
        assert_eq!(ra.unwrap().rows + rb.unwrap().rows, 60);
    }

    // Any reader, including a plain read-only one: every key once, newest.
    let reader = Store::open_read_only(StoreConfig::new(&uri)).await.unwrap();
    for store in [&a, &b, &reader] {
        assert_eq!(store.count(None).await.unwrap(), 60);
        let rows = all_rows(store).await;
        let distinct: BTreeSet<&str> = rows.iter().map(|r| r.id.as_str()).collect();
        assert_eq!((rows.len(), distinct.len()), (60, 60));
        assert!(rows.iter().all(|r| r.grp == "v2"), "newest wins");
    }
    let key = &keys[first_foreign].id;
    assert_eq!(decode(&a.get(key).await.unwrap().unwrap())[0].grp, "v2");

    // The rows sit in their buckets' shards and nowhere else.
    let status = reader.wal_status().await.unwrap();
    let bucket_shards: BTreeMap<_, u32> = (0..BUCKETS)
        .map(|b| (shard_id_for_instance(&bucket_instance_id(b)), b))
        .collect();
    for (shard, generations) in &status.unmerged_generations {
        if *generations > 0 {
            assert!(bucket_shards.contains_key(shard), "{status:?}");
        }
    }
    let busy: BTreeSet<u32> = status
        .unmerged_generations
        .iter()
        .filter(|(_, n)| *n > 0)
        .filter_map(|(s, _)| bucket_shards.get(s).copied())
        .collect();
    assert_eq!(busy, (0..BUCKETS).collect());

    // A delete is routed the same way: b cannot delete a's keys.
    let of_a = keys
        .iter()
        .zip(&expected)
        .find(|(_, b)| **b < 2)
        .map(|(r, _)| r.id.clone())
        .unwrap();
    let err = b.delete(&[of_a.as_str()]).await.unwrap_err();
    assert!(
        matches!(err, Error::NotOwner { bucket, .. } if bucket < 2),
        "{err:?}"
    );
    a.delete(&[of_a.as_str()]).await.unwrap();
    assert_eq!(reader.count(None).await.unwrap(), 59);

    // Stats name the buckets.
    let stats = a.stats().await.unwrap();
    assert_eq!(
        (stats.buckets, stats.owned_buckets.clone()),
        (4, vec![0, 1])
    );
    let read = reader.stats().await.unwrap();
    assert_eq!(
        (read.buckets, read.owned_buckets),
        (4, vec![]),
        "a read-only handle knows the buckets and writes none"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bucket_taken_over_fences_its_owner_and_keeps_what_it_acknowledged() {
    let (_dir, uri) = temp_uri();
    let a = Store::create(owning(&uri, &[0, 1])).await.unwrap();
    let b = Store::open(owning(&uri, &[2, 3])).await.unwrap();
    let keys = rows("t", "from-owner", 40);
    let expected = lance_buckets(&uri, &keys).await;
    let split = |lo: u32, hi: u32, grp: &str| -> Vec<Row> {
        keys.iter()
            .zip(&expected)
            .filter(|(_, b)| (lo..=hi).contains(*b))
            .map(|(r, _)| Row::new(&r.id, grp, r.n))
            .collect()
    };
    a.add(&batch(&split(0, 1, "from-a"))).await.unwrap();
    b.add(&batch(&split(2, 3, "from-b"))).await.unwrap();

    // c takes a's buckets (a restart elsewhere, a rebalance): a is fenced,
    // b goes on, and c reads and rewrites what a acknowledged.
    let c = Store::open(owning(&uri, &[0, 1])).await.unwrap();
    let err = a.add(&batch(&split(0, 1, "late-a"))).await.unwrap_err();
    assert!(err.is_fenced(), "{err:?}");
    b.add(&batch(&split(2, 3, "from-b-2"))).await.unwrap();
    assert_eq!(c.count(None).await.unwrap(), 40);
    let rows = all_rows(&c).await;
    assert_eq!(
        rows.iter().filter(|r| r.grp == "from-a").count(),
        split(0, 1, "").len(),
        "a's acknowledged rows survive the takeover"
    );
    c.add(&batch(&split(0, 1, "from-c"))).await.unwrap();

    // A merge per bucket, each owner its own, then plain Lance reads the
    // base: every key once, newest value.
    let merged_c = c.merge().await.unwrap();
    let merged_b = b.merge().await.unwrap();
    assert!(merged_c.generations_merged >= 2, "{merged_c:?}");
    assert!(merged_b.generations_merged >= 2, "{merged_b:?}");
    let base: Vec<Row> = base_table(&uri, &["id", "grp"])
        .await
        .iter()
        .flat_map(decode)
        .collect();
    let mut seen: BTreeMap<String, String> = BTreeMap::new();
    for row in &base {
        assert!(
            seen.insert(row.id.clone(), row.grp.clone()).is_none(),
            "{} twice in the base",
            row.id
        );
    }
    assert_eq!(seen.len(), 40);
    for (key, bucket) in keys.iter().zip(&expected) {
        let want = if *bucket < 2 { "from-c" } else { "from-b-2" };
        assert_eq!(seen[&key.id], want, "{}", key.id);
    }
    assert_eq!(c.count(None).await.unwrap(), 40);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bucket_settings_are_checked() {
    let (_dir, uri) = temp_uri();
    let invalid = |r: lance_context_store::Result<Store>| match r {
        Err(e) => assert_eq!(e.kind(), ErrorKind::InvalidInput, "{e}"),
        Ok(_) => panic!("accepted"),
    };
    invalid(Store::create(config(&uri).with_buckets(0)).await);
    invalid(Store::create(config(&uri).with_buckets(1025)).await);
    invalid(
        Store::create(
            config(&uri)
                .with_buckets(4)
                .with_capabilities(RecordCapabilities {
                    tombstones: true,
                    ..RecordCapabilities::default()
                }),
        )
        .await,
    );
    assert_eq!(
        Store::probe(&config(&uri)).await.unwrap(),
        lance_context_store::Location::Empty,
        "a refused create writes nothing"
    );

    let store = Store::create(config(&uri).with_buckets(4).with_manual_maintenance())
        .await
        .unwrap();
    assert_eq!(store.owned_buckets(), vec![0, 1, 2, 3], "all by default");
    store.close().await.unwrap();
    invalid(Store::open(config(&uri).with_buckets(8)).await);
    // Buckets beyond the count are ignored; owning none reads only and
    // refuses every add.
    let none = Store::open(
        config(&uri)
            .with_owned_buckets(Some(vec![9, 10]))
            .with_manual_maintenance(),
    )
    .await
    .unwrap();
    assert!(none.is_read_only());
    let err = none.add(&batch(&rows("x", "g", 1))).await.unwrap_err();
    assert!(matches!(err, Error::NotOwner { row: 0, .. }), "{err:?}");
    assert!(
        err.to_string().contains("it owns none"),
        "the message says what is owned: {err}"
    );

    // A store without buckets refuses a count, and ignores an owned list.
    let (_dir2, plain) = temp_uri();
    create(&plain).await.close().await.unwrap();
    invalid(Store::open(config(&plain).with_buckets(4)).await);
    let p = Store::open(config(&plain).with_owned_buckets(Some(vec![1])))
        .await
        .unwrap();
    p.add(&batch(&rows("p", "g", 3))).await.unwrap();
    assert_eq!(p.bucket_count(), None);
}

#[test]
fn bucket_sets_parse_as_operators_write_them() {
    assert_eq!(
        parse_buckets("0-3,8,10-11").unwrap(),
        vec![0, 1, 2, 3, 8, 10, 11]
    );
    assert_eq!(parse_buckets("5").unwrap(), vec![5]);
    assert_eq!(parse_buckets("3,1-2,2").unwrap(), vec![1, 2, 3]);
    for bad in ["", "1,,2", "3-1", "a", "0-1024", "-1", "1-"] {
        assert!(parse_buckets(bad).is_err(), "{bad:?} accepted");
    }
}

/// A record sent to whichever server owns its bucket: `first`, else (409
/// `not_owner`) `second`. Which one took it.
async fn add_routed(
    first: &lance_context_client::Client,
    second: &lance_context_client::Client,
    record: &serde_json::Value,
) -> usize {
    use lance_context_client::{ClientError, StoreApi};
    match first.add("events", std::slice::from_ref(record)).await {
        Ok(added) => {
            assert_eq!(added.added, 1);
            0
        }
        Err(ClientError::Api { status, error }) => {
            assert_eq!(
                (status, error.code.as_str()),
                (409, "not_owner"),
                "{error:?}"
            );
            assert_eq!(error.details["record"], 0);
            assert_eq!(error.details["key"], record["id"]);
            assert!(error.details["bucket"].as_u64().unwrap() >= 2, "{error:?}");
            assert_eq!(error.details["owned"], serde_json::json!([0, 1]));
            assert_eq!(
                second
                    .add("events", std::slice::from_ref(record))
                    .await
                    .unwrap()
                    .added,
                1
            );
            1
        }
        Err(e) => panic!("{e}"),
    }
}

/// Every record of the `events` store, through a server.
async fn every_event(c: &lance_context_client::Client) -> Vec<serde_json::Value> {
    use lance_context_client::{ListParams, StoreApi};
    let every = ListParams {
        limit: Some(1000),
        ..ListParams::default()
    };
    c.list("events", &every)
        .await
        .unwrap()
        .records
        .values()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn servers_owning_disjoint_buckets_serve_one_store_and_a_killed_one_is_replaced() {
    use crate::server::ServerProc;
    use lance_context_client::{CreateStore, StoreApi};
    use serde_json::json;

    let dir = tempfile::tempdir().unwrap();
    let a = ServerProc::start(dir.path(), &["--owns", "0-1"]);
    let b = ServerProc::start(dir.path(), &["--owns", "2-3"]);
    let (ca, cb) = (a.client(), b.client());
    let spec = json!({"name": "events", "key": "id", "columns": [
        {"name": "id", "type": "Utf8", "nullable": false},
        {"name": "v", "type": "Int64"}]});
    let mut create = CreateStore::spec("events", spec);
    create.buckets = Some(BUCKETS);
    ca.create_store(&create).await.unwrap();

    // Every record through a first; b takes those of its buckets. Twice,
    // the second time with newer values.
    let mut owner = Vec::new();
    for version in [1, 2] {
        owner.clear();
        for i in 0..40 {
            let record = json!({"id": format!("e{i:03}"), "v": version});
            owner.push(add_routed(&ca, &cb, &record).await);
        }
    }
    assert!(owner.contains(&0) && owner.contains(&1), "{owner:?}");
    for c in [&ca, &cb] {
        let rows = every_event(c).await;
        assert_eq!(rows.len(), 40, "each key once");
        assert!(rows.iter().all(|r| r["v"] == 2), "newest wins");
    }
    let status = cb.stats("events").await.unwrap();
    assert_eq!((status.buckets, status.owned_buckets), (4, vec![2, 3]));

    // a dies; c takes its buckets: what a acknowledged is there, and the
    // buckets are written again through c while b goes on.
    drop(a);
    let c = ServerProc::start(dir.path(), &["--owns", "0-1"]);
    let cc = c.client();
    let rows = every_event(&cc).await;
    assert_eq!(rows.len(), 40);
    assert!(rows.iter().all(|r| r["v"] == 2));
    for (i, owned_by) in owner.iter().enumerate() {
        let record = json!({"id": format!("e{i:03}"), "v": 3});
        assert_eq!(add_routed(&cc, &cb, &record).await, *owned_by);
    }
    cc.merge("events").await.unwrap();
    cb.merge("events").await.unwrap();
    let rows = every_event(&cb).await;
    assert_eq!(rows.len(), 40);
    assert!(rows.iter().all(|r| r["v"] == 3));
    let base: Vec<String> =
        crate::support::base_table(&dir.path().join("stores/events").to_string_lossy(), &["id"])
            .await
            .iter()
            .flat_map(|b| {
                let ids = b
                    .column(0)
                    .as_any()
                    .downcast_ref::<arrow_array::StringArray>()
                    .unwrap();
                ids.iter()
                    .map(|s| s.unwrap().to_string())
                    .collect::<Vec<_>>()
            })
            .collect();
    let distinct: BTreeSet<&String> = base.iter().collect();
    assert_eq!(
        (base.len(), distinct.len()),
        (40, 40),
        "every key once in the base"
    );
}
