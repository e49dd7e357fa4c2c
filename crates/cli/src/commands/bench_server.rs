//! `lance-context dev bench-server`: the REST server against the same
//! operations in process — adds of 1 and of 1,000 records and gets by key,
//! from N concurrent clients over loopback — latency (p50, p99), throughput,
//! and the ratio HTTP / in-process.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Result;
use clap::Args;
use lance_context_client::{Client, CreateStore, StoreApi as _};
use lance_context_host::spec::SchemaSpec;
use lance_context_host::{
    CreateOptions, NamedStore, PluginLimits, PluginRuntime, Registry, SchemaSource, Server,
    ServerConfig, rows_from_json,
};
use serde_json::{Value, json};

#[derive(Args, Debug)]
pub struct ServerBenchArgs {
    /// Concurrent clients.
    #[arg(long, default_value_t = 8)]
    clients: usize,
    /// Single-record adds (over all clients).
    #[arg(long, default_value_t = 800)]
    single_adds: usize,
    /// Adds of 1,000 records (over all clients).
    #[arg(long, default_value_t = 40)]
    bulk_adds: usize,
    /// Gets by key (over all clients).
    #[arg(long, default_value_t = 4000)]
    gets: usize,
    /// Group commit: HTTP single-record adds from one client, then from
    /// this many at once (alternating, two rounds); 0 leaves it out.
    #[arg(long, default_value_t = 16)]
    scaling_clients: usize,
    /// Single-record adds per client in each group-commit run.
    #[arg(long, default_value_t = 100)]
    scaling_adds: usize,
}

const SPEC: &str = r#"{"name": "bench", "key": "id", "columns": [
    {"name": "id", "type": "Utf8", "nullable": false},
    {"name": "n", "type": "Int64"},
    {"name": "text", "type": "Utf8"}]}"#;

fn record(prefix: &str, i: usize) -> Value {
    json!({"id": format!("{prefix}-{i}"), "n": i, "text": "an observation of moderate length"})
}

/// Latencies of one operation kind.
pub(super) struct Sample {
    latencies: Vec<Duration>,
    wall: Duration,
    records: usize,
}

impl Sample {
    pub(super) fn pct(&self, p: f64) -> Duration {
        let mut l = self.latencies.clone();
        l.sort();
        l.get(((l.len() as f64 - 1.0) * p).round() as usize)
            .copied()
            .unwrap_or_default()
    }
    pub(super) fn ops_per_s(&self) -> f64 {
        self.latencies.len() as f64 / self.wall.as_secs_f64().max(1e-9)
    }
    pub(super) fn records_per_s(&self) -> f64 {
        self.records as f64 / self.wall.as_secs_f64().max(1e-9)
    }
}

/// Run `ops` operations from `clients` tasks; `op(i)` does the i-th.
pub(super) async fn drive<F, Fut>(
    clients: usize,
    ops: usize,
    records_per_op: usize,
    op: F,
) -> Result<Sample>
where
    F: Fn(usize) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = Result<()>> + Send,
{
    let op = Arc::new(op);
    let started = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for c in 0..clients.max(1) {
        let op = op.clone();
        tasks.spawn(async move {
            let mut latencies = Vec::new();
            let mut i = c;
            while i < ops {
                let t = Instant::now();
                op(i).await?;
                latencies.push(t.elapsed());
                i += clients.max(1);
            }
            anyhow::Ok(latencies)
        });
    }
    let mut latencies = Vec::new();
    while let Some(done) = tasks.join_next().await {
        latencies.extend(done??);
    }
    Ok(Sample {
        latencies,
        wall: started.elapsed(),
        records: ops * records_per_op,
    })
}

pub async fn run(args: ServerBenchArgs) -> Result<()> {
    let dir = tempfile::tempdir()?;
    let runtime = Arc::new(PluginRuntime::new(
        PluginLimits::default(),
        lance_context_host::default_cache_dir().as_deref(),
    )?);
    // In process: a store of its own.
    let local_root = dir.path().join("local");
    let registry = Registry::at(&local_root, runtime)?;
    let local: Arc<NamedStore> = Arc::new(
        registry
            .create(
                "bench",
                CreateOptions::new(SchemaSource::Spec(SchemaSpec::from_json(SPEC)?)),
            )
            .await?,
    );
    // Over HTTP: a server on loopback (in this process), its own store.
    let config = ServerConfig::new(dir.path().join("server"), "127.0.0.1:0".parse()?);
    let server = Server::bind(config).await?;
    let url = format!("http://{}", server.local_addr()?);
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let serving = tokio::spawn(server.run(async move {
        let _ = stopped.await;
    }));
    let client = Client::new(&url);
    client
        .create_store(&CreateStore::spec("bench", serde_json::from_str(SPEC)?))
        .await?;

    let n = args.clients;
    println!(
        "bench-server: {n} concurrent clients over loopback HTTP vs in process (same pipeline, same engine)"
    );
    let mut rows: Vec<(String, Sample, Sample)> = Vec::new();

    // Single-record adds.
    let (local_single, http_single) = single_adds(n, args.single_adds, &local, &client).await?;
    rows.push(("add 1 record".into(), local_single, http_single));

    // Adds of 1,000 records.
    let (local_bulk, http_bulk) = bulk_adds(n, args.bulk_adds, &local, &client).await?;
    rows.push(("add 1,000 records".into(), local_bulk, http_bulk));

    // Gets by key (of the single adds), both stores merged first so that
    // both read the same layout: the base table through its key index,
    // nothing left in the write-ahead tier.
    local.merge().await?;
    client.merge("bench").await?;
    let (local_get, http_get) = gets(n, &args, &local, &client).await?;
    rows.push(("get by key".into(), local_get, http_get));

    print_table(&rows);
    if args.scaling_clients > 0 {
        group_commit(args.scaling_clients, args.scaling_adds.max(1), &client).await?;
    }
    local.close().await?;
    let _ = stop.send(());
    serving.await??;
    Ok(())
}

/// `ops` single-record adds from `n` clients, in process then over HTTP.
async fn single_adds(
    n: usize,
    ops: usize,
    local: &Arc<NamedStore>,
    client: &Client,
) -> Result<(Sample, Sample)> {
    let l = local.clone();
    let local_single = drive(n, ops, 1, move |i| {
        let l = l.clone();
        async move {
            let text = record("s", i).to_string();
            let batch = rows_from_json(l.plugin(), text.as_bytes())?;
            l.add(&batch).await?;
            Ok(())
        }
    })
    .await?;
    let c = client.clone();
    let http_single = drive(n, ops, 1, move |i| {
        let c = c.clone();
        async move {
            c.add("bench", &[record("s", i)]).await?;
            Ok(())
        }
    })
    .await?;
    Ok((local_single, http_single))
}

/// `ops` adds of 1,000 records from `n` clients, in process then over HTTP.
async fn bulk_adds(
    n: usize,
    ops: usize,
    local: &Arc<NamedStore>,
    client: &Client,
) -> Result<(Sample, Sample)> {
    let l = local.clone();
    let local_bulk = drive(n, ops, 1000, move |i| {
        let l = l.clone();
        async move {
            let text: Vec<String> = (0..1000)
                .map(|j| record(&format!("b{i}"), j).to_string())
                .collect();
            let batch = rows_from_json(l.plugin(), text.join("\n").as_bytes())?;
            l.add(&batch).await?;
            Ok(())
        }
    })
    .await?;
    let c = client.clone();
    let http_bulk = drive(n, ops, 1000, move |i| {
        let c = c.clone();
        async move {
            let records: Vec<Value> = (0..1000).map(|j| record(&format!("b{i}"), j)).collect();
            c.add("bench", &records).await?;
            Ok(())
        }
    })
    .await?;
    Ok((local_bulk, http_bulk))
}

/// `args.gets` gets by key of the single adds from `n` clients, in process
/// then over HTTP.
async fn gets(
    n: usize,
    args: &ServerBenchArgs,
    local: &Arc<NamedStore>,
    client: &Client,
) -> Result<(Sample, Sample)> {
    let singles = args.single_adds.max(1);
    let l = local.clone();
    let local_get = drive(n, args.gets, 1, move |i| {
        let l = l.clone();
        async move {
            let key = format!("s-{}", (i * 7919) % singles);
            anyhow::ensure!(l.get(&key).await?.is_some(), "{key} missing");
            Ok(())
        }
    })
    .await?;
    let c = client.clone();
    let http_get = drive(n, args.gets, 1, move |i| {
        let c = c.clone();
        async move {
            let key = format!("s-{}", (i * 7919) % singles);
            anyhow::ensure!(c.get("bench", &key).await?.is_some(), "{key} missing");
            Ok(())
        }
    })
    .await?;
    Ok((local_get, http_get))
}

/// The table of each operation in process and over HTTP, and the goals.
fn print_table(rows: &[(String, Sample, Sample)]) {
    println!();
    println!(
        "{:<18} {:>10} {:>10} {:>12} | {:>10} {:>10} {:>12} | {:>8} {:>8}",
        "operation",
        "p50",
        "p99",
        "records/s",
        "HTTP p50",
        "HTTP p99",
        "records/s",
        "p50 ×",
        "thru ×"
    );
    for (name, local, http) in rows {
        println!(
            "{:<18} {:>10.2?} {:>10.2?} {:>12.0} | {:>10.2?} {:>10.2?} {:>12.0} | {:>8.2} {:>8.2}",
            name,
            local.pct(0.5),
            local.pct(0.99),
            local.records_per_s(),
            http.pct(0.5),
            http.pct(0.99),
            http.records_per_s(),
            http.pct(0.5).as_secs_f64() / local.pct(0.5).as_secs_f64().max(1e-9),
            local.ops_per_s() / http.ops_per_s().max(1e-9),
        );
    }
    println!();
    let ratio =
        |i: usize| rows[i].2.pct(0.5).as_secs_f64() / rows[i].1.pct(0.5).as_secs_f64().max(1e-9);
    println!(
        "goals: single add over HTTP ≤ 1.5× in process: {:.2}× {}; get ≤ 2×: {:.2}× {}",
        ratio(0),
        if ratio(0) <= 1.5 { "met" } else { "NOT met" },
        ratio(2),
        if ratio(2) <= 2.0 { "met" } else { "NOT met" }
    );
}

/// Group commit over HTTP: the throughput of single-record adds from one
/// client and from `clients` at once, alternating, two rounds; each run
/// makes `per_client` adds per client. Concurrent adds share a freeze (one
/// generation for all), so throughput should grow with the clients.
async fn group_commit(clients: usize, per_client: usize, client: &Client) -> Result<()> {
    let (mut one, mut many) = (Vec::new(), Vec::new());
    for round in 0..2 {
        for n in [1, clients] {
            let c = client.clone();
            let prefix = format!("g{round}-{n}");
            let sample = drive(n, n * per_client, 1, move |i| {
                let c = c.clone();
                let record = record(&prefix, i);
                async move {
                    c.add("bench", &[record]).await?;
                    Ok(())
                }
            })
            .await?;
            match n {
                1 => one.push(sample),
                _ => many.push(sample),
            }
        }
    }
    // The mean of the rounds.
    let mean = |samples: &[Sample]| {
        samples.iter().map(Sample::records_per_s).sum::<f64>() / samples.len() as f64
    };
    let (a, b) = (mean(&one), mean(&many));
    println!(
        "group commit over HTTP: 1 client {a:.0} records/s (p50 {:.2?}), {clients} clients {b:.0} records/s (p50 {:.2?}): {:.1}× (goal ≥ 10×: {})",
        one[0].pct(0.5),
        many[0].pct(0.5),
        b / a,
        if b / a >= 10.0 { "met" } else { "NOT met" }
    );
    Ok(())
}
