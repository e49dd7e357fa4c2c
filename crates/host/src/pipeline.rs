//! The write pipeline, the one choke point every record goes through:
//! input rows → a `RecordBatch` of the plugin's input schema (by column name;
//! unknown fields rejected, never dropped) → the plugin's `validate` → its
//! `transform` (when declared; the output is checked against the declaration)
//! → the storage engine's write ([`crate::NamedStore`]: add, upsert or patch;
//! durable and visible on return).
//!
//! The input schema is the declared schema with every column nullable: columns
//! a transform fills (defaults) may be absent from the input; the engine
//! enforces the declared nullability on the assembled batch. Only the columns
//! the caller gave cross into the plugin, and only the columns a transform
//! derives cross back.

use std::collections::HashSet;
use std::io::BufRead;
use std::sync::Arc;

use arrow_array::{Array, ArrayRef, RecordBatch, RecordBatchOptions};
use arrow_schema::{DataType, Field, FieldRef, Schema, SchemaRef};
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as B64;

use crate::plugin::{LoadedPlugin, PluginError};

/// Why an add through the pipeline failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PipelineError {
    /// The input does not fit the plugin's input schema (before the plugin ran).
    #[error("invalid input: {message}")]
    InvalidInput {
        /// The column, when the problem is in one.
        column: Option<String>,
        /// The zero-based row, when known.
        row: Option<usize>,
        /// What went wrong.
        message: String,
    },
    /// Records that do not fit the input schema (before the plugin ran):
    /// every one of the batch, the first [`MAX_LISTED_PROBLEMS`] listed.
    #[error("invalid input: {}{}", problems.first().map(|p| p.message.as_str()).unwrap_or("invalid records"), match total { 0 | 1 => String::new(), n => format!(" (and {} more record(s))", n - 1) })]
    InvalidRecords {
        /// The refused records (at most [`MAX_LISTED_PROBLEMS`]), in input order.
        problems: Vec<InputProblem>,
        /// How many records were refused in all.
        total: usize,
    },
    /// The plugin rejected rows, or failed.
    #[error(transparent)]
    Plugin(#[from] PluginError),
    /// The storage engine refused or failed.
    #[error(transparent)]
    Store(#[from] lance_context_store::Error),
}

/// The plugin's input schema: the declared columns, all nullable.
pub fn input_schema(plugin: &LoadedPlugin) -> SchemaRef {
    let declared = &plugin.declaration().schema;
    Arc::new(Schema::new_with_metadata(
        declared
            .fields()
            .iter()
            .map(|f| f.as_ref().clone().with_nullable(true))
            .collect::<Vec<Field>>(),
        declared.metadata().clone(),
    ))
}

/// Problems listed at most, per batch (the rest are counted).
pub const MAX_LISTED_PROBLEMS: usize = 100;

/// One input record that does not fit the input schema.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct InputProblem {
    /// The zero-based record (the non-blank line for JSON Lines).
    pub row: usize,
    /// The column, when the problem is in one.
    pub column: Option<String>,
    /// What is wrong.
    pub message: String,
}

impl std::fmt::Display for InputProblem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

/// JSON Lines read leniently: the records that fit the input schema, as one
/// batch, and every record that does not, with why.
#[derive(Debug)]
pub struct JsonRows {
    /// The good records (`None` when there are none).
    pub batch: Option<RecordBatch>,
    /// For each row of `batch`, its zero-based record in the input.
    pub kept: Vec<usize>,
    /// The refused records, in input order.
    pub problems: Vec<InputProblem>,
}

/// Parse JSON Lines (one object per line) into a batch of the input schema.
/// Unknown fields are an error naming the field and line. Binary values are
/// base64 strings (as [`json_ready`] writes them). Every refused record is
/// reported ([`PipelineError::InvalidRecords`], the first
/// [`MAX_LISTED_PROBLEMS`] listed), not only the first.
pub fn rows_from_json(
    plugin: &LoadedPlugin,
    input: impl BufRead,
) -> Result<RecordBatch, PipelineError> {
    let read = json_rows(plugin, input)?;
    if !read.problems.is_empty() {
        let total = read.problems.len();
        let mut problems = read.problems;
        problems.truncate(MAX_LISTED_PROBLEMS);
        return Err(PipelineError::InvalidRecords { problems, total });
    }
    read.batch
        .ok_or_else(|| invalid(None, None, "no records".into()))
}

/// [`rows_from_json`], keeping the good records when some are refused (for
/// a load that sets the refused ones aside). `Err` only when the input
/// cannot be read at all or has no records.
pub fn json_rows(plugin: &LoadedPlugin, input: impl BufRead) -> Result<JsonRows, PipelineError> {
    let schema = input_schema(plugin);
    let CheckedLines {
        lines,
        mut rows,
        mut problems,
    } = checked_lines(&schema, input)?;
    // The JSON reader has no dictionary support: read those columns as
    // strings, then cast.
    let reading = reading_schema(&schema);
    let read = if lines.is_empty() {
        None
    } else {
        match read_lines(&reading, &lines) {
            Ok(read) => Some(read),
            Err(_) => read_good_lines(&reading, lines, &mut rows, &mut problems)?,
        }
    };
    let batch = match read {
        None => None,
        Some(read) => Some(cast_to_input(&schema, &read)?),
    };
    Ok(JsonRows {
        batch,
        kept: rows,
        problems,
    })
}

/// The non-blank lines of JSON Lines input, each checked ([`check_line`]).
struct CheckedLines {
    /// The lines to read.
    lines: Vec<String>,
    /// The input record (non-blank line) of each line kept.
    rows: Vec<usize>,
    /// The records refused.
    problems: Vec<InputProblem>,
}

/// The non-blank lines of `input`, each checked ([`check_line`]). `Err`
/// when the input cannot be read or has no records.
fn checked_lines(schema: &Schema, input: impl BufRead) -> Result<CheckedLines, PipelineError> {
    let known: HashSet<&str> = schema.fields().iter().map(|f| f.name().as_str()).collect();
    let binary: Vec<&str> = schema
        .fields()
        .iter()
        .filter(|f| matches!(f.data_type(), DataType::Binary | DataType::LargeBinary))
        .map(|f| f.name().as_str())
        .collect();
    let mut lines = Vec::new();
    // The input record (non-blank line) of each line kept.
    let mut rows: Vec<usize> = Vec::new();
    let mut problems = Vec::new();
    let mut row = 0;
    for line in input.lines() {
        let line = line.map_err(|e| invalid(None, Some(row), format!("reading input: {e}")))?;
        if line.trim().is_empty() {
            continue;
        }
        match check_line(schema, &known, &binary, row, line) {
            Ok(line) => {
                lines.push(line);
                rows.push(row);
            }
            Err(problem) => problems.push(problem),
        }
        row += 1;
    }
    if row == 0 {
        return Err(invalid(None, None, "no records".into()));
    }
    Ok(CheckedLines {
        lines,
        rows,
        problems,
    })
}

/// The schema the JSON reader reads `schema` with: dictionary columns as
/// their values.
fn reading_schema(schema: &Schema) -> SchemaRef {
    Arc::new(Schema::new_with_metadata(
        schema
            .fields()
            .iter()
            .map(|f| match f.data_type() {
                DataType::Dictionary(_, value) => {
                    f.as_ref().clone().with_data_type(value.as_ref().clone())
                }
                _ => f.as_ref().clone(),
            })
            .collect::<Vec<Field>>(),
        schema.metadata().clone(),
    ))
}

/// Read JSON `lines` as one batch of `reading`.
fn read_lines(
    reading: &SchemaRef,
    lines: &[String],
) -> Result<RecordBatch, arrow_schema::ArrowError> {
    let joined = lines.join("\n");
    let reader = arrow_json::ReaderBuilder::new(reading.clone())
        .with_strict_mode(true)
        .build(std::io::Cursor::new(joined.into_bytes()))?;
    let batches = reader.collect::<Result<Vec<_>, _>>()?;
    arrow_select::concat::concat_batches(reading, &batches)
}

/// Read `lines` when Arrow's reader refused them together: the lines it
/// refuses alone join `problems` (kept in input order) and leave `rows`;
/// the rest are read (`None` when none are left).
fn read_good_lines(
    reading: &SchemaRef,
    lines: Vec<String>,
    rows: &mut Vec<usize>,
    problems: &mut Vec<InputProblem>,
) -> Result<Option<RecordBatch>, PipelineError> {
    // Arrow's reader does not say which line: find them (the
    // error path only; each line alone), set them aside, and
    // read the rest.
    let mut good = Vec::new();
    let mut good_rows = Vec::new();
    for (line, row) in lines.into_iter().zip(std::mem::take(rows)) {
        match read_lines(reading, std::slice::from_ref(&line)) {
            Ok(_) => {
                good.push(line);
                good_rows.push(row);
            }
            Err(e) => problems.push(InputProblem {
                row,
                column: None,
                message: format!("reading JSON: {e}"),
            }),
        }
    }
    problems.sort_by_key(|p| p.row);
    *rows = good_rows;
    Ok(match good.is_empty() {
        true => None,
        false => Some(
            read_lines(reading, &good)
                .map_err(|e| invalid(None, None, format!("reading JSON: {e}")))?,
        ),
    })
}

/// A batch as read (dictionary columns as their values) cast to the input
/// `schema`.
fn cast_to_input(schema: &SchemaRef, read: &RecordBatch) -> Result<RecordBatch, PipelineError> {
    let columns = schema
        .fields()
        .iter()
        .zip(read.columns())
        .map(|(f, c)| {
            if c.data_type() == f.data_type() {
                Ok(c.clone())
            } else {
                arrow_cast::cast(c, f.data_type()).map_err(|e| {
                    invalid(
                        Some(f.name().clone()),
                        None,
                        format!("column '{}': {e}", f.name()),
                    )
                })
            }
        })
        .collect::<Result<Vec<_>, _>>()?;
    RecordBatch::try_new(schema.clone(), columns)
        .map_err(|e| invalid(None, None, format!("reading JSON: {e}")))
}

/// One line's checks before Arrow's reader sees it: an object, known
/// fields, strict types; binary values rewritten from base64 to the hex
/// Arrow's reader takes. The line to read, or why it is refused.
fn check_line(
    schema: &Schema,
    known: &HashSet<&str>,
    binary: &[&str],
    row: usize,
    line: String,
) -> Result<String, InputProblem> {
    let problem = |column: Option<&str>, message: String| InputProblem {
        row,
        column: column.map(str::to_string),
        message,
    };
    // Checked here so the error names the field (the JSON reader's does not).
    // A member given twice is refused (a plain JSON parse keeps the last).
    let mut value: serde_json::Value = serde_json::from_str::<Strict>(&line)
        .map(|s| s.0)
        .map_err(|e| problem(None, format!("not JSON: {e}")))?;
    let object = value
        .as_object_mut()
        .ok_or_else(|| problem(None, "each line must be a JSON object".into()))?;
    if let Some(unknown) = object.keys().find(|k| !known.contains(k.as_str())) {
        return Err(problem(Some(unknown), format!("unknown field '{unknown}'")));
    }
    // Strict: a value of another JSON type, out of range, or a vector of the
    // wrong length is refused — never coerced (Arrow's reader would truncate
    // 3.9 to 3 or read "2" as 2).
    for field in schema.fields() {
        if let Some(v) = object.get(field.name())
            && let Err(why) = check_json(field.data_type(), v)
        {
            return Err(problem(
                Some(field.name()),
                format!("column '{}': {why}", field.name()),
            ));
        }
    }
    // Binary values are base64 in JSON; Arrow's JSON reader takes hex.
    let mut rewritten = false;
    for name in binary {
        if let Some(v) = object.get_mut(*name) {
            match v {
                serde_json::Value::Null => {}
                serde_json::Value::String(text) => {
                    let bytes = B64.decode(text.as_bytes()).map_err(|e| {
                        problem(
                            Some(name),
                            format!("column '{name}': binary values are base64: {e}"),
                        )
                    })?;
                    *v = serde_json::Value::String(
                        bytes.iter().map(|b| format!("{b:02x}")).collect(),
                    );
                    rewritten = true;
                }
                _ => {
                    return Err(problem(
                        Some(name),
                        format!("column '{name}': binary values are base64 strings"),
                    ));
                }
            }
        }
    }
    Ok(if rewritten { value.to_string() } else { line })
}

fn invalid(column: Option<String>, row: Option<usize>, message: String) -> PipelineError {
    PipelineError::InvalidInput {
        column,
        row,
        message,
    }
}

/// Match a caller's batch to the input schema by column name: reject unknown
/// columns and type mismatches; keep the given columns in declared order and
/// leave out absent and all-null ones (absent counts as null everywhere: the
/// plugin sees fewer bytes, the transform's output is assembled by the host).
pub fn to_input(plugin: &LoadedPlugin, batch: &RecordBatch) -> Result<RecordBatch, PipelineError> {
    let schema = input_schema(plugin);
    for field in batch.schema().fields() {
        match schema.field_with_name(field.name()) {
            Err(_) => {
                return Err(invalid(
                    Some(field.name().clone()),
                    None,
                    format!("unknown column '{}'", field.name()),
                ));
            }
            Ok(target) if !target.data_type().equals_datatype(field.data_type()) => {
                return Err(invalid(
                    Some(field.name().clone()),
                    None,
                    format!(
                        "column '{}' has type {}, expected {}",
                        field.name(),
                        field.data_type(),
                        target.data_type()
                    ),
                ));
            }
            Ok(_) => {}
        }
    }
    let mut fields: Vec<FieldRef> = Vec::new();
    let mut columns: Vec<ArrayRef> = Vec::new();
    for field in schema.fields() {
        if let Some(column) = batch.column_by_name(field.name())
            && column.null_count() < column.len()
        {
            fields.push(field.clone());
            columns.push(column.clone());
        }
    }
    RecordBatch::try_new_with_options(
        Arc::new(Schema::new_with_metadata(fields, schema.metadata().clone())),
        columns,
        &RecordBatchOptions::new().with_row_count(Some(batch.num_rows())),
    )
    .map_err(|e| invalid(None, None, format!("building the input batch: {e}")))
}

/// Match a batch from a typed source (Arrow IPC, Parquet) to the plugin's
/// input schema by column name: an unknown column is refused; a column of
/// another type is converted only within its family when nothing can be
/// lost (a string to a large string, an integer to a wider one, a dictionary
/// to its values, a timestamp of the same unit with no zone or UTC, a list
/// to a fixed-size list of the declared length); anything else is refused,
/// naming the column. JSON goes through [`rows_from_json`] instead.
pub fn conform(plugin: &LoadedPlugin, batch: &RecordBatch) -> Result<RecordBatch, PipelineError> {
    let schema = input_schema(plugin);
    let mut fields = Vec::new();
    let mut columns: Vec<ArrayRef> = Vec::new();
    for (field, column) in batch.schema().fields().iter().zip(batch.columns()) {
        let Ok(target) = schema.field_with_name(field.name()) else {
            return Err(invalid(
                Some(field.name().clone()),
                None,
                format!(
                    "unknown column '{}' (the schema's columns: {})",
                    field.name(),
                    schema
                        .fields()
                        .iter()
                        .map(|f| f.name().as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            ));
        };
        let column = if target.data_type() == column.data_type() {
            column.clone()
        } else if target.data_type().equals_datatype(column.data_type())
            || lossless(column.data_type(), target.data_type())
        {
            // (Equal up to names: a list's child is `element` in files
            // written by pyarrow, `item` here.)
            let options = arrow_cast::CastOptions {
                safe: false,
                ..Default::default()
            };
            arrow_cast::cast_with_options(column, target.data_type(), &options).map_err(|e| {
                invalid(
                    Some(field.name().clone()),
                    None,
                    format!(
                        "column '{}': cannot convert {} to {}: {e}",
                        field.name(),
                        field.data_type(),
                        target.data_type()
                    ),
                )
            })?
        } else {
            return Err(invalid(
                Some(field.name().clone()),
                None,
                format!(
                    "column '{}' has type {}, the schema declares {}",
                    field.name(),
                    field.data_type(),
                    target.data_type()
                ),
            ));
        };
        fields.push(target.as_ref().clone().with_nullable(true));
        columns.push(column);
    }
    RecordBatch::try_new_with_options(
        Arc::new(Schema::new_with_metadata(fields, schema.metadata().clone())),
        columns,
        &RecordBatchOptions::new().with_row_count(Some(batch.num_rows())),
    )
    .map_err(|e| invalid(None, None, format!("building the input batch: {e}")))
}

/// Conversions that keep every value as it is.
fn lossless(from: &DataType, to: &DataType) -> bool {
    use DataType::*;
    let utc = |tz: &Option<Arc<str>>| {
        tz.as_deref()
            .is_none_or(|z| matches!(z, "UTC" | "+00:00" | "Z"))
    };
    match (from, to) {
        (Dictionary(_, value), to) => value.as_ref() == to || lossless(value, to),
        (_, Dictionary(_, value)) => from == value.as_ref() || lossless(from, value),
        (Utf8 | LargeUtf8 | Utf8View, Utf8 | LargeUtf8 | Utf8View) => true,
        (Binary | LargeBinary | BinaryView, Binary | LargeBinary | BinaryView) => true,
        (Int8, Int16 | Int32 | Int64) | (Int16, Int32 | Int64) | (Int32, Int64) => true,
        (UInt8, Int16 | Int32 | Int64 | UInt16 | UInt32 | UInt64)
        | (UInt16, Int32 | Int64 | UInt32 | UInt64)
        | (UInt32, Int64 | UInt64) => true,
        (Float16, Float32 | Float64) | (Float32, Float64) => true,
        (Timestamp(a, ta), Timestamp(b, tb)) => a == b && (ta == tb || (utc(ta) && utc(tb))),
        (List(a), List(b) | LargeList(b)) | (LargeList(a), LargeList(b)) => {
            a.data_type() == b.data_type() || lossless(a.data_type(), b.data_type())
        }
        (List(a) | LargeList(a), FixedSizeList(b, _)) => {
            a.data_type() == b.data_type() || lossless(a.data_type(), b.data_type())
        }
        _ => false,
    }
}

/// Why a JSON value does not fit its column (said after "column 'c': ").
#[derive(Debug, thiserror::Error)]
enum Misfit {
    #[error("expected {expected}, got {} ({value})", json_kind(.value))]
    Expected {
        expected: String,
        value: serde_json::Value,
    },
    #[error("{value} is out of range ({range})")]
    OutOfRange { value: String, range: String },
    #[error("{0} is out of range for Float32")]
    NotFloat32(f64),
    #[error("'{0}' is not a date (YYYY-MM-DD)")]
    NotDate(String),
    #[error("'{0}' is not a timestamp (RFC 3339, e.g. 2026-11-30T10:00:00Z, or without a zone)")]
    NotTimestamp(String),
    #[error("expected {expected} values, got {got}")]
    Length { expected: i32, got: usize },
    #[error("item {0} is null")]
    NullItem(usize),
    #[error("item {0}: {1}")]
    Item(usize, Box<Misfit>),
    #[error("unknown field '{0}'")]
    UnknownField(String),
    #[error("field '{0}' is required (non-nullable)")]
    Required(String),
    #[error("{0}: {1}")]
    Field(String, Box<Misfit>),
}

fn json_kind(v: &serde_json::Value) -> &'static str {
    use serde_json::Value as J;
    match v {
        J::Null => "null",
        J::Bool(_) => "a boolean",
        J::Number(_) => "a number",
        J::String(_) => "a string",
        J::Array(_) => "an array",
        J::Object(_) => "an object",
    }
}

/// Whether a JSON value fits a column of type `dt` without conversion: the
/// problem otherwise. Null fits any type (nullability is checked later).
fn check_json(dt: &DataType, v: &serde_json::Value) -> Result<(), Misfit> {
    use serde_json::Value as J;
    if v.is_null() {
        return Ok(());
    }
    let expected = |what: &str| expected_json(v, what);
    let int = |min: i64, max: i64| check_int(v, min, max);
    let uint = |max: u64| check_uint(v, max);
    let item = |i: usize, item: &J, dt: &DataType| {
        check_json(dt, item).map_err(|p| Misfit::Item(i, Box::new(p)))
    };
    match dt {
        DataType::Boolean => match v.is_boolean() {
            true => Ok(()),
            false => expected("a boolean"),
        },
        DataType::Int8 => int(i8::MIN.into(), i8::MAX.into()),
        DataType::Int16 => int(i16::MIN.into(), i16::MAX.into()),
        DataType::Int32 => int(i32::MIN.into(), i32::MAX.into()),
        DataType::Int64 => int(i64::MIN, i64::MAX),
        DataType::UInt8 => uint(u8::MAX.into()),
        DataType::UInt16 => uint(u16::MAX.into()),
        DataType::UInt32 => uint(u32::MAX.into()),
        DataType::UInt64 => uint(u64::MAX),
        DataType::Float16 | DataType::Float32 | DataType::Float64 => match v.as_f64() {
            Some(f) if matches!(dt, DataType::Float32) && !(f as f32).is_finite() => {
                Err(Misfit::NotFloat32(f))
            }
            Some(_) => Ok(()),
            None => expected("a number"),
        },
        DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View | DataType::Dictionary(..) => {
            match v.is_string() {
                true => Ok(()),
                false => expected("a string"),
            }
        }
        DataType::Date32 => match v.as_str() {
            Some(s) if chrono::NaiveDate::parse_from_str(s, "%Y-%m-%d").is_ok() => Ok(()),
            Some(s) => Err(Misfit::NotDate(s.to_string())),
            None => expected("a date string (YYYY-MM-DD)"),
        },
        DataType::Timestamp(..) => match v.as_str() {
            Some(s)
                if chrono::DateTime::parse_from_rfc3339(s).is_ok()
                    || chrono::NaiveDateTime::parse_from_str(s, "%Y-%m-%dT%H:%M:%S%.f").is_ok() =>
            {
                Ok(())
            }
            Some(s) => Err(Misfit::NotTimestamp(s.to_string())),
            None => expected("a timestamp string (RFC 3339)"),
        },
        DataType::List(f) | DataType::LargeList(f) => match v.as_array() {
            Some(items) => items
                .iter()
                .enumerate()
                .try_for_each(|(i, it)| item(i, it, f.data_type())),
            None => expected("an array"),
        },
        DataType::FixedSizeList(f, n) => match v.as_array() {
            Some(items) if items.len() != *n as usize => Err(Misfit::Length {
                expected: *n,
                got: items.len(),
            }),
            Some(items) => items.iter().enumerate().try_for_each(|(i, it)| {
                if it.is_null() {
                    return Err(Misfit::NullItem(i));
                }
                item(i, it, f.data_type())
            }),
            None => expected(&format!("an array of {n} values")),
        },
        DataType::Struct(fields) => match v.as_object() {
            Some(o) => check_struct(fields, o),
            None => expected("an object"),
        },
        _ => Ok(()),
    }
}

/// `v` is not `what` a column of its type takes.
fn expected_json(v: &serde_json::Value, what: &str) -> Result<(), Misfit> {
    Err(Misfit::Expected {
        expected: what.to_string(),
        value: v.clone(),
    })
}

/// A number outside the column type's `range`.
fn out_of_range(value: String, range: String) -> Result<(), Misfit> {
    Err(Misfit::OutOfRange { value, range })
}

/// Whether `v` is an integer in `min..=max`.
fn check_int(v: &serde_json::Value, min: i64, max: i64) -> Result<(), Misfit> {
    match v.as_i64() {
        Some(i) if (min..=max).contains(&i) => Ok(()),
        Some(i) => out_of_range(i.to_string(), format!("{min}..={max}")),
        None => match v.as_u64() {
            Some(u) => out_of_range(u.to_string(), format!("{min}..={max}")),
            None => expected_json(v, "an integer"),
        },
    }
}

/// Whether `v` is an integer in `0..=max`.
fn check_uint(v: &serde_json::Value, max: u64) -> Result<(), Misfit> {
    match v.as_u64() {
        Some(u) if u <= max => Ok(()),
        Some(u) => out_of_range(u.to_string(), format!("0..={max}")),
        None => match v.as_i64() {
            Some(i) => out_of_range(i.to_string(), format!("0..={max}")),
            None => expected_json(v, "a non-negative integer"),
        },
    }
}

/// Whether the JSON object `o` fits a struct of `fields`: known members,
/// each fitting its field, the non-nullable ones given.
fn check_struct(
    fields: &arrow_schema::Fields,
    o: &serde_json::Map<String, serde_json::Value>,
) -> Result<(), Misfit> {
    use serde_json::Value as J;
    if let Some(unknown) = o.keys().find(|k| fields.find(k).is_none()) {
        return Err(Misfit::UnknownField(unknown.clone()));
    }
    fields.iter().try_for_each(|f| match o.get(f.name()) {
        // A non-nullable field of a struct that is given must be
        // given too (Arrow's reader would refuse it unnamed).
        None | Some(J::Null) if !f.is_nullable() => Err(Misfit::Required(f.name().clone())),
        Some(it) => {
            check_json(f.data_type(), it).map_err(|p| Misfit::Field(f.name().clone(), Box::new(p)))
        }
        None => Ok(()),
    })
}

/// A batch as it is written to JSON: binary columns as base64 strings (the
/// form [`rows_from_json`] reads), everything else unchanged. The CLI's JSON
/// Lines and the server's JSON both write records through this.
pub fn json_ready(batch: &RecordBatch) -> Result<RecordBatch, arrow_schema::ArrowError> {
    let schema = batch.schema();
    if !schema
        .fields()
        .iter()
        .any(|f| matches!(f.data_type(), DataType::Binary | DataType::LargeBinary))
    {
        return Ok(batch.clone());
    }
    let mut fields = Vec::new();
    let mut columns: Vec<ArrayRef> = Vec::new();
    for (field, column) in schema.fields().iter().zip(batch.columns()) {
        let encoded: Option<ArrayRef> = match field.data_type() {
            DataType::Binary => column
                .as_any()
                .downcast_ref::<arrow_array::BinaryArray>()
                .map(|a| {
                    Arc::new(
                        a.iter()
                            .map(|v| v.map(|b| B64.encode(b)))
                            .collect::<arrow_array::StringArray>(),
                    ) as ArrayRef
                }),
            DataType::LargeBinary => column
                .as_any()
                .downcast_ref::<arrow_array::LargeBinaryArray>()
                .map(|a| {
                    Arc::new(
                        a.iter()
                            .map(|v| v.map(|b| B64.encode(b)))
                            .collect::<arrow_array::LargeStringArray>(),
                    ) as ArrayRef
                }),
            _ => None,
        };
        match encoded {
            Some(c) => {
                fields.push(Field::new(field.name(), c.data_type().clone(), true));
                columns.push(c);
            }
            None => {
                fields.push(field.as_ref().clone());
                columns.push(column.clone());
            }
        }
    }
    RecordBatch::try_new(Arc::new(Schema::new(fields)), columns)
}

/// Rows the plugin sees in one call at most: a larger write is prepared in
/// parts, so that guest memory, the IPC copies and a transform's output stay
/// bounded whatever the record count.
pub const PREPARE_ROWS: usize = 8192;

/// Bytes of declared fixed-width data in one part at most (a wide vector
/// column makes parts smaller).
const PREPARE_BYTES: u128 = 16 << 20;

/// Rows of one part for `plugin`'s declared schema.
fn part_rows(plugin: &LoadedPlugin) -> usize {
    let width: u128 = plugin
        .declaration()
        .schema
        .fields()
        .iter()
        .map(|f| crate::spec::fixed_width_bytes(f.data_type()))
        .sum();
    let rows = PREPARE_BYTES / width.max(1);
    usize::try_from(rows)
        .unwrap_or(usize::MAX)
        .clamp(1, PREPARE_ROWS)
}

/// Row errors kept over all parts of one write (as one call keeps).
const KEPT_ROW_ERRORS: usize = 1000;

/// The plugin's part of every write: match the batch to the input schema
/// ([`to_input`]), then the plugin's `validate` and `transform` in one
/// boundary crossing ([`LoadedPlugin::prepare`]) per part of at most
/// [`PREPARE_ROWS`] rows (fewer for wide rows). The result is what the engine writes (all parts,
/// or nothing: rows refused in any part refuse the write, with every part's
/// row errors numbered in the whole batch); [`crate::NamedStore`] is the
/// only caller that writes it.
pub async fn prepare(
    plugin: &LoadedPlugin,
    batch: &RecordBatch,
    now_micros: i64,
) -> Result<RecordBatch, PipelineError> {
    let input = to_input(plugin, batch)?;
    let rows = input.num_rows();
    let step = part_rows(plugin);
    if rows <= step {
        return Ok(plugin.prepare_async(input, now_micros).await?);
    }
    let mut parts = Vec::with_capacity(rows.div_ceil(step));
    let mut refused: Option<(String, Vec<crate::RowError>, usize)> = None;
    for start in (0..rows).step_by(step) {
        let part = input.slice(start, step.min(rows - start));
        match plugin.prepare_async(part, now_micros).await {
            Ok(prepared) => parts.push(prepared),
            Err(PluginError::Rejected {
                plugin,
                errors,
                total,
            }) => {
                let (_, kept, all) = refused.get_or_insert_with(|| (plugin, Vec::new(), 0));
                *all += total;
                let offset = u32::try_from(start).unwrap_or(u32::MAX);
                for mut e in errors {
                    if kept.len() >= KEPT_ROW_ERRORS {
                        break;
                    }
                    e.row = e.row.saturating_add(offset);
                    kept.push(e);
                }
            }
            Err(e) => return Err(e.into()),
        }
    }
    if let Some((plugin, errors, total)) = refused {
        return Err(PluginError::Rejected {
            plugin,
            errors,
            total,
        }
        .into());
    }
    let schema = parts[0].schema();
    arrow_select::concat::concat_batches(&schema, &parts).map_err(|e| {
        PipelineError::from(PluginError::MalformedOutput {
            plugin: plugin.declaration().name.clone(),
            message: format!("the prepared parts do not fit together: {e}"),
        })
    })
}

/// Parse JSON refusing an object that names a member twice (at any depth)
/// instead of keeping the last, in one pass.
pub(crate) fn parse_strict(bytes: &[u8]) -> Result<serde_json::Value, serde_json::Error> {
    serde_json::from_slice::<Strict>(bytes).map(|s| s.0)
}

/// A JSON value parsed by [`parse_strict`].
struct Strict(serde_json::Value);

impl<'de> serde::Deserialize<'de> for Strict {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(StrictVisitor).map(Strict)
    }
}

struct StrictVisitor;

impl<'de> serde::de::Visitor<'de> for StrictVisitor {
    type Value = serde_json::Value;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_bool<E>(self, v: bool) -> Result<Self::Value, E> {
        Ok(v.into())
    }

    fn visit_i64<E>(self, v: i64) -> Result<Self::Value, E> {
        Ok(v.into())
    }

    fn visit_u64<E>(self, v: u64) -> Result<Self::Value, E> {
        Ok(v.into())
    }

    fn visit_f64<E>(self, v: f64) -> Result<Self::Value, E> {
        Ok(serde_json::Number::from_f64(v).map_or(serde_json::Value::Null, Into::into))
    }

    fn visit_str<E>(self, v: &str) -> Result<Self::Value, E> {
        Ok(v.into())
    }

    fn visit_string<E>(self, v: String) -> Result<Self::Value, E> {
        Ok(v.into())
    }

    fn visit_unit<E>(self) -> Result<Self::Value, E> {
        Ok(serde_json::Value::Null)
    }

    fn visit_none<E>(self) -> Result<Self::Value, E> {
        Ok(serde_json::Value::Null)
    }

    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        let mut items = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(4096));
        while let Some(Strict(item)) = seq.next_element::<Strict>()? {
            items.push(item);
        }
        Ok(serde_json::Value::Array(items))
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut object = serde_json::Map::new();
        while let Some(key) = map.next_key::<String>()? {
            let Strict(value) = map.next_value::<Strict>()?;
            if object.contains_key(&key) {
                return Err(serde::de::Error::custom(format!(
                    "the member '{key}' is given twice"
                )));
            }
            object.insert(key, value);
        }
        Ok(serde_json::Value::Object(object))
    }
}
