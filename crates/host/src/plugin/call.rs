//! A loaded plugin's calls: validate, transform, reduce, each in a fresh
//! instance under the call deadline, the memory cap and the call slots.

use std::sync::Arc;
use std::time::Instant;

use arrow_array::RecordBatch;
use lance_context_wire as wire;
use serde_json::value::RawValue;
use wasmtime::{Store, Trap};

use super::abi::{
    self, CallContext, DESCRIBE_BYTES, ERROR_BYTES, MAX_MESSAGE, RawDeclaration,
    SchemaPluginCore as SchemaPlugin, SchemaPluginCorePre as SchemaPluginPre,
};
use super::error::{PluginError, plugin_text};
use super::output::{assemble, check_derived, json_document, panic_message};
use super::runtime::{EPOCH_TICK, PluginDeclaration, Shared};
use super::sandbox::HostState;
use super::slots::Slots;
use crate::spec::{KeyRule, SchemaSpec, SpecProblem, VectorSpec};

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
    pub(super) inner: Arc<Inner>,
}

pub(super) struct Inner {
    pub(super) shared: Arc<Shared>,
    /// This plugin's own call slots (a store's), taken before the runtime's.
    pub(super) slots: Slots,
    pub(super) label: String,
    pub(super) pre: SchemaPluginPre<HostState>,
    pub(super) params: Vec<(String, String)>,
    pub(super) declaration: Option<PluginDeclaration>,
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

    pub(super) fn describe(&self, sha256: String) -> Result<PluginDeclaration, PluginError> {
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
