//! Store commands carried by the store API
//! ([`lance_context_client::StoreApi`]): one code path, run against the
//! embedded implementation (the data root, opened per call: a read claims
//! no writer) or, with `--server`, against the server's client.

use std::path::PathBuf;

use anyhow::Result;
use clap::Args;
use lance_context_client::{
    ClientError, CompactionReport, CreateStore, Deleted, MergeReport, StoreApi, StoreInfo,
    StoreStatus, UpgradeStore,
};
use serde_json::Value;

use crate::args::{ensure_usage, usage};
use crate::exit::Refused;
use crate::output::Out;

/// Where the store API runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Via {
    /// In this process, over the data root.
    Local,
    /// A server's client (`--server`).
    Server,
}

/// A store API error as this CLI's error: its kind from the API's code
/// (`ErrorKind::as_str` names both ways), its details kept.
pub fn failed(e: ClientError, via: Via) -> anyhow::Error {
    use lance_context_host::ErrorKind;
    // The server's codes are the kinds' names, plus a few of its own.
    let kind = match e.code() {
        Some("deadline") => ErrorKind::Busy,
        Some(
            "unauthorized" | "forbidden" | "payload_too_large" | "method_not_allowed"
            | "uri_too_long" | "headers_too_large",
        ) => ErrorKind::InvalidInput,
        Some(code) => ErrorKind::from_code(code).unwrap_or(ErrorKind::Internal),
        None => ErrorKind::Internal,
    };
    let (message, details) = match (&e, via) {
        (ClientError::Api { error, .. }, Via::Local) => {
            (error.message.clone(), error.details.clone())
        }
        (ClientError::Api { error, .. }, Via::Server) => {
            (format!("the server: {e}"), error.details.clone())
        }
        (_, _) => (format!("the server: {e}"), Value::Null),
    };
    Refused {
        kind,
        message,
        details,
    }
    .into()
}

/// `store upsert`: insert records, or supersede the current version with
/// the same secondary key.
#[derive(Args, Debug)]
pub struct UpsertCommand {
    pub name: String,
    /// JSON Lines of records (default: stdin).
    pub file: Option<PathBuf>,
    /// Say what would happen (insert, or which version each record
    /// supersedes), writing nothing.
    #[arg(long)]
    pub dry_run: bool,
}

impl UpsertCommand {
    pub async fn run<A: StoreApi>(self, api: &A, via: Via, out: Out) -> Result<()> {
        let text = match &self.file {
            Some(path) => std::fs::read_to_string(path)
                .map_err(|e| usage(format!("reading {}: {e}", path.display())))?,
            None => std::io::read_to_string(std::io::stdin())?,
        };
        let mut records = Vec::new();
        for (i, line) in text.lines().enumerate() {
            if line.trim().is_empty() {
                continue;
            }
            let record: Value = serde_json::from_str(line)
                .map_err(|e| usage(format!("line {}: not JSON: {e}", i + 1)))?;
            ensure_usage(record.is_object(), || {
                format!("line {}: a record is a JSON object", i + 1)
            })?;
            records.push(record);
        }
        ensure_usage(!records.is_empty(), || "no records in the input".into())?;
        let result = api
            .upsert_records(&self.name, &records, self.dry_run)
            .await
            .map_err(|e| failed(e, via))?;
        let verb = match result.dry_run {
            true => "would",
            false => "did",
        };
        out.list(
            &result.outcomes,
            &["id", "outcome"],
            |o| {
                vec![
                    o.id.clone(),
                    match &o.replaced_id {
                        Some(old) => format!("{verb} supersede {old}"),
                        None => format!("{verb} insert"),
                    },
                ]
            },
            "",
        )
    }
}

/// `store patch`: a new version of a record with some fields changed.
#[derive(Args, Debug)]
pub struct PatchCommand {
    pub name: String,
    /// The record's key.
    pub key: String,
    /// The fields to change, as one JSON object (e.g. '{"text_payload": "revised"}').
    #[arg(long = "set", value_name = "JSON")]
    pub fields: String,
}

impl PatchCommand {
    pub async fn run<A: StoreApi>(self, api: &A, via: Via, out: Out) -> Result<()> {
        let fields: Value = serde_json::from_str(&self.fields)
            .map_err(|e| usage(format!("--set: not JSON: {e}")))?;
        ensure_usage(fields.is_object(), || {
            "--set: give a JSON object of the fields to change".into()
        })?;
        let patched = api
            .patch(&self.name, &self.key, &fields)
            .await
            .map_err(|e| failed(e, via))?;
        out.item(&patched, || {
            format!(
                "{} is the new version of {}",
                patched.id, patched.supersedes
            )
        })
    }
}

/// `store create`: a store from a built-in plugin, a component or a spec;
/// the probe's warnings about its plugin (for the plugin's author) on
/// stderr.
pub async fn create<A: StoreApi>(api: &A, via: Via, create: CreateStore, out: Out) -> Result<()> {
    let info = api
        .create_store(&create)
        .await
        .map_err(|e| failed(e, via))?;
    if !out.json_errors {
        for w in &info.probe_warnings {
            eprintln!("warning: {}", crate::exit::printable(w));
        }
    }
    let columns = info.spec["columns"].as_array().map_or(0, Vec::len);
    let created = serde_json::json!({
        "store": info.name,
        "uri": info.uri,
        "columns": columns,
        "plugin": info.plugin.name,
        "plugin_version": info.plugin.version,
        "sha256": info.plugin.sha256,
    });
    out.item(&created, || {
        format!(
            "created store '{}' at {} ({columns} columns, plugin {} {} sha256 {}){}",
            info.name,
            info.uri,
            info.plugin.name,
            info.plugin.version,
            &info.plugin.sha256[..12.min(info.plugin.sha256.len())],
            through_the(via)
        )
    })
}

/// " through the server" when it is.
fn through_the(via: Via) -> &'static str {
    match via {
        Via::Local => "",
        Via::Server => " through the server",
    }
}

/// `store upgrade`: the store's new plugin pinned; the probe's warnings
/// about it on stderr.
pub async fn upgrade<A: StoreApi>(
    api: &A,
    via: Via,
    name: &str,
    request: &UpgradeStore,
    out: Out,
) -> Result<()> {
    let report = api
        .upgrade(name, request)
        .await
        .map_err(|e| failed(e, via))?;
    if !out.json_errors {
        for w in &report.probe_warnings {
            eprintln!("warning: {}", crate::exit::printable(w));
        }
    }
    let sha = |s: &str| s[..12.min(s.len())].to_string();
    out.item(&report, || {
        format!(
            "store '{}' now pins {} {} (sha256 {}), was {} {} (sha256 {}); the schema is unchanged{}{}",
            report.store,
            report.to.plugin,
            report.to.version,
            sha(&report.to.sha256),
            report.from.plugin,
            report.from.version,
            sha(&report.from.sha256),
            match report.removed_plugin_file {
                true => "; removed the old plugin file (no store pins it)",
                false => "",
            },
            through_the(via)
        )
    })
}

/// `store drop`: only with `yes` (else a usage error saying what it would
/// delete).
pub async fn drop<A: StoreApi>(api: &A, via: Via, name: &str, yes: bool, out: Out) -> Result<()> {
    if !yes {
        let info = api.describe_store(name).await.map_err(|e| failed(e, via))?;
        let place = match via {
            Via::Local => "",
            Via::Server => " on the server",
        };
        return Err(usage(match info.adopted && info.state != "ready" {
            true => format!(
                "dropping '{name}' removes its registry entry{place} (an adoption that did not finish: {} is kept); pass --yes to do it",
                info.uri
            ),
            false => format!(
                "dropping '{name}' deletes {} and its registry entry{place}; pass --yes to do it",
                info.uri
            ),
        }));
    }
    let dropped = api.drop_store(name).await.map_err(|e| failed(e, via))?;
    out.item(&dropped, || {
        format!(
            "dropped store '{}'{}\n{}  {}\n{}",
            dropped.store,
            through_the(via),
            match dropped.data_deleted {
                true => "removed data:",
                false => "kept data:   ",
            },
            dropped.uri,
            match dropped.plugin_file_removed {
                true => "removed its plugin file (no other store pins it)",
                false => "no plugin file removed (a built-in, a spec, or pinned by another store)",
            }
        )
    })
}

/// `store delete`: the keys deleted in as few writes as the implementation
/// takes (10,000 keys each through a server); a row per key ([`Deleted`]).
/// A failure says which keys were deleted before it.
pub async fn delete<A: StoreApi>(
    api: &A,
    via: Via,
    name: &str,
    keys: &[String],
    out: Out,
) -> Result<()> {
    let mut deleted: Vec<Deleted> = Vec::with_capacity(keys.len());
    for chunk in keys.chunks(api.page_limit().max(1)) {
        let chunk: Vec<&str> = chunk.iter().map(String::as_str).collect();
        match api.delete_many(name, &chunk).await {
            Ok(done) => deleted.extend(done),
            Err(e) if deleted.iter().any(|d| d.deleted) => {
                const SHOWN: usize = 20;
                let done: Vec<&str> = deleted
                    .iter()
                    .filter(|d| d.deleted)
                    .map(|d| d.key.as_str())
                    .collect();
                let more = match done.len() > SHOWN {
                    true => format!(" and {} more", done.len() - SHOWN),
                    false => String::new(),
                };
                return Err(failed(e, via).context(format!(
                    "deleting '{}' and the keys after it (deleted before: {}{more})",
                    chunk[0],
                    done[..done.len().min(SHOWN)].join(", ")
                )));
            }
            Err(e) => return Err(failed(e, via)),
        }
    }
    print_deleted(&out, &deleted)
}

/// `store status`.
pub async fn status<A: StoreApi>(api: &A, via: Via, name: &str, out: Out) -> Result<()> {
    let status = api.stats(name).await.map_err(|e| failed(e, via))?;
    print_status(&out, &status)
}

/// `store merge`.
pub async fn merge<A: StoreApi>(api: &A, via: Via, name: &str, out: Out) -> Result<()> {
    let bar = out.spinner(&format!("merging {name}"));
    let merged = api.merge(name).await;
    bar.finish_and_clear();
    print_merge(&out, &merged.map_err(|e| failed(e, via))?)
}

/// `store compact`: compaction commits to the base table only (no writer
/// is claimed where the data root is: a running service keeps writing).
pub async fn compact<A: StoreApi>(api: &A, via: Via, name: &str, out: Out) -> Result<()> {
    let bar = out.spinner(&format!("compacting {name}"));
    let compacted = api.compact(name).await;
    bar.finish_and_clear();
    print_compaction(&out, &compacted.map_err(|e| failed(e, via))?)
}

/// `store index`: the vector index of one column, or of every declared
/// one (commits to the base table only: no writer is claimed).
pub async fn index<A: StoreApi>(
    api: &A,
    via: Via,
    name: &str,
    column: Option<&str>,
    out: Out,
) -> Result<()> {
    let bar = out.spinner(&format!("building the vector index of {name}"));
    let built = api.index(name, column).await;
    bar.finish_and_clear();
    let built = built.map_err(|e| failed(e, via))?;
    for i in built.indexes.iter().filter(|i| !i.covers_all_rows) {
        if out.json_errors {
            break;
        }
        match i.unindexed_fragments >= i.fragments {
            true => eprintln!(
                "warning: the index on {} covers no rows yet: the base table's {} row(s) \
                 are too few to train it; searches stay exact (brute force) and the merge \
                 that brings enough rows trains it",
                i.column, i.rows_in_base
            ),
            false => eprintln!(
                "warning: the index on {} does not cover {} fragment(s) (written \
                 meanwhile); their rows are searched exactly until the next merge extends it",
                i.column, i.unindexed_fragments
            ),
        }
    }
    out.list(
        &built.indexes,
        &["column", "seconds", "covers_all_rows"],
        |i| {
            vec![
                i.column.clone(),
                format!("{:.2}", i.seconds),
                i.covers_all_rows.to_string(),
            ]
        },
        "",
    )
}

/// `store describe`: the registry entry ([`StoreInfo`]).
pub async fn describe<A: StoreApi>(api: &A, via: Via, name: &str, out: Out) -> Result<()> {
    let info = api.describe_store(name).await.map_err(|e| failed(e, via))?;
    out.item(&info, || {
        serde_json::to_string_pretty(&info).unwrap_or_default()
    })
}

/// `store list`.
pub async fn list<A: StoreApi>(api: &A, via: Via, empty: &str, out: Out) -> Result<()> {
    let stores = api.list_stores().await.map_err(|e| failed(e, via))?;
    let listed: Vec<Value> = stores.iter().map(listed).collect();
    out.list(
        &listed,
        &["name", "state", "plugin", "version", "uri"],
        |e| {
            ["name", "state", "plugin", "plugin_version", "uri"]
                .iter()
                .map(|k| e[*k].as_str().unwrap_or_default().to_string())
                .collect()
        },
        empty,
    )
}

/// A store as `store list` prints it.
fn listed(info: &StoreInfo) -> Value {
    serde_json::json!({
        "name": info.name,
        "state": info.state,
        "plugin": info.plugin.name,
        "plugin_version": info.plugin.version,
        "uri": info.uri,
    })
}

/// `store delete`: a row per key ([`Deleted`]).
pub fn print_deleted(out: &Out, deleted: &[Deleted]) -> Result<()> {
    out.list(
        deleted,
        &["key", "result"],
        |d| {
            vec![
                d.key.clone(),
                match d.deleted {
                    true => "deleted".to_string(),
                    false => "no visible record".to_string(),
                },
            ]
        },
        "",
    )
}

/// `store status`: one object ([`StoreStatus`]).
pub fn print_status(out: &Out, status: &StoreStatus) -> Result<()> {
    out.item(status, || {
        let mut s = format!(
            "rows (newest per key): {}\nrows in base table:    {}\ndataset version:       {} ({} kept)\n\
             fragments:             {} ({} below the compaction target)\n\
             unmerged:              {} row(s), {} byte(s)\nbytes on disk:         {}",
            status.rows,
            status.rows_in_base,
            status.version,
            status.versions,
            status.fragments,
            status.small_fragments,
            status.unmerged_rows,
            status.unmerged_bytes,
            status.bytes_on_disk
        );
        if status.buckets > 1 {
            let owned = match status.owned_buckets.as_slice() {
                [] => "none (reads only)".to_string(),
                list => list.iter().map(u32::to_string).collect::<Vec<_>>().join(","),
            };
            s.push_str(&format!(
                "\nbuckets:               {} (this instance writes {owned})",
                status.buckets
            ));
        }
        let bucket = |b: Option<u32>| b.map(|b| format!(" (bucket {b})")).unwrap_or_default();
        for p in &status.pending_generations {
            s.push_str(&format!(
                "\nshard {}{}: {} unmerged generation(s)",
                p.shard,
                bucket(p.bucket),
                p.generations
            ));
        }
        for i in &status.indexes {
            s.push_str(&format!(
                "\nindex {} ({}) on {}: {}, {} segment(s)",
                i.name,
                i.kind,
                i.columns.join(", "),
                if i.covers_all_rows {
                    "covers all rows".to_string()
                } else {
                    format!("{} fragment(s) not indexed yet", i.unindexed_fragments)
                },
                i.segments
            ));
        }
        for m in &status.shard_manifests {
            s.push_str(&format!(
                "\nshard {}{} manifest: version {} ({} byte(s), {} generation(s) listed); {} version(s) kept, {} byte(s)",
                m.shard, bucket(m.bucket), m.newest_version, m.newest_bytes, m.listed_generations, m.versions, m.bytes
            ));
        }
        match &status.maintenance_reason {
            Some(why) => s.push_str(&format!("\nmaintenance:           {} ({why})", status.maintenance)),
            None => s.push_str(&format!("\nmaintenance:           {}", status.maintenance)),
        }
        if let Some(e) = &status.last_background_error {
            s.push_str(&format!("\nlast background error: {e}"));
        }
        s
    })
}

/// A merge's time per phase, in seconds: `read 0.12, write 0.30, …`.
pub fn phases_text(p: &lance_context_client::MergePhaseSeconds) -> String {
    format!(
        "read {:.2}, write {:.2}, count {:.2}, cleanup {:.2}, indexes {:.2}, retention {:.2}",
        p.read, p.write, p.count, p.cleanup, p.indexes, p.retention
    )
}

/// `merge`: one object ([`MergeReport`]).
pub fn print_merge(out: &Out, m: &MergeReport) -> Result<()> {
    out.item(m, || {
        format!(
            "merged {} generation(s): {} row(s) upserted, {} key(s) deleted in {} pass(es) ({:.2} s: \
             {}); removed {} merged generation(s), {} WAL file(s), {} old version(s)",
            m.generations_merged,
            m.rows_upserted,
            m.keys_deleted,
            m.passes,
            m.seconds,
            phases_text(&m.phases),
            m.generations_removed,
            m.wal_files_removed,
            m.versions_removed
        )
    })
}

/// `compact`: one object ([`CompactionReport`]).
pub fn print_compaction(out: &Out, c: &CompactionReport) -> Result<()> {
    out.item(c, || {
        let mut line = format!(
            "compacted ({:.2} s): {} fragment(s) removed, {} added; {} file(s) removed, {} added; \
             {} index(es) remapped; {} old version(s) removed",
            c.seconds,
            c.fragments_removed,
            c.fragments_added,
            c.files_removed,
            c.files_added,
            c.indexes_remapped,
            c.versions_removed
        );
        if c.fragment_reuse_versions > 0 {
            line.push_str(&format!(
                "; {} fragment-reuse version(s) left: an index was not remapped, or \
                 another compaction ran meanwhile (reads stay right; the next \
                 compaction retries; LANCE_CONTEXT_LOG=lance=warn shows Lance's reasons)",
                c.fragment_reuse_versions
            ));
        }
        line
    })
}
