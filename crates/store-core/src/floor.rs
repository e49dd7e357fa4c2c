//! The floor of a durable, visible add: Lance's own `ShardWriter` put of a
//! batch, then a freeze and the wait for its flush to a generation — what
//! any MemWAL store must do to acknowledge a write readers see — with none
//! of this engine's work around it. Benchmarks compare [`crate::Store::add`]
//! with it in the same run.

use std::time::{Duration, Instant};

use arrow_array::RecordBatch;
use arrow_schema::SchemaRef;
use lance::dataset::mem_wal::{DatasetMemWalExt as _, ShardWriterConfig};

use crate::dataset::Opener;
use crate::error::{Error, LanceResultExt as _, Result};

/// How the bare writer makes a put durable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FloorPut {
    /// A durable put (it waits for the WAL flush timer), then the freeze:
    /// what this engine's writer does.
    Durable,
    /// A put that is not durable, then the freeze, whose flush writes the
    /// WAL entry before the generation.
    FreezeFlushes,
}

/// Create an empty dataset at `uri` with `schema` (key tagged) — with a
/// BTree index on `key_index` when given, which the writer then maintains
/// in each memtable and writes with each generation, as this engine's key
/// index is — claim a shard with Lance's writer (WAL flush interval
/// `wal_flush_interval`), and time each batch of `batches`: put, freeze,
/// wait for the generation.
pub async fn bare_shard_adds(
    uri: &str,
    schema: SchemaRef,
    batches: &[RecordBatch],
    put: FloorPut,
    wal_flush_interval: Duration,
    key_index: Option<&str>,
) -> Result<Vec<Duration>> {
    let opener = Opener::new(uri, &Default::default());
    let mut dataset = opener.create(schema).await?;
    if let Some(key) = key_index {
        use lance::index::DatasetIndexExt as _;
        dataset
            .create_index(
                &[key],
                lance_index::IndexType::BTree,
                Some(format!("{key}_idx")),
                &lance_index::scalar::ScalarIndexParams::default(),
                false,
            )
            .await
            .ctx("creating the key index")?;
    }
    let shard = uuid::Uuid::new_v4();
    let config = ShardWriterConfig::new(shard)
        .with_durable_write(put == FloorPut::Durable)
        .with_max_wal_flush_interval(wal_flush_interval);
    let writer = dataset
        .mem_wal_writer(shard, config)
        .await
        .ctx("claiming a shard")?;
    let mut times = Vec::with_capacity(batches.len());
    for batch in batches {
        let started = Instant::now();
        writer.put(vec![batch.clone()]).await.ctx("putting")?;
        let fence = writer.force_freeze_active().await.ctx("freezing")?;
        fence.wait().await.ctx("flushing the generation")?;
        times.push(started.elapsed());
    }
    writer
        .close()
        .await
        .map_err(|e| Error::from_lance("closing the writer", Some(shard), e))?;
    Ok(times)
}
