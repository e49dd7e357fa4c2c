//! # lance-context-host
//!
//! The host around the storage engine: the sandboxed schema-plugin runtime
//! ([`plugin`]), the schema declaration every plugin produces and its rules
//! ([`spec`]), the catalogue of stores by name ([`registry`]), the schemas'
//! named queries ([`query`]), the add
//! pipeline through a plugin ([`pipeline`]), and the
//! `lance-context` CLI (the binary).

pub mod pipeline;
pub mod plugin;
pub mod query;
pub mod registry;
pub use lance_context_spec as spec;

/// Where the host's build placed the plugins it built for `wasm32-wasip2` (the
/// built-in schemas, and the fixtures the tests load).
pub const BUILT_PLUGINS_DIR: &str = env!("LANCE_CONTEXT_PLUGINS_DIR");

/// The path of a plugin built with the host, e.g. `built_plugin("rollout")`
/// for `lance_context_rollout.wasm`.
pub fn built_plugin(name: &str) -> std::path::PathBuf {
    std::path::Path::new(BUILT_PLUGINS_DIR)
        .join(format!("lance_context_{}.wasm", name.replace('-', "_")))
}

/// Hex sha256 of plugin bytes: how a plugin is identified and pinned.
pub(crate) fn sha256_hex(bytes: &[u8]) -> String {
    use sha2::{Digest, Sha256};
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// The host's clock in microseconds since the epoch, as handed to plugins.
pub(crate) fn now_micros() -> i64 {
    chrono::Utc::now().timestamp_micros()
}
