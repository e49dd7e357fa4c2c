//! `lance-context store …`: stores by name in a data root's registry.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, Result};
use clap::{Args, Parser, Subcommand};
use lance_context_client::{StoreApi, UpgradeStore};
use lance_context_host::{
    Embedded, EmbeddedConfig, NamedStore, PipelineError, PluginLimits, PluginRuntime, Registry,
    Residency,
};
use serde::Serialize;

use super::through::{self, Via};
use super::{export, read, search};
use crate::args::{
    AsOf, ScanArgs, StorageOption, ensure_usage, parse_kv, parse_storage_option, usage,
};
use crate::input::{Format, Input};
use crate::output::Out;

#[derive(Args, Debug)]
pub struct StoreArgs {
    /// The data root holding the registry (and stores created without --uri).
    #[arg(long, default_value = "data", global = true)]
    root: PathBuf,
    /// Storage option `key=value` for the store's object store; repeatable.
    /// Values are never recorded: pass them on every command.
    #[arg(long = "storage-option", value_parser = parse_storage_option, global = true)]
    storage_options: Vec<StorageOption>,
    /// Work through a running server (`lance-context serve`) at this URL
    /// instead of opening the data root: every store command but `export`
    /// (and `add --dry-run`, `add --reject-file`), which need the data
    /// root.
    #[arg(long, global = true, value_name = "URL")]
    server: Option<String>,
    /// The bearer token for --server (default: $LANCE_CONTEXT_TOKEN).
    #[arg(
        long,
        global = true,
        env = "LANCE_CONTEXT_TOKEN",
        hide_env_values = true
    )]
    token: Option<String>,
    #[command(subcommand)]
    command: StoreCommand,
}

#[derive(Subcommand, Debug)]
enum StoreCommand {
    /// Create a store from a built-in plugin, a plugin file or a spec file.
    Create(CreateCommand),
    /// Register an existing dataset as a store — one written by the previous
    /// implementation (lance-context 0.6.x: Context, RolloutStore,
    /// DatagenStore, GenericStore) or by plain Lance: compares its columns
    /// with the plugin's, and only when they fit registers it, replays what
    /// the old writers left in the WAL and merges their generations (see
    /// docs/migrating.md).
    Adopt(super::adopt::AdoptCommand),
    /// List the stores.
    List,
    /// Print a store's registry entry: name, location, pinned plugin, spec.
    Describe { name: String },
    /// Delete a store: its data, its entry, and its plugin file if unshared.
    Drop {
        name: String,
        /// Really delete.
        #[arg(long)]
        yes: bool,
    },
    /// Replace a store's plugin with a new build that declares the same
    /// schema (e.g. a fixed validator); refused, with the difference, when
    /// the schema differs, and when the new plugin fails the probe. Through
    /// a server (`--server`), the server's next operations on the store run
    /// the new plugin; where the data root is, a server running meanwhile
    /// keeps the old plugin until it reopens the store.
    Upgrade {
        name: String,
        /// The new plugin component (.wasm), or a built-in's name (`rollout`,
        /// `context`, `datagen`: this binary's own build of it).
        #[arg(long)]
        plugin: PathBuf,
        /// JSON Lines of records the plugin should accept (checked by the
        /// probe before the new plugin is pinned).
        #[arg(long, value_name = "FILE")]
        sample: Option<PathBuf>,
    },
    /// Add records (JSON Lines, Arrow IPC or Parquet; a file or stdin)
    /// through the store's plugin, in batches: each batch is one add (durable
    /// when reported); a batch with a bad record is refused whole, and the
    /// command stops there.
    Add(AddCommand),
    /// Print records by key (blob columns left out unless named).
    Get {
        name: String,
        #[arg(required = true)]
        ids: Vec<String>,
        /// Comma-separated columns (default: all but blob columns).
        #[arg(long, value_delimiter = ',')]
        columns: Option<Vec<String>>,
        #[command(flatten)]
        as_of: AsOf,
    },
    /// Print records (blob columns left out unless named).
    Scan {
        name: String,
        #[command(flatten)]
        scan: ScanArgs,
        #[command(flatten)]
        as_of: AsOf,
    },
    /// Count records (newest version per key), optionally matching a filter.
    Count {
        name: String,
        /// SQL predicate.
        #[arg(long)]
        filter: Option<String>,
        #[command(flatten)]
        as_of: AsOf,
    },
    /// Search one column: nearest neighbours of a vector (`--vector`, rows
    /// with `_distance`) or the best BM25 matches of a text (`--text`, rows
    /// with `_score`), in base and unmerged rows alike.
    Search(search::SearchCommand),
    /// Hybrid retrieval: a vector leg and a text leg fused by reciprocal rank
    /// fusion (each hit with `_rrf_score` and its rank and score per leg).
    Retrieve(search::RetrieveCommand),
    /// Write records out (JSON Lines, Arrow IPC or Parquet), streamed: what
    /// `store add` reads back.
    Export(export::ExportCommand),
    /// Delete records by key: tombstones when the schema declares them
    /// (hidden records — expired, retired, older versions — included; prints
    /// which were deleted), else the engine's delete.
    Delete {
        name: String,
        #[arg(required = true)]
        ids: Vec<String>,
    },
    /// Insert records (JSON Lines), or supersede the current version with
    /// the same secondary key (stores whose schema declares supersession,
    /// e.g. `context` by `external_id`); `--dry-run` says what would happen.
    Upsert(through::UpsertCommand),
    /// Write a new version of a record with some fields changed (stores
    /// whose schema declares supersession); prints the new version's key.
    Patch(through::PatchCommand),
    /// Rows, fragments, pending generations and indexes of a store.
    Status { name: String },
    /// The base table's kept versions (what `--as-of` reads).
    Versions { name: String },
    /// Fold the store's WAL into its base table now.
    Merge { name: String },
    /// Compact the store's fragments and re-ensure its indexes (no writer
    /// is claimed: a running service keeps writing).
    Compact { name: String },
    /// Build (or rebuild) the vector index of a declared vector column (all
    /// of them without --column).
    Index {
        name: String,
        /// The vector column.
        #[arg(long)]
        column: Option<String>,
    },
    /// Run one of the schema's named queries (e.g. rollout `trajectory`).
    Query {
        name: String,
        /// The query; without one, list the schema's queries.
        query: Option<String>,
        /// Argument `param=value`; repeatable.
        #[arg(long = "arg", value_parser = parse_kv)]
        args: Vec<(String, String)>,
        #[command(flatten)]
        as_of: AsOf,
    },
}

#[derive(Parser, Debug)]
pub struct CreateCommand {
    name: String,
    /// A built-in schema (rollout, context, datagen) or a path to a .wasm plugin.
    #[arg(long, conflicts_with = "spec", required_unless_present = "spec")]
    plugin: Option<String>,
    /// A SchemaSpec JSON file (no plugin of your own needed).
    #[arg(long)]
    spec: Option<PathBuf>,
    /// Creation parameter `name=json` for the plugin; repeatable.
    #[arg(long = "param", value_parser = parse_kv)]
    params: Vec<(String, String)>,
    /// Where the data goes (default: ROOT/stores/NAME); e.g. s3://bucket/path.
    #[arg(long)]
    uri: Option<String>,
    /// JSON Lines of records the plugin should accept: the probe run before
    /// the plugin is pinned checks its output on them too.
    #[arg(long, value_name = "FILE")]
    sample: Option<PathBuf>,
    /// Bucket sharding for scale-out: the key is hashed into N buckets
    /// (1 to 1024), each written through a shard of its own, so several
    /// servers (`serve --owns`) can write the store at once. Fixed at
    /// create; not for schemas with record capabilities. Default 1 (none).
    #[arg(long, value_name = "N")]
    buckets: Option<u32>,
}

#[derive(Parser, Debug)]
pub struct AddCommand {
    name: String,
    /// The input file; `-` or absent reads stdin.
    file: Option<PathBuf>,
    /// The input's format (default: by the file's extension — .arrow/.arrows/
    /// .ipc, .parquet — else JSON Lines).
    #[arg(long)]
    format: Option<Format>,
    /// Records per add.
    #[arg(long, default_value_t = 10_000)]
    batch_rows: usize,
    /// Check every record (input format, schema, the plugin's validate and
    /// transform) without writing anything.
    #[arg(long)]
    dry_run: bool,
    /// Set refused records aside instead of stopping: each is written to
    /// FILE as a JSON line `{"line": N, "errors": [{"column", "code",
    /// "message"}], "record": …}` (`"row"` for Arrow and Parquet input) and
    /// the rest are added. FILE is replaced.
    #[arg(long, value_name = "FILE")]
    reject_file: Option<PathBuf>,
}

/// What `store add` did: one object.
#[derive(Debug, Serialize)]
struct Added {
    store: String,
    records: usize,
    batches: usize,
    dry_run: bool,
    seconds: f64,
    records_per_second: f64,
    /// Records refused and set aside (`--reject-file`).
    rejected: usize,
    #[serde(skip_serializing_if = "Option::is_none")]
    reject_file: Option<PathBuf>,
}

pub async fn run(args: StoreArgs, out: Out) -> Result<()> {
    if let Some(url) = &args.server {
        let mut client = lance_context_client::Client::new(url);
        if let Some(token) = &args.token {
            client = client.with_token(token);
        }
        let local_only = |what: &str| {
            usage(format!(
                "{what} is not available with --server: it needs the data root (run it where the data root is)"
            ))
        };
        return match args.command {
            StoreCommand::Export(_) => Err(local_only("'export'")),
            command => {
                through_api(
                    &client,
                    Via::Server,
                    command,
                    "no stores on the server",
                    out,
                )
                .await
            }
        };
    }
    let runtime = Arc::new(PluginRuntime::new(
        PluginLimits::default(),
        lance_context_host::default_cache_dir().as_deref(),
    )?);
    // Only `create` makes a data root: any other command on a root that
    // holds no registry is a mistyped --root, said as such.
    if !matches!(
        args.command,
        StoreCommand::Create(_) | StoreCommand::Adopt(_)
    ) && !args.root.join("registry/stores").is_dir()
    {
        return Err(lance_context_store::Error::NotFound {
            what: format!(
                "a data root at {} (no registry there; `store create` makes one, or pass --root)",
                args.root.display()
            ),
        }
        .into());
    }
    let registry = Registry::at(&args.root, runtime)?;
    let options: HashMap<String, String> = crate::args::options_map(&args.storage_options);
    match args.command {
        StoreCommand::Add(c) if c.needs_the_plugin_here() => {
            add_checked(&registry, &options, c, out).await
        }
        StoreCommand::Add(c) => {
            // The store kept open with its writer for the whole input (as a
            // server keeps it), closed at the end.
            let api = Embedded::new(
                registry,
                EmbeddedConfig {
                    storage_options: options,
                    residency: Residency::Resident,
                    trusted_filters: true,
                    // A whole store in one read, as one scan.
                    max_page: usize::MAX,
                    ..EmbeddedConfig::default()
                },
            );
            let added = c.run(&api, Via::Local, out).await;
            let closed = api.shutdown().await;
            added?;
            Ok(closed?)
        }
        StoreCommand::Export(c) => {
            let named = registry
                .open_with(&c.name, &options, true, |config| c.as_of.apply(config))
                .await?;
            export::run(&named, c, out).await
        }
        command => {
            // The store API over the data root: a store opened per command
            // (a read claims no writer, so a running server is not fenced);
            // filters are the operator's own SQL.
            let api = Embedded::new(
                registry,
                EmbeddedConfig {
                    storage_options: options,
                    residency: Residency::PerCall,
                    trusted_filters: true,
                    // A whole store in one read, as one scan.
                    max_page: usize::MAX,
                    ..EmbeddedConfig::default()
                },
            );
            let empty = format!("no stores under {}", args.root.display());
            through_api(&api, Via::Local, command, &empty, out).await
        }
    }
}

/// The store commands the store API carries, one code path over either
/// implementation: the data root's (`Embedded`) or a server's client.
/// `upgrade`, `export` and `add --dry-run`/`--reject-file` need the data
/// root (`run` takes them first where it is; with `--server` they are
/// refused).
// One arm per command, each a call: the clearest form of a dispatch.
async fn through_api<A: StoreApi>(
    api: &A,
    via: Via,
    command: StoreCommand,
    no_stores: &str,
    out: Out,
) -> Result<()> {
    match command {
        StoreCommand::Create(c) => through::create(api, via, c.into_request()?, out).await,
        StoreCommand::Adopt(c) => c.run(api, via, out).await,
        StoreCommand::List => through::list(api, via, no_stores, out).await,
        StoreCommand::Describe { name } => through::describe(api, via, &name, out).await,
        StoreCommand::Drop { name, yes } => through::drop(api, via, &name, yes, out).await,
        StoreCommand::Get {
            name,
            ids,
            columns,
            as_of,
        } => read::get(api, via, &name, &ids, columns, as_of.as_of, out).await,
        StoreCommand::Scan { name, scan, as_of } => {
            read::scan(api, via, &name, scan, as_of.as_of, out).await
        }
        StoreCommand::Count {
            name,
            filter,
            as_of,
        } => read::count(api, via, &name, filter, as_of.as_of, out).await,
        StoreCommand::Query {
            name,
            query,
            args,
            as_of,
        } => read::query(api, via, &name, query.as_deref(), args, as_of.as_of, out).await,
        StoreCommand::Search(c) => read::search(api, via, &c, out).await,
        StoreCommand::Retrieve(c) => read::retrieve(api, via, &c, out).await,
        StoreCommand::Versions { name } => read::versions(api, via, &name, out).await,
        StoreCommand::Delete { name, ids } => through::delete(api, via, &name, &ids, out).await,
        StoreCommand::Upsert(c) => c.run(api, via, out).await,
        StoreCommand::Patch(c) => c.run(api, via, out).await,
        StoreCommand::Status { name } => through::status(api, via, &name, out).await,
        StoreCommand::Merge { name } => through::merge(api, via, &name, out).await,
        StoreCommand::Compact { name } => through::compact(api, via, &name, out).await,
        StoreCommand::Index { name, column } => {
            through::index(api, via, &name, column.as_deref(), out).await
        }
        StoreCommand::Add(c) => c.run(api, via, out).await,
        StoreCommand::Upgrade {
            name,
            plugin,
            sample,
        } => {
            let request = upgrade_request(&plugin, sample.as_deref())?;
            through::upgrade(api, via, &name, &request, out).await
        }
        StoreCommand::Export(_) => Err(usage(
            "'export' needs the data root (run it without --server)",
        )),
    }
}

/// `store upgrade --plugin P`: a built-in by name (when no file `P`
/// exists), else the component file's bytes; the samples the probe checks.
fn upgrade_request(plugin: &Path, sample: Option<&Path>) -> Result<UpgradeStore> {
    use base64::Engine as _;
    let given = plugin.display().to_string();
    let mut request = UpgradeStore {
        samples: match sample {
            Some(path) => sample_records(path)?,
            None => Vec::new(),
        },
        ..UpgradeStore::default()
    };
    if !plugin.exists() && lance_context_host::builtin_plugin_bytes(&given).is_some() {
        request.plugin = Some(given);
    } else {
        let bytes =
            std::fs::read(plugin).with_context(|| format!("reading {}", plugin.display()))?;
        request.plugin_wasm_base64 = Some(base64::engine::general_purpose::STANDARD.encode(bytes));
        request.plugin_file_name = Some(file_label(&given));
    }
    Ok(request)
}

impl AddCommand {
    /// Whether it checks or sets records aside: the plugin run in this
    /// process (`add_checked`), where the data root is.
    fn needs_the_plugin_here(&self) -> bool {
        self.dry_run || self.reject_file.is_some()
    }

    /// `store add` through the store API, a batch per call (a dry run or a
    /// reject file needs the data root: refused here).
    async fn run<A: StoreApi>(self, api: &A, via: Via, out: Out) -> Result<()> {
        ensure_usage(!self.dry_run, || {
            "--dry-run is not available with --server".into()
        })?;
        ensure_usage(self.reject_file.is_none(), || {
            "--reject-file is not available with --server (the server refuses a batch whole)".into()
        })?;
        ensure_usage(self.batch_rows > 0, || {
            "--batch-rows must be at least 1".into()
        })?;
        super::add::add(
            api,
            via,
            &self.name,
            self.file.as_ref(),
            self.format,
            self.batch_rows,
            out,
        )
        .await
    }
}

impl CreateCommand {
    /// The create as the API takes it (a plugin file's bytes base64, a
    /// spec file's JSON, each parameter as JSON when it parses, else a
    /// string).
    fn into_request(self) -> Result<lance_context_client::CreateStore> {
        use base64::Engine as _;
        let mut create = lance_context_client::CreateStore {
            name: self.name,
            uri: self.uri,
            samples: match &self.sample {
                Some(path) => sample_records(path)?,
                None => Vec::new(),
            },
            buckets: self.buckets,
            ..Default::default()
        };
        match (self.plugin, self.spec) {
            (_, Some(file)) => {
                let text = std::fs::read_to_string(&file)
                    .with_context(|| format!("reading {}", file.display()))?;
                create.spec = Some(
                    serde_json::from_str(&text)
                        .map_err(|e| usage(format!("{}: not JSON: {e}", file.display())))?,
                );
            }
            (Some(p), None) if p.ends_with(".wasm") || p.contains('/') => {
                let bytes = std::fs::read(&p).with_context(|| format!("reading {p}"))?;
                create.plugin_wasm_base64 =
                    Some(base64::engine::general_purpose::STANDARD.encode(bytes));
                create.plugin_file_name = Some(file_label(&p));
            }
            (Some(p), None) => create.plugin = Some(p),
            (None, None) => return Err(usage("give --plugin or --spec")),
        }
        for (k, v) in self.params {
            let value = serde_json::from_str(&v).unwrap_or(serde_json::Value::String(v));
            create.params.insert(k, value);
        }
        Ok(create)
    }
}

/// `store add --dry-run` / `--reject-file`: the plugin run in this process
/// on every chunk (a dry run claims no writer).
async fn add_checked(
    registry: &Registry,
    options: &HashMap<String, String>,
    c: AddCommand,
    out: Out,
) -> Result<()> {
    ensure_usage(c.batch_rows > 0, || {
        "--batch-rows must be at least 1".into()
    })?;
    let format = Format::pick(c.format, c.file.as_deref());
    let mut input = Input::open(c.file.as_ref(), format, c.batch_rows)?;
    let mut rejects = match &c.reject_file {
        Some(path) => {
            input.lenient = true;
            Some(Rejects::create(path, c.file.as_deref())?)
        }
        None => None,
    };
    // A dry run claims no writer: it only reads the entry and runs the plugin.
    let named = registry
        .open_with(&c.name, options, c.dry_run, |c| c)
        .await?;
    let bar = out.bar(input.total, &format!("adding to {}", c.name));
    let started = Instant::now();
    let result = add_chunks(
        &named,
        &mut input,
        c.dry_run,
        out.json_errors,
        &bar,
        rejects.as_mut(),
    )
    .await;
    bar.finish_and_clear();
    if !c.dry_run {
        named.close().await?;
    }
    let rejected = match rejects {
        Some(r) => r.finish()?,
        None => 0,
    };
    let (records, batches) = result?;
    if records == 0 && rejected == 0 {
        return Err(usage("no records in the input"));
    }
    let seconds = started.elapsed().as_secs_f64();
    let added = Added {
        store: c.name.clone(),
        records,
        batches,
        dry_run: c.dry_run,
        seconds,
        records_per_second: records as f64 / seconds.max(1e-9),
        rejected,
        reject_file: c.reject_file.clone(),
    };
    out.item(&added, || {
        let set_aside = match &c.reject_file {
            Some(path) if rejected > 0 => format!(
                "; {rejected} record(s) refused, written to {}",
                path.display()
            ),
            Some(_) => "; none refused".to_string(),
            None => String::new(),
        };
        if c.dry_run {
            format!(
                "dry run: {records} record(s) would be added to '{}' (nothing written){set_aside}",
                c.name
            )
        } else {
            format!(
                "added {records} record(s) to '{}' in {batches} batch(es), {:.1} s ({:.0} records/s){set_aside}",
                c.name, seconds, added.records_per_second
            )
        }
    })
}

/// The reject file of `store add --reject-file`: refused records as JSON
/// lines, in input order, written (and flushed) batch by batch — so a run
/// that stops early leaves the refusals of every batch before the one it
/// stopped in. Opened for writing like any output (a device or a symlink's
/// target is written through); never a directory or the input itself.
struct Rejects {
    path: PathBuf,
    writer: std::io::BufWriter<std::fs::File>,
    count: usize,
}

impl Rejects {
    fn create(path: &Path, input: Option<&Path>) -> Result<Self> {
        ensure_usage(path != Path::new("-"), || {
            "--reject-file -: give a file (stdout carries the summary)".into()
        })?;
        if let Ok(meta) = std::fs::metadata(path) {
            ensure_usage(!meta.is_dir(), || {
                format!("--reject-file {}: is a directory", path.display())
            })?;
            #[cfg(unix)]
            if let Some(input) = input.filter(|i| *i != Path::new("-"))
                && let Ok(input_meta) = std::fs::metadata(input)
            {
                use std::os::unix::fs::MetadataExt;
                ensure_usage(
                    (meta.dev(), meta.ino()) != (input_meta.dev(), input_meta.ino()),
                    || {
                        format!(
                            "--reject-file {}: is the input file; give another file",
                            path.display()
                        )
                    },
                )?;
            }
        }
        let file = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .open(path)
            .with_context(|| format!("opening the reject file {}", path.display()))?;
        Ok(Self {
            path: path.to_path_buf(),
            writer: std::io::BufWriter::new(file),
            count: 0,
        })
    }

    /// Write `refusals` in input order, and flush.
    fn write_all(&mut self, mut refusals: Vec<crate::input::Refusal>) -> Result<()> {
        use std::io::Write;
        if refusals.is_empty() {
            return Ok(());
        }
        refusals.sort_by_key(|r| r.at);
        let failed = |e| {
            anyhow::Error::new(e)
                .context(format!("writing the reject file {}", self.path.display()))
        };
        for refusal in &refusals {
            serde_json::to_writer(&mut self.writer, &refusal.to_json())?;
            self.writer.write_all(b"\n").map_err(failed)?;
            self.count += 1;
        }
        self.writer.flush().map_err(failed)
    }

    /// Flush (and for a regular file sync); the number of records written.
    fn finish(mut self) -> Result<usize> {
        use std::io::Write;
        self.writer
            .flush()
            .with_context(|| format!("writing the reject file {}", self.path.display()))?;
        let file = self.writer.get_ref();
        if file.metadata().is_ok_and(|m| m.is_file()) {
            file.sync_all()
                .with_context(|| format!("syncing the reject file {}", self.path.display()))?;
        }
        Ok(self.count)
    }
}

/// What happened to the input so far: the outermost words of a refusal.
pub(crate) fn stopped_at(added: usize, dry_run: bool) -> String {
    if dry_run {
        format!("dry run stopped ({added} valid record(s) before this batch)")
    } else if added == 0 {
        "refused, nothing added".to_string()
    } else {
        format!("refused, {added} record(s) added before this batch")
    }
}

/// One chunk of the input, being added.
struct Pending {
    batch: arrow_array::RecordBatch,
    positions: crate::input::Positions,
    texts: Option<Vec<String>>,
    /// Its records set aside (for the reject file), in any order.
    set_aside: Vec<crate::input::Refusal>,
}

/// Add (or, dry, only prepare) every chunk; (records, batches). A refused
/// chunk stops the run — its problems are printed by line or row, earlier
/// chunks stay — unless `rejects` is given: then refused records are written
/// there and the rest of the chunk is added.
async fn add_chunks(
    named: &NamedStore,
    input: &mut Input,
    dry_run: bool,
    json_errors: bool,
    bar: &indicatif::ProgressBar,
    mut rejects: Option<&mut Rejects>,
) -> Result<(usize, usize)> {
    let (mut added, mut batches) = (0usize, 0usize);
    loop {
        let chunk = match input.next_chunk(named.plugin()) {
            Ok(Some(chunk)) => chunk,
            Ok(None) => break,
            Err(e) => {
                if !json_errors {
                    print_listed(bar, &crate::exit::details(&e)["input_errors"], "refused");
                }
                return Err(e.context(stopped_at(added, dry_run)));
            }
        };
        // The chunk's refused records, written in input order once the
        // chunk is done.
        let Some(batch) = chunk.batch else {
            if let Some(r) = rejects.as_deref_mut() {
                r.write_all(chunk.refused)?;
            }
            continue;
        };
        let mut pending = Pending {
            batch,
            positions: chunk.positions,
            texts: chunk.texts,
            set_aside: chunk.refused,
        };
        let outcome = settle(named, &mut pending, dry_run, rejects.is_some()).await?;
        if let Some(r) = rejects.as_deref_mut() {
            r.write_all(std::mem::take(&mut pending.set_aside))?;
        }
        let rows = pending.positions.len();
        match outcome {
            Ok(()) => {
                added += rows;
                batches += usize::from(rows > 0);
            }
            Err(e) => {
                let refusal = ChunkRefusal {
                    named,
                    positions: &pending.positions,
                    added,
                    dry_run,
                    json_errors,
                    bar,
                    with_rejects: rejects.is_some(),
                };
                return Err(refusal.of(e));
            }
        }
        match input.total {
            Some(_) => bar.set_position(input.progress),
            None => bar.set_position(added as u64),
        }
        bar.set_message(format!(
            "{} {added} record(s)",
            if dry_run { "checked" } else { "added" }
        ));
    }
    Ok((added, batches))
}

/// Add (or, dry, prepare) a chunk: with a reject file, until what is left
/// of it is accepted or its refusal is about the batch.
async fn settle(
    named: &NamedStore,
    pending: &mut Pending,
    dry_run: bool,
    with_rejects: bool,
) -> Result<Result<(), PipelineError>> {
    let Pending {
        batch,
        positions,
        texts,
        set_aside,
    } = pending;
    // With a reject file, rows refused one by one — by the plugin (each
    // confirmed to fail on its own) or by the engine (a key that exists,
    // a repeat in the batch) — are set aside and the rest tried again;
    // each round removes at least one row. A refusal that depends on
    // other rows of the batch refuses the batch as without a reject file.
    loop {
        let result = if dry_run {
            lance_context_host::prepare(named.plugin(), batch, 0)
                .await
                .map(|_| ())
        } else {
            named.add(batch).await.map(|_| ())
        };
        if !with_rejects {
            return Ok(result);
        }
        let Some(by_row) = refused_rows(named, batch, positions, &result).await else {
            return Ok(result);
        };
        let rows: Vec<usize> = by_row.keys().copied().collect();
        let records = match texts.as_ref() {
            Some(texts) => rows
                .iter()
                .map(|&row| {
                    let text = texts.get(row).map(String::as_str).unwrap_or_default();
                    serde_json::from_str(text)
                        .unwrap_or_else(|_| serde_json::Value::String(text.to_string()))
                })
                .collect(),
            None => crate::input::rows_as_json(batch, &rows),
        };
        for ((row, reasons), record) in by_row.into_iter().zip(records) {
            let (unit, at) = positions.at(row);
            set_aside.push(crate::input::Refusal {
                unit,
                at,
                record,
                raw_base64: None,
                errors: reasons,
            });
        }
        let keep: Vec<bool> = (0..batch.num_rows()).map(|i| !rows.contains(&i)).collect();
        positions.retain(&keep);
        if let Some(texts) = texts.as_mut() {
            crate::input::retain_mask(texts, &keep);
        }
        if positions.len() == 0 {
            return Ok(Ok(()));
        }
        *batch = arrow_select::filter::filter_record_batch(
            batch,
            &arrow_array::BooleanArray::from(keep),
        )?;
    }
}

/// A chunk's refusal, said in the input's terms.
struct ChunkRefusal<'a> {
    named: &'a NamedStore,
    positions: &'a crate::input::Positions,
    /// Records added before the chunk.
    added: usize,
    dry_run: bool,
    json_errors: bool,
    bar: &'a indicatif::ProgressBar,
    /// Whether refused records go to a reject file (then a refusal that
    /// reaches here is about the batch, not a record).
    with_rejects: bool,
}

impl ChunkRefusal<'_> {
    /// The error to stop with: the plugin's rejections listed by line or
    /// row, a fenced writer's unknown outcome, the engine's refusal of one
    /// record by its line, or any other error with the batch's place.
    fn of(&self, e: PipelineError) -> anyhow::Error {
        let Self {
            positions, added, ..
        } = *self;
        let stopped = stopped_at(added, self.dry_run);
        match e {
            PipelineError::Plugin(e) if e.row_errors().is_some() => self.rejected(&e),
            PipelineError::Store(e) if e.is_fenced() => {
                // The batch may or may not be durable: say so, and how to
                // retry (newest wins, unless keys are unique).
                let retry = if self
                    .named
                    .spec()
                    .has(lance_context_host::spec::Capability::UniqueKeys)
                {
                    "this store's keys are unique: look its ids up and add again only the records not found (a record stored already is refused as existing)"
                } else {
                    "re-adding it is safe, newest wins"
                };
                let at = format!(
                    "the batch from {}: its outcome is unknown (another writer claimed the store meanwhile; {retry})",
                    positions.start()
                );
                anyhow::Error::new(PipelineError::Store(e))
                    .context(at)
                    .context(format!(
                        "stopped, {added} record(s) added before this batch"
                    ))
            }
            PipelineError::Store(err) if err.batch_problem().and_then(|p| p.row()).is_some() => {
                // The engine refused one record: say which by its line.
                let problem = err.batch_problem().expect("checked above");
                let row = problem.row().expect("checked above");
                let at = positions.name(row);
                crate::exit::Refused {
                    kind: lance_context_host::ErrorKind::from(err.kind()),
                    message: format!("{stopped}: {at}: {}", problem_text(problem, positions)),
                    details: serde_json::json!({"at": at, "column": problem.column()}),
                }
                .into()
            }
            e => {
                let at = match &e {
                    PipelineError::InvalidInput { row: Some(row), .. } => positions.name(*row),
                    _ => format!("the batch from {}", positions.start()),
                };
                anyhow::Error::new(e).context(at).context(stopped)
            }
        }
    }

    /// The plugin's rejections, listed by line or row (on stderr unless
    /// `--json`, and in the details).
    fn rejected(&self, e: &lance_context_host::PluginError) -> anyhow::Error {
        let (positions, json_errors) = (self.positions, self.json_errors);
        let errors = e.row_errors().unwrap_or_default();
        let listed: Vec<serde_json::Value> = errors
            .iter()
            .map(|r| {
                serde_json::json!({
                    "at": positions.name(r.row as usize),
                    "column": r.column,
                    "code": r.code,
                    "message": r.message,
                })
            })
            .collect();
        if !json_errors {
            print_listed(
                self.bar,
                &serde_json::Value::Array(listed.clone()),
                "rejected",
            );
        }
        let records: std::collections::BTreeSet<u32> = errors.iter().map(|r| r.row).collect();
        let more = match e {
            lance_context_host::PluginError::Rejected { total, .. } if *total > errors.len() => {
                format!(
                    " ({total} problems in all; the first {} listed)",
                    errors.len()
                )
            }
            _ => String::new(),
        };
        // With a reject file, a refusal reaches here only when no refused
        // record fails on its own (see `refused_rows`).
        let not_set_aside = if self.with_rejects {
            "; not set aside in the reject file: no refused record fails on its own, \
             so the refusal is about the batch (e.g. a key repeated within it): fix \
             the input"
        } else {
            ""
        };
        crate::exit::Refused {
            kind: lance_context_host::ErrorKind::Rejected,
            message: format!(
                "{}: the plugin rejected {} record(s) of the batch from {}{more}{}{not_set_aside}",
                stopped_at(self.added, self.dry_run),
                records.len(),
                positions.start(),
                if json_errors { "" } else { " (listed above)" }
            ),
            details: serde_json::json!({ "row_errors": listed }),
        }
        .into()
    }
}

/// The rows of `batch` that `result` refuses one by one, with why: the
/// plugin's row errors, only the rows confirmed to fail on their own (the
/// others are judged again without them; when none does, the refusal is the
/// batch's, not a record's), or the engine's
/// refusal of one row (a key that exists, a repeat in the batch, a null
/// key). `None` when the refusal is not of single rows.
async fn refused_rows(
    named: &NamedStore,
    batch: &arrow_array::RecordBatch,
    positions: &crate::input::Positions,
    result: &Result<(), PipelineError>,
) -> Option<std::collections::BTreeMap<usize, Vec<crate::input::RefusalReason>>> {
    use crate::input::RefusalReason;
    use lance_context_store::BatchProblem as P;
    let mut by_row: std::collections::BTreeMap<usize, Vec<RefusalReason>> = Default::default();
    match result {
        Err(PipelineError::Plugin(e)) => {
            let errors = e.row_errors().filter(|e| !e.is_empty())?;
            for e in errors {
                by_row
                    .entry(e.row as usize)
                    .or_default()
                    .push(RefusalReason {
                        column: e.column.clone(),
                        code: e.code.clone(),
                        message: e.message.clone(),
                    });
            }
            if by_row.keys().any(|&row| row >= batch.num_rows()) {
                return None;
            }
            let mut pass_alone = Vec::new();
            for &row in by_row.keys() {
                let alone =
                    lance_context_host::prepare(named.plugin(), &batch.slice(row, 1), 0).await;
                if alone.is_ok() {
                    pass_alone.push(row);
                }
            }
            if pass_alone.len() == by_row.len() {
                // Every refusal depends on the rest of the batch (a default
                // it cannot fill, a repeat of an earlier record): no record
                // is blamed; the batch is refused whole.
                return None;
            }
            // Only the rows that fail on their own are set aside; the
            // others (e.g. a repeat of a record refused itself) are judged
            // again without them.
            for row in pass_alone {
                by_row.remove(&row);
            }
        }
        Err(PipelineError::Store(e)) => {
            let problem = e.batch_problem()?;
            let single = matches!(
                problem,
                P::NullValue { .. }
                    | P::NullKey { .. }
                    | P::EmptyKey { .. }
                    | P::ReservedValue { .. }
                    | P::DuplicateInBatch { .. }
                    | P::AlreadyExists { .. }
                    | P::MissingSecondaryKey { .. }
                    | P::Ambiguous { .. }
                    | P::NotCurrent { .. }
                    | P::KeyTooLong { .. }
                    | P::EngineManaged { .. }
                    | P::BadVector { .. }
            );
            let row = problem.row().filter(|&r| single && r < batch.num_rows())?;
            by_row.insert(
                row,
                vec![RefusalReason {
                    column: problem.column().map(str::to_string),
                    code: lance_context_host::ErrorKind::from(e.kind())
                        .as_str()
                        .to_string(),
                    message: problem_text(problem, positions),
                }],
            );
        }
        _ => return None,
    }
    Some(by_row)
}

/// A plugin file's label in its pin (`file:NAME`): the file's name, the
/// same whatever directory it was given from.
pub(crate) fn file_label(path: &str) -> String {
    Path::new(path)
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| path.to_string())
}

/// The records of a `--sample` file (JSON Lines; blank lines skipped).
fn sample_records(path: &Path) -> Result<Vec<serde_json::Value>> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let mut records = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let record: serde_json::Value = serde_json::from_str(line)
            .map_err(|e| usage(format!("{} line {}: not JSON: {e}", path.display(), i + 1)))?;
        ensure_usage(record.is_object(), || {
            format!(
                "{} line {}: a record is a JSON object",
                path.display(),
                i + 1
            )
        })?;
        records.push(record);
    }
    Ok(records)
}

/// An engine refusal of one record in the input's terms: without the
/// batch-relative `row N: ` the engine starts with, and a repeat naming the
/// line (or row) it repeats.
fn problem_text(
    problem: &lance_context_store::BatchProblem,
    positions: &crate::input::Positions,
) -> String {
    use lance_context_store::BatchProblem as P;
    match problem {
        P::DuplicateInBatch {
            column,
            first_row,
            value,
            ..
        } => format!("{column} '{value}' repeats {}", positions.name(*first_row)),
        p => {
            let text = p.to_string();
            match p.row() {
                Some(row) => text
                    .strip_prefix(&format!("row {row}: "))
                    .map(str::to_string)
                    .unwrap_or(text),
                None => text,
            }
        }
    }
}

/// Print listed problems (`[{"at", "column", "code"?, "message"}]`) on
/// stderr, one per line: `rejected: line 3, column 'x': message (code)`.
pub(crate) fn print_listed(bar: &indicatif::ProgressBar, listed: &serde_json::Value, verb: &str) {
    let Some(listed) = listed.as_array() else {
        return;
    };
    bar.suspend(|| {
        for r in listed {
            let at = r["at"].as_str().unwrap_or_default();
            let message = crate::exit::printable(r["message"].as_str().unwrap_or_default());
            let code = r["code"]
                .as_str()
                .map(|c| format!(" ({c})"))
                .unwrap_or_default();
            match r["column"].as_str() {
                Some(c) => {
                    // (Input problems name their column in the message too.)
                    let prefix = format!("column '{c}': ");
                    let message = message.strip_prefix(&prefix).unwrap_or(&message);
                    eprintln!("{verb}: {at}, column '{c}': {message}{code}")
                }
                None => eprintln!("{verb}: {at}: {message}{code}"),
            }
        }
    });
}
