//! What the visibility rules hide, and how many rows of the base table they
//! show: the parsed rules, and the count of visible base rows a handle keeps
//! (and shares through the store) so that `count()` need not read the base
//! table. A merge carries that count to the base version it makes: the
//! count of the version it merged into, adjusted by the generations it merged
//! (see [`Rules::carry`]).

use std::collections::HashMap;
use std::sync::{Arc, LazyLock, Mutex};

use arrow_schema::{DataType, TimeUnit};
use lance::Dataset;
use lance::deps::datafusion::logical_expr::Expr;

use super::records::{
    CONTENT_TYPE, EXPIRES_AT, RETIRED_AT, STATUS, SUPERSEDED_BY, TOMBSTONE_CONTENT_TYPE, now_micros,
};
use crate::config::RecordCapabilities;
use crate::conform::Schemas;
use crate::error::{Error, Result};
use crate::merge::Merged;
use crate::read::{ReadView, ShardView, Visibility, parse_filter};

/// Parsed visibility rules by shape (which kinds of rows are shown).
type Parsed = HashMap<(bool, bool, bool), Option<Expr>>;

/// A store's visibility rules and its count of visible base rows; shared
/// between the store handle and its merges.
#[derive(Debug)]
pub(crate) struct Rules {
    capabilities: RecordCapabilities,
    schemas: Schemas,
    parsed: Mutex<Parsed>,
    /// The type of `expires_at` (with lifecycle): the clock's literal takes it.
    clock_type: Option<DataType>,
    /// The base table's visible rows at the last base version counted.
    count: Mutex<Option<VisibleCount>>,
}

impl Rules {
    pub(crate) fn new(capabilities: RecordCapabilities, schemas: Schemas) -> Self {
        let clock_type = schemas
            .stored
            .field_with_name(EXPIRES_AT)
            .ok()
            .map(|f| f.data_type().clone());
        Self {
            capabilities,
            schemas,
            clock_type,
            parsed: Mutex::new(HashMap::new()),
            count: Mutex::new(None),
        }
    }

    /// The expression that hides what `visibility` does not show, or `None`.
    ///
    /// The rule is parsed once per shape (which kinds of rows are shown),
    /// with a stand-in for the clock, and the clock's literal is replaced on
    /// each call: parsing it every time cost about half a millisecond of
    /// every count and scan.
    pub(crate) fn expr(&self, v: &Visibility) -> Result<Option<Expr>> {
        let shape = (v.include_tombstones, v.include_expired, v.include_retired);
        let cached = self
            .parsed
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&shape)
            .cloned();
        let rule = match cached {
            Some(rule) => rule,
            None => {
                let rule = self.parse(v)?;
                self.parsed
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .insert(shape, rule.clone());
                rule
            }
        };
        let Some(rule) = rule else {
            return Ok(None);
        };
        if !self.capabilities.lifecycle || v.include_expired {
            return Ok(Some(rule));
        }
        let now = v.now_micros.unwrap_or_else(now_micros);
        let column = self
            .clock_type
            .as_ref()
            .ok_or_else(|| Error::internal("the lifecycle rule without expires_at"))?;
        match with_clock(rule, now, column) {
            Some(rule) => Ok(Some(rule)),
            // Text with the clock in it would be read in the column's zone:
            // a rule whose clock cannot be set is refused, never guessed.
            None => Err(Error::internal(format!(
                "the visibility rule's clock could not be set (expires_at is {column}; \
                 a timestamp literal was expected in the parsed rule)"
            ))),
        }
    }

    /// The rule for `v` with [`NOW_STAND_IN`] as the clock, parsed from text
    /// built from the engine's own constants and typed literals only.
    fn parse(&self, v: &Visibility) -> Result<Option<Expr>> {
        let Some(text) = self.source(v, NOW_STAND_IN) else {
            return Ok(None);
        };
        parse_filter(&self.schemas.stored, &text)
            .map(Some)
            .map_err(|e| Error::internal(format!("the visibility rule does not parse: {e}")))
    }

    /// The rule's text for `v` with `now` as the clock (`None`: no rule).
    fn source(&self, v: &Visibility, now: i64) -> Option<String> {
        let caps = &self.capabilities;
        let schema = &self.schemas.logical;
        let mut parts = Vec::new();
        if caps.tombstones && !v.include_tombstones {
            parts.push(format!(
                "({CONTENT_TYPE} IS NULL OR {CONTENT_TYPE} <> {})",
                quote(TOMBSTONE_CONTENT_TYPE)
            ));
        }
        if caps.lifecycle && !v.include_expired {
            parts.push(format!(
                "({EXPIRES_AT} IS NULL OR {EXPIRES_AT} > {})",
                timestamp_literal(now)
            ));
        }
        if caps.lifecycle && !v.include_retired {
            parts.push(format!(
                "(({STATUS} IS NULL OR {STATUS} IN ('active', 'contradicted')) AND {RETIRED_AT} IS NULL)"
            ));
        }
        if (caps.supersession || caps.lifecycle)
            && !v.include_retired
            && schema.field_with_name(SUPERSEDED_BY).is_ok()
        {
            parts.push(format!("{SUPERSEDED_BY} IS NULL"));
        }
        (!parts.is_empty()).then(|| parts.join(" AND "))
    }

    /// The default rule's text with the clock at zero: what a shared count
    /// is for (built, not parsed: a count found needs no parse).
    fn rule_text(&self) -> String {
        self.source(&Visibility::default(), 0).unwrap_or_default()
    }

    /// The count of `dataset`'s visible rows at `now` this handle remembers,
    /// or the one shared through the store; `None` when neither holds.
    pub(crate) async fn known(&self, dataset: &Dataset, now: i64) -> Option<VisibleCount> {
        let data = fingerprint(dataset);
        let cached = self.count.lock().unwrap_or_else(|p| p.into_inner()).clone();
        if let Some(c) = cached
            && c.holds(data, now)
        {
            return Some(c);
        }
        let shared = SharedCount::read(dataset).await;
        if let Some(s) = shared
            && s.rule == self.rule_text()
            && s.count.holds(data, now)
        {
            *self.count.lock().unwrap_or_else(|p| p.into_inner()) = Some(s.count.clone());
            return Some(s.count);
        }
        None
    }

    /// Remember `count` and share it, unless the shared one is of a newer
    /// version.
    async fn keep(&self, dataset: &Dataset, count: VisibleCount) {
        *self.count.lock().unwrap_or_else(|p| p.into_inner()) = Some(count.clone());
        let shared = SharedCount::read(dataset).await;
        if shared.is_none_or(|s| s.count.version <= count.version) {
            SharedCount {
                count,
                rule: self.rule_text(),
            }
            .write(dataset)
            .await;
        }
    }

    /// The base table's rows `hide` (the rule at `now`) leaves visible,
    /// counted by a scan of their visibility columns (then remembered and
    /// shared).
    pub(crate) async fn counted(&self, dataset: &Dataset, hide: &Expr, now: i64) -> Result<u64> {
        let mut scan = dataset.scan();
        scan.filter_expr(hide.clone());
        let (visible, expiring) = if self.capabilities.lifecycle {
            expiries(scan).await?
        } else {
            let n = scan
                .count_rows()
                .await
                .map_err(|e| Error::from_lance("counting visible rows", None, e))?;
            (n, Vec::new())
        };
        let (expiring, until) = listing(expiring, None);
        let count = VisibleCount {
            version: dataset.version().version,
            data: fingerprint(dataset),
            from: now,
            until,
            visible,
            expiring: expiring.into(),
        };
        self.keep(dataset, count).await;
        Ok(visible)
    }

    /// After a compaction that committed right on top of `before`: `after`
    /// holds the same rows in new files (a compaction moves rows and drops
    /// deleted ones, which were never counted), so the count known for
    /// `before` — remembered or shared — holds for `after` as it is, its
    /// listed expiries included. Without it the first `count()` after every
    /// compaction read the visibility columns of every row. Nothing is
    /// carried when no count of `before` is known (nothing is scanned).
    pub(crate) async fn carry_rewrite(&self, before: &Dataset, after: &Dataset) {
        let now = now_micros();
        let Some(count) = self.known(before, now).await else {
            tracing::debug!("no visible count known before the compaction: none carried");
            return;
        };
        let count = VisibleCount {
            version: after.version().version,
            data: fingerprint(after),
            ..count
        };
        self.keep(after, count).await;
    }

    /// After a merge: the count of the base version it made, from the count
    /// of the version it merged into (remembered or shared; 0 for an empty
    /// table) adjusted by the generations it merged — as a read adjusts the
    /// base count by unmerged generations — so the first `count()` at the new
    /// version, in any process, need not read the base table. When the
    /// earlier count is not known nothing is carried (a merge never scans
    /// the base table for it). Errors are logged, never raised: the count is
    /// then taken by the next `count()`.
    pub(crate) async fn carry(&self, merged: &Merged) {
        if let Err(e) = self.try_carry(merged).await {
            tracing::warn!("keeping the visible count across a merge: {e}");
        }
    }

    async fn try_carry(&self, merged: &Merged) -> Result<()> {
        let now = now_micros();
        let Some(hide) = self.expr(&Visibility {
            now_micros: Some(now),
            ..Visibility::default()
        })?
        else {
            return Ok(());
        };
        let before = match self.known(&merged.before, now).await {
            Some(c) => Some(c),
            None if merged.before.count_rows(None).await.unwrap_or(1) == 0 => Some(VisibleCount {
                version: merged.before.version().version,
                data: fingerprint(&merged.before),
                from: now,
                until: None,
                visible: 0,
                expiring: Arc::from([]),
            }),
            None => None,
        };
        let Some(before) = before else {
            // Counting the whole new version here would make every merge as
            // slow as a scan of the base table whenever the count lapsed
            // (rows past the listed expiries expired): the next `count()`
            // takes it instead.
            tracing::debug!("no visible count known before the merge: none carried");
            return Ok(());
        };
        let mut snapshot = lance::dataset::mem_wal::scanner::ShardSnapshot::new(merged.shard);
        for (generation, path) in &merged.sstables {
            snapshot = snapshot.with_sstable(*generation, path.clone());
        }
        let view = ReadView {
            dataset: merged.before.clone(),
            shards: vec![ShardView {
                snapshot,
                unmerged: merged.sstables.len(),
                listed: merged.sstables.len(),
                sstables: merged.sstables.clone(),
                unmerged_rows: 0,
                unmerged_bytes: 0,
                sstable_bytes: Default::default(),
                sstable_rows: Default::default(),
                merged_up_to: 0,
                unmeasured: true,
                gap: false,
            }],
            generations: merged.generations.clone(),
        };
        let Some(tally) = crate::read::tally(
            &view,
            &self.schemas.key,
            &merged.opener,
            before.at(now),
            Some(&hide),
            self.capabilities.lifecycle.then_some(EXPIRES_AT),
        )
        .await?
        else {
            return Ok(());
        };
        // The listed expiries still ahead, less those of the base rows the
        // merge replaced (each listed once; one past `until` was never
        // listed), plus those of the merged rows that count.
        let mut expiring: Vec<i64> = before
            .expiring
            .iter()
            .copied()
            .filter(|&e| e > now)
            .collect();
        for gone in tally.removed {
            if before.until.is_some_and(|u| gone >= u) {
                continue;
            }
            match expiring.binary_search(&gone) {
                Ok(at) => {
                    expiring.remove(at);
                }
                Err(_) => {
                    // A counted row's expiry the count did not list: the
                    // count does not describe these rows; carry nothing.
                    tracing::debug!("a replaced row's expiry was not listed: no count carried");
                    return Ok(());
                }
            }
        }
        expiring.extend(tally.added);
        let (expiring, until) = listing(expiring, before.until);
        let count = VisibleCount {
            version: merged.after.version().version,
            data: fingerprint(&merged.after),
            from: now,
            until,
            visible: tally.count,
            expiring: expiring.into(),
        };
        self.keep(&merged.after, count).await;
        Ok(())
    }
}

fn quote(value: &str) -> String {
    format!("'{}'", value.replace('\'', "''"))
}

fn timestamp_literal(micros: i64) -> String {
    format!("TIMESTAMP '{}'", timestamp_text(micros))
}

/// `micros` as the text of a timestamp literal.
fn timestamp_text(micros: i64) -> String {
    match arrow_array::temporal_conversions::timestamp_us_to_datetime(micros) {
        Some(t) => t.format("%Y-%m-%d %H:%M:%S%.6f").to_string(),
        None => "1970-01-01 00:00:00".to_string(),
    }
}

/// The clock in a cached visibility rule (2000-01-01 00:00:00.123457 UTC),
/// replaced by [`with_clock`]; its sub-millisecond digits make it unlikely
/// to be mistaken for any other literal.
const NOW_STAND_IN: i64 = 946_684_800_123_457;

/// [`NOW_STAND_IN`] as the parser keeps it (formatted once, not per call).
static STAND_IN_TEXT: LazyLock<String> = LazyLock::new(|| timestamp_text(NOW_STAND_IN));

/// `rule` with [`NOW_STAND_IN`]'s literal (the parser keeps a timestamp
/// literal as its text, cast to a zone-less timestamp) replaced by `now` as a
/// literal of `column`'s own type — its unit (rounded down: `t > ⌊now⌋` is
/// `t > now` for whole units) and its zone, so the comparison is of instants
/// with no cast at all (a zone-less text literal compared with a zoned column
/// would be read as that zone's local time). `None` when no such literal was
/// found or `column` is not a timestamp.
fn with_clock(rule: Expr, now: i64, column: &DataType) -> Option<Expr> {
    use lance::deps::datafusion::common::ScalarValue;
    use lance::deps::datafusion::common::tree_node::{Transformed, TreeNode};
    let clock = match column {
        DataType::Timestamp(TimeUnit::Second, tz) => {
            ScalarValue::TimestampSecond(Some(now.div_euclid(1_000_000)), tz.clone())
        }
        DataType::Timestamp(TimeUnit::Millisecond, tz) => {
            ScalarValue::TimestampMillisecond(Some(now.div_euclid(1_000)), tz.clone())
        }
        DataType::Timestamp(TimeUnit::Microsecond, tz) => {
            ScalarValue::TimestampMicrosecond(Some(now), tz.clone())
        }
        DataType::Timestamp(TimeUnit::Nanosecond, tz) => {
            // Past the year 2262 (a caller's clock, `Visibility::now_micros`):
            // nothing expires after the largest instant.
            ScalarValue::TimestampNanosecond(Some(now.saturating_mul(1_000)), tz.clone())
        }
        _ => return None,
    };
    let is_stand_in = |e: &Expr| matches!(e, Expr::Literal(ScalarValue::Utf8(Some(text)), _) if *text == *STAND_IN_TEXT);
    let mut replaced = false;
    let rule = rule
        .transform_down(|e| {
            let found = match &e {
                Expr::Cast(c) => is_stand_in(&c.expr),
                Expr::TryCast(c) => is_stand_in(&c.expr),
                other => is_stand_in(other),
            };
            if !found {
                return Ok(Transformed::no(e));
            }
            replaced = true;
            Ok(Transformed::yes(Expr::Literal(clock.clone(), None)))
        })
        .ok()?
        .data;
    replaced.then_some(rule)
}

/// The rows `scan` yields and their expiries (it reads `expires_at` only),
/// in microseconds rounded up ([`crate::read::micros_up`]): at most
/// [`LISTED_EXPIRIES`]` + 1`, the earliest, are kept (what [`listing`]
/// needs), whatever the number of rows.
async fn expiries(mut scan: lance::dataset::scanner::Scanner) -> Result<(u64, Vec<i64>)> {
    let what = "counting visible rows";
    scan.project(&[EXPIRES_AT])
        .map_err(|e| Error::from_lance("projecting expires_at", None, e))?;
    let mut stream = scan
        .try_into_stream()
        .await
        .map_err(|e| Error::from_lance(what, None, e))?;
    let mut rows = 0u64;
    // The earliest expiries seen, the latest of them on top.
    let mut earliest = std::collections::BinaryHeap::with_capacity(LISTED_EXPIRIES + 1);
    while let Some(batch) = futures::TryStreamExt::try_next(&mut stream)
        .await
        .map_err(|e| Error::from_lance(what, None, e))?
    {
        rows += batch.num_rows() as u64;
        for e in crate::read::micros_up(batch.column(0))?
            .into_iter()
            .flatten()
        {
            keep_earliest(&mut earliest, e);
        }
    }
    Ok((rows, earliest.into_vec()))
}

/// Keep `e` among the [`LISTED_EXPIRIES`]` + 1` earliest expiries in `heap`.
fn keep_earliest(heap: &mut std::collections::BinaryHeap<i64>, e: i64) {
    if heap.len() <= LISTED_EXPIRIES {
        heap.push(e);
    } else if heap.peek().is_some_and(|&top| e < top) {
        heap.pop();
        heap.push(e);
    }
}

/// How many expiries a count lists (see [`VisibleCount`]): past that many
/// expiries, the count lapses and is taken again.
const LISTED_EXPIRIES: usize = 4096;

/// A count's expiry list from the expiries of the rows it counts (any order)
/// and the bound `until` already had: the earliest [`LISTED_EXPIRIES`] below
/// it, ascending, and the new bound — the first expiry not listed.
fn listing(mut expiring: Vec<i64>, until: Option<i64>) -> (Vec<i64>, Option<i64>) {
    if let Some(u) = until {
        expiring.retain(|&e| e < u);
    }
    expiring.sort_unstable();
    if expiring.len() <= LISTED_EXPIRIES {
        return (expiring, until);
    }
    let first_unlisted = expiring[LISTED_EXPIRIES];
    // Equal expiries are listed together or not at all.
    let keep = expiring.partition_point(|&e| e < first_unlisted);
    expiring.truncate(keep);
    (expiring, Some(first_unlisted))
}

/// What the rows of `dataset`'s base table are made of: its columns (name,
/// field id, type: dropping, renaming or re-adding a column changes no data
/// file) and its fragments, their data, overlay and deletion files (FNV-1a,
/// stable across builds). Two versions with the same fingerprint hold the
/// same rows — an index commit keeps it — while a dataset recreated in place
/// gets new file names.
pub(crate) fn fingerprint(dataset: &Dataset) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    let mut mix = |bytes: &[u8]| {
        for b in bytes.iter().chain(&[0xff]) {
            hash ^= u64::from(*b);
            hash = hash.wrapping_mul(0x0100_0000_01b3);
        }
    };
    for field in dataset.schema().fields_pre_order() {
        mix(field.name.as_bytes());
        mix(&field.id.to_le_bytes());
        mix(field.data_type().to_string().as_bytes());
    }
    for fragment in dataset.manifest().fragments.iter() {
        mix(&fragment.id.to_le_bytes());
        mix(&(fragment.physical_rows.unwrap_or(usize::MAX) as u64).to_le_bytes());
        for file in &fragment.files {
            mix(file.path.as_bytes());
        }
        for overlay in &fragment.overlays {
            mix(overlay.data_file.path.as_bytes());
            mix(&overlay.committed_version.to_le_bytes());
        }
        if let Some(d) = &fragment.deletion_file {
            mix(&d.read_version.to_le_bytes());
            mix(&d.id.to_le_bytes());
        }
    }
    hash
}

/// The base table's visible rows at one version, and how long that holds.
///
/// `visible` rows were visible at `from`. Nothing in the visibility rule
/// depends on the clock but expiry, and a row hidden by expiry never shows
/// again: the count at a later time is `visible` less the rows whose expiry
/// has passed. `expiring` lists those expiries (microseconds rounded up:
/// a row shows while `now` is before its entry), ascending — every counted
/// row's expiry before `until` (exclusive; `None`: all of them), so the
/// count holds from `from` until `until`, for every version with the same
/// rows (`data`, see [`fingerprint`]). `version` only orders shared counts.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct VisibleCount {
    version: u64,
    data: u64,
    from: i64,
    until: Option<i64>,
    visible: u64,
    /// Shared: a handle hands its remembered count out on every `count()`.
    expiring: Arc<[i64]>,
}

impl VisibleCount {
    fn holds(&self, data: u64, now: i64) -> bool {
        self.data == data && now >= self.from && self.until.is_none_or(|u| now < u)
    }

    /// The visible rows at `now` (a time the count [`Self::holds`] for).
    pub(crate) fn at(&self, now: i64) -> u64 {
        let expired = self.expiring.partition_point(|&e| e <= now) as u64;
        self.visible.saturating_sub(expired)
    }
}

/// The last [`VisibleCount`] any handle of the store computed or a merge
/// carried, kept in `_lance_context/visible_count` so that the next process
/// (every CLI command is one) need not count the base table again: one small
/// read instead of a scan of the visibility columns of every row.
///
/// It stands for the rows of one base version (their fingerprint: a dataset
/// recreated in place has other files) and for one visibility rule (its
/// text, with the clock at zero). A handle that cannot write there
/// (read-only credentials) still counts correctly; it only does not share
/// its count.
#[derive(Debug, Clone, PartialEq)]
struct SharedCount {
    count: VisibleCount,
    rule: String,
}

impl SharedCount {
    /// Format tag: a change of the line's meaning changes it.
    const TAG: &'static str = "v3";

    fn path(dataset: &Dataset) -> object_store::path::Path {
        crate::dataset::engine_dir(dataset).join("visible_count")
    }

    /// `v3 <version> <data fingerprint, hex> <from> <until or -> <visible>
    /// <expiring, comma-separated, runs as expiry*rows; or -> <rule>`
    fn encode(&self) -> String {
        let c = &self.count;
        let until = c.until.map_or("-".to_string(), |u| u.to_string());
        let expiring = if c.expiring.is_empty() {
            "-".to_string()
        } else {
            // Runs of one expiry (rows written together with one time to
            // live) as `<expiry>*<rows>`.
            let mut runs: Vec<String> = Vec::new();
            for run in c.expiring.chunk_by(|a, b| a == b) {
                runs.push(match run.len() {
                    1 => run[0].to_string(),
                    n => format!("{}*{n}", run[0]),
                });
            }
            runs.join(",")
        };
        format!(
            "{} {} {:016x} {} {} {} {} {}\n",
            Self::TAG,
            c.version,
            c.data,
            c.from,
            until,
            c.visible,
            expiring,
            self.rule
        )
    }

    /// `None` for anything that does not parse (a torn or foreign write, an
    /// expiry list out of order or past `until`): the count is then taken
    /// again.
    fn decode(text: &str) -> Option<Self> {
        let mut parts = text.strip_suffix('\n')?.splitn(8, ' ');
        if parts.next()? != Self::TAG {
            return None;
        }
        let version = parts.next()?.parse().ok()?;
        let data = u64::from_str_radix(parts.next()?, 16).ok()?;
        let from: i64 = parts.next()?.parse().ok()?;
        let until: Option<i64> = match parts.next()? {
            "-" => None,
            u => Some(u.parse().ok()?),
        };
        let visible: u64 = parts.next()?.parse().ok()?;
        let mut expiring: Vec<i64> = Vec::new();
        match parts.next()? {
            "-" => {}
            listed => {
                for run in listed.split(',') {
                    let (e, n): (i64, usize) = match run.split_once('*') {
                        Some((e, n)) => (e.parse().ok()?, n.parse::<usize>().ok()?),
                        None => (run.parse().ok()?, 1),
                    };
                    if n == 0 || n > LISTED_EXPIRIES - expiring.len() {
                        return None;
                    }
                    expiring.extend(std::iter::repeat_n(e, n));
                }
            }
        }
        let ordered = expiring.windows(2).all(|w| w[0] <= w[1]);
        let bounded = expiring
            .iter()
            .all(|&e| e > from && until.is_none_or(|u| e < u));
        if !ordered || !bounded || expiring.len() as u64 > visible {
            return None;
        }
        let rule = parts.next()?.to_string();
        Some(Self {
            count: VisibleCount {
                version,
                data,
                from,
                until,
                visible,
                expiring: expiring.into(),
            },
            rule,
        })
    }

    async fn read(dataset: &Dataset) -> Option<Self> {
        let store = match dataset.object_store(None).await {
            Ok(store) => store,
            Err(e) => {
                tracing::debug!("reading the shared visible count: {e}");
                return None;
            }
        };
        match store.read_one_all(&Self::path(dataset)).await {
            Ok(bytes) => Self::decode(&String::from_utf8_lossy(&bytes)),
            Err(e) if e.is_not_found() => None,
            Err(e) => {
                tracing::debug!("reading the shared visible count: {e}");
                None
            }
        }
    }

    async fn write(&self, dataset: &Dataset) {
        let written = match dataset.object_store(None).await {
            Ok(store) => store
                .put(&Self::path(dataset), self.encode().as_bytes())
                .await
                .map(|_| ()),
            Err(e) => Err(e),
        };
        if let Err(e) = written {
            tracing::debug!("sharing the visible count: {e}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow_schema::Schema;

    /// The clocked rule hides a row exactly when its expiry, rounded up to
    /// the microsecond ([`crate::read::micros_up`], what a count lists), is
    /// not after `now` — in every unit and zone a column may have.
    #[test]
    fn the_clocked_rule_hides_exactly_what_a_count_lists_as_expired() {
        use arrow_array::{ArrayRef, BooleanArray, RecordBatch};
        use lance::deps::datafusion::common::DFSchema;
        let now: i64 = 1_790_000_000_654_321;
        let zones: [Option<&str>; 5] = [
            None,
            Some("UTC"),
            Some("+05:00"),
            Some("-05:00"),
            Some("America/New_York"),
        ];
        for tz in zones {
            for unit in [
                TimeUnit::Second,
                TimeUnit::Millisecond,
                TimeUnit::Microsecond,
                TimeUnit::Nanosecond,
            ] {
                let data_type = DataType::Timestamp(unit, tz.map(Into::into));
                let schema = Arc::new(Schema::new(vec![arrow_schema::Field::new(
                    EXPIRES_AT,
                    data_type.clone(),
                    true,
                )]));
                let text = format!(
                    "{EXPIRES_AT} IS NULL OR {EXPIRES_AT} > {}",
                    timestamp_literal(NOW_STAND_IN)
                );
                let rule = parse_filter(&schema, &text).unwrap();
                assert!(
                    with_clock(rule.clone(), i64::MAX, &data_type).is_some(),
                    "{unit:?} {tz:?}: a clock at the end of time"
                );
                let clocked = with_clock(rule, now, &data_type).expect("the stand-in is found");
                // Expiries around `now`, in the column's unit: one unit
                // before, at and after it, and a microsecond either side.
                let in_unit = |micros: i64| match unit {
                    TimeUnit::Second => micros.div_euclid(1_000_000),
                    TimeUnit::Millisecond => micros.div_euclid(1_000),
                    TimeUnit::Microsecond => micros,
                    TimeUnit::Nanosecond => micros * 1_000,
                };
                let mut values: Vec<i64> = Vec::new();
                for micros in [
                    now - 1,
                    now,
                    now + 1,
                    now - 3_600_000_000,
                    now + 3_600_000_000,
                ] {
                    let at = in_unit(micros);
                    values.extend([at - 1, at, at + 1]);
                }
                let column: ArrayRef = arrow_cast::cast(
                    &(Arc::new(arrow_array::Int64Array::from(values.clone())) as ArrayRef),
                    &data_type,
                )
                .unwrap();
                let batch = RecordBatch::try_new(schema.clone(), vec![column.clone()]).unwrap();
                let df_schema = DFSchema::try_from(schema.as_ref().clone()).unwrap();
                let shown = crate::read::session()
                    .create_physical_expr(clocked, &df_schema)
                    .unwrap()
                    .evaluate(&batch)
                    .unwrap()
                    .into_array(batch.num_rows())
                    .unwrap();
                let shown = shown.as_any().downcast_ref::<BooleanArray>().unwrap();
                let expiries = crate::read::micros_up(&column).unwrap();
                for (i, e) in expiries.iter().enumerate() {
                    let e = e.unwrap();
                    assert_eq!(
                        shown.value(i),
                        e > now,
                        "{unit:?} {tz:?}: expiry {} ({e} µs) against {now}",
                        values[i]
                    );
                }
            }
        }
    }

    #[test]
    fn a_shared_count_reads_back_as_written_and_refuses_anything_else() {
        let shared = SharedCount {
            count: VisibleCount {
                version: 42,
                data: 0x0123_4567_89ab_cdef,
                from: 1_700_000_000_000_000,
                until: Some(1_800_000_000_000_000),
                visible: 999_983,
                expiring: Arc::from([
                    1_700_000_000_000_001,
                    1_750_000_000_000_000,
                    1_750_000_000_000_000,
                    1_750_000_000_000_000,
                ]),
            },
            rule: "(content_type IS NULL OR content_type <> 'tombstone')".to_string(),
        };
        assert_eq!(SharedCount::decode(&shared.encode()), Some(shared.clone()));
        let forever = SharedCount {
            count: VisibleCount {
                until: None,
                expiring: Arc::from([]),
                ..shared.count.clone()
            },
            ..shared.clone()
        };
        assert_eq!(SharedCount::decode(&forever.encode()), Some(forever));
        // Torn, foreign or other-format lines are not trusted.
        let text = shared.encode();
        assert_eq!(SharedCount::decode(&text[..text.len() / 2]), None);
        assert_eq!(SharedCount::decode(""), None);
        assert_eq!(SharedCount::decode(&text.replacen("v3", "v2", 1)), None);
        // An expiry list out of order, at or before `from`, at or past
        // `until`, or longer than the count.
        assert!(
            text.contains(" 1700000000000001,1750000000000000*3 "),
            "{text}"
        );
        let with_list = |list: &str| text.replacen("1700000000000001,1750000000000000*3", list, 1);
        assert!(SharedCount::decode(&with_list("1700000000000001,1750000000000000")).is_some());
        assert_eq!(SharedCount::decode(&with_list("1750000000000000*0")), None);
        let too_many = format!("1750000000000000*{}", LISTED_EXPIRIES + 1);
        assert_eq!(SharedCount::decode(&with_list(&too_many)), None);
        // A run that would wrap the length around is refused, not a panic.
        let wrapping = format!("1750000000000000,1750000000000000*{}", usize::MAX);
        assert_eq!(SharedCount::decode(&with_list(&wrapping)), None);
        assert_eq!(
            SharedCount::decode(&with_list("1750000000000000,1700000000000001")),
            None
        );
        assert_eq!(SharedCount::decode(&with_list("1700000000000000")), None);
        assert_eq!(SharedCount::decode(&with_list("1800000000000000")), None);
        assert_eq!(SharedCount::decode(&with_list("1700000000000001,x")), None);
        let short = text.replacen(" 999983 ", " 1 ", 1);
        assert_eq!(SharedCount::decode(&short), None);
        assert_eq!(
            SharedCount::decode(&text.replacen("999983", "many", 1)),
            None
        );
        assert_eq!(
            SharedCount::decode(&text.replacen("0123456789abcdef", "xyz", 1)),
            None
        );
    }

    #[test]
    fn a_count_holds_for_its_rows_until_the_first_unlisted_expiry() {
        let count = VisibleCount {
            version: 3,
            data: 7,
            from: 100,
            until: Some(200),
            visible: 5,
            expiring: Arc::from([120, 150, 150]),
        };
        assert!(count.holds(7, 100) && count.holds(7, 199));
        assert!(!count.holds(8, 150), "other rows");
        assert!(!count.holds(7, 200), "a row past the list expired");
        assert!(!count.holds(7, 99), "before it was taken");
        // A row shows while the clock is before its (rounded-up) expiry.
        assert_eq!(count.at(100), 5);
        assert_eq!(count.at(119), 5);
        assert_eq!(count.at(120), 4);
        assert_eq!(count.at(149), 4);
        assert_eq!(count.at(150), 2);
        assert_eq!(count.at(199), 2);
    }

    #[test]
    fn a_listing_keeps_the_earliest_expiries_and_bounds_the_rest() {
        assert_eq!(listing(vec![5, 3, 9], None), (vec![3, 5, 9], None));
        assert_eq!(listing(vec![5, 3, 9], Some(9)), (vec![3, 5], Some(9)));
        let many: Vec<i64> = (0..LISTED_EXPIRIES as i64 + 10).rev().collect();
        let (listed, until) = listing(many, None);
        assert_eq!(listed.len(), LISTED_EXPIRIES);
        assert_eq!(listed[0], 0);
        assert_eq!(until, Some(LISTED_EXPIRIES as i64));
        // Equal expiries are listed together or not at all.
        let mut tied = vec![1; LISTED_EXPIRIES - 1];
        tied.extend([7, 7, 8]);
        let (listed, until) = listing(tied, Some(100));
        assert_eq!((listed.len(), until), (LISTED_EXPIRIES - 1, Some(7)));
        // A scan keeps the earliest expiries whatever their order.
        let mut heap = std::collections::BinaryHeap::new();
        let n = 3 * LISTED_EXPIRIES as i64;
        for i in 0..n {
            keep_earliest(&mut heap, (i * 7_919) % n);
        }
        let (listed, until) = listing(heap.into_vec(), None);
        let expected: Vec<i64> = (0..LISTED_EXPIRIES as i64).collect();
        assert_eq!(listed, expected);
        assert_eq!(until, Some(LISTED_EXPIRIES as i64));
    }

    #[test]
    fn expiries_round_up_to_the_microsecond_the_rule_compares_them_at() {
        use arrow_array::{ArrayRef, TimestampMillisecondArray, TimestampNanosecondArray};
        let nanos: ArrayRef = std::sync::Arc::new(TimestampNanosecondArray::from(vec![
            Some(5_000),
            Some(5_001),
            Some(5_999),
            None,
            Some(-1_500),
        ]));
        assert_eq!(
            crate::read::micros_up(&nanos).unwrap(),
            vec![Some(5), Some(6), Some(6), None, Some(-1)]
        );
        let millis: ArrayRef = std::sync::Arc::new(TimestampMillisecondArray::from(vec![7]));
        assert_eq!(crate::read::micros_up(&millis).unwrap(), vec![Some(7_000)]);
    }
}
