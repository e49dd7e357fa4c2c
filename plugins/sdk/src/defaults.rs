//! Helpers for `transform`: fill a column's nulls with a default, and build
//! the derived columns. Absent columns count as all-null.

use std::sync::Arc;

use arrow_array::builder::StringDictionaryBuilder;
use arrow_array::cast::AsArray;
use arrow_array::types::{Int8Type, Int32Type, TimestampMicrosecondType};
use arrow_array::{
    Array, ArrayRef, Int32Array, RecordBatch, RecordBatchOptions, StringArray,
    TimestampMicrosecondArray, new_null_array,
};
use arrow_schema::{Field, Schema, SchemaRef};

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

/// A Boolean column with nulls replaced by `default`.
pub fn boolean_or(given: Option<&ArrayRef>, rows: usize, default: bool) -> ArrayRef {
    let given = given.map(|c| c.as_boolean());
    Arc::new(arrow_array::BooleanArray::from_iter((0..rows).map(|i| {
        Some(
            given
                .filter(|g| g.is_valid(i))
                .map(|g| g.value(i))
                .unwrap_or(default),
        )
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

/// The derived columns of a transform: `fill` is asked for each declared
/// column (with the input's column, if given) and returns `Some` for the
/// columns it fills or derives. The result holds those columns only, in
/// declared order (marked nullable: the host checks nullability on the
/// assembled batch and names the row); every other column is kept from the
/// input by the host.
pub fn derive(
    declared: SchemaRef,
    input: &RecordBatch,
    mut fill: impl FnMut(&str, Option<&ArrayRef>) -> Result<Option<ArrayRef>, RowErrors>,
) -> Result<RecordBatch, RowErrors> {
    let mut fields = Vec::new();
    let mut columns = Vec::new();
    for field in declared.fields() {
        if let Some(column) = fill(field.name(), input.column_by_name(field.name()))? {
            // The column's own type: a column of another type than declared
            // goes out as it is, and the host refuses the output as the
            // plugin's fault (naming the column), not as the records'.
            fields.push(Field::new(field.name(), column.data_type().clone(), true));
            columns.push(column);
        }
    }
    RecordBatch::try_new_with_options(
        Arc::new(Schema::new(fields)),
        columns,
        &RecordBatchOptions::new().with_row_count(Some(input.num_rows())),
    )
    .map_err(|e| {
        let mut errors = RowErrors::default();
        errors.push(
            0,
            None,
            "schema",
            format!("a derived column does not fit the declared schema: {e}"),
        );
        errors
    })
}

/// What the host does with a transform's output: the declared batch, each
/// column taken from `derived` when there, else from `input`, else nulls.
/// For a plugin's own tests. Fails when a non-nullable column has nulls.
pub fn apply(
    declared: SchemaRef,
    input: &RecordBatch,
    derived: &RecordBatch,
) -> Result<RecordBatch, arrow_schema::ArrowError> {
    let rows = input.num_rows();
    let columns = declared
        .fields()
        .iter()
        .map(|f| {
            derived
                .column_by_name(f.name())
                .or_else(|| input.column_by_name(f.name()))
                .cloned()
                .unwrap_or_else(|| new_null_array(f.data_type(), rows))
        })
        .collect();
    RecordBatch::try_new(declared, columns)
}

#[cfg(test)]
mod tests {
    use arrow_array::Int32Array;
    use arrow_schema::DataType;

    use super::*;

    /// A derived column of another type than declared goes out as it is,
    /// for the host to refuse as the plugin's fault — not as a row error
    /// blaming the records.
    #[test]
    fn a_derived_column_of_the_wrong_type_is_not_a_row_error() {
        let declared = Arc::new(Schema::new(vec![Field::new(
            "paid",
            DataType::Boolean,
            false,
        )]));
        let input = RecordBatch::try_new_with_options(
            Arc::new(Schema::empty()),
            vec![],
            &RecordBatchOptions::new().with_row_count(Some(2)),
        )
        .unwrap();
        let out = derive(declared, &input, |_, _| {
            Ok(Some(Arc::new(Int32Array::from(vec![0, 1])) as ArrayRef))
        })
        .unwrap();
        assert_eq!(out.schema().field(0).data_type(), &DataType::Int32);
        let filled = boolean_or(None, 2, true);
        assert_eq!(filled.as_boolean().true_count(), 2);
    }
}
