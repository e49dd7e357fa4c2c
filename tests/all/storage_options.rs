//! Storage options reach every open: a store on a real S3-compatible server on
//! loopback (moto), reachable *only* through the endpoint and credentials given
//! as storage options. Create, add (writer + generation flush), point lookup and
//! scan (generation opens), a second instance's open and WAL replay, a reclaim,
//! and a reader's refresh after another instance commits all have to find the
//! server through the options; any path that dropped them would go to AWS, which
//! this machine cannot reach, and fail.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use lance_context_store::{Store, StoreConfig};

use crate::support::*;

pub(crate) struct S3Server {
    child: Child,
    pub(crate) port: u16,
}

impl Drop for S3Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Start moto's S3 server on a free loopback port. The test suite's setup
/// (`make test-deps`) installs it; its absence is a failure, not a skip.
pub(crate) fn start_s3() -> S3Server {
    let port = free_port();
    let child = Command::new("python3")
        .args([
            "-m",
            "moto.server",
            "-H",
            "127.0.0.1",
            "-p",
            &port.to_string(),
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("python3 with moto[server] is required (make test-deps installs it)");
    let server = S3Server { child, port };
    let deadline = Instant::now() + Duration::from_secs(30);
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            Instant::now() < deadline,
            "moto did not start on port {port}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    server
}

/// Create a bucket with a plain HTTP request.
pub(crate) fn create_bucket(port: u16, bucket: &str) {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).unwrap();
    write!(
        stream,
        "PUT /{bucket} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    assert!(response.starts_with("HTTP/1.1 200"), "{response}");
}

pub(crate) fn s3_config(port: u16, uri: &str) -> StoreConfig {
    config(uri)
        .with_storage_option("aws_endpoint", format!("http://127.0.0.1:{port}"))
        .with_storage_option("aws_access_key_id", "testing")
        .with_storage_option("aws_secret_access_key", "testing")
        .with_storage_option("aws_region", "us-east-1")
        .with_storage_option("allow_http", "true")
        .with_storage_option("aws_virtual_hosted_style_request", "false")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn storage_options_reach_every_open() {
    for var in ["AWS_ENDPOINT", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3"] {
        assert!(
            std::env::var_os(var).is_none(),
            "{var} is set in the environment; this test needs the options to be the only route"
        );
    }
    let server = start_s3();
    create_bucket(server.port, "lc-test");
    let uri = "s3://lc-test/stores/options";

    // Create and write: the writer and its generation flushes.
    let store = Store::create(s3_config(server.port, uri)).await.unwrap();
    store.add(&batch(&rows("s3", "g", 20))).await.unwrap();
    // Point lookup and scan open the generations.
    assert!(store.get("s3-00011").await.unwrap().is_some());
    assert_eq!(store.count(Some("grp = 'g'")).await.unwrap(), 20);

    // A reader, open before the next commit, refreshes to see it.
    let reader = Store::open_read_only(s3_config(server.port, uri))
        .await
        .unwrap();
    assert_eq!(reader.count(None).await.unwrap(), 20);

    // A second instance of the same shard: open, WAL replay, claim.
    let second = Store::open(s3_config(server.port, uri)).await.unwrap();
    second.add(&batch(&rows("s3b", "g", 5))).await.unwrap();
    assert_eq!(reader.count(None).await.unwrap(), 25);

    // The first one is fenced; reclaiming reopens the dataset through the options.
    assert!(
        store
            .add(&batch(&rows("x", "g", 1)))
            .await
            .unwrap_err()
            .is_fenced()
    );
    store.reclaim().await.unwrap();
    store.add(&batch(&rows("s3c", "g", 2))).await.unwrap();
    store.close().await.unwrap();
    assert_eq!(reader.count(None).await.unwrap(), 27);
    assert!(reader.get("s3c-00001").await.unwrap().is_some());
}

#[test]
fn debug_output_never_shows_storage_option_values() {
    use lance_context_host::{CreateOptions, SchemaSource};
    let config = StoreConfig::new("s3://bucket/store")
        .with_storage_option("aws_secret_access_key", "hunter2-secret");
    let shown = format!("{config:?}");
    assert!(shown.contains("aws_secret_access_key"), "{shown}");
    assert!(!shown.contains("hunter2-secret"), "{shown}");
    let mut options = CreateOptions::new(SchemaSource::Builtin("rollout".into()));
    options
        .storage_options
        .insert("aws_secret_access_key".into(), "hunter2-secret".into());
    let shown = format!("{options:?}");
    assert!(!shown.contains("hunter2-secret"), "{shown}");
}

/// The engine's maintenance paths on the object store: merges with deletes
/// (each pass a conditional commit carrying its marker), a stale merge from
/// a second handle, cleanup (ledger, generations, WAL, manifests), compaction,
/// retention, the key index, a takeover by another instance, and count.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn maintenance_runs_on_the_object_store() {
    use std::sync::Arc;
    let server = start_s3();
    create_bucket(server.port, "lc-maint");
    let uri = "s3://lc-maint/stores/maint";
    let manual = |instance: &str| {
        let mut c = s3_config(server.port, uri)
            .with_instance_id(instance)
            .with_manual_maintenance()
            .with_retention(lance_context_store::RetentionSettings {
                keep_versions: 3,
                keep_for: Duration::ZERO,
                interval: Duration::ZERO,
            });
        c.merge.cleanup_grace = Duration::from_millis(50);
        c
    };
    let a = Arc::new(Store::create(manual("a")).await.unwrap());
    for i in 0..4 {
        a.add(&batch(&rows(&format!("m{i}"), "g", 10)))
            .await
            .unwrap();
    }
    a.delete(&["m0-00001", "m1-00002"]).await.unwrap();
    let merged = a.merge().await.unwrap();
    assert!(merged.passes >= 2 && merged.keys_deleted == 2, "{merged:?}");
    assert_eq!(a.count(None).await.unwrap(), 38);
    a.compact().await.unwrap();
    tokio::time::sleep(Duration::from_millis(150)).await;
    a.add(&batch(&rows("late", "g", 3))).await.unwrap();
    let cleaned = a.merge().await.unwrap();
    assert!(cleaned.generations_removed >= 5, "{cleaned:?}");
    assert!(cleaned.wal_files_removed >= 1, "{cleaned:?}");
    let stats = a.stats().await.unwrap();
    assert!(stats.versions <= 4, "{stats:?}");
    assert!(
        stats
            .indexes
            .iter()
            .any(|i| i.name == "id_idx" && i.covers_all_rows)
    );
    assert!(a.get("m3-00009").await.unwrap().is_some());
    assert!(a.get("m1-00002").await.unwrap().is_none());

    // Another instance takes the store over (fencing a, merging its shard).
    let b = Store::open(manual("b")).await.unwrap();
    assert!(
        a.add(&batch(&rows("x", "g", 1)))
            .await
            .unwrap_err()
            .is_fenced()
    );
    b.add(&batch(&rows("m0", "from-b", 10))).await.unwrap();
    assert_eq!(b.count(None).await.unwrap(), 42);
    b.merge().await.unwrap();
    let reader = Store::open_read_only(s3_config(server.port, uri))
        .await
        .unwrap();
    assert_eq!(reader.count(None).await.unwrap(), 42);
    assert_eq!(
        decode(&reader.get("m0-00001").await.unwrap().unwrap())[0].grp,
        "from-b"
    );
}

/// The crash trials with their stores on the object store.
#[test]
fn crash_trials_run_on_the_object_store() {
    let server = start_s3();
    create_bucket(server.port, "lc-torture");
    let dir = tempfile::tempdir().unwrap();
    let endpoint = format!("aws_endpoint=http://127.0.0.1:{}", server.port);
    let mut args = vec![
        "dev",
        "torture",
        "--trials",
        "6",
        "--max-run-ms",
        "3000",
        "--uri-base",
        "s3://lc-torture/trials",
    ];
    let options = [
        endpoint.as_str(),
        "aws_access_key_id=testing",
        "aws_secret_access_key=testing",
        "aws_region=us-east-1",
        "allow_http=true",
        "aws_virtual_hosted_style_request=false",
    ];
    for o in &options {
        args.push("--storage-option");
        args.push(o);
    }
    let (code, out, err) = crate::support::cli(dir.path(), &args, "");
    assert_eq!(code, 0, "{out}\n{err}");
    assert!(
        out.contains("rows lost: 0, deletes undone: 0, keys duplicated: 0"),
        "{out}"
    );
}

/// Two handles committing to the base table at once on the object store
/// (two instances' merges, each followed by index work). moto answers a
/// failed conditional PUT with 403 where S3 answers 412: the engine never
/// relies on which — a write that fails is checked against the shard's
/// manifest (a fence is typed from there), merges and index refreshes that
/// lose a race are refused typed or redone. Both merges land every round.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn racing_commits_on_the_object_store_lose_nothing() {
    let server = start_s3();
    create_bucket(server.port, "lc-race");
    let uri = "s3://lc-race/stores/race";
    let manual = |instance: &str| {
        let mut c = s3_config(server.port, uri)
            .with_instance_id(instance)
            .with_manual_maintenance()
            .with_shard_policy(lance_context_store::ShardPolicy::PartitionedKeys);
        c.merge.cleanup_grace = Duration::from_millis(50);
        c
    };
    let a = Store::create(manual("a")).await.unwrap();
    let b = Store::open(manual("b")).await.unwrap();
    for round in 0..3 {
        a.add(&batch(&rows(&format!("a{round}"), "g", 10)))
            .await
            .unwrap();
        b.add(&batch(&rows(&format!("b{round}"), "g", 10)))
            .await
            .unwrap();
        let (ra, rb) = tokio::join!(a.merge(), b.merge());
        ra.unwrap();
        rb.unwrap();
        assert_eq!(a.count(None).await.unwrap(), 20 * (round + 1) as u64);
    }
    let status = a.wal_status().await.unwrap();
    assert!(
        status.unmerged_generations.iter().all(|(_, n)| *n == 0),
        "{status:?}"
    );
}

/// Upload every file under `dir` to `s3://bucket/prefix/…` (moto takes
/// unsigned requests).
fn upload_dir(port: u16, bucket: &str, prefix: &str, dir: &std::path::Path) {
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                stack.push(path);
                continue;
            }
            let key = path
                .strip_prefix(dir)
                .unwrap()
                .to_str()
                .unwrap()
                .to_string();
            let body = std::fs::read(&path).unwrap();
            let mut stream = TcpStream::connect(("127.0.0.1", port)).unwrap();
            write!(
                stream,
                "PUT /{bucket}/{prefix}/{key} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                body.len()
            )
            .unwrap();
            stream.write_all(&body).unwrap();
            let mut response = String::new();
            stream.read_to_string(&mut response).unwrap();
            assert!(response.starts_with("HTTP/1.1 200"), "{key}: {response}");
        }
    }
}

/// The migration guide's object-store block: the previous implementation's
/// datasets on an S3-compatible server, adopted with storage options (the
/// WAL replay and merge go through them too).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_adoption_reaches_the_object_store() {
    let server = start_s3();
    create_bucket(server.port, "lc-old");
    upload_dir(server.port, "lc-old", "old", &crate::adopt::fixtures());
    let blocks: Vec<String> = crate::adopt::guide_blocks()
        .into_iter()
        .filter(|b| b.contains("$OLD_S3"))
        .collect();
    assert_eq!(blocks.len(), 1);
    let work = tempfile::tempdir().unwrap();
    let env = [
        ("OLD_S3", "s3://lc-old/old".to_string()),
        ("AWS_ACCESS_KEY_ID", "testing".to_string()),
        ("AWS_SECRET_ACCESS_KEY", "testing".to_string()),
        ("AWS_REGION", "us-east-1".to_string()),
        (
            "S3_EXTRA",
            format!(
                "--storage-option aws_endpoint=http://127.0.0.1:{} --storage-option allow_http=true --storage-option aws_virtual_hosted_style_request=false",
                server.port
            ),
        ),
    ];
    crate::adopt::run_block(&blocks[0], work.path(), &env);
    let (code, out, err) = cli(
        work.path(),
        &[
            "--json",
            "store",
            "count",
            "memories-s3",
            "--storage-option",
            &format!("aws_endpoint=http://127.0.0.1:{}", server.port),
            "--storage-option",
            "aws_access_key_id=testing",
            "--storage-option",
            "aws_secret_access_key=testing",
            "--storage-option",
            "aws_region=us-east-1",
            "--storage-option",
            "allow_http=true",
            "--storage-option",
            "aws_virtual_hosted_style_request=false",
        ],
        "",
    );
    assert_eq!(code, 0, "{err}");
    assert_eq!(
        crate::adopt::json_lines(&out)[0]["count"],
        serde_json::json!(crate::adopt::expected("context").len())
    );
}

/// Bucket sharding on the object store: three instances owning disjoint
/// buckets write one store at once (with rewrites), a reader sees each key
/// once with its newest value, one instance dies and its buckets are taken
/// over (nothing it acknowledged is lost), and after a merge per bucket the
/// base table holds every key once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn instances_owning_buckets_share_a_store_on_the_object_store() {
    use lance_context_store::Error;
    let server = start_s3();
    create_bucket(server.port, "lc-buckets");
    let uri = "s3://lc-buckets/stores/events";
    let owning = |owned: Vec<u32>| {
        s3_config(server.port, uri)
            .with_buckets(4)
            .with_owned_buckets(Some(owned))
            .with_manual_maintenance()
    };
    let a = Store::create(owning(vec![0, 1])).await.unwrap();
    let b = Store::open(owning(vec![2])).await.unwrap();
    let c = Store::open(owning(vec![3])).await.unwrap();
    // Each key's bucket, as a handle owning none refuses it.
    let router = Store::open(owning(vec![])).await.unwrap();
    let keys = rows("e", "v0", 120);
    let mut bucket_of = Vec::new();
    for key in &keys {
        match router.add(&batch(std::slice::from_ref(key))).await {
            Err(Error::NotOwner { bucket, .. }) => bucket_of.push(bucket),
            other => panic!("{other:?}"),
        }
    }
    let part = |owned: &[u32], grp: &str| -> arrow_array::RecordBatch {
        let mine: Vec<Row> = keys
            .iter()
            .zip(&bucket_of)
            .filter(|(_, b)| owned.contains(b))
            .map(|(r, _)| Row::new(&r.id, grp, r.n))
            .collect();
        batch(&mine)
    };
    for version in ["v1", "v2"] {
        let (pa, pb, pc) = (
            part(&[0, 1], version),
            part(&[2], version),
            part(&[3], version),
        );
        let (ra, rb, rc) = tokio::join!(a.add(&pa), b.add(&pb), c.add(&pc));
        assert_eq!(ra.unwrap().rows + rb.unwrap().rows + rc.unwrap().rows, 120);
    }
    let reader = Store::open_read_only(s3_config(server.port, uri))
        .await
        .unwrap();
    let seen = decode(&reader.scan(Default::default()).await.unwrap());
    assert_eq!(seen.len(), 120, "each key once");
    assert!(seen.iter().all(|r| r.grp == "v2"), "newest wins");

    // a dies; d takes its buckets over and keeps what a acknowledged.
    drop(a);
    let d = Store::open(owning(vec![0, 1])).await.unwrap();
    assert_eq!(d.count(Some("grp = 'v2'")).await.unwrap(), 120);
    d.add(&part(&[0, 1], "v3")).await.unwrap();

    for store in [&d, &b, &c] {
        store.merge().await.unwrap();
    }
    let stats = reader.stats().await.unwrap();
    assert_eq!(
        stats.rows_in_base, 120,
        "every key once in the base: {stats:?}"
    );
    assert_eq!(reader.count(None).await.unwrap(), 120);
    let v3 = bucket_of.iter().filter(|b| **b < 2).count() as u64;
    assert_eq!(reader.count(Some("grp = 'v3'")).await.unwrap(), v3);
    assert_eq!(reader.count(Some("grp = 'v2'")).await.unwrap(), 120 - v3);
}
