//! Keyed reads without a plan per generation: the rows whose key (or
//! secondary key) is one of a list of values, newest version per key, as an
//! LSM scan with `column IN (values)` returns them.
//!
//! The checks of a record write (are these ids new, which record does each
//! secondary key name now) are such reads, one or two per write. Through the
//! LSM scanner each plans a scan of every source — the base table and each
//! unmerged generation — with the value list, and the planning, not the
//! reading, was most of an upsert's time. Here only the base table is read
//! through a plan (one indexed scan); the unmerged generations are held in
//! memory, whole, once read: a generation never changes once written, and the
//! unmerged tier is small (it is merged away; see [`MAX_HELD_BYTES`]).
//!
//! Newest version per key, as the LSM scan has it: a key's row in a
//! generation wins over its rows in older generations of the same shard and
//! in the base table; a Lance delete (`_tombstone`) wins and shows nothing.
//! A generation holds a key once (Lance writes an older duplicate deleted
//! when it flushes). The value list selects among newest versions only: a
//! base row whose key a generation rewrote is never returned, even when the
//! rewrite no longer matches.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};

use arrow_array::{Array, ArrayRef, BooleanArray, RecordBatch, StringArray, UInt32Array};
use arrow_schema::{Field, Schema};
use datafusion::logical_expr::Expr;
use futures::{StreamExt, TryStreamExt};
use lance::dataset::mem_wal::TOMBSTONE;
use lance::deps::datafusion;

use super::ReadView;
use crate::conform::Schemas;
use crate::dataset::Opener;
use crate::error::{Error, LanceResultExt, Result};

/// Above this many bytes of unmerged generations — as their writers
/// measured them, and as held in memory — keyed reads go through the LSM
/// scanner instead, and what was held is dropped.
pub(crate) const MAX_HELD_BYTES: usize = 128 << 20;

/// Generations read at once when a keyed read finds several not held.
const LOADS_AT_ONCE: usize = 8;

/// One unmerged generation, whole, with where each key is.
pub(crate) struct HeldGeneration {
    rows: RecordBatch,
    at: HashMap<String, u32>,
    /// Bytes held: the rows' buffers and the key map.
    bytes: usize,
}

impl HeldGeneration {
    fn read(rows: RecordBatch, key: &str) -> Result<Self> {
        let keys = strings(&rows, key)?;
        let mut at = HashMap::with_capacity(rows.num_rows());
        let mut key_bytes = 0;
        for (row, k) in keys.iter().enumerate() {
            if let Some(k) = k {
                key_bytes += k.len();
                at.insert(k.to_string(), row as u32);
            }
        }
        let entry = std::mem::size_of::<(String, u32)>() + 1;
        let bytes = rows.get_array_memory_size() + key_bytes + at.capacity() * entry;
        Ok(Self { rows, at, bytes })
    }

    fn deleted(&self, row: usize) -> bool {
        self.rows
            .column_by_name(TOMBSTONE)
            .and_then(|c| c.as_any().downcast_ref::<BooleanArray>())
            .is_some_and(|d| d.is_valid(row) && d.value(row))
    }
}

type Slot = Arc<tokio::sync::OnceCell<Arc<HeldGeneration>>>;

/// A held generation: its shard, its number, and the slot its rows load into.
struct Entry {
    shard: uuid::Uuid,
    generation: u64,
    slot: Slot,
}

/// Rows a write of this handle flushed as a generation, held before any
/// view lists it (see [`HeldGenerations::hold_written`]).
struct Written {
    shard: uuid::Uuid,
    generation: u64,
    held: Arc<HeldGeneration>,
}

impl Written {
    fn is(&self, shard: uuid::Uuid, generation: u64) -> bool {
        self.shard == shard && self.generation == generation
    }

    /// Whether a listing counting `rows` rows for it may be these rows.
    fn fits(&self, rows: Option<u64>) -> bool {
        rows == Some(self.held.rows.num_rows() as u64)
    }
}

/// Written generations kept for the views to come (the newest), and the
/// most they hold together: a quarter of what may be held (they are not
/// counted in it until a view lists them).
const WRITTEN_KEPT: usize = 4;
const WRITTEN_SHARE: usize = 4;

#[derive(Default)]
struct Held {
    /// By `<shard>/<dir>`.
    entries: HashMap<String, Entry>,
    /// Generations this handle wrote, not listed by a view yet.
    written: Vec<Written>,
    /// The generations listed when holding them went past the limit: while
    /// a view still lists every one of them, nothing is loaded (the tier
    /// only grows until a merge takes some away).
    refused: Vec<String>,
    /// By shard, the highest "merged up to" marker a view has shown: a read
    /// on an older view (a slow read, a background load) still reads the
    /// generations it lists, but does not hold again what a newer view
    /// showed merged.
    merged: HashMap<uuid::Uuid, u64>,
}

/// The unmerged generations a handle holds in memory, by shard and
/// directory: each read once (two reads wanting one generation share the
/// load), dropped once a read's view shows it merged.
pub(crate) struct HeldGenerations {
    held: Mutex<Held>,
    /// [`MAX_HELD_BYTES`], lowered by tests.
    limit: std::sync::atomic::AtomicUsize,
    /// Point lookups that found more than [`LOOKUP_LOAD_BYTES`] of the
    /// unmerged tier not held (see [`Self::warm`]).
    unheld_lookups: std::sync::atomic::AtomicUsize,
    /// The background load of the generations, the latest one started
    /// (running until it is finished; stopped when the store goes: see
    /// [`Self::stop_warming`]).
    warm_task: Mutex<Option<tokio::task::AbortHandle>>,
    /// Generations a read found not loaded (tests: a refusal is remembered).
    #[cfg(feature = "failpoints")]
    loads: std::sync::atomic::AtomicUsize,
    /// Keyed reads of the base table through its index alone, and through
    /// a plan (tests: which path a read took).
    #[cfg(feature = "failpoints")]
    base_reads: [std::sync::atomic::AtomicUsize; 2],
}

impl Default for HeldGenerations {
    fn default() -> Self {
        Self {
            held: Mutex::default(),
            limit: MAX_HELD_BYTES.into(),
            unheld_lookups: 0.into(),
            warm_task: Mutex::default(),
            #[cfg(feature = "failpoints")]
            loads: 0.into(),
            #[cfg(feature = "failpoints")]
            base_reads: Default::default(),
        }
    }
}

impl HeldGenerations {
    fn limit(&self) -> usize {
        self.limit.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Hold at most `bytes` (tests of the fallback).
    #[cfg(feature = "failpoints")]
    pub(crate) fn set_limit(&self, bytes: usize) {
        self.limit
            .store(bytes, std::sync::atomic::Ordering::Relaxed);
        self.lock().refused.clear();
    }

    /// Bytes held now, how many generations, and how many loads reads
    /// have started so far.
    #[cfg(feature = "failpoints")]
    pub(crate) fn held(&self) -> (usize, usize, usize) {
        let held = self.lock();
        let loaded: Vec<usize> = held
            .entries
            .values()
            .filter_map(|e| e.slot.get())
            .map(|g| g.bytes)
            .collect();
        let loads = self.loads.load(std::sync::atomic::Ordering::Relaxed);
        (loaded.iter().sum(), loaded.len(), loads)
    }

    /// Keyed reads of the base table so far: through its index alone, and
    /// through a plan.
    #[cfg(feature = "failpoints")]
    pub(crate) fn base_reads(&self) -> (usize, usize) {
        let [indexed, planned] = &self.base_reads;
        let read =
            |n: &std::sync::atomic::AtomicUsize| n.load(std::sync::atomic::Ordering::Relaxed);
        (read(indexed), read(planned))
    }

    /// Count a keyed read of the base table (tests).
    fn count_base_read(&self, _indexed: bool) {
        #[cfg(feature = "failpoints")]
        self.base_reads[usize::from(!_indexed)].fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }

    /// Hold `rows` — a write of this handle, in the stored schema — as
    /// generation `generation` of `shard`, the generation that write's own
    /// freeze flushed, so the next keyed read does not read back what was
    /// just written. Only when the writes to the shard are serialized (the
    /// caller holds the record lock, which every write of the store takes),
    /// so the generation holds these rows and nothing else; as a second
    /// guard, a view must list it with as many rows as `rows` has, else it
    /// is read as usual. Rows repeating a key are not held (the generation
    /// masks all but the last).
    pub(crate) fn hold_written(
        &self,
        shard: uuid::Uuid,
        generation: u64,
        rows: RecordBatch,
        key: &str,
    ) -> Result<()> {
        let n = rows.num_rows();
        let budget = self.limit() / WRITTEN_SHARE;
        if rows.get_array_memory_size() > budget {
            return Ok(());
        }
        let held = HeldGeneration::read(rows, key)?;
        if held.at.len() != n || held.bytes > budget {
            return Ok(());
        }
        let mut state = self.lock();
        let written = &mut state.written;
        written.retain(|w| !w.is(shard, generation));
        written.push(Written {
            shard,
            generation,
            held: Arc::new(held),
        });
        // The oldest go first.
        let mut bytes: usize = written.iter().map(|w| w.held.bytes).sum();
        while written.len() > WRITTEN_KEPT || bytes > budget {
            bytes -= written.remove(0).held.bytes;
        }
        Ok(())
    }

    /// The generations of `view`'s shards, newest first within each shard,
    /// read where not held yet. `None` (and nothing held any more) when they
    /// would hold more than the limit ([`MAX_HELD_BYTES`]); loading stops as
    /// soon as it passes it, and is not tried again until a merge takes one
    /// of those generations away.
    async fn of(
        &self,
        view: &ReadView,
        opener: &Opener,
        key: &str,
        lookup: bool,
    ) -> Result<Option<Vec<Vec<Arc<HeldGeneration>>>>> {
        let listed: Vec<(usize, uuid::Uuid, u64, &str, String)> = view
            .shards
            .iter()
            .enumerate()
            .flat_map(|(i, s)| {
                s.sstables.iter().rev().map(move |(generation, dir)| {
                    let shard = s.snapshot.shard_id;
                    (
                        i,
                        shard,
                        *generation,
                        dir.as_str(),
                        format!("{shard}/{dir}"),
                    )
                })
            })
            .collect();
        let Some(slots) = self.slots(view, &listed) else {
            return Ok(None);
        };
        #[cfg(feature = "failpoints")]
        self.loads.fetch_add(
            slots.iter().filter(|s| !s.initialized()).count(),
            std::sync::atomic::Ordering::Relaxed,
        );
        let loads: Vec<_> = listed
            .iter()
            .zip(slots)
            .map(|(&(_, shard, _, dir, _), slot)| {
                load(slot, opener, &view.dataset, shard, dir, key)
            })
            .collect();
        let mut loading = futures::stream::iter(loads).buffered(LOADS_AT_ONCE);
        let (mut loaded, mut bytes) = (Vec::with_capacity(listed.len()), 0);
        while let Some(generation) = loading.try_next().await? {
            bytes += generation.bytes;
            if bytes > self.limit() {
                drop(loading);
                if lookup {
                    // A lookup leaves what record writes hold alone.
                    return Ok(None);
                }
                let mut held = self.lock();
                held.entries.clear();
                held.written.clear();
                held.refused = listed.into_iter().map(|l| l.4).collect();
                return Ok(None);
            }
            loaded.push(generation);
        }
        let mut by_shard: Vec<Vec<Arc<HeldGeneration>>> = vec![Vec::new(); view.shards.len()];
        for ((shard, ..), generation) in listed.iter().zip(loaded) {
            by_shard[*shard].push(generation);
        }
        Ok(Some(by_shard))
    }

    /// The slot of each generation `listed` (index of the shard in `view`,
    /// shard, generation, directory, name), under the lock: what `view` shows
    /// merged is dropped first, and what this handle wrote is moved into its
    /// slot. `None` when loading the same generations was refused already.
    fn slots(
        &self,
        view: &ReadView,
        listed: &[(usize, uuid::Uuid, u64, &str, String)],
    ) -> Option<Vec<Slot>> {
        let mut held = self.lock();
        let names: HashSet<&str> = listed.iter().map(|l| l.4.as_str()).collect();
        if !held.refused.is_empty() && held.refused.iter().all(|n| names.contains(n.as_str())) {
            return None;
        }
        held.refused.clear();
        // Drop what this view, or a newer one, showed merged (at or
        // below its shard's marker).
        let Held {
            entries,
            written,
            merged,
            ..
        } = &mut *held;
        for s in &view.shards {
            let m = merged.entry(s.snapshot.shard_id).or_default();
            *m = (*m).max(s.merged_up_to);
        }
        let is_merged = |shard: &uuid::Uuid, g: u64| merged.get(shard).is_some_and(|&m| g <= m);
        entries.retain(|_, e| !is_merged(&e.shard, e.generation));
        written.retain(|w| !is_merged(&w.shard, w.generation));
        let slots: Vec<Slot> = listed
            .iter()
            .map(|(i, shard, generation, dir, name)| {
                // An older view lists it, a newer one showed it merged:
                // read for this read alone, not held.
                if is_merged(shard, *generation) {
                    return Slot::default();
                }
                let entry = entries.entry(name.clone()).or_insert_with(|| Entry {
                    shard: *shard,
                    generation: *generation,
                    slot: Slot::default(),
                });
                // What this handle wrote as that generation, when the
                // listing counts as many rows.
                if let Some(at) = written.iter().position(|w| w.is(*shard, *generation)) {
                    let w = written.remove(at);
                    if w.fits(view.shards[*i].sstable_rows.get(*dir).copied()) {
                        let _ = entry.slot.set(w.held);
                    }
                }
                entry.slot.clone()
            })
            .collect();
        Some(slots)
    }

    /// Bytes (as their writers measured them) of `view`'s generations not
    /// held yet.
    fn unheld_bytes(&self, view: &ReadView) -> u64 {
        let guard = self.lock();
        let held = &*guard;
        view.shards
            .iter()
            .flat_map(|s| {
                let shard = s.snapshot.shard_id;
                s.sstables.iter().map(move |(generation, dir)| {
                    let name = format!("{shard}/{dir}");
                    let written = held.written.iter().any(|w| {
                        w.is(shard, *generation) && w.fits(s.sstable_rows.get(dir).copied())
                    });
                    let loaded = held
                        .entries
                        .get(&name)
                        .is_some_and(|e| e.slot.initialized());
                    if written || loaded {
                        0
                    } else {
                        s.sstable_bytes.get(dir).copied().unwrap_or(0)
                    }
                })
            })
            .sum()
    }

    /// A point lookup found more of `view`'s generations not held than it
    /// loads itself ([`LOOKUP_LOAD_BYTES`]: a burst of adds written since
    /// the last read, or by another process) and goes through the planner,
    /// one lookup per generation. Without more, every later lookup would do
    /// the same until a merge: nothing loads them. From the second such
    /// lookup of this handle on (a handle serving lookups, not a one-shot
    /// command), the generations are loaded in the background, one load at a
    /// time, so the lookups that follow read them held. The tier is at most
    /// [`LOOKUP_TIER_BYTES`] here, so what is loaded is bounded.
    fn warm(self: &Arc<Self>, view: &ReadView, opener: &Opener, key: &str) {
        use std::sync::atomic::Ordering;
        if self.unheld_lookups.fetch_add(1, Ordering::Relaxed) == 0 {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let mut task = self.warm_task();
        if task.as_ref().is_some_and(|t| !t.is_finished()) {
            return;
        }
        let (held, view, opener, key) =
            (self.clone(), view.clone(), opener.clone(), key.to_string());
        let load = runtime.spawn(async move {
            // With `lookup`, a load passing the limit leaves what is held alone.
            if let Err(e) = held.of(&view, &opener, &key, true).await {
                tracing::debug!("loading unmerged generations for lookups: {e}");
            }
        });
        *task = Some(load.abort_handle());
    }

    fn warm_task(&self) -> std::sync::MutexGuard<'_, Option<tokio::task::AbortHandle>> {
        self.warm_task.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Stop a background load (the store is closed or dropped: nothing will
    /// read what it loads).
    pub(crate) fn stop_warming(&self) {
        let task = self.warm_task().take();
        if let Some(task) = task {
            task.abort();
        }
    }

    /// Whether a background load of generations is running (tests).
    #[cfg(feature = "failpoints")]
    pub(crate) fn warming(&self) -> bool {
        self.warm_task().as_ref().is_some_and(|t| !t.is_finished())
    }

    fn clear(&self) {
        let mut held = self.lock();
        held.entries.clear();
        held.written.clear();
        held.refused.clear();
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Held> {
        self.held.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// The generation `dir` of `shard`, read whole into `slot` unless another
/// read did (or is doing) it.
async fn load(
    slot: Slot,
    opener: &Opener,
    base: &lance::Dataset,
    shard: uuid::Uuid,
    dir: &str,
    key: &str,
) -> Result<Arc<HeldGeneration>> {
    let read = || async {
        let generation = opener.open_generation(base, &shard, dir).await?;
        let schema: Arc<Schema> = Arc::new(generation.schema().into());
        let batches: Vec<RecordBatch> = generation
            .scan()
            .try_into_stream()
            .await
            .ctx("reading a generation")?
            .try_collect()
            .await
            .ctx("reading a generation")?;
        let rows = arrow_select::concat::concat_batches(&schema, &batches)?;
        drop(batches);
        Ok::<_, Error>(Arc::new(HeldGeneration::read(rows, key)?))
    };
    slot.get_or_try_init(read).await.cloned()
}

/// What a keyed read asks for: see [`keyed_rows`].
#[derive(Clone, Copy)]
pub(crate) struct KeyedRead<'a> {
    pub column: &'a str,
    pub values: &'a [&'a str],
    pub hide: Option<&'a Expr>,
    pub columns: &'a [String],
    /// Only when the unmerged tier is at most [`LOOKUP_TIER_BYTES`] (point
    /// lookups: a lookup loads at most that much it does not hold yet; a
    /// larger tier is looked up generation by generation, and what the
    /// record writes hold is left alone).
    pub small_tier_only: bool,
}

/// The largest unmerged tier (as its writers measured it) a point lookup
/// reads through the held generations.
pub(crate) const LOOKUP_TIER_BYTES: u64 = 16 << 20;

/// The most a point lookup loads of generations not held yet (as their
/// writers measured them): loading a large new generation whole costs more
/// than looking a few keys up in it.
pub(crate) const LOOKUP_LOAD_BYTES: u64 = 1 << 20;

/// The rows of `view` whose `column` is one of `values`, newest version per
/// key, that `hide` (the visibility rule) leaves visible: the stored
/// columns `columns` (which include the key), in the stored schema's types.
/// `None` when this path does not apply — the unmerged tier is too large to
/// hold, the key or `column` is not a string column, a column is not stored,
/// or a generation lacks a stored column (written before it was added): the
/// caller reads through the LSM scanner.
pub(crate) async fn keyed_rows(
    view: &ReadView,
    schemas: &Schemas,
    opener: &Opener,
    held: &Arc<HeldGenerations>,
    read: KeyedRead<'_>,
) -> Result<Option<RecordBatch>> {
    let KeyedRead {
        column,
        values,
        hide,
        columns,
        small_tier_only,
    } = read;
    let key = schemas.key.as_str();
    let unmerged: u64 = view.shards.iter().map(|s| s.unmerged_bytes).sum();
    let unmeasured = view.shards.iter().any(|s| s.unmeasured);
    if small_tier_only {
        if unmeasured || unmerged > LOOKUP_TIER_BYTES.min(held.limit() as u64) {
            return Ok(None);
        }
        if held.unheld_bytes(view) > LOOKUP_LOAD_BYTES {
            held.warm(view, opener, key);
            return Ok(None);
        }
    }
    let utf8 = |c: &str| {
        schemas
            .stored
            .field_with_name(c)
            .is_ok_and(|f| f.data_type() == &arrow_schema::DataType::Utf8)
    };
    if unmerged > held.limit() as u64 || unmeasured {
        held.clear();
        return Ok(None);
    }
    if !utf8(key) || !utf8(column) {
        return Ok(None);
    }
    let Some(fields) = columns
        .iter()
        .map(|c| schemas.stored.field_with_name(c).ok().cloned())
        .collect::<Option<Vec<Field>>>()
    else {
        return Ok(None);
    };
    let out_schema = Arc::new(Schema::new(fields));
    // Every generation of every shard, newest first within a shard.
    let Some(generations) = held.of(view, opener, key, small_tier_only).await? else {
        return Ok(None);
    };
    let stored_missing = generations.iter().flatten().any(|generation| {
        schemas
            .stored
            .fields()
            .iter()
            .any(|f| generation.rows.column_by_name(f.name()).is_none())
    });
    if stored_missing {
        return Ok(None);
    }
    let Some(mut parts) = generation_parts(&generations, column, key, values, hide, &out_schema)?
    else {
        return Ok(None);
    };

    // The base table's matching rows that no generation rewrote.
    for batch in base_rows(view, column, values, hide, columns, key, held).await? {
        let keys = strings(&batch, key)?;
        let keep: BooleanArray = (0..batch.num_rows())
            .map(|row| {
                Some(keys.value_if(row).is_some_and(|k| {
                    generations
                        .iter()
                        .flatten()
                        .all(|generation| !generation.at.contains_key(k))
                }))
            })
            .collect();
        let batch = arrow_select::filter::filter_record_batch(&batch, &keep)?;
        if batch.num_rows() > 0 {
            let Some(part) = shaped(&batch, &out_schema, "base") else {
                return Ok(None);
            };
            parts.push(part);
        }
    }
    Ok(Some(arrow_select::concat::concat_batches(
        &out_schema,
        &parts,
    )?))
}

/// The newest versions in `generations` (each shard's, newest first) whose
/// `column` is one of `values` and that `hide` leaves visible, shaped to
/// `out_schema`; `None` when a generation's rows do not fit it.
fn generation_parts(
    generations: &[Vec<Arc<HeldGeneration>>],
    column: &str,
    key: &str,
    values: &[&str],
    hide: Option<&Expr>,
    out_schema: &Arc<Schema>,
) -> Result<Option<Vec<RecordBatch>>> {
    let wanted: HashSet<&str> = values.iter().copied().collect();
    let mut parts: Vec<RecordBatch> = Vec::new();

    // The generations' newest versions that match.
    for shard in generations {
        for (i, generation) in shard.iter().enumerate() {
            let keys = strings(&generation.rows, key)?;
            let matched: Vec<u32> = if column == key {
                wanted
                    .iter()
                    .filter_map(|v| generation.at.get(*v).copied())
                    .collect()
            } else {
                let of = strings(&generation.rows, column)?;
                (0..generation.rows.num_rows())
                    .filter(|&row| of.value_if(row).is_some_and(|v| wanted.contains(v)))
                    .map(|row| row as u32)
                    .collect()
            };
            let newest: Vec<u32> = matched
                .into_iter()
                .filter(|&row| {
                    let row = row as usize;
                    !generation.deleted(row)
                        && keys.value_if(row).is_some_and(|k| {
                            shard[..i].iter().all(|newer| !newer.at.contains_key(k))
                        })
                })
                .collect();
            if newest.is_empty() {
                continue;
            }
            let rows = arrow_select::take::take_record_batch(
                &generation.rows,
                &UInt32Array::from(newest),
            )?;
            let rows = match hide {
                Some(hide) => visible(&rows, hide)?,
                None => rows,
            };
            if rows.num_rows() > 0 {
                let Some(part) = shaped(&rows, out_schema, "generation") else {
                    return Ok(None);
                };
                parts.push(part);
            }
        }
    }
    Ok(Some(parts))
}

/// The base table's rows whose `column` is one of `values` and that `hide`
/// leaves visible, with `columns` and the key: through the column's index
/// alone where that is the whole answer ([`super::indexed`]), else through
/// an indexed scan Lance plans.
async fn base_rows(
    view: &ReadView,
    column: &str,
    values: &[&str],
    hide: Option<&Expr>,
    columns: &[String],
    key: &str,
    held: &HeldGenerations,
) -> Result<Vec<RecordBatch>> {
    let mut projected: Vec<&str> = columns.iter().map(String::as_str).collect();
    if !projected.contains(&key) {
        projected.push(key);
    }
    // The index read takes the rule's columns too and applies it here.
    let mut taken = projected.clone();
    for c in hide.iter().flat_map(|hide| hide.column_refs()) {
        if !taken.contains(&c.name.as_str()) {
            taken.push(c.name.as_str());
        }
    }
    if let Some(rows) = super::indexed::indexed_rows(&view.dataset, column, values, &taken).await? {
        held.count_base_read(true);
        let rows = match hide {
            Some(hide) => visible(&rows, hide)?,
            None => rows,
        };
        return Ok(vec![rows]);
    }
    held.count_base_read(false);
    let mut filter = super::key_filter(column, values);
    if let Some(hide) = hide {
        filter = filter.and(hide.clone());
    }
    let mut scan = view.dataset.scan();
    scan.project(&projected)
        .ctx("projecting a keyed read")?
        .filter_expr(filter);
    let stream = scan.try_into_stream().await.ctx("reading the base table")?;
    stream.try_collect().await.ctx("reading the base table")
}

/// `rows` that `hide` leaves visible.
fn visible(rows: &RecordBatch, hide: &Expr) -> Result<RecordBatch> {
    let schema = datafusion::common::DFSchema::try_from(rows.schema().as_ref().clone())
        .map_err(|e| Error::internal(format!("a generation's schema: {e}")))?;
    let predicate = super::session()
        .create_physical_expr(hide.clone(), &schema)
        .map_err(|e| Error::internal(format!("planning the visibility rule: {e}")))?;
    let shown = predicate
        .evaluate(rows)
        .and_then(|v| v.into_array(rows.num_rows()))
        .map_err(|e| Error::from_datafusion("applying the visibility rule", e))?;
    let shown = shown
        .as_any()
        .downcast_ref::<BooleanArray>()
        .ok_or_else(|| Error::internal("the visibility rule is not a predicate"))?;
    Ok(arrow_select::filter::filter_record_batch(rows, shown)?)
}

/// `rows`' columns of `schema`, by name, in its types. A generation stores
/// its columns nullable (a Lance delete nulls all but the key); the rows
/// kept are real rows, so a non-nullable column holds no null here. `None`
/// where the rows cannot take that shape (the caller reads through the LSM
/// scanner instead).
fn shaped(rows: &RecordBatch, schema: &Arc<Schema>, source: &str) -> Option<RecordBatch> {
    let shaped = shape(rows, schema);
    if shaped.is_none() {
        tracing::debug!(
            "{source} rows do not take the stored shape; reading through the LSM scanner"
        );
    }
    shaped
}

fn shape(rows: &RecordBatch, schema: &Arc<Schema>) -> Option<RecordBatch> {
    let columns: Vec<ArrayRef> = schema
        .fields()
        .iter()
        .map(|f| {
            let column = rows.column_by_name(f.name())?;
            if column.data_type() == f.data_type() {
                Some(column.clone())
            } else {
                let strict = arrow_cast::CastOptions {
                    safe: false,
                    ..Default::default()
                };
                arrow_cast::cast_with_options(column, f.data_type(), &strict).ok()
            }
        })
        .collect::<Option<_>>()?;
    RecordBatch::try_new(schema.clone(), columns).ok()
}

/// A string column of `batch`.
fn strings<'a>(batch: &'a RecordBatch, column: &str) -> Result<&'a StringArray> {
    batch
        .column_by_name(column)
        .and_then(|c| c.as_any().downcast_ref::<StringArray>())
        .ok_or_else(|| Error::internal(format!("column '{column}' is not a string column")))
}

/// A string array's value, `None` where null.
trait ValueIf {
    fn value_if(&self, row: usize) -> Option<&str>;
}

impl ValueIf for StringArray {
    fn value_if(&self, row: usize) -> Option<&str> {
        self.is_valid(row).then(|| self.value(row))
    }
}
