//! `lance-context dev torture`: seeded crash trials in real processes.
//!
//! Each trial creates a store by name (a SchemaSpec store: the registry and
//! the spec plugin are on the path), then starts a **writer** process that
//! runs a schedule drawn from the trial's seed — adds of random sizes that
//! rewrite earlier keys, deletes, merges, compactions — with background
//! merges and cleanup on, and reports every operation as it begins and when
//! it is acknowledged. In most trials a **maintainer** process runs merges and
//! compactions on the same store meanwhile, as an operator's CLI does against
//! a live service (a merge takes the instance over and fences the writer,
//! which reclaims and goes on); it is sometimes killed too. The parent
//! SIGKILLs the writer at a random moment, reopens the store, and checks:
//!
//! - every acknowledged write is there with its newest acknowledged value —
//!   or with the value of a later write whose outcome is unknown (begun, not
//!   acknowledged: killed in flight, or refused as fenced);
//! - no acknowledged delete is undone (same rule);
//! - no key appears twice in a scan, and `count` equals the scan;
//! - a merge changes nothing a reader sees;
//! - the store takes a write again.
//!
//! Trials are reported per window (what the writer was doing when killed)
//! with the rows lost, resurrected or duplicated — which must be 0. A
//! violation prints the trial's seed; `--seed S --trials 1` replays it.

use std::collections::{BTreeMap, HashMap};
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use arrow_array::{Array, Int64Array, RecordBatch, StringArray};
use arrow_schema::{DataType, Field, Schema};
use clap::Args;
use lance_context_host::spec::SchemaSpec;
use lance_context_host::{CreateOptions, NamedStore, Registry, SchemaSource};
use lance_context_host::{PluginLimits, PluginRuntime};
use lance_context_store::{ErrorKind, ScanRequest};

const STORE: &str = "torture";
const KEYS: u64 = 400;

const SPEC: &str = r#"{
  "name": "torture",
  "key": "id",
  "columns": [
    {"name": "id", "type": "Utf8", "nullable": false},
    {"name": "v", "type": "Int64", "nullable": false, "rules": {"min": 0}},
    {"name": "note", "type": "Utf8"},
    {"name": "e", "type": "FixedSizeList(2 x Float32)"}
  ],
  "vectors": [{"column": "e", "dimension": 2, "metric": "l2"}]
}"#;

#[derive(Args, Debug)]
pub struct TortureArgs {
    /// Trials to run.
    #[arg(long, default_value_t = 50)]
    trials: usize,
    /// Stop starting new trials after this many seconds (0: no limit)…
    #[arg(long, default_value_t = 0)]
    max_seconds: u64,
    /// …but not before this many trials have run.
    #[arg(long, default_value_t = 0)]
    min_trials: usize,
    /// Base seed (default: from the clock, printed); trial i uses seed + i.
    #[arg(long)]
    seed: Option<u64>,
    /// Directory for the trials' data roots (default: a temporary directory).
    #[arg(long)]
    dir: Option<PathBuf>,
    /// Longest a writer runs before it is killed, in milliseconds.
    #[arg(long, default_value_t = 4000)]
    max_run_ms: u64,
    /// Create the stores here instead of under each trial's root, e.g.
    /// `s3://bucket/prefix` (each trial gets its own path below it).
    #[arg(long)]
    uri_base: Option<String>,
    /// Storage option `key=value` for `--uri-base`; repeatable.
    #[arg(long = "storage-option", value_parser = crate::args::parse_storage_option)]
    storage_options: Vec<crate::args::StorageOption>,
}

/// A worker of one trial (hidden commands run by `torture`).
#[derive(Args, Debug)]
pub struct WorkerArgs {
    #[arg(long)]
    root: PathBuf,
    #[arg(long)]
    seed: u64,
    #[arg(long = "storage-option", value_parser = crate::args::parse_storage_option)]
    storage_options: Vec<crate::args::StorageOption>,
}

/// Deterministic randomness for a trial (splitmix64).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

fn options(list: &[crate::args::StorageOption]) -> HashMap<String, String> {
    list.iter().map(|o| (o.0.clone(), o.1.clone())).collect()
}

fn registry(root: &Path) -> Result<Registry> {
    let runtime = Arc::new(PluginRuntime::new(
        PluginLimits::default(),
        lance_context_host::default_cache_dir().as_deref(),
    )?);
    Ok(Registry::at(root, runtime)?)
}

fn rows(keys: &[u64], value: i64, note_len: usize) -> Result<RecordBatch> {
    let schema = Arc::new(Schema::new(vec![
        Field::new("id", DataType::Utf8, true),
        Field::new("v", DataType::Int64, true),
        Field::new("note", DataType::Utf8, true),
        Field::new(
            "e",
            DataType::FixedSizeList(Arc::new(Field::new("item", DataType::Float32, true)), 2),
            true,
        ),
    ]));
    let note = "n".repeat(note_len);
    let vectors = arrow_array::FixedSizeListArray::try_new(
        Arc::new(Field::new("item", DataType::Float32, true)),
        2,
        Arc::new(arrow_array::Float32Array::from_iter_values(
            keys.iter().flat_map(|k| [*k as f32, (value % 1000) as f32]),
        )),
        None,
    )?;
    Ok(RecordBatch::try_new(
        schema,
        vec![
            Arc::new(StringArray::from_iter_values(
                keys.iter().map(|k| format!("k{k:04}")),
            )),
            Arc::new(Int64Array::from(vec![value; keys.len()])),
            Arc::new(StringArray::from(vec![Some(note.as_str()); keys.len()])),
            Arc::new(vectors),
        ],
    )?)
}

/// What an operation of the writer came to: the keys it wrote (or none),
/// or the failure's kind and message.
type OpResult = Result<String, (ErrorKind, String)>;

/// The writer: a seeded schedule of operations, each reported as it begins
/// (`B op kind`) and when acknowledged (`A op [keys]`), or as failed with its
/// outcome unknown (`F op kind reason`).
pub async fn writer(args: WorkerArgs) -> Result<()> {
    let reg = registry(&args.root)?;
    let storage = options(&args.storage_options);
    let open = || {
        reg.open_with(STORE, &storage, false, |mut c| {
            c.merge.generation_threshold = Some(4);
            // Merges racing the adds, as the trials were built to find.
            c.merge.quiet_before_merge = Duration::ZERO;
            c.merge.interval = Some(Duration::from_millis(300));
            c.merge.cleanup_grace = Duration::from_millis(200);
            c.compaction.interval = None;
            c.writer.max_memtable_rows = 64;
            c
        })
    };
    let named: NamedStore = open().await?;
    let mut rng = Rng(args.seed);
    for op in 1.. {
        let (kind, result) = operation(&named, &mut rng, op).await?;
        match result {
            Ok(keys) => say(format!("A {op} {keys}")),
            Err((error_kind, message)) => {
                say(format!("F {op} {kind} {error_kind:?}"));
                match error_kind {
                    // Taken over by the maintainer: the writer takes the
                    // store back, as a service would.
                    ErrorKind::Conflict | ErrorKind::Unavailable => {
                        if named.reclaim().await.is_err() {
                            tokio::time::sleep(Duration::from_millis(20)).await;
                        }
                    }
                    ErrorKind::Busy => tokio::time::sleep(Duration::from_millis(50)).await,
                    // Too few rows to train the index yet: a refusal, not a fault.
                    ErrorKind::InvalidInput if kind == "index" => {}
                    _ => bail!("unexpected error in op {op} ({kind}): {message}"),
                }
            }
        }
    }
    Ok(())
}

/// A line of the writer's report.
fn say(line: String) {
    println!("{line}");
}

/// The writer's operation `op`, drawn from `rng`, reported as it begins:
/// its kind and what it came to.
async fn operation(named: &NamedStore, rng: &mut Rng, op: i32) -> Result<(&'static str, OpResult)> {
    let pick = rng.below(100);
    Ok(match pick {
        0..=59 => {
            // An add of 1..160 rows over a key space of KEYS: most
            // rewrite earlier keys. Adds over 64 rows span puts.
            let n = 1 + rng.below(160);
            let mut keys: Vec<u64> = (0..n).map(|_| rng.below(KEYS)).collect();
            keys.sort_unstable();
            keys.dedup();
            let note = rng.below(300) as usize;
            say(format!("B {op} add {}", join(&keys)));
            let batch = rows(&keys, op as i64, note)?;
            (
                "add",
                named
                    .add(&batch)
                    .await
                    .map(|_| join(&keys))
                    .map_err(|e| (pipeline_kind(&e), e.to_string())),
            )
        }
        60..=74 => {
            let n = 1 + rng.below(12);
            let mut keys: Vec<u64> = (0..n).map(|_| rng.below(KEYS)).collect();
            keys.sort_unstable();
            keys.dedup();
            say(format!("B {op} delete {}", join(&keys)));
            let ids: Vec<String> = keys.iter().map(|k| format!("k{k:04}")).collect();
            let refs: Vec<&str> = ids.iter().map(String::as_str).collect();
            (
                "delete",
                named
                    .delete(&refs)
                    .await
                    .map(|_| join(&keys))
                    .map_err(store_error),
            )
        }
        75..=89 => {
            say(format!("B {op} merge"));
            (
                "merge",
                named
                    .merge()
                    .await
                    .map(|_| String::new())
                    .map_err(store_error),
            )
        }
        90..=92 => {
            // Builds (or rebuilds) the vector index: its own commit.
            say(format!("B {op} index"));
            (
                "index",
                named
                    .build_vector_index("e")
                    .await
                    .map(|_| String::new())
                    .map_err(store_error),
            )
        }
        93..=94 => {
            // Removes old versions by the retention policy now.
            say(format!("B {op} cleanup"));
            (
                "cleanup",
                named
                    .apply_retention()
                    .await
                    .map(|_| String::new())
                    .map_err(store_error),
            )
        }
        95..=97 => {
            say(format!("B {op} compact"));
            (
                "compact",
                named
                    .compact()
                    .await
                    .map(|_| String::new())
                    .map_err(store_error),
            )
        }
        _ => {
            say(format!("B {op} sleep"));
            tokio::time::sleep(Duration::from_millis(rng.below(50))).await;
            ("sleep", Ok(String::new()))
        }
    })
}

fn store_error(e: lance_context_store::Error) -> (ErrorKind, String) {
    (e.kind(), e.to_string())
}

/// The kind of a failed add: the engine's, or `Busy` for a plugin without a
/// free call slot; anything else from the plugin is unexpected here.
fn pipeline_kind(e: &lance_context_host::PipelineError) -> ErrorKind {
    use lance_context_host::PipelineError;
    match e {
        PipelineError::Store(e) => e.kind(),
        PipelineError::Plugin(p) if p.is_busy() => ErrorKind::Busy,
        _ => ErrorKind::Internal,
    }
}

fn join(keys: &[u64]) -> String {
    keys.iter()
        .map(u64::to_string)
        .collect::<Vec<_>>()
        .join(",")
}

/// The maintainer: merges (taking the instance over) and compactions, as an
/// operator's CLI runs them against a live writer.
pub async fn maintainer(args: WorkerArgs) -> Result<()> {
    let reg = registry(&args.root)?;
    let storage = options(&args.storage_options);
    let mut rng = Rng(args.seed ^ 0x5A5A);
    loop {
        tokio::time::sleep(Duration::from_millis(50 + rng.below(300))).await;
        let merge = rng.below(3) > 0;
        let result = async {
            if merge {
                let named = reg
                    .open_with(STORE, &storage, false, |c| c.with_manual_maintenance())
                    .await?;
                let merged = named.merge().await;
                named.close().await?;
                merged?;
            } else {
                let named = reg.open_with(STORE, &storage, true, |c| c).await?;
                named.compact().await?;
            }
            anyhow::Ok(())
        }
        .await;
        match result {
            Ok(()) => println!("M {}", if merge { "merge" } else { "compact" }),
            Err(e) => println!("M failed: {e:#}"),
        }
    }
}

/// One key's effect at one operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Effect {
    Set(i64),
    Delete,
}

#[derive(Debug, Default)]
struct Log {
    /// op → (kind, keys); `acked` ops are in `acked`.
    begun: BTreeMap<u64, (String, Vec<u64>)>,
    acked: std::collections::BTreeSet<u64>,
    unexpected: Vec<String>,
}

impl Log {
    fn read(&mut self, line: &str) {
        let mut parts = line.splitn(4, ' ');
        let (tag, op) = (
            parts.next(),
            parts.next().and_then(|o| o.parse::<u64>().ok()),
        );
        let Some(op) = op else { return };
        match tag {
            Some("B") => {
                let kind = parts.next().unwrap_or_default().to_string();
                let keys = parts
                    .next()
                    .map(|k| k.split(',').filter_map(|k| k.parse().ok()).collect())
                    .unwrap_or_default();
                self.begun.insert(op, (kind, keys));
            }
            Some("A") => {
                self.acked.insert(op);
            }
            _ => {}
        }
    }

    /// What the writer was doing when it died.
    fn window(&self) -> String {
        match self.begun.iter().next_back() {
            Some((op, (kind, _))) if !self.acked.contains(op) => kind.clone(),
            _ => "between operations".into(),
        }
    }

    /// Per key: the states a correct store may show.
    fn allowed(&self) -> HashMap<u64, Vec<Option<i64>>> {
        let mut history: HashMap<u64, Vec<(bool, Effect)>> = HashMap::new();
        for (op, (kind, keys)) in &self.begun {
            let effect = match kind.as_str() {
                "add" => Effect::Set(*op as i64),
                "delete" => Effect::Delete,
                _ => continue,
            };
            for k in keys {
                history
                    .entry(*k)
                    .or_default()
                    .push((self.acked.contains(op), effect));
            }
        }
        history
            .into_iter()
            .map(|(k, events)| {
                let last_acked = events.iter().rposition(|(acked, _)| *acked);
                let state = |e: &Effect| match e {
                    Effect::Set(v) => Some(*v),
                    Effect::Delete => None,
                };
                let mut allowed = vec![match last_acked {
                    Some(i) => state(&events[i].1),
                    None => None,
                }];
                let from = last_acked.map_or(0, |i| i + 1);
                allowed.extend(events[from..].iter().map(|(_, e)| state(e)));
                (k, allowed)
            })
            .collect()
    }
}

fn spawn(
    command: &str,
    root: &Path,
    seed: u64,
    storage: &[crate::args::StorageOption],
) -> Result<Child> {
    let mut cmd = Command::new(std::env::current_exe()?);
    cmd.arg("dev")
        .arg(command)
        .arg("--root")
        .arg(root)
        .arg("--seed")
        .arg(seed.to_string());
    for o in storage {
        cmd.arg("--storage-option").arg(format!("{}={}", o.0, o.1));
    }
    cmd.stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("starting {command}"))
}

#[derive(Debug, Default)]
struct Outcome {
    lost: usize,
    resurrected: usize,
    duplicated: usize,
    problems: Vec<String>,
}

async fn check(root: &Path, storage: &HashMap<String, String>, log: &Log) -> Result<Outcome> {
    let reg = registry(root)?;
    let named = reg
        .open_with(STORE, storage, false, |c| c.with_manual_maintenance())
        .await
        .context("reopening after the kill")?;
    let mut out = Outcome::default();
    let read = |batch: &RecordBatch| -> Result<Vec<(u64, i64)>> {
        let ids = batch
            .column_by_name("id")
            .and_then(|c| c.as_any().downcast_ref::<StringArray>())
            .context("id column")?;
        let vs = batch
            .column_by_name("v")
            .and_then(|c| c.as_any().downcast_ref::<Int64Array>())
            .context("v column")?;
        Ok((0..batch.num_rows())
            .map(|i| (ids.value(i)[1..].parse().unwrap_or(u64::MAX), vs.value(i)))
            .collect())
    };
    let snapshot = async || -> Result<(Vec<(u64, i64)>, u64)> {
        let scan = named.scan(ScanRequest::new().project(["id", "v"])).await?;
        Ok((read(&scan)?, named.count(None).await?))
    };
    let (scanned, count) = snapshot().await?;
    let mut seen: HashMap<u64, i64> = HashMap::new();
    for (k, v) in &scanned {
        if seen.insert(*k, *v).is_some() {
            out.duplicated += 1;
            out.problems
                .push(format!("key k{k:04} appears twice in a scan"));
        }
    }
    if count != scanned.len() as u64 {
        out.problems.push(format!(
            "count {count} but the scan has {} rows",
            scanned.len()
        ));
    }
    let allowed = log.allowed();
    for (k, states) in &allowed {
        let actual = seen.get(k).copied();
        if !states.contains(&actual) {
            match (actual, states[0]) {
                (None, Some(_)) => out.lost += 1,
                (Some(_), None) => out.resurrected += 1,
                _ => out.lost += 1,
            }
            out.problems
                .push(format!("key k{k:04} reads {actual:?}; allowed {states:?}"));
        }
    }
    for k in seen.keys() {
        if !allowed.contains_key(k) {
            out.problems.push(format!("key k{k:04} was never written"));
        }
    }
    // A merge changes nothing a reader sees.
    named.merge().await.context("merging after the kill")?;
    let (after, _) = snapshot().await?;
    let after: HashMap<u64, i64> = after.into_iter().collect();
    if after != seen {
        out.problems
            .push("a merge after the kill changed what readers see".into());
    }
    // Writable again.
    named
        .add(&rows(&[KEYS + 1], 1, 1)?)
        .await
        .context("writing after the kill")?;
    if named.get(&format!("k{:04}", KEYS + 1)).await?.is_none() {
        out.problems
            .push("a write after the kill is not read back".into());
    }
    named.close().await?;
    Ok(out)
}

/// Run the trials; an error if any found a violation.
pub async fn run(args: TortureArgs) -> Result<()> {
    let base = args.seed.unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(1)
    });
    let temp = tempfile::tempdir()?;
    let dir = args
        .dir
        .clone()
        .unwrap_or_else(|| temp.path().to_path_buf());
    std::fs::create_dir_all(&dir)?;
    let storage = options(&args.storage_options);
    println!("torture: {} trials from seed {base}", args.trials);
    let started = Instant::now();
    let mut totals = Totals::default();
    for trial in 0..args.trials {
        if args.max_seconds > 0
            && trial >= args.min_trials
            && started.elapsed() > Duration::from_secs(args.max_seconds)
        {
            break;
        }
        let seed = base.wrapping_add(trial as u64);
        one_trial(&args, &dir, &storage, trial, seed, &mut totals).await?;
        // A long soak says how it goes (and leaves a result if it is stopped).
        if totals.done % 50 == 0 {
            println!(
                "progress: {} trials in {:.0?}; {} operations acknowledged; rows lost {}, deletes undone {}, keys duplicated {}, failed trials {}",
                totals.done,
                started.elapsed(),
                totals.acknowledged,
                totals.lost,
                totals.resurrected,
                totals.duplicated,
                totals.failed
            );
        }
    }
    let Totals {
        windows,
        lost,
        resurrected,
        duplicated,
        failed,
        acknowledged,
        fenced,
        maintenance_runs,
        done,
    } = totals;
    println!(
        "torture: {done} trials in {:.0?} from seed {base}; killed during: {}",
        started.elapsed(),
        windows
            .iter()
            .map(|(w, n)| format!("{w} {n}"))
            .collect::<Vec<_>>()
            .join(", ")
    );
    println!(
        "operations acknowledged: {acknowledged}; the writer was fenced by the maintainer {fenced} times \
         and reclaimed; maintainer merges and compactions completed: {maintenance_runs}"
    );
    println!(
        "rows lost: {lost}, deletes undone: {resurrected}, keys duplicated: {duplicated}, failed trials: {failed}"
    );
    if failed > 0 {
        bail!("{failed} of {done} trials found a violation (seeds above)");
    }
    Ok(())
}

/// The trials' figures so far.
#[derive(Debug, Default)]
struct Totals {
    /// Trials per window (what the writer was doing when killed).
    windows: BTreeMap<String, usize>,
    lost: usize,
    resurrected: usize,
    duplicated: usize,
    failed: usize,
    acknowledged: usize,
    fenced: usize,
    maintenance_runs: usize,
    done: usize,
}

/// A trial's workers, killed: the writer (its stderr still to read), how it
/// exited, the lines it reported, and the maintainer's completed runs.
struct Killed {
    writer: Child,
    status: std::process::ExitStatus,
    lines: Vec<String>,
    maintenance_runs: usize,
}

/// Trial `trial` (seeded `seed`): create the store, run the workers, kill
/// them, check the store; its figures added to `totals`.
async fn one_trial(
    args: &TortureArgs,
    dir: &Path,
    storage: &HashMap<String, String>,
    trial: usize,
    seed: u64,
    totals: &mut Totals,
) -> Result<()> {
    let mut rng = Rng(seed);
    let root = dir.join(format!("trial-{trial}"));
    let reg = registry(&root)?;
    let mut create = CreateOptions::new(SchemaSource::Spec(SchemaSpec::from_json(SPEC)?));
    if let Some(base_uri) = &args.uri_base {
        create.uri = Some(format!("{}/{seed}", base_uri.trim_end_matches('/')));
        create.storage_options = storage.clone();
    }
    reg.create(STORE, create).await?.close().await?;

    let Killed {
        mut writer,
        status,
        lines,
        maintenance_runs,
    } = run_and_kill(args, &root, seed, &mut rng).await?;
    totals.maintenance_runs += maintenance_runs;
    totals.fenced += lines
        .iter()
        .filter(|l| l.starts_with("F ") && l.ends_with("Conflict"))
        .count();
    let mut log = Log::default();
    for line in &lines {
        log.read(line);
    }
    totals.acknowledged += log.acked.len();
    if let Some(stderr) = writer.stderr.take() {
        let text: String = BufReader::new(stderr)
            .lines()
            .map_while(|l| l.ok())
            .collect::<Vec<_>>()
            .join("\n");
        if text.contains("unexpected error") || text.contains("panicked") {
            log.unexpected.push(text);
        }
    }
    let window = log.window();
    *totals.windows.entry(window.clone()).or_default() += 1;
    // A check that cannot read the store is a failed trial like any
    // other (its seed printed, its data kept), not the end of the run.
    let outcome = match check(&root, storage, &log).await {
        Ok(outcome) => outcome,
        Err(e) => Outcome {
            problems: vec![format!("the check after the kill failed: {e:#}")],
            ..Outcome::default()
        },
    };
    totals.lost += outcome.lost;
    totals.resurrected += outcome.resurrected;
    totals.duplicated += outcome.duplicated;
    totals.done += 1;
    let trial_failed =
        !outcome.problems.is_empty() || !log.unexpected.is_empty() || status.success();
    if trial_failed {
        totals.failed += 1;
        println!(
            "trial {trial} (seed {seed}, killed during {window}, {} ops, {} acknowledged): FAILED",
            log.begun.len(),
            log.acked.len()
        );
        for p in outcome.problems.iter().take(20) {
            println!("  {p}");
        }
        for u in &log.unexpected {
            println!(
                "  writer: {}",
                u.lines().take(10).collect::<Vec<_>>().join(" | ")
            );
        }
    }
    if args.dir.is_none() {
        if trial_failed {
            // The temporary directory goes with the run: keep what the
            // failed trial left, for the post-mortem.
            let kept = std::env::temp_dir().join(format!("lance-context-torture-{seed}"));
            match std::fs::rename(&root, &kept) {
                Ok(()) => println!("  its data is kept in {}", kept.display()),
                Err(e) => println!("  its data could not be kept: {e}"),
            }
        }
        let _ = std::fs::remove_dir_all(&root);
    }
    Ok(())
}

/// Start the writer (and, in most trials, a maintainer) on the store under
/// `root`, let them run a random while, and kill them.
async fn run_and_kill(args: &TortureArgs, root: &Path, seed: u64, rng: &mut Rng) -> Result<Killed> {
    let mut writer = spawn("torture-writer", root, seed, &args.storage_options)?;
    let with_maintainer = rng.below(10) < 7;
    let mut maintainer = if with_maintainer {
        Some(spawn(
            "torture-maintainer",
            root,
            seed,
            &args.storage_options,
        )?)
    } else {
        None
    };
    let maintenance = maintainer
        .as_mut()
        .and_then(|m| m.stdout.take())
        .map(|out| {
            std::thread::spawn(move || {
                BufReader::new(out)
                    .lines()
                    .map_while(|l| l.ok())
                    .filter(|l| l == "M merge" || l == "M compact")
                    .count()
            })
        });
    let stdout = writer.stdout.take().context("writer stdout")?;
    let reader = std::thread::spawn(move || {
        let mut lines = Vec::new();
        for line in BufReader::new(stdout).lines() {
            match line {
                Ok(line) => lines.push(line),
                Err(_) => break,
            }
        }
        lines
    });
    let run_for = Duration::from_millis(300 + rng.below(args.max_run_ms.max(301) - 300));
    tokio::time::sleep(run_for).await;
    // The maintainer is killed now and then too, mid-merge or not.
    if let Some(m) = maintainer.as_mut()
        && rng.below(3) == 0
    {
        let _ = m.kill();
    }
    let _ = writer.kill();
    let status = writer.wait()?;
    if let Some(mut m) = maintainer.take() {
        let _ = m.kill();
        let _ = m.wait();
    }
    let lines = reader.join().unwrap_or_default();
    let maintenance_runs = maintenance.map_or(0, |t| t.join().unwrap_or(0));
    Ok(Killed {
        writer,
        status,
        lines,
        maintenance_runs,
    })
}
