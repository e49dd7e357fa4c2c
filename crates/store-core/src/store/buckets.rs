//! Bucket sharding: many instances write one store, each key through one
//! shard whichever instance writes it.
//!
//! A store created with [`crate::StoreConfig::with_buckets`] records Lance's
//! MemWAL bucket sharding spec on its key column (murmur3 of the key modulo
//! the count — Lance's own `evaluate_sharding_spec`, so LanceDB and
//! lance-spark compute the same bucket number; they do not write through
//! the bucket's shard named here, so only this engine may write a
//! bucketed store). Bucket `b` is written
//! through one shard, the one of instance id [`bucket_instance_id`]`(b)`,
//! whatever process holds it: owning a bucket is holding that shard's
//! epoch. Taking a bucket over claims the shard (fencing a writer still on
//! it) and replays its WAL, exactly as a restarted instance takes its own
//! shard back; the engine's per-shard machinery (fencing, reclaim, merge,
//! cleanup) does the rest, bucket by bucket.
//!
//! The handle a caller holds reads (base ∪ every shard's generations, as
//! any reader does). Each owned bucket is a writable handle of its own on
//! the same dataset ([`crate::ShardPolicy::PartitionedKeys`]: the bucket
//! routing is the promise that a key has one writer). An add is conformed
//! and checked once, split by bucket, and each part written through its
//! bucket's handle, the parts concurrently; it returns when every part is
//! durable and visible. A row of a bucket this instance does not own
//! refuses the whole add before anything is written ([`Error::NotOwner`]).

use std::collections::{BTreeMap, HashMap};

use arrow_array::{Array, Int32Array, RecordBatch, StringArray, UInt32Array};
use lance::Dataset;
use lance::dataset::mem_wal::{DatasetMemWalExt, evaluate_sharding_spec_with_source_columns};
use lance_index::mem_wal::ShardingSpec;

use super::Store;
use crate::error::{Error, LanceResultExt as _, Result};
use crate::merge::MergeStats;
use crate::writer::AddOutcome;

/// The instance id whose shard bucket `bucket` is written through (its
/// shard id is [`crate::shard_id_for_instance`] of it).
pub fn bucket_instance_id(bucket: u32) -> String {
    format!("bucket-{bucket:04}")
}

/// Parse a set of buckets as an operator writes it — `0-7`, `3`,
/// `0-3,8,10-11` — into a sorted list without repeats
/// ([`Error::InvalidArgument`] saying what is wrong).
pub fn parse_buckets(text: &str) -> Result<Vec<u32>> {
    let number = |s: &str| -> Result<u32> {
        let b = s.trim().parse::<u32>().map_err(|_| {
            Error::invalid_argument(format!("'{}' is not a bucket number", s.trim()))
        })?;
        match b < 1024 {
            true => Ok(b),
            false => Err(Error::invalid_argument(format!(
                "bucket {b}: a store has at most 1024 buckets"
            ))),
        }
    };
    let mut buckets = Vec::new();
    for part in text.split(',') {
        if part.trim().is_empty() {
            return Err(Error::invalid_argument(format!(
                "'{text}': an empty item (write e.g. 0-3,8)"
            )));
        }
        match part.split_once('-') {
            Some((a, b)) => {
                let (a, b) = (number(a)?, number(b)?);
                if a > b {
                    return Err(Error::invalid_argument(format!(
                        "'{}': the range runs backwards",
                        part.trim()
                    )));
                }
                buckets.extend(a..=b);
            }
            None => buckets.push(number(part)?),
        }
    }
    buckets.sort_unstable();
    buckets.dedup();
    Ok(buckets)
}

/// `0-3,6,8-9`: a set of buckets as an operator writes it.
pub(crate) fn describe_owned(owned: &[u32]) -> String {
    if owned.is_empty() {
        return "none".to_string();
    }
    let mut parts = Vec::new();
    let mut start = owned[0];
    let mut end = owned[0];
    for &b in &owned[1..] {
        if b == end + 1 {
            end = b;
            continue;
        }
        parts.push(range(start, end));
        start = b;
        end = b;
    }
    parts.push(range(start, end));
    parts.join(",")
}

fn range(start: u32, end: u32) -> String {
    if start == end {
        start.to_string()
    } else {
        format!("{start}-{end}")
    }
}

/// The bucket sharding a dataset's MemWAL records: its spec and count, or
/// `None` (manual sharding: no buckets).
pub(crate) async fn sharding_of(
    dataset: &Dataset,
    key: &str,
) -> Result<Option<(ShardingSpec, u32)>> {
    let Some(details) = dataset
        .mem_wal_index_details()
        .await
        .ctx("reading the MemWAL index")?
    else {
        return Ok(None);
    };
    let Some(spec) = details.sharding_specs.first() else {
        return Ok(None);
    };
    let bucket = spec
        .fields
        .iter()
        .find(|f| f.transform.as_deref() == Some("bucket"));
    let Some(field) = bucket else {
        // One shard for every row (`unsharded`): written as without a spec.
        if spec
            .fields
            .iter()
            .all(|f| f.transform.as_deref() == Some("unsharded"))
        {
            return Ok(None);
        }
        return Err(Error::invalid_argument(format!(
            "the dataset's MemWAL shards by a spec this build does not write through \
             ({:?}); only bucket sharding on the key column is supported",
            spec.fields
                .iter()
                .map(|f| f.transform.clone().unwrap_or_default())
                .collect::<Vec<_>>()
        )));
    };
    // Routed here by the key alone: a spec of several fields, or bucketing
    // another column, would put rows where Lance's routing does not.
    let key_id = dataset.schema().field(key).map(|f| f.id);
    if spec.fields.len() != 1 || key_id.is_none() || field.source_ids != [key_id.unwrap_or(-1)] {
        return Err(Error::invalid_argument(format!(
            "the dataset's MemWAL buckets rows by something other than the key column \
             '{key}' alone; this build writes only stores bucketed by their key"
        )));
    }
    let count: u32 = field
        .parameters
        .get("num_buckets")
        .and_then(|n| n.parse().ok())
        .filter(|n| *n > 0)
        .ok_or_else(|| {
            Error::invalid_argument("the dataset's bucket sharding spec has no valid num_buckets")
        })?;
    Ok(Some((spec.clone(), count)))
}

/// The owned buckets of a bucketed store: one writable handle each.
pub(crate) struct Buckets {
    /// Buckets of the store.
    pub count: u32,
    spec: ShardingSpec,
    /// The spec's source field id → the key column (the spec names columns
    /// by field id).
    sources: HashMap<i32, String>,
    /// Owned bucket → its writable handle.
    pub owned: BTreeMap<u32, Store>,
}

impl std::fmt::Debug for Buckets {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Buckets")
            .field("count", &self.count)
            .field("owned", &self.owned.keys().collect::<Vec<_>>())
            .finish()
    }
}

impl Buckets {
    pub(crate) fn new(
        count: u32,
        spec: ShardingSpec,
        key: &str,
        owned: BTreeMap<u32, Store>,
    ) -> Self {
        let sources = spec
            .fields
            .iter()
            .flat_map(|f| f.source_ids.iter().map(|id| (*id, key.to_string())))
            .collect();
        Self {
            count,
            spec,
            sources,
            owned,
        }
    }

    pub(crate) fn owned_list(&self) -> Vec<u32> {
        self.owned.keys().copied().collect()
    }

    /// The bucket of each row of `batch` (which has the key column).
    pub(crate) fn buckets_of(&self, batch: &RecordBatch) -> Result<Vec<u32>> {
        let evaluated =
            evaluate_sharding_spec_with_source_columns(batch, &self.spec, &self.sources)
                .ctx("routing rows to buckets")?;
        let column = evaluated
            .column(0)
            .as_any()
            .downcast_ref::<Int32Array>()
            .ok_or_else(|| Error::internal("bucket sharding did not give Int32 buckets"))?;
        column
            .iter()
            .map(|b| match b {
                Some(b) if b >= 0 && (b as u32) < self.count => Ok(b as u32),
                other => Err(Error::internal(format!(
                    "bucket sharding gave bucket {other:?} of {}",
                    self.count
                ))),
            })
            .collect()
    }

    /// Rows of `batch` grouped by bucket (input order kept within each), or
    /// [`Error::NotOwner`] for the first row of a bucket not owned here.
    fn split(&self, batch: &RecordBatch, key: &str) -> Result<Vec<(u32, RecordBatch)>> {
        let buckets = self.buckets_of(batch)?;
        let mut rows: BTreeMap<u32, Vec<u32>> = BTreeMap::new();
        for (row, bucket) in buckets.iter().enumerate() {
            if !self.owned.contains_key(bucket) {
                let key = batch
                    .column_by_name(key)
                    .and_then(|c| c.as_any().downcast_ref::<StringArray>())
                    .filter(|k| k.is_valid(row))
                    .map(|k| k.value(row).to_string())
                    .unwrap_or_default();
                return Err(Error::NotOwner {
                    row,
                    key,
                    bucket: *bucket,
                    buckets: self.count,
                    owned: self.owned_list(),
                });
            }
            rows.entry(*bucket).or_default().push(row as u32);
        }
        if rows.len() == 1 {
            let (bucket, _) = rows.into_iter().next().expect("one bucket");
            return Ok(vec![(bucket, batch.clone())]);
        }
        rows.into_iter()
            .map(|(bucket, rows)| {
                let indices = UInt32Array::from(rows);
                let columns = batch
                    .columns()
                    .iter()
                    .map(|c| arrow_select::take::take(c.as_ref(), &indices, None))
                    .collect::<std::result::Result<Vec<_>, _>>()?;
                Ok((bucket, RecordBatch::try_new(batch.schema(), columns)?))
            })
            .collect()
    }

    /// Write a conformed, checked batch: each bucket's rows through its
    /// handle, concurrently.
    pub(crate) async fn write(&self, conformed: RecordBatch, key: &str) -> Result<AddOutcome> {
        let parts = self.split(&conformed, key)?;
        let writes = parts.into_iter().map(|(bucket, part)| {
            let store = &self.owned[&bucket];
            async move { store.write_conformed(part).await }
        });
        let outcomes = futures::future::try_join_all(writes).await?;
        Ok(AddOutcome {
            rows: outcomes.iter().map(|o| o.rows).sum(),
        })
    }

    /// Delete keys (a batch of the key column, checked by the caller): each
    /// bucket's through its handle.
    pub(crate) async fn delete(&self, keys: RecordBatch) -> Result<usize> {
        let key = keys.schema().field(0).name().clone();
        let parts = self.split(&keys, &key)?;
        let deletes = parts.into_iter().map(|(bucket, part)| {
            let store = &self.owned[&bucket];
            async move {
                let ids = part
                    .column(0)
                    .as_any()
                    .downcast_ref::<StringArray>()
                    .ok_or_else(|| Error::internal("keys to delete are not strings"))?;
                let ids: Vec<&str> = ids.iter().flatten().collect();
                Box::pin(store.delete(&ids)).await
            }
        });
        futures::future::try_join_all(deletes).await?;
        Ok(keys.num_rows())
    }

    /// Merge every owned bucket's shard, one after the other (their commits
    /// to the base table would only conflict), the stats summed. A bucket
    /// that fails does not stop the others; the first error is returned
    /// after every bucket was tried.
    pub(crate) async fn merge(&self) -> Result<MergeStats> {
        let mut total = MergeStats::default();
        let mut first_error = None;
        for store in self.owned.values() {
            match Box::pin(store.merge()).await {
                Ok(stats) => total.absorb(&stats),
                Err(e) => {
                    first_error.get_or_insert(e);
                }
            }
        }
        first_error.map_or(Ok(total), Err)
    }
}
