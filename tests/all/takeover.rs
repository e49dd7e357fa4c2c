//! Takeover and retry paths of the engine, each interleaving forced through
//! the failpoints: a writer recovering from a failed WAL write while another
//! instance takes the store over, background maintenance across a recovery,
//! a read overlapping a takeover, and the shard manifest's size over a long
//! history of short-lived writers.

use std::sync::Arc;
use std::time::Duration;

use lance_context_store::{MaintenanceState, ScanRequest, Store, StoreConfig};

use crate::support::*;

/// A store of instance `instance`, maintenance by hand.
fn manual(uri: &str, instance: &str) -> StoreConfig {
    config(uri)
        .with_instance_id(instance)
        .with_manual_maintenance()
}

/// How many times `id` is read, and the `n` of each time.
async fn reads_of(store: &Store, id: &str) -> Vec<i64> {
    let all = store.scan(ScanRequest::new()).await.unwrap();
    decode(&all)
        .into_iter()
        .filter(|r| r.id == id)
        .map(|r| r.n)
        .collect()
}

/// Item 1 of the takeover review: writer A's WAL write fails and A checks
/// that its epoch has not moved; before A claims its shard again, instance
/// B opens (SingleWriter: claims A's shard, merges it) and acknowledges a
/// write. A's claim then lands one epoch past B's: A must not take the
/// shard back and write beside B (two live writers, a key read twice), but
/// answer `Fenced`, and B keeps writing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_recovery_overtaken_by_a_peer_leaves_the_shard_to_the_peer() {
    let (_dir, uri) = temp_uri();
    let a = Arc::new(Store::create(manual(&uri, "a")).await.unwrap());
    a.add(&batch(&[Row::new("k", "g", 1)])).await.unwrap();

    a.fail_next_wal_write().unwrap();
    let (hook, paused, go) = pause();
    a.pause_next_recovery(hook).unwrap();
    let writer = a.clone();
    let add = tokio::spawn(async move { writer.add(&batch(&[Row::new("x", "g", 1)])).await });
    paused.await.unwrap();

    let b = Store::open(manual(&uri, "b")).await.unwrap();
    b.add(&batch(&[Row::new("k", "g", 2)])).await.unwrap();
    go.send(()).unwrap();
    let err = add.await.unwrap().unwrap_err();
    assert!(err.is_fenced(), "A wrote beside B: {err:?}");
    // Latched: A refuses at once.
    let again = a.add(&batch(&[Row::new("k", "g", 9)])).await.unwrap_err();
    assert!(again.is_fenced(), "{again:?}");

    // B was not fenced by A's late claim, and `k` is read once, newest.
    b.add(&batch(&[Row::new("k", "g", 3)])).await.unwrap();
    let reader = Store::open_read_only(StoreConfig::new(&uri)).await.unwrap();
    assert_eq!(reads_of(&reader, "k").await, [3]);
    assert_eq!(
        reader.count(None).await.unwrap(),
        reader.scan(ScanRequest::new()).await.unwrap().num_rows() as u64
    );
    assert!(matches!(a.maintenance(), MaintenanceState::Off { .. }));
}

/// A reclaim clears the latch only for its own claim: a fence that claim
/// met while the reclaim went on (a peer of the same instance claiming
/// again) keeps the store latched, and adds are refused without touching
/// storage.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_recovery_never_clears_a_fence_seen_meanwhile() {
    let (_dir, uri) = temp_uri();
    let a = Arc::new(Store::create(manual(&uri, "a")).await.unwrap());
    a.add(&batch(&rows("first", "g", 3))).await.unwrap();
    // The public reclaim, paused after its claim: a peer of the same
    // instance claims meanwhile; the reclaim must leave the store latched.
    let (hook, paused, go) = pause();
    let reclaimer = a.clone();
    let reclaim = tokio::spawn(async move { reclaimer.reclaim_with_hook(hook).await });
    paused.await.unwrap();
    let peer = Store::open(manual(&uri, "a")).await.unwrap();
    // A's add meets the peer's fence under the new claim.
    let err = a.add(&batch(&rows("lost", "g", 1))).await.unwrap_err();
    assert!(err.is_fenced(), "{err:?}");
    go.send(()).unwrap();
    reclaim.await.unwrap().unwrap();
    let err = a.add(&batch(&rows("late", "g", 1))).await.unwrap_err();
    assert!(
        err.is_fenced(),
        "the reclaim cleared a fence its own claim met: {err:?}"
    );
    peer.add(&batch(&rows("peer", "g", 2))).await.unwrap();
    assert_eq!(peer.count(Some("id LIKE 'late%'")).await.unwrap(), 0);
    assert_eq!(peer.count(Some("id LIKE 'first%'")).await.unwrap(), 3);
}

/// Item 2: after a failed WAL write the writer recovers, and background
/// maintenance goes on by itself (it used to stop for good once it saw the
/// writer latched during the recovery). Stats say paused while it recovers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn maintenance_resumes_after_the_writer_recovers() {
    let (_dir, uri) = temp_uri();
    let mut cfg = config(&uri).with_manual_maintenance();
    cfg.merge.interval = Some(Duration::from_millis(50));
    let store = Arc::new(Store::create(cfg).await.unwrap());
    assert_eq!(store.maintenance(), MaintenanceState::Running);

    store.fail_next_wal_write().unwrap();
    let (hook, paused, go) = pause();
    store.pause_next_recovery(hook).unwrap();
    let writer = store.clone();
    let add = tokio::spawn(async move { writer.add(&batch(&rows("a", "g", 5))).await });
    paused.await.unwrap();
    assert!(
        matches!(store.maintenance(), MaintenanceState::Paused { .. }),
        "{:?}",
        store.maintenance()
    );
    // Several timer ticks pass while the writer is latched.
    tokio::time::sleep(Duration::from_millis(300)).await;
    go.send(()).unwrap();
    add.await.unwrap().unwrap();
    assert_eq!(store.maintenance(), MaintenanceState::Running);

    store.add(&batch(&rows("b", "g", 5))).await.unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let stats = store.stats().await.unwrap();
        if stats.rows_in_base == 10 && generations(&store).await == 0 {
            assert_eq!(stats.maintenance, MaintenanceState::Running);
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no merge ran after the recovery: {stats:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Item 3: reader R lists the shards (A's and B's, from an earlier
/// takeover) and reads the base table; instance B then takes the store back
/// (merging A's shard, whose generation still holds `k`) and writes `k`
/// again through its own shard; R then reads the shard manifests. R must
/// read `k` once (either value: the read overlaps B's write), never twice —
/// once from A's merged generation, once from B's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_overlapping_a_takeover_reads_each_key_once() {
    let (_dir, uri) = temp_uri();
    let a = Store::create(manual(&uri, "a")).await.unwrap();
    // B's shard exists: B took the store over once, and A took it back.
    let b = Store::open(manual(&uri, "b")).await.unwrap();
    b.add(&batch(&[Row::new("j", "g", 1)])).await.unwrap();
    a.reclaim().await.unwrap();
    a.add(&batch(&[Row::new("k", "g", 1)])).await.unwrap();
    let reader = Arc::new(Store::open_read_only(StoreConfig::new(&uri)).await.unwrap());
    // Warm the reader's caches as a long-lived reader's would be.
    assert_eq!(reads_of(&reader, "k").await, [1]);

    let (hook, paused, go) = pause();
    reader.pause_next_view(hook);
    let r = reader.clone();
    let scan = tokio::spawn(async move { r.scan(ScanRequest::new()).await });
    paused.await.unwrap();
    b.reclaim().await.unwrap();
    b.add(&batch(&[Row::new("k", "g", 2)])).await.unwrap();
    go.send(()).unwrap();
    let rows = decode(&scan.await.unwrap().unwrap());
    let k: Vec<i64> = rows.iter().filter(|r| r.id == "k").map(|r| r.n).collect();
    assert_eq!(k.len(), 1, "k read as {k:?}");
    assert_eq!(rows.len(), 2, "{rows:?}");
    assert_eq!(reads_of(&reader, "k").await, [2]);
}

/// Bytes of the files under `dir` whose path (relative to `dir`) starts
/// with `prefix`, and of the others.
fn bytes_split(dir: &std::path::Path, prefix: &str) -> (u64, u64) {
    let (mut inside, mut outside) = (0, 0);
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).unwrap() {
            let entry = entry.unwrap();
            let meta = entry.metadata().unwrap();
            if meta.is_dir() {
                stack.push(entry.path());
            } else if entry.path().strip_prefix(dir).unwrap().starts_with(prefix) {
                inside += meta.len();
            } else {
                outside += meta.len();
            }
        }
    }
    (inside, outside)
}

/// Item 5: a store written by many short-lived handles of one instance (each
/// claims the shard, adds a record and goes), merged now and then by
/// another short-lived handle: the newest shard manifest lists only
/// unmerged generations and keeps its size, old manifest versions are
/// removed once old enough, and once the grace has passed the MemWAL's
/// files take no more room than the base table's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_shard_manifest_stays_bounded_over_a_long_history_of_short_lived_writers() {
    let (dir, uri) = temp_uri();
    let settings = |cfg: StoreConfig| {
        let mut cfg = cfg.with_manual_maintenance();
        cfg.merge.cleanup_grace = Duration::from_millis(20);
        cfg.merge.manifest_prune_age = Duration::from_millis(20);
        cfg.retention.keep_versions = 2;
        cfg.retention.keep_for = Duration::from_millis(20);
        cfg
    };
    Store::create(settings(config(&uri)))
        .await
        .unwrap()
        .close()
        .await
        .unwrap();
    // 240 rounds in CI; `LC_MANIFEST_ROUNDS=5000` for the figure.
    let rounds: i64 = std::env::var("LC_MANIFEST_ROUNDS")
        .ok()
        .and_then(|r| r.parse().ok())
        .unwrap_or(240);
    let mut newest = Vec::new();
    for i in 0..rounds {
        let store = Store::open(settings(config(&uri))).await.unwrap();
        store
            .add(&batch(&[Row::new(format!("r{:04}", i % 60), "g", i)]))
            .await
            .unwrap();
        if i % 10 == 9 {
            tokio::time::sleep(Duration::from_millis(25)).await;
            store.merge().await.unwrap();
            store.apply_retention().await.unwrap();
            let stats = store.stats().await.unwrap();
            let shard = stats
                .shard_manifests
                .iter()
                .find(|m| m.shard == store.shard_id())
                .cloned()
                .unwrap();
            assert!(
                shard.listed_generations <= 1,
                "round {i}: merged generations still listed: {shard:?}"
            );
            assert!(
                shard.versions <= 40,
                "round {i}: manifest versions pile up: {shard:?}"
            );
            newest.push(shard.newest_bytes);
        }
        store.close().await.unwrap();
    }
    // The newest manifest's size does not grow with the history.
    let (first, last) = (newest[1], *newest.last().unwrap());
    assert!(
        last <= first + 64,
        "the newest manifest grew from {first} to {last} bytes: {newest:?}"
    );
    // Once the grace has passed, the next maintenance removes what the last
    // merge left.
    tokio::time::sleep(Duration::from_millis(50)).await;
    let last = Store::open(settings(config(&uri))).await.unwrap();
    last.merge().await.unwrap();
    last.close().await.unwrap();
    let reader = Store::open_read_only(settings(config(&uri))).await.unwrap();
    assert_eq!(reader.count(None).await.unwrap(), 60);
    let (wal, rest) = bytes_split(std::path::Path::new(&uri), "_mem_wal");
    assert!(
        wal <= rest,
        "the MemWAL holds {wal} bytes beside {rest} of the table ({:?})",
        dir.path()
    );
}

/// One operation of a trial on one key: the value it wrote (`None`: a
/// delete), when it began and ended on the trial's clock, and whether it
/// was acknowledged (else its outcome is unknown: it may or may not have
/// taken effect, at any time after it began).
#[derive(Debug, Clone)]
struct Op {
    value: Option<i64>,
    began: u64,
    ended: u64,
    acked: bool,
}

/// The trial's log and clock, shared by its writers.
#[derive(Default)]
struct Trial {
    clock: std::sync::atomic::AtomicU64,
    ops: std::sync::Mutex<std::collections::BTreeMap<String, Vec<Op>>>,
}

impl Trial {
    fn tick(&self) -> u64 {
        self.clock.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1
    }

    fn record(&self, keys: &[String], value: Option<i64>, began: u64, acked: bool) {
        let ended = if acked { self.tick() } else { u64::MAX };
        let mut ops = self.ops.lock().unwrap();
        for key in keys {
            ops.entry(key.clone()).or_default().push(Op {
                value,
                began,
                ended,
                acked,
            });
        }
    }

    /// What a reader may see of `key` (each key at most once): the value of
    /// an operation no acknowledged operation began after the end of; the
    /// key absent only if such an operation was a delete, or nothing was
    /// acknowledged on it. A problem found, if any.
    fn check(&self, key: &str, seen: &[i64]) -> Option<String> {
        let ops = self.ops.lock().unwrap();
        let empty = Vec::new();
        let ops = ops.get(key).unwrap_or(&empty);
        if seen.len() > 1 {
            return Some(format!("{key} read {} times: {seen:?}", seen.len()));
        }
        let seen = seen.first().copied();
        let last_acked_start = ops.iter().filter(|o| o.acked).map(|o| o.began).max();
        let allowed = |o: &Op| last_acked_start.is_none_or(|s| s <= o.ended);
        let fine = match seen {
            None => {
                last_acked_start.is_none() || ops.iter().any(|o| o.value.is_none() && allowed(o))
            }
            Some(v) => ops.iter().any(|o| o.value == Some(v) && allowed(o)),
        };
        (!fine).then(|| format!("{key} reads {seen:?}, which the log rules out: {ops:?}"))
    }
}

/// A writer of a trial: `ops` random operations on a key space of 40 keys
/// through `store`, a WAL persistence failure injected before one in five.
/// On a fence it reclaims the store (as a service would) when `reclaims`,
/// else it stops.
async fn trial_writer(
    store: &Store,
    trial: &Trial,
    rng: &mut Lcg,
    ops: usize,
    reclaims: bool,
) -> usize {
    let mut faults = 0;
    for _ in 0..ops {
        if rng.below(5) == 0 {
            store.fail_next_wal_write().unwrap();
            faults += 1;
        }
        let keys: Vec<String> = {
            let mut k: Vec<String> = (0..1 + rng.below(6))
                .map(|_| format!("k{:02}", rng.below(40)))
                .collect();
            k.sort();
            k.dedup();
            k
        };
        let began = trial.tick();
        let pick = rng.below(10);
        let result = if pick < 7 {
            let value = began as i64;
            let rows: Vec<Row> = keys.iter().map(|k| Row::new(k, "g", value)).collect();
            let r = store.add(&batch(&rows)).await.map(|_| ());
            trial.record(&keys, Some(value), began, r.is_ok());
            r
        } else if pick < 9 {
            let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
            let r = store.delete(&refs).await.map(|_| ());
            trial.record(&keys, None, began, r.is_ok());
            r
        } else {
            store.merge().await.map(|_| ())
        };
        if let Err(e) = result {
            if !e.is_fenced() && e.kind() != lance_context_store::ErrorKind::Conflict {
                panic!("unexpected error: {e:?}");
            }
            if !reclaims {
                break;
            }
            // A service backs off before taking its store back, so the
            // other instance's open (its takeover) can finish first.
            tokio::time::sleep(Duration::from_millis(20 + rng.below(300))).await;
            let _ = store.reclaim().await;
        }
    }
    faults
}

/// Crash-trial variant of the takeover review: writer A's WAL writes fail
/// at random (an injected persistence fault before one operation in five)
/// while instance B opens with `SingleWriter` at random moments (taking the
/// store over), writes, and is taken over again by A's reclaims. After
/// each trial a fresh reader must read every key at most once, with a
/// value the log allows (nothing lost, stale or resurrected), count ==
/// scan — and again after a final merge. Runs seeded trials for
/// `LC_TAKEOVER_SECONDS` (default 20), at least 4; the seed is printed.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn persistence_faults_beside_takeovers_lose_nothing() {
    let seconds: u64 = std::env::var("LC_TAKEOVER_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(20);
    let seed = std::env::var("LC_TAKEOVER_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos() as u64
        });
    println!("seed {seed} (LC_TAKEOVER_SEED replays it)");
    let started = std::time::Instant::now();
    let (mut trials, mut faults, mut takeovers, mut takeovers_refused) = (0u64, 0usize, 0, 0);
    while trials < 4 || started.elapsed() < Duration::from_secs(seconds) {
        let trial_seed = seed.wrapping_add(trials);
        let (_dir, uri) = temp_uri();
        let trial = Arc::new(Trial::default());
        let a = Arc::new(Store::create(manual(&uri, "a")).await.unwrap());
        let writer_a = {
            let (a, trial) = (a.clone(), trial.clone());
            tokio::spawn(async move {
                let mut rng = Lcg(trial_seed);
                trial_writer(&a, &trial, &mut rng, 60, true).await
            })
        };
        let writer_b = {
            let (uri, trial) = (uri.clone(), trial.clone());
            tokio::spawn(async move {
                let mut rng = Lcg(trial_seed ^ 0x5eed);
                let (mut faults, mut opened, mut refused) = (0, 0, 0);
                for _ in 0..3 {
                    tokio::time::sleep(Duration::from_millis(50 + rng.below(400))).await;
                    let b = match Store::open(manual(&uri, "b")).await {
                        Ok(b) => b,
                        // A took its shard back during B's takeover (or
                        // merged it first, three times): typed, and B
                        // writes nothing.
                        Err(e) => {
                            assert!(
                                matches!(e, lance_context_store::Error::ShardConflict { .. }),
                                "{e:?}"
                            );
                            refused += 1;
                            continue;
                        }
                    };
                    opened += 1;
                    faults += trial_writer(&b, &trial, &mut rng, 8, false).await;
                    let _ = b.close().await;
                }
                (faults, opened, refused)
            })
        };
        faults += writer_a.await.unwrap();
        let (b_faults, opened, refused) = writer_b.await.unwrap();
        faults += b_faults;
        takeovers += opened;
        takeovers_refused += refused;

        let verify = |stage: &'static str| {
            let (uri, trial) = (uri.clone(), trial.clone());
            async move {
                let reader = Store::open_read_only(StoreConfig::new(&uri)).await.unwrap();
                let all = decode(&reader.scan(ScanRequest::new()).await.unwrap());
                let mut seen: std::collections::BTreeMap<String, Vec<i64>> = Default::default();
                for row in &all {
                    seen.entry(row.id.clone()).or_default().push(row.n);
                }
                let mut problems = Vec::new();
                for i in 0..40 {
                    let key = format!("k{i:02}");
                    let values = seen.get(&key).cloned().unwrap_or_default();
                    problems.extend(trial.check(&key, &values));
                }
                let count = reader.count(None).await.unwrap();
                if count != all.len() as u64 {
                    problems.push(format!("count {count} != scan {}", all.len()));
                }
                assert!(
                    problems.is_empty(),
                    "seed {trial_seed}, {stage}: {problems:#?}"
                );
            }
        };
        verify("after the writers").await;
        // A takes the store back and merges everything.
        a.reclaim().await.unwrap();
        a.merge().await.unwrap();
        verify("after a final merge").await;
        a.close().await.unwrap();
        trials += 1;
    }
    println!(
        "{trials} trials, {faults} persistence faults injected, {takeovers} takeovers by B \
         ({takeovers_refused} refused while A took its shard back), no problem"
    );
}
