//! Engine-level commands on a dataset by URI (no registry entry, no plugin):
//! for datasets written by the engine directly, the demo's, or another tool's.
//! Reads open read-only; `merge` claims the named instance's writer.

use std::time::Instant;

use anyhow::Result;
use clap::{Parser, Subcommand};
use lance_context_store::Store;

use super::report;
use crate::args::{AsOf, DatasetArgs, ScanArgs};
use crate::output::Out;

/// The dataset commands (each a top-level subcommand).
#[derive(Subcommand, Debug)]
pub enum DatasetCommand {
    /// Count rows (newest version per key) of a dataset by URI.
    Count(CountCommand),
    /// Print rows of a dataset by key.
    Get(GetCommand),
    /// Print rows of a dataset.
    Scan(ScanCommand),
    /// Operator statistics: rows, fragments, pending generations, indexes.
    Status(StatusCommand),
    /// Merge an instance's unmerged generations into the base table. Claims
    /// that instance's writer (a running writer of the same instance is fenced).
    Merge(MergeCommand),
    /// Compact the base table's fragments and re-ensure its indexes. Needs
    /// no writer: a running writer is not disturbed.
    Compact(CompactCommand),
}

#[derive(Parser, Debug)]
pub struct CountCommand {
    #[command(flatten)]
    store: DatasetArgs,
    /// SQL predicate.
    #[arg(long)]
    filter: Option<String>,
    #[command(flatten)]
    as_of: AsOf,
}

#[derive(Parser, Debug)]
pub struct GetCommand {
    #[command(flatten)]
    store: DatasetArgs,
    /// Keys to look up.
    #[arg(required = true)]
    ids: Vec<String>,
    #[command(flatten)]
    as_of: AsOf,
}

#[derive(Parser, Debug)]
pub struct ScanCommand {
    #[command(flatten)]
    store: DatasetArgs,
    #[command(flatten)]
    scan: ScanArgs,
    /// Print the scan plan instead of rows.
    #[arg(long)]
    explain: bool,
    #[command(flatten)]
    as_of: AsOf,
}

#[derive(Parser, Debug)]
pub struct StatusCommand {
    #[command(flatten)]
    store: DatasetArgs,
}

#[derive(Parser, Debug)]
pub struct MergeCommand {
    #[command(flatten)]
    store: DatasetArgs,
    /// The instance whose shard to merge.
    #[arg(long, default_value = "default")]
    instance: String,
}

#[derive(Parser, Debug)]
pub struct CompactCommand {
    #[command(flatten)]
    store: DatasetArgs,
}

impl DatasetCommand {
    pub async fn execute(self, out: Out) -> Result<()> {
        match self {
            Self::Count(c) => {
                let store = Store::open_read_only(c.as_of.apply(c.store.config())).await?;
                let count = store.count(c.filter.as_deref()).await?;
                out.item(&serde_json::json!({ "count": count }), || count.to_string())
            }
            Self::Get(c) => {
                let store = Store::open_read_only(c.as_of.apply(c.store.config())).await?;
                let ids: Vec<&str> = c.ids.iter().map(String::as_str).collect();
                report::found(&out, &store.get_many(&ids).await?, store.key_column(), &ids)
            }
            Self::Scan(c) => {
                let store = Store::open_read_only(c.as_of.apply(c.store.config())).await?;
                let request = c.scan.request(None)?;
                if c.explain {
                    println!("{}", store.explain(request).await?);
                    return Ok(());
                }
                out.rows(&store.scan(request).await?)
            }
            Self::Status(c) => {
                let store = Store::open_read_only(c.store.config()).await?;
                report::status(&out, &store.stats().await?, store.count(None).await?)
            }
            Self::Merge(c) => {
                let config = c
                    .store
                    .config()
                    .with_instance_id(&c.instance)
                    .with_manual_maintenance();
                let store = Store::open(config).await?;
                let bar = out.spinner("merging");
                let t = Instant::now();
                let stats = store.merge().await;
                bar.finish_and_clear();
                // Claiming the instance took every other shard's unmerged
                // generations over and merged them: counted too.
                let taken = store.taken_over();
                store.close().await?;
                let mut stats = stats?;
                stats.absorb(&taken);
                report::merge(&out, &stats, t.elapsed().as_secs_f64())
            }
            Self::Compact(c) => {
                let store = Store::open_read_only(c.store.config()).await?;
                let bar = out.spinner("compacting");
                let t = Instant::now();
                let stats = store.compact().await;
                bar.finish_and_clear();
                report::compaction(&out, &stats?, t.elapsed().as_secs_f64())
            }
        }
    }
}
