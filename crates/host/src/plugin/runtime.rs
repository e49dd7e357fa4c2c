//! [`PluginRuntime`] (engine, linker, deadline ticker, compile cache) and
//! [`LoadedPlugin`] (a described plugin and its calls).

use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use arrow_array::RecordBatch;
use arrow_schema::SchemaRef;
use lance_context_wire as wire;
use serde_json::value::RawValue;
use wasmtime::component::{Component, Linker};
use wasmtime::{Config, Engine, Store, Trap};

use super::abi::{
    self, CallContext, DESCRIBE_BYTES, ERROR_BYTES, MAX_MESSAGE, RawDeclaration,
    SchemaPluginCore as SchemaPlugin, SchemaPluginCorePre as SchemaPluginPre,
};
use super::cache::{CacheStats, CompileCache};
use super::compile::{ChildBounds, Compiler, ShapeLimits, check_shape, compile_in_child};
use super::error::{PluginError, plugin_text};
use super::loader::{Loader, NotRun};
use super::output::{assemble, check_derived, json_document, panic_message};
use super::sandbox::{self, HostState};
use super::slots::Slots;
use crate::spec::{KeyRule, SchemaSpec, SpecProblem, VectorSpec};

pub use lance_context_wire::ABI_VERSION;

const EPOCH_TICK: Duration = Duration::from_millis(10);

/// Limits applied to every plugin.
#[derive(Debug, Clone)]
pub struct PluginLimits {
    /// Wall-clock time one call may take (instantiation included).
    pub call_deadline: Duration,
    /// Bytes of all linear memories and tables of one instance together.
    pub memory_bytes: usize,
    /// Size of a transform's output (bytes of Arrow IPC).
    pub output_bytes: usize,
    /// Size of a reduce's output (bytes of JSON).
    pub reduce_output_bytes: usize,
    /// WebAssembly stack.
    pub max_wasm_stack: usize,
    /// Size of a component the runtime agrees to compile.
    pub component_bytes: usize,
    /// The shape a component may have (checked before compiling).
    pub shape: ShapeLimits,
    /// Where components are compiled (see [`Compiler`]).
    pub compiler: Compiler,
    /// Wall-clock time compiling one component may take. With
    /// [`Compiler::Subprocess`] the compiler is killed then; in process, only
    /// the wait ends.
    pub compile_deadline: Duration,
    /// Memory (data segment) a compiler child may use.
    pub compile_memory_bytes: usize,
    /// Loads (compile, describe) running at once, each on a loader thread of
    /// the runtime; more wait in the load queue.
    pub loaders: usize,
    /// Loads waiting for a loader at most; past it a load is refused at once
    /// with [`PluginError::LoadBusy`].
    pub load_queue: usize,
    /// How long a load waits in the queue for a loader before
    /// [`PluginError::LoadBusy`].
    pub load_wait: Duration,
    /// How long a failed load (compile or describe) is remembered and
    /// answered without running again.
    pub failed_ttl: Duration,
    /// Bytes the compile cache may hold on disk; past it the least recently
    /// used entries are removed.
    pub cache_bytes: u64,
    /// Plugin calls running at once in this runtime, over every plugin
    /// (each has its own instance, so this bounds the guest memory in use
    /// to this many times `memory_bytes`).
    pub max_concurrent_calls: usize,
    /// Calls running at once of one loaded plugin (a store's): a store whose
    /// calls run hot waits behind itself, not in front of other stores.
    pub calls_per_plugin: usize,
    /// How long a call waits for a free slot (its plugin's, then the
    /// runtime's) before [`PluginError::Busy`].
    pub slot_wait: Duration,
}

impl Default for PluginLimits {
    fn default() -> Self {
        Self {
            call_deadline: Duration::from_secs(5),
            memory_bytes: 512 << 20,
            output_bytes: 64 << 20,
            reduce_output_bytes: 16 << 20,
            max_wasm_stack: 1 << 20,
            component_bytes: 64 << 20,
            shape: ShapeLimits::default(),
            compiler: Compiler::default(),
            compile_deadline: Duration::from_secs(60),
            compile_memory_bytes: 2 << 30,
            loaders: 2,
            load_queue: 32,
            load_wait: Duration::from_secs(10),
            failed_ttl: Duration::from_secs(60),
            cache_bytes: 1 << 30,
            max_concurrent_calls: 8,
            calls_per_plugin: 2,
            slot_wait: Duration::from_secs(30),
        }
    }
}

/// What a plugin declared, checked and in host types: the plugin's identity
/// and its [`SchemaSpec`].
#[derive(Debug, Clone, PartialEq)]
pub struct PluginDeclaration {
    /// The name the plugin gives itself (printable).
    pub name: String,
    /// Its version (printable).
    pub version: String,
    /// The contract ABI it was built against.
    pub abi_version: u32,
    /// The spec's Arrow schema (key column tagged as the primary key).
    pub schema: SchemaRef,
    /// Key, columns, blobs, vectors, secondary key, capabilities.
    pub spec: SchemaSpec,
    /// Whether the plugin derives columns (`transform`).
    pub has_transform: bool,
    /// sha256 of the component bytes (hex).
    pub sha256: String,
}

impl PluginDeclaration {
    /// The key column.
    pub fn key_column(&self) -> &str {
        &self.spec.key
    }
}

/// The epoch ticker: one thread bumping the engine's epoch every
/// [`EPOCH_TICK`], for as long as anything that runs plugins is alive (the
/// runtime or any plugin it loaded).
#[derive(Debug)]
struct Ticker {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Ticker {
    fn start(engine: &Engine) -> std::io::Result<Self> {
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let engine = engine.clone();
            let stop = stop.clone();
            std::thread::Builder::new()
                .name("plugin-epoch".into())
                .spawn(move || {
                    while !stop.load(Ordering::Relaxed) {
                        std::thread::sleep(EPOCH_TICK);
                        engine.increment_epoch();
                    }
                })?
        };
        Ok(Self {
            stop,
            thread: Some(thread),
        })
    }
}

impl Drop for Ticker {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// What the runtime and every plugin it loaded share; the ticker stops when
/// the last of them is dropped.
struct Shared {
    engine: Engine,
    linker: Linker<HostState>,
    limits: PluginLimits,
    cache: Option<CompileCache>,
    /// Call slots shared by every plugin of the runtime.
    slots: Slots,
    /// Loads that failed (compile by sha256, describe by sha256 and
    /// parameters), with when: answered without running again for
    /// [`PluginLimits::failed_ttl`].
    failed: Mutex<HashMap<String, (PluginError, Instant)>>,
    /// The loader threads and their queue.
    loader: Loader,
    /// Components compiled (or read from the cache) by this runtime, by
    /// sha256: many stores pinning one plugin compile it once.
    compiled: Mutex<HashMap<String, Component>>,
    _ticker: Ticker,
}

/// Compiled components a runtime keeps in memory (a few plugins are the
/// norm; past this many, one is let go before another is kept).
const MAX_COMPILED: usize = 32;

impl Shared {
    /// The compiled component for `sha256`: from memory, else from the
    /// disk cache (then kept in memory).
    fn compiled_component(&self, sha256: &str) -> Option<Component> {
        if let Some(component) = self
            .compiled
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(sha256)
        {
            return Some(component.clone());
        }
        let component = self.cache.as_ref()?.load(&self.engine, sha256)?;
        self.keep_compiled(sha256, &component);
        Some(component)
    }

    fn keep_compiled(&self, sha256: &str, component: &Component) {
        let mut compiled = self.compiled.lock().unwrap_or_else(|p| p.into_inner());
        if compiled.len() >= MAX_COMPILED && !compiled.contains_key(sha256) {
            let victim = compiled.keys().next().cloned();
            if let Some(victim) = victim {
                compiled.remove(&victim);
            }
        }
        compiled.insert(sha256.to_string(), component.clone());
    }

    /// The remembered failure of `key`, while it is fresh.
    fn failed_before(&self, key: &str) -> Option<PluginError> {
        let mut failed = self.failed.lock().unwrap_or_else(|p| p.into_inner());
        let ttl = self.limits.failed_ttl;
        failed.retain(|_, (_, at)| at.elapsed() < ttl);
        failed.get(key).map(|(e, _)| e.clone())
    }

    /// Remember that `key` failed with `error` (not when the host was busy
    /// or could not run the compiler: those say nothing of the plugin).
    fn remember_failure(&self, key: String, error: &PluginError) {
        if error.is_busy() || error.kind() == crate::ErrorKind::Unavailable {
            return;
        }
        let mut failed = self.failed.lock().unwrap_or_else(|p| p.into_inner());
        // Bounded: a flood of distinct failing uploads forgets the oldest.
        if failed.len() >= MAX_FAILED
            && let Some(oldest) = failed
                .iter()
                .min_by_key(|(_, (_, at))| *at)
                .map(|(k, _)| k.clone())
        {
            failed.remove(&oldest);
        }
        failed.insert(key, (error.clone(), Instant::now()));
    }
}

/// Failed loads remembered at most.
const MAX_FAILED: usize = 1024;

/// The engine configuration of every runtime and compiler child (they must
/// agree for a child's artifact to load).
pub(crate) fn engine_config(max_wasm_stack: usize) -> Config {
    let mut config = Config::new();
    config.wasm_component_model(true);
    config.epoch_interruption(true);
    config.max_wasm_stack(max_wasm_stack);
    config
}

/// Compiles, links and loads plugins.
pub struct PluginRuntime {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for PluginRuntime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PluginRuntime")
            .field("limits", &self.shared.limits)
            .field("cache", &self.shared.cache.as_ref().map(CompileCache::dir))
            .finish_non_exhaustive()
    }
}

fn load_error(plugin: &str, message: impl Into<String>) -> PluginError {
    PluginError::Load {
        plugin: plugin.to_string(),
        message: message.into(),
    }
}

/// The interfaces a component may import: those the sandbox links (see
/// [`sandbox`]), and the contract's own types.
const ALLOWED_IMPORTS: &[&str] = &[
    "wasi:io/error",
    "wasi:io/poll",
    "wasi:io/streams",
    "wasi:cli/environment",
    "wasi:cli/exit",
    "wasi:cli/stdin",
    "wasi:cli/stdout",
    "wasi:cli/stderr",
    "wasi:cli/terminal-input",
    "wasi:cli/terminal-output",
    "wasi:cli/terminal-stdin",
    "wasi:cli/terminal-stdout",
    "wasi:cli/terminal-stderr",
    "wasi:clocks/wall-clock",
    "wasi:clocks/monotonic-clock",
    "wasi:random/random",
    "wasi:random/insecure",
    "wasi:random/insecure-seed",
    "lance-context:plugin/types",
];

impl PluginRuntime {
    /// A runtime with these limits; compiled components are cached under
    /// `cache_dir` when given (a private directory: see the `cache` docs and
    /// [`crate::plugin::default_cache_dir`]).
    pub fn new(limits: PluginLimits, cache_dir: Option<&Path>) -> Result<Self, PluginError> {
        let runtime_error = |message: String| load_error("(runtime)", message);
        let config = engine_config(limits.max_wasm_stack);
        let engine = Engine::new(&config).map_err(|e| runtime_error(format!("{e:#}")))?;
        let linker = sandbox::linker(&engine).map_err(|e| runtime_error(format!("{e:#}")))?;
        let cache = match cache_dir {
            Some(dir) => Some(
                CompileCache::open(dir, &engine, limits.cache_bytes)
                    .map_err(|e| runtime_error(e.to_string()))?,
            ),
            None => None,
        };
        let loader = Loader::start(limits.loaders.max(1), limits.load_queue)
            .map_err(|e| runtime_error(format!("starting the loaders: {e}")))?;
        let ticker = Ticker::start(&engine)
            .map_err(|e| runtime_error(format!("starting the epoch ticker: {e}")))?;
        Ok(Self {
            shared: Arc::new(Shared {
                engine,
                linker,
                slots: Slots::new(limits.max_concurrent_calls.max(1)),
                limits,
                cache,
                failed: Mutex::new(HashMap::new()),
                loader,
                compiled: Mutex::new(HashMap::new()),
                _ticker: ticker,
            }),
        })
    }

    /// What the compile cache did since this runtime started (`None`
    /// without a cache).
    pub fn cache_stats(&self) -> Option<CacheStats> {
        self.shared.cache.as_ref().map(CompileCache::stats)
    }

    /// The limits every call runs under.
    pub fn limits(&self) -> &PluginLimits {
        &self.shared.limits
    }

    /// Compile `bytes` (through the cache, within the size cap, the shape
    /// limits and the compile deadline), check its imports and exports
    /// against the contract, instantiate it and call `describe` with
    /// `params`; the declaration is checked before it is returned. Runs on
    /// the calling thread: async callers use [`Self::load_async`].
    pub fn load(
        &self,
        label: &str,
        bytes: &[u8],
        params: Vec<(String, String)>,
    ) -> Result<LoadedPlugin, PluginError> {
        load_checked(&self.shared, label, bytes, params).map_err(PluginError::sanitized)
    }

    /// [`Self::load`] on one of the runtime's loader threads, never on the
    /// caller's: an async worker is not held while a component compiles or
    /// describes. A load that finds the queue full, or waits past
    /// [`PluginLimits::load_wait`] for a loader, is refused with
    /// [`PluginError::LoadBusy`] (retry later).
    pub async fn load_async(
        &self,
        label: &str,
        bytes: Vec<u8>,
        params: Vec<(String, String)>,
    ) -> Result<LoadedPlugin, PluginError> {
        let shared = self.shared.clone();
        let plugin = plugin_text(label, abi::MAX_NAME);
        let label = label.to_string();
        let job =
            move || load_checked(&shared, &label, &bytes, params).map_err(PluginError::sanitized);
        let wait = self.shared.limits.load_wait;
        match self.shared.loader.run(job, wait).await {
            Ok(loaded) => loaded,
            Err(NotRun::Busy { queued }) => Err(PluginError::LoadBusy {
                plugin,
                waited: wait,
                queued,
            }),
            Err(NotRun::Panicked) => Err(load_error(&plugin, "the load failed unexpectedly")),
        }
    }
}

fn load_checked(
    shared: &Arc<Shared>,
    label: &str,
    bytes: &[u8],
    params: Vec<(String, String)>,
) -> Result<LoadedPlugin, PluginError> {
    let label = plugin_text(label, abi::MAX_NAME);
    if bytes.len() > shared.limits.component_bytes {
        return Err(PluginError::OutputTooLarge {
            plugin: label,
            what: "component",
            size: bytes.len(),
            limit: shared.limits.component_bytes,
        });
    }
    // The imports first (a cheap parse), so a component the sandbox
    // cannot host is never compiled.
    let refused = refused_imports(bytes).map_err(|m| load_error(&label, m))?;
    if !refused.is_empty() {
        return Err(load_error(
            &label,
            format!(
                "it imports what the sandbox does not provide: {}",
                refused.join(", ")
            ),
        ));
    }
    let sha256 = crate::sha256_hex(bytes);
    let (component, fresh) = component(shared, &label, &sha256, bytes)?;
    let described = format!(
        "describe:{sha256}:{}",
        crate::sha256_hex(format!("{params:?}").as_bytes())
    );
    if let Some(error) = shared.failed_before(&described) {
        return Err(error);
    }
    let pre = shared
        .linker
        .instantiate_pre(&component)
        .map_err(|e| load_error(&label, format!("{e:#}")))?;
    let pre = SchemaPluginPre::new(pre)
        .map_err(|e| load_error(&label, format!("not a schema plugin: {e:#}")))?;
    let mut inner = Inner {
        shared: shared.clone(),
        slots: Slots::new(shared.limits.calls_per_plugin.max(1)),
        label,
        pre,
        params,
        declaration: None,
    };
    let declaration = inner
        .describe(sha256.clone())
        .inspect_err(|e| shared.remember_failure(described, e))?;
    // Only a component that described is worth a cache entry.
    if fresh && let Some(cache) = &shared.cache {
        cache.store(&sha256, &component);
    }
    inner.label = declaration.name.clone();
    inner.declaration = Some(declaration);
    Ok(LoadedPlugin {
        inner: Arc::new(inner),
    })
}

/// The compiled component of `bytes` (hashing to `sha256`), and whether it
/// was compiled just now: from memory, the cache, or a compile within the
/// shape limits and the deadline. A failed compile is remembered for
/// [`PluginLimits::failed_ttl`].
fn component(
    shared: &Shared,
    label: &str,
    sha256: &str,
    bytes: &[u8],
) -> Result<(Component, bool), PluginError> {
    let key = format!("compile:{sha256}");
    if let Some(error) = shared.failed_before(&key) {
        return Err(error);
    }
    if let Some(component) = shared.compiled_component(sha256) {
        return Ok((component, false));
    }
    let compiled = check_shape(bytes, &shared.limits.shape)
        .map_err(|limit| PluginError::Compile {
            plugin: label.to_string(),
            limit,
        })
        .and_then(|()| compile(shared, label, bytes))
        .inspect_err(|e| shared.remember_failure(key, e))?;
    shared.keep_compiled(sha256, &compiled);
    Ok((compiled, true))
}

/// Compile where the limits say: a child process (killed at the deadline),
/// or a thread of this process (waited for until the deadline).
fn compile(shared: &Shared, label: &str, bytes: &[u8]) -> Result<Component, PluginError> {
    let limits = &shared.limits;
    match &limits.compiler {
        Compiler::Subprocess(program) => compile_in_child(
            program,
            &shared.engine,
            ChildBounds {
                deadline: limits.compile_deadline,
                memory_bytes: limits.compile_memory_bytes,
                max_wasm_stack: limits.max_wasm_stack,
            },
            label,
            bytes,
        ),
        Compiler::InProcess => compile_on_thread(shared, label, bytes),
    }
}

fn compile_on_thread(shared: &Shared, label: &str, bytes: &[u8]) -> Result<Component, PluginError> {
    let (tx, rx) = std::sync::mpsc::channel();
    let engine = shared.engine.clone();
    let bytes = bytes.to_vec();
    std::thread::Builder::new()
        .name("plugin-compile".into())
        .spawn(move || {
            let compiled = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                Component::new(&engine, &bytes)
            }));
            let _ = tx.send(compiled);
        })
        .map_err(|e| load_error(label, format!("starting the compiler: {e}")))?;
    let failed = |limit| PluginError::Compile {
        plugin: label.to_string(),
        limit,
    };
    match rx.recv_timeout(shared.limits.compile_deadline) {
        Ok(Ok(Ok(component))) => Ok(component),
        Ok(Ok(Err(e))) => Err(load_error(label, format!("{e:#}"))),
        Ok(Err(panic)) => Err(failed(super::error::CompileLimit::CompilerPanic(
            panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_default(),
        ))),
        Err(_) => Err(failed(super::error::CompileLimit::Deadline(
            shared.limits.compile_deadline,
        ))),
    }
}

/// The imports of a component (top level) that the sandbox does not
/// provide, read without compiling it.
fn refused_imports(bytes: &[u8]) -> Result<Vec<String>, String> {
    let mut refused = Vec::new();
    let mut depth = 0usize;
    for payload in wasmparser::Parser::new(0).parse_all(bytes) {
        match payload.map_err(|e| format!("not a component: {e}"))? {
            wasmparser::Payload::Version {
                encoding: wasmparser::Encoding::Module,
                ..
            } if depth == 0 => {
                return Err("it is a core module, not a component".into());
            }
            wasmparser::Payload::ModuleSection { .. }
            | wasmparser::Payload::ComponentSection { .. } => depth += 1,
            wasmparser::Payload::End(_) => depth = depth.saturating_sub(1),
            wasmparser::Payload::ComponentImportSection(imports) if depth == 0 => {
                for import in imports {
                    let import = import.map_err(|e| format!("not a component: {e}"))?;
                    // Type imports (the contract's `use types.{…}`) need no
                    // implementation; everything else must be an interface
                    // the sandbox links.
                    if matches!(import.ty, wasmparser::ComponentTypeRef::Type(_)) {
                        continue;
                    }
                    let name = import.name.name;
                    let interface = name.split('@').next().unwrap_or(name);
                    let linked = matches!(import.ty, wasmparser::ComponentTypeRef::Instance(_))
                        && ALLOWED_IMPORTS.contains(&interface);
                    if !linked {
                        refused.push(plugin_text(name, abi::MAX_NAME));
                    }
                }
            }
            _ => {}
        }
    }
    Ok(refused)
}

/// A loaded, described plugin. Cheap to clone and safe to share between
/// threads.
///
/// Every call runs in a **fresh instance** (new memories, no state carried
/// over from an earlier call, as the contract says) under the call deadline
/// and the memory cap; at most [`PluginLimits::max_concurrent_calls`] calls
/// of the runtime run at once. The `*_async` methods run the call on a
/// blocking thread, so an async caller's worker is never held by a plugin.
/// Every error leaving here has its plugin-supplied text escaped.
#[derive(Clone)]
pub struct LoadedPlugin {
    inner: Arc<Inner>,
}

struct Inner {
    shared: Arc<Shared>,
    /// This plugin's own call slots (a store's), taken before the runtime's.
    slots: Slots,
    label: String,
    pre: SchemaPluginPre<HostState>,
    params: Vec<(String, String)>,
    declaration: Option<PluginDeclaration>,
}

impl std::fmt::Debug for LoadedPlugin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LoadedPlugin")
            .field("plugin", &self.inner.label)
            .finish_non_exhaustive()
    }
}

impl LoadedPlugin {
    /// The checked declaration.
    pub fn declaration(&self) -> &PluginDeclaration {
        self.inner.declaration()
    }

    /// The parameters it was loaded with.
    pub fn params(&self) -> &[(String, String)] {
        &self.inner.params
    }

    /// Validate a batch: `Ok`, or [`PluginError::Rejected`] with its row errors.
    pub fn validate(&self, batch: &RecordBatch) -> Result<(), PluginError> {
        self.inner.validate(batch).map_err(PluginError::sanitized)
    }

    /// Transform a batch. By the contract a transform applies `validate`'s
    /// checks first (one boundary crossing for both), then returns the columns
    /// it fills or derives; the host decodes them with the bounded decoder,
    /// checks each against the declaration and assembles the batch: a
    /// derived column where returned, else the input's, else nulls. Without a
    /// declared transform, the batch is returned as is.
    pub fn transform(
        &self,
        batch: &RecordBatch,
        now_micros: i64,
    ) -> Result<RecordBatch, PluginError> {
        self.inner
            .transform(batch, now_micros)
            .map_err(PluginError::sanitized)
    }

    /// Reduce the rows of named query `query` (declared with `reduce`) to a
    /// JSON document with the plugin's `reduce`. The document is checked (one
    /// JSON value, within [`PluginLimits::reduce_output_bytes`]) but not
    /// built: it is returned as raw JSON text.
    pub fn reduce(
        &self,
        query: &str,
        rows: &RecordBatch,
        now_micros: i64,
    ) -> Result<Box<RawValue>, PluginError> {
        self.inner
            .reduce(query, rows, now_micros)
            .map_err(PluginError::sanitized)
    }

    /// What the add pipeline runs: `transform` when the plugin declares one
    /// (it validates in the same call), else `validate`; the batch to store.
    pub fn prepare(
        &self,
        batch: &RecordBatch,
        now_micros: i64,
    ) -> Result<RecordBatch, PluginError> {
        self.inner
            .prepare(batch, now_micros)
            .map_err(PluginError::sanitized)
    }

    /// [`Self::prepare`] on a blocking thread.
    pub async fn prepare_async(
        &self,
        batch: RecordBatch,
        now_micros: i64,
    ) -> Result<RecordBatch, PluginError> {
        let this = self.clone();
        self.blocking(move || this.prepare(&batch, now_micros))
            .await
    }

    /// [`Self::reduce`] on a blocking thread.
    pub async fn reduce_async(
        &self,
        query: String,
        rows: RecordBatch,
        now_micros: i64,
    ) -> Result<Box<RawValue>, PluginError> {
        let this = self.clone();
        self.blocking(move || this.reduce(&query, &rows, now_micros))
            .await
    }

    async fn blocking<T: Send + 'static>(
        &self,
        f: impl FnOnce() -> Result<T, PluginError> + Send + 'static,
    ) -> Result<T, PluginError> {
        match tokio::runtime::Handle::try_current() {
            Ok(handle) => handle
                .spawn_blocking(f)
                .await
                .map_err(|e| PluginError::Trap {
                    plugin: self.inner.label.clone(),
                    message: format!("the call's thread failed: {e}"),
                })?,
            Err(_) => f(),
        }
    }
}

impl Inner {
    fn declaration(&self) -> &PluginDeclaration {
        self.declaration
            .as_ref()
            .expect("a LoadedPlugin is only handed out after describe")
    }

    fn deadline_ticks(&self) -> u64 {
        (self.shared.limits.call_deadline.as_millis() / EPOCH_TICK.as_millis()).max(1) as u64
    }

    /// Run `f` on a fresh instance in a fresh store, under the deadline, with
    /// `fuel` bytes of hostcall fuel (what the result's lift may copy out of
    /// the guest).
    fn call<R>(
        &self,
        fuel: usize,
        f: impl FnOnce(
            &SchemaPlugin,
            &wasmtime::component::Instance,
            &mut Store<HostState>,
        ) -> wasmtime::Result<R>,
    ) -> Result<R, PluginError> {
        let wait = self.shared.limits.slot_wait;
        let busy = || PluginError::Busy {
            plugin: self.label.clone(),
            waited: wait,
        };
        // This plugin's slot first: calls of a store that runs hot queue
        // here, behind each other, and take at most `calls_per_plugin` of
        // the runtime's slots.
        let deadline = Instant::now() + wait;
        let _own = self.slots.acquire_until(deadline).ok_or_else(busy)?;
        let _slot = self.shared.slots.acquire_until(deadline).ok_or_else(busy)?;
        let mut store = Store::new(
            &self.shared.engine,
            HostState::new(self.shared.limits.memory_bytes),
        );
        store.limiter(|s| s);
        store.set_epoch_deadline(self.deadline_ticks());
        store.set_hostcall_fuel(fuel);
        let instance = self
            .pre
            .instance_pre()
            .instantiate(&mut store)
            .map_err(|e| self.trap(&store, e, false))?;
        let plugin =
            SchemaPlugin::new(&mut store, &instance).map_err(|e| self.trap(&store, e, false))?;
        f(&plugin, &instance, &mut store).map_err(|e| self.trap(&store, e, true))
    }

    /// Turn a failed instantiation or call into the typed error saying why.
    /// An error that is not a trap, from a call, is the result's lift
    /// failing: an output over its cap (hostcall fuel) or not well-formed.
    fn trap(&self, store: &Store<HostState>, err: wasmtime::Error, called: bool) -> PluginError {
        let plugin = self.label.clone();
        let state = store.data();
        if state.memory_denied {
            return PluginError::MemoryLimit {
                plugin,
                limit: self.shared.limits.memory_bytes,
            };
        }
        if let Some(violation) = state.violation {
            return PluginError::Forbidden { plugin, violation };
        }
        match err.downcast_ref::<Trap>() {
            Some(Trap::Interrupt) => PluginError::Timeout {
                plugin,
                deadline: self.shared.limits.call_deadline,
            },
            Some(Trap::UnreachableCodeReached) => PluginError::Panic {
                plugin,
                message: plugin_text(&panic_message(&state.console()), MAX_MESSAGE),
            },
            Some(Trap::StackOverflow) => PluginError::Trap {
                plugin,
                message: "stack overflow (runaway recursion)".into(),
            },
            Some(_) => PluginError::Trap {
                plugin,
                message: plugin_text(&format!("{err:#}"), MAX_MESSAGE),
            },
            None if called => PluginError::MalformedOutput {
                plugin,
                message: plugin_text(
                    &format!("its result could not be read within the host's bounds: {err:#}"),
                    MAX_MESSAGE,
                ),
            },
            None => PluginError::Trap {
                plugin,
                message: plugin_text(&format!("instantiating: {err:#}"), MAX_MESSAGE),
            },
        }
    }

    fn malformed_input(&self, e: wire::WireError) -> PluginError {
        PluginError::MalformedInput {
            plugin: self.label.clone(),
            message: e.to_string(),
        }
    }

    fn describe(&self, sha256: String) -> Result<PluginDeclaration, PluginError> {
        // One instance answers both: `describe`, then (ABI 2) its text
        // columns. Both lifts share the call's hostcall fuel.
        let result = self.call(DESCRIBE_BYTES, |p, instance, s| {
            let decl = p.call_describe(&mut *s, &self.params)?;
            let text = match &decl {
                Ok(d) if d.abi_version == 2 => {
                    let Ok(f) = instance.get_typed_func::<
                        (Vec<(String, String)>,),
                        (Result<Vec<abi::TextColumn>, abi::DescribeError>,),
                    >(&mut *s, abi::DESCRIBE_TEXT) else {
                        return Ok((decl, None));
                    };
                    Some(f.call(&mut *s, (self.params.clone(),))?.0)
                }
                _ => Some(Ok(Vec::new())),
            };
            Ok((decl, text))
        })?;
        let invalid_params = |message: String| PluginError::InvalidParams {
            plugin: self.label.clone(),
            message: plugin_text(&message, MAX_MESSAGE),
        };
        let mut raw = match result.0 {
            Ok(decl) => abi::declaration(&self.label, decl)?,
            Err(abi::DescribeError::InvalidParams(message)) => return Err(invalid_params(message)),
        };
        raw.text_columns = match result.1 {
            Some(Ok(list)) => abi::text_columns(&self.label, list)?,
            Some(Err(abi::DescribeError::InvalidParams(message))) => {
                return Err(invalid_params(message));
            }
            None => {
                return Err(PluginError::InvalidDeclaration {
                    plugin: self.label.clone(),
                    problems: vec![SpecProblem {
                        field: "abi-version".into(),
                        message: format!(
                            "ABI version {} needs the `{}` export (lance-context:plugin@0.2.0), which this component lacks or types differently",
                            raw.abi_version,
                            abi::DESCRIBE_TEXT
                        ),
                    }],
                });
            }
        };
        self.check_declaration(raw, sha256)
    }

    /// Turn what `describe` returned into a checked declaration.
    fn check_declaration(
        &self,
        raw: RawDeclaration,
        sha256: String,
    ) -> Result<PluginDeclaration, PluginError> {
        let plugin = if raw.name.is_empty() {
            self.label.clone()
        } else {
            raw.name.clone()
        };
        if !lance_context_wire::SUPPORTED_ABI_VERSIONS.contains(&raw.abi_version) {
            return Err(PluginError::UnsupportedAbi {
                plugin,
                found: raw.abi_version,
            });
        }
        let schema = wire::decode_schema(&raw.arrow_schema).map_err(|e| {
            PluginError::InvalidDeclaration {
                plugin: plugin.clone(),
                problems: vec![SpecProblem {
                    field: "arrow-schema".into(),
                    message: e.to_string(),
                }],
            }
        })?;
        let mut spec = SchemaSpec::from_arrow(&plugin, &raw.key_column, &schema);
        spec.blob_columns = raw.blob_columns;
        spec.vectors = raw
            .vectors
            .into_iter()
            .map(|(column, dimension, metric)| VectorSpec {
                column,
                dimension: i64::from(dimension),
                metric: match metric {
                    abi::Metric::L2 => crate::spec::Metric::L2,
                    abi::Metric::Cosine => crate::spec::Metric::Cosine,
                    abi::Metric::Dot => crate::spec::Metric::Dot,
                },
            })
            .collect();
        spec.text_columns = raw.text_columns;
        spec.secondary_key = raw.secondary_key;
        spec.queries = raw.queries;
        spec.capabilities = raw.capabilities;
        // The built-in datagen schema keys by `event_id`; the registry holds
        // user schemas to `id`.
        let schema = spec
            .check(KeyRule::Builtin)
            .map_err(|e| PluginError::InvalidDeclaration {
                plugin: plugin.clone(),
                problems: e.problems,
            })?;
        // A named query's filter runs on the host: plain predicates only.
        let problems: Vec<SpecProblem> = spec
            .queries
            .iter()
            .enumerate()
            .filter_map(|(i, q)| {
                let probe: Vec<(String, String)> =
                    q.params.iter().map(|p| (p.clone(), "x".into())).collect();
                let filter = q.bind(&probe).map_err(|e| e.to_string()).and_then(|f| {
                    lance_context_store::check_plain_predicate(&f).map_err(|e| e.to_string())
                });
                filter.err().map(|message| SpecProblem {
                    field: format!("queries[{i}].filter"),
                    message,
                })
            })
            .collect();
        if !problems.is_empty() {
            return Err(PluginError::InvalidDeclaration {
                plugin: plugin.clone(),
                problems,
            });
        }
        Ok(PluginDeclaration {
            name: plugin,
            version: raw.version,
            abi_version: raw.abi_version,
            schema,
            spec,
            has_transform: raw.has_transform,
            sha256,
        })
    }

    fn encode_input(&self, batch: &RecordBatch) -> Result<Vec<u8>, PluginError> {
        wire::encode(std::slice::from_ref(batch)).map_err(|e| self.malformed_input(e))
    }

    fn context(&self, now_micros: i64) -> CallContext {
        CallContext {
            now_micros,
            params: self.params.clone(),
        }
    }

    /// Validate a batch: `Ok`, or [`PluginError::Rejected`] with its row errors.
    fn validate(&self, batch: &RecordBatch) -> Result<(), PluginError> {
        let bytes = self.encode_input(batch)?;
        let context = self.context(crate::now_micros());
        self.call(ERROR_BYTES, |p, _, s| p.call_validate(s, &bytes, &context))?
            .map_err(|e| abi::batch_error(&self.label, e, batch.num_rows()))
    }

    /// Transform a batch. By the contract a transform applies `validate`'s
    /// checks first (one boundary crossing for both), then returns the columns
    /// it fills or derives; the host decodes them with the bounded decoder,
    /// checks each against the declaration and assembles the batch: a
    /// derived column where returned, else the input's, else nulls. Without a
    /// declared transform, the batch is returned as is.
    fn transform(&self, batch: &RecordBatch, now_micros: i64) -> Result<RecordBatch, PluginError> {
        let declared = self.declaration();
        if !declared.has_transform {
            return Ok(batch.clone());
        }
        let bytes = self.encode_input(batch)?;
        let context = self.context(now_micros);
        let limit = self.shared.limits.output_bytes;
        let out = self
            .call(limit.max(ERROR_BYTES), |p, _, s| {
                p.call_transform(s, &bytes, &context)
            })?
            .map_err(|e| abi::batch_error(&self.label, e, batch.num_rows()))?;
        drop(bytes);
        if out.len() > limit {
            return Err(PluginError::OutputTooLarge {
                plugin: self.label.clone(),
                what: "transform output",
                size: out.len(),
                limit,
            });
        }
        let malformed = |message: String| PluginError::MalformedOutput {
            plugin: self.label.clone(),
            message,
        };
        let mismatch = |message: &dyn std::fmt::Display| PluginError::SchemaMismatch {
            plugin: self.label.clone(),
            message: message.to_string(),
        };
        let limits = wire::Limits {
            max_bytes: limit,
            max_rows: batch.num_rows(),
            ..wire::Limits::default()
        };
        let decoded = wire::decode_with(out, &limits).map_err(|e| malformed(e.to_string()))?;
        check_derived(&declared.schema, &decoded.schema).map_err(|p| mismatch(&p))?;
        let rows: usize = decoded.batches.iter().map(RecordBatch::num_rows).sum();
        if rows != batch.num_rows() {
            return Err(mismatch(&format!(
                "{} rows in, {rows} rows out",
                batch.num_rows()
            )));
        }
        let derived = match decoded.batches.len() {
            1 => decoded.batches.into_iter().next().expect("one batch"),
            _ => arrow_select::concat::concat_batches(&decoded.schema, &decoded.batches)
                .map_err(|e| malformed(e.to_string()))?,
        };
        // Declared columns neither returned nor given are filled with nulls:
        // bounded like an output (a wide fixed-size list costs its width per row).
        let fill: u128 = declared
            .schema
            .fields()
            .iter()
            .filter(|f| {
                derived.column_by_name(f.name()).is_none()
                    && batch.column_by_name(f.name()).is_none()
            })
            .map(|f| crate::spec::fixed_width_bytes(f.data_type()))
            .sum::<u128>()
            .saturating_mul(batch.num_rows() as u128);
        if fill > limit as u128 {
            return Err(PluginError::OutputTooLarge {
                plugin: self.label.clone(),
                what: "null columns to fill",
                size: usize::try_from(fill).unwrap_or(usize::MAX),
                limit,
            });
        }
        assemble(&declared.schema, batch, &derived).map_err(|p| malformed(p.to_string()))
    }

    /// Reduce the rows of named query `query` (declared with `reduce`) to a
    /// JSON document with the plugin's `reduce`. The document is checked (one
    /// JSON value, within [`PluginLimits::reduce_output_bytes`]) but not
    /// built: it is returned as raw JSON text.
    fn reduce(
        &self,
        query: &str,
        rows: &RecordBatch,
        now_micros: i64,
    ) -> Result<Box<RawValue>, PluginError> {
        let bytes = self.encode_input(rows)?;
        let context = self.context(now_micros);
        let limit = self.shared.limits.reduce_output_bytes;
        let text = self
            .call(limit.max(ERROR_BYTES), |p, _, s| {
                p.call_reduce(s, query, &bytes, &context)
            })?
            .map_err(|e| abi::batch_error(&self.label, e, rows.num_rows()))?;
        if text.len() > limit {
            return Err(PluginError::OutputTooLarge {
                plugin: self.label.clone(),
                what: "reduce output",
                size: text.len(),
                limit,
            });
        }
        json_document(text).map_err(|problem| PluginError::MalformedOutput {
            plugin: self.label.clone(),
            message: format!("reduce returned {problem}"),
        })
    }

    /// What the add pipeline runs: `transform` when the plugin declares one
    /// (it validates in the same call), else `validate`; the batch to store.
    fn prepare(&self, batch: &RecordBatch, now_micros: i64) -> Result<RecordBatch, PluginError> {
        if self.declaration().has_transform {
            self.transform(batch, now_micros)
        } else {
            self.validate(batch)?;
            Ok(batch.clone())
        }
    }
}
