//! `lance-context dev bench-search`: search quality and latency, measured, and
//! the previous implementation's `search` / `retrieve` on the same records.
//!
//! A store of N generated records (a key, a category, a text from a Zipfian
//! vocabulary, a clustered cosine vector of D dimensions) is loaded and
//! merged; the vector index is built (timed). Then, for Q queries:
//! - recall@10 of the indexed vector search against an exact search in memory;
//! - the text search's top 10 against an exact BM25 over the same rows
//!   (overlap@10 and the largest score difference);
//! - p50/p99 latency of vector, text and hybrid queries with 0 unmerged
//!   generations, then again with G unmerged generations written on top.
//!
//! With `--peer-python` (a Python with `lance_context` 0.6.x installed; the
//! default looks for `target/peer-venv/bin/python` and makes it with pip when
//! missing) the same records go to the previous implementation's `Context`
//! and its `search` (vector), `retrieve(text=…)` and `retrieve(text, vector)`
//! are timed the same way; the ratios are printed side by side. When it cannot
//! be installed the comparison is skipped with a message.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, ensure};
use arrow_array::{Array, FixedSizeListArray, Float32Array, RecordBatch, StringArray};
use arrow_schema::{DataType, Field, Schema, SchemaRef};
use clap::Args;
use lance_context_store::{
    IndexSettings, Metric, RetrieveQuery, Store, StoreConfig, TextColumn, TextOperator, TextQuery,
    VectorColumn, VectorIndexKind, VectorQuery, exact_bm25,
};

#[derive(Args, Debug)]
pub struct SearchBenchArgs {
    /// Directory for the benchmark store (recreated).
    #[arg(long, default_value = "data/bench-search")]
    data: PathBuf,
    /// Records in the store.
    #[arg(long, default_value_t = 100_000)]
    rows: usize,
    /// Vector dimension.
    #[arg(long, default_value_t = 64)]
    dim: usize,
    /// Queries per measure.
    #[arg(long, default_value_t = 50)]
    queries: usize,
    /// Unmerged generations written for the second round (100 rows each).
    #[arg(long, default_value_t = 16)]
    unmerged: usize,
    /// A Python with the previous implementation (`lance_context` 0.6.x).
    /// Default: `target/peer-venv/bin/python`, made with pip when missing.
    #[arg(long)]
    peer_python: Option<PathBuf>,
    /// Skip the previous implementation.
    #[arg(long)]
    no_peer: bool,
    /// Records the previous implementation gets (it scores every row in
    /// memory per call; default: all of them, at most 100,000).
    #[arg(long)]
    peer_rows: Option<usize>,
}

const K: usize = 10;
const VOCABULARY: usize = 5_000;
const CATEGORIES: usize = 10;

/// A small deterministic generator (the bench needs no crate for it).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn unit(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 24) as f32
    }
    fn normal(&mut self) -> f32 {
        let (a, b) = (self.unit().max(1e-7), self.unit());
        (-2.0 * a.ln()).sqrt() * (std::f32::consts::TAU * b).cos()
    }
    /// A Zipf-ish rank in 0..n (exponent ~1).
    fn zipf(&mut self, n: usize) -> usize {
        let u = self.unit() as f64;
        (((n as f64 + 1.0).powf(u) - 1.0) as usize).min(n - 1)
    }
}

/// Pseudo-words: syllables, so the analyzer sees word-like terms (no stop
/// words among them, few that stem alike).
fn word(i: usize) -> String {
    const ON: &[&str] = &[
        "b", "d", "f", "g", "k", "l", "m", "n", "p", "r", "s", "t", "v", "z",
    ];
    const NU: &[&str] = &["a", "e", "i", "o", "u"];
    let mut w = String::new();
    let mut n = i + 1;
    while n > 0 {
        w.push_str(ON[n % ON.len()]);
        n /= ON.len();
        w.push_str(NU[n % NU.len()]);
        n /= NU.len();
    }
    w.push('x');
    w
}

struct Data {
    ids: Vec<String>,
    texts: Vec<String>,
    categories: Vec<String>,
    vectors: Vec<Vec<f32>>,
}

fn generate(rows: usize, dim: usize, seed: u64, prefix: &str) -> Data {
    let mut rng = Rng(seed | 1);
    let centres: Vec<Vec<f32>> = {
        let mut c = Rng(0x5eed);
        (0..256)
            .map(|_| (0..dim).map(|_| c.normal()).collect())
            .collect()
    };
    let mut data = Data {
        ids: Vec::with_capacity(rows),
        texts: Vec::with_capacity(rows),
        categories: Vec::with_capacity(rows),
        vectors: Vec::with_capacity(rows),
    };
    for i in 0..rows {
        data.ids.push(format!("{prefix}{i:09}"));
        let words = 8 + (rng.next() % 40) as usize;
        let text: Vec<String> = (0..words).map(|_| word(rng.zipf(VOCABULARY))).collect();
        data.texts.push(text.join(" "));
        data.categories
            .push(format!("c{}", rng.next() as usize % CATEGORIES));
        let centre = &centres[rng.next() as usize % centres.len()];
        data.vectors
            .push(centre.iter().map(|c| c + 0.3 * rng.normal()).collect());
    }
    data
}

fn schema(dim: usize) -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("id", DataType::Utf8, false),
        Field::new("category", DataType::Utf8, true),
        Field::new("text", DataType::Utf8, true),
        Field::new(
            "emb",
            DataType::FixedSizeList(
                Arc::new(Field::new("item", DataType::Float32, true)),
                dim as i32,
            ),
            true,
        ),
    ]))
}

fn batch(data: &Data, range: std::ops::Range<usize>, dim: usize) -> Result<RecordBatch> {
    let flat: Vec<f32> = data.vectors[range.clone()]
        .iter()
        .flatten()
        .copied()
        .collect();
    let emb = FixedSizeListArray::try_new(
        Arc::new(Field::new("item", DataType::Float32, true)),
        dim as i32,
        Arc::new(Float32Array::from(flat)),
        None,
    )?;
    Ok(RecordBatch::try_new(
        schema(dim),
        vec![
            Arc::new(StringArray::from(data.ids[range.clone()].to_vec())),
            Arc::new(StringArray::from(data.categories[range.clone()].to_vec())),
            Arc::new(StringArray::from(data.texts[range].to_vec())),
            Arc::new(emb),
        ],
    )?)
}

fn cosine(a: &[f32], b: &[f32]) -> f32 {
    let dot: f32 = a.iter().zip(b).map(|(x, y)| x * y).sum();
    let na: f32 = a.iter().map(|x| x * x).sum::<f32>().sqrt();
    let nb: f32 = b.iter().map(|x| x * x).sum::<f32>().sqrt();
    1.0 - dot / (na * nb)
}

fn ids(batch: &RecordBatch) -> Vec<String> {
    let a = batch
        .column_by_name("id")
        .and_then(|c| c.as_any().downcast_ref::<StringArray>())
        .expect("id column");
    (0..a.len()).map(|i| a.value(i).to_string()).collect()
}

fn scores(batch: &RecordBatch, column: &str) -> Vec<f32> {
    let a = batch
        .column_by_name(column)
        .and_then(|c| c.as_any().downcast_ref::<Float32Array>())
        .expect("score column");
    (0..a.len()).map(|i| a.value(i)).collect()
}

fn percentile(mut v: Vec<Duration>, p: f64) -> f64 {
    v.sort();
    if v.is_empty() {
        return 0.0;
    }
    let i = ((v.len() as f64 - 1.0) * p).round() as usize;
    v[i].as_secs_f64() * 1e3
}

struct Latency {
    p50: f64,
    p99: f64,
}

fn latency(times: Vec<Duration>) -> Latency {
    Latency {
        p50: percentile(times.clone(), 0.5),
        p99: percentile(times, 0.99),
    }
}

struct Queries {
    vectors: Vec<Vec<f32>>,
    texts: Vec<String>,
}

fn queries(n: usize, dim: usize) -> Queries {
    let mut rng = Rng(0xfeed);
    let sample = generate(n, dim, 0xabcdef, "q");
    Queries {
        vectors: sample.vectors,
        texts: (0..n)
            .map(|_| {
                // Two or three terms of middling frequency.
                let terms = 2 + (rng.next() % 2) as usize;
                (0..terms)
                    .map(|_| word(20 + rng.next() as usize % 500))
                    .collect::<Vec<_>>()
                    .join(" ")
            })
            .collect(),
    }
}

async fn timed<F, Fut>(n: usize, mut f: F) -> Result<Latency>
where
    F: FnMut(usize) -> Fut,
    Fut: std::future::Future<Output = Result<()>>,
{
    // One warm-up round, not counted.
    f(0).await?;
    let mut times = Vec::with_capacity(n);
    for i in 0..n {
        let t = Instant::now();
        f(i).await?;
        times.push(t.elapsed());
    }
    Ok(latency(times))
}

struct Round {
    vector: Latency,
    text: Latency,
    hybrid: Latency,
    /// The hybrid's legs alone, at its per-leg limit (`LEG` each).
    vector_leg: Latency,
    text_leg: Latency,
}

/// Each leg of the hybrid query fetches this many rows before fusion.
const LEG: usize = 2 * K;

async fn round(store: &Store, q: &Queries) -> Result<Round> {
    let n = q.texts.len();
    let vector = timed(n, |i| {
        let query = VectorQuery::new("emb", q.vectors[i].clone(), K);
        async move {
            store.nearest(&query).await?;
            Ok(())
        }
    })
    .await?;
    let text = timed(n, |i| {
        let query = TextQuery::new("text", q.texts[i].clone(), K);
        async move {
            store.search_text(&query).await?;
            Ok(())
        }
    })
    .await?;
    let vector_leg = timed(n, |i| {
        let query = VectorQuery::new("emb", q.vectors[i].clone(), LEG);
        async move {
            store.nearest(&query).await?;
            Ok(())
        }
    })
    .await?;
    let text_leg = timed(n, |i| {
        let query = TextQuery::new("text", q.texts[i].clone(), LEG);
        async move {
            store.search_text(&query).await?;
            Ok(())
        }
    })
    .await?;
    let hybrid = timed(n, |i| {
        let query = RetrieveQuery::new(
            Some(VectorQuery::new("emb", q.vectors[i].clone(), LEG)),
            Some(TextQuery::new("text", q.texts[i].clone(), LEG)),
            K,
        );
        async move {
            store.retrieve(&query).await?;
            Ok(())
        }
    })
    .await?;
    Ok(Round {
        vector,
        text,
        hybrid,
        vector_leg,
        text_leg,
    })
}

/// Records per add (each merged) when loading, and per batch of the whole
/// table for the exact BM25.
const CHUNK: usize = 50_000;

pub async fn run(args: SearchBenchArgs) -> Result<()> {
    ensure!(args.rows >= 1000, "--rows must be at least 1,000");
    ensure!(args.queries >= 1, "--queries must be at least 1");
    let dim = args.dim;
    if args.data.exists() {
        std::fs::remove_dir_all(&args.data)
            .with_context(|| format!("removing {}", args.data.display()))?;
    }
    std::fs::create_dir_all(&args.data)?;
    let uri = args.data.join("store.lance").display().to_string();
    println!(
        "bench-search: {} rows, {dim} dims (cosine), {} queries, k = {K}",
        args.rows, args.queries
    );
    let data = generate(args.rows, dim, 42, "r");
    let store = load(&uri, &data, args.rows, dim).await?;

    let q = queries(args.queries, dim);
    // Quality: recall@10 against exact cosine; text top 10 against exact BM25.
    let recall = vector_recall(&store, &data, &q).await?;
    let (overlap, worst) = text_overlap(&store, &data, &q, args.rows, dim).await?;
    println!(
        "vector recall@10 (index, default settings) {recall:.3} · text overlap@10 with exact BM25 {overlap:.3}, largest relative score difference {worst:.1e}"
    );

    let merged = round(&store, &q).await?;
    // G unmerged generations on top (100 new rows each).
    let extra = generate(args.unmerged * 100, dim, 7, "u");
    for g in 0..args.unmerged {
        store
            .add(&batch(&extra, g * 100..(g + 1) * 100, dim)?)
            .await?;
    }
    let fresh = round(&store, &q).await?;
    latency_table(&merged, &fresh, args.unmerged);

    if args.no_peer {
        return Ok(());
    }
    compare_with_peer(&args, &data, &q, &merged, dim);
    Ok(())
}

/// Create the store at `uri` and load `data` into it (merged), compact it
/// and build its vector index, each timed.
async fn load(uri: &str, data: &Data, rows: usize, dim: usize) -> Result<Store> {
    let config = StoreConfig::new(uri)
        .with_schema(schema(dim))
        .with_manual_maintenance()
        .with_indexes(IndexSettings {
            vector_columns: vec![VectorColumn {
                column: "emb".into(),
                dimension: dim,
                metric: Metric::Cosine,
                kind: VectorIndexKind::IvfSq,
            }],
            text_columns: vec![TextColumn::new("text")],
            ..IndexSettings::default()
        });
    let store = Store::create(config).await?;
    let t = Instant::now();
    for start in (0..rows).step_by(CHUNK) {
        let end = (start + CHUNK).min(rows);
        store.add(&batch(data, start..end, dim)?).await?;
        store.merge().await?;
    }
    let load = t.elapsed();
    let t = Instant::now();
    store.compact().await?;
    let compact = t.elapsed();
    let t = Instant::now();
    store.build_vector_index("emb").await?;
    let vector_index = t.elapsed();
    println!(
        "load + merge {:.1} s · compaction (folds the text index) {:.1} s · vector index build {:.1} s",
        load.as_secs_f64(),
        compact.as_secs_f64(),
        vector_index.as_secs_f64()
    );
    Ok(store)
}

/// The indexed vector search's recall@10 against an exact cosine search,
/// averaged over the queries.
async fn vector_recall(store: &Store, data: &Data, q: &Queries) -> Result<f64> {
    let mut recall = 0.0;
    for v in &q.vectors {
        let mut exact: Vec<(f32, usize)> = data
            .vectors
            .iter()
            .enumerate()
            .map(|(i, x)| (cosine(v, x), i))
            .collect();
        exact.select_nth_unstable_by(K, |a, b| a.0.total_cmp(&b.0));
        let truth: HashSet<String> = exact[..K].iter().map(|e| data.ids[e.1].clone()).collect();
        let got = ids(&store
            .nearest(&VectorQuery::new("emb", v.clone(), K))
            .await?);
        recall += got.iter().filter(|g| truth.contains(*g)).count() as f64 / K as f64;
    }
    recall /= q.vectors.len() as f64;
    Ok(recall)
}

/// The text search's top 10 against an exact BM25 over the same rows: the
/// overlap (averaged over the queries) and the largest relative score
/// difference.
async fn text_overlap(
    store: &Store,
    data: &Data,
    q: &Queries,
    rows: usize,
    dim: usize,
) -> Result<(f64, f32)> {
    let text_column = TextColumn::new("text");
    let whole = {
        let mut parts = Vec::new();
        for start in (0..rows).step_by(CHUNK) {
            parts.push(batch(data, start..(start + CHUNK).min(rows), dim)?);
        }
        arrow_select::concat::concat_batches(&schema(dim), &parts)?
    };
    let (mut overlap, mut worst) = (0.0, 0.0f32);
    for text in &q.texts {
        let exact = exact_bm25(&text_column, text, TextOperator::Or, &whole)?;
        let mut ranked: Vec<(f32, &String)> = exact
            .iter()
            .zip(&data.ids)
            .filter_map(|(s, id)| s.map(|s| (s, id)))
            .collect();
        ranked.sort_by(|a, b| b.0.total_cmp(&a.0).then_with(|| a.1.cmp(b.1)));
        ranked.truncate(K);
        let found = store
            .search_text(&TextQuery::new("text", text.clone(), K))
            .await?;
        let got = ids(&found);
        let truth: HashSet<&String> = ranked.iter().map(|r| r.1).collect();
        overlap +=
            got.iter().filter(|g| truth.contains(g)).count() as f64 / ranked.len().max(1) as f64;
        for (score, want) in scores(&found, "_score").iter().zip(&ranked) {
            worst = worst.max((score - want.0).abs() / want.0.max(1e-6));
        }
    }
    overlap /= q.texts.len() as f64;
    Ok((overlap, worst))
}

/// The latency table: each query kind merged and with `unmerged`
/// generations on top, then hybrid against its slower leg.
fn latency_table(merged: &Round, fresh: &Round, unmerged: usize) {
    println!();
    println!("| query (p50 / p99 ms) | 0 unmerged generations | {unmerged} unmerged generations |");
    println!("|---|---|---|");
    for (name, a, b) in [
        ("vector top-10", &merged.vector, &fresh.vector),
        ("text top-10 (BM25)", &merged.text, &fresh.text),
        ("hybrid top-10 (RRF)", &merged.hybrid, &fresh.hybrid),
        (
            "its vector leg alone (top-20)",
            &merged.vector_leg,
            &fresh.vector_leg,
        ),
        (
            "its text leg alone (top-20)",
            &merged.text_leg,
            &fresh.text_leg,
        ),
    ] {
        println!(
            "| {name} | {:.2} / {:.2} | {:.2} / {:.2} |",
            a.p50, a.p99, b.p50, b.p99
        );
    }
    println!(
        "hybrid against its slower leg at the same per-leg limit (p50): {:.2}× merged, {:.2}× with {unmerged} unmerged generations",
        merged.hybrid.p50 / merged.vector_leg.p50.max(merged.text_leg.p50),
        fresh.hybrid.p50 / fresh.vector_leg.p50.max(fresh.text_leg.p50),
    );
}

/// The previous implementation on the same records, side by side with this
/// host's merged figures (skipped with a message when it cannot run).
fn compare_with_peer(args: &SearchBenchArgs, data: &Data, q: &Queries, merged: &Round, dim: usize) {
    let peer_rows = args
        .peer_rows
        .unwrap_or(args.rows.min(100_000))
        .min(args.rows);
    match peer(args, data, q, peer_rows, dim) {
        Ok(Some(p)) => {
            println!();
            println!(
                "previous implementation (lance-context 0.6.x) on the first {peer_rows} of the same records, p50 ms:"
            );
            println!("| query | previous | this host (0 unmerged) | speed-up |");
            println!("|---|---|---|---|");
            for (name, theirs, ours) in [
                ("vector top-10 (`search`)", p[0], merged.vector.p50),
                ("text top-10 (`retrieve(text=)`)", p[1], merged.text.p50),
                ("hybrid top-10 (`retrieve`)", p[2], merged.hybrid.p50),
            ] {
                println!(
                    "| {name} | {theirs:.2} | {ours:.2} | {:.1}× |",
                    theirs / ours
                );
            }
            if peer_rows != args.rows {
                println!("(this host's figures are at {} rows)", args.rows);
            }
        }
        Ok(None) => {}
        Err(e) => println!("previous implementation: skipped ({e:#})"),
    }
}

const PEER_SCRIPT: &str = r#"
import json, statistics, sys, time
from lance_context import Context
path, queries_path, out = sys.argv[1], sys.argv[2], sys.argv[3]
ctx = Context.create(out, embedding_dim=int(sys.argv[4]), distance_metric="cosine")
batch = []
with open(path) as f:
    for line in f:
        r = json.loads(line)
        batch.append({"role": "user", "content": r["text"], "embedding": r["emb"],
                      "external_id": r["id"], "tenant": r["category"]})
        if len(batch) == 10000:
            ctx.add_many(batch); batch = []
if batch:
    ctx.add_many(batch)
q = json.load(open(queries_path))
def timed(f):
    f(0)
    ts = []
    for i in range(len(q["texts"])):
        t = time.perf_counter(); f(i); ts.append(time.perf_counter() - t)
    return statistics.median(ts) * 1e3
v = timed(lambda i: ctx.search(q["vectors"][i], limit=10))
t = timed(lambda i: ctx.retrieve(text=q["texts"][i], limit=10))
h = timed(lambda i: ctx.retrieve(text=q["texts"][i], vector=q["vectors"][i], limit=10))
print(json.dumps([v, t, h]))
"#;

/// The previous implementation's Python: `given`, or
/// `target/peer-venv/bin/python`, made (`python3 -m venv`, `pip install
/// lance-context==0.6.7`) when missing. `None`, said, when that fails.
pub fn peer_python(given: Option<&Path>) -> Option<PathBuf> {
    if let Some(p) = given {
        return Some(p.to_path_buf());
    }
    let venv = Path::new("target/peer-venv");
    let python = venv.join("bin/python");
    if !python.exists() {
        println!(
            "installing the previous implementation into {} …",
            venv.display()
        );
        let made = std::process::Command::new("python3")
            .args(["-m", "venv"])
            .arg(venv)
            .status();
        let installed = made.is_ok_and(|s| s.success())
            && std::process::Command::new(&python)
                .args(["-m", "pip", "install", "-q", "lance-context==0.6.7"])
                .status()
                .is_ok_and(|s| s.success());
        if !installed {
            println!(
                "previous implementation: skipped (python3 -m venv and pip install lance-context==0.6.7 did not succeed; pass --peer-python)"
            );
            return None;
        }
    }
    Some(python)
}

/// Run `script` (written to `dir/peer.py`) with the previous
/// implementation's `python` and `args`: the last line it printed, or an
/// error with the last line of its stderr.
pub fn run_peer(
    python: &Path,
    dir: &Path,
    script: &str,
    args: &[&std::ffi::OsStr],
) -> Result<String> {
    let path = dir.join("peer.py");
    std::fs::write(&path, script)?;
    let out = std::process::Command::new(python)
        .arg(&path)
        .args(args)
        .output()
        .with_context(|| format!("running {}", python.display()))?;
    ensure!(
        out.status.success(),
        "the previous implementation failed: {}",
        String::from_utf8_lossy(&out.stderr)
            .lines()
            .last()
            .unwrap_or("")
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    Ok(stdout.trim().lines().last().unwrap_or("").to_string())
}

/// The previous implementation's p50 (ms) for vector, text and hybrid; `None`
/// with a message printed when it is not available.
fn peer(
    args: &SearchBenchArgs,
    data: &Data,
    q: &Queries,
    rows: usize,
    dim: usize,
) -> Result<Option<[f64; 3]>> {
    let Some(python) = peer_python(args.peer_python.as_deref()) else {
        return Ok(None);
    };
    let dir = args.data.join("peer");
    std::fs::create_dir_all(&dir)?;
    let records = dir.join("records.jsonl");
    {
        use std::io::Write;
        let mut f = std::io::BufWriter::new(std::fs::File::create(&records)?);
        for i in 0..rows {
            serde_json::to_writer(
                &mut f,
                &serde_json::json!({"id": data.ids[i], "text": data.texts[i],
                    "category": data.categories[i], "emb": data.vectors[i]}),
            )?;
            f.write_all(b"\n")?;
        }
    }
    let queries = dir.join("queries.json");
    std::fs::write(
        &queries,
        serde_json::to_vec(&serde_json::json!({"vectors": q.vectors, "texts": q.texts}))?,
    )?;
    println!("previous implementation: loading {rows} records …");
    let line = run_peer(
        &python,
        &dir,
        PEER_SCRIPT,
        &[
            records.as_os_str(),
            queries.as_os_str(),
            dir.join("ctx.lance").as_os_str(),
            std::ffi::OsStr::new(&dim.to_string()),
        ],
    )?;
    let figures: Vec<f64> =
        serde_json::from_str(&line).context("reading the previous implementation's figures")?;
    ensure!(
        figures.len() == 3,
        "expected three figures, got {figures:?}"
    );
    Ok(Some([figures[0], figures[1], figures[2]]))
}
