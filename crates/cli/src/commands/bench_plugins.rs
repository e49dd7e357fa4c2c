//! `lance-context dev bench-plugins`: the cost of the plugin boundary, side by side.
//!
//! For batches of 1k, 10k and 100k rollout rows (the built-in rollout plugin):
//! a durable add through the plugin (the pipeline: input matched by name, one
//! transform call that validates and derives the defaults in the sandbox, the
//! batch assembled, then the engine's add) against the same add with the same
//! checks and defaults done natively in the host; the plugin calls and the
//! native checks alone; the per-call overhead (a one-row validate) and the time
//! to load (compile, cached compile, instantiate + describe).

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Result, ensure};
use arrow_array::{
    Array, ArrayRef, Int32Array, LargeStringArray, RecordBatch, StringArray,
    TimestampMicrosecondArray, builder::StringDictionaryBuilder, new_null_array, types::Int8Type,
};
use clap::Args;
use lance_context_host::{LoadedPlugin, PluginLimits, PluginRuntime};
use lance_context_store::{Store, StoreConfig};

#[derive(Args, Debug)]
pub struct PluginBenchArgs {
    /// Directory for the benchmark stores (recreated).
    #[arg(long, default_value = "data/bench-plugins")]
    data: std::path::PathBuf,
    /// Adds per batch size and path.
    #[arg(long, default_value_t = 9)]
    repeats: usize,
    /// Cached starts (and loads in a runtime that compiled the plugin)
    /// timed; the medians are reported. Many (hundreds) for a profile.
    #[arg(long, default_value_t = 5)]
    starts: usize,
}

fn input(schema: &arrow_schema::SchemaRef, start: usize, n: usize) -> Result<RecordBatch> {
    let columns: Vec<ArrayRef> = schema
        .fields()
        .iter()
        .map(|f| -> ArrayRef {
            match f.name().as_str() {
                "id" => Arc::new(StringArray::from_iter_values(
                    (start..start + n).map(|i| format!("row-{i:09}")),
                )),
                "rollout_id" => Arc::new(StringArray::from_iter_values(
                    (start..start + n).map(|i| format!("rollout-{}", i / 50)),
                )),
                "content" => Arc::new(LargeStringArray::from_iter_values(
                    (start..start + n).map(|i| format!("turn {i}: the quick brown fox jumps")),
                )),
                "reward" => Arc::new(arrow_array::Float32Array::from_iter_values(
                    (0..n).map(|i| i as f32 / n as f32),
                )),
                _ => new_null_array(f.data_type(), n),
            }
        })
        .collect();
    Ok(RecordBatch::try_new(schema.clone(), columns)?)
}

/// The rollout plugin's checks and defaults, written natively.
fn native_prepare(
    batch: &RecordBatch,
    declared: &arrow_schema::SchemaRef,
    now: i64,
) -> Result<RecordBatch> {
    let strings = |name: &str| {
        batch
            .column_by_name(name)
            .and_then(|c| c.as_any().downcast_ref::<StringArray>().cloned())
    };
    let ids = strings("id").expect("id");
    let rollouts = strings("rollout_id").expect("rollout_id");
    for i in 0..batch.num_rows() {
        ensure!(
            ids.is_valid(i) && !ids.value(i).is_empty(),
            "row {i}: id is required"
        );
        ensure!(
            rollouts.is_valid(i) && !rollouts.value(i).is_empty(),
            "row {i}: rollout_id is required"
        );
    }
    let n = batch.num_rows();
    let mut columns: Vec<ArrayRef> = Vec::new();
    for f in declared.fields() {
        let given = batch.column_by_name(f.name()).cloned();
        columns.push(match f.name().as_str() {
            "problem_id" => Arc::new(rollouts.clone()),
            "sequence_order" => Arc::new(Int32Array::from(vec![0; n])),
            "role" => {
                let mut b = StringDictionaryBuilder::<Int8Type>::new();
                for _ in 0..n {
                    b.append("assistant")?;
                }
                Arc::new(b.finish())
            }
            "content_type" => Arc::new(StringArray::from(vec!["text/plain"; n])),
            "created_at" => Arc::new(TimestampMicrosecondArray::from(vec![now; n])),
            _ => given.unwrap_or_else(|| new_null_array(f.data_type(), n)),
        });
    }
    Ok(RecordBatch::try_new(declared.clone(), columns)?)
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

/// Load the plugin: compiled (a first start), then `starts` cached starts
/// (what a new process opening a store does: a new runtime, the plugin's
/// file read and checked against the store's pin, the component from the
/// compile cache, described), then `starts` loads in a runtime that holds
/// the compiled plugin already (a second store of the same plugin, a store
/// opened again). The last runtime and its plugin.
fn load(
    file: &std::path::Path,
    cache: &std::path::Path,
    starts: usize,
) -> Result<(PluginRuntime, LoadedPlugin)> {
    let starts = starts.max(1);
    let bytes = std::fs::read(file)?;
    let t = Instant::now();
    let cold = PluginRuntime::new(PluginLimits::default(), Some(cache))?;
    let pin = cold
        .load("rollout", &bytes, vec![])?
        .declaration()
        .sha256
        .clone();
    let cold_load = t.elapsed();
    drop(cold);
    let (mut runtimes, mut cached) = (Vec::new(), Vec::new());
    for _ in 0..starts {
        let t = Instant::now();
        let runtime = PluginRuntime::new(PluginLimits::default(), Some(cache))?;
        runtimes.push(t.elapsed());
        let t = Instant::now();
        let bytes = std::fs::read(file)?;
        runtime.load_pinned("rollout", &bytes, &pin, vec![])?;
        cached.push(t.elapsed());
    }
    let runtime = PluginRuntime::new(PluginLimits::default(), Some(cache))?;
    let mut plugin: LoadedPlugin = runtime.load_pinned("rollout", &bytes, &pin, vec![])?;
    let mut in_memory = Vec::new();
    for _ in 0..starts {
        let t = Instant::now();
        let bytes = std::fs::read(file)?;
        plugin = runtime.load_pinned("rollout", &bytes, &pin, vec![])?;
        in_memory.push(t.elapsed());
    }
    let (runtime_new, from_cache) = (median(runtimes), median(cached));
    let started = runtime_new + from_cache;
    println!(
        "load:   first start (compile) {:.1} ms | cached start {:.1} ms: a runtime {:.1} ms + the plugin read, checked against its pin and loaded from the compile cache {:.1} ms (goal ≤ 5 ms: {}) | the plugin again in a runtime that compiled it {:.1} ms (medians of {starts})",
        ms(cold_load),
        ms(started),
        ms(runtime_new),
        ms(from_cache),
        if ms(started) <= 5.0 { "met" } else { "NOT met" },
        ms(median(in_memory)),
    );
    Ok((runtime, plugin))
}

/// The cost of one call: a one-row validate, the instance reused.
fn call_overhead(plugin: &LoadedPlugin, input_schema: &arrow_schema::SchemaRef) -> Result<()> {
    let one = input(input_schema, 0, 1)?;
    plugin.validate(&one)?;
    let t = Instant::now();
    for _ in 0..200 {
        plugin.validate(&one)?;
    }
    println!(
        "call:   one-row validate {:.3} ms per call (instance reused)",
        ms(t.elapsed()) / 200.0
    );
    Ok(())
}

pub async fn run(args: PluginBenchArgs) -> Result<()> {
    if args.data.exists() {
        std::fs::remove_dir_all(&args.data)?;
    }
    std::fs::create_dir_all(&args.data)?;
    let file = lance_context_host::built_plugin("rollout");
    let cache = args.data.join("compile-cache");

    // Loading.
    let (_runtime, plugin) = load(&file, &cache, args.starts)?;

    // Per-call overhead.
    let input_schema = lance_context_host::input_schema(&plugin);
    call_overhead(&plugin, &input_schema)?;

    let declared = plugin.declaration().schema.clone();
    let config = |name: &str| {
        StoreConfig::new(args.data.join(name).to_string_lossy())
            .with_schema(declared.clone())
            .with_manual_maintenance()
    };
    let via_plugin = Store::create(config("via-plugin")).await?;
    let native = Store::create(config("native")).await?;
    println!(
        "{:>7} | {:>13} | {:>13} | {:>12} | {:>13} | {:>13} | {:>10}",
        "rows",
        "plugin add ms",
        "native add ms",
        "plugin calls",
        "native checks",
        "boundary cost",
        "end-to-end"
    );
    let mut start = 0;
    for n in [1_000usize, 10_000, 100_000] {
        let mut plugin_adds = Vec::new();
        let mut native_adds = Vec::new();
        let mut calls = Vec::new();
        let mut checks = Vec::new();
        for repeat in 0..args.repeats {
            // Alternate which path goes first, so drift (page cache, WAL
            // growth) does not favour one.
            for plugin_path in [repeat % 2 == 0, repeat % 2 == 1] {
                let batch = input(&input_schema, start, n)?;
                start += n;
                let t = Instant::now();
                if plugin_path {
                    let given = lance_context_host::to_input(&plugin, &batch)?;
                    let ready = plugin.prepare(&given, 1)?;
                    calls.push(t.elapsed());
                    via_plugin.add(&ready).await?;
                    plugin_adds.push(t.elapsed());
                } else {
                    let ready = native_prepare(&batch, &declared, 1)?;
                    checks.push(t.elapsed());
                    native.add(&ready).await?;
                    native_adds.push(t.elapsed());
                }
            }
        }
        let (p, nat) = (median(plugin_adds), median(native_adds));
        let (c, k) = (median(calls), median(checks));
        println!(
            "{n:>7} | {:>13.1} | {:>13.1} | {:>12.2} | {:>13.2} | {:>12.1}% | {:>9.1}%",
            ms(p),
            ms(nat),
            ms(c),
            ms(k),
            (c.as_secs_f64() - k.as_secs_f64()) / nat.as_secs_f64() * 100.0,
            (p.as_secs_f64() / nat.as_secs_f64() - 1.0) * 100.0
        );
    }
    println!(
        "boundary cost = (plugin calls - native checks) / native add; \
         end-to-end = plugin add / native add - 1 (medians of {} adds)",
        args.repeats
    );
    via_plugin.close().await?;
    native.close().await?;
    Ok(())
}
