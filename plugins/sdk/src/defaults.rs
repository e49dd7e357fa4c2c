//! Helpers for `transform`: fill a column's nulls with a default, and build
//! the declared batch. Absent columns count as all-null.

use std::sync::Arc;

use arrow_array::builder::StringDictionaryBuilder;
use arrow_array::cast::AsArray;
use arrow_array::types::{Int8Type, Int32Type, TimestampMicrosecondType};
use arrow_array::{
    Array, ArrayRef, Int32Array, RecordBatch, StringArray, TimestampMicrosecondArray,
    new_null_array,
};
use arrow_schema::SchemaRef;

use crate::RowErrors;

/// A Utf8 column with nulls replaced by `default`.
pub fn utf8_or(given: Option<&ArrayRef>, rows: usize, default: &str) -> ArrayRef {
    let given = given.map(|c| c.as_string::<i32>());
    Arc::new(StringArray::from_iter_values((0..rows).map(
        |i| match given.filter(|g| g.is_valid(i)) {
            Some(g) => g.value(i),
            None => default,
        },
    )))
}

/// A Utf8 column with nulls replaced by the same row of `fallback`.
pub fn utf8_or_column(
    given: Option<&ArrayRef>,
    fallback: Option<&ArrayRef>,
    rows: usize,
) -> ArrayRef {
    let given = given.map(|c| c.as_string::<i32>());
    let fallback = fallback.map(|c| c.as_string::<i32>());
    Arc::new(StringArray::from_iter((0..rows).map(|i| {
        given
            .filter(|g| g.is_valid(i))
            .or(fallback.filter(|f| f.is_valid(i)))
            .map(|c| c.value(i))
    })))
}

/// An Int32 column with nulls replaced by `default`.
pub fn int32_or(given: Option<&ArrayRef>, rows: usize, default: i32) -> ArrayRef {
    let given = given.map(|c| c.as_primitive::<Int32Type>());
    Arc::new(Int32Array::from_iter_values((0..rows).map(|i| {
        given
            .filter(|g| g.is_valid(i))
            .map(|g| g.value(i))
            .unwrap_or(default)
    })))
}

/// A Timestamp(µs) column with nulls replaced by `now`, in `timezone`.
pub fn timestamp_us_or(
    given: Option<&ArrayRef>,
    rows: usize,
    now: i64,
    timezone: Option<&str>,
) -> ArrayRef {
    let given = given.map(|c| c.as_primitive::<TimestampMicrosecondType>());
    let values = TimestampMicrosecondArray::from_iter_values((0..rows).map(|i| {
        given
            .filter(|g| g.is_valid(i))
            .map(|g| g.value(i))
            .unwrap_or(now)
    }));
    match timezone {
        Some(tz) => Arc::new(values.with_timezone(tz)),
        None => Arc::new(values),
    }
}

/// A Dictionary(Int8, Utf8) column with nulls replaced by `default`.
pub fn dictionary_or(
    given: Option<&ArrayRef>,
    rows: usize,
    default: &str,
    column: &str,
) -> Result<ArrayRef, RowErrors> {
    let given = given.map(|c| c.as_dictionary::<Int8Type>());
    let mut builder = StringDictionaryBuilder::<Int8Type>::new();
    for i in 0..rows {
        let value = given.filter(|g| g.is_valid(i)).map(|g| {
            g.values()
                .as_string::<i32>()
                .value(g.keys().value(i) as usize)
        });
        builder.append(value.unwrap_or(default)).map_err(|e| {
            let mut errors = RowErrors::default();
            errors.push(
                i,
                Some(column),
                "dictionary",
                format!("too many distinct values: {e}"),
            );
            errors
        })?;
    }
    Ok(Arc::new(builder.finish()))
}

/// Build the declared batch: `fill` gives a column (or `None` to take the
/// input's, or nulls when the input lacks it).
pub fn assemble(
    declared: SchemaRef,
    input: &RecordBatch,
    mut fill: impl FnMut(&str, Option<&ArrayRef>) -> Result<Option<ArrayRef>, RowErrors>,
) -> Result<RecordBatch, RowErrors> {
    let rows = input.num_rows();
    let mut columns = Vec::with_capacity(declared.fields().len());
    for field in declared.fields() {
        let given = input.column_by_name(field.name());
        let column = match fill(field.name(), given)? {
            Some(c) => c,
            None => given
                .cloned()
                .unwrap_or_else(|| new_null_array(field.data_type(), rows)),
        };
        columns.push(column);
    }
    RecordBatch::try_new(declared, columns).map_err(|e| {
        let mut errors = RowErrors::default();
        errors.push(
            0,
            None,
            "schema",
            format!("the batch does not fit the declared schema: {e}"),
        );
        errors
    })
}
