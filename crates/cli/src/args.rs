//! Argument types shared by several commands.

use std::collections::HashMap;

use anyhow::{Result, bail};
use clap::Args;
use lance_context_store::{ScanRequest, SortKey, StoreConfig};

/// A `--storage-option key=value`. Values are credentials: `Debug` shows
/// the key only.
#[derive(Clone)]
pub struct StorageOption(pub String, pub String);

impl std::fmt::Debug for StorageOption {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}=<redacted>", self.0)
    }
}

/// A command-line argument that should be `key=value` and has no `=`.
#[derive(Debug, thiserror::Error)]
#[error("expected key=value, got '{0}'")]
pub struct NotKeyValue(String);

pub fn parse_storage_option(s: &str) -> Result<StorageOption, NotKeyValue> {
    parse_kv(s).map(|(k, v)| StorageOption(k, v))
}

pub fn parse_kv(s: &str) -> Result<(String, String), NotKeyValue> {
    s.split_once('=')
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .ok_or_else(|| NotKeyValue(s.to_string()))
}

/// The options as the engine takes them.
pub fn options_map(options: &[StorageOption]) -> HashMap<String, String> {
    options.iter().map(|o| (o.0.clone(), o.1.clone())).collect()
}

/// What to read: filter, columns, order, limit, offset.
#[derive(Args, Debug, Default, Clone)]
pub struct ScanArgs {
    /// SQL predicate, e.g. `reward > 0.5 AND role = 'tool'`.
    #[arg(long)]
    pub filter: Option<String>,
    /// Comma-separated columns (default: all but blob columns).
    #[arg(long, value_delimiter = ',')]
    pub columns: Option<Vec<String>>,
    /// `column` or `column:desc`; repeatable.
    #[arg(long = "order-by")]
    pub order_by: Vec<String>,
    /// At most this many rows.
    #[arg(long)]
    pub limit: Option<usize>,
    /// Skip this many rows first.
    #[arg(long)]
    pub offset: Option<usize>,
}

impl ScanArgs {
    /// The request; `default_columns` when no `--columns` was given.
    pub fn request(self, default_columns: Option<Vec<String>>) -> Result<ScanRequest> {
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

/// `--as-of VERSION`: read the base table as it was at a dataset version.
#[derive(Args, Debug, Default, Clone, Copy)]
pub struct AsOf {
    /// Time travel: read the base table as it was at this dataset version
    /// (`store versions` lists them). Rows still in the write-ahead tier at
    /// that moment are not part of a version.
    #[arg(long = "as-of", value_name = "VERSION")]
    pub as_of: Option<u64>,
}

impl AsOf {
    /// `config`, pinned to the version when one was given.
    pub fn apply(self, config: StoreConfig) -> StoreConfig {
        match self.as_of {
            Some(v) => config.with_as_of(v),
            None => config,
        }
    }
}

/// A dataset by URI (the engine-level commands, for datasets without a
/// registry entry).
#[derive(Args, Debug)]
pub struct DatasetArgs {
    /// Dataset URI (local path or s3://…).
    #[arg(long)]
    pub uri: String,
    /// Key column.
    #[arg(long, default_value = "id")]
    pub key: String,
    /// Storage option `key=value`; repeatable.
    #[arg(long = "storage-option", value_parser = parse_storage_option)]
    pub storage_options: Vec<StorageOption>,
}

impl DatasetArgs {
    pub fn config(&self) -> StoreConfig {
        StoreConfig::new(&self.uri)
            .with_key_column(&self.key)
            .with_storage_options(options_map(&self.storage_options))
    }
}

pub fn parse_sort(s: &str) -> Result<SortKey> {
    match s.split_once(':') {
        None => Ok(SortKey::asc(s)),
        Some((c, "asc")) => Ok(SortKey::asc(c)),
        Some((c, "desc")) => Ok(SortKey::desc(c)),
        Some((_, other)) => Err(usage(format!(
            "order-by direction must be asc or desc, got '{other}'"
        ))),
    }
}

/// An argument the user got wrong: invalid input (exit code 2).
pub fn usage(message: impl Into<String>) -> anyhow::Error {
    lance_context_store::Error::InvalidArgument {
        message: message.into(),
    }
    .into()
}

/// Fail with invalid input unless `ok`.
pub fn ensure_usage(ok: bool, message: impl FnOnce() -> String) -> Result<()> {
    if !ok {
        bail!(usage(message()));
    }
    Ok(())
}
