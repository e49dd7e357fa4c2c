//! [`Store`]: one dataset, one resident writer, the LSM read path.

pub(crate) mod buckets;
pub(crate) mod input;
pub(crate) mod records;
pub(crate) mod visible;

use std::collections::HashMap;
use std::sync::Arc;

use arrow_array::{Array, RecordBatch, StringArray};
use arrow_schema::{DataType, Field, Schema, SchemaRef};
use arrow_select::concat::concat_batches;
use lance::Dataset;
use lance::dataset::mem_wal::scanner::SsTableCache;
use lance::deps::datafusion::physical_plan::displayable;
use tokio::sync::RwLock;
use uuid::Uuid;

use crate::config::{RecordCapabilities, ShardPolicy, StoreConfig};
use crate::conform::Schemas;
use crate::dataset::{Location, Opener, ensure_mem_wal, narrow_maintained_indexes};
use crate::engine::{
    Background, CompactionState, CompactionStats, Engine, Settings, StoreStats,
    ensure_scalar_indexes,
};
use crate::error::ErrorKind;
use crate::error::{Error, Result};
use crate::id::shard_id_for_instance;
#[cfg(feature = "failpoints")]
use crate::merge::MergeFailpoint;
use crate::merge::{MergeState, MergeStats};
use crate::read::{
    BatchStream, Condition, ReadView, RetrieveQuery, ScanRequest, TextQuery, VectorQuery, collect,
    execute, plan_lookup, plan_scan,
};
use crate::writer::{AddOutcome, Writer};

/// How many opened generation datasets a store keeps (least recently used go).
const GENERATION_CACHE_ENTRIES: u64 = 512;

/// Field metadata that marks the key column for Lance's MemWAL.
pub use lance_context_spec::PRIMARY_KEY_METADATA;

/// [`Store::on_view`] on `engine`'s views, awaiting `pause` (failpoints)
/// between taking the first view and reading: a function of the engine
/// alone, so a read can run on a task of its own.
///
/// The first read is on `first` when given (a view the caller took for
/// several reads that must see one state), else on a new view.
pub(crate) async fn read_on_view<T, F, Fut>(
    engine: &Engine,
    first: Option<ReadView>,
    pause: Option<crate::merge::ReclaimHook>,
    read: F,
) -> Result<T>
where
    F: Fn(ReadView) -> Fut,
    Fut: std::future::Future<Output = Result<T>>,
{
    let view = match first {
        Some(view) => view,
        None => engine.view().await?,
    };
    let version = view.dataset.version().version;
    if let Some(pause) = pause {
        pause().await;
    }
    let (mut outcome, mut version) = (read(view).await, version);
    for _ in 0..READ_AGAIN {
        // Lance reports the vanished file as not found, or (through its
        // cache of opened generations) as a storage error.
        match &outcome {
            Err(e) if matches!(e.kind(), ErrorKind::NotFound | ErrorKind::Storage) => {}
            _ => break,
        }
        let again = engine.view().await?;
        if again.dataset.version().version == version {
            break;
        }
        tracing::debug!("a read outlived cleanup of what it listed; reading again");
        version = again.dataset.version().version;
        outcome = read(again).await;
    }
    outcome
}

/// A store: a Lance dataset with this instance's resident MemWAL writer.
///
/// Cheap to share behind an `Arc`; every method takes `&self` and is safe to
/// call concurrently.
pub struct Store {
    pub(crate) engine: Arc<Engine>,
    pub(crate) schemas: Schemas,
    instance_id: String,
    background: std::sync::Mutex<Option<Background>>,
    /// Record semantics the schema opted into.
    pub(crate) capabilities: RecordCapabilities,
    /// Serialises check-then-write adds (uniqueness, upsert, patch, delete by
    /// tombstone) of this store handle.
    pub(crate) record_lock: tokio::sync::Mutex<()>,
    /// Visibility rules, and the count of visible base rows (record
    /// capabilities); merges carry the count to the versions they make.
    pub(crate) rules: Arc<visible::Rules>,
    shard_policy: ShardPolicy,
    /// A bucketed store's owned buckets, each a writable handle of its own
    /// (this handle then reads only; see the `buckets` module).
    buckets: Option<buckets::Buckets>,
    /// A read-only handle's view of the dataset's bucket count (read once
    /// at open; a writable handle's is in `buckets`).
    read_buckets: Option<u32>,
    /// Awaited by the next read between taking its view and reading
    /// (failpoints: a reader slower than cleanup).
    #[cfg(feature = "failpoints")]
    read_pause: std::sync::Mutex<Option<crate::merge::ReclaimHook>>,
    /// Awaited by the next record write after its checks (failpoints).
    #[cfg(feature = "failpoints")]
    pub(crate) record_write_pause: std::sync::Mutex<Option<crate::merge::ReclaimHook>>,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store")
            .field("opener", &self.engine.opener)
            .field("instance_id", &self.instance_id)
            .field("shard", &self.engine.shard)
            .field("read_only", &self.is_read_only())
            .field("buckets", &self.buckets)
            .finish_non_exhaustive()
    }
}

/// What an operator wants to know about the write-ahead tier.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WalStatus {
    /// This instance's shard.
    pub shard: Uuid,
    /// Unmerged generations per shard (every shard of the dataset).
    pub unmerged_generations: Vec<(Uuid, usize)>,
}

/// How many times a read outlived by cleanup is taken again on a new view.
const READ_AGAIN: usize = 3;

impl Store {
    /// Create the dataset (empty, MemWAL initialised) and open it.
    /// [`Error::AlreadyExists`] if there is one.
    pub async fn create(config: StoreConfig) -> Result<Self> {
        let schema = config
            .schema
            .clone()
            .ok_or_else(|| Error::invalid_argument("creating a store needs a schema"))?;
        let schema = validate_new_schema(&schema, &config.key_column)?;
        let buckets = check_bucket_count(&config)?;
        let opener = Opener::new(&config.uri, &config.storage_options);
        let dataset = opener
            .create_sharded(schema, buckets.map(|n| (config.key_column.as_str(), n)))
            .await?;
        Self::start_writable(config, opener, dataset).await
    }

    /// Open an existing dataset. [`Error::NotFound`] if there is none.
    ///
    /// A dataset without a MemWAL (one written by plain Lance, or a create that
    /// stopped half-way) has it initialised.
    pub async fn open(config: StoreConfig) -> Result<Self> {
        if config.as_of.is_some() {
            return Err(Error::invalid_argument(
                "a store opened at a version (as_of) is read-only: open it with open_read_only",
            ));
        }
        let buckets = check_bucket_count(&config)?;
        let opener = Opener::new(&config.uri, &config.storage_options);
        let mut dataset = opener.open().await?;
        ensure_mem_wal(
            &mut dataset,
            buckets.map(|n| (config.key_column.as_str(), n)),
        )
        .await?;
        Self::start_writable(config, opener, dataset).await
    }

    /// Start a writable handle: one writer on the instance's shard, or on a
    /// bucketed store one per owned bucket.
    async fn start_writable(config: StoreConfig, opener: Opener, dataset: Dataset) -> Result<Self> {
        let Some((spec, count)) = buckets::sharding_of(&dataset, &config.key_column).await? else {
            if config.buckets > 1 {
                return Err(Error::invalid_argument(format!(
                    "the store at {} has no buckets (it was created without them); \
                     open it without a bucket count",
                    config.uri
                )));
            }
            return Self::start(config, opener, dataset, true).await;
        };
        if config.buckets > 1 && config.buckets != count {
            return Err(Error::invalid_argument(format!(
                "the store at {} has {count} buckets, not {}: the count is chosen at create",
                config.uri, config.buckets
            )));
        }
        if config.capabilities != RecordCapabilities::default() {
            return Err(Error::invalid_argument(NO_BUCKETED_RECORDS));
        }
        let mut owned: Vec<u32> = match &config.owned_buckets {
            Some(list) => list.iter().copied().filter(|b| *b < count).collect(),
            None => (0..count).collect(),
        };
        owned.sort_unstable();
        owned.dedup();
        if owned.is_empty() && config.owned_buckets.as_ref().is_some_and(|l| !l.is_empty()) {
            tracing::warn!(
                uri = %config.uri,
                "none of the buckets this instance owns is below the store's count ({count}): \
                 it writes no bucket of this store"
            );
        }
        let key = config.key_column.clone();
        // Keys never cross buckets: the reads of this handle need no check
        // across shards (see `ShardPolicy`).
        let top_config = config
            .clone()
            .with_shard_policy(ShardPolicy::PartitionedKeys);
        let mut top = Self::start(top_config, opener.clone(), dataset, false).await?;
        // One writable handle per owned bucket, each on its bucket's shard.
        // The first alone (it ensures the key index, a commit), the rest
        // together; only the first compacts in the background (one
        // compactor per instance).
        let handle = |bucket: u32, first: bool| {
            let mut config = config
                .clone()
                .with_instance_id(buckets::bucket_instance_id(bucket))
                .with_shard_policy(ShardPolicy::PartitionedKeys);
            if !first {
                config.compaction.interval = None;
            }
            let opener = opener.clone();
            async move {
                let dataset = opener.open().await?;
                let store = Box::pin(Self::start(config, opener, dataset, true)).await?;
                Ok::<_, Error>((bucket, store))
            }
        };
        let mut handles = std::collections::BTreeMap::new();
        if let Some((&first, rest)) = owned.split_first() {
            let (bucket, store) = handle(first, true).await?;
            handles.insert(bucket, store);
            let others =
                futures::future::try_join_all(rest.iter().map(|b| handle(*b, false))).await?;
            handles.extend(others);
        }
        top.buckets = Some(buckets::Buckets::new(count, spec, &key, handles));
        Ok(top)
    }

    /// Open an existing dataset for reading only: no writer is opened, so no
    /// shard is claimed and a running writer is not disturbed. Adds fail with
    /// [`Error::WriterUnavailable`].
    /// With [`StoreConfig::with_as_of`], every read sees the base table at
    /// that version (time travel).
    pub async fn open_read_only(config: StoreConfig) -> Result<Self> {
        let opener = Opener::new(&config.uri, &config.storage_options).at_version(config.as_of);
        let dataset = opener.open().await?;
        // A bucketed store keeps each key in its bucket's shard: reads need
        // not check across shards for a takeover (see `ShardPolicy`).
        // A spec this build cannot write through does not fail a read-only
        // open.
        let count = match buckets::sharding_of(&dataset, &config.key_column).await {
            Ok(Some((_, count))) => Some(count),
            _ => None,
        };
        let config = match count {
            Some(_) => config.with_shard_policy(ShardPolicy::PartitionedKeys),
            None => config,
        };
        let mut store = Self::start(config, opener, dataset, false).await?;
        store.read_buckets = count;
        Ok(store)
    }

    /// Delete the dataset at `config.uri` — every version, index and WAL
    /// shard — with `config`'s storage options. Irreversible; close every
    /// store open on it first. Deleting nothing is not an error.
    pub async fn destroy(config: &StoreConfig) -> Result<()> {
        Opener::new(&config.uri, &config.storage_options)
            .remove()
            .await
    }

    /// What is at `config.uri` (with its storage options): nothing, a Lance
    /// dataset, or other files — for callers that must not create over, or
    /// delete, what they did not write.
    pub async fn probe(config: &StoreConfig) -> Result<Location> {
        Opener::new(&config.uri, &config.storage_options)
            .probe()
            .await
    }

    /// The Arrow schema of the dataset at `config.uri` (latest version), with
    /// its schema and field metadata — what a dataset written elsewhere
    /// declares, read before any key or schema is known (nothing is
    /// claimed or written). [`Error::NotFound`] if there is none.
    pub async fn dataset_schema(config: &StoreConfig) -> Result<SchemaRef> {
        let dataset = Opener::new(&config.uri, &config.storage_options)
            .open()
            .await?;
        Ok(Arc::new(Schema::from(dataset.schema())))
    }

    /// A small file the caller keeps with the dataset at `config.uri`
    /// (`_lance_context/<name>`, e.g. which registry holds the store):
    /// its bytes, or `None`. Not part of any version; dropped with the data.
    pub async fn read_note(config: &StoreConfig, name: &str) -> Result<Option<Vec<u8>>> {
        Opener::new(&config.uri, &config.storage_options)
            .read_note(name)
            .await
    }

    /// Write the note `name` (see [`Store::read_note`]), replacing it.
    pub async fn write_note(config: &StoreConfig, name: &str, bytes: &[u8]) -> Result<()> {
        Opener::new(&config.uri, &config.storage_options)
            .write_note(name, bytes)
            .await
    }

    /// The bucket count of the store at `config.uri` (by its key column,
    /// `config.key_column`), read from its MemWAL index; `None`: not
    /// bucketed. Opens nothing for writing.
    pub async fn bucket_count_at(config: &StoreConfig) -> Result<Option<u32>> {
        let dataset = Opener::new(&config.uri, &config.storage_options)
            .open()
            .await?;
        Ok(buckets::sharding_of(&dataset, &config.key_column)
            .await?
            .map(|(_, count)| count))
    }

    /// Keys the base table of the dataset at `config.uri` holds more than
    /// once (at most `limit` of them, sorted) — a dataset written by plain
    /// Lance, where nothing kept keys unique, before it is served keyed.
    /// `None` when the base table has more than `max_rows` rows (not
    /// checked: the check holds 8 bytes per row). Reads the key column once,
    /// and again only the suspects' rows; writes nothing.
    pub async fn duplicate_keys(
        config: &StoreConfig,
        limit: usize,
        max_rows: usize,
    ) -> Result<Option<Vec<String>>> {
        use crate::error::LanceResultExt as _;
        use futures::TryStreamExt as _;
        use std::hash::BuildHasher as _;
        let dataset = Opener::new(&config.uri, &config.storage_options)
            .open()
            .await?;
        let key = config.key_column.as_str();
        let rows = dataset.count_rows(None).await.ctx("counting rows")?;
        if rows > max_rows {
            return Ok(None);
        }
        let hasher =
            std::hash::BuildHasherDefault::<std::collections::hash_map::DefaultHasher>::default();
        let keys_of = |batch: &RecordBatch| -> Vec<Option<String>> {
            let Some(column) = batch.column_by_name(key) else {
                return Vec::new();
            };
            match arrow_cast::cast(column, &DataType::Utf8) {
                Ok(c) => c
                    .as_any()
                    .downcast_ref::<StringArray>()
                    .map(|a| a.iter().map(|v| v.map(str::to_string)).collect())
                    .unwrap_or_default(),
                Err(_) => Vec::new(),
            }
        };
        // Pass 1: a 64-bit hash per row; a hash seen twice makes a suspect.
        let mut hashes: Vec<u64> = Vec::with_capacity(rows);
        let mut scan = dataset.scan();
        scan.project(&[key]).ctx("projecting the key")?;
        let mut stream = scan.try_into_stream().await.ctx("reading the keys")?;
        while let Some(batch) = stream.try_next().await.ctx("reading the keys")? {
            for k in keys_of(&batch).into_iter().flatten() {
                hashes.push(hasher.hash_one(&k));
            }
        }
        hashes.sort_unstable();
        let repeated: std::collections::HashSet<u64> = hashes
            .windows(2)
            .filter(|w| w[0] == w[1])
            .map(|w| w[0])
            .collect();
        drop(hashes);
        if repeated.is_empty() {
            return Ok(Some(Vec::new()));
        }
        // Pass 2: the rows whose hash repeats, counted by key (exact).
        let mut counts: HashMap<String, usize> = HashMap::new();
        let mut scan = dataset.scan();
        scan.project(&[key]).ctx("projecting the key")?;
        let mut stream = scan.try_into_stream().await.ctx("reading the keys")?;
        while let Some(batch) = stream.try_next().await.ctx("reading the keys")? {
            for k in keys_of(&batch).into_iter().flatten() {
                if repeated.contains(&hasher.hash_one(&k)) {
                    *counts.entry(k).or_default() += 1;
                }
            }
        }
        let mut duplicated: Vec<String> = counts
            .into_iter()
            .filter(|(_, n)| *n > 1)
            .map(|(k, _)| k)
            .collect();
        duplicated.sort_unstable();
        duplicated.truncate(limit);
        Ok(Some(duplicated))
    }

    /// Open the dataset, creating it first when it does not exist.
    pub async fn open_or_create(config: StoreConfig) -> Result<Self> {
        match Self::open(config.clone()).await {
            Err(Error::NotFound { .. }) => match Self::create(config.clone()).await {
                // Lost a race with another creator: open theirs.
                Err(Error::AlreadyExists { .. }) => Self::open(config).await,
                other => other,
            },
            other => other,
        }
    }

    async fn start(
        mut config: StoreConfig,
        opener: Opener,
        dataset: Dataset,
        writable: bool,
    ) -> Result<Self> {
        if config.indexes.secondary_key_index.is_none() {
            config.indexes.secondary_key_index = config.capabilities.secondary_key.clone();
        }
        let stored: SchemaRef = Arc::new(Schema::from(dataset.schema()));
        let schemas = resolve_schemas(&config, stored)?;
        records::check_capabilities(&config.capabilities, &schemas.logical)?;
        let shard = shard_id_for_instance(&config.instance_id);
        if config.merge.cleanup_grace.is_zero() {
            return Err(Error::invalid_argument(
                "merge.cleanup_grace must be greater than zero: a read in progress may still open what cleanup would delete",
            ));
        }
        // The key index exists before the writer opens (see
        // `ensure_scalar_indexes`) and is the only maintained index
        // (`narrow_maintained_indexes`; this build's writer drops even that
        // from its memtables, see `crate::writer`).
        let dataset = match writable {
            true => {
                let mut dataset = ensure_scalar_indexes(&dataset, &schemas.key, &config.indexes)
                    .await?
                    .unwrap_or(dataset);
                narrow_maintained_indexes(&mut dataset, &format!("{}_idx", schemas.key)).await;
                dataset
            }
            false => dataset,
        };
        let writer = match writable {
            true => Some(Writer::open(&dataset, shard, config.writer.clone()).await?),
            false => None,
        };
        let rules = Arc::new(visible::Rules::new(
            config.capabilities.clone(),
            schemas.clone(),
        ));
        let engine = Arc::new(Engine {
            opener,
            key: schemas.key.clone(),
            dataset: RwLock::new(Arc::new(dataset)),
            generations: Arc::new(SsTableCache::new(GENERATION_CACHE_ENTRIES)),
            held: Default::default(),
            shard,
            writer,
            settings: Settings {
                merge: config.merge.clone(),
                compaction: config.compaction.clone(),
                indexes: config.indexes.clone(),
                retention: config.retention.clone(),
                writer: config.writer.clone(),
                shard_policy: config.shard_policy,
            },
            merge_state: MergeState::default(),
            compaction_state: CompactionState::default(),
            kick: tokio::sync::Notify::new(),
            last_background_error: std::sync::Mutex::new(None),
            last_retention: std::sync::Mutex::new(None),
            manifests: Default::default(),
            rules: (config.capabilities != RecordCapabilities::default()).then(|| rules.clone()),
            taken_over: Default::default(),
            #[cfg(feature = "failpoints")]
            views: Default::default(),
            #[cfg(feature = "failpoints")]
            compaction_pause: Default::default(),
            #[cfg(feature = "failpoints")]
            view_pause: Default::default(),
        });
        let background = match writable {
            true => {
                if config.shard_policy == ShardPolicy::SingleWriter {
                    let dataset = engine.fresh_dataset().await?;
                    Box::pin(engine.take_over_other_shards(&dataset)).await?;
                }
                Background::start(&engine)
            }
            false => None,
        };
        Ok(Self {
            engine,
            schemas,
            instance_id: config.instance_id,
            background: std::sync::Mutex::new(background),
            capabilities: config.capabilities,
            record_lock: tokio::sync::Mutex::new(()),
            rules,
            shard_policy: config.shard_policy,
            buckets: None,
            read_buckets: None,
            #[cfg(feature = "failpoints")]
            read_pause: std::sync::Mutex::new(None),
            #[cfg(feature = "failpoints")]
            record_write_pause: std::sync::Mutex::new(None),
        })
    }

    /// The schema callers write and read.
    pub fn schema(&self) -> SchemaRef {
        self.schemas.logical.clone()
    }

    /// The schema the dataset stores (may lack columns of [`Self::schema`]).
    pub fn stored_schema(&self) -> SchemaRef {
        self.schemas.stored.clone()
    }

    /// The key column.
    pub fn key_column(&self) -> &str {
        &self.schemas.key
    }

    /// The dataset URI.
    pub fn uri(&self) -> &str {
        self.engine.opener.uri()
    }

    /// Write this store's note `name` ([`Store::write_note`]), conditional
    /// on the version `expected` when given (see [`crate::NoteWrite`]).
    pub async fn write_note_if(
        &self,
        name: &str,
        bytes: &[u8],
        expected: Option<&crate::NoteVersion>,
    ) -> Result<crate::NoteWrite> {
        self.engine
            .opener
            .write_note_if(name, bytes, expected)
            .await
    }

    /// This store's notes under `_lance_context/<dir>/` named `*<suffix>`,
    /// at most `max_bytes` each and `max_notes` in all (file name, bytes),
    /// sorted by name.
    pub async fn list_notes(
        &self,
        dir: &str,
        suffix: &str,
        max_bytes: u64,
        max_notes: usize,
    ) -> Result<Vec<(String, Vec<u8>)>> {
        self.engine
            .opener
            .list_notes(dir, suffix, max_bytes, max_notes)
            .await
    }

    /// This store's note `name`, or `None`.
    pub async fn read_own_note(&self, name: &str) -> Result<Option<Vec<u8>>> {
        self.engine.opener.read_note(name).await
    }

    /// Delete this store's note `name` (absent: fine).
    pub async fn remove_note(&self, name: &str) -> Result<()> {
        self.engine.opener.remove_note(name).await
    }

    /// This instance's id.
    pub fn instance_id(&self) -> &str {
        &self.instance_id
    }

    /// This instance's MemWAL shard.
    pub fn shard_id(&self) -> Uuid {
        self.engine.shard
    }

    /// Whether this store was opened without a writer.
    pub fn is_read_only(&self) -> bool {
        match &self.buckets {
            Some(buckets) => buckets.owned.is_empty(),
            None => self.engine.writer.is_none(),
        }
    }

    /// A bucketed store's bucket count, or `None` (see
    /// [`StoreConfig::with_buckets`]).
    pub fn bucket_count(&self) -> Option<u32> {
        self.buckets.as_ref().map(|b| b.count)
    }

    /// The buckets this handle writes (empty without buckets, or when it
    /// owns none).
    pub fn owned_buckets(&self) -> Vec<u32> {
        self.buckets
            .as_ref()
            .map(|b| b.owned_list())
            .unwrap_or_default()
    }

    /// The bucket of each key, as Lance routes it (`None`: the store is not
    /// bucketed, or this handle was opened read-only).
    pub fn buckets_of_keys(&self, keys: &[&str]) -> Result<Option<Vec<u32>>> {
        let Some(buckets) = &self.buckets else {
            return Ok(None);
        };
        buckets.buckets_of(&self.key_batch(keys)?).map(Some)
    }

    /// `ids` as a batch of the key column alone (as stored).
    fn key_batch(&self, ids: &[&str]) -> Result<RecordBatch> {
        let key_field = self
            .schemas
            .stored
            .field_with_name(&self.schemas.key)
            .map_err(|_| Error::internal("the stored schema lost its key column"))?
            .clone();
        Ok(RecordBatch::try_new(
            Arc::new(Schema::new(vec![key_field])),
            vec![Arc::new(StringArray::from_iter_values(ids.iter().copied()))],
        )?)
    }

    /// Each owned bucket and the epoch its shard is held at (`None` for a
    /// writer closed meanwhile; during a claim, the epoch seen last).
    pub fn bucket_epochs(&self) -> Vec<(u32, Option<u64>)> {
        let Some(buckets) = &self.buckets else {
            return Vec::new();
        };
        let mut epochs = Vec::with_capacity(buckets.owned.len());
        for (bucket, store) in &buckets.owned {
            let epoch = match store.engine.writer() {
                Ok(writer) => writer.epoch(),
                Err(_) => None,
            };
            epochs.push((*bucket, epoch));
        }
        epochs
    }

    /// The checks [`Store::add`] makes of a batch before it writes (the
    /// schema, keys, vectors), without writing: a caller splitting one
    /// request between instances refuses it whole first.
    pub fn check_batch(&self, batch: &RecordBatch) -> Result<()> {
        let conformed = self.schemas.conform_for_write(batch)?;
        self.check_input(&conformed)
    }

    /// The checks [`Store::delete`] makes of its keys (some, none empty,
    /// none too long), without deleting.
    pub fn check_keys(&self, ids: &[&str]) -> Result<()> {
        if ids.is_empty() {
            return Err(Error::batch(crate::error::BatchProblem::EmptyBatch));
        }
        if let Some(row) = ids.iter().position(|id| id.is_empty()) {
            return Err(Error::batch(crate::error::BatchProblem::EmptyKey {
                column: self.schemas.key.clone(),
                row,
            }));
        }
        input::check_key_lengths(&self.schemas.key, ids)
    }

    /// Add rows. When this returns `Ok`, the rows are durable (in the shard's WAL
    /// and in a flushed generation) and visible to every reader, in this process
    /// or another. A re-added key replaces the older row (newest wins); within
    /// one batch the later row wins.
    ///
    /// The batch is matched to the schema by column name: columns may come in
    /// any order, absent nullable columns are filled with nulls, and unknown
    /// columns, type mismatches, nulls in non-nullable columns and null or empty
    /// keys are rejected with [`Error::InvalidBatch`] naming the column and row.
    /// So are keys (and secondary keys) longer than [`crate::MAX_KEY_BYTES`]
    /// ([`crate::BatchProblem::KeyTooLong`]) and vectors of declared vector
    /// columns with an element that is not finite, too large for their
    /// distances to stay finite, or all zero under the cosine metric
    /// ([`crate::BatchProblem::BadVector`]).
    /// A rejected batch writes nothing.
    ///
    /// With record capabilities: the tombstone value is refused
    /// ([`crate::BatchProblem::ReservedValue`]), and so are the values only
    /// the engine writes — any `superseded_by_id` (supersession), the
    /// `lifecycle_status` [`crate::RESERVED_STATUS`] (lifecycle)
    /// ([`crate::BatchProblem::EngineManaged`]); with `unique_keys`, a key or
    /// secondary key repeated in the batch or held by a stored non-tombstone
    /// row is refused, the first in input order
    /// ([`crate::BatchProblem::DuplicateInBatch`], [`crate::BatchProblem::AlreadyExists`]);
    /// with supersession, a row naming a record in `supersedes_id` also marks
    /// that record superseded, which must be current
    /// ([`crate::BatchProblem::NotCurrent`]).
    pub async fn add(&self, batch: &RecordBatch) -> Result<AddOutcome> {
        let caps = &self.capabilities;
        if caps.tombstones || caps.unique_keys || caps.supersession {
            let _guard = self.record_lock.lock().await;
            let conformed = self.schemas.conform_for_write(batch)?;
            self.check_input(&conformed)?;
            self.check_new_records(None, &conformed, true).await?;
            let rows = conformed.num_rows();
            let linked = self.with_backlinks(conformed).await?;
            self.write_linked(linked).await?;
            return Ok(AddOutcome { rows });
        }
        let conformed = self.schemas.conform_for_write(batch)?;
        self.check_input(&conformed)?;
        if let Some(buckets) = &self.buckets {
            return buckets.write(conformed, &self.schemas.key).await;
        }
        self.write_conformed(conformed).await
    }

    /// Write a conformed batch (every check done).
    pub(crate) async fn write_conformed(&self, conformed: RecordBatch) -> Result<AddOutcome> {
        let writer = self.engine.writer()?;
        self.engine.check_backpressure().await?;
        let outcome = writer
            .add(conformed, || self.engine.reopen_for_writer())
            .await?;
        self.engine.kick.notify_one();
        Ok(outcome)
    }

    /// Write a record batch whose linked rows (a new version and the
    /// rewritten version it supersedes, rows sharing a key) must become
    /// visible together: each group goes whole into one atomic write.
    ///
    /// The caller holds the record lock. Every write of a store with
    /// tombstones, unique keys or supersession takes it, so a write of one
    /// chunk is alone in the generation its freeze flushes: with unique keys
    /// or supersession (whose writes read by key) those rows are held for
    /// the keyed reads that follow (the next record write's checks) instead
    /// of being read back.
    pub(crate) async fn write_linked(&self, linked: records::Linked) -> Result<()> {
        #[cfg(feature = "failpoints")]
        crate::merge::await_pause(&self.record_write_pause).await;
        let writer = self.engine.writer()?;
        self.engine.check_backpressure().await?;
        let chunks = linked.into_chunks(&self.schemas.key, writer.max_atomic_rows())?;
        // Held where record writes read by key (uniqueness, supersession);
        // their writes are serialized: `add`, `delete`, `upsert`, `patch`
        // and tombstones all take the record lock on such a store.
        let caps = &self.capabilities;
        let read_by_key = caps.unique_keys || caps.supersession;
        let only = match chunks.as_slice() {
            [one] if read_by_key => Some(one.clone()),
            _ => None,
        };
        let frozen = writer
            .add_chunks(chunks, || self.engine.reopen_for_writer())
            .await?;
        if let (Some(rows), Some(generation)) = (only, frozen) {
            // Holding is an optimisation: a failure leaves the read to disk.
            if let Err(e) = self.engine.held.hold_written(
                self.engine.shard,
                generation,
                rows,
                &self.schemas.key,
            ) {
                tracing::debug!("not holding a written generation: {e}");
            }
        }
        self.engine.kick.notify_one();
        Ok(())
    }

    /// Delete rows by key: a tombstone per key, newest-wins like an add, so the
    /// key reads as absent from every reader when this returns (durable and
    /// visible, as for [`Self::add`]); the next merge removes it from the base
    /// table. Returns the number of keys given. Deleting an absent key is not
    /// an error; adding the key again later makes it live again. A key longer
    /// than [`crate::MAX_KEY_BYTES`] is refused (none is stored).
    pub async fn delete(&self, ids: &[&str]) -> Result<usize> {
        let caps = &self.capabilities;
        // A record write in flight checked its targets as current: a delete
        // slipping between that check and its write would be undone by it.
        let _guard = if caps.tombstones || caps.unique_keys || caps.supersession {
            Some(self.record_lock.lock().await)
        } else {
            None
        };
        if self.buckets.is_none() {
            self.engine.writer()?;
            self.engine.check_backpressure().await?;
        }
        self.check_keys(ids)?;
        let keys = self.key_batch(ids)?;
        if let Some(buckets) = &self.buckets {
            return buckets.delete(keys).await;
        }
        let writer = self.engine.writer()?;
        writer
            .delete(keys, || self.engine.reopen_for_writer())
            .await?;
        self.engine.kick.notify_one();
        Ok(ids.len())
    }

    /// Fold this instance's unmerged generations into the base table now
    /// (streaming, atomic, idempotent; see the crate docs), then clean up
    /// generations merged at least `cleanup_grace` ago.
    pub async fn merge(&self) -> Result<MergeStats> {
        if let Some(buckets) = &self.buckets {
            return buckets.merge().await;
        }
        self.engine
            .merge(
                None,
                #[cfg(feature = "failpoints")]
                None,
            )
            .await
    }

    /// [`Self::merge`], stopping with an error at `failpoint` (crash tests).
    #[cfg(feature = "failpoints")]
    pub async fn merge_failing_at(&self, failpoint: MergeFailpoint) -> Result<MergeStats> {
        self.engine.merge(Some(failpoint), None).await
    }

    /// [`Self::merge`], awaiting `hook(first, last)` before each pass commits
    /// (interleaving tests).
    #[cfg(feature = "failpoints")]
    pub async fn merge_with_hook(&self, hook: crate::MergeHook) -> Result<MergeStats> {
        self.engine.merge(None, Some(hook)).await
    }

    /// Make this store's next WAL write fail as Lance reports a failed WAL
    /// persistence (crash tests: the writer must reclaim and retry).
    #[cfg(feature = "failpoints")]
    pub fn fail_next_wal_write(&self) -> Result<()> {
        self.engine
            .writer()?
            .fail_next_write
            .store(true, std::sync::atomic::Ordering::SeqCst);
        Ok(())
    }

    /// Read views this handle has taken so far (tests: how many the checks
    /// of one write take).
    #[cfg(feature = "failpoints")]
    pub fn views_taken(&self) -> usize {
        self.engine.views.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Make this store's next read await `pause` after taking its view and
    /// before reading (a reader slower than the cleanup grace).
    #[cfg(feature = "failpoints")]
    pub fn pause_next_read(&self, pause: crate::merge::ReclaimHook) {
        *self.read_pause.lock().unwrap_or_else(|p| p.into_inner()) = Some(pause);
    }

    /// Make the next read view await `pause` after it read the base table and
    /// before it reads the shard manifests (a takeover between the two).
    #[cfg(feature = "failpoints")]
    pub fn pause_next_view(&self, pause: crate::merge::ReclaimHook) {
        *self
            .engine
            .view_pause
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = Some(pause);
    }

    /// Make this store's next recovery from a failed WAL write await `pause`
    /// after it checked the shard's epoch, before it claims the shard again
    /// (a peer claiming meanwhile).
    #[cfg(feature = "failpoints")]
    pub fn pause_next_recovery(&self, pause: crate::merge::ReclaimHook) -> Result<()> {
        *self
            .engine
            .writer()?
            .recovery_pause
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = Some(pause);
        Ok(())
    }

    /// Make the next record write (add, upsert, patch, tombstone of a store
    /// with record capabilities) await `pause` after its checks, before it
    /// writes (a reclaim racing it).
    #[cfg(feature = "failpoints")]
    pub fn pause_next_record_write(&self, pause: crate::merge::ReclaimHook) {
        *self
            .record_write_pause
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = Some(pause);
    }

    /// Make the next compaction attempt await `pause` after it read the
    /// version it compacts, before it compacts: a commit made meanwhile
    /// races its own.
    #[cfg(feature = "failpoints")]
    pub fn pause_next_compaction(&self, pause: crate::merge::ReclaimHook) {
        *self
            .engine
            .compaction_pause
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = Some(pause);
    }

    /// Make this store's next write fail after `puts` of its puts (of at
    /// most `max_memtable_rows` rows each) went through, as a crash would
    /// cut it (crash tests of writes split over several puts).
    #[cfg(feature = "failpoints")]
    pub fn fail_write_after_puts(&self, puts: usize) -> Result<()> {
        self.engine
            .writer()?
            .fail_after_puts
            .store(puts + 1, std::sync::atomic::Ordering::SeqCst);
        Ok(())
    }

    /// Bytes this store has read from the base table's object store since
    /// the last call (tests: a lookup through the key index reads little).
    #[cfg(feature = "failpoints")]
    pub async fn base_read_bytes(&self) -> u64 {
        let dataset = self.engine.dataset.read().await.clone();
        match dataset.object_store(None).await {
            Ok(store) => store.io_stats_incremental().read_bytes,
            Err(_) => 0,
        }
    }

    /// Apply the version retention policy now (maintenance runs it after
    /// merges and compactions, at most once per `retention.interval`); the
    /// number of versions removed.
    pub async fn apply_retention(&self) -> Result<u64> {
        self.engine.retain(true).await
    }

    /// What this handle's claims merged of other shards' generations, in
    /// sum: a single-writer handle takes over every other shard's unmerged
    /// generations when it opens or reclaims its writer (see
    /// [`ShardPolicy::SingleWriter`]).
    pub fn taken_over(&self) -> MergeStats {
        self.engine
            .taken_over
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Compact the base table's fragments (Lance compaction, index remap
    /// deferred), remap every index to the rows' new places and trim the
    /// fragment-reuse history the compaction left (see
    /// [`CompactionStats::fragment_reuse_versions`]), then re-ensure the
    /// indexes. A concurrent request gets [`Error::CompactionInProgress`].
    pub async fn compact(&self) -> Result<CompactionStats> {
        // A bucketed store compacts through its first owned bucket's handle,
        // whose guard its background compactions share.
        if let Some(store) = self.buckets.as_ref().and_then(|b| b.owned.values().next()) {
            return store.engine.compact().await;
        }
        self.engine.compact().await
    }

    /// Build the index of a declared vector column (IVF-PQ or IVF-HNSW-PQ, with
    /// the column's metric) over the base table. Merge first: rows still in
    /// generations are searched by brute force until they are merged.
    pub async fn build_vector_index(&self, column: &str) -> Result<()> {
        self.engine.build_vector_index(column).await
    }

    /// The rows nearest to `query.vector` in a declared vector column, by the
    /// column's metric, with a `_distance` column, nearest first. Searches the
    /// base table (through its vector index when built) and every unmerged
    /// generation; `query.filter` is applied first.
    /// On a store with record capabilities only visible rows are searched.
    /// A query vector is held to the rules of stored ones (every element
    /// finite, the sum of squares at most [`crate::MAX_VECTOR_SQUARED_NORM`],
    /// not all zero under cosine), so every distance returned is finite.
    pub async fn nearest(&self, query: &VectorQuery) -> Result<RecordBatch> {
        let hide = self.visibility_expr(&crate::read::Visibility::default())?;
        let declared = self.vector_column(&query.column)?;
        self.check_vector_query(declared, query)?;
        let hide = hide.as_ref();
        self.on_view(|view| async move {
            crate::read::nearest(
                &view,
                &self.schemas,
                declared,
                query,
                &self.engine.opener.store_params(),
                hide,
            )
            .await
        })
        .await
    }

    /// The rows best matching `query.query` in a declared text column, by
    /// BM25, with a `_score` column, best first (ties by key). Searches the
    /// base table through its full-text index and every unmerged generation,
    /// scoring both against one set of corpus statistics (see
    /// [`TextQuery`]); a row rewritten or deleted since the base never shows
    /// its old text. `query.filter` is applied first; on a store with record
    /// capabilities only visible rows are searched. A query with no term left
    /// after analysis (only stop words, say) finds nothing.
    pub async fn search_text(&self, query: &TextQuery) -> Result<RecordBatch> {
        let declared = self.text_column(&query.column)?;
        check_text_query(query)?;
        let hide = self.visibility_expr(&crate::read::Visibility::default())?;
        let hide = hide.as_ref();
        self.on_view(|view| async move {
            crate::read::search_text(
                &view,
                &self.schemas,
                declared,
                query,
                &self.engine.opener.store_params(),
                hide,
            )
            .await
        })
        .await
    }

    /// Hybrid retrieval: the vector leg and the text leg run on one view of
    /// the store, each with its own limit and `query.filter` (and its own
    /// filter, if any), and their hits are fused by reciprocal rank fusion
    /// (see [`RetrieveQuery`]). Each hit carries `_rrf_score`, and its rank
    /// and score in each leg (`_vector_rank`, `_distance`, `_text_rank`,
    /// `_score`; null where the leg did not find it).
    pub async fn retrieve(&self, query: &RetrieveQuery) -> Result<RecordBatch> {
        query.check()?;
        let and = |own: &Option<String>| match (&query.filter, own) {
            (Some(a), Some(b)) => Some(format!("({a}) AND ({b})")),
            (Some(a), None) => Some(a.clone()),
            (None, b) => b.clone(),
        };
        let vector = match &query.vector {
            Some(v) => {
                let mut v = v.clone();
                v.filter = and(&v.filter);
                let declared = self.vector_column(&v.column)?;
                self.check_vector_query(declared, &v)?;
                Some((v, declared))
            }
            None => None,
        };
        let text = match &query.text {
            Some(t) => {
                let mut t = t.clone();
                t.filter = and(&t.filter);
                let declared = self.text_column(&t.column)?;
                check_text_query(&t)?;
                Some((t, declared))
            }
            None => None,
        };
        let hide = self.visibility_expr(&crate::read::Visibility::default())?;
        let hide = hide.as_ref();
        let row_schema = self
            .schemas
            .conform_for_read(&RecordBatch::new_empty(self.schemas.stored.clone()), None)?
            .schema();
        let params = self.engine.opener.store_params();
        let (vector, text, params, row_schema) = (&vector, &text, &params, &row_schema);
        self.on_view(|view| async move {
            // The legs run together on the same view.
            let near = async {
                match vector {
                    Some((v, declared)) => {
                        crate::read::nearest(&view, &self.schemas, declared, v, params, hide)
                            .await
                            .map(Some)
                    }
                    None => Ok(None),
                }
            };
            let found = async {
                match text {
                    Some((t, declared)) => {
                        crate::read::search_text(&view, &self.schemas, declared, t, params, hide)
                            .await
                            .map(Some)
                    }
                    None => Ok(None),
                }
            };
            let (near, found) = futures::future::try_join(near, found).await?;
            crate::read::fuse(
                &self.schemas.key,
                row_schema,
                near.as_ref().map(|batch| crate::read::Leg {
                    batch,
                    score_column: lance::dataset::mem_wal::scanner::DISTANCE_COLUMN,
                }),
                found.as_ref().map(|batch| crate::read::Leg {
                    batch,
                    score_column: crate::SCORE_COLUMN,
                }),
                query.rrf_k,
                query.k,
            )
        })
        .await
    }

    /// `sql` and the typed `conditions` (see [`Condition`]) as one
    /// predicate over this store's columns; `None` when both are empty.
    pub fn filter_of(&self, sql: Option<&str>, conditions: &[Condition]) -> Result<Option<String>> {
        let typed = crate::read::compile_conditions(&self.schemas.logical, conditions)?;
        Ok(match (sql, typed) {
            (Some(a), Some(b)) => Some(format!("({a}) AND {b}")),
            (Some(a), None) => Some(a.to_string()),
            (None, b) => b,
        })
    }

    fn text_column(&self, column: &str) -> Result<&crate::config::TextColumn> {
        self.engine
            .settings
            .indexes
            .text_columns
            .iter()
            .find(|t| t.column == column)
            .ok_or_else(|| {
                let declared: Vec<&str> = self
                    .engine
                    .settings
                    .indexes
                    .text_columns
                    .iter()
                    .map(|t| t.column.as_str())
                    .collect();
                Error::invalid_argument(format!(
                    "'{column}' is not a declared text column (declared: {})",
                    if declared.is_empty() {
                        "none".to_string()
                    } else {
                        declared.join(", ")
                    }
                ))
            })
    }

    fn vector_column(&self, column: &str) -> Result<&crate::config::VectorColumn> {
        self.engine
            .settings
            .indexes
            .vector_columns
            .iter()
            .find(|v| v.column == column)
            .ok_or_else(|| {
                Error::invalid_argument(format!("'{column}' is not a declared vector column"))
            })
    }

    fn check_vector_query(
        &self,
        declared: &crate::config::VectorColumn,
        query: &VectorQuery,
    ) -> Result<()> {
        if query.vector.len() != declared.dimension {
            return Err(Error::invalid_argument(format!(
                "query has {} dimensions, column '{}' has {}",
                query.vector.len(),
                query.column,
                declared.dimension
            )));
        }
        // A distance that overflows reads as null (inf) or ranks anywhere
        // (NaN): refused, as for stored vectors.
        if let Err(problem) = input::check_vector(&query.vector, declared.metric) {
            return Err(Error::invalid_argument(format!("query vector: {problem}")));
        }
        Ok(())
    }

    /// The base table's versions that retention has kept, oldest first: what
    /// [`StoreConfig::with_as_of`] can open.
    pub async fn versions(&self) -> Result<Vec<VersionInfo>> {
        let dataset = self.engine.fresh_dataset().await?;
        let current = dataset.version().version;
        let versions = dataset
            .versions()
            .await
            .map_err(|e| Error::from_lance("listing versions", None, e))?;
        Ok(versions
            .into_iter()
            .map(|v| VersionInfo {
                version: v.version,
                timestamp_micros: v.timestamp.timestamp_micros(),
                current: v.version == current,
            })
            .collect())
    }

    /// Operator statistics: rows, fragments, pending generations, indexes and
    /// their coverage, last merge and compaction.
    pub async fn stats(&self) -> Result<StoreStats> {
        let mut stats = self.engine.stats(self.maintenance()).await?;
        if let Some(buckets) = &self.buckets {
            stats.buckets = buckets.count;
            stats.owned_buckets = buckets.owned_list();
            // Maintenance runs on the bucket handles: what they did.
            for store in buckets.owned.values() {
                let theirs = store.engine.stats_of_maintenance();
                stats.last_merge = stats.last_merge.max(theirs.0);
                stats.last_compaction = stats.last_compaction.max(theirs.1);
                stats.compactions += theirs.2;
                if stats.last_background_error.is_none() {
                    stats.last_background_error = theirs.3;
                }
            }
        } else if let Some(count) = self.read_buckets {
            stats.buckets = count;
        }
        Ok(stats)
    }

    /// Whether background maintenance runs on this handle, and if not why.
    pub fn maintenance(&self) -> crate::MaintenanceState {
        use crate::MaintenanceState::{Off, Paused, Running};
        let off = |reason: &str| Off {
            reason: reason.to_string(),
        };
        if let Some(buckets) = &self.buckets {
            // Running when every owned bucket's maintenance runs; else the
            // first bucket's reason that does not.
            for (bucket, store) in &buckets.owned {
                match store.maintenance() {
                    Running => {}
                    Paused { reason } => {
                        return Paused {
                            reason: format!("bucket {bucket}: {reason}"),
                        };
                    }
                    Off { reason } => {
                        return Off {
                            reason: format!("bucket {bucket}: {reason}"),
                        };
                    }
                }
            }
            return match buckets.owned.is_empty() {
                true => off("this instance owns none of the store's buckets (it reads only)"),
                false => Running,
            };
        }
        let Some(writer) = self.engine.writer.as_ref() else {
            return off("opened read-only");
        };
        let running = self
            .background
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
            .map(|b| !b.is_finished());
        match running {
            None if Background::wanted(&self.engine) => off("the store is closed"),
            None => off("no merge or compaction trigger is configured (manual maintenance)"),
            Some(false) => off("the maintenance task ended unexpectedly (see the log)"),
            Some(true) => match writer.latched() {
                None => Running,
                Some(crate::FenceReason::PeerClaimedEpoch) => Paused {
                    reason: "another instance claimed this shard: reclaim or reopen the store"
                        .to_string(),
                },
                Some(crate::FenceReason::PersistenceFailure) => Paused {
                    reason: "the writer is taking its shard back after a failed WAL write"
                        .to_string(),
                },
            },
        }
    }

    /// Take the shard back after [`Error::Fenced`]: claims a new epoch (replaying
    /// the WAL); under `SingleWriter` then takes every other shard over (the
    /// writer that fenced this one is fenced in turn). Adds are refused
    /// (`Fenced`) until all of that succeeded, so no add is acknowledged while
    /// another writer can still write; if it fails, the store stays fenced
    /// and `reclaim` can be called again. Only call this when this instance
    /// is the rightful owner.
    pub async fn reclaim(&self) -> Result<()> {
        if let Some(buckets) = &self.buckets {
            // Only the buckets whose writer lost its shard: claiming the
            // others again would fence nobody but could race a peer.
            for store in buckets.owned.values() {
                let latched = store
                    .engine
                    .writer
                    .as_ref()
                    .is_some_and(|w| w.latched().is_some());
                if latched {
                    Box::pin(store.reclaim()).await?;
                }
            }
            return Ok(());
        }
        self.reclaim_inner(
            #[cfg(feature = "failpoints")]
            None,
        )
        .await
    }

    /// [`Self::reclaim`], awaiting `hook` after the shard is claimed and
    /// before the other shards are taken over (interleaving tests).
    #[cfg(feature = "failpoints")]
    pub async fn reclaim_with_hook(&self, hook: crate::merge::ReclaimHook) -> Result<()> {
        self.reclaim_inner(Some(hook)).await
    }

    async fn reclaim_inner(
        &self,
        #[cfg(feature = "failpoints")] hook: Option<crate::merge::ReclaimHook>,
    ) -> Result<()> {
        let writer = self.engine.writer()?;
        let result = self
            .reclaim_steps(
                writer,
                #[cfg(feature = "failpoints")]
                hook,
            )
            .await;
        // Maintenance restarts whatever happened: after a failed reclaim the
        // writer stays latched, and the task skips its triggers until a
        // reclaim succeeds.
        if let Some(background) = Background::start(&self.engine) {
            let old = self
                .background
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .replace(background);
            if let Some(old) = old {
                old.abort();
            }
        }
        result
    }

    async fn reclaim_steps(
        &self,
        writer: &crate::writer::Writer,
        #[cfg(feature = "failpoints")] hook: Option<crate::merge::ReclaimHook>,
    ) -> Result<()> {
        // A record write in flight checked its rows under the old claim: it
        // finishes (on the fenced writer, so it fails) before the shard is
        // taken back, never writes under the new claim what a peer's writes
        // meanwhile made wrong.
        let _records = self.record_lock.lock().await;
        self.stop_background();
        let dataset = self.engine.opener.open().await?;
        let claim = writer.reclaim(&dataset).await?;
        #[cfg(feature = "failpoints")]
        if let Some(hook) = hook {
            hook().await;
        }
        if self.shard_policy == ShardPolicy::SingleWriter {
            self.engine.take_over_other_shards(&dataset).await?;
        }
        writer.unlatch(claim);
        Ok(())
    }

    /// Scan as a stream of batches in the logical schema. A store with record
    /// capabilities shows only visible rows unless the request's
    /// [`crate::Visibility`] says otherwise.
    pub async fn scan_stream(&self, request: ScanRequest) -> Result<BatchStream> {
        let (request, hide) = self.with_visibility(request)?;
        let view = self.engine.view().await?;
        let (plan, projection) =
            plan_scan(&view, &self.schemas, &request, None, hide.as_ref()).await?;
        execute(plan, self.schemas.clone(), projection)
    }

    /// Scan into one batch.
    pub async fn scan(&self, request: ScanRequest) -> Result<RecordBatch> {
        self.scan_matching(request, None).await
    }

    /// [`Self::scan`], with `matching` — an expression built by the engine,
    /// never parsed from text — joined to the request's filter.
    pub(crate) async fn scan_matching(
        &self,
        request: ScanRequest,
        matching: Option<lance::deps::datafusion::logical_expr::Expr>,
    ) -> Result<RecordBatch> {
        let schema = self.output_schema(request.projection.as_deref())?;
        let (request, hide) = self.with_visibility(request)?;
        let (request, matching, hide) = (&request, matching.as_ref(), hide.as_ref());
        let batches = self
            .on_view(|view| async move {
                let (plan, projection) =
                    plan_scan(&view, &self.schemas, request, matching, hide).await?;
                collect(execute(plan, self.schemas.clone(), projection)?).await
            })
            .await?;
        Ok(concat_batches(&schema, &batches)?)
    }

    /// Run a read on a fresh view. A read slower than `merge.cleanup_grace`
    /// may find a generation it listed merged and removed meanwhile (a file
    /// is gone, found missing while the plan is made or while it runs); when
    /// the base table has moved on since the view was taken, the read runs
    /// again on a new view, which no longer lists it — up to [`READ_AGAIN`]
    /// times, as long as the base keeps moving. (A streamed scan cannot be
    /// re-run part-way; it fails with [`ErrorKind::NotFound`].)
    async fn on_view<T, F, Fut>(&self, read: F) -> Result<T>
    where
        F: Fn(ReadView) -> Fut,
        Fut: std::future::Future<Output = Result<T>>,
    {
        read_on_view(&self.engine, None, self.take_read_pause(), read).await
    }

    /// The pause the next read awaits (failpoints), taken.
    #[cfg(feature = "failpoints")]
    pub(crate) fn take_read_pause(&self) -> Option<crate::merge::ReclaimHook> {
        self.read_pause
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
    }

    #[cfg(not(feature = "failpoints"))]
    pub(crate) fn take_read_pause(&self) -> Option<crate::merge::ReclaimHook> {
        None
    }

    /// The plan a scan would run, for operators (`EXPLAIN`).
    pub async fn explain(&self, request: ScanRequest) -> Result<String> {
        let (request, hide) = self.with_visibility(request)?;
        let view = self.engine.view().await?;
        let (plan, _) = plan_scan(&view, &self.schemas, &request, None, hide.as_ref()).await?;
        Ok(displayable(plan.as_ref()).indent(true).to_string())
    }

    /// The plan a lookup of `ids` runs (operators and tests: a lookup probes
    /// the base table through its key index when it has one).
    pub async fn explain_lookup(&self, ids: &[&str]) -> Result<String> {
        let view = self.engine.view().await?;
        let plan = plan_lookup(&view, &self.schemas, ids, None).await?;
        Ok(displayable(plan.as_ref()).indent(true).to_string())
    }

    /// Rows matching `filter` (all rows when `None`), newest version per key.
    /// Without a filter or record capabilities this reads no rows of the base
    /// table: its count comes from fragment metadata, adjusted by the keys of
    /// the unmerged generations (new keys added, deleted ones taken away).
    ///
    /// With record capabilities and no filter, the base table's visible rows
    /// are counted on their own (the visibility columns of the base table,
    /// no newest-version folding — its keys are unique), remembered for that
    /// base version until the next row in it expires, and adjusted by the
    /// unmerged generations' keys the same way.
    pub async fn count(&self, filter: Option<&str>) -> Result<u64> {
        if filter.is_none() && self.capabilities == RecordCapabilities::default() {
            return self
                .on_view(|view| async move {
                    let base = view
                        .dataset
                        .count_rows(None)
                        .await
                        .map_err(|e| Error::from_lance("counting rows", None, e))?
                        as u64;
                    crate::read::count_all(
                        &view,
                        &self.schemas.key,
                        &self.engine.opener,
                        base,
                        None,
                    )
                    .await?
                    .ok_or_else(|| Error::internal("a count without visibility rules gave up"))
                })
                .await;
        }
        if filter.is_none()
            && let Some(n) = self.count_visible().await?
        {
            return Ok(n);
        }
        let mut request = ScanRequest::new().project([self.schemas.key.clone()]);
        request.filter = filter.map(str::to_string);
        let (request, hide) = self.with_visibility(request)?;
        let (request, hide) = (&request, hide.as_ref());
        self.on_view(|view| async move {
            let (plan, projection) = plan_scan(&view, &self.schemas, request, None, hide).await?;
            let mut stream = execute(plan, self.schemas.clone(), projection)?;
            let mut rows = 0u64;
            while let Some(batch) = futures::StreamExt::next(&mut stream).await {
                rows += batch?.num_rows() as u64;
            }
            Ok(rows)
        })
        .await
    }

    /// The row with key `id`, newest version, as a one-row batch.
    pub async fn get(&self, id: &str) -> Result<Option<RecordBatch>> {
        let batch = self.get_many(&[id]).await?;
        Ok((batch.num_rows() > 0).then_some(batch))
    }

    /// The rows with these keys (newest version each), in the order the keys are
    /// given; keys not found are skipped and repeated keys returned once. A
    /// point lookup: the base table is probed through its key index when it has
    /// one, and each unmerged generation by key — never a full scan.
    pub async fn get_many(&self, ids: &[&str]) -> Result<RecordBatch> {
        self.lookup(ids, None).await
    }

    /// [`Self::get_many`] returning only `projection`'s columns. With the
    /// tombstones capability a deleted key reads as absent (no other
    /// visibility rule applies to lookups by key).
    pub async fn lookup(&self, ids: &[&str], projection: Option<&[String]>) -> Result<RecordBatch> {
        if self.capabilities.tombstones {
            return self.lookup_live(ids, projection).await;
        }
        self.lookup_any(ids, projection).await
    }

    /// Lookup by key, tombstones included.
    pub(crate) async fn lookup_any(
        &self,
        ids: &[&str],
        projection: Option<&[String]>,
    ) -> Result<RecordBatch> {
        if ids.is_empty() {
            return Ok(RecordBatch::new_empty(self.output_schema(projection)?));
        }
        // Rows are ordered (and repeats dropped) by key: a projection
        // without the key reads it too, and it is dropped at the end.
        let key = &self.schemas.key;
        let with_key: Option<Vec<String>> = projection
            .filter(|p| !p.contains(key))
            .map(|p| p.iter().chain([key]).cloned().collect());
        let projection = with_key.as_deref().or(projection);
        let schema = self.output_schema(projection)?;
        // The stored columns asked for (those the dataset lacks come back
        // null).
        let stored: Vec<String> = match projection {
            Some(columns) => columns
                .iter()
                .filter(|c| self.schemas.stored.field_with_name(c).is_ok())
                .cloned()
                .collect(),
            None => self.schemas.readable_columns(),
        };
        let stored = stored.as_slice();
        let batches = self
            .on_view(|view| async move {
                // With a small unmerged tier (or none), from the held
                // generations and the base table's key index, not a lookup
                // per generation.
                let read = crate::read::KeyedRead {
                    column: &self.schemas.key,
                    values: ids,
                    hide: None,
                    columns: stored,
                    small_tier_only: true,
                };
                if let Some(rows) = self.keyed(&view, read).await? {
                    return Ok(vec![self.schemas.conform_for_read(&rows, projection)?]);
                }
                let plan = plan_lookup(&view, &self.schemas, ids, projection).await?;
                collect(execute(
                    plan,
                    self.schemas.clone(),
                    projection.map(<[String]>::to_vec),
                )?)
                .await
            })
            .await?;
        let found = concat_batches(&schema, &batches)?;
        let ordered = order_by_keys(&found, key, ids)?;
        match with_key {
            Some(_) => without_column(&ordered, key),
            None => Ok(ordered),
        }
    }

    /// Unmerged generations per shard. Every add makes at most one generation
    /// (concurrent adds share one); until they are merged into the base table
    /// each read opens all of them.
    pub async fn wal_status(&self) -> Result<WalStatus> {
        let view = self.engine.view().await?;
        Ok(WalStatus {
            shard: self.shard_id(),
            unmerged_generations: view
                .shards
                .iter()
                .map(|s| (s.snapshot.shard_id, s.unmerged))
                .collect(),
        })
    }

    /// The background maintenance task, taken (none runs afterwards).
    fn take_background(&self) -> Option<Background> {
        self.background
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
    }

    /// Abort the background maintenance task, without waiting for it.
    fn stop_background(&self) {
        if let Some(background) = self.take_background() {
            background.abort();
        }
    }

    /// Flush and release the writer. Reads keep working; adds fail with
    /// [`Error::WriterUnavailable`].
    pub async fn close(&self) -> Result<()> {
        if let Some(buckets) = &self.buckets {
            let mut first_error = None;
            for store in buckets.owned.values() {
                if let Err(e) = Box::pin(store.close()).await {
                    first_error.get_or_insert(e);
                }
            }
            self.engine.held.stop_warming();
            return first_error.map_or(Ok(()), Err);
        }
        self.engine.held.stop_warming();
        let background = self.take_background();
        if let Some(background) = background {
            background.stop().await;
        }
        match &self.engine.writer {
            Some(writer) => writer.close().await,
            None => Ok(()),
        }
    }

    fn output_schema(&self, projection: Option<&[String]>) -> Result<SchemaRef> {
        let empty = RecordBatch::new_empty(self.schemas.stored.clone());
        Ok(self.schemas.conform_for_read(&empty, projection)?.schema())
    }
}

impl Drop for Store {
    fn drop(&mut self) {
        // Never blocks: every acknowledged row is already in a generation, so
        // only background work needs stopping (the writer stops its own tasks
        // when the engine goes).
        self.stop_background();
        self.engine.held.stop_warming();
    }
}

const NO_BUCKETED_RECORDS: &str = "record capabilities (tombstones, supersession, lifecycle, \
     unique keys, secondary-key upserts) are not available on a bucketed store: their checks \
     read and write across keys, so across buckets";

/// The bucket count `config` asks for at create: `None` for none (1);
/// [`Error::InvalidArgument`] outside 1..=1024 (Lance's bound).
fn check_bucket_count(config: &StoreConfig) -> Result<Option<u32>> {
    match config.buckets {
        0 => Err(Error::invalid_argument(
            "buckets must be at least 1 (1 is no bucket sharding)",
        )),
        1 => Ok(None),
        n if n > 1024 => Err(Error::invalid_argument(format!(
            "buckets must be at most 1024, got {n}"
        ))),
        _ if config.capabilities != RecordCapabilities::default() => {
            Err(Error::invalid_argument(NO_BUCKETED_RECORDS))
        }
        n => Ok(Some(n)),
    }
}

/// `batch` without its column `name` (one a read added for its own use).
pub(crate) fn without_column(batch: &RecordBatch, name: &str) -> Result<RecordBatch> {
    let at = batch.schema().index_of(name)?;
    let keep: Vec<usize> = (0..batch.num_columns()).filter(|&i| i != at).collect();
    Ok(batch.project(&keep)?)
}

/// Reorder `found` to follow `ids` (first occurrence), dropping repeats.
fn order_by_keys(found: &RecordBatch, key: &str, ids: &[&str]) -> Result<RecordBatch> {
    if found.num_rows() <= 1 {
        return Ok(found.clone());
    }
    let keys = found
        .column_by_name(key)
        .and_then(|c| c.as_any().downcast_ref::<StringArray>())
        .ok_or_else(|| Error::internal("lookup result lacks the key column"))?;
    let mut position: HashMap<&str, u32> = HashMap::with_capacity(keys.len());
    for (row, k) in keys.iter().enumerate() {
        if let Some(k) = k {
            position.entry(k).or_insert(row as u32);
        }
    }
    let mut seen = std::collections::HashSet::new();
    let indices: Vec<u32> = ids
        .iter()
        .filter(|id| seen.insert(**id))
        .filter_map(|id| position.get(id).copied())
        .collect();
    let indices = arrow_array::UInt32Array::from(indices);
    let columns = found
        .columns()
        .iter()
        .map(|c| arrow_select::take::take(c.as_ref(), &indices, None))
        .collect::<std::result::Result<Vec<_>, _>>()?;
    Ok(RecordBatch::try_new(found.schema(), columns)?)
}

/// Check a schema for a new store and tag its key column.
fn validate_new_schema(schema: &Schema, key: &str) -> Result<SchemaRef> {
    let Ok(index) = schema.index_of(key) else {
        return Err(Error::invalid_argument(format!(
            "the schema has no key column '{key}'"
        )));
    };
    let fields: Vec<Field> = schema
        .fields()
        .iter()
        .enumerate()
        .map(|(i, f)| {
            let f = f.as_ref().clone();
            if i != index {
                return Ok(f);
            }
            check_key_field(&f)?;
            let mut metadata = f.metadata().clone();
            metadata.insert(PRIMARY_KEY_METADATA.to_string(), "true".to_string());
            Ok(f.with_metadata(metadata))
        })
        .collect::<Result<_>>()?;
    Ok(Arc::new(Schema::new_with_metadata(
        fields,
        schema.metadata().clone(),
    )))
}

fn check_key_field(field: &Field) -> Result<()> {
    if field.data_type() != &DataType::Utf8 {
        return Err(Error::invalid_argument(format!(
            "key column '{}' must be Utf8, found {}",
            field.name(),
            field.data_type()
        )));
    }
    if field.is_nullable() {
        return Err(Error::invalid_argument(format!(
            "key column '{}' must be non-nullable",
            field.name()
        )));
    }
    Ok(())
}

/// Reconcile the caller's expected schema with the stored one.
fn resolve_schemas(config: &StoreConfig, stored: SchemaRef) -> Result<Schemas> {
    let key = config.key_column.clone();
    let stored_key = stored
        .field_with_name(&key)
        .map_err(|_| Error::invalid_argument(format!("the dataset has no key column '{key}'")))?;
    check_key_field(stored_key)?;
    if stored_key
        .metadata()
        .get(PRIMARY_KEY_METADATA)
        .map(String::as_str)
        != Some("true")
    {
        return Err(Error::invalid_argument(format!(
            "the dataset's key column '{key}' is not tagged {PRIMARY_KEY_METADATA}=true"
        )));
    }
    let logical = match &config.schema {
        None => stored.clone(),
        Some(expected) => {
            for field in expected.fields() {
                if let Ok(s) = stored.field_with_name(field.name())
                    && !s.data_type().equals_datatype(field.data_type())
                {
                    return Err(Error::invalid_argument(format!(
                        "column '{}' is {} in the dataset but {} in the expected schema",
                        field.name(),
                        s.data_type(),
                        field.data_type()
                    )));
                }
            }
            if expected.field_with_name(&key).is_err() {
                return Err(Error::invalid_argument(format!(
                    "the expected schema has no key column '{key}'"
                )));
            }
            expected.clone()
        }
    };
    Ok(Schemas {
        logical,
        stored,
        key,
    })
}

/// One kept version of the base table (see [`Store::versions`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VersionInfo {
    /// The dataset version number.
    pub version: u64,
    /// When it was committed, in microseconds since the epoch (UTC).
    pub timestamp_micros: i64,
    /// Whether it is the version this handle reads (the latest, or the one
    /// it was opened at).
    pub current: bool,
}

/// A text query's own limits: its text at most [`crate::MAX_TEXT_QUERY`]
/// bytes.
fn check_text_query(query: &TextQuery) -> Result<()> {
    if query.query.len() > crate::MAX_TEXT_QUERY {
        return Err(Error::invalid_argument(format!(
            "the query text is {} bytes; at most {} are accepted",
            query.query.len(),
            crate::MAX_TEXT_QUERY
        )));
    }
    Ok(())
}
