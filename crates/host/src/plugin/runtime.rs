//! [`PluginRuntime`] (engine, linker, deadline ticker, compile cache) and
//! loading a plugin: checks, compiling, describing. A loaded plugin's calls
//! are in `call.rs`.

use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use arrow_schema::SchemaRef;
use wasmtime::component::{Component, Linker};
use wasmtime::{Config, Engine};

use super::abi::{self, SchemaPluginCorePre as SchemaPluginPre};
use super::cache::{CacheStats, CompileCache};
use super::call::{Inner, LoadedPlugin};
use super::compile::{ChildBounds, Compiler, ShapeLimits, check_shape, compile_in_child};
use super::error::{PluginError, plugin_text};
use super::loader::{Loader, NotRun};
use super::sandbox::{self, HostState};
use super::slots::Slots;
use crate::spec::SchemaSpec;

pub use lance_context_wire::ABI_VERSION;

pub(super) const EPOCH_TICK: Duration = Duration::from_millis(10);

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
pub(super) struct Shared {
    pub(super) engine: Engine,
    pub(super) linker: Linker<HostState>,
    pub(super) limits: PluginLimits,
    pub(super) cache: Option<CompileCache>,
    /// Call slots shared by every plugin of the runtime.
    pub(super) slots: Slots,
    /// Loads that failed (compile by sha256, describe by sha256 and
    /// parameters), with when: answered without running again for
    /// [`PluginLimits::failed_ttl`].
    pub(super) failed: Mutex<HashMap<String, (PluginError, Instant)>>,
    /// The loader threads and their queue.
    pub(super) loader: Loader,
    /// Components compiled (or read from the cache) by this runtime, by
    /// sha256: many stores pinning one plugin compile it once.
    pub(super) compiled: Mutex<HashMap<String, Component>>,
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
        load_checked(&self.shared, label, bytes, params, None).map_err(PinnedLoadError::unpinned)
    }

    /// [`Self::load`] of the component a store pins: `bytes` must hash to
    /// `sha256` (else [`PinnedLoadError::Mismatch`], and nothing of them is
    /// run). The pinned component is looked up (in memory, in the compile
    /// cache) while the bytes are hashed, on two threads: a cached start
    /// pays the longer of the two rather than both.
    pub fn load_pinned(
        &self,
        label: &str,
        bytes: &[u8],
        sha256: &str,
        params: Vec<(String, String)>,
    ) -> Result<LoadedPlugin, PinnedLoadError> {
        load_checked(&self.shared, label, bytes, params, Some(sha256))
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
        self.load_on_loader(label, bytes, None, params)
            .await
            .map_err(PinnedLoadError::unpinned)
    }

    /// [`Self::load_pinned`] on one of the runtime's loader threads (see
    /// [`Self::load_async`]).
    pub async fn load_pinned_async(
        &self,
        label: &str,
        bytes: Vec<u8>,
        sha256: String,
        params: Vec<(String, String)>,
    ) -> Result<LoadedPlugin, PinnedLoadError> {
        self.load_on_loader(label, bytes, Some(sha256), params)
            .await
    }

    async fn load_on_loader(
        &self,
        label: &str,
        bytes: Vec<u8>,
        pin: Option<String>,
        params: Vec<(String, String)>,
    ) -> Result<LoadedPlugin, PinnedLoadError> {
        let shared = self.shared.clone();
        let plugin = plugin_text(label, abi::MAX_NAME);
        let label = label.to_string();
        let job = move || load_checked(&shared, &label, &bytes, params, pin.as_deref());
        let wait = self.shared.limits.load_wait;
        match self.shared.loader.run(job, wait).await {
            Ok(loaded) => loaded,
            Err(NotRun::Busy { queued }) => Err(PinnedLoadError::Plugin(PluginError::LoadBusy {
                plugin,
                waited: wait,
                queued,
            })),
            Err(NotRun::Panicked) => Err(PinnedLoadError::Plugin(load_error(
                &plugin,
                "the load failed unexpectedly",
            ))),
        }
    }
}

/// Why [`PluginRuntime::load_pinned`] failed.
#[derive(Debug, Clone, thiserror::Error)]
pub enum PinnedLoadError {
    /// The bytes are not the pinned component: they hash to `found`.
    #[error("the component's bytes hash to {found}, not to the pinned sha256")]
    Mismatch {
        /// The sha256 of the bytes given (hex).
        found: String,
    },
    /// The component failed to load.
    #[error(transparent)]
    Plugin(#[from] PluginError),
}

impl PinnedLoadError {
    /// A load without a pin cannot mismatch.
    fn unpinned(self) -> PluginError {
        match self {
            Self::Plugin(e) => e,
            Self::Mismatch { found } => load_error(
                "plugin",
                format!("unexpected pin mismatch (sha256 {found})"),
            ),
        }
    }
}

/// [`load_unsanitized`], every error's text made safe to print.
fn load_checked(
    shared: &Arc<Shared>,
    label: &str,
    bytes: &[u8],
    params: Vec<(String, String)>,
    pin: Option<&str>,
) -> Result<LoadedPlugin, PinnedLoadError> {
    load_unsanitized(shared, label, bytes, params, pin).map_err(|e| match e {
        PinnedLoadError::Plugin(e) => PinnedLoadError::Plugin(e.sanitized()),
        mismatch => mismatch,
    })
}

fn load_unsanitized(
    shared: &Arc<Shared>,
    label: &str,
    bytes: &[u8],
    params: Vec<(String, String)>,
    pin: Option<&str>,
) -> Result<LoadedPlugin, PinnedLoadError> {
    let label = plugin_text(label, abi::MAX_NAME);
    if bytes.len() > shared.limits.component_bytes {
        // Bytes that are not the pinned ones say so first, whatever size.
        if let Some(pin) = pin {
            let found = crate::sha256_hex(bytes);
            if found != pin {
                return Err(PinnedLoadError::Mismatch { found });
            }
        }
        return Err(PluginError::OutputTooLarge {
            plugin: label,
            what: "component",
            size: bytes.len(),
            limit: shared.limits.component_bytes,
        }
        .into());
    }
    // The hash, and the imports (a cheap parse, so that a component the
    // sandbox cannot host is never compiled). With a pin, the pinned
    // component is looked up meanwhile on this thread; it is used only
    // once the bytes are known to be it.
    let check = || (crate::sha256_hex(bytes), refused_imports(bytes));
    let (checked, found) = match pin {
        None => (Ok(check()), None),
        Some(pin) => std::thread::scope(|scope| {
            let checking = std::thread::Builder::new()
                .name("plugin-hash".into())
                .spawn_scoped(scope, check);
            let found = shared.compiled_component(pin);
            let checked = match checking {
                Ok(handle) => handle.join().map_err(|_| ()),
                // No thread to spare: check here.
                Err(_) => Ok(check()),
            };
            (checked, found)
        }),
    };
    let Ok((sha256, refused)) = checked else {
        return Err(load_error(&label, "checking the component failed unexpectedly").into());
    };
    if let Some(pin) = pin
        && sha256 != pin
    {
        return Err(PinnedLoadError::Mismatch { found: sha256 });
    }
    let refused = refused.map_err(|e| load_error(&label, e.to_string()))?;
    if !refused.is_empty() {
        return Err(load_error(
            &label,
            format!(
                "it imports what the sandbox does not provide: {}",
                refused.join(", ")
            ),
        )
        .into());
    }
    let (component, fresh) = match found {
        Some(component) => (component, false),
        None => component(shared, &label, &sha256, bytes, pin.is_none())?,
    };
    let described = format!(
        "describe:{sha256}:{}",
        crate::sha256_hex(format!("{params:?}").as_bytes())
    );
    if let Some(error) = shared.failed_before(&described) {
        return Err(error.into());
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
/// was compiled just now: from memory, the cache (unless `look_up` is
/// false: the caller looked already), or a compile within the
/// shape limits and the deadline. A failed compile is remembered for
/// [`PluginLimits::failed_ttl`].
fn component(
    shared: &Shared,
    label: &str,
    sha256: &str,
    bytes: &[u8],
    look_up: bool,
) -> Result<(Component, bool), PluginError> {
    let key = format!("compile:{sha256}");
    if let Some(error) = shared.failed_before(&key) {
        return Err(error);
    }
    if look_up && let Some(component) = shared.compiled_component(sha256) {
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

/// Why bytes given as a plugin are not a component.
#[derive(Debug, thiserror::Error)]
enum NotAComponent {
    #[error("not a component: {0}")]
    Unreadable(wasmparser::BinaryReaderError),
    #[error("it is a core module, not a component")]
    CoreModule,
}

/// The imports of a component (top level) that the sandbox does not
/// provide, read without compiling it.
fn refused_imports(bytes: &[u8]) -> Result<Vec<String>, NotAComponent> {
    let mut refused = Vec::new();
    let mut depth = 0usize;
    for payload in wasmparser::Parser::new(0).parse_all(bytes) {
        match payload.map_err(NotAComponent::Unreadable)? {
            wasmparser::Payload::Version {
                encoding: wasmparser::Encoding::Module,
                ..
            } if depth == 0 => {
                return Err(NotAComponent::CoreModule);
            }
            wasmparser::Payload::ModuleSection { .. }
            | wasmparser::Payload::ComponentSection { .. } => depth += 1,
            wasmparser::Payload::End(_) => depth = depth.saturating_sub(1),
            wasmparser::Payload::ComponentImportSection(imports) if depth == 0 => {
                for import in imports {
                    let import = import.map_err(NotAComponent::Unreadable)?;
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
