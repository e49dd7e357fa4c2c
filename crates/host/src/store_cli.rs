//! `lance-context store …`: stores by name in a data root's registry.

use std::collections::HashMap;
use std::io::Read;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{Context, Result, bail};
use clap::{Args, Subcommand};
use lance_context_host::spec::SchemaSpec;
use lance_context_host::{CreateOptions, Registry, SchemaSource};
use lance_context_host::{PluginLimits, PluginRuntime};

use crate::{ScanArgs, StorageOption, parse_kv, parse_storage_option, print_json_lines};

#[derive(Args, Debug)]
pub struct StoreArgs {
    /// The data root holding the registry (and stores created without --uri).
    #[arg(long, default_value = "data", global = true)]
    root: PathBuf,
    /// Storage option `key=value` for the store's object store; repeatable.
    /// Values are never recorded: pass them on every command.
    #[arg(long = "storage-option", value_parser = parse_storage_option, global = true)]
    storage_options: Vec<StorageOption>,
    #[command(subcommand)]
    command: StoreCommand,
}

#[derive(Subcommand, Debug)]
enum StoreCommand {
    /// Create a store from a built-in plugin, a plugin file or a spec file.
    Create {
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
    },
    /// List the stores.
    List,
    /// Print a store's registry entry (JSON).
    Describe { name: String },
    /// Delete a store: its data, its entry, and its plugin file if unshared.
    Drop {
        name: String,
        /// Really delete.
        #[arg(long)]
        yes: bool,
    },
    /// Add JSON Lines records (a file, or stdin) through the store's plugin,
    /// in batches: each batch is one add (durable when reported); a batch with
    /// a bad record is refused whole, and the command stops there.
    Add {
        name: String,
        /// JSON Lines file; `-` or absent reads stdin.
        file: Option<PathBuf>,
        /// Records per add.
        #[arg(long, default_value_t = 10_000)]
        batch_rows: usize,
    },
    /// Print rows by key, as JSON lines.
    Get {
        name: String,
        #[arg(required = true)]
        ids: Vec<String>,
    },
    /// Print rows as JSON lines (blob columns left out unless named).
    Scan {
        name: String,
        #[command(flatten)]
        scan: ScanArgs,
    },
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
    /// Fold the store's WAL into its base table now.
    Merge { name: String },
    /// Compact the store's fragments and re-ensure its indexes (no writer
    /// is claimed: a running service keeps writing).
    Compact { name: String },
    /// Run one of the schema's named queries (e.g. rollout `trajectory`).
    Query {
        name: String,
        /// The query; without one, list the schema's queries.
        query: Option<String>,
        /// Argument `param=value`; repeatable.
        #[arg(long = "arg", value_parser = parse_kv)]
        args: Vec<(String, String)>,
    },
}

pub async fn run(args: StoreArgs) -> Result<()> {
    let runtime = Arc::new(PluginRuntime::new(
        PluginLimits::default(),
        lance_context_host::default_cache_dir().as_deref(),
    )?);
    let registry = Registry::at(&args.root, runtime)?;
    let options: HashMap<String, String> = args
        .storage_options
        .into_iter()
        .map(|o| (o.0, o.1))
        .collect();
    match args.command {
        StoreCommand::Create {
            name,
            plugin,
            spec,
            params,
            uri,
        } => {
            let source = match (plugin, spec) {
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
                (None, None) => bail!("give --plugin or --spec"),
            };
            let named = registry
                .create(
                    &name,
                    CreateOptions {
                        source,
                        params,
                        uri,
                        storage_options: options,
                    },
                )
                .await?;
            named.close().await?;
            let e = &named.entry();
            println!(
                "created store '{}' at {} ({} columns, plugin {} {} sha256 {})",
                e.name,
                e.uri,
                e.spec.columns.len(),
                e.plugin.name,
                e.plugin.version,
                &e.plugin.sha256[..12]
            );
            Ok(())
        }
        StoreCommand::List => {
            let entries = registry.list()?;
            if entries.is_empty() {
                println!("no stores under {}", args.root.display());
            }
            for e in entries {
                println!(
                    "{:<24} {:<10} {:<12} {:<8} {}",
                    e.name,
                    format!("{:?}", e.state).to_lowercase(),
                    e.plugin.name,
                    e.plugin.version,
                    e.uri
                );
            }
            Ok(())
        }
        StoreCommand::Describe { name } => {
            let entry = registry.describe(&name)?;
            println!("{}", serde_json::to_string_pretty(&entry)?);
            Ok(())
        }
        StoreCommand::Drop { name, yes } => {
            let entry = registry.describe(&name)?;
            if !yes {
                bail!(
                    "dropping '{name}' deletes {} and its registry entry; pass --yes to do it",
                    entry.uri
                );
            }
            let report = registry.drop_store(&name, &options).await?;
            println!("dropped store '{}'", report.name);
            println!("removed data:  {}", report.uri);
            println!("removed entry: {}", report.entry.display());
            match report.plugin_file {
                Some(p) => println!("removed plugin file: {}", p.display()),
                None => println!("kept the plugin file (another store pins it)"),
            }
            Ok(())
        }
        StoreCommand::Add {
            name,
            file,
            batch_rows,
        } => {
            if batch_rows == 0 {
                bail!("--batch-rows must be at least 1");
            }
            let mut text = Vec::new();
            match file.as_deref().filter(|f| f.as_os_str() != "-") {
                Some(f) => {
                    text = std::fs::read(f).with_context(|| format!("reading {}", f.display()))?
                }
                None => {
                    std::io::stdin().read_to_end(&mut text)?;
                }
            }
            let text = String::from_utf8(text).context("the input is not UTF-8")?;
            // (line number, record), blank lines skipped.
            let lines: Vec<(usize, &str)> = text
                .lines()
                .enumerate()
                .filter(|(_, l)| !l.trim().is_empty())
                .map(|(i, l)| (i + 1, l))
                .collect();
            if lines.is_empty() {
                bail!("no records in the input");
            }
            let named = registry.open(&name, &options).await?;
            let result = add_in_batches(&named, &lines, batch_rows).await;
            named.close().await?;
            let added = result?;
            println!("added {added} record(s) to '{name}'");
            Ok(())
        }
        StoreCommand::Delete { name, ids } => {
            let named = registry
                .open_with(&name, &options, false, |c| c.with_manual_maintenance())
                .await?;
            let ids: Vec<&str> = ids.iter().map(String::as_str).collect();
            // Per key: whether a visible record was deleted (a tombstone
            // when the schema declares them).
            let result = named.delete(&ids).await.map(|done| {
                for (id, deleted) in ids.iter().zip(done) {
                    println!(
                        "{id}: {}",
                        if deleted {
                            "deleted"
                        } else {
                            "no visible record"
                        }
                    );
                }
            });
            named.close().await?;
            Ok(result?)
        }
        StoreCommand::Status { name } => {
            let named = registry.open_with(&name, &options, true, |c| c).await?;
            crate::print_status(&named.stats().await?, named.count(None).await?)
        }
        StoreCommand::Merge { name } => {
            let named = registry
                .open_with(&name, &options, false, |c| c.with_manual_maintenance())
                .await?;
            let stats = named.merge().await;
            named.close().await?;
            crate::print_merge(&stats?);
            Ok(())
        }
        StoreCommand::Compact { name } => {
            // Compaction commits to the base table only: no writer is claimed,
            // so a running service keeps writing.
            let named = registry.open_with(&name, &options, true, |c| c).await?;
            crate::print_compaction(&named.compact().await?);
            Ok(())
        }
        StoreCommand::Get { name, ids } => {
            let named = registry.open_with(&name, &options, true, |c| c).await?;
            let ids: Vec<&str> = ids.iter().map(String::as_str).collect();
            let projection = lance_context_host::default_projection(&named.entry().spec);
            let found = named.lookup(&ids, Some(&projection)).await?;
            crate::print_found(&found, &named.entry().spec.key, &ids)
        }
        StoreCommand::Scan { name, scan } => {
            let named = registry.open_with(&name, &options, true, |c| c).await?;
            let request = scan.request(Some(lance_context_host::default_projection(
                &named.entry().spec,
            )))?;
            print_json_lines(&named.scan(request).await?)
        }
        StoreCommand::Query { name, query, args } => {
            let named = registry.open_with(&name, &options, true, |c| c).await?;
            let Some(query) = query else {
                for q in &named.entry().spec.queries {
                    println!(
                        "{:<16} {:<28} {}{}",
                        q.name,
                        q.params
                            .iter()
                            .map(|p| format!("--arg {p}=…"))
                            .collect::<Vec<_>>()
                            .join(" "),
                        q.description,
                        if q.reduce { " (JSON)" } else { "" }
                    );
                }
                return Ok(());
            };
            let reduces = named
                .spec()
                .queries
                .iter()
                .any(|q| q.name == query && q.reduce);
            if reduces {
                println!("{}", named.reduce(&query, &args).await?.get());
                return Ok(());
            }
            print_json_lines(&named.query(&query, &args).await?)
        }
    }
}

/// Add `lines` in batches of `batch_rows`; the number added. A refused batch
/// stops the run: its problems are printed by line, earlier batches stay.
async fn add_in_batches(
    named: &lance_context_host::NamedStore,
    lines: &[(usize, &str)],
    batch_rows: usize,
) -> Result<usize> {
    let mut added = 0;
    for chunk in lines.chunks(batch_rows) {
        let joined: Vec<&str> = chunk.iter().map(|(_, l)| *l).collect();
        let first = chunk[0].0;
        // The typed error stays the source (exit codes), with where it stopped.
        let stop = |e: lance_context_host::PipelineError, what: String| {
            anyhow::Error::new(e).context(if added == 0 {
                format!("{what}nothing was added")
            } else {
                format!(
                    "{what}{added} record(s) added before the batch starting at line {first}, none from it"
                )
            })
        };
        let batch = match lance_context_host::rows_from_json(
            named.plugin(),
            joined.join("\n").as_bytes(),
        ) {
            Ok(batch) => batch,
            Err(e) => {
                let at = match &e {
                    lance_context_host::PipelineError::InvalidInput { row: Some(row), .. } => {
                        format!("at line {}: ", chunk[*row].0)
                    }
                    _ => String::new(),
                };
                return Err(stop(e, at));
            }
        };
        match named.add(&batch).await {
            Ok(_) => added += batch.num_rows(),
            Err(lance_context_host::PipelineError::Plugin(e)) if e.row_errors().is_some() => {
                let rows = e.row_errors().unwrap_or_default();
                for r in rows {
                    let line = chunk.get(r.row as usize).map_or(0, |(n, _)| *n);
                    match &r.column {
                        Some(c) => eprintln!(
                            "rejected: line {line}, column '{c}': {} ({})",
                            r.message, r.code
                        ),
                        None => eprintln!("rejected: line {line}: {} ({})", r.message, r.code),
                    }
                }
                let what = format!("{} record(s) rejected; ", rows.len());
                return Err(stop(lance_context_host::PipelineError::Plugin(e), what));
            }
            Err(e) => return Err(stop(e, String::new())),
        }
        if lines.len() > batch_rows {
            eprintln!("added {added}/{} record(s)", lines.len());
        }
    }
    Ok(added)
}
