//! `lance-context dev bench-scaleout`: scale-out on the loopback object
//! store. For 1, 2 and 4 instances (`serve` processes of this binary, each
//! owning an equal share of a bucketed store's buckets, `--advertise`), the
//! same clients send batched adds and gets to every instance in turn: add
//! throughput, get latency, the scaling efficiency against one instance,
//! and the object-store requests per add (counted from the S3 server's
//! request log). The S3 server is moto (`python3 -m moto.server`), as in
//! the tests; each instance count gets a store of its own.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use clap::Args;
use lance_context_client::{Client, CreateStore, StoreApi as _};

use super::bench_server::drive;
use serde_json::{Value, json};

#[derive(Args, Debug)]
pub struct ScaleoutBenchArgs {
    /// Instance counts, run one after the other (each divides `--buckets`).
    #[arg(long, value_delimiter = ',', default_value = "1,2,4")]
    instances: Vec<u32>,
    /// The store's buckets.
    #[arg(long, default_value_t = 4)]
    buckets: u32,
    /// Concurrent clients (each sends to every instance in turn).
    #[arg(long, default_value_t = 8)]
    clients: usize,
    /// Records per add.
    #[arg(long, default_value_t = 100)]
    batch: usize,
    /// Adds per instance count (over all clients).
    #[arg(long, default_value_t = 200)]
    adds: usize,
    /// Gets by key per instance count (over all clients).
    #[arg(long, default_value_t = 2000)]
    gets: usize,
}

const SPEC: &str = r#"{"name": "bench", "key": "id", "columns": [
    {"name": "id", "type": "Utf8", "nullable": false},
    {"name": "n", "type": "Int64"},
    {"name": "text", "type": "Utf8"}]}"#;

/// A child process, killed when dropped.
struct Proc(Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn free_port() -> Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

/// moto's S3 server on a free loopback port, its request log in `log`.
async fn start_s3(log: &Path) -> Result<(Proc, u16)> {
    let port = free_port()?;
    let child = Command::new("python3")
        .args([
            "-m",
            "moto.server",
            "-H",
            "127.0.0.1",
            "-p",
            &port.to_string(),
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::from(std::fs::File::create(log)?))
        .spawn()
        .context(
            "starting python3 -m moto.server (install it: python3 -m pip install 'moto[server]')",
        )?;
    let proc = Proc(child);
    let until = Instant::now() + Duration::from_secs(30);
    while tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .is_err()
    {
        if Instant::now() > until {
            bail!(
                "moto did not start on port {port} (is moto[server] installed? python3 -m pip install 'moto[server]')"
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let made = reqwest::Client::new()
        .put(format!("http://127.0.0.1:{port}/bench"))
        .send()
        .await?;
    if !made.status().is_success() {
        bail!("creating the S3 bucket: {}", made.status());
    }
    Ok((proc, port))
}

/// Requests the S3 server has logged so far.
fn s3_requests(log: &Path) -> Result<u64> {
    let text = std::fs::read_to_string(log)?;
    Ok(text.lines().filter(|l| l.contains(" HTTP/1.1\" ")).count() as u64)
}

fn options(port: u16) -> Vec<String> {
    [
        format!("aws_endpoint=http://127.0.0.1:{port}"),
        "aws_access_key_id=testing".into(),
        "aws_secret_access_key=testing".into(),
        "aws_region=us-east-1".into(),
        "allow_http=true".into(),
        "aws_virtual_hosted_style_request=false".into(),
    ]
    .into()
}

/// A `serve` process of this binary owning `owns`; its address.
fn serve(root: &Path, port: u16, name: &str, owns: &str) -> Result<(Proc, String)> {
    let mut command = Command::new(std::env::current_exe()?);
    command.args(["serve", "--root"]).arg(root).args([
        "--addr",
        "127.0.0.1:0",
        "--owns",
        owns,
        "--advertise",
        "auto",
        "--instance",
        name,
        "--allow-uri-prefix",
        "s3://bench/",
        "--store-concurrency",
        "64",
    ]);
    for option in options(port) {
        command.args(["--storage-option", &option]);
    }
    let log = std::fs::File::create(root.join(format!("{name}.log")))?;
    let mut child = command
        .stdout(Stdio::piped())
        .stderr(Stdio::from(log))
        .spawn()?;
    let mut line = String::new();
    BufReader::new(child.stdout.as_mut().context("stdout")?).read_line(&mut line)?;
    let url = line
        .trim()
        .strip_prefix("listening on ")
        .with_context(|| format!("serve printed {line:?}"))?
        .to_string();
    Ok((Proc(child), url))
}

fn record(i: usize) -> Value {
    json!({"id": format!("k{i:08}"), "n": i, "text": "an observation of moderate length"})
}

/// What one instance count measured.
struct Figures {
    instances: u32,
    rows_per_s: f64,
    add_p50: Duration,
    gets_per_s: f64,
    get_p50: Duration,
    get_p99: Duration,
    requests_per_add: f64,
    requests_per_get: f64,
}

async fn one(
    args: &ScaleoutBenchArgs,
    dir: &Path,
    port: u16,
    log: &Path,
    n: u32,
) -> Result<Figures> {
    let root = dir.join(format!("root-{n}"));
    std::fs::create_dir_all(&root)?;
    let per = args.buckets / n;
    let mut procs = Vec::new();
    let mut clients = Vec::new();
    for i in 0..n {
        let owns = format!("{}-{}", i * per, (i + 1) * per - 1);
        let (proc, url) = serve(&root, port, &format!("i{i}"), &owns)?;
        procs.push(proc);
        clients.push(Client::new(&url));
    }
    let mut create = CreateStore::spec("bench", serde_json::from_str(SPEC)?);
    create.buckets = Some(args.buckets);
    create.uri = Some(format!("s3://bench/n{n}"));
    clients[0].create_store(&create).await?;
    // Every instance has opened the store and published (a write of every
    // bucket through each succeeds).
    let probe: Vec<Value> = (0..64).map(|i| record(100_000_000 + i)).collect();
    for c in &clients {
        let until = Instant::now() + Duration::from_secs(60);
        while let Err(e) = c.add("bench", &probe).await {
            if Instant::now() > until {
                bail!("instances never all ready: {e}");
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    let clients = Arc::new(clients);

    // Adds, then gets of keys written: op i goes to instance i mod n.
    let before = s3_requests(log)?;
    let batch = args.batch;
    let adds = drive(args.clients, args.adds, batch, {
        let clients = clients.clone();
        move |a| {
            let clients = clients.clone();
            async move {
                let records: Vec<Value> = (a * batch..(a + 1) * batch).map(record).collect();
                clients[a % clients.len()].add("bench", &records).await?;
                Ok(())
            }
        }
    })
    .await?;
    let add_requests = s3_requests(log)? - before;
    let written = args.adds * batch;
    let before = s3_requests(log)?;
    let gets = drive(args.clients, args.gets, 1, move |g| {
        let clients = clients.clone();
        async move {
            let key = format!("k{:08}", (g * 7919) % written);
            let found = clients[g % clients.len()].get("bench", &key).await?;
            anyhow::ensure!(found.is_some(), "{key} not found");
            Ok(())
        }
    })
    .await?;
    let get_requests = s3_requests(log)? - before;
    drop(procs);
    Ok(Figures {
        instances: n,
        rows_per_s: adds.records_per_s(),
        add_p50: adds.pct(0.5),
        gets_per_s: gets.ops_per_s(),
        get_p50: gets.pct(0.5),
        get_p99: gets.pct(0.99),
        requests_per_add: add_requests as f64 / args.adds.max(1) as f64,
        requests_per_get: get_requests as f64 / args.gets.max(1) as f64,
    })
}

pub async fn run(args: ScaleoutBenchArgs) -> Result<()> {
    for n in &args.instances {
        if *n == 0 || !args.buckets.is_multiple_of(*n) {
            bail!(
                "--instances: {n} does not divide --buckets {}",
                args.buckets
            );
        }
    }
    let dir = tempfile::tempdir()?;
    let log: PathBuf = dir.path().join("s3.log");
    let (_s3, port) = start_s3(&log).await?;
    let mut figures = Vec::new();
    for n in &args.instances {
        eprintln!("{n} instance(s)…");
        figures.push(one(&args, dir.path(), port, &log, *n).await?);
    }
    let base = figures
        .iter()
        .find(|f| f.instances == 1)
        .map(|f| f.rows_per_s);
    println!();
    println!(
        "scale-out on the loopback S3 server (moto): {} buckets, {} clients, adds of {} records, {} cores",
        args.buckets,
        args.clients,
        args.batch,
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1)
    );
    println!(
        "{:>9} {:>12} {:>10} {:>11} {:>9} {:>9} {:>9} {:>12} {:>12}",
        "instances",
        "add rows/s",
        "add p50",
        "efficiency",
        "gets/s",
        "get p50",
        "get p99",
        "S3 reqs/add",
        "S3 reqs/get"
    );
    for f in &figures {
        let efficiency = base
            .map(|b| format!("{:.2}", f.rows_per_s / (b * f.instances as f64)))
            .unwrap_or_else(|| "-".into());
        println!(
            "{:>9} {:>12.0} {:>8.1}ms {:>11} {:>9.0} {:>7.2}ms {:>7.2}ms {:>12.1} {:>12.1}",
            f.instances,
            f.rows_per_s,
            f.add_p50.as_secs_f64() * 1e3,
            efficiency,
            f.gets_per_s,
            f.get_p50.as_secs_f64() * 1e3,
            f.get_p99.as_secs_f64() * 1e3,
            f.requests_per_add,
            f.requests_per_get
        );
    }
    println!(
        "efficiency: add rows/s at N instances / (N x rows/s at 1); S3 requests counted from the S3 server's log over each phase (background merges included); every process (instances, S3 server, clients) shares this machine's cores"
    );
    Ok(())
}
