//! One key, one shard: the engine refuses to open a writer on a second shard
//! while another shard holds unmerged generations (e.g. a renamed instance).

use lance_context_store::{Error, ErrorKind, ShardPolicy, Store, shard_id_for_instance};

use crate::support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_renamed_instance_is_refused_while_the_old_shard_is_unmerged() {
    let (_dir, uri) = temp_uri();
    let a = Store::create(config(&uri).with_instance_id("a"))
        .await
        .unwrap();
    a.add(&batch(&rows("k", "from-a", 5))).await.unwrap();
    a.close().await.unwrap();
    drop(a);

    let err = Store::open(config(&uri).with_instance_id("b"))
        .await
        .unwrap_err();
    match &err {
        Error::ShardConflict {
            ours,
            other,
            generations,
        } => {
            assert_eq!(*ours, shard_id_for_instance("b"));
            assert_eq!(*other, shard_id_for_instance("a"));
            assert!(*generations >= 1);
        }
        other => panic!("expected ShardConflict, got {other:?}"),
    }
    assert_eq!(err.kind(), ErrorKind::Conflict);

    // The old name still opens, and its rows are there once.
    let a = Store::open(config(&uri).with_instance_id("a"))
        .await
        .unwrap();
    assert_eq!(a.count(None).await.unwrap(), 5);
    a.add(&batch(&rows("k", "again-a", 5))).await.unwrap();
    assert_eq!(
        a.count(None).await.unwrap(),
        5,
        "same keys, same shard: deduped"
    );
    drop(a);

    // With partitioned keys (the caller's promise) a second instance may write
    // disjoint keys; both shards are read.
    let b = Store::open(
        config(&uri)
            .with_instance_id("b")
            .with_shard_policy(ShardPolicy::PartitionedKeys),
    )
    .await
    .unwrap();
    b.add(&batch(&rows("only-b", "from-b", 3))).await.unwrap();
    assert_eq!(b.count(None).await.unwrap(), 8);
    let status = b.wal_status().await.unwrap();
    assert_eq!(status.unmerged_generations.len(), 2, "{status:?}");
}
