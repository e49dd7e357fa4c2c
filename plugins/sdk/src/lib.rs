//! # lance-context-plugin: write a schema plugin in Rust
//!
//! A schema plugin declares a store's Arrow schema, validates batches of
//! records and may fill defaults. Implement [`Plugin`] on a type and export it
//! with [`export_plugin!`]; build with `cargo build --release --target
//! wasm32-wasip2`. The contract is `wit/plugin.wit`
//! (`lance-context:plugin@0.1.0`).
//!
//! ```
//! use lance_context_plugin::*;
//!
//! pub struct Notes;
//!
//! impl Plugin for Notes {
//!     fn describe(_params: &Params) -> Result<Declaration, InvalidParams> {
//!         Ok(Declaration::new("notes", "0.1.0", Schema::new(vec![
//!             key_field("id"),
//!             Field::new("text", DataType::Utf8, false),
//!             // A UTC timestamp: microseconds, zone "UTC".
//!             Field::new("at", DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into())), true),
//!         ])))
//!     }
//!     fn validate(batch: &RecordBatch, call: &CallInfo, errors: &mut RowErrors) {
//!         // Non-nullable columns (the key, `text`) as `required` row errors.
//!         if let Ok(d) = call.declaration::<Self>() {
//!             require_declared(batch, &d.schema, errors);
//!         }
//!         for row in rows_where_empty(batch, "text") {
//!             errors.push(row, Some("text"), "required", "text must not be empty");
//!         }
//!     }
//! }
//!
//! // The component's exports exist only in the wasm32 build; natively the
//! // crate is plain Rust, so `cargo test` runs the plugin's logic.
//! #[cfg(target_arch = "wasm32")]
//! export_plugin!(Notes);
//!
//! # let batch = RecordBatch::try_new(
//! #     std::sync::Arc::new(Schema::new(vec![Field::new("text", DataType::Utf8, true)])),
//! #     vec![std::sync::Arc::new(arrow_array::StringArray::from(vec![Some("")]))],
//! # ).unwrap();
//! let mut errors = RowErrors::default();
//! Notes::validate(&batch, &CallInfo::default(), &mut errors);
//! let codes: Vec<String> = errors.into_vec().into_iter().map(|e| e.code).collect();
//! assert_eq!(codes, ["required", "required"]); // no id; empty text
//! ```
//!
//! A crate of its own needs `crate-type = ["cdylib", "rlib"]` (the component
//! and native tests) and a release profile of `opt-level = 3`, `lto = true`,
//! `panic = "abort"`; `lance-context plugin new NAME` writes one.
//!
//! Everything except the export glue is plain Rust over Arrow, so a plugin's
//! logic is unit-tested natively.

mod declaration;
pub mod defaults;
mod errors;
/// The contract's wire format (Arrow IPC, bounded decoding): the
/// `lance-context-wire` crate the host uses too.
pub use lance_context_wire as ipc;
mod shared;

#[cfg(target_arch = "wasm32")]
#[doc(hidden)]
pub mod bindings;

pub use arrow_array::{self, Array, ArrayRef, RecordBatch};
pub use arrow_schema::{self, DataType, Field, Schema, SchemaRef, TimeUnit};
/// Arrow's selection kernels (`zip`, `filter`, `take`, `concat`).
pub use arrow_select;
pub use declaration::{
    ABI_VERSION, Capabilities, Capability, Declaration, Metric, NamedQuery, PRIMARY_KEY_METADATA,
    TOMBSTONE_CONTENT_TYPE, TextColumn, VectorColumn, key_field,
};
pub use errors::{
    InvalidParams, RowError, RowErrors, require_declared, rows_where_empty, rows_where_null,
};
pub use shared::{check_relationships, relationships_field, require_non_empty};

/// Creation parameters: `(name, JSON text)` pairs.
pub type Params = [(String, String)];

/// A schema plugin. Only `describe` and `validate` are required.
pub trait Plugin {
    /// Declare the schema for these creation parameters (validate them; an
    /// error names the parameter).
    fn describe(params: &Params) -> Result<Declaration, InvalidParams>;

    /// Record every problem of `batch` in `errors` (row order). Columns the
    /// caller did not give are absent from `batch` (they count as null).
    /// `call` carries the host's clock and the store's parameters.
    fn validate(batch: &RecordBatch, call: &CallInfo, errors: &mut RowErrors);

    /// Fill defaults or derive columns of a batch that passed `validate`.
    /// Only called when the declaration says `has_transform`.
    ///
    /// Return the columns you fill or derive, by name: columns you leave out
    /// are kept from the input as they are (the host assembles the declared
    /// batch), so pass-through columns never cross the boundary twice. Returning
    /// the whole batch is allowed too. [`defaults::derive`] builds the result
    /// from the declared schema, which [`CallInfo::schema`] gives
    /// (`call.schema::<Self>()?`). The default derives nothing.
    fn transform(batch: RecordBatch, call: &CallInfo) -> Result<RecordBatch, RowErrors> {
        let _ = call;
        Ok(RecordBatch::try_new_with_options(
            std::sync::Arc::new(Schema::empty()),
            vec![],
            &arrow_array::RecordBatchOptions::new().with_row_count(Some(batch.num_rows())),
        )
        .expect("an empty batch with a row count is valid"))
    }

    /// Reduce the rows of the named query `query` (declared with
    /// `with_reduce_query`) to a JSON document. The default reduces nothing.
    fn reduce(query: &str, rows: &RecordBatch, call: &CallInfo) -> Result<String, CallError> {
        let _ = (rows, call);
        Err(CallError::Malformed(format!(
            "this plugin reduces no query '{query}'"
        )))
    }
}

/// What the host tells a `validate`, `transform` or `reduce` call.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct CallInfo {
    /// The host's clock, microseconds since the Unix epoch (the sandbox has none).
    pub now_micros: i64,
    /// The store's creation parameters.
    pub params: Vec<(String, String)>,
}

impl CallInfo {
    /// The declaration of plugin `P` for this store: `P::describe` with the
    /// store's parameters (what the store was created with).
    pub fn declaration<P: Plugin + ?Sized>(&self) -> Result<Declaration, InvalidParams> {
        P::describe(&self.params)
    }

    /// The declared schema of plugin `P` for this store — what
    /// [`defaults::derive`] takes. In a transform:
    /// `defaults::derive(call.schema::<Self>()?, &batch, |name, given| …)`.
    pub fn schema<P: Plugin + ?Sized>(&self) -> Result<SchemaRef, RowErrors> {
        Ok(std::sync::Arc::new(self.declaration::<P>()?.schema))
    }
}

fn check<P: Plugin>(batches: &[RecordBatch], call: &CallInfo) -> Result<(), CallError> {
    let mut errors = RowErrors::default();
    let mut offset = 0;
    for batch in batches {
        errors.set_row_offset(offset);
        P::validate(batch, call, &mut errors);
        offset += batch.num_rows();
    }
    errors.into_result().map_err(CallError::Rows)
}

/// Run `validate` over IPC bytes as the host calls it.
pub fn run_validate<P: Plugin>(bytes: Vec<u8>, call: &CallInfo) -> Result<(), CallError> {
    check::<P>(&ipc::decode(bytes).map_err(malformed)?, call)
}

/// Run `transform` over IPC bytes as the host calls it: `validate` first (the
/// contract's transform applies the same checks, so the host crosses the
/// boundary once per batch), then [`Plugin::transform`] on each batch. The
/// output holds the derived columns only.
pub fn run_transform<P: Plugin>(bytes: Vec<u8>, call: &CallInfo) -> Result<Vec<u8>, CallError> {
    let batches = ipc::decode(bytes).map_err(malformed)?;
    check::<P>(&batches, call)?;
    let mut out: Vec<RecordBatch> = Vec::with_capacity(batches.len());
    let mut offset = 0;
    for batch in batches {
        let rows = batch.num_rows();
        match P::transform(batch, call) {
            Ok(b) => {
                if b.num_rows() != rows {
                    return Err(CallError::Malformed(format!(
                        "transform returned {} rows for {rows}",
                        b.num_rows()
                    )));
                }
                if let Some(first) = out.first()
                    && first.schema() != b.schema()
                {
                    return Err(CallError::Malformed(
                        "transform returned different columns for different batches".into(),
                    ));
                }
                out.push(b);
            }
            Err(mut errors) => {
                errors.shift_rows(offset);
                return Err(CallError::Rows(errors.into_vec()));
            }
        }
        offset += rows;
    }
    ipc::encode(&out).map_err(malformed)
}

/// Run `reduce` over IPC bytes as the host calls it (the batches concatenated).
pub fn run_reduce<P: Plugin>(
    query: &str,
    bytes: Vec<u8>,
    call: &CallInfo,
) -> Result<String, CallError> {
    let batches = ipc::decode(bytes).map_err(malformed)?;
    let Some(first) = batches.first() else {
        return Err(CallError::Malformed("the stream holds no batch".into()));
    };
    let rows = arrow_select::concat::concat_batches(&first.schema(), &batches)
        .map_err(|e| CallError::Malformed(e.to_string()))?;
    P::reduce(query, &rows, call)
}

fn malformed(e: ipc::WireError) -> CallError {
    CallError::Malformed(e.to_string())
}

/// A failed call, as the contract's `batch-error`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CallError {
    /// Row-level problems.
    Rows(Vec<RowError>),
    /// The input (or output) is not valid Arrow IPC of the schema.
    Malformed(String),
}
