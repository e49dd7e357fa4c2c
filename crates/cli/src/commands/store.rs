//! `lance-context store …`: stores by name in a data root's registry.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, Result};
use clap::{Args, Parser, Subcommand};
use lance_context_host::spec::SchemaSpec;
use lance_context_host::{
    CreateOptions, Embedded, EmbeddedConfig, NamedStore, PipelineError, PluginLimits,
    PluginRuntime, Registry, Residency, SchemaSource, default_projection,
};
use serde::Serialize;

use super::through::{self, Via};
use super::{export, report, search};
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
    /// instead of opening the data root: every store command but `upgrade`,
    /// `versions` and `export` (and `--as-of`, `add --dry-run`,
    /// `add --reject-file`, `create --sample`), which need the data root.
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
    /// the schema differs, and when the new plugin fails the probe. A
    /// running server keeps the old plugin until it reopens the store.
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
        return remote(&client, args.command, out).await;
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
    // The store API over the data root: a store opened per command (a read
    // claims no writer, so a running server is not fenced).
    let api = Embedded::new(
        registry.clone(),
        EmbeddedConfig {
            storage_options: options.clone(),
            residency: Residency::PerCall,
            ..EmbeddedConfig::default()
        },
    );
    let read = |name: String, as_of: AsOf| {
        let registry = registry.clone();
        let options = options.clone();
        async move {
            registry
                .open_with(&name, &options, true, |c| as_of.apply(c))
                .await
        }
    };
    match args.command {
        StoreCommand::Create(c) => create(&registry, options, c, out).await,
        StoreCommand::Adopt(c) => c.run(&registry, options, out).await,
        StoreCommand::List => {
            let empty = format!("no stores under {}", args.root.display());
            through::list(&api, Via::Local, &empty, out).await
        }
        StoreCommand::Describe { name } => through::describe(&api, Via::Local, &name, out).await,
        StoreCommand::Drop { name, yes } => {
            let entry = registry.describe(&name)?;
            ensure_usage(yes, || {
                match entry.adopted && entry.state != lance_context_host::EntryState::Ready {
                    true => format!(
                        "dropping '{name}' removes its registry entry (an adoption that did not finish: {} is kept); pass --yes to do it",
                        entry.uri
                    ),
                    false => format!(
                        "dropping '{name}' deletes {} and its registry entry; pass --yes to do it",
                        entry.uri
                    ),
                }
            })?;
            let report = registry.drop_store(&name, &options).await?;
            let dropped = serde_json::json!({
                "store": report.name,
                "uri": report.uri,
                "entry": report.entry,
                "plugin_file": report.plugin_file,
                "data_deleted": report.data_deleted,
            });
            out.item(&dropped, || {
                format!(
                    "dropped store '{}'\n{}  {}\nremoved entry: {}\n{}",
                    report.name,
                    match report.data_deleted {
                        true => "removed data:",
                        false => "kept data:   ",
                    },
                    report.uri,
                    report.entry.display(),
                    match &report.plugin_file {
                        Some(p) => format!("removed plugin file: {}", p.display()),
                        None => "kept the plugin file (another store pins it)".to_string(),
                    }
                )
            })
        }
        StoreCommand::Upgrade {
            name,
            plugin,
            sample,
        } => {
            let given = plugin.display().to_string();
            let builtin = (!plugin.exists())
                .then(|| lance_context_host::builtin_plugin_bytes(&given))
                .flatten();
            let (bytes, label) = match builtin {
                Some(bytes) => (bytes.to_vec(), given.clone()),
                None => (
                    std::fs::read(&plugin)
                        .with_context(|| format!("reading {}", plugin.display()))?,
                    file_label(&given),
                ),
            };
            let samples = read_samples(sample.as_deref())?;
            let report = registry.upgrade(&name, &label, &bytes, samples).await?;
            print_warnings(&report.probe_warnings, &out);
            let upgraded = serde_json::json!({
                "store": report.name,
                "from": {"plugin": report.from.name, "version": report.from.version, "sha256": report.from.sha256},
                "to": {"plugin": report.to.name, "version": report.to.version, "sha256": report.to.sha256},
                "removed_plugin_file": report.removed_plugin_file,
            });
            out.item(&upgraded, || {
                format!(
                    "store '{}' now pins {} {} (sha256 {}), was {} {} (sha256 {}); the schema is unchanged{}",
                    report.name,
                    report.to.name,
                    report.to.version,
                    &report.to.sha256[..12.min(report.to.sha256.len())],
                    report.from.name,
                    report.from.version,
                    &report.from.sha256[..12.min(report.from.sha256.len())],
                    match &report.removed_plugin_file {
                        Some(p) => format!("; removed the old plugin file {}", p.display()),
                        None => String::new(),
                    }
                )
            })
        }
        StoreCommand::Add(c) => add(&registry, &options, c, out).await,
        StoreCommand::Delete { name, ids } => {
            let named = registry
                .open_with(&name, &options, false, |c| c.with_manual_maintenance())
                .await?;
            let ids: Vec<&str> = ids.iter().map(String::as_str).collect();
            let result = named.delete(&ids).await;
            named.close().await?;
            let done = result?;
            let deleted: Vec<lance_context_client::Deleted> = ids
                .iter()
                .zip(done)
                .map(|(id, deleted)| lance_context_client::Deleted {
                    key: id.to_string(),
                    deleted,
                })
                .collect();
            through::print_deleted(&out, &deleted)
        }
        StoreCommand::Status { name } => through::status(&api, Via::Local, &name, out).await,
        StoreCommand::Upsert(c) => c.run(&api, Via::Local, out).await,
        StoreCommand::Patch(c) => c.run(&api, Via::Local, out).await,
        StoreCommand::Versions { name } => {
            let named = read(name, AsOf::default()).await?;
            let versions: Vec<_> = named
                .versions()
                .await?
                .into_iter()
                .map(|v| {
                    serde_json::json!({
                        "version": v.version,
                        "timestamp": chrono::DateTime::from_timestamp_micros(v.timestamp_micros)
                            .map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Micros, true)),
                        "current": v.current,
                    })
                })
                .collect();
            out.list(
                &versions,
                &["version", "committed (UTC)", "current"],
                |v| {
                    vec![
                        v["version"].to_string(),
                        v["timestamp"].as_str().unwrap_or_default().to_string(),
                        if v["current"].as_bool().unwrap_or(false) {
                            "*".to_string()
                        } else {
                            String::new()
                        },
                    ]
                },
                "no versions",
            )
        }
        StoreCommand::Merge { name } => through::merge(&api, Via::Local, &name, out).await,
        StoreCommand::Compact { name } => through::compact(&api, Via::Local, &name, out).await,
        StoreCommand::Index { name, column } => {
            through::index(&api, Via::Local, &name, column.as_deref(), out).await
        }
        StoreCommand::Get {
            name,
            ids,
            columns,
            as_of,
        } => {
            let named = read(name, as_of).await?;
            let ids: Vec<&str> = ids.iter().map(String::as_str).collect();
            let mut projection = columns.unwrap_or_else(|| default_projection(&named.entry().spec));
            // The key is always there: it says which records were found.
            if !projection.contains(&named.entry().spec.key) {
                projection.insert(0, named.entry().spec.key.clone());
            }
            let found = named.lookup(&ids, Some(&projection)).await?;
            report::found(&out, &found, &named.entry().spec.key, &ids)
        }
        StoreCommand::Scan { name, scan, as_of } => {
            let named = read(name, as_of).await?;
            let request = scan.request(Some(default_projection(&named.entry().spec)))?;
            out.rows(&named.scan(request).await?)
        }
        StoreCommand::Count {
            name,
            filter,
            as_of,
        } => {
            let named = read(name, as_of).await?;
            let count = named.count(filter.as_deref()).await?;
            out.item(&serde_json::json!({ "count": count }), || count.to_string())
        }
        StoreCommand::Search(c) => {
            let named = read(c.name.clone(), AsOf::default()).await?;
            search::search(&named, &c, out).await
        }
        StoreCommand::Retrieve(c) => {
            let named = read(c.name.clone(), AsOf::default()).await?;
            search::retrieve(&named, &c, out).await
        }
        StoreCommand::Export(c) => {
            let named = read(c.name.clone(), c.as_of).await?;
            export::run(&named, c, out).await
        }
        StoreCommand::Query {
            name,
            query,
            args,
            as_of,
        } => {
            let named = read(name, as_of).await?;
            let Some(query) = query else {
                let queries: Vec<serde_json::Value> = named
                    .spec()
                    .queries
                    .iter()
                    .map(|q| {
                        serde_json::json!({
                            "query": q.name,
                            "params": q.params,
                            "description": q.description,
                            "reduce": q.reduce,
                        })
                    })
                    .collect();
                return print_queries(&out, &queries);
            };
            let reduces = named
                .spec()
                .queries
                .iter()
                .any(|q| q.name == query && q.reduce);
            if reduces {
                let value = named.reduce(&query, &args).await?;
                println!("{}", value.get());
                return Ok(());
            }
            out.rows(&named.query(&query, &args).await?)
        }
    }
}

/// A schema's named queries (`store query NAME` without a query).
fn print_queries(out: &Out, queries: &[serde_json::Value]) -> Result<()> {
    out.list(
        queries,
        &["query", "arguments", "description"],
        |q| {
            vec![
                q["query"].as_str().unwrap_or_default().to_string(),
                q["params"]
                    .as_array()
                    .map(|ps| {
                        ps.iter()
                            .map(|p| format!("--arg {}=…", p.as_str().unwrap_or("")))
                            .collect::<Vec<_>>()
                            .join(" ")
                    })
                    .unwrap_or_default(),
                format!(
                    "{}{}",
                    q["description"].as_str().unwrap_or_default(),
                    if q["reduce"].as_bool().unwrap_or(false) {
                        " (reduces to JSON)"
                    } else {
                        ""
                    }
                ),
            ]
        },
        "the schema declares no named queries",
    )
}

/// The store commands through a server (`--server`): those the store API
/// carries run the same code as where the data root is.
async fn remote(
    client: &lance_context_client::Client,
    command: StoreCommand,
    out: Out,
) -> Result<()> {
    use super::remote;
    use lance_context_client::StoreApi as _;
    const VIA: Via = Via::Server;
    let failed = |e| through::failed(e, VIA);
    let local_only = |what: &str| {
        usage(format!(
            "{what} is not available with --server: it needs the data root (run it where the data root is)"
        ))
    };
    let no_as_of = |as_of: &AsOf| {
        ensure_usage(as_of.as_of.is_none(), || {
            "--as-of is not available with --server".into()
        })
    };
    match command {
        StoreCommand::Create(c) => remote::create(client, c.into_request()?, out).await,
        StoreCommand::Adopt(c) => c.remote(client, out).await,
        StoreCommand::List => through::list(client, VIA, "no stores on the server", out).await,
        StoreCommand::Describe { name } => through::describe(client, VIA, &name, out).await,
        StoreCommand::Drop { name, yes } => {
            ensure_usage(yes, || {
                format!(
                    "dropping '{name}' deletes its data and registry entry on the server; pass --yes to do it"
                )
            })?;
            remote::drop(client, &name, out).await
        }
        StoreCommand::Add(c) => {
            ensure_usage(!c.dry_run, || {
                "--dry-run is not available with --server".into()
            })?;
            ensure_usage(c.reject_file.is_none(), || {
                "--reject-file is not available with --server (the server refuses a batch whole)"
                    .into()
            })?;
            ensure_usage(c.batch_rows > 0, || {
                "--batch-rows must be at least 1".into()
            })?;
            remote::add(
                client,
                &c.name,
                c.file.as_ref(),
                c.format,
                c.batch_rows,
                out,
            )
            .await
        }
        StoreCommand::Get {
            name,
            ids,
            columns,
            as_of,
        } => {
            ensure_usage(columns.is_none(), || {
                "--columns is not available with --server".into()
            })?;
            no_as_of(&as_of)?;
            remote::get(client, &name, &ids, out).await
        }
        StoreCommand::Scan { name, scan, as_of } => {
            no_as_of(&as_of)?;
            remote::scan(client, &name, scan, out).await
        }
        StoreCommand::Count {
            name,
            filter,
            as_of,
        } => {
            no_as_of(&as_of)?;
            let count = remote::count(client, &name, filter).await?;
            out.item(&serde_json::json!({ "count": count }), || count.to_string())
        }
        StoreCommand::Query {
            name,
            query: Some(query),
            args,
            as_of,
        } => {
            no_as_of(&as_of)?;
            remote::query(client, &name, &query, &args, out).await
        }
        StoreCommand::Query {
            name,
            query: None,
            as_of: _,
            ..
        } => {
            let info = client.describe_store(&name).await.map_err(failed)?;
            let queries: Vec<serde_json::Value> = info.spec["queries"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|q| {
                    serde_json::json!({
                        "query": q["name"],
                        "params": q["params"],
                        "description": q["description"],
                        "reduce": q["reduce"].as_bool().unwrap_or(false),
                    })
                })
                .collect();
            print_queries(&out, &queries)
        }
        StoreCommand::Search(c) => {
            let records = client
                .search(&c.name, &c.request()?)
                .await
                .map_err(failed)?;
            out.values(&records.values()?)
        }
        StoreCommand::Retrieve(c) => {
            let records = client
                .retrieve(&c.name, &c.request()?)
                .await
                .map_err(failed)?;
            out.values(&records.values()?)
        }
        StoreCommand::Delete { name, ids } => remote::delete(client, &name, &ids, out).await,
        StoreCommand::Upsert(c) => c.run(client, VIA, out).await,
        StoreCommand::Patch(c) => c.run(client, VIA, out).await,
        StoreCommand::Status { name } => through::status(client, VIA, &name, out).await,
        StoreCommand::Merge { name } => through::merge(client, VIA, &name, out).await,
        StoreCommand::Compact { name } => through::compact(client, VIA, &name, out).await,
        StoreCommand::Index { name, column } => {
            through::index(client, VIA, &name, column.as_deref(), out).await
        }
        StoreCommand::Upgrade { .. } => Err(local_only("'upgrade'")),
        StoreCommand::Versions { .. } => Err(local_only("'versions'")),
        StoreCommand::Export(_) => Err(local_only("'export'")),
    }
}

impl CreateCommand {
    /// The create as the API takes it (a plugin file's bytes base64, a
    /// spec file's JSON, each parameter as JSON when it parses, else a
    /// string).
    fn into_request(self) -> Result<lance_context_client::CreateStore> {
        use base64::Engine as _;
        ensure_usage(self.sample.is_none(), || {
            "--sample is not available with --server".into()
        })?;
        let mut create = lance_context_client::CreateStore {
            name: self.name,
            uri: self.uri,
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

async fn create(
    registry: &Registry,
    options: HashMap<String, String>,
    c: CreateCommand,
    out: Out,
) -> Result<()> {
    let source = match (c.plugin, c.spec) {
        (_, Some(file)) => {
            let text = std::fs::read_to_string(&file)
                .with_context(|| format!("reading {}", file.display()))?;
            SchemaSource::Spec(SchemaSpec::from_json(&text)?)
        }
        (Some(p), None) if p.ends_with(".wasm") || p.contains('/') => {
            let bytes = std::fs::read(&p).with_context(|| format!("reading {p}"))?;
            SchemaSource::Plugin {
                label: file_label(&p),
                bytes,
            }
        }
        (Some(p), None) => SchemaSource::Builtin(p),
        (None, None) => return Err(usage("give --plugin or --spec")),
    };
    let named = registry
        .create(
            &c.name,
            CreateOptions {
                source,
                params: c.params,
                uri: c.uri,
                storage_options: options,
                probe_samples: read_samples(c.sample.as_deref())?,
            },
        )
        .await?;
    named.close().await?;
    // The probe passed (or the create was refused); its warnings are for
    // the plugin's author: say them.
    print_warnings(named.probe_warnings(), &out);
    let e = named.entry();
    let created = serde_json::json!({
        "store": e.name,
        "uri": e.uri,
        "columns": e.spec.columns.len(),
        "plugin": e.plugin.name,
        "plugin_version": e.plugin.version,
        "sha256": e.plugin.sha256,
    });
    out.item(&created, || {
        format!(
            "created store '{}' at {} ({} columns, plugin {} {} sha256 {})",
            e.name,
            e.uri,
            e.spec.columns.len(),
            e.plugin.name,
            e.plugin.version,
            &e.plugin.sha256[..12.min(e.plugin.sha256.len())]
        )
    })
}

async fn add(
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
    // The outermost words of the error: what happened to the input so far.
    let stopped = |added: usize| {
        if dry_run {
            format!("dry run stopped ({added} valid record(s) before this batch)")
        } else if added == 0 {
            "refused, nothing added".to_string()
        } else {
            format!("refused, {added} record(s) added before this batch")
        }
    };
    loop {
        let chunk = match input.next_chunk(named.plugin()) {
            Ok(Some(chunk)) => chunk,
            Ok(None) => break,
            Err(e) => {
                if !json_errors {
                    print_listed(bar, &crate::exit::details(&e)["input_errors"], "refused");
                }
                return Err(e.context(stopped(added)));
            }
        };
        let crate::input::Chunk {
            batch,
            mut positions,
            mut texts,
            refused,
        } = chunk;
        // The chunk's refused records, written in input order once the
        // chunk is done.
        let mut set_aside = refused;
        let Some(mut batch) = batch else {
            if let Some(r) = rejects.as_deref_mut() {
                r.write_all(set_aside)?;
            }
            continue;
        };
        // With a reject file, rows refused one by one — by the plugin (each
        // confirmed to fail on its own) or by the engine (a key that exists,
        // a repeat in the batch) — are set aside and the rest tried again;
        // each round removes at least one row. A refusal that depends on
        // other rows of the batch refuses the batch as without a reject file.
        let outcome = loop {
            let result = if dry_run {
                lance_context_host::prepare(named.plugin(), &batch, 0)
                    .await
                    .map(|_| ())
            } else {
                named.add(&batch).await.map(|_| ())
            };
            if rejects.is_none() {
                break result;
            }
            let Some(by_row) = refused_rows(named, &batch, &positions, &result).await else {
                break result;
            };
            let rows: Vec<usize> = by_row.keys().copied().collect();
            let records = match &texts {
                Some(texts) => rows
                    .iter()
                    .map(|&row| {
                        let text = texts.get(row).map(String::as_str).unwrap_or_default();
                        serde_json::from_str(text)
                            .unwrap_or_else(|_| serde_json::Value::String(text.to_string()))
                    })
                    .collect(),
                None => crate::input::rows_as_json(&batch, &rows),
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
                break Ok(());
            }
            batch = arrow_select::filter::filter_record_batch(
                &batch,
                &arrow_array::BooleanArray::from(keep),
            )?;
        };
        if let Some(r) = rejects.as_deref_mut() {
            r.write_all(set_aside)?;
        }
        let rows = positions.len();
        match outcome {
            Ok(()) => {
                added += rows;
                batches += usize::from(rows > 0);
            }
            Err(PipelineError::Plugin(e)) if e.row_errors().is_some() => {
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
                    print_listed(bar, &serde_json::Value::Array(listed.clone()), "rejected");
                }
                let records: std::collections::BTreeSet<u32> =
                    errors.iter().map(|r| r.row).collect();
                let more = match e {
                    lance_context_host::PluginError::Rejected { total, .. }
                        if total > errors.len() =>
                    {
                        format!(
                            " ({total} problems in all; the first {} listed)",
                            errors.len()
                        )
                    }
                    _ => String::new(),
                };
                // With a reject file, a refusal reaches here only when no
                // refused record fails on its own (see `refused_rows`).
                let not_set_aside = if rejects.is_some() {
                    "; not set aside in the reject file: no refused record fails on its own, \
                     so the refusal is about the batch (e.g. a key repeated within it): fix \
                     the input"
                } else {
                    ""
                };
                return Err(crate::exit::Refused {
                    kind: lance_context_host::ErrorKind::Rejected,
                    message: format!(
                        "{}: the plugin rejected {} record(s) of the batch from {}{more}{}{not_set_aside}",
                        stopped(added),
                        records.len(),
                        positions.start(),
                        if json_errors { "" } else { " (listed above)" }
                    ),
                    details: serde_json::json!({ "row_errors": listed }),
                }
                .into());
            }
            Err(PipelineError::Store(e)) if e.is_fenced() => {
                // The batch may or may not be durable: say so, and how to
                // retry (newest wins, unless keys are unique).
                let retry = if named
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
                return Err(anyhow::Error::new(PipelineError::Store(e))
                    .context(at)
                    .context(format!(
                        "stopped, {added} record(s) added before this batch"
                    )));
            }
            Err(PipelineError::Store(err))
                if err.batch_problem().and_then(|p| p.row()).is_some() =>
            {
                // The engine refused one record: say which by its line.
                let problem = err.batch_problem().expect("checked above");
                let row = problem.row().expect("checked above");
                let at = positions.name(row);
                return Err(crate::exit::Refused {
                    kind: lance_context_host::ErrorKind::from(err.kind()),
                    message: format!(
                        "{}: {at}: {}",
                        stopped(added),
                        problem_text(problem, &positions)
                    ),
                    details: serde_json::json!({"at": at, "column": problem.column()}),
                }
                .into());
            }
            Err(e) => {
                let at = match &e {
                    PipelineError::InvalidInput { row: Some(row), .. } => positions.name(*row),
                    _ => format!("the batch from {}", positions.start()),
                };
                return Err(anyhow::Error::new(e).context(at).context(stopped(added)));
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

fn read_samples(path: Option<&Path>) -> Result<Option<Vec<u8>>> {
    path.map(|p| std::fs::read(p).with_context(|| format!("reading {}", p.display())))
        .transpose()
}

/// The probe's warnings about a plugin just pinned, on stderr (the probe
/// passed: a create or upgrade with a problem is refused).
fn print_warnings(warnings: &[String], out: &Out) {
    if !out.json_errors {
        for w in warnings {
            eprintln!("warning: {}", crate::exit::printable(w));
        }
    }
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
fn print_listed(bar: &indicatif::ProgressBar, listed: &serde_json::Value, verb: &str) {
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
