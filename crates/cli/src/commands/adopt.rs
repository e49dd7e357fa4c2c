//! `lance-context store adopt`: register an existing dataset (one the
//! previous implementation wrote, or plain Lance) as a store.

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::Parser;
use lance_context_client::{AdoptStore, ClientError, StoreApi};
use lance_context_host::AdoptReport;

use super::through::{Via, failed};

use crate::args::parse_kv;
use crate::output::Out;

#[derive(Parser, Debug)]
pub struct AdoptCommand {
    /// The name the store gets.
    pub name: String,
    /// The existing dataset (a local path or s3://…).
    #[arg(long)]
    pub uri: String,
    /// The schema: a built-in (rollout, context, datagen) or a .wasm plugin.
    /// Default: inferred from the dataset (the previous GenericStore's
    /// recorded declaration, or the columns of a built-in schema).
    #[arg(long, conflicts_with = "spec")]
    pub plugin: Option<String>,
    /// A SchemaSpec JSON file — or the previous GenericStore's schema
    /// mapping, as it is.
    #[arg(long)]
    pub spec: Option<PathBuf>,
    /// Creation parameter `name=json` for the plugin; repeatable (default
    /// for the context plugin: the dataset's embedding width, metric and
    /// blob columns).
    #[arg(long = "param", value_parser = parse_kv)]
    pub params: Vec<(String, String)>,
    /// Report what adoption would find (every column compared, the shards
    /// and their unmerged generations, the rows) without registering,
    /// replaying or writing anything.
    #[arg(long)]
    pub dry_run: bool,
}

impl AdoptCommand {
    /// The schema source given, if any.
    /// The adoption as the store API takes it (a plugin file's bytes
    /// base64, a spec file's JSON, each parameter as JSON when it parses,
    /// else a string).
    fn request(&self) -> Result<AdoptStore> {
        let mut request = AdoptStore::new(&self.uri);
        match (&self.plugin, &self.spec) {
            (_, Some(file)) => {
                let text = std::fs::read_to_string(file)
                    .with_context(|| format!("reading {}", file.display()))?;
                request.spec = Some(
                    serde_json::from_str(&text)
                        .with_context(|| format!("{} is not JSON", file.display()))?,
                );
            }
            (Some(p), None) if p.ends_with(".wasm") || p.contains('/') => {
                use base64::Engine as _;
                let bytes = std::fs::read(p).with_context(|| format!("reading {p}"))?;
                request.plugin_wasm_base64 =
                    Some(base64::engine::general_purpose::STANDARD.encode(bytes));
                request.plugin_file_name = Some(super::store::file_label(p));
            }
            (Some(p), None) => request.plugin = Some(p.clone()),
            (None, None) => {}
        }
        for (k, v) in &self.params {
            let value = serde_json::from_str(v).unwrap_or(serde_json::Value::String(v.clone()));
            request.params.insert(k.clone(), value);
        }
        request.dry_run = self.dry_run;
        Ok(request)
    }

    /// Adopt through the store API: the report printed, also when the
    /// dataset does not fit (then the command fails after it).
    pub async fn run<A: StoreApi>(self, api: &A, via: Via, out: Out) -> Result<()> {
        let request = self.request()?;
        match api.adopt(&self.name, &request).await {
            Ok(report) => {
                let report: AdoptReport = serde_json::from_value(serde_json::to_value(&report)?)?;
                print(&report, &out)
            }
            Err(e) => {
                // A refusal carries its report: shown before the error.
                let report = match &e {
                    ClientError::Api { error, .. } => error
                        .details
                        .get("adopt_report")
                        .and_then(|r| serde_json::from_value::<AdoptReport>(r.clone()).ok()),
                    _ => None,
                };
                if let Some(report) = report {
                    print(&report, &out)?;
                }
                Err(failed(e, via))
            }
        }
    }
}

fn print(report: &AdoptReport, out: &Out) -> Result<()> {
    if out.json {
        println!("{}", serde_json::to_string(report)?);
        return Ok(());
    }
    let source = match &report.inferred_from {
        Some(why) => format!("{} (inferred from {why})", report.plugin),
        None => report.plugin.clone(),
    };
    println!(
        "dataset {} as store '{}': {source}",
        report.uri, report.store
    );
    if !report.params.is_empty() {
        let params: Vec<String> = report
            .params
            .iter()
            .filter(|(k, _)| k != "spec")
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        if !params.is_empty() {
            println!("parameters: {}", params.join(" "));
        }
    }
    let mut table = comfy_table::Table::new();
    table.load_preset(comfy_table::presets::UTF8_FULL_CONDENSED);
    table.set_header(["column", "dataset", "plugin", "verdict", "note"]);
    for c in &report.columns {
        // Column names and types come from the dataset: shown escaped.
        let shown = |s: &str| crate::exit::printable(s);
        table.add_row([
            shown(&c.column),
            c.dataset
                .as_deref()
                .map(shown)
                .unwrap_or_else(|| "-".into()),
            c.plugin.as_deref().map(shown).unwrap_or_else(|| "-".into()),
            serde_json::to_value(c.verdict)
                .ok()
                .and_then(|v| v.as_str().map(str::to_string))
                .unwrap_or_default(),
            if c.verdict == lance_context_host::ColumnVerdict::Same {
                String::new()
            } else {
                shown(&c.note)
            },
        ]);
    }
    println!("{table}");
    if !report.duplicate_keys.is_empty() {
        let keys: Vec<String> = report
            .duplicate_keys
            .iter()
            .map(|k| format!("'{}'", crate::exit::printable(k)))
            .collect();
        println!(
            "keys held more than once in the base table: {}",
            keys.join(", ")
        );
    } else if !report.duplicates_checked {
        println!("repeated keys: not checked (over 50,000,000 rows)");
    }
    if !report.compatible {
        println!("not compatible: nothing was registered");
        return Ok(());
    }
    for s in &report.shards {
        println!(
            "shard {}: {} unmerged generation(s)",
            s.shard, s.unmerged_generations
        );
    }
    match report.rows_after {
        Some(after) => println!(
            "rows: {} readable before, {after} after (WAL entries replayed); {} generation(s) merged into the base table; {} supersession link(s) written",
            report.rows_before, report.generations_merged, report.supersession_links
        ),
        None => println!(
            "rows readable now: {} (rows only in the WAL appear after adoption); supersession links to write: {}",
            report.rows_before, report.supersession_links
        ),
    }
    if report.registered {
        println!("registered store '{}'", report.store);
    } else {
        println!("dry run: nothing registered, replayed or written");
    }
    Ok(())
}
