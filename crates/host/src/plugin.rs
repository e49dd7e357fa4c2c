//! Schema plugins: WebAssembly components run in a sandbox.
//!
//! # Threat model
//! A plugin is untrusted code from a third party. Whatever it does, the host
//! keeps serving, the data stays safe, and the code that runs is the code the
//! store pinned (by sha256). A plugin **can**: compute on the batches it is
//! given, allocate up to its memory cap, write to stdout/stderr (captured,
//! bounded, shown only escaped), read the host's entropy, and return data —
//! which the host treats as untrusted input. A plugin **cannot**: reach a
//! file, a socket, the environment or the real clock; block or sleep; run
//! past its deadline; use more than its memory cap over all its memories and
//! tables; keep state from one call to the next; make the host allocate more
//! than its output caps; or crash, hang or abort the host.
//!
//! # How
//! - **Sandbox** (`sandbox`): only the WASI interfaces Rust's standard library
//!   imports are linked, each implemented without blocking or reaching out
//!   (the table is in that module's docs). A component importing anything
//!   else does not load. Nothing enters an async runtime, so calls behave the
//!   same inside tokio (the CLI, the server) and outside.
//! - **Limits** ([`PluginLimits`]): a deadline per call (epoch interruption,
//!   a 10 ms ticker that lives as long as any plugin does), one memory cap
//!   over all memories and tables of an instance, low caps on core instances,
//!   memories and tables, a bounded wasm stack, a cap on concurrent calls,
//!   and on the size and compile time of a component.
//! - **Fresh state**: every call gets a new instance; nothing a call leaves in
//!   memory is seen by the next, and no memory is kept between calls.
//! - **Untrusted output** (`abi`, `output`): exports are called through typed
//!   functions whose results stay in guest memory until read, so every list
//!   and string is measured before it is copied; row errors are capped (the
//!   total is still reported); plugin text is cut and escaped
//!   ([`PluginError`]). Arrow IPC from a plugin goes through the bounded
//!   decoder of `lance-context-wire` (compression, dictionary deltas,
//!   malformed types and buffers outside their body refused before decoding);
//!   a reduce result is checked to be JSON without being built.
//! - **Pinned code** (`cache`): compiled components are cached in a private
//!   per-user directory, each entry authenticated with a MAC (keyed BLAKE3) under a key
//!   only that user can read; a planted or swapped entry is refused and
//!   recompiled.
//!
//! # Failures
//! Expected failures travel as data: `describe` refusing its parameters,
//! `validate` / `transform` returning row errors. Everything else — a trap,
//! the deadline, the memory cap, a forbidden call, an output too large or
//! malformed or not matching the declaration — is a typed [`PluginError`]
//! naming the plugin ([`PluginError::is_fault`]).

mod abi;
mod cache;
mod call;
mod compile;
mod error;
mod loader;
mod output;
mod runtime;
mod sandbox;
mod slots;

pub use cache::{CacheStats, default_cache_dir};
pub use call::LoadedPlugin;
pub use compile::{COMPILER_ARG, Compiler, ShapeLimits, compiler_main, use_compiler_program};
pub use error::{CompileLimit, PluginError, RowError, Violation};
pub use runtime::{ABI_VERSION, PinnedLoadError, PluginDeclaration, PluginLimits, PluginRuntime};
