//! One module per command group (the binary's `main.rs` dispatches).

pub mod add;
pub mod adopt;
pub mod bench;
pub mod bench_peer;
pub mod bench_plugins;
pub mod bench_records;
pub mod bench_scaleout;
pub mod bench_search;
pub mod bench_server;
pub mod bench_workload;
pub mod dataset;
pub mod demo;
pub mod dev;
pub mod export;
pub mod plugin;
pub mod plugin_new;
pub mod read;
pub mod report;
pub mod search;
pub mod serve;
pub mod store;
pub mod through;
pub mod torture;
