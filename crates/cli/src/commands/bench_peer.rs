//! `lance-context dev bench-peer`: this host against the previous
//! implementation (the `lance-context` 0.6.7 Python package, installed into
//! a virtual environment), side by side in one run, alternating.
//!
//! This release measures the **single durable add** — what an agent does
//! after every step — and where its time goes, each variant on the same
//! record (an id, two scalars, a text, a 64-dimensional vector), a fresh
//! dataset per round:
//! - **host**: a spec store's add through the plugin (validate, transform)
//!   and the engine; durable and visible to other processes on return;
//! - **engine alone**: `Store::add` of the same row, no plugin;
//! - **floor**: Lance's own writer — put, freeze, wait for the generation —
//!   with a put that is not durable (the freeze's flush writes the WAL
//!   entry before the generation), and with a durable put, as the engine's
//!   (which waits for the WAL flush timer);
//! - **previous**: `GenericStore.add` with `seal_on_add=True` (readable by
//!   another process when it returns);
//! - two diagnostics: the engine with its background merges off, and the
//!   floor with the key index Lance's writer then keeps in each memtable
//!   and writes with each generation (as earlier versions of the engine
//!   did; this one keeps none and makes every freeze itself).
//!
//! Then the workload ([`bench_workload`]): batched adds of 1k and 10k
//! records, gets (p50/p99) and a filtered scan before and after a merge,
//! the merge's throughput, disk bytes per record and a cold start, on both,
//! at 20k records (rounds alternating) and once at ~1M. Vector search
//! against the previous implementation is `bench-search`; the upsert of
//! 1,000 records against its floor, `bench --records-rows`.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, ensure};

use super::bench_workload;
use clap::Args;
use lance_context_host::spec::SchemaSpec;
use lance_context_host::{
    CreateOptions, PluginLimits, PluginRuntime, Registry, SchemaSource, rows_from_json,
};
use lance_context_store::floor::{FloorPut, bare_shard_adds};
use lance_context_store::{Store, StoreConfig};
use serde_json::json;

#[derive(Args, Debug)]
pub struct PeerBenchArgs {
    /// Adds per variant per round (the first of each round is a warm-up,
    /// not counted).
    #[arg(long, default_value_t = 40)]
    adds: usize,
    /// Rounds; the variants alternate within each.
    #[arg(long, default_value_t = 5)]
    rounds: usize,
    /// Working directory (datasets, the peer's script).
    #[arg(long, default_value = "target/bench-peer")]
    data: PathBuf,
    /// The previous implementation's Python (with `lance-context` 0.6.7).
    /// Default: `target/peer-venv/bin/python`, made with pip when missing.
    #[arg(long)]
    peer_python: Option<PathBuf>,
    /// Leave the previous implementation out.
    #[arg(long)]
    no_peer: bool,
    /// The workload's records in 10,000-record adds (10 adds of 1,000
    /// follow); 0 leaves the workload out.
    #[arg(long, default_value_t = 10_000)]
    workload_rows: usize,
    /// Rounds of the workload (each side, alternating).
    #[arg(long, default_value_t = 3)]
    workload_rounds: usize,
    /// The workload once more at this many records (one round); 0 leaves it
    /// out.
    #[arg(long, default_value_t = 1_000_000)]
    large_rows: usize,
    /// Gets per layout (unmerged, merged) in the workload.
    #[arg(long, default_value_t = 200)]
    gets: usize,
    /// Leave the single durable add out (the workload only).
    #[arg(long)]
    no_single_add: bool,
}

const DIM: usize = 64;

pub(super) const SPEC: &str = r#"{"name": "peer", "key": "id", "columns": [
    {"name": "id", "type": "Utf8", "nullable": false},
    {"name": "step", "type": "Int64"},
    {"name": "score", "type": "Float32"},
    {"name": "text", "type": "Utf8"},
    {"name": "emb", "type": "FixedSizeList(64 x Float32)"}],
  "vectors": [{"column": "emb", "dimension": 64, "metric": "cosine"}]}"#;

/// The previous implementation's declaration of the same schema.
pub(super) const PEER_SCHEMA: &str = r#"{"id": {"type": "string", "nullable": false},
  "step": "int64", "score": "float32", "text": "string",
  "emb": {"type": "vector", "dim": 64, "metric": "cosine"}}"#;

const PEER_SCRIPT: &str = r#"
import json, sys, time
from lance_context import GenericStore
uri, schema, n = sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3])
store = GenericStore.open(uri, schema=schema, seal_on_add=True)
times = []
for i in range(n):
    row = {"id": f"r{i}", "step": i, "score": i / 7, "text": f"step {i} of the agent",
           "emb": [((i * 31 + j) % 17) / 17 + 0.01 for j in range(64)]}
    t = time.perf_counter()
    store.add([row])
    times.append((time.perf_counter() - t) * 1000)
print(json.dumps(times[1:]))
"#;

pub(super) fn record(i: usize) -> serde_json::Value {
    let emb: Vec<f32> = (0..DIM)
        .map(|j| ((i * 31 + j) % 17) as f32 / 17.0 + 0.01)
        .collect();
    json!({"id": format!("r{i}"), "step": i, "score": i as f32 / 7.0,
           "text": format!("step {i} of the agent"), "emb": emb})
}

pub(super) fn pct(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let at = ((sorted.len() - 1) as f64 * p).round() as usize;
    sorted[at]
}

fn ms(d: &Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

pub async fn run(args: PeerBenchArgs) -> Result<()> {
    ensure!(
        args.adds >= 2,
        "--adds must be at least 2 (the first is a warm-up)"
    );
    ensure!(args.rounds >= 1, "--rounds must be at least 1");
    if args.data.exists() {
        std::fs::remove_dir_all(&args.data)
            .with_context(|| format!("clearing {}", args.data.display()))?;
    }
    std::fs::create_dir_all(&args.data)?;
    let python = match args.no_peer {
        true => None,
        false => super::bench_search::peer_python(args.peer_python.as_deref()),
    };
    let runtime = Arc::new(PluginRuntime::new(
        PluginLimits::default(),
        lance_context_host::default_cache_dir().as_deref(),
    )?);
    if !args.no_single_add {
        single_add(&args, &runtime, python.as_deref()).await?;
    }
    workload(&args, &runtime, python.as_deref()).await
}

/// The single durable add: every variant, alternating round by round.
async fn single_add(
    args: &PeerBenchArgs,
    runtime: &Arc<PluginRuntime>,
    python: Option<&Path>,
) -> Result<()> {
    let names = [
        "host (plugin + engine)",
        "engine alone",
        "floor: put, freeze flushes the WAL",
        "floor: durable put, freeze",
        "previous: GenericStore seal_on_add",
        "engine, no background merges",
        "floor + key index in the memtable",
        // Parts of the host's adds, timed within its rounds.
        "host part: records read (JSON → Arrow)",
        "host part: plugin call (prepare, apart)",
    ];
    // The variants run; the rest are parts of the host's adds.
    const VARIANTS: usize = 7;
    let mut samples: Vec<Vec<f64>> = vec![Vec::new(); names.len()];
    println!(
        "bench-peer: single durable add, {} rounds × {} adds per variant (first of each round not counted)",
        args.rounds, args.adds
    );
    for round in 0..args.rounds {
        let dir = args.data.join(format!("round-{round}"));
        std::fs::create_dir_all(&dir)?;
        // Alternate the order: each variant goes first in some round.
        let mut order: Vec<usize> = (0..VARIANTS).collect();
        order.rotate_left(round % VARIANTS);
        for v in order {
            let times = match v {
                0 => {
                    let [total, read, plugin] = host_adds(runtime, &dir, args.adds).await?;
                    samples[VARIANTS].extend(read);
                    samples[VARIANTS + 1].extend(plugin);
                    total
                }
                1 | 5 => engine_adds(runtime, &dir, args.adds, v == 1).await?,
                2 | 3 | 6 => floor_adds(runtime, &dir, args.adds, v == 3, v == 6).await?,
                _ => match python {
                    Some(p) => peer_adds(p, &dir, args.adds)?,
                    None => Vec::new(),
                },
            };
            samples[v].extend(times);
        }
        println!("round {} of {} done", round + 1, args.rounds);
    }
    for s in &mut samples {
        s.sort_by(f64::total_cmp);
    }
    report(&names, &samples);
    Ok(())
}

/// The workload on both sides (see [`bench_workload`]): at `--workload-rows`
/// for `--workload-rounds` rounds, then once at `--large-rows`.
async fn workload(
    args: &PeerBenchArgs,
    runtime: &Arc<PluginRuntime>,
    python: Option<&Path>,
) -> Result<()> {
    for (rows, rounds) in [
        (args.workload_rows, args.workload_rounds),
        (args.large_rows, 1),
    ] {
        if rows == 0 || rounds == 0 {
            continue;
        }
        ensure!(
            rows % 10_000 == 0,
            "--workload-rows and --large-rows are multiples of 10,000 (got {rows})"
        );
        let load = bench_workload::Load {
            rows,
            gets: args.gets,
        };
        let (mut ours, mut theirs) = (Vec::new(), Vec::new());
        for round in 0..rounds {
            let dir = args.data.join(format!("workload-{rows}-{round}"));
            std::fs::create_dir_all(&dir)?;
            // Alternate which side goes first.
            let peer_first = round % 2 == 1;
            if let (true, Some(p)) = (peer_first, python) {
                theirs.push(bench_workload::theirs(p, &dir, load)?);
            }
            ours.push(bench_workload::ours(runtime, &dir, load).await?);
            if let (false, Some(p)) = (peer_first, python) {
                theirs.push(bench_workload::theirs(p, &dir, load)?);
            }
            std::fs::remove_dir_all(&dir).ok();
            println!(
                "workload at {} records: round {} of {rounds} done",
                rows + 10_000,
                round + 1
            );
        }
        bench_workload::report(load, rounds, &ours, &theirs);
    }
    Ok(())
}

/// The table (p50, p99, ratios to the floor and to the previous
/// implementation), where the host's time goes, and the goals; `samples`
/// sorted, in the order of `names`.
fn report(names: &[&str], samples: &[Vec<f64>]) {
    let p50: Vec<f64> = samples.iter().map(|s| pct(s, 0.5)).collect();
    let floor = p50[2];
    let previous = p50[4];
    println!();
    println!(
        "{:<38} {:>9} {:>9} {:>9} {:>11}",
        "single durable add", "p50 ms", "p99 ms", "× floor", "× previous"
    );
    for (i, name) in names.iter().enumerate() {
        if samples[i].is_empty() {
            println!("{name:<38} {:>9}", "skipped");
            continue;
        }
        println!(
            "{name:<38} {:>9.2} {:>9.2} {:>9.2} {:>11}",
            p50[i],
            pct(&samples[i], 0.99),
            p50[i] / floor,
            match previous.is_nan() {
                true => "-".to_string(),
                false => format!("{:.2}", p50[i] / previous),
            }
        );
    }
    println!();
    println!(
        "where the host's p50 goes: {:.2} ms over the engine alone (host − engine: records read {:.2} ms, plugin call {:.2} ms, the rest {:.2} ms), engine {:.2} ms over the floor (engine − floor), floor {:.2} ms; a durable put would add {:.2} ms (the WAL timer)",
        p50[0] - p50[1],
        p50[7],
        p50[8],
        p50[0] - p50[1] - p50[7] - p50[8],
        p50[1] - floor,
        floor,
        p50[3] - floor
    );
    println!(
        "diagnostics: a key index kept in each memtable and written with each generation would cost {:.2} ms (floor + key index − floor; the engine keeps none, and makes every freeze itself); background merges beside the adds {:.2} ms (engine − engine without them; the count trigger waits for a pause in the adds)",
        p50[6] - floor,
        p50[1] - p50[5]
    );
    let goal = |ok: bool| if ok { "met" } else { "not met" };
    println!(
        "goals: host ≤ 1.2× floor: {:.2}× {}; host ≤ previous: {}",
        p50[0] / floor,
        goal(p50[0] <= 1.2 * floor),
        match previous.is_nan() {
            true => "previous skipped".to_string(),
            false => format!("{:.2}× {}", p50[0] / previous, goal(p50[0] <= previous)),
        }
    );
}

/// Adds through a spec store (plugin and engine), one record each: the
/// adds' times, the part of each that reads the record (JSON → Arrow), and
/// the plugin's call for the same record timed apart, after each add (the
/// call `add` makes: `prepare`, a fresh instance on a blocking thread).
async fn host_adds(runtime: &Arc<PluginRuntime>, dir: &Path, n: usize) -> Result<[Vec<f64>; 3]> {
    let registry = Registry::at(dir.join("host"), runtime.clone())?;
    let store = registry
        .create(
            "peer",
            CreateOptions::new(SchemaSource::Spec(SchemaSpec::from_json(SPEC)?)),
        )
        .await?;
    let (mut times, mut reads, mut calls) = (
        Vec::with_capacity(n),
        Vec::with_capacity(n),
        Vec::with_capacity(n),
    );
    for i in 0..n {
        let text = record(i).to_string();
        let started = Instant::now();
        let batch = rows_from_json(store.plugin(), text.as_bytes())?;
        let read = started.elapsed();
        store.add(&batch).await?;
        times.push(ms(&started.elapsed()));
        reads.push(ms(&read));
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)?
            .as_micros() as i64;
        let called = Instant::now();
        lance_context_host::prepare(store.plugin(), &batch, now).await?;
        calls.push(ms(&called.elapsed()));
    }
    store.close().await?;
    Ok([times.split_off(1), reads.split_off(1), calls.split_off(1)])
}

/// The batches the plugin's schema reads the records as (for the variants
/// without a plugin call on the timed path).
async fn batches(
    runtime: &Arc<PluginRuntime>,
    n: usize,
) -> Result<(arrow_schema::SchemaRef, Vec<arrow_array::RecordBatch>)> {
    let spec = SchemaSpec::from_json(SPEC)?;
    let plugin = runtime
        .load_async(
            "peer",
            lance_context_host::builtin_plugin_bytes("spec-plugin")
                .context("the built-in spec plugin")?
                .to_vec(),
            vec![("spec".to_string(), spec.to_json())],
        )
        .await?;
    let schema = plugin.declaration().schema.clone();
    let mut out = Vec::with_capacity(n);
    for i in 0..n {
        out.push(rows_from_json(&plugin, record(i).to_string().as_bytes())?);
    }
    Ok((schema, out))
}

/// `Store::add` of the same rows, no plugin; with or without the
/// background merges (by generation count and by time).
async fn engine_adds(
    runtime: &Arc<PluginRuntime>,
    dir: &Path,
    n: usize,
    merges: bool,
) -> Result<Vec<f64>> {
    let (schema, rows) = batches(runtime, n).await?;
    let name = if merges { "engine" } else { "engine-no-merges" };
    let uri = dir.join(name).to_string_lossy().into_owned();
    let mut config = StoreConfig::new(&uri).with_schema(schema);
    if !merges {
        config.merge.generation_threshold = None;
        config.merge.interval = None;
        config.merge.max_unmerged_generations = None;
    }
    let store = Store::create(config).await?;
    let mut times = Vec::with_capacity(n);
    for batch in &rows {
        let started = Instant::now();
        store.add(batch).await?;
        times.push(ms(&started.elapsed()));
    }
    store.close().await?;
    Ok(times.split_off(1))
}

/// Lance's writer alone: put, freeze, wait for the generation.
async fn floor_adds(
    runtime: &Arc<PluginRuntime>,
    dir: &Path,
    n: usize,
    durable: bool,
    key_index: bool,
) -> Result<Vec<f64>> {
    let (schema, rows) = batches(runtime, n).await?;
    let name = match (durable, key_index) {
        (true, _) => "floor-durable",
        (false, true) => "floor-key-index",
        (false, false) => "floor",
    };
    let uri = dir.join(name).to_string_lossy().into_owned();
    let put = match durable {
        true => FloorPut::Durable,
        false => FloorPut::FreezeFlushes,
    };
    let interval = lance_context_store::WriterSettings::default().wal_flush_interval;
    let times = bare_shard_adds(
        &uri,
        schema,
        &rows,
        put,
        interval,
        key_index.then_some("id"),
    )
    .await?;
    Ok(times.iter().skip(1).map(ms).collect())
}

/// The previous implementation's `GenericStore.add` with `seal_on_add`.
fn peer_adds(python: &Path, dir: &Path, n: usize) -> Result<Vec<f64>> {
    let uri = dir.join("peer.lance");
    let n = n.to_string();
    let line = super::bench_search::run_peer(
        python,
        dir,
        PEER_SCRIPT,
        &[
            uri.as_os_str(),
            std::ffi::OsStr::new(PEER_SCHEMA),
            std::ffi::OsStr::new(&n),
        ],
    )?;
    serde_json::from_str(&line).context("reading the previous implementation's times")
}
