//! Store configuration.

use std::collections::HashMap;
use std::time::Duration;

use arrow_schema::SchemaRef;

/// How a store is opened or created. Build one with [`StoreConfig::new`] and the
/// `with_*` methods. Its `Debug` output shows the storage options' keys only
/// (their values are credentials).
#[derive(Clone)]
pub struct StoreConfig {
    /// Dataset location: a local path or an object-store URI (`s3://…`).
    pub uri: String,
    /// Object-store options (credentials, endpoint, region, …). They reach every
    /// open of the dataset and of its WAL generations.
    pub storage_options: HashMap<String, String>,
    /// The key column: Utf8, non-null, the MemWAL merge key. Default `id`.
    pub key_column: String,
    /// This instance's name; its MemWAL shard is derived from it. Default `default`.
    pub instance_id: String,
    /// The logical schema. Required to create; when opening, the schema the
    /// caller expects (columns the dataset lacks read back as nulls). When
    /// `None` on open, the dataset's schema is used.
    pub schema: Option<SchemaRef>,
    /// Writer settings.
    pub writer: WriterSettings,
    /// Whether other instances' shards may hold unmerged rows when this one
    /// opens its writer. See [`ShardPolicy`].
    pub shard_policy: ShardPolicy,
    /// WAL → base merge.
    pub merge: MergeSettings,
    /// Base-table compaction.
    pub compaction: CompactionSettings,
    /// Key and vector indexes.
    pub indexes: IndexSettings,
    /// Record semantics the schema opts into (tombstones, supersession,
    /// lifecycle, unique keys). None by default.
    pub capabilities: RecordCapabilities,
    /// Which old versions of the base table maintenance keeps.
    pub retention: RetentionSettings,
    /// Time travel: read the base table as it was at this dataset version
    /// (see [`StoreConfig::with_as_of`]). Only a read-only open takes one.
    pub as_of: Option<u64>,
    /// Bucket sharding, at create: the number of buckets the key column is
    /// hashed into (1, the default, is no bucket sharding). See
    /// [`StoreConfig::with_buckets`].
    pub buckets: u32,
    /// Bucket sharding, at a writable open of a bucketed store: the buckets
    /// this instance writes (`None`, the default: all of them). See
    /// [`StoreConfig::with_owned_buckets`].
    pub owned_buckets: Option<Vec<u32>>,
}

impl std::fmt::Debug for StoreConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut keys: Vec<&String> = self.storage_options.keys().collect();
        keys.sort();
        f.debug_struct("StoreConfig")
            .field("uri", &self.uri)
            .field("storage_option_keys", &keys)
            .field("key_column", &self.key_column)
            .field("instance_id", &self.instance_id)
            .field("schema", &self.schema)
            .field("writer", &self.writer)
            .field("shard_policy", &self.shard_policy)
            .field("merge", &self.merge)
            .field("compaction", &self.compaction)
            .field("indexes", &self.indexes)
            .field("capabilities", &self.capabilities)
            .field("retention", &self.retention)
            .field("as_of", &self.as_of)
            .field("buckets", &self.buckets)
            .field("owned_buckets", &self.owned_buckets)
            .finish()
    }
}

impl StoreConfig {
    /// A config for `uri` with every default.
    pub fn new(uri: impl Into<String>) -> Self {
        Self {
            uri: uri.into(),
            storage_options: HashMap::new(),
            key_column: "id".to_string(),
            instance_id: "default".to_string(),
            schema: None,
            writer: WriterSettings::default(),
            shard_policy: ShardPolicy::SingleWriter,
            merge: MergeSettings::default(),
            compaction: CompactionSettings::default(),
            indexes: IndexSettings::default(),
            capabilities: RecordCapabilities::default(),
            retention: RetentionSettings::default(),
            as_of: None,
            buckets: 1,
            owned_buckets: None,
        }
    }

    /// Bucket sharding (scale-out), chosen when the store is created: the
    /// key column is hashed into `buckets` buckets (Lance's MemWAL bucket
    /// sharding spec: murmur3 of the key, as LanceDB and lance-spark
    /// route), and each bucket is written through a shard of its own. Any
    /// number of instances may write the store at once, each owning a
    /// disjoint set of buckets ([`StoreConfig::with_owned_buckets`]): a key
    /// is always written through its bucket's shard, so it is never read
    /// twice whichever instance wrote it. 1 to 1024; 1 (the default) is no
    /// bucket sharding. The count is recorded in the dataset and cannot be
    /// changed; on open, a count other than 1 must match it. Record
    /// capabilities are not available on a bucketed store (their checks
    /// read and write across keys, so across buckets).
    pub fn with_buckets(mut self, buckets: u32) -> Self {
        self.buckets = buckets;
        self
    }

    /// The buckets of a bucketed store this instance writes; `None` (the
    /// default) is every bucket. Taking a bucket claims its shard: a writer
    /// elsewhere still holding it is fenced and its acknowledged rows are
    /// replayed. An add with a row of a bucket not owned here is refused
    /// whole ([`crate::Error::NotOwner`]); reads see every bucket. Buckets
    /// beyond the store's count are ignored, so one list can serve stores
    /// of different counts; a store with no buckets ignores the list.
    pub fn with_owned_buckets(mut self, buckets: Option<Vec<u32>>) -> Self {
        self.owned_buckets = buckets;
        self
    }

    /// Time travel: read the base table as it was when dataset version
    /// `version` was committed (`Store::versions` lists them). Only
    /// [`crate::Store::open_read_only`] takes it (a writable open refuses).
    /// A version holds what was merged into the base table by then: rows still
    /// in the write-ahead tier at that moment are not part of it, and reads
    /// at a version never look at the write-ahead tier. A version that
    /// retention removed is [`crate::Error::NotFound`].
    pub fn with_as_of(mut self, version: u64) -> Self {
        self.as_of = Some(version);
        self
    }

    /// Set the version retention.
    pub fn with_retention(mut self, retention: RetentionSettings) -> Self {
        self.retention = retention;
        self
    }

    /// Set the record capabilities.
    pub fn with_capabilities(mut self, capabilities: RecordCapabilities) -> Self {
        self.capabilities = capabilities;
        self
    }

    /// Set the merge settings.
    pub fn with_merge(mut self, merge: MergeSettings) -> Self {
        self.merge = merge;
        self
    }

    /// Set the compaction settings.
    pub fn with_compaction(mut self, compaction: CompactionSettings) -> Self {
        self.compaction = compaction;
        self
    }

    /// No background maintenance: no merge triggers and no background
    /// compaction; the caller runs `merge` and `compact` itself.
    pub fn with_manual_maintenance(mut self) -> Self {
        self.merge.generation_threshold = None;
        self.merge.interval = None;
        self.compaction.interval = None;
        self
    }

    /// Set the index settings.
    pub fn with_indexes(mut self, indexes: IndexSettings) -> Self {
        self.indexes = indexes;
        self
    }

    /// Set the logical schema.
    pub fn with_schema(mut self, schema: SchemaRef) -> Self {
        self.schema = Some(schema);
        self
    }

    /// Set the storage options.
    pub fn with_storage_options(mut self, options: HashMap<String, String>) -> Self {
        self.storage_options = options;
        self
    }

    /// Set one storage option.
    pub fn with_storage_option(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.storage_options.insert(key.into(), value.into());
        self
    }

    /// Set the key column.
    pub fn with_key_column(mut self, key: impl Into<String>) -> Self {
        self.key_column = key.into();
        self
    }

    /// Set the instance id (and so the shard this instance writes through).
    pub fn with_instance_id(mut self, instance_id: impl Into<String>) -> Self {
        self.instance_id = instance_id.into();
        self
    }

    /// Set the writer settings.
    pub fn with_writer(mut self, writer: WriterSettings) -> Self {
        self.writer = writer;
        self
    }

    /// Set the shard policy.
    pub fn with_shard_policy(mut self, policy: ShardPolicy) -> Self {
        self.shard_policy = policy;
        self
    }
}

/// Lance dedupes a key only within one shard: a key written through two shards is
/// read back twice. This policy says how the engine guards against that.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ShardPolicy {
    /// The default: one writing instance per dataset at a time. Opening (or
    /// reclaiming) a writer takes every *other* shard over — claims it,
    /// fencing any writer still on it, replays its WAL tail and merges it —
    /// because two shards could hold the same key; when that fails the open
    /// is refused with [`crate::Error::ShardConflict`].
    #[default]
    SingleWriter,
    /// Several instances write the dataset at once, each through its own shard.
    /// The caller guarantees that a key is only ever written by one instance
    /// (route keys by instance); the engine does not check.
    PartitionedKeys,
}

/// Settings of the resident MemWAL writer.
#[derive(Debug, Clone)]
pub struct WriterSettings {
    /// How often the WAL buffer is flushed. A durable put waits for the next
    /// flush (the freeze that follows each write also flushes it), so this
    /// bounds the durability part of an add's latency. Lance's default is
    /// 100 ms; ours is 5 ms. Must be > 0.
    pub wal_flush_interval: Duration,
    /// Largest number of rows one memtable holds, and so one atomic write.
    /// An add (or delete) with more rows is written as several puts; a reader
    /// may see a prefix of such an add before it returns (a full memtable is
    /// flushed as it fills), and a crash part-way can leave a prefix durable
    /// (retrying the add is safe: newest wins). With record capabilities, rows
    /// that must become visible together — a new version and the record it
    /// supersedes, rows sharing a key — always go into the same put.
    pub max_memtable_rows: usize,
    /// Bytes of unflushed memtables before writes are held back.
    pub max_unflushed_bytes: usize,
}

impl Default for WriterSettings {
    fn default() -> Self {
        Self {
            wal_flush_interval: Duration::from_millis(5),
            max_memtable_rows: 100_000,
            max_unflushed_bytes: 1 << 30,
        }
    }
}

/// WAL → base merge settings.
#[derive(Debug, Clone)]
pub struct MergeSettings {
    /// Bytes of rows the merge holds in memory at once. A merge of more is done
    /// in several passes, each an atomic commit recording its own last
    /// generation as merged.
    pub batch_budget_bytes: usize,
    /// Merge when this instance's shard has at least this many unmerged
    /// generations (checked after each add). `None` = no count trigger.
    pub generation_threshold: Option<usize>,
    /// Once the count trigger is reached, the merge waits until no add has
    /// come for this long, so that a burst of adds does not share the
    /// machine with a merge (a merge beside back-to-back single-record adds
    /// cost each ~1 ms of 9 on 2 cores, `lance-context dev bench-peer`). An
    /// agent adding a record after each step is merged between its steps.
    /// Zero: merge as soon as the threshold is reached.
    pub quiet_before_merge: Duration,
    /// Unmerged generations at which the count trigger merges without
    /// waiting for a pause (adds that never pause still get merged; every
    /// read opens every unmerged generation). `None`: wait for the pause —
    /// but never longer than `interval`, nor once adds are refused as busy
    /// (`max_unmerged_generations`). Default 64 (4× the threshold).
    pub merge_without_pause_at: Option<usize>,
    /// Merge every this often in the background. `None` = no time trigger.
    pub interval: Option<Duration>,
    /// How long merged generations and replayed WAL entries are kept after the
    /// merge, for readers still holding an older snapshot: set it above the
    /// longest read, streamed scans included. Must be greater than zero (zero
    /// would delete what a running read is about to open). Measured from the
    /// merge's commit, as recorded beside the dataset, so any process's
    /// maintenance honours it. Default 15 minutes, as long as retention keeps
    /// old base versions (`RetentionSettings::keep_for`): a read that may run
    /// that long keeps both what it opened in the base and in the WAL tier.
    pub cleanup_grace: Duration,
    /// Unmerged generations of this instance's shard beyond which `add`
    /// answers `Busy` instead of writing (merges are failing or cannot keep
    /// up, and every read opens every unmerged generation). `None`: no bound.
    pub max_unmerged_generations: Option<usize>,
    /// How old a shard manifest version must be before cleanup removes it
    /// (the newest 16 are always kept). Default two hours: a Lance shard
    /// writer builds its next manifest on a position it confirmed up to an
    /// hour ago, so a version younger than that could be written again by a
    /// stale writer once removed. Lower it only where no writer can be stale
    /// (tests; one-shot batch jobs).
    pub manifest_prune_age: Duration,
    /// A merge pass finds which of its keys the base already holds through
    /// the key index while the pass holds fewer rows than this fraction of
    /// the base's rows (a few lookups into a large table); a larger pass
    /// reads the base's key column once and joins in memory, which is far
    /// faster than a lookup per row (a first merge of 1M records into an
    /// empty base, a bulk load). Default 0.01; 0 always joins in memory.
    pub key_lookup_below: f64,
}

impl Default for MergeSettings {
    fn default() -> Self {
        Self {
            batch_budget_bytes: 64 << 20,
            generation_threshold: Some(16),
            quiet_before_merge: Duration::from_millis(100),
            merge_without_pause_at: Some(64),
            interval: Some(Duration::from_secs(30)),
            cleanup_grace: Duration::from_secs(15 * 60),
            max_unmerged_generations: Some(256),
            manifest_prune_age: Duration::from_secs(2 * 3600),
            key_lookup_below: 0.01,
        }
    }
}

/// Which old versions of the base table maintenance (merge, compaction)
/// removes: a version goes when it is neither among the newest
/// `keep_versions` nor younger than `keep_for`. Defaults: 2 versions, 15
/// minutes. Old versions serve time travel and readers holding an older
/// snapshot (any reader younger than `keep_for` is safe whatever
/// `keep_versions` says); every kept version keeps the data files it
/// references — at 10 versions a store merged often held ~3× its table's
/// size on disk, at 2 about 1.5× (`lance-context dev bench --retention-merges`).
#[derive(Debug, Clone)]
pub struct RetentionSettings {
    /// The newest versions always kept (at least 1).
    pub keep_versions: usize,
    /// Versions younger than this are kept.
    pub keep_for: Duration,
    /// Maintenance applies the policy at most this often per store handle.
    pub interval: Duration,
}

impl Default for RetentionSettings {
    fn default() -> Self {
        Self {
            keep_versions: 2,
            keep_for: Duration::from_secs(15 * 60),
            interval: Duration::from_secs(5 * 60),
        }
    }
}

/// Compaction settings (Lance fragment compaction of the base table).
#[derive(Debug, Clone)]
pub struct CompactionSettings {
    /// Fragments smaller than this are candidates.
    pub target_rows_per_fragment: usize,
    /// Rows per group in rewritten files.
    pub max_rows_per_group: usize,
    /// Rewrite fragments whose deleted fraction exceeds `deletion_threshold`.
    pub materialize_deletions: bool,
    /// See `materialize_deletions`.
    pub deletion_threshold: f32,
    /// Check every this often in the background. `None` = no background task.
    pub interval: Option<Duration>,
    /// The background task compacts when there are at least this many fragments…
    pub min_fragments: usize,
    /// …or when at least this fraction of fragments is small.
    pub small_fragment_ratio: f32,
}

impl Default for CompactionSettings {
    fn default() -> Self {
        Self {
            target_rows_per_fragment: 1_000_000,
            max_rows_per_group: 1024,
            materialize_deletions: true,
            deletion_threshold: 0.1,
            interval: Some(Duration::from_secs(300)),
            min_fragments: 5,
            small_fragment_ratio: 0.5,
        }
    }
}

/// The key column's scalar index.
///
/// Always a BTree: besides answering point lookups, it is what makes the
/// MemWAL writers keep an index in memory, and so what makes Lance wait for
/// the key sidecar of each generation to be complete before publishing it
/// (see [`crate::Store::create`]). A choice without one would not be safe.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum KeyIndex {
    /// A BTree (exact lookups).
    #[default]
    BTree,
}

pub use lance_context_spec::Metric;

pub use lance_context_spec::TextSpec as TextColumn;

/// Kind of vector index.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VectorIndexKind {
    /// IVF partitions with 8-bit scalar quantisation (one byte per
    /// dimension): the default the registry builds. Measured by
    /// `bench-search` at 100k × 64 dims, clustered cosine data, refine 10:
    /// recall@10 1.000, where `IvfPq` (16 dimensions per sub-vector) gave
    /// 0.64.
    IvfSq,
    /// IVF partitions with product quantisation (16 dimensions per
    /// sub-vector, else 8): the smallest index, the lowest recall; raise
    /// `refine_factor` with it.
    IvfPq,
    /// IVF partitions with an HNSW graph per partition (PQ-compressed).
    IvfHnswPq,
}

/// A declared vector column.
#[derive(Debug, Clone, PartialEq)]
pub struct VectorColumn {
    /// Column name (FixedSizeList<Float32, dimension>).
    pub column: String,
    /// Vector dimension.
    pub dimension: usize,
    /// Distance metric.
    pub metric: Metric,
    /// Index kind built by `build_vector_index`.
    pub kind: VectorIndexKind,
}

/// Index settings.
#[derive(Debug, Clone, Default)]
pub struct IndexSettings {
    /// The key column's index: created with the store (and on open when
    /// missing), before any writer opens; kept by merges and compaction.
    pub key_index: KeyIndex,
    /// Vector columns, indexed on request.
    pub vector_columns: Vec<VectorColumn>,
    /// Text columns with a full-text (BM25) index (`<column>_fts`): created
    /// with the store (and on open when missing) and kept covering new rows
    /// by merges and compaction, like the key index.
    pub text_columns: Vec<TextColumn>,
    /// A BTree index on the records' secondary key (`<column>_idx`), kept like
    /// the key index, so uniqueness and upsert checks are lookups, not scans.
    /// Set from [`RecordCapabilities::secondary_key`] when not given.
    pub secondary_key_index: Option<String>,
    /// Keys per page of those BTree indexes when they are created (`None`:
    /// [`DEFAULT_KEY_INDEX_PAGE_ROWS`]). A lookup whose page is not cached
    /// reads, decodes and sorts one whole page, so smaller pages make cold
    /// lookups cheaper; building the index over many keys at once takes
    /// more memory with them. An existing index keeps its page size.
    pub key_index_page_rows: Option<u64>,
}

/// Keys per page of the key indexes unless [`IndexSettings::key_index_page_rows`]
/// says otherwise (Lance's own default is 4,096).
pub const DEFAULT_KEY_INDEX_PAGE_ROWS: u64 = 512;

/// Record semantics a schema opts into, applied by the engine for any schema
/// that declares them (see the `records` section of the crate docs). Each needs
/// certain columns; opening a store whose schema lacks them is an error.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RecordCapabilities {
    /// Deleting appends a tombstone: a row with the same key whose
    /// `content_type` (Utf8) is [`crate::TOMBSTONE_CONTENT_TYPE`]. Tombstones
    /// are hidden from reads; callers may not write that value.
    pub tombstones: bool,
    /// A row naming another row's key in `supersedes_id` (Utf8) hides that
    /// row from default reads.
    pub supersession: bool,
    /// `expires_at` (Timestamp), `lifecycle_status` (Utf8) and `retired_at`
    /// (Timestamp) decide visibility (and `superseded_by_id` when present).
    pub lifecycle: bool,
    /// `add` refuses a key, or a secondary key, that a non-tombstone row holds
    /// already, and repeats within a batch.
    pub unique_keys: bool,
    /// The caller-side key (Utf8) used by uniqueness, upsert, patch and
    /// delete-by-secondary-key, e.g. `external_id`.
    pub secondary_key: Option<String>,
}
