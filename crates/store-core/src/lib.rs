//! # lance-context-store: the one storage engine
//!
//! Every schema — built-in or user-defined — is stored through this crate. It
//! knows Arrow schemas and Lance datasets, nothing about plugins, CLIs or HTTP.
//!
//! ## Architecture
//! A store is one Lance dataset (the *base table*) plus a MemWAL: each writing
//! instance owns one *shard*, whose id is derived from the instance id
//! ([`shard_id_for_instance`]). A shard has a write-ahead log and a sequence of
//! flushed *generations* (small Lance datasets under `_mem_wal/<shard>/`).
//! Readers see base ∪ every shard's unmerged generations, deduplicated by the
//! key column (newest write wins).
//!
//! ## Write path and durability promise
//! [`Store::add`]: conform the batch to the stored schema by column name
//! (reject unknown columns, type mismatches, null/empty keys, nulls in
//! non-nullable columns — nothing is written from a rejected batch) → durable
//! `put` into the shard's WAL → a group-committed freeze that flushes the
//! memtable into a generation and commits the shard manifest. **When `add`
//! returns `Ok`, the rows are durable and visible to any reader, in this process
//! or another, including after this process is killed.** Concurrent adds share
//! one freeze, so they share one generation.
//!
//! Known limits: an add larger than `WriterSettings::max_memtable_rows` is
//! written as several puts, so a crash (or fence) part-way can leave a prefix of
//! it durable (rows that must become visible together — a new version and the
//! record it supersedes — always share a put); every add makes a generation that reads open until it is merged
//! into the base table (see [`Store::wal_status`] and the merge triggers).
//!
//! ## Fencing policy
//! One writer per shard. If another process opens the same instance id, it
//! claims a newer epoch; this instance's next add fails with [`Error::Fenced`]
//! and the writer latches (later adds fail fast) until [`Store::reclaim`] or a
//! reopen. Rows this instance acknowledged before are replayed by the new owner —
//! none is lost. If our own WAL persistence fails, we are still the owner: the
//! engine reclaims the shard (new epoch, WAL replay) and retries once. Handles
//! claiming one shard at the same moment (a restart racing a deploy) do not
//! fail because of each other: a lost claim race is tried again, and the
//! claimer that comes last owns the shard; a reclaim that loses to a later
//! open returns [`Error::Fenced`] and can be called again.
//!
//! ## One key, one shard
//! Lance dedupes within a shard only. With [`ShardPolicy::SingleWriter`] (the
//! default) a writer that opens (or reclaims) takes every other shard over
//! first — claims it, fencing a writer still on it, replays its WAL tail and
//! merges it — and accepts no add until that is done; when the takeover fails
//! the open is refused with [`Error::ShardConflict`]. [`ShardPolicy::PartitionedKeys`] lets several
//! instances write, on the caller's promise that each key has one writer.
//!
//! ## Read path
//! [`Store::get`] / [`Store::get_many`] are point lookups (the base table's key
//! index when it has one, per-generation lookups otherwise). [`Store::scan`]
//! pushes filter, projection, order-by (a top-k sort bounded by offset+limit)
//! and limit/offset into the scan plan. Results are decoded by column name;
//! columns the dataset lacks (it was created by an older version) read as nulls.
//!
//! ## Maintenance
//! [`Store::merge`] folds this instance's unmerged generations into the base
//! table: streaming in passes bounded by a byte budget, tombstones applied as
//! deletes, each pass committing its own "merged up to" marker atomically with
//! its data (a stale pass is refused whole), so a crash anywhere neither loses
//! nor duplicates a row; merged
//! generations and replayed WAL files are removed after a grace period (see the
//! `merge` module). Triggers: generation count after add, a timer, or explicit.
//! [`Store::compact`] runs Lance compaction with deferred index remap behind a
//! single-compactor guard; the key index (`<key>_idx`, BTree or ZoneMap) is
//! ensured on open and extended after every merge and compaction; declared
//! vector columns get IVF-PQ / IVF-HNSW-PQ indexes on request
//! ([`Store::build_vector_index`]) and [`Store::nearest`] searches base and
//! generations together. [`Store::stats`] reports all of it.
//!
//! ## Record capabilities
//! A schema may opt into record semantics ([`RecordCapabilities`] in
//! [`StoreConfig::capabilities`]): tombstone delete ([`Store::tombstone`],
//! [`Store::tombstone_by_secondary_key`]), lifecycle and supersession
//! visibility on scans, counts and vector search (lifted per request by
//! [`Visibility`]), unique keys on add, upsert by the secondary key
//! ([`Store::upsert`]) and patch as a new version ([`Store::patch`]). The
//! engine applies them to any schema that declares them and has their columns;
//! the rules are in the `records` module's docs.
//!
//! ## Storage options
//! Every open of the dataset goes through one module, which carries the store's
//! storage options; Lance hands the same object-store parameters to every
//! generation it opens.

mod cleanup;
mod config;
mod conform;
mod dataset;
mod engine;
mod error;
pub mod floor;
mod id;
mod merge;
mod read;
mod store;
mod uri;
mod writer;

pub use config::{
    CompactionSettings, DEFAULT_KEY_INDEX_PAGE_ROWS, IndexSettings, KeyIndex, MergeSettings,
    Metric, RecordCapabilities, RetentionSettings, ShardPolicy, StoreConfig, TextColumn,
    VectorColumn, VectorIndexKind, WriterSettings,
};
pub use dataset::{Location, NoteVersion, NoteWrite};
pub use engine::{CompactionStats, IndexStats, MaintenanceState, ShardManifestStats, StoreStats};
pub use error::{BatchProblem, Error, ErrorKind, FenceReason, Result};
pub use id::{generate_id, shard_id_for_instance};
#[cfg(feature = "failpoints")]
pub use merge::{MergeFailpoint, MergeHook, ReclaimHook};
pub use merge::{MergePhases, MergeStats};
pub use read::{
    BatchStream, Condition, DEFAULT_RRF_K, FilterValue, MAX_IN_VALUES, MAX_TEXT_QUERY,
    RRF_SCORE_COLUMN, RetrieveQuery, SCORE_COLUMN, ScanRequest, SortKey, TEXT_RANK_COLUMN,
    TextOperator, TextQuery, VECTOR_RANK_COLUMN, VectorQuery, Visibility, check_plain_predicate,
    compile_conditions, exact_bm25,
};
pub use store::buckets::{bucket_instance_id, parse_buckets};
pub use store::input::{MAX_KEY_BYTES, MAX_VECTOR_SQUARED_NORM, RESERVED_STATUS, VectorProblem};
pub use store::records::{PatchTarget, PatchedVersion, TOMBSTONE_CONTENT_TYPE, UpsertOutcome};
pub use store::{PRIMARY_KEY_METADATA, Store, VersionInfo, WalStatus};
pub use uri::{
    CanonicalLocation, DataLocation, UriError, check_new_uri, resolve_uri, without_source_locations,
};
pub use writer::AddOutcome;
