//! `lance-context store …`: stores by name in a data root's registry.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, Result};
use clap::{Args, Parser, Subcommand};
use lance_context_host::spec::SchemaSpec;
use lance_context_host::{
    CreateOptions, NamedStore, PipelineError, PluginLimits, PluginRuntime, Registry, SchemaSource,
    default_projection,
};
use lance_context_store::VectorQuery;
use serde::Serialize;

use super::{export, report};
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
    /// instead of opening the store: add, get, scan and query.
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
    /// Nearest neighbours in one of the store's vector columns.
    Search(SearchCommand),
    /// Write records out (JSON Lines, Arrow IPC or Parquet), streamed: what
    /// `store add` reads back.
    Export(export::ExportCommand),
    /// Delete records by key: tombstones when the schema declares them
    /// (visible records only; prints which were deleted), else the engine's
    /// delete.
    Delete {
        name: String,
        #[arg(required = true)]
        ids: Vec<String>,
    },
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
}

#[derive(Parser, Debug)]
pub struct SearchCommand {
    name: String,
    /// The vector column to search (a store may have several).
    #[arg(long)]
    column: String,
    /// The query vector: a JSON array or comma-separated numbers.
    #[arg(long, allow_hyphen_values = true)]
    vector: String,
    /// How many neighbours.
    #[arg(long, default_value_t = 10)]
    k: usize,
    /// SQL predicate applied before ranking.
    #[arg(long)]
    filter: Option<String>,
    /// IVF partitions to probe in the index (more: better recall, slower).
    #[arg(long)]
    nprobes: Option<usize>,
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
}

/// One row of `store list`.
#[derive(Debug, Serialize)]
struct Listed {
    name: String,
    state: String,
    plugin: String,
    plugin_version: String,
    uri: String,
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
    let registry = Registry::at(&args.root, runtime)?;
    let options: HashMap<String, String> = crate::args::options_map(&args.storage_options);
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
        StoreCommand::List => {
            let entries: Vec<Listed> = registry
                .list()?
                .into_iter()
                .map(|e| Listed {
                    name: e.name,
                    state: format!("{:?}", e.state).to_lowercase(),
                    plugin: e.plugin.name,
                    plugin_version: e.plugin.version,
                    uri: e.uri,
                })
                .collect();
            out.list(
                &entries,
                &["name", "state", "plugin", "version", "uri"],
                |e| {
                    vec![
                        e.name.clone(),
                        e.state.clone(),
                        e.plugin.clone(),
                        e.plugin_version.clone(),
                        e.uri.clone(),
                    ]
                },
                &format!("no stores under {}", args.root.display()),
            )
        }
        StoreCommand::Describe { name } => {
            let entry = registry.describe(&name)?;
            out.item(&entry, || {
                serde_json::to_string_pretty(&entry).unwrap_or_default()
            })
        }
        StoreCommand::Drop { name, yes } => {
            let entry = registry.describe(&name)?;
            ensure_usage(yes, || {
                format!(
                    "dropping '{name}' deletes {} and its registry entry; pass --yes to do it",
                    entry.uri
                )
            })?;
            let report = registry.drop_store(&name, &options).await?;
            let dropped = serde_json::json!({
                "store": report.name,
                "uri": report.uri,
                "entry": report.entry,
                "plugin_file": report.plugin_file,
            });
            out.item(&dropped, || {
                format!(
                    "dropped store '{}'\nremoved data:  {}\nremoved entry: {}\n{}",
                    report.name,
                    report.uri,
                    report.entry.display(),
                    match &report.plugin_file {
                        Some(p) => format!("removed plugin file: {}", p.display()),
                        None => "kept the plugin file (another store pins it)".to_string(),
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
            let rows: Vec<_> = ids
                .iter()
                .zip(done)
                .map(|(id, deleted)| serde_json::json!({"key": id, "deleted": deleted}))
                .collect();
            out.list(
                &rows,
                &["key", "result"],
                |r| {
                    vec![
                        r["key"].as_str().unwrap_or_default().to_string(),
                        if r["deleted"].as_bool().unwrap_or(false) {
                            "deleted".to_string()
                        } else {
                            "no visible record".to_string()
                        },
                    ]
                },
                "",
            )
        }
        StoreCommand::Status { name } => {
            let named = read(name, AsOf::default()).await?;
            report::status(&out, &named.stats().await?, named.count(None).await?)
        }
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
        StoreCommand::Merge { name } => {
            let named = registry
                .open_with(&name, &options, false, |c| c.with_manual_maintenance())
                .await?;
            let bar = out.spinner(&format!("merging {name}"));
            let t = Instant::now();
            let stats = named.merge().await;
            bar.finish_and_clear();
            named.close().await?;
            report::merge(&out, &stats?, t.elapsed().as_secs_f64())
        }
        StoreCommand::Compact { name } => {
            // Compaction commits to the base table only: no writer is claimed,
            // so a running service keeps writing.
            let named = read(name.clone(), AsOf::default()).await?;
            let bar = out.spinner(&format!("compacting {name}"));
            let t = Instant::now();
            let stats = named.compact().await;
            bar.finish_and_clear();
            report::compaction(&out, &stats?, t.elapsed().as_secs_f64())
        }
        StoreCommand::Index { name, column } => {
            let named = read(name.clone(), AsOf::default()).await?;
            let columns: Vec<String> = match column {
                Some(c) => vec![c],
                None => named
                    .spec()
                    .vectors
                    .iter()
                    .map(|v| v.column.clone())
                    .collect(),
            };
            ensure_usage(!columns.is_empty(), || {
                format!("store '{name}' declares no vector column to index")
            })?;
            let mut built = Vec::new();
            for column in columns {
                let bar = out.spinner(&format!("building the vector index on {column}"));
                let t = Instant::now();
                let result = named.build_vector_index(&column).await;
                bar.finish_and_clear();
                result?;
                built.push(serde_json::json!({
                    "column": column,
                    "seconds": t.elapsed().as_secs_f64(),
                }));
            }
            out.list(
                &built,
                &["column", "seconds"],
                |b| {
                    vec![
                        b["column"].as_str().unwrap_or_default().to_string(),
                        format!("{:.2}", b["seconds"].as_f64().unwrap_or(0.0)),
                    ]
                },
                "",
            )
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
            ensure_usage(c.k >= 1, || "--k must be at least 1".into())?;
            ensure_usage(c.nprobes != Some(0), || {
                "--nprobes must be at least 1".into()
            })?;
            let named = read(c.name.clone(), AsOf::default()).await?;
            let vector = parse_vector(&c.vector)?;
            let mut query = VectorQuery::new(&c.column, vector, c.k);
            query.filter = c.filter;
            query.nprobes = c.nprobes;
            out.rows(&named.nearest(&query).await?)
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
                let queries: Vec<_> = named
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
                return out.list(
                    &queries,
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
                );
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

/// The commands that work through a server.
async fn remote(
    client: &lance_context_client::Client,
    command: StoreCommand,
    out: Out,
) -> Result<()> {
    use super::remote;
    let local_only = |what: &str| {
        usage(format!(
            "{what} is not available with --server (add, get, scan and query are); use the server's API or run it where the data root is"
        ))
    };
    match command {
        StoreCommand::Add(c) => {
            ensure_usage(!c.dry_run, || {
                "--dry-run is not available with --server".into()
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
            ensure_usage(columns.is_none() && as_of.as_of.is_none(), || {
                "--columns and --as-of are not available with --server".into()
            })?;
            remote::get(client, &name, &ids, out).await
        }
        StoreCommand::Scan { name, scan, as_of } => {
            ensure_usage(as_of.as_of.is_none(), || {
                "--as-of is not available with --server".into()
            })?;
            remote::scan(client, &name, scan, out).await
        }
        StoreCommand::Query {
            name,
            query: Some(query),
            args,
            as_of,
        } => {
            ensure_usage(as_of.as_of.is_none(), || {
                "--as-of is not available with --server".into()
            })?;
            remote::query(client, &name, &query, &args, out).await
        }
        StoreCommand::Query { query: None, .. } => Err(local_only("listing queries")),
        other => Err(local_only(&format!(
            "'{}'",
            format!("{other:?}")
                .split([' ', '{', '('])
                .next()
                .unwrap_or("this command")
                .to_lowercase()
        ))),
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
            SchemaSource::Plugin { label: p, bytes }
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
            },
        )
        .await?;
    named.close().await?;
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
    // A dry run claims no writer: it only reads the entry and runs the plugin.
    let named = registry
        .open_with(&c.name, options, c.dry_run, |c| c)
        .await?;
    let bar = out.bar(input.total, &format!("adding to {}", c.name));
    let started = Instant::now();
    let result = add_chunks(&named, &mut input, c.dry_run, out.json_errors, &bar).await;
    bar.finish_and_clear();
    if !c.dry_run {
        named.close().await?;
    }
    let (records, batches) = result?;
    if records == 0 {
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
    };
    out.item(&added, || {
        if c.dry_run {
            format!(
                "dry run: {records} record(s) would be added to '{}' (nothing written)",
                c.name
            )
        } else {
            format!(
                "added {records} record(s) to '{}' in {batches} batch(es), {:.1} s ({:.0} records/s)",
                c.name, seconds, added.records_per_second
            )
        }
    })
}

/// Add (or, dry, only prepare) every chunk; (records, batches). A refused
/// chunk stops the run: its problems are printed by line or row, earlier
/// chunks stay.
async fn add_chunks(
    named: &NamedStore,
    input: &mut Input,
    dry_run: bool,
    json_errors: bool,
    bar: &indicatif::ProgressBar,
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
            Err(e) => return Err(e.context(stopped(added))),
        };
        let rows = chunk.batch.num_rows();
        let result = if dry_run {
            lance_context_host::prepare(named.plugin(), &chunk.batch, 0)
                .await
                .map(|_| ())
        } else {
            named.add(&chunk.batch).await.map(|_| ())
        };
        match result {
            Ok(()) => {
                added += rows;
                batches += 1;
            }
            Err(PipelineError::Plugin(e)) if e.row_errors().is_some() => {
                let errors = e.row_errors().unwrap_or_default();
                let listed: Vec<serde_json::Value> = errors
                    .iter()
                    .map(|r| {
                        serde_json::json!({
                            "at": chunk.positions.name(r.row as usize),
                            "column": r.column,
                            "code": r.code,
                            "message": r.message,
                        })
                    })
                    .collect();
                if !json_errors {
                    bar.suspend(|| {
                        for r in &listed {
                            let at = r["at"].as_str().unwrap_or_default();
                            let message = r["message"].as_str().unwrap_or_default();
                            let code = r["code"].as_str().unwrap_or_default();
                            match r["column"].as_str() {
                                Some(c) => {
                                    eprintln!("rejected: {at}, column '{c}': {message} ({code})")
                                }
                                None => eprintln!("rejected: {at}: {message} ({code})"),
                            }
                        }
                    });
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
                return Err(crate::exit::Refused {
                    kind: lance_context_host::ErrorKind::Rejected,
                    message: format!(
                        "{}: the plugin rejected {} record(s) of the batch from {}{more}{}",
                        stopped(added),
                        records.len(),
                        chunk.positions.start(),
                        if json_errors { "" } else { " (listed above)" }
                    ),
                    details: serde_json::json!({ "row_errors": listed }),
                }
                .into());
            }
            Err(PipelineError::Store(e)) if e.is_fenced() => {
                // The batch may or may not be durable: say so.
                let at = format!(
                    "the batch from {}: its outcome is unknown (another writer claimed the store meanwhile; re-adding it is safe, newest wins)",
                    chunk.positions.start()
                );
                return Err(anyhow::Error::new(PipelineError::Store(e))
                    .context(at)
                    .context(format!(
                        "stopped, {added} record(s) added before this batch"
                    )));
            }
            Err(e) => {
                let at = match &e {
                    PipelineError::InvalidInput { row: Some(row), .. } => {
                        chunk.positions.name(*row)
                    }
                    _ => format!("the batch from {}", chunk.positions.start()),
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

/// `[0.1, 0.2]` or `0.1,0.2`.
fn parse_vector(text: &str) -> Result<Vec<f32>> {
    let trimmed = text.trim();
    let values: Result<Vec<f32>, _> = if trimmed.starts_with('[') {
        serde_json::from_str::<Vec<f32>>(trimmed).map_err(|e| e.to_string())
    } else {
        trimmed
            .split(',')
            .map(|v| v.trim().parse::<f32>().map_err(|e| format!("'{v}': {e}")))
            .collect()
    };
    let values = values.map_err(|e| usage(format!("--vector: not a list of numbers: {e}")))?;
    ensure_usage(values.iter().all(|v| v.is_finite()), || {
        "--vector: every number must be finite".into()
    })?;
    Ok(values)
}
