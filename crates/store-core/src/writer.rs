//! The resident MemWAL writer: group commit and the fencing policy.
//!
//! One [`ShardWriter`] per store instance, on the shard derived from the
//! instance id, opened once and reused for every add.
//!
//! # Add
//! `put` (durable: returns once the WAL entry is persisted) → take a ticket →
//! make every ticket up to ours visible with one `force_freeze_active` +
//! `FreezeFence::wait` (the frozen memtable is written as a generation and the
//! shard manifest committed). Adds that arrive while a freeze is running share
//! the next one (group commit), so concurrent adds do not each pay a freeze nor
//! each make a generation.
//!
//! # Every freeze is the writer's own
//! A generation's key sidecar (the `_pk_index` reads use to keep only the
//! newest version of a key) is written from the memtable's in-memory key
//! index, which Lance fills in a task of its own after each put. Lance
//! waits for that task before a flush only when the writer maintains a
//! table index in memory — which costs each flush a second index on the
//! generation (~1.3–1.9 ms of a 6–9 ms single-record add) that no read of
//! this engine uses. Instead, nothing freezes a memtable that holds a
//! put's rows before that put has returned (`put` returns once its rows
//! are indexed and durable):
//! - Lance's writer never freezes by itself: its backpressure controller
//!   ([`OwnFreezes`]) answers "no" to every freeze it asks for, so a put
//!   that would need one (the memtable full by rows or bytes) is refused
//!   with `Backpressure` before it writes anything; the writer then freezes
//!   and puts again;
//! - every freeze of this writer (the add's, one for a full memtable, the
//!   WAL tail at a claim, the close) holds the `gate` exclusively, and
//!   every put holds it shared until it returns — in a task of its own, so
//!   that a caller that stops waiting does not let the gate go while
//!   Lance's index task is still behind the put's rows;
//! - the memtables keep no table index: the store-wide set of maintained
//!   indexes still names the key index (earlier builds of this engine rely
//!   on it to make their flushes wait), and each claim of this writer
//!   replaces it with none in its own memtables once the WAL tail it
//!   replayed is published.
//!
//! # Fencing policy
//! - `PersistenceFailure` (our own WAL write failed; we are still the rightful
//!   owner): reopen the writer — claiming a new epoch, which replays the WAL —
//!   and retry the failed step once. A second failure is returned. Adds are
//!   refused (`Fenced`, `PersistenceFailure`) while the writer recovers, and
//!   the recovery takes the shard back only when nobody else claimed it since
//!   this writer's own claim: the manifest must still name this writer's
//!   epoch before the claim (a manifest that cannot be read leaves the store
//!   latched, and the next add tries again), and the claim must land on the
//!   very next epoch. A claim that skipped an epoch lost a race with a peer
//!   (under `SingleWriter` one that opened meanwhile and may already
//!   acknowledge adds into its own shard): the writer latches as fenced by it
//!   instead of writing beside it. With the epochs contiguous no other
//!   instance opened since this writer's claim, so there is nothing to take
//!   over: the recovery is the whole of `reclaim` for this case.
//! - `PeerClaimedEpoch` (another process opened the same instance id): the peer
//!   owns the shard now and has replayed every row we acknowledged. We return
//!   [`Error::Fenced`] and latch: every later add fails the same way, without
//!   touching storage, until the caller calls `reclaim` (taking the shard back)
//!   or reopens the store.
//!
//! An add that fails with `Fenced` after its put was durable may still become
//! visible (the new owner replays the WAL): treat it as "outcome unknown" and
//! re-add the same keys, which is idempotent under newest-wins.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use arrow_array::RecordBatch;
use lance::Dataset;
use lance::dataset::mem_wal::write::{BackpressureController, Drain, ShardMemory};
use lance::dataset::mem_wal::{
    DatasetMemWalExt, FreezeFence, ShardManifestStore, ShardWriter, ShardWriterConfig,
};
use lance_index::mem_wal::ShardManifest;
use tokio::sync::{Mutex, RwLock};
use uuid::Uuid;

use crate::config::WriterSettings;
use crate::error::{Error, FenceReason, Result};

/// What an add did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AddOutcome {
    /// Rows written.
    pub rows: usize,
}

/// Attempts to claim a shard when opening a writer (see [`Writer::open`]).
const CLAIM_ATTEMPTS: u32 = 10;

/// Puts of one chunk refused for a full memtable (each followed by a
/// freeze) before the write gives up as `Busy`: only other writes filling
/// each new memtable first can refuse a put again.
const FULL_MEMTABLE_RETRIES: u32 = 64;

/// Lance's writer asks its backpressure controller before every freeze it
/// would make by itself (a memtable full by rows or bytes); this one always
/// answers no, so that every freeze is the [`Writer`]'s own (see the module
/// docs). Admission is Lance's own rule: a put waits while the shard's
/// unflushed memtables hold `ceiling` bytes or more, for the oldest flush.
#[derive(Debug)]
struct OwnFreezes {
    ceiling: usize,
}

/// How often a put held back by the ceiling looks again when no flush is
/// there to wait for.
const DRAIN_POLL: std::time::Duration = std::time::Duration::from_millis(10);

#[async_trait::async_trait]
impl BackpressureController for OwnFreezes {
    async fn maybe_apply_backpressure(&self, shard: ShardMemory) -> lance::Result<()> {
        while shard.unflushed_bytes() >= self.ceiling {
            match shard.drain() {
                Drain::Flush(mut flushed) => {
                    let _ = flushed.await_value().await;
                }
                Drain::Background => tokio::time::sleep(DRAIN_POLL).await,
                // Only a freeze would drain it: refused, the writer freezes
                // and puts again.
                Drain::Stalled => {
                    return Err(lance::Error::backpressure(
                        "the shard's memtables are at their ceiling with no flush running",
                    ));
                }
            }
        }
        Ok(())
    }

    fn may_freeze_memtable(&self) -> bool {
        false
    }
}

pub(crate) struct Writer {
    shard: Uuid,
    settings: WriterSettings,
    /// `None` once closed.
    inner: RwLock<Option<Arc<ShardWriter>>>,
    /// Set when the writer lost its shard to a peer (cleared by `reclaim`) or
    /// while it recovers from a failed WAL write.
    latched: std::sync::Mutex<Latch>,
    /// The number of the claim whose writer is in place (its open is 1):
    /// a write that failed under one claim and finds a newer one retries on
    /// it instead of recovering again.
    claims: AtomicU64,
    /// Claim attempts numbered so far: each claim, kept or not, gets a
    /// number of its own, greater than every earlier one's.
    attempts: AtomicU64,
    /// One recovery from a persistence failure at a time.
    recovering: Mutex<()>,
    /// Tickets handed to adds whose put has returned.
    tickets: AtomicU64,
    /// The epoch [`Writer::epoch`] saw last (0: none).
    last_epoch: AtomicU64,
    /// The highest ticket known visible (all puts up to it are in a generation).
    visible: Mutex<u64>,
    /// Held shared by every put until it returns, exclusively by every
    /// freeze: a frozen memtable holds only rows of puts that returned, so
    /// its key index covers every row (see the module docs).
    gate: Arc<RwLock<()>>,
    /// Tests: make the next WAL write fail as a persistence failure.
    #[cfg(feature = "failpoints")]
    pub(crate) fail_next_write: std::sync::atomic::AtomicBool,
    /// When > 0: a write fails (as a crash would cut it) after this many
    /// puts minus one (failpoints).
    #[cfg(feature = "failpoints")]
    pub(crate) fail_after_puts: std::sync::atomic::AtomicUsize,
    /// Awaited by the next recovery after its epoch check, before its claim
    /// (interleaving tests).
    #[cfg(feature = "failpoints")]
    pub(crate) recovery_pause: std::sync::Mutex<Option<crate::merge::ReclaimHook>>,
}

/// The writer's latch: why adds are refused, if they are, and under which
/// claim that was seen, so that clearing it after a reclaim does not clear
/// a fence the new claim met meanwhile (a fence the old writer reports is
/// history once the shard is claimed again).
#[derive(Debug, Default, Clone, Copy)]
struct Latch {
    reason: Option<FenceReason>,
    claim: u64,
}

#[derive(Clone, Copy)]
enum WriteOp<'a> {
    Put(&'a [RecordBatch]),
    Delete(&'a [RecordBatch]),
}

impl std::fmt::Debug for Writer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Writer")
            .field("shard", &self.shard)
            .finish_non_exhaustive()
    }
}

/// The Lance writer's configuration: durable puts (a put returns once its
/// WAL entry is written). Every write is then frozen at once, and the
/// freeze's flush writes the WAL entries before the generation anyway; a
/// put that is not durable saved ~0.1 ms of a 5–6 ms add in `bench-peer`
/// (docs/performance.md), not worth leaving the configuration the crash
/// trials proved.
///
/// Lance's writer makes no freeze of its own ([`OwnFreezes`]).
fn lance_config(shard: Uuid, settings: &WriterSettings) -> ShardWriterConfig {
    ShardWriterConfig::new(shard)
        .with_durable_write(true)
        .with_max_wal_flush_interval(settings.wal_flush_interval)
        .with_max_memtable_rows(settings.max_memtable_rows)
        .with_max_unflushed_memtable_bytes(settings.max_unflushed_bytes)
        .with_backpressure(Arc::new(OwnFreezes {
            ceiling: settings.max_unflushed_bytes,
        }))
}

/// Claim `shard` (a new epoch) and replay its WAL.
///
/// Claiming is a conditional write of the shard's manifest; two claimers
/// racing for one shard both read the same epoch and one loses. Lance
/// reports that as an I/O error — or, when the peer's claim lands while ours
/// replays the WAL, as a fence — so a failed claim is tried again (a new
/// epoch each time): the claimer that comes last owns the shard, the policy
/// everywhere else (see the module docs), and an open never fails only
/// because a peer claimed at the same moment.
async fn claim(
    dataset: &Dataset,
    shard: Uuid,
    settings: &WriterSettings,
    context: &str,
) -> Result<ShardWriter> {
    let mut attempt = 0;
    loop {
        attempt += 1;
        match dataset
            .mem_wal_writer(shard, lance_config(shard, settings))
            .await
        {
            Ok(writer) => return Ok(writer),
            Err(e) if attempt < CLAIM_ATTEMPTS => {
                tracing::debug!(%shard, attempt, error = %e, "claiming the shard failed; trying again");
                tokio::time::sleep(claim_backoff(attempt)).await;
            }
            Err(e) => return Err(Error::from_lance(context, Some(shard), e)),
        }
    }
}

/// A growing, jittered pause before claim attempt `attempt + 1`, so that
/// several claimers racing do not collide again in lockstep.
fn claim_backoff(attempt: u32) -> std::time::Duration {
    use std::hash::{BuildHasher, Hasher};
    let random = std::collections::hash_map::RandomState::new()
        .build_hasher()
        .finish();
    let base = 10 * u64::from(attempt);
    std::time::Duration::from_millis(base + random % (base + 10))
}

impl Writer {
    /// Claim the shard (a new epoch) and replay its WAL.
    pub async fn open(dataset: &Dataset, shard: Uuid, settings: WriterSettings) -> Result<Self> {
        if settings.wal_flush_interval.is_zero() {
            return Err(Error::invalid_argument(
                "writer.wal_flush_interval must be greater than zero",
            ));
        }
        if settings.max_memtable_rows == 0 {
            return Err(Error::invalid_argument(
                "writer.max_memtable_rows must be greater than zero",
            ));
        }
        let writer = claim(dataset, shard, &settings, "opening the shard writer").await?;
        let this = Self {
            shard,
            settings,
            inner: RwLock::new(Some(Arc::new(writer))),
            latched: std::sync::Mutex::new(Latch::default()),
            claims: AtomicU64::new(1),
            attempts: AtomicU64::new(1),
            recovering: Mutex::new(()),
            tickets: AtomicU64::new(0),
            last_epoch: AtomicU64::new(0),
            visible: Mutex::new(0),
            gate: Arc::new(RwLock::new(())),
            #[cfg(feature = "failpoints")]
            fail_next_write: std::sync::atomic::AtomicBool::new(false),
            #[cfg(feature = "failpoints")]
            fail_after_puts: std::sync::atomic::AtomicUsize::new(0),
            #[cfg(feature = "failpoints")]
            recovery_pause: std::sync::Mutex::new(None),
        };
        {
            let guard = this.inner.read().await;
            if let Some(writer) = guard.as_ref() {
                match this.publish_replayed(writer).await {
                    Ok(()) => {}
                    // A peer claimed the shard right after us: opened, fenced.
                    Err(e) if e.is_fenced() => this.latch(&e, 1),
                    Err(e) => return Err(e),
                }
            }
        }
        Ok(this)
    }

    /// Make what claiming the shard replayed from the WAL (rows written but
    /// never acknowledged, e.g. a write cut by a crash between its puts) a
    /// generation now, so readers see the store as the new writer does, not
    /// only after this writer's first write.
    async fn publish_replayed(&self, writer: &ShardWriter) -> Result<()> {
        let flushed = match self.freeze(writer).await {
            Ok(fence) => fence.wait().await,
            Err(e) => Err(e),
        };
        // Then the memtables keep no table index (the active one is empty
        // now: swapped in place, nothing frozen). The store-wide set names
        // the key index for writers of earlier builds (see
        // `dataset::narrow_maintained_indexes`); this writer freezes only
        // with no put running instead (see the module docs).
        let flushed = match flushed {
            Ok(()) => self.without_table_indexes(writer).await,
            Err(e) => Err(e),
        };
        match flushed {
            Ok(()) => Ok(()),
            Err(e) => {
                let err = self.classify("flushing the replayed WAL tail", e);
                Err(self.fenced_or(writer, err).await)
            }
        }
    }

    /// Build the writer's memtables without any table index, holding the
    /// gate (a swap with rows in the active memtable freezes it).
    async fn without_table_indexes(&self, writer: &ShardWriter) -> lance::Result<()> {
        let fence = {
            let _closed = self.gate.write().await;
            writer.replace_index_configs(Vec::new()).await?
        };
        match fence {
            Some(fence) => fence.wait().await,
            None => Ok(()),
        }
    }

    /// The epoch this writer holds its shard at (`None` once closed). While
    /// a claim is under way (the writer being replaced, its WAL replayed),
    /// the epoch seen last: this never waits for a claim.
    pub(crate) fn epoch(&self) -> Option<u64> {
        match self.inner.try_read() {
            Ok(inner) => {
                let epoch = inner.as_ref().map(|w| w.epoch());
                self.last_epoch.store(epoch.unwrap_or(0), Ordering::Relaxed);
                epoch
            }
            Err(_) => Some(self.last_epoch.load(Ordering::Relaxed)).filter(|e| *e > 0),
        }
    }

    /// `Err(Fenced)` once the writer lost its shard to a peer (until
    /// reclaimed), or while it recovers from a failed WAL write.
    pub(crate) fn check_latch(&self) -> Result<()> {
        match self.latch_state().reason {
            Some(reason) => Err(Error::Fenced {
                shard: self.shard,
                reason,
            }),
            None => Ok(()),
        }
    }

    /// Why adds are refused, if they are (operator statistics).
    pub(crate) fn latched(&self) -> Option<FenceReason> {
        self.latch_state().reason
    }

    fn latch_state(&self) -> Latch {
        *self.latched.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Latch as fenced when `err`, met by the writer of claim `claim`, says
    /// a peer claimed the shard.
    fn latch(&self, err: &Error, claim: u64) {
        if let Error::Fenced {
            reason: FenceReason::PeerClaimedEpoch,
            ..
        } = err
        {
            self.set_latch(FenceReason::PeerClaimedEpoch, claim);
        }
    }

    /// Refuse adds for `reason`, seen under claim `claim`. A fence is never
    /// downgraded to a recovery.
    fn set_latch(&self, reason: FenceReason, claim: u64) {
        let mut latch = self.latched.lock().unwrap_or_else(|p| p.into_inner());
        if latch.reason != Some(FenceReason::PeerClaimedEpoch)
            || reason == FenceReason::PeerClaimedEpoch
        {
            latch.reason = Some(reason);
        }
        latch.claim = latch.claim.max(claim);
    }

    /// The current claim's number.
    fn claim_number(&self) -> u64 {
        self.claims.load(Ordering::SeqCst)
    }

    fn classify(&self, context: &str, err: lance::Error) -> Error {
        Error::from_lance(context, Some(self.shard), err)
    }

    /// Write `batch` (already conformed to the stored schema) durably and make it
    /// visible. `reopen` gives a fresh dataset handle for the persistence-failure
    /// retry.
    pub async fn add<F, Fut>(&self, batch: RecordBatch, reopen: F) -> Result<AddOutcome>
    where
        F: Fn() -> Fut,
        Fut: std::future::Future<Output = Result<Dataset>>,
    {
        let rows = batch.num_rows();
        let chunks = split(&batch, self.settings.max_memtable_rows);
        self.write(WriteOp::Put(&chunks), reopen).await?;
        Ok(AddOutcome { rows })
    }

    /// Write `chunks` in order, each as one WAL entry: a chunk lands in one
    /// memtable and so one generation (Lance freezes before an entry that
    /// would not fit), so rows that must become visible together go in one
    /// chunk. Each chunk holds at most `max_memtable_rows` rows.
    ///
    /// Returns, for a write of one chunk whose freeze this call made, the
    /// generation that freeze flushed: it holds the chunk, and may hold rows
    /// other writes put in the same memtable (the caller compares row counts
    /// before taking it for the chunk alone).
    pub async fn add_chunks<F, Fut>(
        &self,
        chunks: Vec<RecordBatch>,
        reopen: F,
    ) -> Result<Option<u64>>
    where
        F: Fn() -> Fut,
        Fut: std::future::Future<Output = Result<Dataset>>,
    {
        debug_assert!(
            chunks
                .iter()
                .all(|c| c.num_rows() <= self.settings.max_memtable_rows)
        );
        let frozen = self.write(WriteOp::Put(&chunks), reopen).await?;
        Ok(frozen.filter(|_| chunks.len() == 1))
    }

    /// Rows one write can make visible atomically.
    pub fn max_atomic_rows(&self) -> usize {
        self.settings.max_memtable_rows
    }

    /// Delete the keys in `keys` (a batch holding the key column): a tombstone
    /// per key, durable and visible on return like an add.
    pub async fn delete<F, Fut>(&self, keys: RecordBatch, reopen: F) -> Result<()>
    where
        F: Fn() -> Fut,
        Fut: std::future::Future<Output = Result<Dataset>>,
    {
        let chunks = split(&keys, self.settings.max_memtable_rows);
        self.write(WriteOp::Delete(&chunks), reopen).await?;
        Ok(())
    }

    /// Write `op`; the generation this write's own freeze flushed, if it made
    /// one (see [`Self::put_and_publish_on`]). A persistence failure is
    /// recovered from (see the module docs) and the write retried once.
    async fn write<F, Fut>(&self, op: WriteOp<'_>, reopen: F) -> Result<Option<u64>>
    where
        F: Fn() -> Fut,
        Fut: std::future::Future<Output = Result<Dataset>>,
    {
        if let Err(err) = self.check_latch() {
            match err {
                // An earlier recovery could not finish (e.g. storage was
                // unreachable): this write tries again.
                Error::Fenced {
                    reason: FenceReason::PersistenceFailure,
                    ..
                } => self.recover(self.claim_number(), &reopen).await?,
                err => return Err(err),
            }
        }
        let mut retried = false;
        loop {
            match self.put_and_publish(op).await {
                Ok(frozen) => return Ok(frozen),
                Err((
                    Error::Fenced {
                        reason: FenceReason::PersistenceFailure,
                        ..
                    },
                    claim,
                )) if !retried => {
                    retried = true;
                    tracing::warn!(shard = %self.shard, "WAL persistence failed; reclaiming the shard and retrying once");
                    self.recover(claim, &reopen).await?;
                }
                Err((err, claim)) => {
                    self.latch(&err, claim);
                    return Err(err);
                }
            }
        }
    }

    /// Recover from a persistence failure seen under claim number `claim`
    /// (see the module docs): nothing to do when another write recovered
    /// since; else take the shard back if nobody else claimed it.
    async fn recover<F, Fut>(&self, claim: u64, reopen: &F) -> Result<()>
    where
        F: Fn() -> Fut,
        Fut: std::future::Future<Output = Result<Dataset>>,
    {
        let _one = self.recovering.lock().await;
        if self.claim_number() != claim {
            // Recovered (or reclaimed) meanwhile: the write retries on the
            // new claim, or meets the fence that stopped it.
            return self.check_latch();
        }
        self.set_latch(FenceReason::PersistenceFailure, claim);
        let dataset = reopen().await?;
        // The manifest must name our epoch still; an error reading it leaves
        // the store latched (the next write tries again).
        let epoch = self
            .check_epoch_unmoved()
            .await
            .inspect_err(|e| self.latch(e, claim))?;
        #[cfg(feature = "failpoints")]
        crate::merge::await_pause(&self.recovery_pause).await;
        let claimed = self.claim_again(&dataset, Some((epoch, claim))).await?;
        self.unlatch(claimed);
        Ok(())
    }

    /// Put and publish on the current writer; an error comes with the
    /// number of the claim whose writer met it.
    async fn put_and_publish(
        &self,
        op: WriteOp<'_>,
    ) -> std::result::Result<Option<u64>, (Error, u64)> {
        let guard = self.inner.read().await;
        // The claim changes only under the write lock: this is the writer's.
        let claim = self.claim_number();
        let Some(writer) = guard.as_ref() else {
            return Err((
                Error::WriterUnavailable {
                    message: "the store is closed".to_string(),
                },
                claim,
            ));
        };
        match self.put_and_publish_on(writer, op).await {
            Ok(frozen) => Ok(frozen),
            Err(err) => Err((self.fenced_or(writer, err).await, claim)),
        }
    }

    /// This writer's epoch, checked against the shard's manifest:
    /// `Err(Fenced(PeerClaimedEpoch))` when the manifest names a newer one,
    /// and any error reading it as that error (never taken for "unmoved").
    async fn check_epoch_unmoved(&self) -> Result<u64> {
        let guard = self.inner.read().await;
        let Some(writer) = guard.as_ref() else {
            return Err(Error::WriterUnavailable {
                message: "the store is closed".to_string(),
            });
        };
        writer
            .manifest_store()
            .check_fenced(writer.epoch())
            .await
            .map_err(|e| self.classify("checking the shard's epoch", e))?;
        Ok(writer.epoch())
    }

    /// `Err(Fenced)` (and latched) when the shard's manifest names a newer
    /// epoch than this writer's, or the writer is latched already; storage
    /// errors reading the manifest are not a fence.
    pub(crate) async fn check_fenced_now(&self) -> Result<()> {
        self.check_latch()?;
        let guard = self.inner.read().await;
        let claim = self.claim_number();
        let Some(writer) = guard.as_ref() else {
            return Ok(());
        };
        match writer.manifest_store().check_fenced(writer.epoch()).await {
            Err(e) if e.fence_reason().is_some() => {
                let err = self.classify("checking the shard's epoch", e);
                self.latch(&err, claim);
                Err(err)
            }
            _ => Ok(()),
        }
    }

    /// A write that failed for another reason may have failed because a peer
    /// claimed the shard (Lance reports some of those, e.g. from a flush, as
    /// I/O errors): ask the shard's manifest, whose answer is typed.
    async fn fenced_or(&self, writer: &ShardWriter, err: Error) -> Error {
        if err.is_fenced() {
            return err;
        }
        match writer.manifest_store().check_fenced(writer.epoch()).await {
            Err(e) if e.fence_reason().is_some() => self.classify("writing to the shard", e),
            _ => err,
        }
    }

    /// The `fail_write_after_puts` failpoint: cut the write after `done` puts.
    #[cfg(feature = "failpoints")]
    fn failpoint_before_put(&self, done: usize) -> Result<()> {
        let after = self.fail_after_puts.load(Ordering::SeqCst);
        if after > 0 && done + 1 == after {
            self.fail_after_puts.store(0, Ordering::SeqCst);
            return Err(Error::internal(format!(
                "failpoint: write cut after {done} puts"
            )));
        }
        Ok(())
    }

    #[cfg(not(feature = "failpoints"))]
    fn failpoint_before_put(&self, _done: usize) -> Result<()> {
        Ok(())
    }

    /// Put `op` and make it visible: freeze and flush the memtable unless a
    /// freeze started after the put already did. The generation this call's
    /// freeze flushed, when it made one.
    async fn put_and_publish_on(
        &self,
        writer: &Arc<ShardWriter>,
        op: WriteOp<'_>,
    ) -> Result<Option<u64>> {
        #[cfg(feature = "failpoints")]
        if self.fail_next_write.swap(false, Ordering::SeqCst) {
            return Err(Error::Fenced {
                shard: self.shard,
                reason: FenceReason::PersistenceFailure,
            });
        }
        match op {
            WriteOp::Put(chunks) => {
                for (done, chunk) in chunks.iter().enumerate() {
                    self.failpoint_before_put(done)?;
                    self.put_one(writer, chunk, false).await?;
                }
            }
            WriteOp::Delete(chunks) => {
                for chunk in chunks {
                    self.put_one(writer, chunk, true).await?;
                }
            }
        }
        let ticket = self.tickets.fetch_add(1, Ordering::SeqCst) + 1;
        let mut visible = self.visible.lock().await;
        if *visible >= ticket {
            // A freeze that started after our put already published it.
            return Ok(None);
        }
        // Every ticket issued so far belongs to a put that has returned, so its
        // rows are in the active memtable or an earlier one: this freeze covers
        // them. Read once the gate is ours, so the puts this freeze waited for
        // are covered too (group commit).
        let mut covered = 0;
        let fence = self
            .freeze_then(writer, || covered = self.tickets.load(Ordering::SeqCst))
            .await
            .map_err(|e| self.classify("freezing the memtable", e))?;
        let frozen = fence.frozen_generation();
        fence
            .wait()
            .await
            .map_err(|e| self.classify("flushing the memtable to a generation", e))?;
        *visible = covered;
        Ok(frozen)
    }

    /// Put `chunk` (rows, or keys to delete when `delete`) in the WAL and
    /// the active memtable, holding the gate shared until the put returns
    /// (its rows indexed and durable). A put refused because the memtable is
    /// full (Lance's writer asks to freeze, and is told no: see the module
    /// docs) is put again after a freeze of the writer's own.
    async fn put_one(
        &self,
        writer: &Arc<ShardWriter>,
        chunk: &RecordBatch,
        delete: bool,
    ) -> Result<()> {
        let mut refused = 0;
        loop {
            let open = self.gate.clone().read_owned().await;
            let (put_writer, batch) = (writer.clone(), chunk.clone());
            // A task of its own: a caller that stops waiting (a timeout, a
            // dropped future) does not cut the put short between Lance's
            // insert and its index apply while the gate is let go — a freeze
            // then could publish a generation whose key sidecar misses rows.
            let put = tokio::spawn(async move {
                let put = match delete {
                    false => put_writer.put(vec![batch]).await.map(drop),
                    true => put_writer.delete(vec![batch]).await.map(drop),
                };
                drop(put_writer);
                drop(open);
                put
            })
            .await;
            let context = match delete {
                false => "writing to the WAL",
                true => "writing tombstones to the WAL",
            };
            let put = match put {
                Ok(put) => put,
                Err(e) => {
                    return Err(Error::internal(format!(
                        "{context}: the put's task failed: {e}"
                    )));
                }
            };
            match put {
                Ok(()) => return Ok(()),
                Err(e) if e.is_backpressure() && refused < FULL_MEMTABLE_RETRIES => {
                    refused += 1;
                    self.freeze(writer)
                        .await
                        .map_err(|e| self.classify("freezing a full memtable", e))?;
                }
                Err(e) if e.is_backpressure() => {
                    return Err(Error::Busy {
                        message: format!(
                            "{context}: the memtable was full {refused} times in a row (other \
                             writes filled each new one first); try again"
                        ),
                    });
                }
                Err(e) => return Err(self.classify(context, e)),
            }
        }
    }

    /// Freeze the active memtable, holding the gate exclusively: no put is
    /// running, so every row in it is indexed (see the module docs). Does
    /// not wait for the flush: the fence does.
    async fn freeze(&self, writer: &ShardWriter) -> lance::Result<FreezeFence> {
        self.freeze_then(writer, || ()).await
    }

    /// [`Self::freeze`], calling `first` once the gate is held, before the
    /// freeze.
    async fn freeze_then(
        &self,
        writer: &ShardWriter,
        first: impl FnOnce(),
    ) -> lance::Result<FreezeFence> {
        let _closed = self.gate.write().await;
        first();
        writer.force_freeze_active().await
    }

    /// Take the shard back: claim a new epoch (replaying the WAL). The new
    /// writer is claimed before the old one is dropped, so a failed or
    /// cancelled claim leaves the old (fenced) writer in place and the store
    /// latched rather than writer-less. The latch is left set (and set if it
    /// was not): the caller clears it with [`Self::unlatch`], passing the
    /// count returned here, once nothing else can still write (under
    /// `SingleWriter`, after taking the other shards over), so no add is
    /// acknowledged while a peer still writes. A fence observed after this
    /// claim keeps the latch set.
    pub async fn reclaim(&self, dataset: &Dataset) -> Result<u64> {
        self.set_latch(FenceReason::PeerClaimedEpoch, self.claim_number());
        self.claim_again(dataset, None).await
    }

    /// Claim the shard anew and put the new writer in place of the old.
    /// With `after` (an epoch and the claim it belongs to), the claim must
    /// land on epoch `after + 1`: otherwise a peer claimed the shard since,
    /// the new writer is dropped and the store latched as fenced. When this
    /// handle claimed again meanwhile (a `reclaim`), nothing is claimed. The new claim's number.
    async fn claim_again(&self, dataset: &Dataset, after: Option<(u64, u64)>) -> Result<u64> {
        let mut guard = self.inner.write().await;
        if guard.is_none() {
            return Err(Error::WriterUnavailable {
                message: "the store is closed".to_string(),
            });
        }
        if let Some((_, claim)) = after
            && self.claim_number() != claim
        {
            // This handle's own `reclaim` replaced the writer since the
            // failure: the recovery is done (or met that claim's fence).
            return match self.check_latch() {
                Ok(()) => Ok(self.claim_number()),
                Err(e) => Err(e),
            };
        }
        let after = after.map(|(epoch, _)| epoch);
        let writer = claim(
            dataset,
            self.shard,
            &self.settings,
            "reclaiming the shard writer",
        )
        .await?;
        if let Some(epoch) = after
            && writer.epoch() != epoch + 1
        {
            tracing::warn!(
                shard = %self.shard,
                ours = epoch,
                claimed = writer.epoch(),
                "a peer claimed the shard while this writer recovered; it keeps the shard"
            );
            let _ = writer.abort().await;
            let err = Error::Fenced {
                shard: self.shard,
                reason: FenceReason::PeerClaimedEpoch,
            };
            self.latch(&err, self.claim_number());
            return Err(err);
        }
        let claimed = self.attempts.fetch_add(1, Ordering::SeqCst) + 1;
        if let Err(e) = self.publish_replayed(&writer).await {
            if e.is_fenced() {
                self.latch(&e, claimed);
            }
            let _ = writer.abort().await;
            return Err(e);
        }
        if let Some(old) = guard.replace(Arc::new(writer)) {
            // The old writer is fenced or poisoned: stop its tasks without I/O.
            let _ = old.abort().await;
        }
        self.claims.store(claimed, Ordering::SeqCst);
        Ok(claimed)
    }

    /// Accept writes again after [`Self::reclaim`] (or a recovery) that made
    /// claim `claim`, unless a fence met that claim (or a newer one) since.
    pub fn unlatch(&self, claim: u64) {
        let mut latch = self.latched.lock().unwrap_or_else(|p| p.into_inner());
        if latch.claim < claim {
            latch.reason = None;
        }
    }

    /// Flush and release the writer. Later adds fail with `WriterUnavailable`.
    pub async fn close(&self) -> Result<()> {
        let Some(writer) = self.inner.write().await.take() else {
            return Ok(());
        };
        if self.check_latch().is_err() {
            // A fenced writer cannot flush; everything it acknowledged is durable.
            let _ = writer.abort().await;
            return Ok(());
        }
        // Close freezes the active memtable: no put may be running (a put's
        // task lets its handle on the writer go before the gate).
        let _closed = self.gate.write().await;
        match Arc::try_unwrap(writer) {
            Ok(writer) => writer
                .close()
                .await
                .map_err(|e| self.classify("closing the shard writer", e)),
            Err(writer) => {
                // Not reached (only put tasks share the writer, and none
                // runs): stop it without a flush; every acknowledged row is
                // in a generation already.
                tracing::warn!(shard = %self.shard, "the writer is still shared at close; stopped without a flush");
                let _ = writer.abort().await;
                Ok(())
            }
        }
    }

    /// The shard's manifest store, the writer's epoch and its latest manifest:
    /// what the merge's cleanup needs to commit a manifest update under this
    /// writer's epoch.
    pub async fn manifest_access(
        &self,
    ) -> Result<(Arc<ShardManifestStore>, u64, Option<ShardManifest>)> {
        let guard = self.inner.read().await;
        let writer = guard.as_ref().ok_or_else(|| Error::WriterUnavailable {
            message: "the store is closed".to_string(),
        })?;
        let manifest = writer
            .manifest()
            .await
            .map_err(|e| self.classify("reading the shard manifest", e))?;
        Ok((writer.manifest_store(), writer.epoch(), manifest))
    }

    /// Generations this writer's shard lists, from the writer's own position
    /// (no I/O).
    pub async fn listed_generations(&self) -> Result<Vec<u64>> {
        let guard = self.inner.read().await;
        let Some(writer) = guard.as_ref() else {
            return Ok(Vec::new());
        };
        let manifest = writer
            .manifest()
            .await
            .map_err(|e| self.classify("reading the shard manifest", e))?;
        Ok(manifest
            .map(|m| m.sstables.iter().map(|s| s.generation).collect())
            .unwrap_or_default())
    }
}

impl Drop for Writer {
    /// Stop the writer's background tasks without I/O (every acknowledged row
    /// is already in a generation, so nothing is lost). Runs when the last
    /// handle on the store's engine goes, background task included.
    fn drop(&mut self) {
        let Some(writer) = self.inner.get_mut().take() else {
            return;
        };
        match tokio::runtime::Handle::try_current() {
            Ok(handle) => {
                handle.spawn(async move {
                    let _ = writer.abort().await;
                });
            }
            Err(_) => {
                // Outside any runtime: a small one just for the shutdown.
                if let Ok(rt) = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                {
                    let _ = rt.block_on(writer.abort());
                }
            }
        }
    }
}

/// Split a batch into slices of at most `max_rows` rows (zero-copy).
fn split(batch: &RecordBatch, max_rows: usize) -> Vec<RecordBatch> {
    if batch.num_rows() <= max_rows {
        return vec![batch.clone()];
    }
    (0..batch.num_rows())
        .step_by(max_rows)
        .map(|start| batch.slice(start, max_rows.min(batch.num_rows() - start)))
        .collect()
}
