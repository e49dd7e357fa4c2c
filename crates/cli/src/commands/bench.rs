//! `lance-context dev bench`: side-by-side figures for the storage engine, in one run.
//!
//! 1. Write `rows` rows through durable adds of `batch` rows each.
//! 2. Merge them from the WAL into the base table: rows/s, the merge's peak
//!    buffered bytes against its budget, and the process's peak RSS.
//! 3. Point lookups of random keys through the key index (`get`) vs the same
//!    lookups as a full scan (a predicate the index cannot answer), reported as
//!    p50/p95 latency and their ratio.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use arrow_array::{Int64Array, LargeStringArray, RecordBatch, StringArray};
use arrow_schema::{DataType, Field, Schema, SchemaRef};
use clap::Args;
use lance_context_store::{ScanRequest, Store, StoreConfig};

#[derive(Args, Debug)]
pub struct BenchArgs {
    /// Directory for the benchmark store (deleted and recreated).
    #[arg(long, default_value = "data/bench")]
    data: std::path::PathBuf,
    /// Rows to write and merge.
    #[arg(long, default_value_t = 1_000_000)]
    rows: usize,
    /// Rows per add.
    #[arg(long, default_value_t = 100_000)]
    batch: usize,
    /// Merge memory budget in MiB.
    #[arg(long, default_value_t = 64)]
    merge_budget_mib: usize,
    /// Point lookups per method.
    #[arg(long, default_value_t = 50)]
    lookups: usize,
    /// Also compare a store with every record capability against a plain
    /// one at this many rows (0: skip).
    #[arg(long, default_value_t = 0)]
    records_rows: usize,
    /// Timed repeats of each operation in the record-capabilities comparison
    /// (count, filtered scan, upsert); medians are reported.
    #[arg(long, default_value_t = 5)]
    records_repeats: usize,
    /// Also measure disk use after this many add+merge rounds under each
    /// retention setting (0: skip).
    #[arg(long, default_value_t = 0)]
    retention_merges: usize,
    /// Skip the add/merge/lookup section (run only the sections asked for).
    #[arg(long)]
    skip_core: bool,
    /// Keys per page of the key index in the add/merge/lookup section
    /// (default: the engine's, 512).
    #[arg(long)]
    key_index_page_rows: Option<u64>,
}

fn schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("id", DataType::Utf8, false),
        Field::new("group_id", DataType::Utf8, false),
        Field::new("seq", DataType::Int64, false),
        Field::new("content", DataType::LargeUtf8, true),
    ]))
}

fn key(i: usize) -> String {
    format!("key-{i:010}")
}

fn make_batch(schema: &SchemaRef, start: usize, n: usize) -> Result<RecordBatch> {
    Ok(RecordBatch::try_new(
        schema.clone(),
        vec![
            Arc::new(StringArray::from_iter_values((start..start + n).map(key))),
            Arc::new(StringArray::from_iter_values(
                (start..start + n).map(|i| format!("group-{}", i / 100)),
            )),
            Arc::new(Int64Array::from_iter_values(
                (start..start + n).map(|i| i as i64),
            )),
            Arc::new(LargeStringArray::from_iter_values(
                (start..start + n).map(|i| format!("message {i}: the quick brown fox")),
            )),
        ],
    )?)
}

fn peak_rss_mib() -> Option<f64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kib: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib / 1024.0)
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let idx = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[idx]
}

pub async fn run(args: BenchArgs) -> Result<()> {
    if args.data.exists() {
        std::fs::remove_dir_all(&args.data)
            .with_context(|| format!("clearing {}", args.data.display()))?;
    }
    std::fs::create_dir_all(&args.data)?;
    let uri = std::fs::canonicalize(&args.data)?
        .to_string_lossy()
        .into_owned();
    let dir = std::path::PathBuf::from(&uri);
    if !args.skip_core {
        core(&args, &uri).await?;
    }
    if args.records_rows > 0 {
        super::bench_records::run(
            &dir.join("records"),
            args.records_rows,
            args.batch,
            args.lookups,
            args.records_repeats.max(1),
        )
        .await?;
    }
    if args.retention_merges > 0 {
        super::bench_records::retention(&dir.join("retention"), args.retention_merges).await?;
    }
    Ok(())
}

async fn core(args: &BenchArgs, uri: &str) -> Result<()> {
    let uri = format!("{uri}/core");
    let schema = schema();
    let budget = args.merge_budget_mib << 20;
    let mut config = StoreConfig::new(&uri)
        .with_schema(schema.clone())
        .with_manual_maintenance();
    config.merge.batch_budget_bytes = budget;
    config.indexes.key_index_page_rows = args.key_index_page_rows;
    let store = Store::create(config).await?;

    // 1. Durable adds.
    let t = Instant::now();
    let mut written = 0;
    while written < args.rows {
        let n = args.batch.min(args.rows - written);
        store.add(&make_batch(&schema, written, n)?).await?;
        written += n;
    }
    let add_time = t.elapsed();
    println!(
        "add:    {written} rows in {} adds, {:.2}s, {:.0} rows/s (durable + visible per add)",
        written.div_ceil(args.batch),
        add_time.as_secs_f64(),
        written as f64 / add_time.as_secs_f64()
    );

    // 2. Merge.
    let rss_before = peak_rss_mib();
    let t = Instant::now();
    let stats = store.merge().await?;
    let merge_time = t.elapsed();
    println!(
        "merge:  {} rows from {} generations in {:.2}s = {:.0} rows/s; {} passes; peak buffered {:.1} MiB (budget {} MiB); process peak RSS {:.0} MiB (before merge {:.0} MiB)",
        stats.rows_upserted,
        stats.generations_merged,
        merge_time.as_secs_f64(),
        stats.rows_upserted as f64 / merge_time.as_secs_f64(),
        stats.passes,
        stats.peak_buffered_bytes as f64 / (1 << 20) as f64,
        args.merge_budget_mib,
        peak_rss_mib().unwrap_or(f64::NAN),
        rss_before.unwrap_or(f64::NAN),
    );

    // 3. Point lookups: key index vs full scan.
    let mut rng = 0x2545_f491_4f6c_dd1du64;
    let mut next = || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        (rng % written as u64) as usize
    };
    let ids: Vec<String> = (0..args.lookups).map(|_| key(next())).collect();
    // Warm both paths once.
    store.get(&ids[0]).await?.context("warm-up lookup")?;
    let mut indexed = Vec::with_capacity(ids.len());
    for id in &ids {
        let t = Instant::now();
        let row = store.get(id).await?;
        indexed.push(t.elapsed());
        anyhow::ensure!(row.is_some(), "{id} not found through the index");
    }
    let mut scanned = Vec::with_capacity(ids.len());
    for id in &ids {
        let t = Instant::now();
        // `id || ''` cannot be answered by the key index: a full scan.
        let found = store
            .scan(ScanRequest::new().filter(format!("id || '' = '{id}'")))
            .await?;
        scanned.push(t.elapsed());
        anyhow::ensure!(found.num_rows() == 1, "{id} not found by the scan");
    }
    indexed.sort();
    scanned.sort();
    let (i50, s50) = (percentile(&indexed, 0.5), percentile(&scanned, 0.5));
    println!(
        "lookup: key index p50 {:.2} ms p95 {:.2} ms | full scan p50 {:.2} ms p95 {:.2} ms | index is {:.0}x faster (p50), {} lookups each over {written} rows",
        i50.as_secs_f64() * 1e3,
        percentile(&indexed, 0.95).as_secs_f64() * 1e3,
        s50.as_secs_f64() * 1e3,
        percentile(&scanned, 0.95).as_secs_f64() * 1e3,
        s50.as_secs_f64() / i50.as_secs_f64().max(1e-9),
        args.lookups,
    );
    store.close().await?;
    Ok(())
}
