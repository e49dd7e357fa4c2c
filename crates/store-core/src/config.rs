//! Store configuration.

use std::collections::HashMap;
use std::time::Duration;

use arrow_schema::SchemaRef;

/// How a store is opened or created. Build one with [`StoreConfig::new`] and the
/// `with_*` methods.
#[derive(Debug, Clone)]
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
        }
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
    /// The default: one writing instance per dataset at a time. Opening a writer
    /// is refused with [`crate::Error::ShardConflict`] while any *other* shard
    /// holds generations not yet merged into the base table (for example after
    /// an instance was renamed), because the two shards could hold the same key.
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
    /// flush, so this bounds the durability part of an add's latency. Lance's
    /// default is 100 ms; ours is 5 ms. Must be > 0.
    pub wal_flush_interval: Duration,
    /// Largest number of rows one memtable holds. An add with more rows is
    /// written as several puts (still one visibility commit).
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
