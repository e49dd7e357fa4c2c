//! `lance-context dev …`: the developers' commands — benchmarks and the
//! crash trials — kept out of the operator's command list.

use anyhow::Result;
use clap::Subcommand;

use super::{
    bench, bench_peer, bench_plugins, bench_scaleout, bench_search, bench_server, torture,
};

#[derive(Subcommand, Debug)]
pub enum DevCommand {
    /// Benchmark adds, merge and point lookups (key index vs full scan).
    Bench(bench::BenchArgs),
    /// Benchmark the plugin boundary: adds through the rollout plugin vs native.
    BenchPlugins(bench_plugins::PluginBenchArgs),
    /// Benchmark search: recall, BM25 agreement, vector/text/hybrid latency,
    /// and the previous implementation's search side by side.
    BenchSearch(bench_search::SearchBenchArgs),
    /// Benchmark the REST server: adds and gets over loopback HTTP vs in process.
    BenchServer(bench_server::ServerBenchArgs),
    /// Benchmark scale-out: add throughput, get latency and object-store
    /// requests per add at 1, 2 and 4 instances on a loopback S3 server.
    BenchScaleout(bench_scaleout::ScaleoutBenchArgs),
    /// Benchmark against the previous implementation (lance-context 0.6.7,
    /// installed into a venv): the single durable add, its floor (Lance's
    /// own writer) and where its time goes.
    BenchPeer(bench_peer::PeerBenchArgs),
    /// Seeded crash trials: a writer (and an operator's maintenance) killed at
    /// random moments, then every acknowledged write checked.
    Torture(torture::TortureArgs),
    #[command(hide = true)]
    TortureWriter(torture::WorkerArgs),
    #[command(hide = true)]
    TortureMaintainer(torture::WorkerArgs),
}

impl DevCommand {
    pub async fn execute(self) -> Result<()> {
        match self {
            Self::Bench(args) => bench::run(args).await,
            Self::BenchPlugins(args) => bench_plugins::run(args).await,
            Self::BenchSearch(args) => bench_search::run(args).await,
            Self::BenchServer(args) => bench_server::run(args).await,
            Self::BenchPeer(args) => bench_peer::run(args).await,
            Self::BenchScaleout(args) => bench_scaleout::run(args).await,
            Self::Torture(args) => torture::run(args).await,
            Self::TortureWriter(args) => torture::writer(args).await,
            Self::TortureMaintainer(args) => torture::maintainer(args).await,
        }
    }
}
