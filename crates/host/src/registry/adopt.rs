//! Adopting a dataset written elsewhere — by the previous implementation
//! (the `lance-context` 0.6.x Python package: `Context`, `RolloutStore`,
//! `DatagenStore`, `GenericStore`) or by plain Lance with a tagged key — as
//! a named store: [`Registry::adopt`].
//!
//! The dataset's schema is compared with the plugin's declaration column by
//! column ([`ColumnReport`]); only a compatible dataset is registered. Then
//! the store's writer opens on it: the single-writer takeover claims every
//! shard the old writers left (fencing a writer still running), replays the
//! WAL entries they never flushed, and merges their generations into the
//! base table — new fragments and deletion files; no existing data file is
//! rewritten. With the supersession capability, records the old store
//! superseded without a back-link get one ([`Store::link_superseded`]).

use std::collections::HashMap;

use arrow_schema::{DataType, Field, Schema, SchemaRef};
use lance_context_store::{Location, Store, StoreConfig};
use serde::{Deserialize, Serialize};

use super::{
    EntryState, PluginPin, RegistryError, Resolved, Result, SchemaSource, StoreEntry,
    resolve_source, store_config, write_atomic,
};
use crate::Registry;
use crate::plugin::PluginDeclaration;
use crate::spec::{PREVIOUS_SPEC_METADATA, PRIMARY_KEY_METADATA, SchemaSpec};

/// Most base-table rows checked for repeated keys (8 bytes each).
const MAX_ROWS_CHECKED: usize = 50_000_000;

/// How to adopt a dataset.
#[derive(Clone, Debug)]
pub struct AdoptOptions {
    /// The dataset's location.
    pub uri: String,
    /// The schema: `None` infers it (see [`Registry::adopt`]).
    pub source: Option<SchemaSource>,
    /// Creation parameters for the plugin's `describe`. For the context
    /// plugin, those not given are read from the dataset (its
    /// `embedding_dim`, `distance_metric`, `blob_columns`).
    pub params: Vec<(String, String)>,
    /// Object-store options; only their keys are recorded.
    pub storage_options: HashMap<String, String>,
    /// Report only: register nothing, replay and write nothing.
    pub dry_run: bool,
}

impl AdoptOptions {
    /// Adopt the dataset at `uri`, inferring its schema.
    pub fn new(uri: impl Into<String>) -> Self {
        Self {
            uri: uri.into(),
            source: None,
            params: Vec::new(),
            storage_options: HashMap::new(),
            dry_run: false,
        }
    }
}

/// What [`Registry::adopt`] found and did.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AdoptReport {
    /// The store name.
    pub store: String,
    /// The dataset's location.
    pub uri: String,
    /// The schema's source: `builtin:<name>`, `spec` or `file:<label>`.
    pub plugin: String,
    /// Why this schema, when it was inferred (else `None`: given).
    pub inferred_from: Option<String>,
    /// The plugin's creation parameters (given or inferred).
    pub params: Vec<(String, String)>,
    /// Every column of either side, dataset order first.
    pub columns: Vec<ColumnReport>,
    /// Keys the base table holds more than once (at most 10; a dataset
    /// written by plain Lance may have them): a conflict.
    pub duplicate_keys: Vec<String>,
    /// Whether the base table was checked for repeated keys (not above
    /// 50,000,000 rows).
    pub duplicates_checked: bool,
    /// No column conflicts and no repeated key.
    pub compatible: bool,
    /// The dataset's MemWAL shards (the old writers') and their unmerged
    /// generations, before adoption.
    pub shards: Vec<ShardReport>,
    /// Rows a read shows before adoption (WAL entries never flushed are not
    /// among them).
    pub rows_before: u64,
    /// Rows a read shows after adoption (every row the old system
    /// acknowledged); `None` on a dry run.
    pub rows_after: Option<u64>,
    /// Generations of the old shards merged into the base table (after
    /// their WAL tails were replayed).
    pub generations_merged: u64,
    /// Superseded records that lacked their back-link (`superseded_by_id`):
    /// linked, or to be linked on a dry run.
    pub supersession_links: usize,
    /// The store was registered.
    pub registered: bool,
    /// A dry run (nothing registered, replayed or written).
    pub dry_run: bool,
}

impl AdoptReport {
    /// The conflicts, one line each: every column, then repeated keys.
    pub fn conflicts(&self) -> Vec<String> {
        let mut out: Vec<String> = self
            .columns
            .iter()
            .filter(|c| !c.verdict.compatible())
            .map(|c| format!("{}: {}", c.column, c.note))
            .collect();
        if !self.duplicate_keys.is_empty() {
            out.push(format!(
                "the base table holds keys more than once (e.g. {}): a keyed store reads each key once",
                self.duplicate_keys
                    .iter()
                    .map(|k| format!("'{k}'"))
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
        }
        out
    }
}

/// One column of an adoption's comparison.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ColumnReport {
    /// The column.
    pub column: String,
    /// Its type in the dataset (`None`: the dataset lacks it), with ` not
    /// null` when not nullable.
    pub dataset: Option<String>,
    /// Its type in the plugin's declaration (`None`: not declared).
    pub plugin: Option<String>,
    /// The verdict.
    pub verdict: ColumnVerdict,
    /// What it means, in a sentence.
    pub note: String,
}

/// How a column of the dataset and of the declaration compare.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ColumnVerdict {
    /// The same type and nullability.
    Same,
    /// Declared, nullable, not in the dataset: reads as null, and only
    /// nulls may be written to it.
    MissingNullable,
    /// In the dataset, not declared (a conflict: a record this store
    /// rewrites — a new version, a back-link — would lose its value).
    Undeclared,
    /// Declared non-nullable, not in the dataset (a conflict).
    MissingRequired,
    /// Different types (a conflict).
    TypeConflict,
    /// Different nullability (a conflict).
    NullabilityConflict,
    /// The key column is not tagged as Lance's primary key, which the MemWAL
    /// merges on (a conflict).
    KeyNotTagged,
    /// Another column is tagged as Lance's primary key (a conflict: Lance
    /// would merge on both).
    ExtraKeyTag,
    /// Stored with Lance's blob encoding (`lance-encoding:blob`), which this
    /// host does not read (a conflict).
    BlobEncoding,
}

impl ColumnVerdict {
    /// Whether the column lets the dataset be adopted.
    pub fn compatible(self) -> bool {
        matches!(self, Self::Same | Self::MissingNullable)
    }
}

/// A MemWAL shard found in the dataset.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShardReport {
    /// The shard id.
    pub shard: String,
    /// Its generations not merged into the base table.
    pub unmerged_generations: usize,
}

/// A built-in schema recognised by the columns only it has.
fn infer_builtin(stored: &Schema) -> Option<(&'static str, String)> {
    let has = |c: &str| stored.field_with_name(c).is_ok();
    if has("event_id") && has("item_seq") && has("checkpoint_id") {
        return Some((
            "datagen",
            "its columns (event_id, item_seq, checkpoint_id): the previous DatagenStore".into(),
        ));
    }
    if has("rollout_id") && has("sequence_order") {
        return Some((
            "rollout",
            "its columns (rollout_id, sequence_order): the previous RolloutStore".into(),
        ));
    }
    if has("lifecycle_status") && has("supersedes_id") && has("run_id") {
        return Some((
            "context",
            "its columns (lifecycle_status, supersedes_id, run_id): the previous Context".into(),
        ));
    }
    None
}

/// The context schema's parameters a dataset of the previous `Context` was
/// created with: its embedding width, metric (schema metadata
/// `lance-context:distance_metric`) and blob columns (field metadata
/// `lance-context:blob`), where they differ from the defaults.
fn infer_context_params(stored: &Schema) -> Vec<(String, String)> {
    let mut params = Vec::new();
    if let Ok(field) = stored.field_with_name("embedding")
        && let DataType::FixedSizeList(_, dim) = field.data_type()
        && *dim != 1536
    {
        params.push(("embedding_dim".to_string(), dim.to_string()));
    }
    if let Some(metric) = stored.metadata().get("lance-context:distance_metric")
        && metric != "l2"
    {
        params.push((
            "distance_metric".to_string(),
            serde_json::Value::String(metric.clone()).to_string(),
        ));
    }
    let blobs: Vec<&str> = ["text_payload", "binary_payload"]
        .into_iter()
        .filter(|c| {
            stored.field_with_name(c).is_ok_and(|f| {
                f.metadata()
                    .get(crate::spec::BLOB_FIELD_METADATA)
                    .map(String::as_str)
                    == Some("true")
            })
        })
        .collect();
    if !blobs.is_empty() {
        params.push((
            "blob_columns".to_string(),
            serde_json::to_string(&blobs).unwrap_or_default(),
        ));
    }
    params
}

fn shown(field: &Field) -> String {
    match field.is_nullable() {
        true => field.data_type().to_string(),
        false => format!("{} not null", field.data_type()),
    }
}

/// Whether two types agree as a read and a write through this host need:
/// Arrow's type equality without field names and metadata
/// (`equals_datatype`), and the same child names, in the same order, for
/// every struct inside (values are matched to struct fields by position).
fn same_type(a: &DataType, b: &DataType) -> bool {
    fn names_agree(a: &DataType, b: &DataType) -> bool {
        match (a, b) {
            (DataType::Struct(x), DataType::Struct(y)) => {
                x.len() == y.len()
                    && x.iter().zip(y.iter()).all(|(f, g)| {
                        f.name() == g.name() && names_agree(f.data_type(), g.data_type())
                    })
            }
            (DataType::List(x), DataType::List(y))
            | (DataType::LargeList(x), DataType::LargeList(y))
            | (DataType::FixedSizeList(x, _), DataType::FixedSizeList(y, _))
            | (DataType::Map(x, _), DataType::Map(y, _)) => {
                names_agree(x.data_type(), y.data_type())
            }
            (DataType::Dictionary(_, x), DataType::Dictionary(_, y)) => names_agree(x, y),
            _ => true,
        }
    }
    a.equals_datatype(b) && names_agree(a, b)
}

/// Compare the dataset's schema with the declared one, column by column.
pub(crate) fn compare(stored: &Schema, declared: &Schema, key: &str) -> Vec<ColumnReport> {
    let mut out = Vec::new();
    for s in stored.fields() {
        let name = s.name();
        let report = |plugin: Option<&Field>, verdict, note: String| ColumnReport {
            column: name.clone(),
            dataset: Some(shown(s)),
            plugin: plugin.map(shown),
            verdict,
            note,
        };
        let tagged = s.metadata().get(PRIMARY_KEY_METADATA).map(String::as_str) == Some("true");
        if s.metadata().get("lance-encoding:blob").map(String::as_str) == Some("true") {
            out.push(report(
                declared.field_with_name(name).ok(),
                ColumnVerdict::BlobEncoding,
                "stored with Lance's blob encoding (lance-encoding:blob), which this host does not read".into(),
            ));
            continue;
        }
        let Ok(d) = declared.field_with_name(name) else {
            out.push(if tagged {
                report(
                    None,
                    ColumnVerdict::ExtraKeyTag,
                    format!("tagged {PRIMARY_KEY_METADATA}=true but the key is '{key}': Lance would merge on both"),
                )
            } else {
                report(
                    None,
                    ColumnVerdict::Undeclared,
                    "not declared by the plugin: a record this store rewrites (a new version, a back-link) would lose its value; declare it to adopt the dataset".into(),
                )
            });
            continue;
        };
        let verdict = if !same_type(s.data_type(), d.data_type()) {
            report(
                Some(d),
                ColumnVerdict::TypeConflict,
                format!(
                    "the dataset stores {} but the plugin declares {}",
                    s.data_type(),
                    d.data_type()
                ),
            )
        } else if s.is_nullable() != d.is_nullable() {
            report(
                Some(d),
                ColumnVerdict::NullabilityConflict,
                match s.is_nullable() {
                    true => "nullable in the dataset, non-nullable in the plugin: stored nulls could not be read as declared".into(),
                    false => "non-nullable in the dataset, nullable in the plugin: an add leaving it null would fail in storage".into(),
                },
            )
        } else if name == key && !tagged {
            report(
                Some(d),
                ColumnVerdict::KeyNotTagged,
                format!(
                    "the key column is not tagged {PRIMARY_KEY_METADATA}=true, which the MemWAL merges on"
                ),
            )
        } else if name != key && tagged {
            report(
                Some(d),
                ColumnVerdict::ExtraKeyTag,
                format!(
                    "tagged {PRIMARY_KEY_METADATA}=true but the key is '{key}': Lance would merge on both"
                ),
            )
        } else {
            report(Some(d), ColumnVerdict::Same, "the same".into())
        };
        out.push(verdict);
    }
    for d in declared.fields() {
        if stored.field_with_name(d.name()).is_ok() {
            continue;
        }
        let (verdict, note) = match (d.is_nullable(), d.name() == key) {
            (true, false) => (
                ColumnVerdict::MissingNullable,
                "not in the dataset: reads as null; only nulls may be written to it".to_string(),
            ),
            _ => (
                ColumnVerdict::MissingRequired,
                "declared non-nullable (or the key) but not in the dataset".to_string(),
            ),
        };
        out.push(ColumnReport {
            column: d.name().clone(),
            dataset: None,
            plugin: Some(shown(d)),
            verdict,
            note,
        });
    }
    out
}

/// Open an adopted dataset with its writer — the old shards taken over:
/// their WAL replayed, their generations merged — write the missing
/// supersession back-links, count, close: (generations merged, links
/// written, rows).
async fn open_adopted(
    config: StoreConfig,
) -> std::result::Result<(u64, usize, u64), lance_context_store::Error> {
    let store = Store::open(config).await?;
    let merged = store.taken_over();
    let links = store.link_superseded(true).await?;
    let rows = store.count(None).await?;
    store.close().await?;
    Ok((merged.generations_merged as u64, links, rows))
}

/// A schema chosen for an adoption: the source, its parameters, and why,
/// when it was inferred.
type Chosen = (SchemaSource, Vec<(String, String)>, Option<String>);

/// The schema to adopt with: `options.source`, or inferred from the
/// dataset (the previous GenericStore's recorded declaration, else a
/// built-in schema by its columns); with the context plugin, the dataset's
/// own parameters under those given. Also why, when inferred.
fn choose_schema(name: &str, uri: &str, options: &AdoptOptions, stored: &Schema) -> Result<Chosen> {
    let (source, inferred_from) = match options.source.clone() {
        Some(source) => (source, None),
        None => match stored.metadata().get(PREVIOUS_SPEC_METADATA) {
            Some(text) => (
                SchemaSource::Spec(SchemaSpec::from_previous(name, text)?),
                Some(format!(
                    "its {PREVIOUS_SPEC_METADATA} metadata: the previous GenericStore's declaration"
                )),
            ),
            None => match infer_builtin(stored) {
                Some((builtin, why)) => (SchemaSource::Builtin(builtin.into()), Some(why)),
                None => {
                    return Err(RegistryError::CannotInfer {
                        uri: uri.to_string(),
                        reason: format!(
                            "it has no {PREVIOUS_SPEC_METADATA} metadata and not the columns of a built-in schema (columns: {})",
                            stored
                                .fields()
                                .iter()
                                .map(|f| f.name().as_str())
                                .collect::<Vec<_>>()
                                .join(", ")
                        ),
                    });
                }
            },
        },
    };
    let mut params = options.params.clone();
    if matches!(&source, SchemaSource::Builtin(b) if b == "context") {
        for (k, v) in infer_context_params(stored) {
            if !params.iter().any(|(given, _)| *given == k) {
                params.push((k, v));
            }
        }
    }
    Ok((source, params, inferred_from))
}

impl Registry {
    /// Register the existing dataset at `options.uri` as store `name`.
    ///
    /// The schema is `options.source`, or inferred: a dataset carrying the
    /// previous GenericStore's declaration (`lance-context:schema_spec`)
    /// gets a spec store of that declaration; one with the columns of the
    /// previous `Context`, `RolloutStore` or `DatagenStore` gets the
    /// built-in plugin (for context with the embedding width, metric and
    /// blob columns the dataset was created with). The plugin is loaded and
    /// probed as for a create, and its declaration compared with the
    /// dataset's schema column by column: any conflict refuses the adoption
    /// with the whole report ([`RegistryError::AdoptRefused`]) and nothing
    /// is registered. A dry run stops at the report.
    ///
    /// Otherwise the store is registered and opened with its writer: the
    /// old shards are taken over (their unflushed WAL entries replayed) and
    /// merged into the base table, and missing supersession back-links are
    /// written. Stop the old writers first: a writer still running is
    /// fenced. The location is held to the rules of a create (not the data
    /// root, the registry or another store's data); dropping the store later
    /// deletes this dataset, as for any store.
    pub async fn adopt(&self, name: &str, options: AdoptOptions) -> Result<AdoptReport> {
        let (uri, stored) = self.adoptable(name, &options).await?;

        let (source, params, inferred_from) = choose_schema(name, &uri, &options, &stored)?;
        let resolved: Resolved = resolve_source(&source, &params)?;
        let (plugin, _warnings) = self.load_and_probe(&resolved, &source, None).await?;
        let declared = plugin.declaration().clone();
        let columns = compare(&stored, &declared.schema, &declared.spec.key);
        let columns_fit = columns.iter().all(|c| c.verdict.compatible());
        // Keys repeated in the base table (nothing kept them unique in a
        // dataset plain Lance wrote); checked once the columns fit.
        let duplicates = match columns_fit {
            true => duplicate_keys(&uri, &declared.spec.key, &options).await?,
            false => Some(Vec::new()),
        };
        let duplicates_checked = duplicates.is_some();
        let duplicate_keys = duplicates.unwrap_or_default();
        let compatible = columns_fit && duplicate_keys.is_empty();

        let mut entry = adopted_entry(name, &uri, &options, &declared, &resolved);
        let config = store_config(&entry, &plugin, &options.storage_options);
        let mut report = AdoptReport {
            store: name.to_string(),
            uri: uri.clone(),
            plugin: resolved.source.clone(),
            inferred_from,
            params: resolved.params.clone(),
            columns,
            duplicate_keys,
            duplicates_checked,
            compatible,
            shards: Vec::new(),
            rows_before: 0,
            rows_after: None,
            generations_merged: 0,
            supersession_links: 0,
            registered: false,
            dry_run: options.dry_run,
        };
        if !compatible {
            return Err(RegistryError::AdoptRefused {
                name: name.to_string(),
                report: Box::new(report),
            });
        }
        survey(config.clone(), &declared.spec.key, &mut report).await?;
        if options.dry_run {
            return Ok(report);
        }

        // Claim the name and pin the plugin (as a create does), then open.
        let _name = self.name_lock(name).await?;
        let path = self.claim_entry(name, &entry, &declared.sha256, &resolved.bytes)?;
        // The data is the user's: a failure frees the name and leaves it.
        let adopted = open_adopted(config).await;
        match adopted {
            Ok((generations, links, rows)) => {
                entry.state = EntryState::Ready;
                write_atomic(&path, &self.stored_form(&entry))?;
                let mut noted = StoreConfig::new(&uri);
                noted.storage_options = options.storage_options.clone();
                self.note_owner(&noted, name).await;
                report.generations_merged = generations;
                report.supersession_links = links;
                report.rows_after = Some(rows);
                report.registered = true;
                Ok(report)
            }
            Err(e) => {
                let _ = std::fs::remove_file(&path);
                if let Ok(_pins) = self.pins_lock() {
                    let _ = self.remove_if_unpinned(&declared.sha256);
                }
                Err(e.into())
            }
        }
    }

    /// Check that `options.uri` may be adopted as store `name`: a free name,
    /// a location a create could use, a Lance dataset there that no other
    /// data root's live store owns. Its absolute URI and schema.
    async fn adoptable(&self, name: &str, options: &AdoptOptions) -> Result<(String, SchemaRef)> {
        super::check_name(name)?;
        let uri = super::absolute_uri(&options.uri)?;
        self.check_new_location(name, &uri)?;
        if self.entry_path(name).exists() {
            return Err(RegistryError::AlreadyExists {
                name: name.to_string(),
            });
        }
        let mut probe_config = StoreConfig::new(&uri);
        probe_config.storage_options = options.storage_options.clone();
        if Store::probe(&probe_config).await? != Location::Dataset {
            return Err(lance_context_store::Error::NotFound {
                what: format!("a Lance dataset at {uri} (nothing to adopt there)"),
            }
            .into());
        }
        // A live store of another data root (its registry's note says so):
        // adopting it would take its writer over, and a drop here delete it.
        if let Some(reason) = self.other_owner(&probe_config, &uri).await? {
            return Err(RegistryError::UriRefused {
                name: name.to_string(),
                uri,
                reason,
            });
        }
        let stored = Store::dataset_schema(&probe_config).await?;
        Ok((uri, stored))
    }
}

/// Keys the base table at `uri` holds more than once (at most 10), or
/// `None` when it is too large to check.
async fn duplicate_keys(
    uri: &str,
    key: &str,
    options: &AdoptOptions,
) -> Result<Option<Vec<String>>> {
    let mut check = StoreConfig::new(uri).with_key_column(key);
    check.storage_options = options.storage_options.clone();
    Ok(Store::duplicate_keys(&check, 10, MAX_ROWS_CHECKED).await?)
}

/// The registry entry of an adopted store, still `Creating`.
fn adopted_entry(
    name: &str,
    uri: &str,
    options: &AdoptOptions,
    declared: &PluginDeclaration,
    resolved: &Resolved,
) -> StoreEntry {
    let mut keys: Vec<String> = options.storage_options.keys().cloned().collect();
    keys.sort();
    StoreEntry {
        name: name.to_string(),
        state: EntryState::Creating,
        uri: uri.to_string(),
        storage_option_keys: keys,
        plugin: PluginPin {
            name: declared.name.clone(),
            version: declared.version.clone(),
            sha256: declared.sha256.clone(),
            source: resolved.source.clone(),
        },
        spec: declared.spec.clone(),
        params: resolved.params.clone(),
        created_at: chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
        adopted: true,
    }
}

/// Fill `report` with what a reader sees now: the old shards' unmerged
/// generations, the rows, and on a dry run the back-links the writer would
/// write.
async fn survey(config: StoreConfig, key: &str, report: &mut AdoptReport) -> Result<()> {
    // What a reader sees now (no claim: a running old writer is not
    // disturbed by a dry run).
    let reader = Store::open_read_only(config).await?;
    report.shards = reader
        .wal_status()
        .await?
        .unmerged_generations
        .into_iter()
        .map(|(shard, unmerged)| ShardReport {
            shard: shard.to_string(),
            unmerged_generations: unmerged,
        })
        .collect();
    // Counted by a scan (a filter that holds for every row), which
    // keeps no count in the dataset: a dry run writes nothing.
    let every_row = format!("{key} IS NOT NULL");
    report.rows_before = reader.count(Some(&every_row)).await?;
    if report.dry_run {
        report.supersession_links = reader.link_superseded(false).await?;
    }
    Ok(())
}
