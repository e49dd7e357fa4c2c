//! The plugin runtime: engine, limits, instance pools, output checks.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use arrow_array::RecordBatch;
use arrow_schema::{Schema, SchemaRef};
// The contract's wire format, shared with the guest side: bounded, in-place
// decoding of untrusted IPC (arrays fully validated), one-allocation encoding.
use lance_context_plugin::ipc::{decode, decode_schema, encode};
use wasmtime::component::{Component, Linker, ResourceTable};
use wasmtime::{Cache, CacheConfig, Config, Engine, ResourceLimiter, Store, Trap};
use wasmtime_wasi::p2::pipe::MemoryOutputPipe;
use wasmtime_wasi::{HostMonotonicClock, HostWallClock, WasiCtx, WasiCtxView, WasiView};

use super::bindings::{self, SchemaPlugin, SchemaPluginPre};
use crate::spec::{KeyRule, QuerySpec, SchemaSpec, SpecProblem, VectorSpec};

/// The contract ABI version this host speaks (`lance-context:plugin@0.1.0`).
pub const ABI_VERSION: u32 = 1;

const EPOCH_TICK: Duration = Duration::from_millis(10);
const STDERR_CAPTURE: usize = 64 << 10;

/// Limits applied to every plugin call.
#[derive(Debug, Clone)]
pub struct PluginLimits {
    /// Wall-clock time one call may take.
    pub call_deadline: Duration,
    /// Linear memory one instance may use.
    pub memory_bytes: usize,
    /// Size of one call's output (a transformed batch or a declaration).
    pub output_bytes: usize,
    /// WebAssembly stack.
    pub max_wasm_stack: usize,
}

impl Default for PluginLimits {
    fn default() -> Self {
        Self {
            call_deadline: Duration::from_secs(5),
            memory_bytes: 512 << 20,
            output_bytes: 256 << 20,
            max_wasm_stack: 1 << 20,
        }
    }
}

/// One row-level problem reported by a plugin: the SDK's type, which both
/// sides of the contract share.
pub use lance_context_plugin::RowError;

/// A plugin failure, always naming the plugin.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PluginError {
    /// The bytes are not a component this host can compile or link.
    #[error("plugin {plugin}: cannot load: {message}")]
    Load { plugin: String, message: String },
    /// The plugin was built against an ABI this host does not speak.
    #[error(
        "plugin {plugin}: ABI version {found} is not supported (this host speaks {ABI_VERSION})"
    )]
    UnsupportedAbi { plugin: String, found: u32 },
    /// `describe` refused the creation parameters.
    #[error("plugin {plugin}: invalid parameters: {message}")]
    InvalidParams { plugin: String, message: String },
    /// The declaration breaks the spec rules (every problem found).
    #[error("plugin {plugin}: invalid declaration: {}", problems.iter().map(ToString::to_string).collect::<Vec<_>>().join("; "))]
    InvalidDeclaration {
        plugin: String,
        problems: Vec<SpecProblem>,
    },
    /// `validate` or `transform` rejected rows.
    #[error("plugin {plugin}: {} row error(s), first: {}", errors.len(), errors.first().map(ToString::to_string).unwrap_or_default())]
    Rejected {
        plugin: String,
        errors: Vec<RowError>,
    },
    /// The call ran past its deadline.
    #[error("plugin {plugin}: call exceeded its deadline of {deadline:?}")]
    Timeout { plugin: String, deadline: Duration },
    /// The instance tried to grow its memory past the cap.
    #[error("plugin {plugin}: exceeded its memory limit of {limit} bytes")]
    MemoryLimit { plugin: String, limit: usize },
    /// The guest panicked.
    #[error("plugin {plugin}: panicked: {message}")]
    Panic { plugin: String, message: String },
    /// Any other trap.
    #[error("plugin {plugin}: trapped: {message}")]
    Trap { plugin: String, message: String },
    /// The output is too large.
    #[error("plugin {plugin}: output of {size} bytes exceeds the limit of {limit}")]
    OutputTooLarge {
        plugin: String,
        size: usize,
        limit: usize,
    },
    /// The output is not valid Arrow IPC.
    #[error("plugin {plugin}: malformed output: {message}")]
    MalformedOutput { plugin: String, message: String },
    /// The output does not match the declared schema.
    #[error("plugin {plugin}: output does not match the declared schema: {message}")]
    SchemaMismatch { plugin: String, message: String },
    /// The plugin reported its input as malformed (a host bug or version skew).
    #[error("plugin {plugin}: rejected its input as malformed: {message}")]
    MalformedInput { plugin: String, message: String },
}

impl PluginError {
    /// The row errors, when rows were rejected.
    pub fn row_errors(&self) -> Option<&[RowError]> {
        match self {
            Self::Rejected { errors, .. } => Some(errors),
            _ => None,
        }
    }
}

/// What a plugin declared, checked and in host types: the plugin's identity
/// and its [`SchemaSpec`].
#[derive(Debug, Clone, PartialEq)]
pub struct PluginDeclaration {
    pub name: String,
    pub version: String,
    pub abi_version: u32,
    /// The spec's Arrow schema (key column tagged as the primary key).
    pub schema: SchemaRef,
    /// Key, columns, blobs, vectors, secondary key, capabilities.
    pub spec: SchemaSpec,
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

/// Per-store state of an instance.
struct HostState {
    wasi: WasiCtx,
    table: ResourceTable,
    memory_limit: usize,
    memory_denied: bool,
    stderr: MemoryOutputPipe,
}

impl WasiView for HostState {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView {
            ctx: &mut self.wasi,
            table: &mut self.table,
        }
    }
}

impl ResourceLimiter for HostState {
    fn memory_growing(
        &mut self,
        _current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        if desired > self.memory_limit {
            self.memory_denied = true;
            return Err(wasmtime::format_err!(
                "memory limit of {} bytes reached",
                self.memory_limit
            ));
        }
        Ok(true)
    }

    fn table_growing(
        &mut self,
        _current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        Ok(desired <= 1_000_000)
    }
}

/// A clock stopped at the epoch: the sandbox observes no time.
struct FrozenClock;

impl HostWallClock for FrozenClock {
    fn resolution(&self) -> Duration {
        Duration::from_secs(1)
    }
    fn now(&self) -> Duration {
        Duration::ZERO
    }
}

impl HostMonotonicClock for FrozenClock {
    fn resolution(&self) -> u64 {
        1_000_000_000
    }
    fn now(&self) -> u64 {
        0
    }
}

/// Compiles, links and loads plugins.
pub struct PluginRuntime {
    engine: Engine,
    linker: Arc<Linker<HostState>>,
    limits: PluginLimits,
    cache: Option<Cache>,
    ticker_stop: Arc<AtomicBool>,
    ticker: Option<std::thread::JoinHandle<()>>,
}

impl std::fmt::Debug for PluginRuntime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PluginRuntime")
            .field("limits", &self.limits)
            .field("cache", &self.cache.as_ref().map(|c| c.directory().clone()))
            .finish_non_exhaustive()
    }
}

impl PluginRuntime {
    /// A runtime with these limits; compiled components are cached under
    /// `cache_dir` when given.
    pub fn new(limits: PluginLimits, cache_dir: Option<PathBuf>) -> Result<Self, PluginError> {
        let load_error = |message: String| PluginError::Load {
            plugin: "(runtime)".to_string(),
            message,
        };
        let mut config = Config::new();
        config.wasm_component_model(true);
        config.epoch_interruption(true);
        config.max_wasm_stack(limits.max_wasm_stack);
        let cache = match cache_dir {
            Some(dir) => {
                std::fs::create_dir_all(&dir)
                    .map_err(|e| load_error(format!("cache directory {}: {e}", dir.display())))?;
                // wasmtime wants an absolute path.
                let dir = std::path::absolute(&dir)
                    .map_err(|e| load_error(format!("cache directory {}: {e}", dir.display())))?;
                let mut cache_config = CacheConfig::new();
                cache_config.with_directory(dir);
                let cache = Cache::new(cache_config).map_err(|e| load_error(e.to_string()))?;
                config.cache(Some(cache.clone()));
                Some(cache)
            }
            None => None,
        };
        let engine = Engine::new(&config).map_err(|e| load_error(e.to_string()))?;
        let mut linker = Linker::<HostState>::new(&engine);
        wasmtime_wasi::p2::add_to_linker_sync(&mut linker)
            .map_err(|e| load_error(e.to_string()))?;

        let ticker_stop = Arc::new(AtomicBool::new(false));
        let ticker = {
            let engine = engine.clone();
            let stop = ticker_stop.clone();
            std::thread::Builder::new()
                .name("plugin-epoch".into())
                .spawn(move || {
                    while !stop.load(Ordering::Relaxed) {
                        std::thread::sleep(EPOCH_TICK);
                        engine.increment_epoch();
                    }
                })
                .map_err(|e| load_error(format!("starting the epoch ticker: {e}")))?
        };
        Ok(Self {
            engine,
            linker: Arc::new(linker),
            limits,
            cache,
            ticker_stop,
            ticker: Some(ticker),
        })
    }

    /// Compiled-component cache hits and misses since this runtime started.
    pub fn cache_stats(&self) -> Option<(usize, usize)> {
        self.cache
            .as_ref()
            .map(|c| (c.cache_hits(), c.cache_misses()))
    }

    /// Compile `bytes` (through the cache), instantiate, and call `describe`
    /// with `params`; the declaration is checked before it is returned.
    pub fn load(
        &self,
        label: &str,
        bytes: &[u8],
        params: Vec<(String, String)>,
    ) -> Result<LoadedPlugin, PluginError> {
        let sha256 = crate::sha256_hex(bytes);
        let component = Component::new(&self.engine, bytes).map_err(|e| PluginError::Load {
            plugin: label.to_string(),
            message: format!("{e:#}"),
        })?;
        let instance_pre =
            self.linker
                .instantiate_pre(&component)
                .map_err(|e| PluginError::Load {
                    plugin: label.to_string(),
                    message: format!("{e:#}"),
                })?;
        let pre = SchemaPluginPre::new(instance_pre).map_err(|e| PluginError::Load {
            plugin: label.to_string(),
            message: format!("not a schema plugin: {e:#}"),
        })?;
        let mut plugin = LoadedPlugin {
            label: label.to_string(),
            engine: self.engine.clone(),
            pre,
            limits: self.limits.clone(),
            params,
            pool: Mutex::new(Vec::new()),
            declaration: None,
        };
        let declaration = plugin.describe(sha256)?;
        plugin.label = declaration.name.clone();
        plugin.declaration = Some(declaration);
        Ok(plugin)
    }
}

impl Drop for PluginRuntime {
    fn drop(&mut self) {
        self.ticker_stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.ticker.take() {
            let _ = t.join();
        }
    }
}

struct Instance {
    store: Store<HostState>,
    plugin: SchemaPlugin,
}

/// A loaded, described plugin. Safe to share between threads.
pub struct LoadedPlugin {
    label: String,
    engine: Engine,
    pre: SchemaPluginPre<HostState>,
    limits: PluginLimits,
    params: Vec<(String, String)>,
    pool: Mutex<Vec<Instance>>,
    declaration: Option<PluginDeclaration>,
}

impl std::fmt::Debug for LoadedPlugin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LoadedPlugin")
            .field("plugin", &self.label)
            .finish_non_exhaustive()
    }
}

impl LoadedPlugin {
    /// The checked declaration.
    pub fn declaration(&self) -> &PluginDeclaration {
        self.declaration
            .as_ref()
            .expect("a LoadedPlugin is only handed out after describe")
    }

    fn instance(&self) -> Result<Instance, PluginError> {
        if let Some(instance) = self.pool.lock().unwrap_or_else(|p| p.into_inner()).pop() {
            return Ok(instance);
        }
        let stderr = MemoryOutputPipe::new(STDERR_CAPTURE);
        let wasi = WasiCtx::builder()
            .stderr(stderr.clone())
            .wall_clock(FrozenClock)
            .monotonic_clock(FrozenClock)
            .secure_random(wasmtime_wasi::Deterministic::new(vec![7]))
            .insecure_random(wasmtime_wasi::Deterministic::new(vec![7]))
            .insecure_random_seed(7)
            .build();
        let mut store = Store::new(
            &self.engine,
            HostState {
                wasi,
                table: ResourceTable::new(),
                memory_limit: self.limits.memory_bytes,
                memory_denied: false,
                stderr,
            },
        );
        store.limiter(|s| s as &mut dyn ResourceLimiter);
        store.set_epoch_deadline(self.deadline_ticks());
        let plugin = self
            .pre
            .instantiate(&mut store)
            .map_err(|e| self.trap(&store, e))?;
        Ok(Instance { store, plugin })
    }

    fn deadline_ticks(&self) -> u64 {
        (self.limits.call_deadline.as_millis() / EPOCH_TICK.as_millis()).max(1) as u64
    }

    /// Run `f` on a pooled instance; a trap discards the instance.
    fn call<R>(
        &self,
        f: impl FnOnce(&SchemaPlugin, &mut Store<HostState>) -> wasmtime::Result<R>,
    ) -> Result<R, PluginError> {
        let mut instance = self.instance()?;
        instance.store.set_epoch_deadline(self.deadline_ticks());
        match f(&instance.plugin, &mut instance.store) {
            Ok(r) => {
                self.pool
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .push(instance);
                Ok(r)
            }
            Err(e) => Err(self.trap(&instance.store, e)),
        }
    }

    fn trap(&self, store: &Store<HostState>, err: wasmtime::Error) -> PluginError {
        let plugin = self.label.clone();
        if store.data().memory_denied {
            return PluginError::MemoryLimit {
                plugin,
                limit: self.limits.memory_bytes,
            };
        }
        match err.downcast_ref::<Trap>() {
            Some(Trap::Interrupt) => PluginError::Timeout {
                plugin,
                deadline: self.limits.call_deadline,
            },
            Some(Trap::UnreachableCodeReached) => {
                // Rust's panic hook writes "thread … panicked at file:line:col:",
                // the message, then a hint about RUST_BACKTRACE.
                let stderr = String::from_utf8_lossy(&store.data().stderr.contents()).into_owned();
                let message: Vec<&str> = stderr
                    .lines()
                    .map(str::trim)
                    .filter(|l| !l.is_empty() && !l.starts_with("note: run with"))
                    .collect();
                PluginError::Panic {
                    plugin,
                    message: if message.is_empty() {
                        "(no message)".to_string()
                    } else {
                        message.join(" ")
                    },
                }
            }
            _ => PluginError::Trap {
                plugin,
                message: format!("{err:#}"),
            },
        }
    }

    fn describe(&self, sha256: String) -> Result<PluginDeclaration, PluginError> {
        let params = self.params.clone();
        let result = self.call(|p, s| p.call_describe(s, &params))?;
        let decl = result.map_err(|e| match e {
            bindings::DescribeError::InvalidParams(message) => PluginError::InvalidParams {
                plugin: self.label.clone(),
                message,
            },
        })?;
        let plugin = if decl.name.is_empty() {
            self.label.clone()
        } else {
            decl.name.clone()
        };
        if decl.abi_version != ABI_VERSION {
            return Err(PluginError::UnsupportedAbi {
                plugin,
                found: decl.abi_version,
            });
        }
        if decl.arrow_schema.len() > self.limits.output_bytes {
            return Err(PluginError::OutputTooLarge {
                plugin,
                size: decl.arrow_schema.len(),
                limit: self.limits.output_bytes,
            });
        }
        let schema = decode_schema(&decl.arrow_schema).map_err(|message| {
            PluginError::InvalidDeclaration {
                plugin: plugin.clone(),
                problems: vec![SpecProblem {
                    field: "arrow-schema".into(),
                    message,
                }],
            }
        })?;
        let mut spec = SchemaSpec::from_arrow(&plugin, &decl.key_column, &schema);
        spec.blob_columns = decl.blob_columns;
        spec.vectors = decl
            .vector_columns
            .iter()
            .map(|v| VectorSpec {
                column: v.name.clone(),
                dimension: i64::from(v.dimension),
                metric: match v.metric {
                    bindings::Metric::L2 => "l2",
                    bindings::Metric::Cosine => "cosine",
                    bindings::Metric::Dot => "dot",
                }
                .to_string(),
            })
            .collect();
        spec.secondary_key = decl.secondary_key;
        spec.queries = decl
            .queries
            .into_iter()
            .map(|q| QuerySpec {
                name: q.name,
                description: q.description,
                params: q.params,
                filter: q.filter,
                order_by: q.order_by,
                reduce: q.reduce,
            })
            .collect();
        for (flag, name) in [
            (bindings::Capabilities::TOMBSTONES, "tombstones"),
            (bindings::Capabilities::SUPERSESSION, "supersession"),
            (bindings::Capabilities::LIFECYCLE, "lifecycle"),
            (bindings::Capabilities::UNIQUE_KEYS, "unique_keys"),
        ] {
            if decl.capabilities.contains(flag) {
                spec.capabilities.push(name.to_string());
            }
        }
        // The built-in datagen schema keys by `event_id`; the registry holds
        // user schemas to `id`.
        let schema = spec
            .check(KeyRule::Builtin)
            .map_err(|e| PluginError::InvalidDeclaration {
                plugin: plugin.clone(),
                problems: e.problems,
            })?;
        Ok(PluginDeclaration {
            name: plugin,
            version: decl.version,
            abi_version: decl.abi_version,
            schema,
            spec,
            has_transform: decl.has_transform,
            sha256,
        })
    }

    fn batch_error(&self, e: bindings::BatchError) -> PluginError {
        match e {
            bindings::BatchError::Rows(rows) => PluginError::Rejected {
                plugin: self.label.clone(),
                errors: rows
                    .into_iter()
                    .map(|r| RowError {
                        row: r.row,
                        column: r.column,
                        code: r.code,
                        message: r.message,
                    })
                    .collect(),
            },
            bindings::BatchError::MalformedInput(message) => PluginError::MalformedInput {
                plugin: self.label.clone(),
                message,
            },
        }
    }

    fn encode_input(&self, batch: &RecordBatch) -> Result<Vec<u8>, PluginError> {
        encode(std::slice::from_ref(batch)).map_err(|message| PluginError::MalformedInput {
            plugin: self.label.clone(),
            message,
        })
    }

    fn context(&self, now_micros: i64) -> bindings::CallContext {
        bindings::CallContext {
            now_micros,
            params: self.params.clone(),
        }
    }

    /// Validate a batch: `Ok`, or [`PluginError::Rejected`] with every row error.
    pub fn validate(&self, batch: &RecordBatch) -> Result<(), PluginError> {
        let bytes = self.encode_input(batch)?;
        let context = self.context(crate::now_micros());
        self.call(|p, s| p.call_validate(s, &bytes, &context))?
            .map_err(|e| self.batch_error(e))
    }

    /// Transform a batch. By the contract a transform applies `validate`'s
    /// checks first (one boundary crossing for both), then returns the columns
    /// it fills or derives; the host checks each against the declaration and
    /// assembles the batch: a derived column where returned, else the input's,
    /// else nulls. Without a declared transform, the batch is returned as is.
    pub fn transform(
        &self,
        batch: &RecordBatch,
        now_micros: i64,
    ) -> Result<RecordBatch, PluginError> {
        let declared = self.declaration();
        if !declared.has_transform {
            return Ok(batch.clone());
        }
        let bytes = self.encode_input(batch)?;
        let context = self.context(now_micros);
        let out = self
            .call(|p, s| p.call_transform(s, &bytes, &context))?
            .map_err(|e| self.batch_error(e))?;
        drop(bytes);
        if out.len() > self.limits.output_bytes {
            return Err(PluginError::OutputTooLarge {
                plugin: self.label.clone(),
                size: out.len(),
                limit: self.limits.output_bytes,
            });
        }
        let batches = decode(out).map_err(|message| PluginError::MalformedOutput {
            plugin: self.label.clone(),
            message,
        })?;
        let mismatch = |message: String| PluginError::SchemaMismatch {
            plugin: self.label.clone(),
            message,
        };
        let Some(first) = batches.first() else {
            return Err(PluginError::MalformedOutput {
                plugin: self.label.clone(),
                message: "the output stream holds no batch".into(),
            });
        };
        let derived_schema = first.schema();
        check_derived(&declared.schema, &derived_schema).map_err(mismatch)?;
        let mut rows = 0;
        for b in &batches {
            if b.schema() != derived_schema {
                return Err(mismatch("the output batches have different columns".into()));
            }
            rows += b.num_rows();
        }
        if rows != batch.num_rows() {
            return Err(mismatch(format!(
                "{} rows in, {rows} rows out",
                batch.num_rows()
            )));
        }
        let derived = if batches.len() == 1 {
            batches.into_iter().next().expect("one batch")
        } else {
            arrow_select::concat::concat_batches(&derived_schema, &batches).map_err(|e| {
                PluginError::MalformedOutput {
                    plugin: self.label.clone(),
                    message: e.to_string(),
                }
            })?
        };
        assemble(&declared.schema, batch, &derived).map_err(|message| {
            PluginError::MalformedOutput {
                plugin: self.label.clone(),
                message,
            }
        })
    }

    /// Reduce the rows of named query `query` (declared with `reduce`) to
    /// JSON with the plugin's `reduce`. Output larger than the output cap, or
    /// not JSON, is an error.
    pub fn reduce(
        &self,
        query: &str,
        rows: &RecordBatch,
        now_micros: i64,
    ) -> Result<serde_json::Value, PluginError> {
        let bytes = self.encode_input(rows)?;
        let context = self.context(now_micros);
        let out = self
            .call(|p, s| p.call_reduce(s, query, &bytes, &context))?
            .map_err(|e| self.batch_error(e))?;
        if out.len() > self.limits.output_bytes {
            return Err(PluginError::OutputTooLarge {
                plugin: self.label.clone(),
                size: out.len(),
                limit: self.limits.output_bytes,
            });
        }
        serde_json::from_str(&out).map_err(|e| PluginError::MalformedOutput {
            plugin: self.label.clone(),
            message: format!("reduce returned text that is not JSON: {e}"),
        })
    }

    /// What the add pipeline runs: `transform` when the plugin declares one
    /// (it validates in the same call), else `validate`; the batch to store.
    pub fn prepare(
        &self,
        batch: &RecordBatch,
        now_micros: i64,
    ) -> Result<RecordBatch, PluginError> {
        if self.declaration().has_transform {
            self.transform(batch, now_micros)
        } else {
            self.validate(batch)?;
            Ok(batch.clone())
        }
    }
}

/// A transform's output columns must be declared, once each, with the
/// declared type (nullability is the engine's to check, row by row).
fn check_derived(declared: &Schema, got: &Schema) -> Result<(), String> {
    let mut seen = std::collections::HashSet::new();
    for field in got.fields() {
        if !seen.insert(field.name()) {
            return Err(format!("column '{}' is returned twice", field.name()));
        }
        match declared.field_with_name(field.name()) {
            Err(_) => return Err(format!("column '{}' is not declared", field.name())),
            Ok(d) if d.data_type() != field.data_type() => {
                return Err(format!(
                    "column '{}' is {}, declared {}",
                    field.name(),
                    field.data_type(),
                    d.data_type()
                ));
            }
            Ok(_) => {}
        }
    }
    Ok(())
}

/// The declared columns in declared order: derived, else input, else nulls.
/// Fields keep the declared type and are nullable here; the engine checks
/// nullability and names the row.
fn assemble(
    declared: &SchemaRef,
    input: &RecordBatch,
    derived: &RecordBatch,
) -> Result<RecordBatch, String> {
    let rows = input.num_rows();
    let mut fields = Vec::with_capacity(declared.fields().len());
    let mut columns = Vec::with_capacity(declared.fields().len());
    for field in declared.fields() {
        let column = derived
            .column_by_name(field.name())
            .or_else(|| input.column_by_name(field.name()))
            .cloned()
            .unwrap_or_else(|| arrow_array::new_null_array(field.data_type(), rows));
        if column.data_type() != field.data_type() {
            return Err(format!(
                "column '{}' is {}, declared {}",
                field.name(),
                column.data_type(),
                field.data_type()
            ));
        }
        fields.push(field.as_ref().clone().with_nullable(true));
        columns.push(column);
    }
    RecordBatch::try_new(
        Arc::new(Schema::new_with_metadata(
            fields,
            declared.metadata().clone(),
        )),
        columns,
    )
    .map_err(|e| e.to_string())
}
