//! # lance-context-host
//!
//! The host around the storage engine: the sandboxed schema-plugin runtime
//! ([`PluginRuntime`], [`LoadedPlugin`]), the schema declaration every plugin
//! produces and its rules ([`spec`]), the catalogue of stores by name
//! ([`Registry`]), a store opened by name — the only way the host writes —
//! ([`NamedStore`]), the write pipeline through a plugin ([`prepare`]), the
//! schemas' named queries ([`named_request`]), one error kind for all of it
//! ([`ErrorKind`], [`error_kind`]), the store API in this process
//! ([`Embedded`], the trait `lance_context_client::StoreApi`) and the REST
//! server ([`Server`]). The `lance-context` CLI is a crate of its own
//! (`crates/cli`) over this one; nothing here depends on it.
//!
//! The crate's public surface is the `pub use` list below; its modules are
//! private.

#![warn(missing_docs)]

mod api;
mod kind;
mod named;
mod pipeline;
mod plugin;
mod probe;
mod query;
mod registry;
mod reports;
pub mod search;
mod server;

pub use api::members::{
    FORWARDED_HEADER, MemberBucket, MemberRecord, NOW_HEADER, PeerConfig, PeerConfigError, owners,
};
pub use api::{Embedded, EmbeddedConfig, MAX_PAGE, Residency};
pub use kind::{ErrorKind, error_kind};
pub use lance_context_spec as spec;
pub use named::{NamedStore, QueryFailure};
pub use pipeline::{
    InputProblem, JsonRows, MAX_LISTED_PROBLEMS, PipelineError, conform, input_schema, json_ready,
    json_rows, prepare, rows_from_json, to_input,
};
pub use plugin::{
    ABI_VERSION, COMPILER_ARG, CacheStats, CompileLimit, Compiler, LoadedPlugin, PinnedLoadError,
    PluginDeclaration, PluginError, PluginLimits, PluginRuntime, RowError, ShapeLimits, Violation,
    compiler_main, default_cache_dir, use_compiler_program,
};
pub use probe::{ProbeCheck, ProbeLevel, ProbeReport, probe};
pub use query::{QueryError, default_projection, named_request};
pub use registry::{
    AdoptOptions, AdoptReport, BUILTIN_PLUGINS, ColumnReport, ColumnVerdict, CreateOptions,
    DropReport, EntryState, PluginPin, RESERVED_NAMES, Registry, RegistryError, SchemaSource,
    ShardReport, StoreEntry, UpgradeReport, UriConflict, check_name, check_uri_allowed,
    store_config,
};
pub use reports::{compaction_report, merge_report, store_status};
pub use server::{Role, Server, ServerConfig, ServerError, Token, TokensFile};

/// Where the host's build placed the plugins it built for `wasm32-wasip2` (the
/// built-in schemas, and the fixtures the tests load).
pub const BUILT_PLUGINS_DIR: &str = env!("LANCE_CONTEXT_PLUGINS_DIR");

/// The path of a plugin built with the host, e.g. `built_plugin("rollout")`
/// for `lance_context_rollout.wasm`.
pub fn built_plugin(name: &str) -> std::path::PathBuf {
    std::path::Path::new(BUILT_PLUGINS_DIR)
        .join(format!("lance_context_{}.wasm", name.replace('-', "_")))
}

/// The components of the built-in plugins, compiled into the host: the
/// binary needs no file of the build tree at run time.
const EMBEDDED_PLUGINS: &[(&str, &[u8])] = &[
    (
        "rollout",
        include_bytes!(concat!(
            env!("LANCE_CONTEXT_PLUGINS_DIR"),
            "/lance_context_rollout.wasm"
        )),
    ),
    (
        "context",
        include_bytes!(concat!(
            env!("LANCE_CONTEXT_PLUGINS_DIR"),
            "/lance_context_context.wasm"
        )),
    ),
    (
        "datagen",
        include_bytes!(concat!(
            env!("LANCE_CONTEXT_PLUGINS_DIR"),
            "/lance_context_datagen.wasm"
        )),
    ),
    (
        "spec-plugin",
        include_bytes!(concat!(
            env!("LANCE_CONTEXT_PLUGINS_DIR"),
            "/lance_context_spec_plugin.wasm"
        )),
    ),
];

/// The component of a built-in plugin (`rollout`, `context`, `datagen`, or
/// `spec-plugin`, the generic plugin of declarative specs), as compiled into
/// the host.
pub fn builtin_plugin_bytes(name: &str) -> Option<&'static [u8]> {
    EMBEDDED_PLUGINS
        .iter()
        .find(|(n, _)| *n == name)
        .map(|(_, bytes)| *bytes)
}

/// Records a built-in plugin accepts (JSON Lines), for the probe run before
/// a store pins it: the built-ins' rules (enumerations, consistency checks)
/// refuse the probe's generated records, so their transforms are checked on
/// these.
pub fn builtin_samples(name: &str) -> Option<&'static str> {
    match name {
        "rollout" => Some(concat!(
            r#"{"id": "probe-r1", "rollout_id": "r1", "problem_id": "p1", "sequence_order": 0, "role": "user", "content": "What is 2+2?"}"#,
            "\n",
            r#"{"id": "probe-r2", "rollout_id": "r1", "problem_id": "p1", "sequence_order": 1, "role": "assistant", "content": "4", "reward": 1.0}"#,
            "\n"
        )),
        "context" => Some(concat!(
            r#"{"id": "probe-c1", "run_id": "run-1", "text_payload": "a note"}"#,
            "\n",
            r#"{"id": "probe-c2", "run_id": "run-1", "external_id": "ext-1", "text_payload": "another"}"#,
            "\n"
        )),
        "datagen" => Some(concat!(
            r#"{"event_id": "probe-e0", "item_id": "i1", "root_item_id": "i1", "item_seq": 0, "checkpoint_id": "c1", "event_type": "ITEM_CREATED", "run_id": "run-1", "writer_epoch": "1", "schema_version": 1}"#,
            "\n",
            r#"{"event_id": "probe-e1", "item_id": "i1", "root_item_id": "i1", "item_seq": 1, "checkpoint_id": "c1", "event_type": "STEP_STARTED", "run_id": "run-1", "writer_epoch": "1", "schema_version": 1, "step_name": "draft", "step_kind": "leaf", "step_index": 0}"#,
            "\n"
        )),
        _ => None,
    }
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
