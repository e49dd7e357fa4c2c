//! Checks on a caller's rows that need no read, made on every write path
//! (add, upsert, new versions, delete) after the batch is conformed and
//! before anything is written:
//!
//! - **Key length**: the key, and the secondary key of a schema that declares
//!   one, hold at most [`MAX_KEY_BYTES`] bytes (UTF-8). Keys are copied into
//!   every index page, lookup, tombstone and back-link; an unbounded key
//!   lets one request make every later read of its page slow.
//! - **Engine-managed values**: with supersession, `superseded_by_id` is
//!   written by the engine alone (when a newer version names the record), so
//!   a caller's value is refused, not stored; with lifecycle, the
//!   `lifecycle_status` value [`RESERVED_STATUS`] is refused (a record is
//!   deleted with a tombstone, and a retired record must never pass for a
//!   deleted one). The engine's own rows (tombstones, rewritten predecessors)
//!   are built after these checks.
//! - **Vectors** of declared vector columns: every element finite, the sum
//!   of the squares at most [`MAX_VECTOR_SQUARED_NORM`], and under the cosine
//!   metric not all zero, so the distance between any two vectors the engine
//!   accepts (stored or query) is a finite Float32 under the column's metric.

use arrow_array::cast::AsArray;
use arrow_array::types::Float32Type;
use arrow_array::{Array, RecordBatch};
use arrow_schema::DataType;

use super::Store;
use super::records::{STATUS, SUPERSEDED_BY};
use crate::config::{Metric, VectorColumn};
use crate::error::{BatchProblem, Error, Result};

/// The longest key (and secondary key) a write accepts, in bytes of UTF-8.
pub const MAX_KEY_BYTES: usize = 1024;

/// The `lifecycle_status` value callers may not write (lifecycle capability).
pub const RESERVED_STATUS: &str = "deleted";

/// The largest sum of squares of a vector's elements a write or a query
/// accepts. With both vectors within it, `‖a − b‖² ≤ (‖a‖ + ‖b‖)² ≤ 4e37`
/// and `|a · b| ≤ 1e37`, inside Float32's range (3.4e38) with room for
/// rounding: no distance overflows. Any element of magnitude up to about
/// 3e18 fits alone; real embeddings are many orders of magnitude below.
pub const MAX_VECTOR_SQUARED_NORM: f64 = 1e37;

impl Store {
    /// The checks of the module docs on a conformed batch of new rows; the
    /// problem of the first row that has one (in input order).
    pub(crate) fn check_input(&self, batch: &RecordBatch) -> Result<()> {
        let mut problems: Vec<BatchProblem> = Vec::new();
        let mut keys = vec![self.schemas.key.as_str()];
        keys.extend(self.capabilities.secondary_key.as_deref());
        for column in keys {
            problems.extend(long_key(batch, column));
        }
        if self.capabilities.supersession
            && let Some(values) = batch.column_by_name(SUPERSEDED_BY)
            && let Some(row) = (0..values.len()).find(|&i| values.is_valid(i))
        {
            problems.push(BatchProblem::EngineManaged {
                column: SUPERSEDED_BY.into(),
                row,
                reserved: None,
            });
        }
        if self.capabilities.lifecycle
            && let Some(row) = string_values(batch, STATUS)
                .and_then(|mut v| v.position(|s| s == Some(RESERVED_STATUS)))
        {
            problems.push(BatchProblem::EngineManaged {
                column: STATUS.into(),
                row,
                reserved: Some(RESERVED_STATUS.into()),
            });
        }
        for declared in &self.engine.settings.indexes.vector_columns {
            problems.extend(bad_vector(batch, declared));
        }
        match problems.into_iter().min_by_key(|p| p.row()) {
            Some(problem) => Err(Error::batch(problem)),
            None => Ok(()),
        }
    }
}

/// The key-length check on the keys (or secondary keys: `column`) given to
/// a delete; `row` is the position in `values`. No stored key is longer, and
/// a plain store's delete writes the keys it is given.
pub(crate) fn check_key_lengths(column: &str, values: &[&str]) -> Result<()> {
    match values.iter().position(|v| v.len() > MAX_KEY_BYTES) {
        Some(row) => Err(Error::batch(BatchProblem::KeyTooLong {
            column: column.to_string(),
            row,
            bytes: values[row].len(),
            max: MAX_KEY_BYTES,
        })),
        None => Ok(()),
    }
}

/// A Utf8 column's values (`None` when the batch lacks it).
fn string_values<'a>(
    batch: &'a RecordBatch,
    column: &str,
) -> Option<impl Iterator<Item = Option<&'a str>>> {
    let array = batch.column_by_name(column)?;
    (array.data_type() == &DataType::Utf8).then(|| array.as_string::<i32>().iter())
}

/// The first value of `column` longer than [`MAX_KEY_BYTES`].
fn long_key(batch: &RecordBatch, column: &str) -> Option<BatchProblem> {
    let (row, bytes) = string_values(batch, column)?
        .enumerate()
        .find_map(|(row, v)| {
            v.filter(|v| v.len() > MAX_KEY_BYTES)
                .map(|v| (row, v.len()))
        })?;
    Some(BatchProblem::KeyTooLong {
        column: column.to_string(),
        row,
        bytes,
        max: MAX_KEY_BYTES,
    })
}

/// The first vector of a declared column that [`check_vector`] refuses.
fn bad_vector(batch: &RecordBatch, declared: &VectorColumn) -> Option<BatchProblem> {
    let array = batch.column_by_name(&declared.column)?;
    let vectors = array.as_fixed_size_list_opt()?;
    for row in (0..vectors.len()).filter(|&r| vectors.is_valid(r)) {
        let vector = vectors.value(row);
        let values = vector.as_primitive_opt::<Float32Type>()?;
        // A null element has no value to check (its slot holds anything).
        let valid: Vec<f32>;
        let values: &[f32] = if values.null_count() == 0 {
            values.values()
        } else {
            valid = values.iter().flatten().collect();
            &valid
        };
        if let Err(problem) = check_vector(values, declared.metric) {
            return Some(BatchProblem::BadVector {
                column: declared.column.clone(),
                row,
                problem,
            });
        }
    }
    None
}

/// What is wrong with a vector of a column with `metric`, if anything (see
/// the module docs).
pub(crate) fn check_vector(
    values: &[f32],
    metric: Metric,
) -> std::result::Result<(), VectorProblem> {
    if let Some(element) = values.iter().position(|v| !v.is_finite()) {
        return Err(VectorProblem::NotFinite { element });
    }
    // In f64: the sum of squares of finite f32 values cannot overflow it.
    let squared: f64 = values.iter().map(|&v| f64::from(v) * f64::from(v)).sum();
    if squared > MAX_VECTOR_SQUARED_NORM {
        let largest = values
            .iter()
            .enumerate()
            .max_by(|a, b| a.1.abs().total_cmp(&b.1.abs()))
            .map(|(i, _)| i)
            .unwrap_or(0);
        return Err(VectorProblem::TooLarge { element: largest });
    }
    // Cosine divides by the norm: a zero vector's distances are NaN.
    if metric == Metric::Cosine && squared == 0.0 {
        return Err(VectorProblem::ZeroUnderCosine);
    }
    Ok(())
}

/// Why a vector is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum VectorProblem {
    /// Element `element` is NaN or infinite.
    NotFinite { element: usize },
    /// The sum of the squares passes [`MAX_VECTOR_SQUARED_NORM`]; `element`
    /// is the largest in magnitude.
    TooLarge { element: usize },
    /// Every element is zero, under the cosine metric (no direction, so no
    /// cosine distance).
    ZeroUnderCosine,
}

impl std::fmt::Display for VectorProblem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::NotFinite { element } => write!(f, "element {element} is not a finite number"),
            Self::TooLarge { element } => write!(
                f,
                "the sum of the squares of its elements is more than {MAX_VECTOR_SQUARED_NORM:e} \
                 (element {element} is the largest), so its distances would overflow"
            ),
            Self::ZeroUnderCosine => write!(
                f,
                "every element is zero, and a zero vector has no cosine distance"
            ),
        }
    }
}
