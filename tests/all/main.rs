//! The one integration-test binary: a module per area, shared helpers in
//! `support`. Everything runs against real Lance datasets on disk (and a real
//! S3-compatible server on loopback for object-store paths).

mod support;

mod adopt;
mod authoring;
mod buckets;
mod cli;
mod conformance;
mod crash;
mod fencing;
mod fuzz;
mod layers;
mod maintenance;
mod plugins;
mod promises;
mod read;
mod records;
mod registry;
mod sandbox;
mod scaleout;
mod search;
mod server;
mod shards;
mod soak;
mod storage_options;
mod takeover;
mod tenants;
mod torture;
mod vectors;
mod write;
