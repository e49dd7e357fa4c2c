//! Scale-out on the object store: several `lance-context serve` processes,
//! each owning a set of a bucketed store's buckets (`--owns`) and publishing
//! where it is (`--advertise`), serve one store on a loopback S3 server
//! (moto, credentials as storage options). Any instance takes any write:
//! rows of another instance's buckets are sent to their owner; a reader
//! process sees every key once with its newest value; an owner killed with
//! SIGKILL is replaced by a new process, which replays its WAL; merges per
//! bucket leave every key once in the base table, as plain Lance reads it.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use lance_context_client::{Client, ClientError, CreateStore, ListParams, StoreApi};
use serde_json::{Value, json};

use crate::server::ServerProc;
use crate::storage_options::{create_bucket, start_s3};
use crate::support::cli;

/// Keys written: 12,000 in the suite (CI's budget); the 100,000
/// with `LC_SCALEOUT_KEYS=100000` (about 5 minutes in a debug build).
fn keys() -> usize {
    std::env::var("LC_SCALEOUT_KEYS")
        .ok()
        .and_then(|n| n.parse().ok())
        .filter(|n| *n >= 1_000)
        .unwrap_or(12_000)
}

const BATCH: usize = 2_000;

fn s3_options(port: u16) -> Vec<String> {
    [
        format!("aws_endpoint=http://127.0.0.1:{port}"),
        "aws_access_key_id=testing".into(),
        "aws_secret_access_key=testing".into(),
        "aws_region=us-east-1".into(),
        "allow_http=true".into(),
        "aws_virtual_hosted_style_request=false".into(),
    ]
    .into()
}

/// A server owning `owns`, named `name`, advertising its own address.
fn instance(root: &Path, port: u16, name: &str, owns: &str) -> ServerProc {
    let mut args: Vec<String> = vec![
        "--owns".into(),
        owns.into(),
        "--advertise".into(),
        "auto".into(),
        "--instance".into(),
        name.into(),
        "--lease-secs".into(),
        "3".into(),
        "--allow-uri-prefix".into(),
        "s3://lc-scale/".into(),
        "--request-timeout-secs".into(),
        "300".into(),
    ];
    for option in s3_options(port) {
        args.push("--storage-option".into());
        args.push(option);
    }
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    ServerProc::start_logging(root, &args, &root.join(format!("{name}.log")))
}

fn record(i: usize, v: i64) -> Value {
    json!({"id": format!("k{i:06}"), "v": v, "text": format!("row {i} version {v}")})
}

/// Add `records` through `client`, retrying while an owner is not reachable
/// yet (503: its record not published, or its lease not yet run out after a
/// kill) — what a caller does with a 503.
async fn add_retrying(client: &Client, records: &[Value]) -> usize {
    let until = Instant::now() + Duration::from_secs(120);
    loop {
        match client.add("events", records).await {
            Ok(added) => return added.added,
            Err(ClientError::Api { status: 503, error }) if Instant::now() < until => {
                assert!(
                    matches!(error.code.as_str(), "owner_unavailable" | "busy"),
                    "{error:?}"
                );
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
            Err(e) => panic!("{e}"),
        }
    }
}

/// What a reader process (`store export` on the data root, no writer)
/// sees: key → value of `v`, every key once.
fn read_all(root: &Path, port: u16) -> BTreeMap<String, i64> {
    let mut args = vec![
        "store".to_string(),
        "--root".into(),
        root.display().to_string(),
    ];
    for option in s3_options(port) {
        args.push("--storage-option".into());
        args.push(option);
    }
    args.extend([
        "export".into(),
        "events".into(),
        "--columns".into(),
        "id,v".into(),
    ]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let (code, out, err) = cli(root, &args, "");
    assert_eq!(code, 0, "{err}");
    let mut seen = BTreeMap::new();
    for line in out.lines() {
        let row: Value = serde_json::from_str(line).unwrap();
        let id = row["id"].as_str().unwrap().to_string();
        let v = row["v"].as_i64().unwrap();
        assert!(seen.insert(id.clone(), v).is_none(), "{id} read twice");
    }
    seen
}

/// The newest value written of each key: 1 for all, 2 for every 5th, 3
/// for every 10th (after the takeover).
fn expected(i: usize, phase: i64) -> i64 {
    match (phase, i % 10, i % 5) {
        (3, 0, _) => 3,
        (_, _, 0) if phase >= 2 => 2,
        _ => 1,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn instances_route_writes_to_owners_and_a_killed_owner_is_replaced() {
    let began = Instant::now();
    let total = keys();
    let phase = |what: &str| eprintln!("scaleout: {what} at {:.1}s", began.elapsed().as_secs_f64());
    let s3 = start_s3();
    create_bucket(s3.port, "lc-scale");
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let a = instance(root, s3.port, "a", "0-1");
    let b = instance(root, s3.port, "b", "2-3");
    let c = instance(root, s3.port, "c", "4-5");
    let (ca, cb, cc) = (a.client(), b.client(), c.client());
    let spec = json!({"name": "events", "key": "id", "columns": [
        {"name": "id", "type": "Utf8", "nullable": false},
        {"name": "v", "type": "Int64", "nullable": false},
        {"name": "text", "type": "Utf8"}]});
    let mut create = CreateStore::spec("events", spec);
    create.buckets = Some(6);
    create.uri = Some("s3://lc-scale/stores/events".into());
    ca.create_store(&create).await.unwrap();

    // A batch the plugin refuses (row 3: `v` is not a number), spanning
    // every bucket: refused whole with the row named, nothing written.
    let mut bad: Vec<Value> = (0..12).map(|i| record(900_000 + i, 1)).collect();
    bad[3]["v"] = json!("three");
    match cb.add("events", &bad).await {
        Err(ClientError::Api { status, error }) => {
            assert_eq!(status, 400, "{error:?}");
            assert_eq!(error.details["record"], 3, "{error:?}");
        }
        other => panic!("a refused batch was answered {other:?}"),
    }

    // 100k keys, then every 5th again: batches spread over the three
    // instances, two at a time; each instance writes its buckets' rows and
    // sends the rest to their owners.
    let clients = [&ca, &cb, &cc];
    for (phase, keys) in [
        (1_i64, (0..total).collect::<Vec<_>>()),
        (2, (0..total).step_by(5).collect()),
    ] {
        let batches: Vec<Vec<Value>> = keys
            .chunks(BATCH)
            .map(|chunk| chunk.iter().map(|i| record(*i, phase)).collect())
            .collect();
        for pair in batches.chunks(2).enumerate() {
            let (n, pair) = pair;
            let adds = pair.iter().enumerate().map(|(j, batch)| {
                let client = clients[(2 * n + j) % 3];
                async move { add_retrying(client, batch).await }
            });
            let added: usize = futures::future::join_all(adds).await.into_iter().sum();
            assert_eq!(added, pair.iter().map(Vec::len).sum::<usize>());
        }
    }
    phase("written; reading");
    // The refused batch left nothing.
    let seen = read_all(root, s3.port);
    assert_eq!(seen.len(), total, "every key once, no refused row");
    for (i, (id, v)) in seen.iter().enumerate() {
        assert_eq!(
            (id.as_str(), *v),
            (format!("k{i:06}").as_str(), expected(i, 2))
        );
    }
    // Each instance holds only its buckets' shards, and every instance
    // counts the whole store.
    for (client, owned) in [(&ca, vec![0, 1]), (&cb, vec![2, 3]), (&cc, vec![4, 5])] {
        let status = client.stats("events").await.unwrap();
        assert_eq!((status.buckets, status.owned_buckets), (6, owned));
        let counted = client
            .count("events", &Default::default())
            .await
            .unwrap()
            .count;
        assert_eq!(counted, total as u64);
    }

    phase("checked; killing a");
    // a is killed; d takes its buckets (claiming their shards fences a,
    // replays its WAL). Writes of a's buckets through b reach d.
    drop(a);
    let d = instance(root, s3.port, "d", "0-1");
    let cd = d.client();
    let rewrites: Vec<Value> = (0..total).step_by(10).map(|i| record(i, 3)).collect();
    for chunk in rewrites.chunks(BATCH) {
        assert_eq!(add_retrying(&cb, chunk).await, chunk.len());
    }
    phase("rewritten; deleting");
    // Deletes are routed too: 20 keys of every bucket, through c.
    let gone: Vec<String> = (0..20).map(|i| format!("k{:06}", i * 7 + 1)).collect();
    let deleted = cc
        .delete_many(
            "events",
            &gone.iter().map(String::as_str).collect::<Vec<_>>(),
        )
        .await
        .unwrap();
    assert!(deleted.iter().all(|d| d.deleted), "{deleted:?}");
    phase("deleted; reading");
    let seen = read_all(root, s3.port);
    assert_eq!(seen.len(), total - gone.len());
    for i in 0..total {
        let id = format!("k{i:06}");
        match gone.contains(&id) {
            true => assert!(!seen.contains_key(&id), "{id} deleted, still read"),
            false => assert_eq!(seen.get(&id), Some(&expected(i, 3)), "{id}"),
        }
    }

    phase("checked; merging");
    // Merges per bucket, by each owner; then plain Lance reads the base:
    // every key once.
    for client in [&cb, &cc, &cd] {
        client.merge("events").await.unwrap();
    }
    phase("merged; reading the base");
    let mut options = std::collections::HashMap::new();
    for option in s3_options(s3.port) {
        let (k, v) = option.split_once('=').unwrap();
        options.insert(k.to_string(), v.to_string());
    }
    let dataset = lance::dataset::builder::DatasetBuilder::from_uri("s3://lc-scale/stores/events")
        .with_storage_options(options)
        .load()
        .await
        .unwrap();
    let batches: Vec<arrow_array::RecordBatch> = {
        use futures::TryStreamExt;
        let mut scan = dataset.scan();
        scan.project(&["id"]).unwrap();
        scan.try_into_stream()
            .await
            .unwrap()
            .try_collect()
            .await
            .unwrap()
    };
    let mut base = std::collections::BTreeSet::new();
    let mut rows = 0;
    for batch in &batches {
        let ids = batch
            .column(0)
            .as_any()
            .downcast_ref::<arrow_array::StringArray>()
            .unwrap();
        for id in ids.iter().flatten() {
            rows += 1;
            base.insert(id.to_string());
        }
    }
    assert_eq!(
        (rows, base.len()),
        (total - gone.len(), total - gone.len()),
        "every key once in the base table"
    );
    drop((b, c, d));
}

/// The membership records: one per instance, naming its buckets and
/// address; a stopped instance's record is gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn instances_publish_membership_records_with_the_store() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let start = |name: &str, owns: &str| {
        ServerProc::start_logging(
            root,
            &[
                "--owns",
                owns,
                "--advertise",
                "auto",
                "--instance",
                name,
                "--lease-secs",
                "3",
            ],
            &root.join(format!("{name}.log")),
        )
    };
    let a = start("a", "0");
    let b = start("b", "1");
    let spec = json!({"name": "events", "key": "id", "columns": [
        {"name": "id", "type": "Utf8", "nullable": false},
        {"name": "v", "type": "Int64"}]});
    let mut create = CreateStore::spec("events", spec);
    create.buckets = Some(2);
    a.client().create_store(&create).await.unwrap();
    let members = root.join("stores/events/_lance_context/members");
    let read = |name: &str| -> Option<Value> {
        let text = std::fs::read(members.join(format!("{name}.json"))).ok()?;
        Some(serde_json::from_slice(&text).unwrap())
    };
    // b opens the store created through a on its own (within a third of
    // its lease) and publishes its record.
    let until = Instant::now() + Duration::from_secs(30);
    while read("b").is_none() {
        assert!(Instant::now() < until, "b never published");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let record_a = read("a").unwrap();
    assert_eq!(record_a["address"], json!(a.url));
    assert_eq!(record_a["buckets"][0]["bucket"], 0);
    assert_eq!(record_a["buckets_total"], 2);
    assert_eq!(read("b").unwrap()["buckets"][0]["bucket"], 1);
    // Records are renewed.
    let first = record_a["renewed_at_ms"].as_u64().unwrap();
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    assert!(read("a").unwrap()["renewed_at_ms"].as_u64().unwrap() > first);
    // Each takes every key (the other's through it).
    for (i, client) in [a.client(), b.client()].iter().enumerate() {
        let records: Vec<Value> = (0..20)
            .map(|k| json!({"id": format!("k{k}"), "v": i}))
            .collect();
        assert_eq!(client.add("events", &records).await.unwrap().added, 20);
    }
    let page = b
        .client()
        .list(
            "events",
            &ListParams {
                limit: Some(100),
                ..Default::default()
            },
        )
        .await
        .unwrap()
        .records
        .values()
        .unwrap();
    assert_eq!(page.len(), 20);
    assert!(page.iter().all(|r| r["v"] == 1));

    // A record that is not what it says (its instance is not its file's
    // name) is never routed to: b's rows of a's bucket still reach a.
    std::fs::write(
        members.join("mallory.json"),
        serde_json::to_vec(&json!({"format": 1, "instance": "a",
            "address": "http://127.0.0.1:9", "buckets_total": 2,
            "buckets": [{"bucket": 0, "epoch": u64::MAX}],
            "renewed_at_ms": record_a["renewed_at_ms"], "lease_ms": 3_600_000}))
        .unwrap(),
    )
    .unwrap();
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    let records: Vec<Value> = (0..20)
        .map(|k| json!({"id": format!("k{k}"), "v": 2}))
        .collect();
    assert_eq!(b.client().add("events", &records).await.unwrap().added, 20);

    // A record the engine refuses (a key over 1,024 bytes), in either
    // bucket: the request is refused whole, the record named, nothing
    // written anywhere.
    let before = b
        .client()
        .count("events", &Default::default())
        .await
        .unwrap()
        .count;
    let mut records: Vec<Value> = (0..20)
        .map(|k| json!({"id": format!("m{k}"), "v": 3}))
        .collect();
    records[13]["id"] = json!("x".repeat(2_000));
    match b.client().add("events", &records).await {
        Err(ClientError::Api { status: 400, error }) => {
            assert_eq!(error.details["record"], 13, "{error:?}");
        }
        other => panic!("{other:?}"),
    }
    let after = b
        .client()
        .count("events", &Default::default())
        .await
        .unwrap()
        .count;
    assert_eq!(before, after, "a refused request wrote part of itself");

    // A store without buckets is not opened by the instances on their own
    // (its one writer would move between them): a, which created it, keeps
    // writing it after b's rounds.
    let plain = json!({"name": "plain", "key": "id", "columns": [
        {"name": "id", "type": "Utf8", "nullable": false}]});
    a.client()
        .create_store(&CreateStore::spec("plain", plain))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(2_500)).await;
    assert_eq!(
        a.client()
            .add("plain", &[json!({"id": "p1"})])
            .await
            .unwrap()
            .added,
        1
    );

    // A stopped instance leaves: its record is deleted.
    assert!(b.terminate().success());
    assert!(read("b").is_none(), "a stopped instance's record stays");
    // Its bucket has no owner now: once a's view of the records is fresh
    // (at most a second old), a write of it is refused with 503
    // owner_unavailable, naming the bucket, before anything is written.
    tokio::time::sleep(Duration::from_millis(1_200)).await;
    let before = a
        .client()
        .count("events", &Default::default())
        .await
        .unwrap()
        .count;
    match a
        .client()
        .add(
            "events",
            &(0..20)
                .map(|k| json!({"id": format!("n{k}"), "v": 9}))
                .collect::<Vec<_>>(),
        )
        .await
    {
        Err(ClientError::Api { status: 503, error }) => {
            assert_eq!(error.code, "owner_unavailable", "{error:?}");
            assert_eq!(error.details["bucket"], 1, "{error:?}");
        }
        other => panic!("{other:?}"),
    }
    let after = a
        .client()
        .count("events", &Default::default())
        .await
        .unwrap()
        .count;
    assert_eq!(
        after, before,
        "a request with a bucket no one owns writes nothing"
    );
}

/// The membership record's renewal is a conditional write: over the
/// version written last it succeeds, over an older one it is refused (on
/// the S3-compatible server); a local directory has no conditional replace
/// and says so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn notes_are_replaced_only_over_the_version_expected() {
    use lance_context_store::{NoteWrite, Store};
    let s3 = start_s3();
    create_bucket(s3.port, "lc-notes");
    let on_s3 = Store::create(crate::storage_options::s3_config(
        s3.port,
        "s3://lc-notes/n",
    ))
    .await
    .unwrap();
    let NoteWrite::Written(first) = on_s3
        .write_note_if("members/x.json", b"1", None)
        .await
        .unwrap()
    else {
        panic!("a plain write is written");
    };
    let NoteWrite::Written(second) = on_s3
        .write_note_if("members/x.json", b"2", Some(&first))
        .await
        .unwrap()
    else {
        panic!("a write over the version written last is written");
    };
    assert_ne!(first, second);
    assert_eq!(
        on_s3
            .write_note_if("members/x.json", b"3", Some(&first))
            .await
            .unwrap(),
        NoteWrite::Conflict,
        "a write over an older version is refused"
    );
    on_s3
        .write_note_if("members/y.json", b"4", None)
        .await
        .unwrap();
    // Not listed: a file of another name, one over the size given.
    on_s3
        .write_note_if("members/z.txt", b"5", None)
        .await
        .unwrap();
    on_s3
        .write_note_if("members/big.json", &[b'x'; 2048], None)
        .await
        .unwrap();
    let notes = on_s3
        .list_notes("members", ".json", 1 << 10, 100)
        .await
        .unwrap();
    assert_eq!(
        notes,
        vec![
            ("x.json".to_string(), b"2".to_vec()),
            ("y.json".to_string(), b"4".to_vec())
        ]
    );
    on_s3.remove_note("members/x.json").await.unwrap();
    on_s3.remove_note("members/x.json").await.unwrap();
    assert_eq!(
        on_s3
            .list_notes("members", ".json", 1 << 10, 100)
            .await
            .unwrap()
            .len(),
        1
    );
    on_s3.close().await.unwrap();

    let (_dir, uri) = crate::support::temp_uri();
    let local = crate::support::create(&uri).await;
    let NoteWrite::Written(v) = local
        .write_note_if("members/x.json", b"1", None)
        .await
        .unwrap()
    else {
        panic!("written");
    };
    assert!(matches!(
        local
            .write_note_if("members/x.json", b"2", Some(&v))
            .await
            .unwrap(),
        NoteWrite::Unconditional(_)
    ));
    assert_eq!(
        local
            .list_notes("members", ".json", 1 << 10, 100)
            .await
            .unwrap()[0]
            .1,
        b"2".to_vec()
    );
    local.close().await.unwrap();
}
