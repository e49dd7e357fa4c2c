//! # lance-context-wire: the plugin contract's wire format
//!
//! Records cross the plugin boundary as an Arrow IPC *stream*: one schema
//! message, then record batches (and, before them, at most one dictionary
//! batch per dictionary-encoded column). Both sides of the contract use this
//! crate: the host to encode a plugin's input and to decode what a plugin
//! returns, the guest SDK the other way round.
//!
//! # Untrusted bytes
//! Whatever a plugin returns is untrusted input to the host. Arrow's IPC
//! reader trusts what a message declares: a compressed buffer announcing a
//! huge uncompressed length makes it allocate that much (an abort, not an
//! error), a list field without a child or an integer of width 7 reach
//! `unwrap`s and `unimplemented!`, a buffer pointing outside its message body
//! reaches a slice out of bounds, and a stream of delta dictionaries costs
//! quadratic work. So [`decode`] first *walks* the stream ([`inspect`]): every
//! message's framing and flatbuffer (verified), every field's type against the
//! types the contract carries, every buffer against its body, the message,
//! row, column and nesting counts against [`Limits`] — and refuses, with a
//! typed [`WireError`], anything compressed, any delta or replaced dictionary,
//! any type outside the contract. Only a stream that passes is handed to
//! Arrow's decoder, which then validates every array; a panic in it is still
//! caught and reported as [`WireError::DecoderPanicked`] (a backstop, never
//! the plan).
//!
//! Decoding is zero-copy: the arrays point into the bytes given.

use arrow_array::RecordBatch;
use arrow_buffer::Buffer;
use arrow_ipc::MetadataVersion;
use arrow_ipc::reader::StreamDecoder;
use arrow_ipc::writer::{IpcWriteOptions, StreamWriter};
use arrow_schema::{ArrowError, Schema, SchemaRef};

mod contract;
#[cfg(any(test, feature = "craft"))]
pub mod craft;
mod walk;

pub use contract::{
    ABI_VERSION, Capability, Metric, PRIMARY_KEY_METADATA, RowError, SUPPORTED_ABI_VERSIONS,
    TOMBSTONE_CONTENT_TYPE,
};
pub use walk::{StreamShape, inspect};

/// Bounds on a stream a decoder accepts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Total bytes of the stream.
    pub max_bytes: usize,
    /// Messages (schema, dictionaries and record batches).
    pub max_messages: usize,
    /// Rows over all record batches.
    pub max_rows: usize,
    /// Fields of the schema, nested ones included.
    pub max_fields: usize,
    /// Nesting depth of a field's type (a top-level primitive is 1).
    pub max_depth: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_bytes: 256 << 20,
            max_messages: 4096,
            max_rows: 16 << 20,
            max_fields: 4096,
            max_depth: 16,
        }
    }
}

/// Why bytes are not an acceptable Arrow IPC stream. Every variant says what
/// and, where it can, which message (zero-based) or field.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum WireError {
    /// The stream ends inside a message.
    Truncated { message: usize },
    /// A message's framing or flatbuffer is invalid.
    Malformed { message: usize, reason: String },
    /// More bytes, messages, rows, fields or nesting than the limits allow.
    TooLarge { what: &'static str, limit: usize },
    /// A record batch or dictionary uses body compression.
    Compressed { message: usize },
    /// A delta dictionary batch, or a second dictionary for the same id.
    DictionaryUpdate { message: usize, id: i64 },
    /// A field's type is not one the contract carries.
    UnsupportedType { field: String, reason: String },
    /// A buffer lies outside its message body, or counts do not match the schema.
    BadLayout { message: usize, reason: String },
    /// The stream holds no schema (or data before it).
    NoSchema,
    /// Arrow's decoder refused the stream (after the walk accepted it).
    Arrow(String),
    /// Arrow's decoder panicked (caught; reported as an error).
    DecoderPanicked(String),
    /// Encoding failed (the batches given do not share one schema, or none was given).
    Encode(String),
}

impl std::fmt::Display for WireError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Truncated { message } => {
                write!(f, "the Arrow IPC stream ends inside message {message}")
            }
            Self::Malformed { message, reason } => {
                write!(f, "Arrow IPC message {message} is malformed: {reason}")
            }
            Self::TooLarge { what, limit } => {
                write!(
                    f,
                    "the Arrow IPC stream has more {what} than the limit of {limit}"
                )
            }
            Self::Compressed { message } => write!(
                f,
                "Arrow IPC message {message} is compressed; the contract carries uncompressed buffers only"
            ),
            Self::DictionaryUpdate { message, id } => write!(
                f,
                "Arrow IPC message {message} updates dictionary {id} (delta or replacement); \
                 the contract allows one dictionary per column"
            ),
            Self::UnsupportedType { field, reason } => {
                write!(f, "field '{field}': {reason}")
            }
            Self::BadLayout { message, reason } => {
                write!(f, "Arrow IPC message {message}: {reason}")
            }
            Self::NoSchema => write!(f, "the Arrow IPC stream does not start with a schema"),
            Self::Arrow(e) => write!(f, "invalid Arrow IPC stream: {e}"),
            Self::DecoderPanicked(e) => write!(f, "the Arrow IPC decoder failed: {e}"),
            Self::Encode(e) => write!(f, "encoding Arrow IPC: {e}"),
        }
    }
}

impl std::error::Error for WireError {}

impl From<ArrowError> for WireError {
    fn from(e: ArrowError) -> Self {
        Self::Arrow(e.to_string())
    }
}

/// Decode a stream of record batches within `limits`, without copying the
/// bytes. The stream is walked first (see the crate docs); the batches share
/// the stream's schema.
pub fn decode_with(bytes: Vec<u8>, limits: &Limits) -> Result<Decoded, WireError> {
    let shape = inspect(&bytes, limits)?;
    let buffer = Buffer::from_vec(bytes);
    let (schema, batches) = guarded(move || {
        let mut buffer = buffer;
        // The walk checked every buffer's alignment: Arrow never copies one.
        let mut decoder = StreamDecoder::new().with_require_alignment(true);
        let mut batches = Vec::with_capacity(shape.batches);
        while !buffer.is_empty() {
            if let Some(batch) = decoder.decode(&mut buffer)? {
                batches.push(batch);
            }
        }
        decoder.finish()?;
        let schema = decoder.schema().ok_or(WireError::NoSchema)?;
        Ok((schema, batches))
    })?;
    Ok(Decoded { schema, batches })
}

/// [`decode_with`] under the default [`Limits`], returning the batches.
pub fn decode(bytes: Vec<u8>) -> Result<Vec<RecordBatch>, WireError> {
    decode_with(bytes, &Limits::default()).map(|d| d.batches)
}

/// A decoded stream: its schema (also when it holds no batch) and batches.
#[derive(Debug, Clone)]
pub struct Decoded {
    /// The stream's schema.
    pub schema: SchemaRef,
    /// The record batches, in order.
    pub batches: Vec<RecordBatch>,
}

/// Decode a schema-only stream (a declaration's `arrow-schema`), walked
/// first like [`decode_with`]. Record batches are refused.
pub fn decode_schema_with(bytes: &[u8], limits: &Limits) -> Result<Schema, WireError> {
    let shape = inspect(bytes, limits)?;
    if shape.batches > 0 || shape.dictionaries > 0 {
        return Err(WireError::BadLayout {
            message: 1,
            reason: "a schema stream holds the schema message only".into(),
        });
    }
    let bytes = bytes.to_vec();
    guarded(move || {
        let mut buffer = Buffer::from_vec(bytes);
        let mut decoder = StreamDecoder::new();
        while !buffer.is_empty() {
            decoder.decode(&mut buffer)?;
        }
        decoder
            .schema()
            .map(|s| s.as_ref().clone())
            .ok_or(WireError::NoSchema)
    })
}

/// [`decode_schema_with`] under the default [`Limits`].
pub fn decode_schema(bytes: &[u8]) -> Result<Schema, WireError> {
    decode_schema_with(bytes, &Limits::default())
}

/// Run Arrow's decoder with panics turned into [`WireError::DecoderPanicked`]
/// (where panics unwind; a guest built with `panic = "abort"` traps instead,
/// which the host reports as a plugin fault).
fn guarded<T>(f: impl FnOnce() -> Result<T, WireError>) -> Result<T, WireError> {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
        Ok(result) => result,
        Err(panic) => Err(WireError::DecoderPanicked(
            panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "panic".to_string()),
        )),
    }
}

/// Encode batches (all of one schema) as an Arrow IPC stream: 8-byte
/// aligned, uncompressed, one allocation sized up front.
pub fn encode(batches: &[RecordBatch]) -> Result<Vec<u8>, WireError> {
    let Some(first) = batches.first() else {
        return Err(WireError::Encode("nothing to encode".into()));
    };
    // Buffers plus padding and per-message metadata: one allocation, no regrowth.
    let size: usize = batches
        .iter()
        .map(|b| b.get_array_memory_size() + 64 * b.num_columns() + 1024)
        .sum();
    let mut out = Vec::with_capacity(size);
    let encode_error = |e: ArrowError| WireError::Encode(e.to_string());
    let mut writer = StreamWriter::try_new_with_options(&mut out, &first.schema(), options())
        .map_err(encode_error)?;
    for batch in batches {
        writer.write(batch).map_err(encode_error)?;
    }
    writer.finish().map_err(encode_error)?;
    drop(writer);
    Ok(out)
}

fn options() -> IpcWriteOptions {
    IpcWriteOptions::try_new(8, false, MetadataVersion::V5).expect("8 is a valid alignment")
}

/// Encode a schema alone (a declaration's `arrow-schema`).
pub fn encode_schema(schema: &Schema) -> Result<Vec<u8>, WireError> {
    let mut out = Vec::new();
    let encode_error = |e: ArrowError| WireError::Encode(e.to_string());
    let mut writer =
        StreamWriter::try_new_with_options(&mut out, schema, options()).map_err(encode_error)?;
    writer.finish().map_err(encode_error)?;
    drop(writer);
    Ok(out)
}

#[cfg(test)]
mod tests;
