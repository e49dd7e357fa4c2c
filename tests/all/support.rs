//! Shared helpers: schemas, batch builders, temp stores, and the child-process
//! entry point used by the crash tests.

use std::path::Path;
use std::sync::Arc;

use arrow_array::{Array, Float64Array, Int64Array, RecordBatch, StringArray};
use arrow_schema::{DataType, Field, Schema, SchemaRef};
use lance_context_store::{Store, StoreConfig};

/// One compile cache for the whole test binary (under cargo's target
/// tmpdir): each real component is compiled once per run, not once per test.
/// The tests of the cache itself use their own directories.
pub fn compile_cache() -> &'static Path {
    Path::new(concat!(env!("CARGO_TARGET_TMPDIR"), "/compile-cache"))
}

/// A small schema: key, a group column, a number, an optional note.
pub fn schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("id", DataType::Utf8, false),
        Field::new("grp", DataType::Utf8, false),
        Field::new("n", DataType::Int64, false),
        Field::new("score", DataType::Float64, true),
        Field::new("note", DataType::Utf8, true),
    ]))
}

/// One row of [`schema`].
#[derive(Debug, Clone, PartialEq)]
pub struct Row {
    pub id: String,
    pub grp: String,
    pub n: i64,
    pub score: Option<f64>,
    pub note: Option<String>,
}

impl Row {
    pub fn new(id: impl Into<String>, grp: &str, n: i64) -> Self {
        Self {
            id: id.into(),
            grp: grp.to_string(),
            n,
            score: Some(n as f64 / 10.0),
            note: None,
        }
    }
}

/// A batch of [`schema`] from rows.
pub fn batch(rows: &[Row]) -> RecordBatch {
    RecordBatch::try_new(
        schema(),
        vec![
            Arc::new(StringArray::from_iter_values(
                rows.iter().map(|r| r.id.as_str()),
            )),
            Arc::new(StringArray::from_iter_values(
                rows.iter().map(|r| r.grp.as_str()),
            )),
            Arc::new(Int64Array::from_iter_values(rows.iter().map(|r| r.n))),
            Arc::new(Float64Array::from_iter(rows.iter().map(|r| r.score))),
            Arc::new(StringArray::from_iter(
                rows.iter().map(|r| r.note.as_deref()),
            )),
        ],
    )
    .unwrap()
}

/// Rows `prefix-0 .. prefix-(n-1)` in group `grp`.
pub fn rows(prefix: &str, grp: &str, n: usize) -> Vec<Row> {
    (0..n)
        .map(|i| Row::new(format!("{prefix}-{i:05}"), grp, i as i64))
        .collect()
}

/// Decode a result batch of [`schema`] (any column order, by name).
pub fn decode(batch: &RecordBatch) -> Vec<Row> {
    let s = |name: &str| {
        batch
            .column_by_name(name)
            .map(|c| c.as_any().downcast_ref::<StringArray>().unwrap().clone())
    };
    let ids = s("id").expect("id column");
    let grp = s("grp");
    let note = s("note");
    let n = batch
        .column_by_name("n")
        .map(|c| c.as_any().downcast_ref::<Int64Array>().unwrap().clone());
    let score = batch
        .column_by_name("score")
        .map(|c| c.as_any().downcast_ref::<Float64Array>().unwrap().clone());
    (0..batch.num_rows())
        .map(|i| Row {
            id: ids.value(i).to_string(),
            grp: grp
                .as_ref()
                .map(|g| g.value(i).to_string())
                .unwrap_or_default(),
            n: n.as_ref().map(|a| a.value(i)).unwrap_or_default(),
            score: score
                .as_ref()
                .and_then(|a| a.is_valid(i).then(|| a.value(i))),
            note: note
                .as_ref()
                .and_then(|a| a.is_valid(i).then(|| a.value(i).to_string())),
        })
        .collect()
}

/// Sorted ids of a result.
pub fn ids(batch: &RecordBatch) -> Vec<String> {
    let mut ids: Vec<String> = decode(batch).into_iter().map(|r| r.id).collect();
    ids.sort();
    ids
}

/// A pause hook for the failpoints, and its two ends: the receiver fires
/// when the hook is reached, a send on the sender lets it return.
pub fn pause() -> (
    lance_context_store::ReclaimHook,
    tokio::sync::oneshot::Receiver<()>,
    tokio::sync::oneshot::Sender<()>,
) {
    let (go_tx, go_rx) = tokio::sync::oneshot::channel::<()>();
    let (paused_tx, paused_rx) = tokio::sync::oneshot::channel::<()>();
    let hook: lance_context_store::ReclaimHook = Box::new(move || {
        Box::pin(async move {
            let _ = paused_tx.send(());
            let _ = go_rx.await;
        })
    });
    (hook, paused_rx, go_tx)
}

/// Pause `store`'s next read after it takes its view: the first channel
/// says it is paused, a send on the second lets it go on.
pub fn pause_next_read(
    store: &Store,
) -> (
    tokio::sync::oneshot::Receiver<()>,
    tokio::sync::oneshot::Sender<()>,
) {
    let (hook, paused, go) = pause();
    store.pause_next_read(hook);
    (paused, go)
}

/// A temp dir and its dataset URI.
pub fn temp_uri() -> (tempfile::TempDir, String) {
    let dir = tempfile::tempdir().unwrap();
    let uri = dir.path().join("store").to_string_lossy().into_owned();
    (dir, uri)
}

pub fn config(uri: &str) -> StoreConfig {
    StoreConfig::new(uri).with_schema(schema())
}

pub async fn create(uri: &str) -> Store {
    Store::create(config(uri)).await.unwrap()
}

/// Unmerged generations across all shards.
pub async fn generations(store: &Store) -> usize {
    store
        .wal_status()
        .await
        .unwrap()
        .unmerged_generations
        .iter()
        .map(|(_, n)| n)
        .sum()
}

/// Deterministic pseudo-random numbers (no external crate, fixed seed).
pub struct Lcg(pub u64);

impl Lcg {
    pub fn next(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        self.0 >> 33
    }

    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// The `lance-context` binary next to this test binary (`make test` builds it).
pub fn cli_binary() -> std::path::PathBuf {
    let exe = std::env::current_exe().unwrap();
    let dir = exe.parent().unwrap().parent().unwrap();
    let bin = dir.join(format!("lance-context{}", std::env::consts::EXE_SUFFIX));
    assert!(
        bin.exists(),
        "{} is missing: build it first (`cargo build -p lance-context-cli --bin lance-context`; `make test` does)",
        bin.display()
    );
    bin
}

/// Run the CLI; (exit code, stdout, stderr).
pub fn cli(
    root: &std::path::Path,
    args: &[&str],
    stdin: impl AsRef<[u8]>,
) -> (i32, String, String) {
    use std::io::Write;
    let mut child = std::process::Command::new(cli_binary())
        .args(args)
        .env("LANCE_CONTEXT_CACHE_DIR", compile_cache())
        .current_dir(root)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(stdin.as_ref())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Every row of the base table at `uri` with `columns` (all when empty),
/// read by plain Lance: no index, no WAL, no visibility rule.
pub async fn base_table(uri: &str, columns: &[&str]) -> Vec<RecordBatch> {
    use futures::TryStreamExt;
    let dataset = lance::Dataset::open(uri).await.unwrap();
    let mut scan = dataset.scan();
    if !columns.is_empty() {
        scan.project(columns).unwrap();
    }
    scan.try_into_stream()
        .await
        .unwrap()
        .try_collect()
        .await
        .unwrap()
}
