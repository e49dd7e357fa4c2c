//! One key, one shard. With the default single-writer policy, a writer that
//! opens takes over every other shard: it fences a writer still on it,
//! replays and merges what it holds, and only then writes — so two instances
//! never write at once, and a key is never read twice.

use lance_context_store::{ShardPolicy, Store, StoreConfig, shard_id_for_instance};

use crate::support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_instance_takes_over_the_first_and_no_key_is_read_twice() {
    let (_dir, uri) = temp_uri();
    let manual = |instance: &str| {
        config(&uri)
            .with_instance_id(instance)
            .with_manual_maintenance()
    };
    let a = Store::create(manual("a")).await.unwrap();
    a.add(&batch(&rows("k", "from-a", 5))).await.unwrap();

    // Nothing unmerged stops the takeover, and a live writer on "a" is fenced.
    let b = Store::open(manual("b")).await.unwrap();
    let status = b.wal_status().await.unwrap();
    assert!(
        status.unmerged_generations.iter().all(|(_, n)| *n == 0),
        "a's shard was merged before b wrote: {status:?}"
    );
    let err = a.add(&batch(&rows("late-a", "g", 1))).await.unwrap_err();
    assert!(err.is_fenced(), "{err:?}");

    // The same keys through b: newest wins, each key once.
    b.add(&batch(&rows("k", "from-b", 5))).await.unwrap();
    assert_eq!(b.count(None).await.unwrap(), 5);
    let reader = Store::open_read_only(StoreConfig::new(&uri)).await.unwrap();
    assert_eq!(reader.count(None).await.unwrap(), 5);
    let row = decode(&reader.get("k-00003").await.unwrap().unwrap());
    assert_eq!(row[0].grp, "from-b");

    // a takes the store back the same way.
    a.reclaim().await.unwrap();
    a.add(&batch(&rows("k", "from-a-again", 5))).await.unwrap();
    assert!(
        b.add(&batch(&rows("x", "g", 1)))
            .await
            .unwrap_err()
            .is_fenced()
    );
    assert_eq!(reader.count(None).await.unwrap(), 5);
    let row = decode(&reader.get("k-00003").await.unwrap().unwrap());
    assert_eq!(row[0].grp, "from-a-again");
    drop((a, b));

    // With partitioned keys (the caller's promise) a second instance writes
    // beside the first; both shards are read.
    let c = Store::open(manual("c").with_shard_policy(ShardPolicy::PartitionedKeys))
        .await
        .unwrap();
    c.add(&batch(&rows("only-c", "from-c", 3))).await.unwrap();
    let d = Store::open(manual("d").with_shard_policy(ShardPolicy::PartitionedKeys))
        .await
        .unwrap();
    d.add(&batch(&rows("only-d", "from-d", 2))).await.unwrap();
    c.add(&batch(&rows("only-c2", "from-c", 1))).await.unwrap();
    assert_eq!(reader.count(None).await.unwrap(), 11);
    let status = reader.wal_status().await.unwrap();
    let shard = |i: &str| shard_id_for_instance(i);
    for instance in ["c", "d"] {
        assert!(
            status
                .unmerged_generations
                .iter()
                .any(|(s, n)| *s == shard(instance) && *n > 0),
            "{instance}: {status:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreplayed_wal_tail_of_another_instance_is_taken_over() {
    use lance::dataset::mem_wal::{DatasetMemWalExt, ShardWriterConfig};
    // A writer of instance "a" made puts durable in its WAL but died before
    // flushing them to a generation (the window inside an add). "b" opening
    // must replay and merge them before it writes, or they would be lost to
    // readers, or read beside b's versions of the same keys.
    let (_dir, uri) = temp_uri();
    let manual = |instance: &str| {
        config(&uri)
            .with_instance_id(instance)
            .with_manual_maintenance()
    };
    Store::create(manual("a"))
        .await
        .unwrap()
        .close()
        .await
        .unwrap();
    let shard = shard_id_for_instance("a");
    let dataset = lance::Dataset::open(&uri).await.unwrap();
    let writer = dataset
        .mem_wal_writer(
            shard,
            ShardWriterConfig::new(shard)
                .with_durable_write(true)
                .with_max_wal_flush_interval(std::time::Duration::from_millis(5)),
        )
        .await
        .unwrap();
    writer
        .put(vec![batch(&rows("tail", "a", 4))])
        .await
        .unwrap();
    writer.abort().await.unwrap(); // the crash: no flush, no freeze

    let b = Store::open(manual("b")).await.unwrap();
    b.add(&batch(&rows("tail", "b", 2))).await.unwrap();
    assert_eq!(b.count(None).await.unwrap(), 4, "each key once");
    let newest = |id: &str| {
        let b = &b;
        let id = id.to_string();
        async move { decode(&b.get(&id).await.unwrap().unwrap())[0].grp.clone() }
    };
    assert_eq!(newest("tail-00001").await, "b");
    assert_eq!(
        newest("tail-00003").await,
        "a",
        "the replayed tail survived"
    );
}

/// The review's sequence: a fenced `a` reclaims while `b` still writes. Until
/// `a` has taken `b`'s shard over, `a` must refuse adds — otherwise both
/// acknowledge writes of one key through two shards, and `b`'s newer value
/// (merged into the base by the takeover) is hidden by `a`'s older one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reclaim_acknowledges_nothing_until_the_other_writer_is_fenced() {
    let (_dir, uri) = temp_uri();
    let manual = |instance: &str| {
        config(&uri)
            .with_instance_id(instance)
            .with_manual_maintenance()
    };
    let a = std::sync::Arc::new(Store::create(manual("a")).await.unwrap());
    a.add(&batch(&[Row::new("K", "v1", 1)])).await.unwrap();
    let b = std::sync::Arc::new(Store::open(manual("b")).await.unwrap());
    assert!(
        a.add(&batch(&[Row::new("K", "v2", 2)]))
            .await
            .unwrap_err()
            .is_fenced()
    );
    let during = std::sync::Arc::new(std::sync::Mutex::new(None));
    let hook: lance_context_store::ReclaimHook = Box::new({
        let (a, b, during) = (a.clone(), b.clone(), during.clone());
        move || {
            Box::pin(async move {
                // a has its shard back but b is still live.
                let by_a = a.add(&batch(&[Row::new("K", "v3", 3)])).await;
                let by_b = b.add(&batch(&[Row::new("K", "v4", 4)])).await;
                *during.lock().unwrap() = Some((by_a.map(|_| ()), by_b.map(|_| ())));
            })
        }
    });
    a.reclaim_with_hook(hook).await.unwrap();
    let (by_a, by_b) = during.lock().unwrap().take().unwrap();
    let err = by_a.expect_err("a acknowledged an add while b could still write");
    assert!(err.is_fenced(), "{err:?}");
    by_b.expect("b was still the writer");
    // b's acknowledged value is the newest, and b is fenced now.
    assert_eq!(decode(&a.get("K").await.unwrap().unwrap())[0].grp, "v4");
    assert!(
        b.add(&batch(&[Row::new("K", "v5", 5)]))
            .await
            .unwrap_err()
            .is_fenced()
    );
    a.add(&batch(&[Row::new("K", "v6", 6)])).await.unwrap();
    let all = a
        .scan(lance_context_store::ScanRequest::new())
        .await
        .unwrap();
    assert_eq!(ids(&all), ["K"]);
    assert_eq!(decode(&all)[0].grp, "v6");
}

/// Several handles opening one instance at once (a restart racing a
/// blue/green deploy, an operator's CLI against a live service): the opener
/// that comes last owns the shard, and no open fails because another claimed
/// it meanwhile — the loser of a claim race tries again. (Seen in the soak: a
/// second handle's open failed `Fenced(PeerClaimedEpoch)` while the first
/// handle reclaimed.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn handles_opening_one_instance_at_once_all_open() {
    let (_dir, uri) = temp_uri();
    let manual = || config(&uri).with_manual_maintenance();
    let first = Store::create(manual()).await.unwrap();
    first.add(&batch(&rows("k", "first", 3))).await.unwrap();
    for round in 0..4 {
        let mut opens = tokio::task::JoinSet::new();
        for _ in 0..4 {
            let config = manual();
            opens.spawn(async move { Store::open(config).await });
        }
        // The first handle reclaims at the same time.
        let reclaimed = first.reclaim().await;
        let mut opened = Vec::new();
        while let Some(done) = opens.join_next().await {
            match done.unwrap() {
                Ok(store) => opened.push(store),
                Err(e) => panic!("round {round}: an open failed: {e:?}"),
            }
        }
        // A reclaim may lose to an open that claimed after it: then it says
        // so (fenced) and can be called again.
        if let Err(e) = reclaimed {
            assert!(e.is_fenced(), "round {round}: the reclaim failed: {e:?}");
        }
        assert_eq!(opened.len(), 4);
        // Whoever owns the shard now writes; nothing acknowledged is lost.
        let mut writers = 0;
        for store in opened.iter().chain([&first]) {
            match store.add(&batch(&rows("k", &format!("r{round}"), 3))).await {
                Ok(_) => writers += 1,
                Err(e) => assert!(e.is_fenced(), "round {round}: {e:?}"),
            }
        }
        assert!(writers >= 1, "round {round}: nobody could write");
        for store in opened {
            let _ = store.close().await;
        }
        first.reclaim().await.unwrap();
    }
    first.add(&batch(&rows("k", "last", 3))).await.unwrap();
    let reader = Store::open_read_only(StoreConfig::new(&uri)).await.unwrap();
    assert_eq!(reader.count(None).await.unwrap(), 3);
    assert_eq!(
        decode(&reader.get("k-00001").await.unwrap().unwrap())[0].grp,
        "last"
    );
}
