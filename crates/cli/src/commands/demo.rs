//! `lance-context demo` (`make demo`): the product end to end on the embedded
//! default, a registry in a local directory. Four stores — rollout, context
//! and datagen from the built-in plugins, and a user schema from a SchemaSpec
//! — loaded with a generated sample through their plugins, a refused bad
//! batch, merge, compaction and the vector index, then every kind of read,
//! and a fresh reader's counts. A second run reopens the stores and adds.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, Result, ensure};
use clap::Parser;
use lance_context_host::spec::SchemaSpec;
use lance_context_host::{
    CreateOptions, NamedStore, PluginLimits, PluginRuntime, Registry, RegistryError, SchemaSource,
    rows_from_json,
};
use lance_context_store::{ScanRequest, SortKey, VectorQuery};
use serde::Serialize;
use serde_json::{Value, json};

use crate::output::Out;

#[derive(Parser, Debug)]
pub struct DemoCommand {
    /// The data root of the demo's stores (created if absent).
    #[arg(long, default_value = "data/demo")]
    pub data: PathBuf,
    /// Sample size: rollout trajectories (40 messages each); the other
    /// stores get a proportional share (memories ×25, items ×2.5 with ~8
    /// events each, tickets ×10).
    #[arg(long, default_value_t = 300)]
    pub rollouts: usize,
    /// Records per add.
    #[arg(long, default_value_t = 2_000)]
    pub batch_rows: usize,
}

/// The user schema of the demo: support tickets, declared in JSON.
const TICKETS_SPEC: &str = r#"{
  "name": "tickets",
  "key": "id",
  "columns": [
    {"name": "id", "type": "Utf8", "nullable": false, "rules": {"non_empty": true}},
    {"name": "team", "type": "Utf8", "nullable": false, "rules": {"one_of": ["billing", "infra", "search", "agents"]}},
    {"name": "title", "type": "Utf8", "nullable": false, "rules": {"non_empty": true, "max_length": 200}},
    {"name": "priority", "type": "Int32", "nullable": false, "rules": {"min": 1, "max": 5}},
    {"name": "status", "type": "Utf8", "nullable": false, "rules": {"one_of": ["open", "closed"]}},
    {"name": "opened_at", "type": "Timestamp(Microsecond, None)", "nullable": false}
  ],
  "queries": [
    {"name": "open_for_team", "description": "open tickets of one team, most urgent first",
     "params": ["team"], "filter": "team = {team} AND status = 'open'", "order_by": ["priority", "id"]}
  ]
}"#;

const EMBEDDING_DIM: usize = 32;

/// Creation parameters `(name, json)`.
type Params = Vec<(String, String)>;

/// What the demo did, for `--json`.
#[derive(Debug, Default, Serialize)]
struct Report {
    root: String,
    run: u64,
    steps: Vec<Step>,
    counts: HashMap<String, u64>,
}

#[derive(Debug, Serialize)]
struct Step {
    step: String,
    detail: String,
    seconds: f64,
}

struct Demo {
    out: Out,
    report: Report,
}

impl Demo {
    fn say(&mut self, step: &str, detail: String, started: Instant) {
        let seconds = started.elapsed().as_secs_f64();
        if !self.out.json {
            println!("{step:<18} {detail} ({})", human(seconds));
        }
        self.report.steps.push(Step {
            step: step.to_string(),
            detail,
            seconds,
        });
    }
}

fn human(seconds: f64) -> String {
    if seconds < 1.0 {
        format!("{:.0} ms", seconds * 1000.0)
    } else {
        format!("{seconds:.2} s")
    }
}

/// A small deterministic generator (the sample differs per run through the seed).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
    fn unit(&mut self) -> f32 {
        (self.next() % 1_000_000) as f32 / 1_000_000.0
    }
    fn pick<'a>(&mut self, from: &[&'a str]) -> &'a str {
        from[self.below(from.len() as u64) as usize]
    }
}

pub async fn run(c: DemoCommand, out: Out) -> Result<()> {
    crate::args::ensure_usage(c.rollouts >= 4, || {
        "--rollouts must be at least 4 (the vector index trains on the memories: 25 per rollout)"
            .into()
    })?;
    crate::args::ensure_usage(c.batch_rows >= 1, || {
        "--batch-rows must be at least 1".into()
    })?;
    let total = Instant::now();
    let (registry, mut demo) = Demo::start(&c, out)?;
    let run = demo.report.run;

    // 1. Stores: three built-in plugins and one user SchemaSpec.
    let [rollouts, memories, events, tickets] = demo.stores(&registry).await?;
    let stores = [&rollouts, &memories, &events, &tickets];
    let before = counts(&stores).await?;

    // 2. A generated sample, as JSON lines through each store's plugin.
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15 ^ (run.wrapping_mul(0x2545_F491_4F6C_DD1D)) | 1);
    let tag = format!("r{run}");
    let sample = Sample::generate(&mut rng, &tag, c.rollouts);
    demo.load(stores, &sample, c.batch_rows).await?;

    // 3. A bad batch is refused whole, naming row and column.
    demo.refused_batch(&tickets, &tag).await?;

    // 4. Maintenance: merge the write-ahead tier, compact, index the vectors.
    demo.maintain(stores, &memories).await?;

    // 5. Reads.
    demo.lookup_and_scan(&memories, &tickets, &tag).await?;
    demo.vector_search(&memories, &mut rng).await?;
    demo.named_reads(&rollouts, &events, &tickets, &sample)
        .await?;

    for store in stores {
        store.close().await?;
    }

    // 6. A fresh reader (a new registry handle, read-only) sees every
    // acknowledged record.
    demo.fresh_reader(&c.data, &before, &sample).await?;
    if out.json {
        return out.item(&demo.report, String::new);
    }
    println!(
        "done in {}; run it again to reopen the stores and add more. Try: lance-context store --root {} list",
        human(total.elapsed().as_secs_f64()),
        c.data.display()
    );
    Ok(())
}

/// The generated sample of a run: each store's records, as JSON.
struct Sample {
    rollouts: Vec<Value>,
    memories: Vec<Value>,
    events: Vec<Value>,
    tickets: Vec<Value>,
    /// The first rollout's id (read back as a trajectory).
    first_rollout: String,
    /// The first datagen item's id (read back folded).
    first_item: String,
}

impl Sample {
    /// `rollouts` trajectories and each other store's proportional share.
    fn generate(rng: &mut Rng, tag: &str, rollouts: usize) -> Self {
        let (rollout_rows, first_rollout) = rollout_sample(rng, tag, rollouts);
        let memory_rows = memory_sample(rng, tag, rollouts * 25);
        let (event_rows, first_item) = event_sample(rng, tag, rollouts * 5 / 2);
        let ticket_rows = ticket_sample(rng, tag, rollouts * 10);
        Sample {
            rollouts: rollout_rows,
            memories: memory_rows,
            events: event_rows,
            tickets: ticket_rows,
            first_rollout,
            first_item,
        }
    }

    /// Each store's records, in the stores' order.
    fn rows(&self) -> [&Vec<Value>; 4] {
        [&self.rollouts, &self.memories, &self.events, &self.tickets]
    }

    /// The records of every store.
    fn len(&self) -> usize {
        self.rows().iter().map(|rows| rows.len()).sum()
    }
}

impl Demo {
    /// The data root, its registry and the run's number (taken before
    /// anything is written), announced.
    fn start(c: &DemoCommand, out: Out) -> Result<(Registry, Demo)> {
        std::fs::create_dir_all(&c.data)
            .with_context(|| format!("creating {}", c.data.display()))?;
        let runtime = Arc::new(PluginRuntime::new(
            PluginLimits::default(),
            lance_context_host::default_cache_dir().as_deref(),
        )?);
        let registry = Registry::at(&c.data, runtime)?;
        // Each run's keys are new (the run number is part of them); the number
        // is taken before anything is written, so a run that stopped half-way
        // does not make the next one rewrite its keys.
        let run = 1 + count_runs(&c.data);
        std::fs::write(c.data.join(".demo-runs"), run.to_string())?;
        let demo = Demo {
            out,
            report: Report {
                root: c.data.display().to_string(),
                run,
                ..Default::default()
            },
        };
        if !out.json {
            println!(
                "lance-context demo, run {run}, in {} (a registry of stores in a local directory)",
                c.data.display()
            );
        }
        Ok((registry, demo))
    }

    /// Step 1: the four stores, reopened or created.
    async fn stores(&mut self, registry: &Registry) -> Result<[NamedStore; 4]> {
        let t = Instant::now();
        let sources: [(&str, SchemaSource, Params); 4] = [
            ("rollouts", SchemaSource::Builtin("rollout".into()), vec![]),
            (
                "memories",
                SchemaSource::Builtin("context".into()),
                vec![("embedding_dim".into(), EMBEDDING_DIM.to_string())],
            ),
            ("events", SchemaSource::Builtin("datagen".into()), vec![]),
            (
                "tickets",
                SchemaSource::Spec(SchemaSpec::from_json(TICKETS_SPEC)?),
                vec![],
            ),
        ];
        let mut stores: Vec<NamedStore> = Vec::new();
        let mut created = Vec::new();
        for (name, source, params) in sources {
            let named = match registry.describe(name) {
                Ok(_) => registry.open(name, &HashMap::new()).await?,
                Err(RegistryError::NotFound { .. }) => {
                    created.push(name);
                    let mut options = CreateOptions::new(source);
                    options.params = params;
                    registry.create(name, options).await?
                }
                Err(e) => return Err(e.into()),
            };
            stores.push(named);
        }
        self.say(
            "stores",
            if created.is_empty() {
                "reopened rollouts (rollout plugin), memories (context), events (datagen), tickets (user SchemaSpec)".into()
            } else {
                format!(
                    "created {} from the built-in plugins and a user SchemaSpec",
                    created.join(", ")
                )
            },
            t,
        );
        <[NamedStore; 4]>::try_from(stores).map_err(|_| anyhow::anyhow!("four stores expected"))
    }

    /// Step 2: the sample through each store's plugin, `batch_rows` records
    /// per add.
    async fn load(
        &mut self,
        stores: [&NamedStore; 4],
        sample: &Sample,
        batch_rows: usize,
    ) -> Result<()> {
        let all = sample.len();
        let bar = self.out.bar(Some(all as u64), "loading the sample");
        let t = Instant::now();
        let mut loaded = 0usize;
        for (store, rows) in stores.into_iter().zip(sample.rows()) {
            for chunk in rows.chunks(batch_rows.max(1)) {
                let text = chunk
                    .iter()
                    .map(Value::to_string)
                    .collect::<Vec<_>>()
                    .join("\n");
                let batch = rows_from_json(store.plugin(), text.as_bytes())?;
                store.add(&batch).await?;
                loaded += chunk.len();
                bar.set_position(loaded as u64);
            }
        }
        bar.finish_and_clear();
        self.say(
            "load",
            format!(
                "{all} records through the plugins ({} rollout messages, {} memories with {EMBEDDING_DIM}-d embeddings, {} datagen events, {} tickets), {:.0} records/s, each add durable on return",
                sample.rollouts.len(),
                sample.memories.len(),
                sample.events.len(),
                sample.tickets.len(),
                all as f64 / t.elapsed().as_secs_f64().max(1e-9)
            ),
            t,
        );
        Ok(())
    }

    /// Step 3: a bad batch of tickets is refused whole, naming row and
    /// column, and writes nothing.
    async fn refused_batch(&mut self, tickets: &NamedStore, tag: &str) -> Result<()> {
        let t = Instant::now();
        let bad = [
            json!({"id": format!("{tag}-bad-1"), "team": "billing", "title": "fine", "priority": 2, "status": "open", "opened_at": "2026-11-30T10:00:00"}),
            json!({"id": format!("{tag}-bad-2"), "team": "marketing", "title": "", "priority": 9, "status": "open", "opened_at": "2026-11-30T10:00:00"}),
        ];
        let text = bad
            .iter()
            .map(Value::to_string)
            .collect::<Vec<_>>()
            .join("\n");
        let batch = rows_from_json(tickets.plugin(), text.as_bytes())?;
        let tickets_before = tickets.count(None).await?;
        match tickets.add(&batch).await {
            Ok(_) => anyhow::bail!("the demo's bad batch was accepted"),
            Err(e) => {
                let errors = e.to_string().replace('\n', " ");
                let rows = match &e {
                    lance_context_host::PipelineError::Plugin(p) => p
                        .row_errors()
                        .unwrap_or_default()
                        .iter()
                        .map(|r| {
                            format!(
                                "line {} column {}: {}",
                                u64::from(r.row) + 1,
                                r.column.as_deref().unwrap_or("-"),
                                r.message
                            )
                        })
                        .collect::<Vec<_>>(),
                    _ => vec![errors],
                };
                ensure!(
                    tickets.count(None).await? == tickets_before,
                    "a refused batch wrote rows"
                );
                self.say(
                    "refused batch",
                    format!(
                        "2 tickets refused whole, nothing written: {}",
                        rows.join("; ")
                    ),
                    t,
                );
            }
        }
        Ok(())
    }

    /// Step 4: merge the write-ahead tier, compact, index the memories'
    /// vectors.
    async fn maintain(&mut self, stores: [&NamedStore; 4], memories: &NamedStore) -> Result<()> {
        let t = Instant::now();
        let mut merged = 0;
        for store in stores {
            merged += store.merge().await?.rows_upserted;
        }
        self.say(
            "merge",
            format!("{merged} rows folded from the write-ahead tier into the base tables"),
            t,
        );
        let t = Instant::now();
        let mut removed = 0;
        for store in stores {
            removed += store.compact().await?.fragments_removed;
        }
        self.say(
            "compact",
            format!("{removed} small fragment(s) rewritten"),
            t,
        );
        let t = Instant::now();
        memories.build_vector_index("embedding").await?;
        let stats = memories.stats().await?;
        let trained = stats
            .index("embedding_idx")
            .is_some_and(|i| i.covers_all_rows);
        self.say(
            "vector index",
            if trained {
                "IVF index on memories.embedding".into()
            } else {
                format!(
                    "IVF index on memories.embedding defined, not trained: {} row(s) \
                     (training needs 256); searches are exact",
                    stats.rows_in_base
                )
            },
            t,
        );
        Ok(())
    }

    /// Step 5, reads: a point lookup of a memory, a filtered scan of
    /// tickets.
    async fn lookup_and_scan(
        &mut self,
        memories: &NamedStore,
        tickets: &NamedStore,
        tag: &str,
    ) -> Result<()> {
        let t = Instant::now();
        let key = format!("{tag}-mem-7");
        let found = memories
            .lookup(
                &[key.as_str()],
                Some(&["id".to_string(), "text_payload".to_string()]),
            )
            .await?;
        ensure!(found.num_rows() == 1, "point lookup of {key} found nothing");
        self.say("point lookup", format!("memories {key}: found"), t);

        let t = Instant::now();
        let urgent = tickets
            .scan(
                ScanRequest::new()
                    .filter("priority <= 2 AND status = 'open' AND team = 'infra'")
                    .project(["id", "priority", "title"])
                    .order_by(SortKey::asc("priority"))
                    .order_by(SortKey::asc("id"))
                    .limit(10),
            )
            .await?;
        let open_infra = tickets
            .count(Some("status = 'open' AND team = 'infra'"))
            .await?;
        self.say(
            "filtered scan",
            format!(
                "tickets: {open_infra} open for infra; the {} most urgent, ordered by priority",
                urgent.num_rows()
            ),
            t,
        );
        Ok(())
    }

    /// Step 5, reads: the memories nearest a random vector, in one tenant.
    async fn vector_search(&mut self, memories: &NamedStore, rng: &mut Rng) -> Result<()> {
        let t = Instant::now();
        let query: Vec<f32> = (0..EMBEDDING_DIM).map(|_| rng.unit()).collect();
        let mut search = VectorQuery::new("embedding", query, 5);
        search.filter = Some("tenant = 'acme'".into());
        let near = memories.nearest(&search).await?;
        self.say(
            "vector search",
            format!(
                "5 nearest memories of tenant acme: {} found",
                near.num_rows()
            ),
            t,
        );
        Ok(())
    }

    /// Step 5, reads: the plugins' named queries and fold — a trajectory, a
    /// datagen item's state, the SchemaSpec's query.
    async fn named_reads(
        &mut self,
        rollouts: &NamedStore,
        events: &NamedStore,
        tickets: &NamedStore,
        sample: &Sample,
    ) -> Result<()> {
        let Sample {
            first_rollout,
            first_item,
            ..
        } = sample;
        let t = Instant::now();
        let trajectory = rollouts
            .query(
                "trajectory",
                &[("rollout_id".into(), first_rollout.clone())],
            )
            .await?;
        ensure!(
            trajectory.num_rows() == 40,
            "trajectory of {first_rollout}: {} rows",
            trajectory.num_rows()
        );
        self.say(
            "trajectory",
            format!(
                "rollout {first_rollout}: {} messages in order (named query)",
                trajectory.num_rows()
            ),
            t,
        );

        let t = Instant::now();
        let state = events
            .reduce("item_state", &[("item_id".into(), first_item.clone())])
            .await?;
        let state: Value = serde_json::from_str(state.get())?;
        self.say(
            "item fold",
            format!(
                "datagen item {first_item}: status {}, folded by the plugin from its events",
                state.pointer("/item/status").unwrap_or(&Value::Null)
            ),
            t,
        );

        let t = Instant::now();
        let team = tickets
            .query("open_for_team", &[("team".into(), "agents".into())])
            .await?;
        self.say(
            "user query",
            format!(
                "tickets open_for_team(agents): {} rows (a query the SchemaSpec declares)",
                team.num_rows()
            ),
            t,
        );
        Ok(())
    }

    /// Step 6: a fresh reader (a new registry handle, read-only) counts each
    /// store: what it held `before` plus this run's sample.
    async fn fresh_reader(
        &mut self,
        data: &std::path::Path,
        before: &[u64],
        sample: &Sample,
    ) -> Result<()> {
        let t = Instant::now();
        let reader = Registry::at(
            data,
            Arc::new(PluginRuntime::new(
                PluginLimits::default(),
                lance_context_host::default_cache_dir().as_deref(),
            )?),
        )?;
        let mut fresh = Vec::new();
        for name in ["rollouts", "memories", "events", "tickets"] {
            fresh.push(reader.open_with(name, &HashMap::new(), true, |c| c).await?);
        }
        let after = counts(&fresh.iter().collect::<Vec<_>>()).await?;
        let added = sample.rows().map(|rows| rows.len());
        for (i, name) in ["rollouts", "memories", "events", "tickets"]
            .iter()
            .enumerate()
        {
            ensure!(
                after[i] == before[i] + added[i] as u64,
                "a fresh reader sees {} records in {name}, expected {} + {}",
                after[i],
                before[i],
                added[i]
            );
            self.report.counts.insert(name.to_string(), after[i]);
        }
        self.say(
            "fresh reader",
            format!(
                "rollouts {}, memories {}, events {}, tickets {} (+{} this run)",
                after[0],
                after[1],
                after[2],
                after[3],
                sample.len()
            ),
            t,
        );
        Ok(())
    }
}

fn count_runs(root: &std::path::Path) -> u64 {
    std::fs::read_to_string(root.join(".demo-runs"))
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(0)
}

async fn counts(stores: &[&NamedStore]) -> Result<Vec<u64>> {
    let mut out = Vec::new();
    for s in stores {
        out.push(s.count(None).await?);
    }
    Ok(out)
}

fn rollout_sample(rng: &mut Rng, tag: &str, trajectories: usize) -> (Vec<Value>, String) {
    let mut rows = Vec::new();
    let first = format!("{tag}-rollout-0");
    for t in 0..trajectories {
        let rollout = format!("{tag}-rollout-{t}");
        let problem = format!("{tag}-problem-{}", t / 4);
        let reward = rng.unit();
        for step in 0..40 {
            let role = match step {
                0 => "system",
                s if s % 3 == 1 => "user",
                s if s % 3 == 2 => "assistant",
                _ => "tool",
            };
            let tokens: Vec<u32> = (0..8).map(|_| rng.below(50_000) as u32).collect();
            rows.push(json!({
                "id": format!("{rollout}-{step}"),
                "rollout_id": rollout,
                "problem_id": problem,
                "dataset": rng.pick(&["gsm8k", "swe-bench", "webarena"]),
                "sequence_order": step,
                "role": role,
                "content": format!("{role} message {step} of {rollout}: {}", "lorem ipsum ".repeat(1 + (step % 5))),
                "input_tokens": tokens,
                "num_input_tokens": 8,
                "reward": if step == 39 { Some(reward) } else { None },
                "policy_version": "policy-7",
            }));
        }
    }
    (rows, first)
}

fn memory_sample(rng: &mut Rng, tag: &str, n: usize) -> Vec<Value> {
    (0..n)
        .map(|i| {
            let embedding: Vec<f32> = (0..EMBEDDING_DIM).map(|_| rng.unit()).collect();
            json!({
                "id": format!("{tag}-mem-{i}"),
                "run_id": format!("{tag}-add-{}", i / 100),
                "bot_id": rng.pick(&["planner", "coder", "reviewer"]),
                "session_id": format!("{tag}-session-{}", i / 40),
                "tenant": rng.pick(&["acme", "globex", "initech"]),
                "role": rng.pick(&["user", "assistant", "tool"]),
                "text_payload": format!("observation {i}: the agent noted {}", rng.below(1000)),
                "embedding": embedding,
            })
        })
        .collect()
}

fn event_sample(rng: &mut Rng, tag: &str, items: usize) -> (Vec<Value>, String) {
    let mut rows = Vec::new();
    let first = format!("{tag}-item-0");
    for i in 0..items {
        let item = format!("{tag}-item-{i}");
        let base = |seq: i64, event_type: &str| {
            json!({
                "event_id": format!("{item}-e{seq}"),
                "item_id": item,
                "root_item_id": item,
                "item_seq": seq,
                "checkpoint_id": format!("{tag}-ckpt"),
                "event_type": event_type,
                "run_id": format!("{tag}-run"),
                "writer_epoch": "1",
                "schema_version": 1,
            })
        };
        let mut seq = 0;
        rows.push(base(seq, "ITEM_CREATED"));
        for (index, step) in ["draft", "critique", "revise"].iter().enumerate() {
            let with_step = |mut v: Value| {
                v["step_name"] = json!(step);
                v["step_kind"] = json!("leaf");
                v["step_index"] = json!(index);
                v
            };
            seq += 1;
            rows.push(with_step(base(seq, "STEP_STARTED")));
            seq += 1;
            let mut field = with_step(base(seq, "FIELD_SET"));
            field["field_name"] = json!(format!("{step}_text"));
            field["field_type"] = json!("str");
            field["codec_version"] = json!(1);
            field["value_kind"] = json!("str");
            field["value_str"] = json!(format!("{step} of {item}: {}", rng.below(10_000)));
            rows.push(field);
            seq += 1;
            rows.push(with_step(base(seq, "STEP_COMPLETED")));
        }
        seq += 1;
        let mut terminal = base(seq, "TERMINAL");
        terminal["status"] = json!(if rng.below(10) == 0 {
            "filtered"
        } else {
            "completed"
        });
        rows.push(terminal);
    }
    (rows, first)
}

fn ticket_sample(rng: &mut Rng, tag: &str, n: usize) -> Vec<Value> {
    (0..n)
        .map(|i| {
            json!({
                "id": format!("{tag}-ticket-{i}"),
                "team": rng.pick(&["billing", "infra", "search", "agents"]),
                "title": format!("ticket {i}: {}", rng.pick(&["timeout", "wrong total", "slow query", "agent loops"])),
                "priority": 1 + rng.below(5),
                "status": rng.pick(&["open", "open", "closed"]),
                "opened_at": format!("2026-11-{:02}T{:02}:00:00", 1 + rng.below(28), rng.below(24)),
            })
        })
        .collect()
}
