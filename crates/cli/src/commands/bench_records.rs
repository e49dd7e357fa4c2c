//! `lance-context dev bench --records-rows N`: what record capabilities cost at
//! scale, and what retention saves, side by side in one run.
//!
//! Two stores of the same context-like schema (key, secondary key, run,
//! text, lifecycle and supersession columns) hold the same N rows, merged
//! into the base table: one declares no capabilities, the other all four
//! (tombstones, supersession, lifecycle, unique keys on `external_id`). Each
//! figure is timed on both, interleaved, and reported with its ratio:
//! `get` (p50/p95 of random keys), `count`, a selective filtered scan, and an
//! upsert of 1,000 rows (an add of 1,000 rows on the plain store), of
//! records clustered in the table and of records spread over it; then the
//! reads alone an upsert makes before writing (`Store::check_upsert`), and
//! with a plain add's time the least an upsert can cost.
//!
//! Then two small stores run 100 add+merge rounds, one with the default
//! retention and one keeping every version; the bytes on disk are compared
//! with the base table's own data files after maintenance has run past the
//! cleanup grace.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, ensure};
use arrow_array::{RecordBatch, StringArray, TimestampMicrosecondArray};
use arrow_schema::{DataType, Field, Schema, SchemaRef, TimeUnit};
use lance_context_store::{RecordCapabilities, RetentionSettings, ScanRequest, Store, StoreConfig};

fn schema() -> SchemaRef {
    let ts = |n: &str| Field::new(n, DataType::Timestamp(TimeUnit::Microsecond, None), true);
    let s = |n: &str, nullable| Field::new(n, DataType::Utf8, nullable);
    Arc::new(Schema::new(vec![
        s("id", false),
        s("external_id", true),
        s("run_id", false),
        s("text", true),
        Field::new(
            "created_at",
            DataType::Timestamp(TimeUnit::Microsecond, None),
            false,
        ),
        ts("expires_at"),
        s("lifecycle_status", true),
        ts("retired_at"),
        s("supersedes_id", true),
        s("superseded_by_id", true),
        s("content_type", true),
    ]))
}

fn batch(prefix: &str, start: usize, n: usize) -> Result<RecordBatch> {
    let now = chrono::Utc::now().timestamp_micros();
    let ids = |f: &dyn Fn(usize) -> String| -> Arc<StringArray> {
        Arc::new(StringArray::from_iter_values((start..start + n).map(f)))
    };
    Ok(RecordBatch::try_new(
        schema(),
        vec![
            ids(&|i| format!("{prefix}{i:010}")),
            ids(&|i| format!("ext-{prefix}{i:010}")),
            ids(&|i| format!("run-{}", i / 1000)),
            ids(&|i| format!("record {i}: some context text for the agent")),
            Arc::new(TimestampMicrosecondArray::from(vec![now; n])),
            Arc::new(TimestampMicrosecondArray::from(vec![None::<i64>; n])),
            Arc::new(StringArray::from(vec![Some("active"); n])),
            Arc::new(TimestampMicrosecondArray::from(vec![None::<i64>; n])),
            Arc::new(StringArray::from(vec![None::<&str>; n])),
            Arc::new(StringArray::from(vec![None::<&str>; n])),
            Arc::new(StringArray::from(vec![Some("text/plain"); n])),
        ],
    )?)
}

/// 1,000 rows with fresh keys (`prefix`) under the existing secondary keys of
/// rows `row_of(first..first + 1000)`: new versions of those records.
fn new_versions(
    prefix: &str,
    first: usize,
    row_of: &dyn Fn(usize) -> usize,
) -> Result<RecordBatch> {
    let b = batch(prefix, 0, 1000)?;
    let ext = Arc::new(StringArray::from_iter_values(
        (0..1000).map(|j| format!("ext-r{:010}", row_of(first + j))),
    ));
    let mut columns = b.columns().to_vec();
    columns[1] = ext;
    Ok(RecordBatch::try_new(b.schema(), columns)?)
}

fn all_capabilities() -> RecordCapabilities {
    RecordCapabilities {
        tombstones: true,
        supersession: true,
        lifecycle: true,
        unique_keys: true,
        secondary_key: Some("external_id".into()),
    }
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

struct Pair {
    plain: Store,
    records: Store,
}

/// Time `f` on both stores, alternating which goes first; medians.
async fn both<F>(pair: &Pair, repeats: usize, f: F) -> Result<(Duration, Duration)>
where
    F: AsyncFn(&Store, bool, usize) -> Result<()>,
{
    let (mut plain, mut records) = (Vec::new(), Vec::new());
    for i in 0..repeats {
        for first in [i % 2 == 0, i % 2 == 1] {
            let (store, with_caps) = if first {
                (&pair.plain, false)
            } else {
                (&pair.records, true)
            };
            let t = Instant::now();
            f(store, with_caps, i).await?;
            if with_caps {
                records.push(t.elapsed());
            } else {
                plain.push(t.elapsed());
            }
        }
    }
    plain.sort();
    records.sort();
    Ok((percentile(&plain, 0.5), percentile(&records, 0.5)))
}

/// One figure on both stores, with its ratio.
fn line(what: &str, p: Duration, r: Duration) {
    println!(
        "{what:<44} plain {:>8.2} ms | capabilities {:>8.2} ms | ratio {:.2}",
        ms(p),
        ms(r),
        r.as_secs_f64() / p.as_secs_f64().max(1e-9)
    );
}

/// Create the store `name` under `dir` with `caps`, merged only by hand.
async fn open(dir: &std::path::Path, name: &str, caps: RecordCapabilities) -> Result<Store> {
    let uri = dir.join(name).to_string_lossy().into_owned();
    let mut config = StoreConfig::new(uri)
        .with_schema(schema())
        .with_manual_maintenance()
        .with_capabilities(caps);
    config.merge.max_unmerged_generations = None;
    Ok(Store::create(config).await?)
}

/// A count on a new read-only handle of the capabilities store (`caps`) or
/// the plain one: how long it took.
async fn count_on_a_new_handle(dir: &std::path::Path, caps: bool) -> Result<Duration> {
    let (name, capabilities) = match caps {
        true => ("records", all_capabilities()),
        false => ("plain", RecordCapabilities::default()),
    };
    let store = Store::open_read_only(
        StoreConfig::new(dir.join(name).to_string_lossy().into_owned())
            .with_schema(schema())
            .with_manual_maintenance()
            .with_capabilities(capabilities),
    )
    .await?;
    let t = Instant::now();
    store.count(None).await?;
    let took = t.elapsed();
    store.close().await?;
    Ok(took)
}

pub async fn run(
    dir: &std::path::Path,
    rows: usize,
    batch_rows: usize,
    lookups: usize,
    repeats: usize,
) -> Result<()> {
    println!("\n== record capabilities at {rows} rows (medians; ratio = capabilities / plain)");
    let pair = Pair {
        plain: open(dir, "plain", RecordCapabilities::default()).await?,
        records: open(dir, "records", all_capabilities()).await?,
    };
    load(&pair, rows, batch_rows).await?;
    let keys = Arc::new(random_keys(lookups, rows));
    // get
    let (gp, gr) = gets(&pair, &keys).await?;
    line("get p50", percentile(&gp, 0.5), percentile(&gr, 0.5));
    line("get p95", percentile(&gp, 0.95), percentile(&gr, 0.95));
    let (p, r) = both(&pair, repeats, async |s: &Store, _, _| {
        s.count(None).await?;
        Ok(())
    })
    .await?;
    line("count (repeated)", p, r);
    counts_on_new_handles(dir, &pair, rows).await?;
    let runs = rows.div_ceil(1000);
    let (p, r) = both(&pair, repeats, async |s: &Store, _, i| {
        let run = (7 + i) % runs;
        let found = s
            .scan(ScanRequest::new().filter(format!("run_id = 'run-{run}'")))
            .await?;
        let expected = 1000.min(rows - run * 1000);
        ensure!(found.num_rows() == expected, "{} rows", found.num_rows());
        Ok(())
    })
    .await?;
    line("filtered scan (1,000 rows)", p, r);
    upserts(&pair, rows, repeats).await?;
    // The upserts (and the plain adds) are left unmerged: lookups now go
    // through every unmerged generation too.
    let unmerged = pair.records.wal_status().await?.unmerged_generations;
    let (gp, gr) = gets(&pair, &keys).await?;
    let label = format!(
        "get p50 ({} unmerged generations)",
        unmerged.iter().map(|(_, n)| n).sum::<usize>()
    );
    line(&label, percentile(&gp, 0.5), percentile(&gr, 0.5));
    // "after a compaction": what the upserts left merged, the fragments
    // compacted, then a new handle counts (the compaction carries the count
    // to the version it makes: the same rows in new files). Once per store,
    // last (the figures above run on the stores as merges left them); the
    // counts repeated on new handles.
    let mut compacted = Vec::new();
    for caps in [false, true] {
        let store = if caps { &pair.records } else { &pair.plain };
        store.merge().await?;
        store.compact().await?;
        let mut took = Vec::new();
        for _ in 0..repeats {
            took.push(count_on_a_new_handle(dir, caps).await?);
        }
        took.sort();
        compacted.push(percentile(&took, 0.5));
    }
    line(
        "count (new handle, after a compaction)",
        compacted[0],
        compacted[1],
    );
    pair.plain.close().await?;
    pair.records.close().await?;
    Ok(())
}

/// Load `rows` rows into each store, `batch_rows` per add, merging every
/// ten adds and at the end.
async fn load(pair: &Pair, rows: usize, batch_rows: usize) -> Result<()> {
    for (name, store) in [("plain", &pair.plain), ("records", &pair.records)] {
        let t = Instant::now();
        let mut written = 0;
        while written < rows {
            let n = batch_rows.min(rows - written);
            store.add(&batch("r", written, n)?).await?;
            written += n;
            if written % (batch_rows * 10) == 0 || written == rows {
                store.merge().await?;
            }
        }
        println!(
            "load {name:<8} {rows} rows in {:.1}s ({:.0} rows/s, merged)",
            t.elapsed().as_secs_f64(),
            rows as f64 / t.elapsed().as_secs_f64()
        );
    }
    Ok(())
}

/// `lookups` keys of the loaded rows, drawn by a fixed xorshift.
fn random_keys(lookups: usize, rows: usize) -> Vec<String> {
    let mut rng = 0x2545_f491_4f6c_dd1du64;
    (0..lookups)
        .map(|_| {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            format!("r{:010}", rng % rows as u64)
        })
        .collect()
}

/// Counts on new handles: after a merge, after an expiry passed, cold.
async fn counts_on_new_handles(dir: &std::path::Path, pair: &Pair, rows: usize) -> Result<()> {
    // A handle remembers the base table's visible count for a base version
    // and shares it through the store (`_lance_context/visible_count`); a
    // merge carries it to the version it makes. "after a merge": 1,000 rows
    // added and merged, then a new handle counts (the first count of that
    // version). "after an expiry passed": those rows expire 300 ms after
    // they are written, and a new handle counts once they have (the count's
    // expiry list takes them off). "cold": the shared count removed first, as
    // for a store whose count nothing kept (the base table's visibility
    // columns are read).
    let (mut mp, mut mr, mut cp, mut cold) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let (mut ep, mut er) = (Vec::new(), Vec::new());
    for i in 0..10 {
        for caps in [i % 2 == 0, i % 2 == 1] {
            let store = if caps { &pair.records } else { &pair.plain };
            // Keys and runs apart from the loaded ones (filtered scans below).
            let b = batch("m", rows * 2 + i * 1000, 1000)?;
            let expires = chrono::Utc::now().timestamp_micros() + 300_000;
            let mut columns = b.columns().to_vec();
            columns[5] = Arc::new(TimestampMicrosecondArray::from(vec![expires; 1000]));
            store
                .add(&RecordBatch::try_new(b.schema(), columns)?)
                .await?;
            store.merge().await?;
            let took = count_on_a_new_handle(dir, caps).await?;
            while chrono::Utc::now().timestamp_micros() <= expires {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            let after_expiry = count_on_a_new_handle(dir, caps).await?;
            if caps {
                er.push(after_expiry);
            } else {
                ep.push(after_expiry);
            }
            if caps {
                mr.push(took);
                let path = dir
                    .join("records")
                    .join("_lance_context")
                    .join("visible_count");
                std::fs::remove_file(&path)
                    .with_context(|| format!("removing {}", path.display()))?;
                cold.push(count_on_a_new_handle(dir, true).await?);
            } else {
                mp.push(took);
                cp.push(count_on_a_new_handle(dir, false).await?);
            }
        }
    }
    for v in [&mut mp, &mut mr, &mut ep, &mut er, &mut cp, &mut cold] {
        v.sort();
    }
    line(
        "count (new handle, after a merge)",
        percentile(&mp, 0.5),
        percentile(&mr, 0.5),
    );
    line(
        "count (new handle, after an expiry passed)",
        percentile(&ep, 0.5),
        percentile(&er, 0.5),
    );
    line(
        "count (new handle, cold)",
        percentile(&cp, 0.5),
        percentile(&cold, 0.5),
    );
    Ok(())
}

/// Upserts of 1,000 rows (plain adds on the plain store), clustered and
/// spread; the reads an upsert makes; the upsert against its floor.
async fn upserts(pair: &Pair, rows: usize, repeats: usize) -> Result<()> {
    // 1,000 rows with fresh keys under existing secondary keys: the
    // capabilities store supersedes them, the plain one adds them. First
    // records clustered in the table, then records spread over it (each row
    // read is on a page of its own).
    let clustered = |n: usize| n * 7 % rows;
    let mut plain_adds = Vec::new();
    let mut upserts = Vec::new();
    // What an upsert reads before it writes, whatever it writes: the 1,000
    // clustered rows of each upsert below checked (ids new, the records the
    // secondary keys name, by key alone), nothing written — before the
    // upserts, so with nothing unmerged: a lower bound for them. Against the
    // plain add; with the plain add's time, the least any upsert keeping its
    // contract (outcomes, unique keys) can cost.
    let mut checks = Vec::with_capacity(repeats);
    for i in 0..repeats {
        let b = new_versions(&format!("k{i}-"), i * 1000, &clustered)?;
        let t = Instant::now();
        let outcomes = pair.records.check_upsert(&b).await?;
        checks.push(t.elapsed());
        ensure!(
            outcomes.iter().all(|o| !o.inserted),
            "check_upsert: every row names a stored record"
        );
    }
    checks.sort();
    let check = percentile(&checks, 0.5);
    let spread = |n: usize| (n * 7_919_191 + 12_345) % rows;
    for (prefix, row_of, label) in [
        (
            "u",
            &clustered as &dyn Fn(usize) -> usize,
            "upsert of 1,000 rows",
        ),
        ("s", &spread, "upsert of 1,000 rows spread over the table"),
    ] {
        let (p, r) = both(pair, repeats, async |s: &Store, caps, i| {
            let b = new_versions(&format!("{prefix}{i}-{}", caps as u8), i * 1000, row_of)?;
            if caps {
                s.upsert(&b).await?;
            } else {
                s.add(&b).await?;
            }
            Ok(())
        })
        .await?;
        line(label, p, r);
        plain_adds.push(p);
        upserts.push(r);
    }
    line(
        "upsert checked, not written (the reads)",
        plain_adds[0],
        check,
    );
    line(
        "upsert floor: the reads + a plain add",
        plain_adds[0],
        plain_adds[0] + check,
    );
    // The goal (issue 38): an upsert costs at most 1.2× its own floor.
    let floor = plain_adds[0] + check;
    println!(
        "{:<44} floor {:>8.2} ms | upsert       {:>8.2} ms | ratio {:.2} (goal ≤ 1.20: {})",
        "upsert of 1,000 rows against its floor",
        ms(floor),
        ms(upserts[0]),
        upserts[0].as_secs_f64() / floor.as_secs_f64().max(1e-9),
        if upserts[0].as_secs_f64() <= 1.2 * floor.as_secs_f64() {
            "met"
        } else {
            "not met"
        }
    );
    Ok(())
}

pub async fn retention(dir: &std::path::Path, merges: usize) -> Result<()> {
    println!("\n== disk after {merges} add+merge rounds of 1,000 rows");
    for (name, retention) in [
        ("default retention", RetentionSettings::default()),
        (
            // What the default keeps once its 15 minutes have passed (the
            // bench does not wait them out): the newest 2 versions.
            "default, after 15 min",
            RetentionSettings {
                keep_for: Duration::ZERO,
                ..RetentionSettings::default()
            },
        ),
        (
            "retention: 10 versions",
            RetentionSettings {
                keep_versions: 10,
                keep_for: Duration::ZERO,
                interval: Duration::ZERO,
            },
        ),
        (
            "no retention",
            RetentionSettings {
                keep_versions: usize::MAX / 2,
                keep_for: Duration::from_secs(1 << 30),
                interval: Duration::ZERO,
            },
        ),
    ] {
        let uri = dir
            .join(name.replace([' ', ':', ','], "-"))
            .to_string_lossy()
            .into_owned();
        let mut config = StoreConfig::new(&uri)
            .with_schema(schema())
            .with_manual_maintenance()
            .with_retention(retention);
        config.merge.cleanup_grace = Duration::from_millis(100);
        let store = Store::create(config).await?;
        for i in 0..merges {
            store.add(&batch("d", i * 1000, 1000)?).await?;
            store.merge().await?;
            if i % 20 == 19 {
                store.compact().await?;
            }
        }
        store.compact().await?;
        tokio::time::sleep(Duration::from_millis(200)).await;
        store.add(&batch("d", merges * 1000, 1)?).await?;
        store.merge().await?;
        store.apply_retention().await?;
        let stats = store.stats().await?;
        let base = stats.base_data_bytes;
        println!(
            "{name:<24} {:>8.1} MiB on disk, base table data {:>6.1} MiB, ratio {:.2}; {} versions kept",
            stats.bytes_on_disk as f64 / (1 << 20) as f64,
            base as f64 / (1 << 20) as f64,
            stats.bytes_on_disk as f64 / base.max(1) as f64,
            stats.versions
        );
        store.close().await?;
    }
    Ok(())
}

/// Time a `get` of each of `keys` on both stores, interleaved; sorted.
async fn gets(pair: &Pair, keys: &[String]) -> Result<(Vec<Duration>, Vec<Duration>)> {
    let (mut gp, mut gr) = (Vec::new(), Vec::new());
    for (i, key) in keys.iter().enumerate() {
        for store_is_records in [i % 2 == 0, i % 2 == 1] {
            let store = if store_is_records {
                &pair.records
            } else {
                &pair.plain
            };
            let t = Instant::now();
            let found = store.get(key).await?;
            let took = t.elapsed();
            ensure!(found.is_some(), "{key} not found");
            if store_is_records {
                gr.push(took)
            } else {
                gp.push(took)
            }
        }
    }
    gp.sort();
    gr.sort();
    Ok((gp, gr))
}
