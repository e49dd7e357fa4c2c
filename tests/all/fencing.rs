//! Two instances claiming one shard: the fenced one gets the typed error, latches,
//! and every row it acknowledged is still there.

use lance_context_store::{Error, ErrorKind, FenceReason, Store, StoreConfig};

use crate::support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_fenced_writer_gets_a_typed_error_and_no_acknowledged_row_is_lost() {
    let (_dir, uri) = temp_uri();
    let first = create(&uri).await;
    first.add(&batch(&rows("first", "g", 10))).await.unwrap();

    // A second process with the same instance id claims the shard.
    let second = Store::open(config(&uri)).await.unwrap();
    assert_eq!(second.shard_id(), first.shard_id());

    let err = first.add(&batch(&rows("lost", "g", 3))).await.unwrap_err();
    assert!(
        matches!(
            err,
            Error::Fenced {
                reason: FenceReason::PeerClaimedEpoch,
                ..
            }
        ),
        "{err:?}"
    );
    assert_eq!(err.kind(), ErrorKind::Conflict);
    // Latched: fails again at once, typed.
    let again = first.add(&batch(&rows("lost2", "g", 1))).await.unwrap_err();
    assert!(again.is_fenced(), "{again:?}");

    // Everything the first writer acknowledged is visible through the new owner.
    for i in 0..10 {
        let id = format!("first-{i:05}");
        assert!(second.get(&id).await.unwrap().is_some(), "{id} lost");
    }
    second.add(&batch(&rows("second", "g", 5))).await.unwrap();
    assert!(second.count(Some("id LIKE 'second%'")).await.unwrap() == 5);
    assert_eq!(second.count(Some("id LIKE 'lost2%'")).await.unwrap(), 0);

    // The rightful owner can take the shard back; then the other one is fenced.
    first.reclaim().await.unwrap();
    first.add(&batch(&rows("back", "g", 2))).await.unwrap();
    let err = second.add(&batch(&rows("late", "g", 1))).await.unwrap_err();
    assert!(err.is_fenced(), "{err:?}");

    let reader = Store::open_read_only(StoreConfig::new(&uri)).await.unwrap();
    for prefix in ["first", "second", "back"] {
        assert!(
            reader
                .count(Some(&format!("id LIKE '{prefix}-%'")))
                .await
                .unwrap()
                > 0,
            "{prefix} rows missing"
        );
    }
    assert_eq!(reader.count(Some("id LIKE 'first-%'")).await.unwrap(), 10);
    assert_eq!(reader.count(Some("id LIKE 'second-%'")).await.unwrap(), 5);
    assert_eq!(reader.count(Some("id LIKE 'back-%'")).await.unwrap(), 2);
}
