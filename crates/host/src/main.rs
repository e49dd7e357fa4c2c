//! `lance-context`: the operator CLI.
//!
//! `demo` is the main job on the embedded default (a local directory store); the
//! other commands read any store without claiming its writer.

mod bench;
mod bench_plugins;
mod bench_records;
mod store_cli;
mod torture;

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, Result, bail};
use arrow_array::{
    Array, Float32Array, Int32Array, LargeStringArray, RecordBatch, StringArray,
    TimestampMicrosecondArray,
};
use arrow_schema::{DataType, Field, Schema, SchemaRef, TimeUnit};
use clap::{Args, Parser, Subcommand};
use lance_context_store::{ErrorKind, ScanRequest, SortKey, Store, StoreConfig, generate_id};

#[derive(Parser, Debug)]
#[command(
    name = "lance-context",
    version,
    about = "Storage host for AI-agent data on Lance"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Write and read a demo store in a local directory, and report what it did.
    Demo(DemoArgs),
    /// Benchmark the plugin boundary: adds through the rollout plugin vs native.
    BenchPlugins(bench_plugins::PluginBenchArgs),
    /// Stores by name in a data root: create (from a plugin or a spec file),
    /// list, describe, drop, add, get, scan, named queries.
    Store(store_cli::StoreArgs),
    /// Schema plugins: inspect a declaration, check a component.
    Plugin {
        #[command(subcommand)]
        command: PluginCommand,
    },
    /// Benchmark adds, merge and point lookups (key index vs full scan).
    Bench(bench::BenchArgs),
    /// Seeded crash trials: a writer (and an operator's maintenance) killed at
    /// random moments, then every acknowledged write checked.
    Torture(torture::TortureArgs),
    #[command(hide = true)]
    TortureWriter(torture::WorkerArgs),
    #[command(hide = true)]
    TortureMaintainer(torture::WorkerArgs),
    /// Count rows (newest version per key).
    Count {
        #[command(flatten)]
        store: StoreArgs,
        /// SQL predicate.
        #[arg(long)]
        filter: Option<String>,
    },
    /// Print rows by key, as JSON lines.
    Get {
        #[command(flatten)]
        store: StoreArgs,
        /// Keys to look up.
        #[arg(required = true)]
        ids: Vec<String>,
    },
    /// Print rows as JSON lines.
    Scan {
        #[command(flatten)]
        store: StoreArgs,
        #[command(flatten)]
        scan: ScanArgs,
        /// Print the scan plan instead of rows.
        #[arg(long)]
        explain: bool,
    },
    /// Operator statistics: rows, fragments, pending generations, indexes.
    Status {
        #[command(flatten)]
        store: StoreArgs,
    },
    /// Merge an instance's unmerged generations into the base table. Claims that
    /// instance's writer (a running writer of the same instance is fenced).
    Merge {
        #[command(flatten)]
        store: StoreArgs,
        /// The instance whose shard to merge.
        #[arg(long, default_value = "default")]
        instance: String,
    },
    /// Compact the base table's fragments and re-ensure its indexes. Needs
    /// no writer: a running writer is not disturbed.
    Compact {
        #[command(flatten)]
        store: StoreArgs,
    },
}

#[derive(Subcommand, Debug)]
enum PluginCommand {
    /// Print a plugin's declared schema as a table.
    Inspect {
        /// A built-in plugin (rollout, context, datagen) or a path to a .wasm component.
        plugin: String,
        /// Creation parameter `name=json`; repeatable (e.g. `embedding_dim=8`).
        #[arg(long = "param", value_parser = parse_kv)]
        params: Vec<(String, String)>,
    },
    /// Load a component with the host's checks and report every problem found.
    Check {
        /// Path to a .wasm component (or a built-in plugin's name).
        plugin: String,
        #[arg(long = "param", value_parser = parse_kv)]
        params: Vec<(String, String)>,
    },
}

#[derive(Args, Debug)]
struct StoreArgs {
    /// Dataset URI (local path or s3://…).
    #[arg(long)]
    uri: String,
    /// Key column.
    #[arg(long, default_value = "id")]
    key: String,
    /// Storage option `key=value`; repeatable.
    #[arg(long = "storage-option", value_parser = parse_storage_option)]
    storage_options: Vec<StorageOption>,
}

/// What to read: filter, columns, order, limit, offset.
#[derive(Args, Debug, Default)]
pub(crate) struct ScanArgs {
    /// SQL predicate.
    #[arg(long)]
    filter: Option<String>,
    /// Comma-separated columns.
    #[arg(long, value_delimiter = ',')]
    columns: Option<Vec<String>>,
    /// `column` or `column:desc`; repeatable.
    #[arg(long = "order-by")]
    order_by: Vec<String>,
    #[arg(long)]
    limit: Option<usize>,
    #[arg(long)]
    offset: Option<usize>,
}

impl ScanArgs {
    /// The request; `default_columns` when no `--columns` was given.
    pub(crate) fn request(self, default_columns: Option<Vec<String>>) -> Result<ScanRequest> {
        Ok(ScanRequest {
            filter: self.filter,
            projection: self.columns.or(default_columns),
            order_by: self
                .order_by
                .iter()
                .map(|s| parse_sort(s))
                .collect::<Result<_>>()?,
            limit: self.limit,
            offset: self.offset,
            ..ScanRequest::default()
        })
    }
}

#[derive(Args, Debug)]
struct DemoArgs {
    /// Directory of the demo store (created if absent).
    #[arg(long, default_value = "data/demo")]
    data: PathBuf,
    /// Trajectories to write.
    #[arg(long, default_value_t = 20)]
    rollouts: usize,
    /// Rows per trajectory (one add each).
    #[arg(long, default_value_t = 50)]
    steps: usize,
    /// Concurrent writers for the group-commit part.
    #[arg(long, default_value_t = 8)]
    concurrency: usize,
}

/// A `--storage-option key=value`. Values are credentials: `Debug` shows
/// the key only.
#[derive(Clone)]
pub(crate) struct StorageOption(pub String, pub String);

impl std::fmt::Debug for StorageOption {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}=<redacted>", self.0)
    }
}

/// A command-line argument that should be `key=value` and has no `=`.
#[derive(Debug, thiserror::Error)]
#[error("expected key=value, got '{0}'")]
pub(crate) struct NotKeyValue(String);

pub(crate) fn parse_storage_option(s: &str) -> Result<StorageOption, NotKeyValue> {
    parse_kv(s).map(|(k, v)| StorageOption(k, v))
}

fn parse_kv(s: &str) -> Result<(String, String), NotKeyValue> {
    s.split_once('=')
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .ok_or_else(|| NotKeyValue(s.to_string()))
}

impl StoreArgs {
    fn config(&self) -> StoreConfig {
        StoreConfig::new(&self.uri)
            .with_key_column(&self.key)
            .with_storage_options(
                self.storage_options
                    .iter()
                    .map(|o| (o.0.clone(), o.1.clone()))
                    .collect::<HashMap<_, _>>(),
            )
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    // Lance's futures are deep; 8 MiB per worker as for the main thread.
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_stack_size(8 << 20)
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the runtime: {e}");
            return ExitCode::from(1);
        }
    };
    match runtime.block_on(run(cli)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("error: {err:#}");
            ExitCode::from(exit_code(&err))
        }
    }
}

/// Exit codes: 2 invalid input, 3 not found, 4 conflict/exists, 5 busy or
/// unavailable, 6 plugin fault, 1 anything else.
fn exit_code(err: &anyhow::Error) -> u8 {
    use lance_context_host::PipelineError;
    use lance_context_host::{QueryFailure, RegistryError};
    if let Some(e) = err.downcast_ref::<RegistryError>() {
        return match e {
            RegistryError::Plugin(e) => plugin_exit_code(e),
            RegistryError::InvalidName { .. }
            | RegistryError::Spec(_)
            | RegistryError::UnknownPlugin { .. }
            | RegistryError::MissingStorageOptions { .. } => 2,
            RegistryError::NotFound { .. } => 3,
            RegistryError::AlreadyExists { .. } => 4,
            RegistryError::Incomplete { .. } => 5,
            RegistryError::Store(e) => store_exit_code(e.kind()),
            _ => 1,
        };
    }
    if let Some(e) = err.downcast_ref::<PipelineError>() {
        return match e {
            PipelineError::Store(e) => store_exit_code(e.kind()),
            PipelineError::Plugin(e) => plugin_exit_code(e),
            _ => 2,
        };
    }
    if let Some(e) = err.downcast_ref::<QueryFailure>() {
        return match e {
            QueryFailure::Store(e) => store_exit_code(e.kind()),
            QueryFailure::Plugin(e) => plugin_exit_code(e),
            _ => 2,
        };
    }
    if let Some(e) = err.downcast_ref::<lance_context_host::PluginError>() {
        return plugin_exit_code(e);
    }
    if err
        .downcast_ref::<lance_context_host::spec::SpecErrors>()
        .is_some()
    {
        return 2;
    }
    err.downcast_ref::<lance_context_store::Error>()
        .map_or(1, |e| store_exit_code(e.kind()))
}

/// A plugin that failed (trap, deadline, limit, bad output) is a plugin
/// fault, 6; one that refused the caller's rows or parameters, invalid input.
fn plugin_exit_code(e: &lance_context_host::PluginError) -> u8 {
    if e.is_fault() { 6 } else { 2 }
}

fn store_exit_code(kind: ErrorKind) -> u8 {
    match Some(kind) {
        Some(ErrorKind::InvalidInput) => 2,
        Some(ErrorKind::NotFound) => 3,
        Some(ErrorKind::AlreadyExists | ErrorKind::Conflict) => 4,
        Some(ErrorKind::Busy | ErrorKind::Unavailable) => 5,
        _ => 1,
    }
}

async fn run(cli: Cli) -> Result<()> {
    match cli.command {
        Command::Demo(args) => demo(args).await,
        Command::Bench(args) => bench::run(args).await,
        Command::Torture(args) => torture::run(args).await,
        Command::TortureWriter(args) => torture::writer(args).await,
        Command::TortureMaintainer(args) => torture::maintainer(args).await,
        Command::BenchPlugins(args) => bench_plugins::run(args).await,
        Command::Plugin { command } => plugin_command(command),
        Command::Store(args) => store_cli::run(args).await,
        Command::Count { store, filter } => {
            let store = Store::open_read_only(store.config()).await?;
            println!("{}", store.count(filter.as_deref()).await?);
            Ok(())
        }
        Command::Get { store, ids } => {
            let store = Store::open_read_only(store.config()).await?;
            let ids: Vec<&str> = ids.iter().map(String::as_str).collect();
            print_found(&store.get_many(&ids).await?, store.key_column(), &ids)
        }
        Command::Scan {
            store,
            scan,
            explain,
        } => {
            let store = Store::open_read_only(store.config()).await?;
            let request = scan.request(None)?;
            if explain {
                println!("{}", store.explain(request).await?);
                return Ok(());
            }
            print_json_lines(&store.scan(request).await?)
        }
        Command::Status { store } => {
            let store = Store::open_read_only(store.config()).await?;
            print_status(&store.stats().await?, store.count(None).await?)
        }
        Command::Merge { store, instance } => {
            let store = Store::open(maintenance_config(&store, &instance)).await?;
            let stats = store.merge().await;
            store.close().await?;
            print_merge(&stats?);
            Ok(())
        }
        Command::Compact { store } => {
            let store = Store::open_read_only(store.config()).await?;
            print_compaction(&store.compact().await?);
            Ok(())
        }
    }
}

/// Operator statistics of a store.
pub(crate) fn print_status(stats: &lance_context_store::StoreStats, count: u64) -> Result<()> {
    println!("rows (newest per key): {count}");
    println!("rows in base table:    {}", stats.rows_in_base);
    println!("dataset version:       {}", stats.version);
    println!(
        "fragments:             {} ({} below the compaction target)",
        stats.fragments, stats.small_fragments
    );
    for (shard, generations) in &stats.pending_generations {
        println!("shard {shard}: {generations} unmerged generation(s)");
    }
    for index in &stats.indexes {
        println!(
            "index {} ({}) on {}: {}",
            index.name,
            index.kind,
            index.columns.join(", "),
            if index.covers_all_rows {
                "covers all rows".to_string()
            } else {
                format!("{} fragment(s) not indexed yet", index.unindexed_fragments)
            }
        );
    }
    Ok(())
}

pub(crate) fn print_merge(stats: &lance_context_store::MergeStats) {
    println!(
        "merged {} generation(s): {} row(s) upserted, {} key(s) deleted in {} pass(es); \
         removed {} merged generation(s) and {} WAL file(s)",
        stats.generations_merged,
        stats.rows_upserted,
        stats.keys_deleted,
        stats.passes,
        stats.generations_removed,
        stats.wal_files_removed
    );
}

pub(crate) fn print_compaction(stats: &lance_context_store::CompactionStats) {
    println!(
        "compacted: {} fragment(s) removed, {} added; {} file(s) removed, {} added",
        stats.fragments_removed, stats.fragments_added, stats.files_removed, stats.files_added
    );
}

fn plugin_bytes(plugin: &str) -> Result<(String, Vec<u8>)> {
    let path = if plugin.ends_with(".wasm") || plugin.contains('/') {
        std::path::PathBuf::from(plugin)
    } else {
        lance_context_host::built_plugin(plugin)
    };
    let bytes = std::fs::read(&path).with_context(|| format!("reading {}", path.display()))?;
    Ok((path.display().to_string(), bytes))
}

fn plugin_command(command: PluginCommand) -> Result<()> {
    use lance_context_host::{PluginLimits, PluginRuntime};
    let runtime = PluginRuntime::new(
        PluginLimits::default(),
        lance_context_host::default_cache_dir().as_deref(),
    )?;
    match command {
        PluginCommand::Inspect { plugin, params } => {
            let (label, bytes) = plugin_bytes(&plugin)?;
            let loaded = runtime.load(&label, &bytes, params)?;
            let d = loaded.declaration();
            println!(
                "plugin {} {} (ABI {}), sha256 {}",
                d.name, d.version, d.abi_version, d.sha256
            );
            let spec = &d.spec;
            println!("key: {}", spec.key);
            if let Some(k) = &spec.secondary_key {
                println!("secondary key: {k}");
            }
            for v in &spec.vectors {
                println!(
                    "vector: {} (dimension {}, {})",
                    v.column, v.dimension, v.metric
                );
            }
            if !spec.blob_columns.is_empty() {
                println!("blob columns: {}", spec.blob_columns.join(", "));
            }
            println!(
                "capabilities: {}",
                if spec.capabilities.is_empty() {
                    "none".to_string()
                } else {
                    spec.capabilities
                        .iter()
                        .map(|c| c.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                }
            );
            println!("transform: {}", if d.has_transform { "yes" } else { "no" });
            println!();
            println!(
                "{:<4} {:<24} {:<48} {:<8} metadata",
                "#", "column", "type", "null"
            );
            for (i, f) in d.schema.fields().iter().enumerate() {
                let mut meta: Vec<String> = f
                    .metadata()
                    .iter()
                    .map(|(k, v)| format!("{k}={v}"))
                    .collect();
                meta.sort();
                println!(
                    "{:<4} {:<24} {:<48} {:<8} {}",
                    i + 1,
                    f.name(),
                    f.data_type().to_string(),
                    if f.is_nullable() { "yes" } else { "no" },
                    meta.join(" ")
                );
            }
            Ok(())
        }
        PluginCommand::Check { plugin, params } => {
            let (label, bytes) = plugin_bytes(&plugin)?;
            println!("checking {label} ({} bytes)", bytes.len());
            let loaded = match runtime.load(&label, &bytes, params) {
                Ok(loaded) => loaded,
                Err(lance_context_host::PluginError::InvalidDeclaration { plugin, problems }) => {
                    println!("ok: compiles, links as a schema plugin, describe succeeds");
                    println!("the declaration of {plugin} breaks the schema rules:");
                    for p in &problems {
                        println!("problem: {p}");
                    }
                    bail!("{} problem(s) found", problems.len());
                }
                Err(e) => {
                    println!("problem: {e}");
                    bail!("1 problem found");
                }
            };
            println!("ok: compiles, links as a schema plugin, describe succeeds");
            // A user's plugin is held to the user-schema rules (key `id`); the
            // built-ins keep theirs.
            let builtin = lance_context_host::BUILTIN_PLUGINS.contains(&plugin.as_str());
            if !builtin
                && let Err(e) = loaded
                    .declaration()
                    .spec
                    .check(lance_context_host::spec::KeyRule::IdOnly)
            {
                println!("the declaration breaks the rules for a store's schema:");
                for p in &e.problems {
                    println!("problem: {p}");
                }
                bail!("{} problem(s) found", e.problems.len());
            }
            println!(
                "ok: ABI {}, key column '{}', declared columns present",
                loaded.declaration().abi_version,
                loaded.declaration().key_column()
            );
            // Probe the calls with one all-null row: row errors are the plugin
            // working; traps and bad outputs are problems.
            let probe =
                arrow_array::RecordBatch::new_empty(lance_context_host::input_schema(&loaded));
            let one_row = arrow_select_one_null_row(&probe)?;
            let mut problems = 0;
            match loaded.validate(&one_row) {
                Ok(()) => println!("ok: validate accepts an all-null row"),
                Err(e) if e.row_errors().is_some() => println!(
                    "ok: validate answers with row errors ({} for an all-null row)",
                    e.row_errors().map(<[_]>::len).unwrap_or(0)
                ),
                Err(e) => {
                    problems += 1;
                    println!("problem: validate: {e}");
                }
            }
            if loaded.declaration().has_transform {
                match loaded.transform(&one_row, 0) {
                    Ok(_) => println!("ok: transform output matches the declared schema"),
                    Err(e) if e.row_errors().is_some() => {
                        println!("ok: transform answers with row errors")
                    }
                    Err(e) => {
                        // An all-null row may legitimately not fit a non-null column.
                        println!("note: transform of an all-null row: {e}");
                    }
                }
            }
            if problems > 0 {
                bail!("{problems} problem(s) found");
            }
            println!("no problems found");
            Ok(())
        }
    }
}

fn arrow_select_one_null_row(empty: &arrow_array::RecordBatch) -> Result<arrow_array::RecordBatch> {
    let columns = empty
        .schema()
        .fields()
        .iter()
        .map(|f| arrow_array::new_null_array(f.data_type(), 1))
        .collect();
    Ok(arrow_array::RecordBatch::try_new(empty.schema(), columns)?)
}

/// A writable config with no background maintenance (the command does it).
fn maintenance_config(store: &StoreArgs, instance: &str) -> StoreConfig {
    store
        .config()
        .with_instance_id(instance)
        .with_manual_maintenance()
}

fn parse_sort(s: &str) -> Result<SortKey> {
    match s.split_once(':') {
        None => Ok(SortKey::asc(s)),
        Some((c, "asc")) => Ok(SortKey::asc(c)),
        Some((c, "desc")) => Ok(SortKey::desc(c)),
        Some((_, other)) => bail!("order-by direction must be asc or desc, got '{other}'"),
    }
}

/// Print the rows a lookup found; then, if some asked keys were not found,
/// fail with a not-found error naming them (exit code 3).
pub(crate) fn print_found(batch: &RecordBatch, key: &str, ids: &[&str]) -> Result<()> {
    print_json_lines(batch)?;
    let found: std::collections::HashSet<&str> = batch
        .column_by_name(key)
        .and_then(|c| c.as_any().downcast_ref::<arrow_array::StringArray>())
        .map(|c| c.iter().flatten().collect())
        .unwrap_or_default();
    let mut seen = std::collections::HashSet::new();
    let missing: Vec<&str> = ids
        .iter()
        .copied()
        .filter(|id| !found.contains(id) && seen.insert(*id))
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    Err(lance_context_store::Error::NotFound {
        what: format!("no record with {key} {}", missing.join(", ")),
    }
    .into())
}

fn print_json_lines(batch: &RecordBatch) -> Result<()> {
    let stdout = std::io::stdout();
    let mut writer = arrow_json::LineDelimitedWriter::new(stdout.lock());
    writer.write(batch)?;
    writer.finish()?;
    Ok(())
}

fn demo_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("id", DataType::Utf8, false),
        Field::new("rollout_id", DataType::Utf8, false),
        Field::new("sequence_order", DataType::Int32, false),
        Field::new("role", DataType::Utf8, false),
        Field::new("content", DataType::LargeUtf8, true),
        Field::new("reward", DataType::Float32, true),
        Field::new(
            "created_at",
            DataType::Timestamp(TimeUnit::Microsecond, None),
            false,
        ),
    ]))
}

fn demo_batch(schema: &SchemaRef, rollout: &str, steps: usize) -> Result<RecordBatch> {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)?
        .as_micros() as i64;
    let ids: Vec<String> = (0..steps).map(|_| generate_id()).collect();
    let roles: Vec<&str> = (0..steps)
        .map(|i| if i % 2 == 0 { "assistant" } else { "tool" })
        .collect();
    let content: Vec<String> = (0..steps)
        .map(|i| format!("step {i} of {rollout}"))
        .collect();
    Ok(RecordBatch::try_new(
        schema.clone(),
        vec![
            Arc::new(StringArray::from(ids)),
            Arc::new(StringArray::from(vec![rollout; steps])),
            Arc::new(Int32Array::from_iter_values(0..steps as i32)),
            Arc::new(StringArray::from(roles)),
            Arc::new(LargeStringArray::from(content)),
            Arc::new(Float32Array::from_iter_values(
                (0..steps).map(|i| i as f32 / steps as f32),
            )),
            Arc::new(TimestampMicrosecondArray::from_iter_values(
                (0..steps as i64).map(|i| now + i),
            )),
        ],
    )?)
}

async fn demo(args: DemoArgs) -> Result<()> {
    std::fs::create_dir_all(&args.data)
        .with_context(|| format!("creating {}", args.data.display()))?;
    let uri = std::fs::canonicalize(&args.data)?
        .to_string_lossy()
        .into_owned();
    let schema = demo_schema();
    let config = StoreConfig::new(&uri).with_schema(schema.clone());

    let started = Instant::now();
    let store = Arc::new(Store::open_or_create(config.clone()).await?);
    let before = store.count(None).await?;
    println!(
        "store {uri} (shard {}): {before} rows before, opened in {:.0?}",
        store.shard_id(),
        started.elapsed()
    );

    // Sequential adds: one trajectory per add.
    let half = args.rollouts / 2;
    let t = Instant::now();
    let mut first_rollout = None;
    for _ in 0..half {
        let rollout = generate_id();
        store
            .add(&demo_batch(&schema, &rollout, args.steps)?)
            .await?;
        first_rollout.get_or_insert(rollout);
    }
    let seq = t.elapsed();
    if half > 0 {
        println!(
            "sequential: {half} adds of {} rows in {seq:.0?} ({:.1} ms/add, durable and visible on return)",
            args.steps,
            seq.as_secs_f64() * 1000.0 / half as f64
        );
    }

    // Concurrent adds share freezes (group commit).
    let gens_before = generations(&store).await?;
    let t = Instant::now();
    let rest = args.rollouts - half;
    let mut tasks = tokio::task::JoinSet::new();
    for worker in 0..args.concurrency.max(1) {
        let store = store.clone();
        let schema = schema.clone();
        let steps = args.steps;
        let mine = (worker..rest).step_by(args.concurrency.max(1)).count();
        tasks.spawn(async move {
            for _ in 0..mine {
                store
                    .add(&demo_batch(&schema, &generate_id(), steps)?)
                    .await?;
            }
            anyhow::Ok(())
        });
    }
    while let Some(done) = tasks.join_next().await {
        done??;
    }
    let conc = t.elapsed();
    let made = generations(&store).await? - gens_before;
    if rest > 0 {
        println!(
            "concurrent: {rest} adds from {} tasks in {conc:.0?}, {made} generation(s) written",
            args.concurrency
        );
    }

    // Reads.
    let total = store.count(None).await?;
    println!("rows now: {total} (+{})", total - before);
    if let Some(rollout) = first_rollout {
        let t = Instant::now();
        let trajectory = store
            .scan(
                ScanRequest::new()
                    .filter(format!("rollout_id = '{rollout}'"))
                    .project(["id", "sequence_order", "role"])
                    .order_by(SortKey::asc("sequence_order"))
                    .order_by(SortKey::asc("id")),
            )
            .await?;
        println!(
            "trajectory {rollout}: {} rows, ordered by sequence_order, in {:.0?}",
            trajectory.num_rows(),
            t.elapsed()
        );
        let ids = trajectory
            .column_by_name("id")
            .and_then(|c| c.as_any().downcast_ref::<StringArray>())
            .context("trajectory lacks ids")?;
        if !ids.is_empty() {
            let t = Instant::now();
            let row = store.get(ids.value(0)).await?;
            println!(
                "point lookup {}: {} in {:.0?}",
                ids.value(0),
                if row.is_some() { "found" } else { "MISSING" },
                t.elapsed()
            );
        }
    }
    let top = store
        .scan(
            ScanRequest::new()
                .project(["id", "reward"])
                .order_by(SortKey::desc("reward"))
                .limit(3),
        )
        .await?;
    println!("top 3 rewards: {} rows", top.num_rows());
    store.close().await?;

    // A fresh reader sees everything that was acknowledged.
    let reader = Store::open_read_only(StoreConfig::new(&uri)).await?;
    let seen = reader.count(None).await?;
    println!("fresh reader sees {seen} rows");
    if seen != total {
        bail!("a fresh reader saw {seen} rows, expected {total}");
    }
    Ok(())
}

async fn generations(store: &Store) -> Result<usize> {
    Ok(store
        .wal_status()
        .await?
        .unmerged_generations
        .iter()
        .map(|(_, n)| n)
        .sum())
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn cli(args: &[&str]) -> Result<()> {
        let mut all = vec!["lance-context"];
        all.extend_from_slice(args);
        run(Cli::try_parse_from(all)?).await
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn store_commands_work_by_name() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("root");
        let root = root.to_str().unwrap();
        let spec = dir.path().join("notes.json");
        std::fs::write(
            &spec,
            r#"{"name": "notes", "key": "id", "columns": [
                {"name": "id", "type": "Utf8", "nullable": false},
                {"name": "n", "type": "Int32", "rules": {"min": 0}}]}"#,
        )
        .unwrap();
        let rows = dir.path().join("rows.jsonl");
        std::fs::write(
            &rows,
            "{\"id\": \"a\", \"n\": 1}\n{\"id\": \"b\", \"n\": 2}\n",
        )
        .unwrap();
        let spec = spec.to_str().unwrap();
        let rows = rows.to_str().unwrap();
        cli(&["store", "--root", root, "create", "notes", "--spec", spec])
            .await
            .unwrap();
        let err = cli(&["store", "--root", root, "create", "notes", "--spec", spec])
            .await
            .unwrap_err();
        assert_eq!(exit_code(&err), 4, "{err:#}");
        cli(&[
            "store",
            "--root",
            root,
            "add",
            "notes",
            rows,
            "--batch-rows",
            "1",
        ])
        .await
        .unwrap();
        for args in [
            vec!["list"],
            vec!["describe", "notes"],
            vec!["get", "notes", "a"],
            vec!["scan", "notes", "--filter", "n > 1"],
            vec!["status", "notes"],
            vec!["merge", "notes"],
            vec!["compact", "notes"],
            vec!["delete", "notes", "a"],
            vec!["query", "notes"],
        ] {
            let mut all = vec!["store", "--root", root];
            all.extend(args.iter().copied());
            cli(&all)
                .await
                .unwrap_or_else(|e| panic!("{args:?}: {e:#}"));
        }
        // A key not found (here: deleted) is exit code 3, naming the key.
        let err = cli(&["store", "--root", root, "get", "notes", "a"])
            .await
            .unwrap_err();
        assert_eq!(exit_code(&err), 3, "{err:#}");
        assert!(err.to_string().contains("id a"), "{err:#}");
        let err = cli(&[
            "store", "--root", root, "scan", "notes", "--filter", "m = 1",
        ])
        .await
        .unwrap_err();
        assert_eq!(exit_code(&err), 2, "{err:#}");
        let err = cli(&["store", "--root", root, "drop", "notes"])
            .await
            .unwrap_err();
        assert!(err.to_string().contains("--yes"), "{err:#}");
        cli(&["store", "--root", root, "drop", "notes", "--yes"])
            .await
            .unwrap();
        let err = cli(&["store", "--root", root, "describe", "notes"])
            .await
            .unwrap_err();
        assert_eq!(exit_code(&err), 3, "{err:#}");
    }

    fn store_args(uri: &str) -> StoreArgs {
        StoreArgs {
            uri: uri.to_string(),
            key: "id".to_string(),
            storage_options: Vec::new(),
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn demo_writes_a_store_that_the_other_commands_read() {
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().join("demo");
        let uri = data.to_string_lossy().into_owned();
        let demo_args = || DemoArgs {
            data: data.clone(),
            rollouts: 6,
            steps: 10,
            concurrency: 3,
        };
        run(Cli {
            command: Command::Demo(demo_args()),
        })
        .await
        .unwrap();
        // A second run reopens and adds.
        run(Cli {
            command: Command::Demo(demo_args()),
        })
        .await
        .unwrap();
        let store = Store::open_read_only(StoreConfig::new(&uri)).await.unwrap();
        assert_eq!(store.count(None).await.unwrap(), 120);

        for command in [
            Command::Status {
                store: store_args(&uri),
            },
            Command::Merge {
                store: store_args(&uri),
                instance: "default".into(),
            },
            Command::Compact {
                store: store_args(&uri),
            },
        ] {
            run(Cli { command }).await.unwrap();
        }
        let stats = store.stats().await.unwrap();
        assert_eq!(
            stats.rows_in_base, 120,
            "merge folded everything: {stats:?}"
        );
        assert!(stats.pending_generations.iter().all(|(_, n)| *n == 0));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn typed_errors_become_exit_codes() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("missing").to_string_lossy().into_owned();
        let err = run(Cli {
            command: Command::Count {
                store: store_args(&missing),
                filter: None,
            },
        })
        .await
        .unwrap_err();
        assert_eq!(exit_code(&err), 3, "{err:#}");

        let data = dir.path().join("demo");
        run(Cli {
            command: Command::Demo(DemoArgs {
                data: data.clone(),
                rollouts: 2,
                steps: 2,
                concurrency: 1,
            }),
        })
        .await
        .unwrap();
        let err = run(Cli {
            command: Command::Scan {
                store: store_args(&data.to_string_lossy()),
                scan: ScanArgs {
                    filter: Some("no_such_column = 1".into()),
                    ..ScanArgs::default()
                },
                explain: false,
            },
        })
        .await
        .unwrap_err();
        assert_eq!(exit_code(&err), 2, "{err:#}");
        assert!(parse_sort("n:sideways").is_err());
    }
}
