//! `lance-context dev bench-peer`, the workload: what a user of the previous
//! implementation does with a store, on both, alternating round by round, a
//! fresh store per round. This host through a spec store (records as JSON
//! Lines through the plugin), the previous implementation through
//! `GenericStore` with `seal_on_add=True`, the same schema and records as
//! the single durable add.
//!
//! The load: `rows / 10,000` adds of 10,000 records, then 10 adds of 1,000
//! (`rows + 10,000` records, one generation per add). Then: gets of keys
//! spread over the store, a filtered scan of a tenth of the rows, a merge of
//! the WAL tier into the base (all of it: the previous implementation's
//! `cleanup_wal` merges 8 generations per call, so it is called until it
//! merges none), the gets and the scan again, the bytes on disk per record,
//! and a cold start (a new process opens the store and answers one get).
//! The merge figure is the records merged per second of merging every
//! record: the previous implementation's store has merged nothing before;
//! this host's store has merged most in the background during the adds, so
//! its figure comes from the same adds into a store without background
//! merges, merged once. Then an upsert of 1,000 records by the caller's key
//! into a store of the context schema holding 10,000 (half of each upsert
//! replaces, half is new): this host's `context` store, the previous
//! implementation's `Context.upsert_many(key="external_id")`.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, ensure};
use lance_context_host::spec::SchemaSpec;
use lance_context_host::{
    CreateOptions, NamedStore, PluginRuntime, Registry, SchemaSource, rows_from_json,
};
use lance_context_store::ScanRequest;

use super::bench_peer::{PEER_SCHEMA, SPEC, pct, record};

/// Each figure: its name, its unit, and whether more is better.
pub const FIGURES: [(&str, &str, bool); 12] = [
    ("batched add, 1k records", "records/s", true),
    ("batched add, 10k records", "records/s", true),
    ("get p50, unmerged", "ms", false),
    ("get p99, unmerged", "ms", false),
    ("filtered scan (a tenth), unmerged", "ms", false),
    ("merge into the base", "records/s", true),
    ("get p50, merged", "ms", false),
    ("get p99, merged", "ms", false),
    ("filtered scan (a tenth), merged", "ms", false),
    ("disk bytes per record", "B", false),
    ("cold start: a process opens, one get", "ms", false),
    ("upsert of 1,000 records (context schema)", "ms", false),
];

/// Cold starts timed per side per round (their median is reported).
const COLD_STARTS: usize = 5;

/// Filtered scans timed per layout (their median is reported).
const SCANS: usize = 5;

/// The size of one run.
#[derive(Debug, Clone, Copy)]
pub struct Load {
    /// Records in 10,000-record adds (a multiple of 10,000, at least one).
    pub rows: usize,
    /// Gets per layout.
    pub gets: usize,
}

impl Load {
    fn total(&self) -> usize {
        self.rows + 10_000
    }

    /// The key of get number `g`: spread over the whole store, the same
    /// sequence on both sides.
    fn key(&self, g: usize) -> usize {
        (g * 7919 + 13) % self.total()
    }
}

/// The previous implementation's side, the same steps (prints the figures
/// but the cold start as one JSON list, in the order of [`FIGURES`]).
const PEER_SCRIPT: &str = r#"
import json, os, statistics, sys, time
from lance_context import GenericStore
uri, schema, rows, gets = sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
total = rows + 10000
def rec(i):
    return {"id": f"r{i}", "step": i, "score": i / 7, "text": f"step {i} of the agent",
            "emb": [((i * 31 + j) % 17) / 17 + 0.01 for j in range(64)]}
def pct(ts, p):
    ts = sorted(ts)
    return ts[round((len(ts) - 1) * p)]
store = GenericStore.open(uri, schema=schema, seal_on_add=True)
added = 0
def adds(count, size):
    global added
    rates = []
    for _ in range(count):
        batch = [rec(k) for k in range(added, added + size)]
        t = time.perf_counter()
        store.add(batch)
        rates.append(size / (time.perf_counter() - t))
        added += size
    return statistics.median(rates)
r10 = adds(rows // 10000, 10000)
r1 = adds(10, 1000)
def get_times():
    ts = []
    for g in range(gets):
        k = (g * 7919 + 13) % total
        t = time.perf_counter()
        r = store.get(f"r{k}")
        ts.append((time.perf_counter() - t) * 1000)
        assert r is not None and r["step"] == k, (k, r)
    return pct(ts, 0.5), pct(ts, 0.99)
def scan():
    ts = []
    for _ in range(5):
        t = time.perf_counter()
        out = store.list(filter=f"step < {total // 10}")
        ts.append((time.perf_counter() - t) * 1000)
        assert len(out) == total // 10, len(out)
    return statistics.median(ts)
g50, g99 = get_times()
s1 = scan()
# cleanup_wal merges a few generations per call (8 in 0.6.7): called until
# it merges none, every record is in the base.
t = time.perf_counter()
for _ in range(100000):
    if not store.cleanup_wal():
        break
merge = total / (time.perf_counter() - t)
m50, m99 = get_times()
s2 = scan()
disk = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(uri) for f in fs)
print(json.dumps([r1, r10, g50, g99, s1, merge, m50, m99, s2, disk / total]))
"#;

/// A new process opening the previous implementation's store and answering
/// one get.
const PEER_COLD: &str = r#"
import sys
from lance_context import GenericStore
store = GenericStore.open_existing(sys.argv[1])
assert store.get(sys.argv[2]) is not None
"#;

/// JSON Lines of records `from..from + count`.
fn lines(from: usize, count: usize) -> String {
    let mut out = String::with_capacity(count * 600);
    for i in from..from + count {
        out.push_str(&record(i).to_string());
        out.push('\n');
    }
    out
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    pct(&v, 0.5)
}

/// Bytes of every file under `dir`.
fn disk_bytes(dir: &Path) -> u64 {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    entries
        .filter_map(|e| e.ok())
        .map(|e| match e.file_type() {
            Ok(t) if t.is_dir() => disk_bytes(&e.path()),
            _ => e.metadata().map(|m| m.len()).unwrap_or(0),
        })
        .sum()
}

/// The median wall time of `COLD_STARTS` runs of `command` (each must
/// succeed).
fn cold_start(mut command: impl FnMut() -> Command) -> Result<f64> {
    let mut times = Vec::with_capacity(COLD_STARTS);
    for _ in 0..COLD_STARTS {
        let started = Instant::now();
        let out = command()
            .output()
            .context("starting the cold-start process")?;
        ensure!(
            out.status.success(),
            "the cold-start process failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
        times.push(ms(started.elapsed()));
    }
    Ok(median(times))
}

/// The load's adds into `store` (see the module docs): the median
/// records/s of the 10,000-record adds and of the 1,000-record ones.
async fn add_load(store: &NamedStore, load: Load) -> Result<(f64, f64)> {
    let mut added = 0;
    let mut adds = async |count: usize, size: usize| -> Result<f64> {
        let mut rates = Vec::with_capacity(count);
        for _ in 0..count {
            let text = lines(added, size);
            let started = Instant::now();
            let batch = rows_from_json(store.plugin(), text.as_bytes())?;
            store.add(&batch).await?;
            rates.push(size as f64 / started.elapsed().as_secs_f64());
            added += size;
        }
        Ok(median(rates))
    };
    let r10 = adds(load.rows / 10_000, 10_000).await?;
    let r1 = adds(10, 1_000).await?;
    Ok((r10, r1))
}

/// This host's figures, in the order of [`FIGURES`].
pub async fn ours(runtime: &Arc<PluginRuntime>, dir: &Path, load: Load) -> Result<Vec<f64>> {
    let root = dir.join("host-root");
    let registry = Registry::at(&root, runtime.clone())?;
    let store = registry
        .create(
            "peer",
            CreateOptions::new(SchemaSource::Spec(SchemaSpec::from_json(SPEC)?)),
        )
        .await?;
    let (r10, r1) = add_load(&store, load).await?;
    let gets = async || -> Result<(f64, f64)> {
        let mut times = Vec::with_capacity(load.gets);
        for g in 0..load.gets {
            let key = format!("r{}", load.key(g));
            let started = Instant::now();
            let found = store.get(&key).await?;
            times.push(ms(started.elapsed()));
            ensure!(found.is_some(), "{key} not found");
        }
        times.sort_by(f64::total_cmp);
        Ok((pct(&times, 0.5), pct(&times, 0.99)))
    };
    let tenth = load.total() / 10;
    let scan = async || -> Result<f64> {
        let mut times = Vec::with_capacity(SCANS);
        for _ in 0..SCANS {
            let started = Instant::now();
            let out = store
                .scan(ScanRequest::new().filter(format!("step < {tenth}")))
                .await?;
            times.push(ms(started.elapsed()));
            ensure!(out.num_rows() == tenth, "the scan read {}", out.num_rows());
        }
        Ok(median(times))
    };
    let (g50, g99) = gets().await?;
    let s1 = scan().await?;
    // What the background merges left (the merge figure is measured on a
    // store of its own, below).
    let started = Instant::now();
    let merged = store.merge().await?;
    println!(
        "this host's merge of what background merges left at {} records: {} rows from {} generation(s) in {:.2} s ({})",
        load.total(),
        merged.rows_upserted,
        merged.generations_merged,
        started.elapsed().as_secs_f64(),
        super::through::phases_text(&lance_context_host::merge_report(&merged, 0.0).phases),
    );
    let (m50, m99) = gets().await?;
    let s2 = scan().await?;
    store.close().await?;
    // Disk once the cleanup grace has passed (merged generations and WAL
    // entries removed, old versions past retention): what a store settles
    // at, the grace (15 minutes) shortened to skip the wait.
    let settled = registry
        .open_with("peer", &Default::default(), false, |mut c| {
            c.merge.cleanup_grace = Duration::from_millis(1);
            c.merge.manifest_prune_age = Duration::from_millis(1);
            c.retention.keep_for = Duration::ZERO;
            c
        })
        .await?;
    settled.merge().await?;
    settled.apply_retention().await?;
    settled.close().await?;
    let disk = disk_bytes(&root.join("stores").join("peer")) as f64 / load.total() as f64;
    let exe = std::env::current_exe()?;
    let key = format!("r{}", load.total() / 2);
    let cold = cold_start(|| {
        let mut c = Command::new(&exe);
        c.args(["store", "--root"])
            .arg(&root)
            .args(["get", "peer", &key]);
        c
    })?;
    let upsert = ours_upsert(runtime, dir).await?;
    let merge = ours_merge(&registry, load).await?;
    Ok(vec![
        r1, r10, g50, g99, s1, merge, m50, m99, s2, disk, cold, upsert,
    ])
}

/// The merge figure: the same adds into a store without background merges,
/// then one merge of every record into the base (as the previous
/// implementation merges, its `cleanup_wal` called until nothing is left);
/// records merged per second.
async fn ours_merge(registry: &Registry, load: Load) -> Result<f64> {
    registry
        .create(
            "merge",
            CreateOptions::new(SchemaSource::Spec(SchemaSpec::from_json(SPEC)?)),
        )
        .await?
        .close()
        .await?;
    let store = registry
        .open_with("merge", &Default::default(), false, |c| {
            c.with_manual_maintenance()
        })
        .await?;
    add_load(&store, load).await?;
    let added = load.total();
    let started = Instant::now();
    let merged = store.merge().await?;
    let took = started.elapsed();
    ensure!(
        merged.rows_upserted as usize == added,
        "the merge wrote {} of {added} records",
        merged.rows_upserted
    );
    println!(
        "this host's merge of {added} unmerged records: {} generation(s) in {:.2} s ({})",
        merged.generations_merged,
        took.as_secs_f64(),
        super::through::phases_text(&lance_context_host::merge_report(&merged, 0.0).phases),
    );
    store.close().await?;
    Ok(added as f64 / took.as_secs_f64())
}

/// The previous implementation's figures, in the order of [`FIGURES`].
pub fn theirs(python: &Path, dir: &Path, load: Load) -> Result<Vec<f64>> {
    let uri: PathBuf = dir.join("peer-workload.lance");
    let line = super::bench_search::run_peer(
        python,
        dir,
        PEER_SCRIPT,
        &[
            uri.as_os_str(),
            std::ffi::OsStr::new(PEER_SCHEMA),
            std::ffi::OsStr::new(&load.rows.to_string()),
            std::ffi::OsStr::new(&load.gets.to_string()),
        ],
    )?;
    let mut figures: Vec<f64> =
        serde_json::from_str(&line).context("reading the previous implementation's figures")?;
    let script = dir.join("peer-cold.py");
    std::fs::write(&script, PEER_COLD)?;
    let key = format!("r{}", load.total() / 2);
    figures.push(cold_start(|| {
        let mut c = Command::new(python);
        c.arg(&script).arg(&uri).arg(&key);
        c
    })?);
    figures.push(theirs_upsert(python, dir)?);
    ensure!(
        figures.len() == FIGURES.len(),
        "the previous implementation gave {} figures, not {}",
        figures.len(),
        FIGURES.len()
    );
    Ok(figures)
}

/// The table: each figure's median over the rounds on both sides, and how
/// many times better this host is (more than 1: this host is better).
pub fn report(load: Load, rounds: usize, ours: &[Vec<f64>], theirs: &[Vec<f64>]) {
    println!();
    println!(
        "workload: {} records ({} adds of 10,000, then 10 of 1,000), {} gets per layout, medians of {} round(s)",
        load.total(),
        load.rows / 10_000,
        load.gets,
        rounds
    );
    println!(
        "{:<40} {:>10} {:>14} {:>14} {:>9}",
        "figure", "unit", "previous", "this host", "× better"
    );
    for (i, (name, unit, more_is_better)) in FIGURES.iter().enumerate() {
        let of = |runs: &[Vec<f64>]| median(runs.iter().map(|r| r[i]).collect());
        let us = of(ours);
        let them = if theirs.is_empty() {
            f64::NAN
        } else {
            of(theirs)
        };
        let better = match more_is_better {
            true => us / them,
            false => them / us,
        };
        let cell = |v: f64| match v.is_nan() {
            true => "-".to_string(),
            false if v >= 100.0 => format!("{v:.0}"),
            false => format!("{v:.2}"),
        };
        println!(
            "{name:<40} {unit:>10} {:>14} {:>14} {:>9}",
            cell(them),
            cell(us),
            cell(better)
        );
    }
}

/// Records in the context stores before the upserts.
const UPSERT_PRELOAD: usize = 10_000;
/// Upserts of 1,000 records timed per side per round (the median is
/// reported).
const UPSERTS: usize = 3;

/// The external ids of upsert `u`: 1,000 from `9,500 + 1,000·u`, so that
/// half of each replaces a stored record (preloaded, or upserted by the one
/// before) and half is new.
fn upsert_ids(u: usize) -> std::ops::Range<usize> {
    let from = UPSERT_PRELOAD - 500 + 1_000 * u;
    from..from + 1_000
}

/// The previous implementation's `Context.upsert_many` of the same records
/// (prints the median milliseconds of the upserts).
const PEER_UPSERT: &str = r#"
import json, statistics, sys, time
from lance_context import Context
uri, preload, upserts = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
ctx = Context.create(uri)
def rec(i, v):
    return {"role": "user", "content": f"note {i} version {v}", "external_id": f"e{i}"}
for start in range(0, preload, 10000):
    ctx.add_many([rec(i, 0) for i in range(start, min(preload, start + 10000))])
ts = []
for u in range(upserts):
    batch = [rec(i, u + 1) for i in range(preload - 500 + 1000 * u, preload + 500 + 1000 * u)]
    t = time.perf_counter()
    ctx.upsert_many(batch, key="external_id")
    ts.append((time.perf_counter() - t) * 1000)
print(json.dumps(statistics.median(ts)))
"#;

/// A record of the context schema with external id `e{i}`, its `v`-th
/// version (`id` new for each version, as an upsert requires).
fn context_record(i: usize, v: usize) -> serde_json::Value {
    serde_json::json!({"id": format!("u{i}-{v}"), "run_id": "bench", "role": "user",
        "text_payload": format!("note {i} version {v}"), "external_id": format!("e{i}")})
}

/// This host's upsert of 1,000 records into a `context` store (by
/// `external_id`, records as JSON Lines through the plugin): the median
/// milliseconds.
pub async fn ours_upsert(runtime: &Arc<PluginRuntime>, dir: &Path) -> Result<f64> {
    let registry = Registry::at(dir.join("host-upsert"), runtime.clone())?;
    let store = registry
        .create(
            "ctx",
            CreateOptions::new(SchemaSource::Builtin("context".into())),
        )
        .await?;
    let text: String = (0..UPSERT_PRELOAD)
        .map(|i| context_record(i, 0).to_string() + "\n")
        .collect();
    store
        .add(&rows_from_json(store.plugin(), text.as_bytes())?)
        .await?;
    let mut times = Vec::with_capacity(UPSERTS);
    for u in 0..UPSERTS {
        let text: String = upsert_ids(u)
            .map(|i| context_record(i, u + 1).to_string() + "\n")
            .collect();
        let started = Instant::now();
        let batch = rows_from_json(store.plugin(), text.as_bytes())?;
        let outcomes = store.upsert(&batch).await?;
        times.push(ms(started.elapsed()));
        ensure!(outcomes.len() == 1_000, "{} outcomes", outcomes.len());
    }
    store.close().await?;
    Ok(median(times))
}

/// The previous implementation's `Context.upsert_many` of the same records:
/// the median milliseconds.
pub fn theirs_upsert(python: &Path, dir: &Path) -> Result<f64> {
    let uri = dir.join("peer-upsert.lance");
    let line = super::bench_search::run_peer(
        python,
        dir,
        PEER_UPSERT,
        &[
            uri.as_os_str(),
            std::ffi::OsStr::new(&UPSERT_PRELOAD.to_string()),
            std::ffi::OsStr::new(&UPSERTS.to_string()),
        ],
    )?;
    serde_json::from_str(&line).context("reading the previous implementation's upsert time")
}
