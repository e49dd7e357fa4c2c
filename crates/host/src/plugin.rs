//! Schema plugins: WebAssembly components run in a sandbox.
//!
//! # Sandbox
//! A plugin gets WASI with nothing behind it: no environment, arguments,
//! directories or sockets; a frozen clock (always the epoch) and a fixed random
//! source, so it cannot observe time or entropy; stderr is captured (to report
//! a panic's message). Every call has a deadline (epoch interruption, a 10 ms
//! ticker), every instance a memory cap, every output a size cap.
//!
//! # Failures
//! Expected failures travel as data: `describe` refusing its parameters,
//! `validate` / `transform` returning row errors. A trap — deadline, memory,
//! panic — becomes a typed [`PluginError`] naming the plugin; the instance that
//! trapped is dropped and the next call gets a fresh one. Outputs are checked:
//! the declared schema must decode and be keyed properly, the ABI version must
//! be one the host knows, and a transform's output must decode (bounded
//! decoder) and match the declared schema exactly.
//!
//! # Reuse and caching
//! Components are compiled once per runtime, through wasmtime's on-disk cache
//! (keyed by content hash and engine version), so a second start does not
//! recompile. Each loaded plugin keeps a pool of instances, reused across
//! calls; calls from several threads each take their own instance.

mod bindings;
mod runtime;

pub use runtime::{
    ABI_VERSION, LoadedPlugin, PluginDeclaration, PluginError, PluginLimits, PluginRuntime,
    RowError,
};
