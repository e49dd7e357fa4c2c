//! Fitting caller batches to the stored schema, and stored batches to the
//! caller's logical schema. Everything is matched by column name, never by
//! position.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use arrow_array::{Array, ArrayRef, RecordBatch, StringArray, make_array, new_null_array};
use arrow_schema::{DataType, Field, Schema, SchemaRef};

use crate::error::{BatchProblem, Error, Result};

/// The schemas of an open store.
#[derive(Debug, Clone)]
pub(crate) struct Schemas {
    /// What callers write and read: the config's schema, or the dataset's.
    pub logical: SchemaRef,
    /// What the dataset stores (may lack columns the logical schema has, for a
    /// dataset created by an older version).
    pub stored: SchemaRef,
    /// The key column.
    pub key: String,
}

impl Schemas {
    /// Columns of the logical schema that the dataset stores, in logical order.
    pub fn readable_columns(&self) -> Vec<String> {
        self.logical
            .fields()
            .iter()
            .filter(|f| self.stored.field_with_name(f.name()).is_ok())
            .map(|f| f.name().clone())
            .collect()
    }

    /// Check a caller's batch and turn it into a batch of the stored schema.
    ///
    /// Order: empty batch, duplicate columns, unknown columns, types, missing
    /// non-nullable columns, null and empty keys, nulls in non-nullable columns,
    /// values in columns the dataset lacks. The first problem is reported with
    /// its column and row; nothing is written from a rejected batch.
    pub fn conform_for_write(&self, batch: &RecordBatch) -> Result<RecordBatch> {
        if batch.num_rows() == 0 {
            return Err(Error::batch(BatchProblem::EmptyBatch));
        }
        let input = batch.schema();
        let mut seen = HashSet::new();
        for field in input.fields() {
            if !seen.insert(field.name().as_str()) {
                return Err(Error::batch(BatchProblem::DuplicateColumn {
                    column: field.name().clone(),
                }));
            }
            let Ok(target) = self.logical.field_with_name(field.name()) else {
                return Err(Error::batch(BatchProblem::UnknownColumn {
                    column: field.name().clone(),
                }));
            };
            if !field.data_type().equals_datatype(target.data_type()) {
                return Err(Error::batch(BatchProblem::TypeMismatch {
                    column: field.name().clone(),
                    expected: target.data_type().to_string(),
                    found: field.data_type().to_string(),
                }));
            }
        }

        let rows = batch.num_rows();
        let mut by_name: HashMap<&str, ArrayRef> = HashMap::new();
        for target in self.logical.fields() {
            let name = target.name();
            let given = batch.column_by_name(name);
            let Ok(stored) = self.stored.field_with_name(name) else {
                // A column this older dataset does not have: only nulls may be written.
                if let Some(array) = given
                    && let Some(row) = first_valid(array.as_ref())
                {
                    return Err(Error::batch(BatchProblem::ColumnNotInDataset {
                        column: name.clone(),
                        row,
                    }));
                }
                continue;
            };
            let array = match given {
                Some(array) => retype(array, stored.data_type())?,
                None if target.is_nullable() && stored.is_nullable() => {
                    new_null_array(stored.data_type(), rows)
                }
                None => {
                    return Err(Error::batch(BatchProblem::MissingColumn {
                        column: name.clone(),
                    }));
                }
            };
            if name == &self.key {
                check_key(name, array.as_ref())?;
            } else if (!target.is_nullable() || !stored.is_nullable())
                && let Some(row) = first_null(array.as_ref())
            {
                return Err(Error::batch(BatchProblem::NullValue {
                    column: name.clone(),
                    row,
                }));
            }
            by_name.insert(name.as_str(), array);
        }
        // In stored order. Columns the dataset stores that the logical schema
        // does not know (a dataset written by a newer version) are written as
        // nulls when nullable.
        let mut out_columns = Vec::with_capacity(self.stored.fields().len());
        for stored in self.stored.fields() {
            match by_name.remove(stored.name().as_str()) {
                Some(array) => out_columns.push(array),
                None if stored.is_nullable() => {
                    out_columns.push(new_null_array(stored.data_type(), rows))
                }
                None => {
                    return Err(Error::batch(BatchProblem::MissingColumn {
                        column: stored.name().clone(),
                    }));
                }
            }
        }
        Ok(RecordBatch::try_new(self.stored.clone(), out_columns)?)
    }

    /// Turn a batch read from the dataset into the logical schema (restricted to
    /// `projection` when given): columns the dataset lacks become nulls.
    pub fn conform_for_read(
        &self,
        batch: &RecordBatch,
        projection: Option<&[String]>,
    ) -> Result<RecordBatch> {
        let fields: Vec<Field> = match projection {
            Some(names) => names
                .iter()
                .map(|n| {
                    self.logical
                        .field_with_name(n)
                        .cloned()
                        .map_err(|_| Error::invalid_argument(format!("unknown column '{n}'")))
                })
                .collect::<Result<_>>()?,
            None => self
                .logical
                .fields()
                .iter()
                .map(|f| f.as_ref().clone())
                .collect(),
        };
        let rows = batch.num_rows();
        let mut columns = Vec::with_capacity(fields.len());
        for field in &fields {
            let array = match batch.column_by_name(field.name()) {
                Some(array) => retype(array, field.data_type())?,
                None => new_null_array(field.data_type(), rows),
            };
            columns.push(array);
        }
        // Read-back fields are nullable when the dataset may lack them; keep the
        // declared nullability otherwise.
        let out_fields: Vec<Field> = fields
            .iter()
            .map(|f| {
                let stored_nullable = self
                    .stored
                    .field_with_name(f.name())
                    .map(|s| s.is_nullable())
                    .unwrap_or(true);
                f.clone().with_nullable(f.is_nullable() || stored_nullable)
            })
            .collect();
        let schema = Arc::new(Schema::new_with_metadata(
            out_fields,
            self.logical.metadata().clone(),
        ));
        Ok(RecordBatch::try_new_with_options(
            schema,
            columns,
            &arrow_array::RecordBatchOptions::new().with_row_count(Some(rows)),
        )?)
    }
}

/// The array re-labelled with `target` when the types agree but nested field
/// names or metadata differ (e.g. a list item named `element` vs `item`).
fn retype(array: &ArrayRef, target: &DataType) -> Result<ArrayRef> {
    if array.data_type() == target {
        return Ok(array.clone());
    }
    let data = array
        .to_data()
        .into_builder()
        .data_type(target.clone())
        .build()?;
    Ok(make_array(data))
}

fn check_key(column: &str, array: &dyn Array) -> Result<()> {
    if let Some(row) = first_null(array) {
        return Err(Error::batch(BatchProblem::NullKey {
            column: column.to_string(),
            row,
        }));
    }
    let Some(keys) = array.as_any().downcast_ref::<StringArray>() else {
        return Err(Error::batch(BatchProblem::TypeMismatch {
            column: column.to_string(),
            expected: DataType::Utf8.to_string(),
            found: array.data_type().to_string(),
        }));
    };
    if let Some(row) = keys.iter().position(|k| k == Some("")) {
        return Err(Error::batch(BatchProblem::EmptyKey {
            column: column.to_string(),
            row,
        }));
    }
    Ok(())
}

fn first_null(array: &dyn Array) -> Option<usize> {
    if array.null_count() == 0 {
        return None;
    }
    (0..array.len()).find(|&i| array.is_null(i))
}

fn first_valid(array: &dyn Array) -> Option<usize> {
    if array.null_count() == array.len() {
        return None;
    }
    (0..array.len()).find(|&i| array.is_valid(i))
}
