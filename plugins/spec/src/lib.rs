//! The built-in generic schema plugin: stores declared by a `SchemaSpec` file
//! (JSON, see `lance-context-spec`) instead of code. The spec arrives as the
//! creation parameter `spec` (its JSON text); `describe` checks it with the
//! same rules as the host and declares its schema, key, vectors, blob columns,
//! secondary key and capabilities.
//!
//! validate, per row and column: non-null columns present (`required`;
//! not for a column with a default), and each column's rules — `non_empty`,
//! `one_of`, `max_length` for strings, `min` / `max` for numbers (errors
//! named by the rule). Vector columns: every element finite (`finite`), and
//! a non-zero vector where the metric is cosine (`non_zero`). Types are the
//! host's to check (input matched by name and type before the plugin runs).
//!
//! transform (declared only when a column has a `default`): fills each such
//! column where the record leaves it absent or null — `"now"` with the host's
//! clock for a timestamp, else the constant.

use lance_context_plugin::arrow_array::cast::AsArray;
use lance_context_plugin::arrow_array::types::{
    Float32Type, Float64Type, Int8Type, Int16Type, Int32Type, Int64Type, UInt8Type, UInt16Type,
    UInt32Type, UInt64Type,
};
use lance_context_plugin::*;
use lance_context_spec::{KeyRule, SchemaSpec};

/// Plugin version.
pub const VERSION: &str = "0.1.0";

/// The spec from the creation parameters.
pub fn spec_from(params: &Params) -> Result<SchemaSpec, InvalidParams> {
    let mut spec = None;
    for (name, value) in params {
        match name.as_str() {
            "spec" => spec = Some(value),
            other => {
                return Err(format!(
                    "unknown parameter '{other}' (the spec plugin takes 'spec', the SchemaSpec as JSON)"
                ).into());
            }
        }
    }
    let text = spec.ok_or("the parameter 'spec' (the SchemaSpec as JSON) is required")?;
    SchemaSpec::from_json(text).map_err(|e| InvalidParams::new(e.to_string()))
}

/// The spec plugin.
pub struct SpecPlugin;

impl Plugin for SpecPlugin {
    fn describe(params: &Params) -> Result<Declaration, InvalidParams> {
        let spec = spec_from(params)?;
        let schema = spec.check(KeyRule::IdOnly).map_err(|e| e.to_string())?;
        if let Some(i) = spec.queries.iter().position(|q| q.reduce) {
            return Err(format!(
                "queries[{i}].reduce: a declarative spec cannot reduce (only a compiled plugin can)"
            )
            .into());
        }
        let mut d =
            Declaration::new(&spec.name, VERSION, schema.as_ref().clone()).with_key(&spec.key);
        for b in &spec.blob_columns {
            d = d.with_blob(b);
        }
        for v in &spec.vectors {
            d = d.with_vector(&v.column, v.dimension as u32, v.metric);
        }
        for t in &spec.text_columns {
            d = d.with_text_column(lance_context_plugin::TextColumn {
                name: t.column.clone(),
                tokenizer: t.tokenizer.clone(),
                language: t.language.clone(),
                lower_case: t.lower_case,
                stem: t.stem,
                remove_stop_words: t.remove_stop_words,
                ascii_folding: t.ascii_folding,
                max_token_length: t.max_token_length,
            });
        }
        d.secondary_key = spec.secondary_key.clone();
        d.queries = spec
            .queries
            .iter()
            .map(|q| NamedQuery {
                name: q.name.clone(),
                description: q.description.clone(),
                params: q.params.clone(),
                filter: q.filter.clone(),
                order_by: q.order_by.clone(),
                reduce: false,
            })
            .collect();
        if spec.columns.iter().any(|c| c.rules.default.is_some()) {
            d = d.with_transform();
        }
        d.capabilities = Capabilities {
            tombstones: spec.has(Capability::Tombstones),
            supersession: spec.has(Capability::Supersession),
            lifecycle: spec.has(Capability::Lifecycle),
            unique_keys: spec.has(Capability::UniqueKeys),
        };
        Ok(d)
    }

    fn validate(batch: &RecordBatch, call: &CallInfo, errors: &mut RowErrors) {
        match spec_from(&call.params) {
            Ok(spec) => check(&spec, batch, errors),
            // describe refused these parameters already; not reached for a
            // loaded plugin.
            Err(refused) => errors.push(0, None, "params", refused.to_string()),
        }
    }

    fn transform(batch: RecordBatch, call: &CallInfo) -> Result<RecordBatch, RowErrors> {
        let spec = spec_from(&call.params)?;
        let rows = batch.num_rows();
        let declared = call.schema::<Self>()?;
        defaults::derive(declared.clone(), &batch, |name, given| {
            let default = spec
                .columns
                .iter()
                .find(|c| c.name == name)
                .and_then(|c| c.rules.default.as_ref());
            match (default, declared.field_with_name(name)) {
                (Some(default), Ok(field)) => {
                    let absent;
                    let given = match given {
                        Some(g) => g,
                        None => {
                            absent = arrow_array::new_null_array(field.data_type(), rows);
                            &absent
                        }
                    };
                    fill(name, given, rows, default, call.now_micros).map(Some)
                }
                _ => Ok(None),
            }
        })
    }
}

/// `given` (of the column's declared type) with its nulls replaced by
/// `default`.
fn fill(
    column: &str,
    given: &ArrayRef,
    rows: usize,
    default: &serde_json::Value,
    now_micros: i64,
) -> Result<ArrayRef, RowErrors> {
    use std::sync::Arc;

    use lance_context_plugin::arrow_array::types::{
        ArrowDictionaryKeyType, TimestampMicrosecondType, TimestampMillisecondType,
        TimestampNanosecondType, TimestampSecondType,
    };
    use lance_context_plugin::arrow_array::{
        BooleanArray, LargeStringArray, PrimitiveArray, StringArray,
        builder::StringDictionaryBuilder,
    };
    let t = given.data_type().clone();
    let bad = || unfillable(column, &format!("the default {default} does not fit {t}"));
    macro_rules! constant {
        ($arrow:ty, $v:expr) => {
            Arc::new(PrimitiveArray::<$arrow>::from_value($v, rows)) as ArrayRef
        };
    }
    let int = || default.as_i64().ok_or_else(bad);
    fn dictionary<K: ArrowDictionaryKeyType>(
        given: &ArrayRef,
        rows: usize,
        value: &str,
        column: &str,
    ) -> Result<ArrayRef, RowErrors> {
        use lance_context_plugin::arrow_array::ArrayAccessor;
        let given = given.as_dictionary::<K>();
        let strings = given
            .downcast_dict::<StringArray>()
            .ok_or_else(|| unfillable(column, "the dictionary's values are not Utf8"))?;
        let mut builder = StringDictionaryBuilder::<K>::new();
        for row in 0..rows {
            let v = match given.is_valid(row) {
                true => strings.value(row),
                false => value,
            };
            builder
                .append(v)
                .map_err(|e| unfillable(column, &e.to_string()))?;
        }
        Ok(Arc::new(builder.finish()))
    }
    let fallback: ArrayRef = match (&t, default) {
        (DataType::Timestamp(unit, tz), _) => {
            let array: ArrayRef = match unit {
                TimeUnit::Second => constant!(TimestampSecondType, now_micros / 1_000_000),
                TimeUnit::Millisecond => constant!(TimestampMillisecondType, now_micros / 1_000),
                TimeUnit::Microsecond => constant!(TimestampMicrosecondType, now_micros),
                TimeUnit::Nanosecond => {
                    constant!(TimestampNanosecondType, now_micros.saturating_mul(1_000))
                }
            };
            match tz {
                // Same values, the column's zone.
                Some(_) => lance_context_plugin::arrow_array::make_array(
                    array
                        .to_data()
                        .into_builder()
                        .data_type(t.clone())
                        .build()
                        .map_err(|e| unfillable(column, &e.to_string()))?,
                ),
                None => array,
            }
        }
        (DataType::Utf8, serde_json::Value::String(v)) => {
            Arc::new(StringArray::from_iter_values(std::iter::repeat_n(v, rows)))
        }
        (DataType::LargeUtf8, serde_json::Value::String(v)) => Arc::new(
            LargeStringArray::from_iter_values(std::iter::repeat_n(v, rows)),
        ),
        (DataType::Dictionary(k, _), serde_json::Value::String(v)) => {
            use lance_context_plugin::arrow_array::types::{Int8Type, Int16Type, Int32Type};
            return match k.as_ref() {
                DataType::Int8 => dictionary::<Int8Type>(given, rows, v, column),
                DataType::Int16 => dictionary::<Int16Type>(given, rows, v, column),
                _ => dictionary::<Int32Type>(given, rows, v, column),
            };
        }
        (DataType::Boolean, serde_json::Value::Bool(b)) => {
            Arc::new(BooleanArray::from(vec![*b; rows]))
        }
        (DataType::Float32, _) => constant!(Float32Type, default.as_f64().ok_or_else(bad)? as f32),
        (DataType::Float64, _) => constant!(Float64Type, default.as_f64().ok_or_else(bad)?),
        (DataType::Int8, _) => constant!(Int8Type, i8::try_from(int()?).map_err(|_| bad())?),
        (DataType::Int16, _) => constant!(Int16Type, i16::try_from(int()?).map_err(|_| bad())?),
        (DataType::Int32, _) => constant!(Int32Type, i32::try_from(int()?).map_err(|_| bad())?),
        (DataType::Int64, _) => constant!(Int64Type, int()?),
        (DataType::UInt8, _) => constant!(UInt8Type, u8::try_from(int()?).map_err(|_| bad())?),
        (DataType::UInt16, _) => constant!(UInt16Type, u16::try_from(int()?).map_err(|_| bad())?),
        (DataType::UInt32, _) => constant!(UInt32Type, u32::try_from(int()?).map_err(|_| bad())?),
        (DataType::UInt64, _) => constant!(UInt64Type, default.as_u64().ok_or_else(bad)?),
        _ => return Err(bad()),
    };
    let keep = BooleanArray::from_iter((0..rows).map(|row| Some(given.is_valid(row))));
    lance_context_plugin::arrow_select::zip::zip(&keep, given, &fallback)
        .map_err(|e| unfillable(column, &e.to_string()))
}

fn unfillable(column: &str, why: &str) -> RowErrors {
    let mut errors = RowErrors::default();
    errors.push(
        0,
        Some(column),
        "default",
        format!("cannot fill {column}: {why}"),
    );
    errors
}

/// Check a batch against a spec's nullability and value rules.
pub fn check(spec: &SchemaSpec, batch: &RecordBatch, errors: &mut RowErrors) {
    for column in &spec.columns {
        let array = batch.column_by_name(&column.name);
        if !column.nullable && column.rules.default.is_none() {
            match array {
                None => {
                    for row in 0..batch.num_rows() {
                        errors.push(
                            row,
                            Some(&column.name),
                            "required",
                            format!("{} is required", column.name),
                        );
                    }
                }
                Some(a) => {
                    for row in (0..a.len()).filter(|&r| a.is_null(r)) {
                        errors.push(
                            row,
                            Some(&column.name),
                            "required",
                            format!("{} is required", column.name),
                        );
                    }
                }
            }
        }
        let Some(array) = array else { continue };
        let rules = &column.rules;
        let name = column.name.as_str();
        match array.data_type() {
            DataType::Utf8 | DataType::LargeUtf8 => {
                let values: Vec<Option<&str>> = match array.data_type() {
                    DataType::Utf8 => array.as_string::<i32>().iter().collect(),
                    _ => array.as_string::<i64>().iter().collect(),
                };
                for (row, v) in values.into_iter().enumerate() {
                    let Some(v) = v else { continue };
                    if rules.non_empty && v.is_empty() {
                        errors.push(
                            row,
                            Some(name),
                            "non_empty",
                            format!("{name} must not be empty"),
                        );
                    }
                    if let Some(max) = rules.max_length
                        && v.chars().count() as u64 > max
                    {
                        errors.push(
                            row,
                            Some(name),
                            "max_length",
                            format!("{name} is longer than {max} characters"),
                        );
                    }
                    if let Some(allowed) = &rules.one_of
                        && !allowed.iter().any(|a| a == v)
                    {
                        errors.push(
                            row,
                            Some(name),
                            "one_of",
                            format!("{name} must be one of {}, got '{v}'", allowed.join(", ")),
                        );
                    }
                }
            }
            t if t.is_numeric() && (rules.min.is_some() || rules.max.is_some()) => {
                let Some(values) = as_f64(array) else {
                    continue;
                };
                // A Float32 value is compared with the bound as Float32
                // holds it (0.1 as Float32 is not above a max of 0.1).
                let float32 = *t == DataType::Float32;
                let bound = |b: Option<f64>| match float32 {
                    true => b.map(|b| f64::from(b as f32)),
                    false => b,
                };
                let (min_bound, max_bound) = (bound(rules.min), bound(rules.max));
                for (row, v) in values.into_iter().enumerate() {
                    let Some(v) = v else { continue };
                    if let Some(min) = min_bound
                        && v < min
                    {
                        errors.push(
                            row,
                            Some(name),
                            "min",
                            format!("{name} must be at least {min}, got {v}"),
                        );
                    }
                    if let Some(max) = max_bound
                        && v > max
                    {
                        errors.push(
                            row,
                            Some(name),
                            "max",
                            format!("{name} must be at most {max}, got {v}"),
                        );
                    }
                }
            }
            _ => {}
        }
    }
    check_vectors(spec, batch, errors);
}

/// Vector columns: every element of a vector finite; under the cosine
/// metric, not all zero (its distance to anything is undefined).
fn check_vectors(spec: &SchemaSpec, batch: &RecordBatch, errors: &mut RowErrors) {
    for v in &spec.vectors {
        let Some(array) = batch.column_by_name(&v.column) else {
            continue;
        };
        let Some(lists) = array.as_fixed_size_list_opt() else {
            continue;
        };
        let name = v.column.as_str();
        for row in (0..lists.len()).filter(|&r| lists.is_valid(r)) {
            let item = lists.value(row);
            let Some(values) = item.as_primitive_opt::<Float32Type>() else {
                continue;
            };
            if let Some(i) =
                (0..values.len()).find(|&i| values.is_null(i) || !values.value(i).is_finite())
            {
                errors.push(
                    row,
                    Some(name),
                    "finite",
                    format!("{name}: element {i} is not a finite number"),
                );
                continue;
            }
            // Under cosine the vector is normalised: its norm, in Float32 as
            // the engine computes it, must be neither zero nor infinite.
            let norm2: f32 = values.values().iter().map(|x| x * x).sum();
            if v.metric == Metric::Cosine && (norm2 == 0.0 || !norm2.is_finite()) {
                errors.push(
                    row,
                    Some(name),
                    "non_zero",
                    format!(
                        "{name}: under the cosine metric a vector needs a norm that is neither zero nor infinite in Float32"
                    ),
                );
            }
        }
    }
}

fn as_f64(array: &ArrayRef) -> Option<Vec<Option<f64>>> {
    macro_rules! prim {
        ($t:ty) => {
            array
                .as_primitive::<$t>()
                .iter()
                .map(|v| v.map(|v| v as f64))
                .collect()
        };
    }
    Some(match array.data_type() {
        DataType::Int8 => prim!(Int8Type),
        DataType::Int16 => prim!(Int16Type),
        DataType::Int32 => prim!(Int32Type),
        DataType::Int64 => prim!(Int64Type),
        DataType::UInt8 => prim!(UInt8Type),
        DataType::UInt16 => prim!(UInt16Type),
        DataType::UInt32 => prim!(UInt32Type),
        DataType::UInt64 => prim!(UInt64Type),
        DataType::Float32 => prim!(Float32Type),
        DataType::Float64 => prim!(Float64Type),
        _ => return None,
    })
}

#[cfg(target_arch = "wasm32")]
export_plugin!(SpecPlugin);

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use lance_context_plugin::arrow_array::{Int32Array, StringArray};

    use super::*;

    const SPEC: &str = r#"{
      "name": "tickets",
      "key": "id",
      "columns": [
        {"name": "id", "type": "Utf8", "nullable": false},
        {"name": "title", "type": "Utf8", "nullable": false, "rules": {"non_empty": true, "max_length": 5}},
        {"name": "state", "type": "Utf8", "rules": {"one_of": ["open", "closed"]}},
        {"name": "priority", "type": "Int32", "rules": {"min": 1, "max": 3}}
      ]
    }"#;

    fn params() -> Vec<(String, String)> {
        vec![("spec".into(), SPEC.into())]
    }

    #[test]
    fn describe_declares_the_spec() {
        let d = SpecPlugin::describe(&params()).unwrap();
        assert_eq!(d.name, "tickets");
        assert_eq!(d.schema.fields().len(), 4);
        assert!(!d.has_transform);
        assert!(
            SpecPlugin::describe(&[])
                .unwrap_err()
                .message()
                .contains("'spec'")
        );
        assert!(
            SpecPlugin::describe(&[("x".into(), "1".into())])
                .unwrap_err()
                .message()
                .contains("unknown parameter 'x'")
        );
        let bad = SPEC.replace("\"Int32\"", "\"Int33\"");
        let err = SpecPlugin::describe(&[("spec".into(), bad)]).unwrap_err();
        assert!(err.message().contains("columns[3].type"), "{err}");
    }

    #[test]
    fn every_rule_is_checked_by_row_and_column() {
        let schema = Arc::new(Schema::new(vec![
            Field::new("id", DataType::Utf8, true),
            Field::new("title", DataType::Utf8, true),
            Field::new("state", DataType::Utf8, true),
            Field::new("priority", DataType::Int32, true),
        ]));
        let batch = RecordBatch::try_new(
            schema,
            vec![
                Arc::new(StringArray::from(vec![
                    Some("a"),
                    Some("b"),
                    None,
                    Some("d"),
                ])),
                Arc::new(StringArray::from(vec![
                    Some("ok"),
                    Some(""),
                    Some("ok"),
                    Some("toolong"),
                ])),
                Arc::new(StringArray::from(vec![
                    Some("open"),
                    None,
                    Some("gone"),
                    Some("closed"),
                ])),
                Arc::new(Int32Array::from(vec![Some(1), Some(9), None, Some(0)])),
            ],
        )
        .unwrap();
        let mut errors = RowErrors::default();
        let call = CallInfo {
            now_micros: 0,
            params: params(),
        };
        SpecPlugin::validate(&batch, &call, &mut errors);
        let got: Vec<(u32, Option<String>, String)> = errors
            .into_vec()
            .into_iter()
            .map(|e| (e.row, e.column, e.code))
            .collect();
        let want = [
            (1, "title", "non_empty"),
            (1, "priority", "max"),
            (2, "id", "required"),
            (2, "state", "one_of"),
            (3, "title", "max_length"),
            (3, "priority", "min"),
        ];
        let mut got_sorted = got.clone();
        got_sorted.sort();
        let mut want: Vec<(u32, Option<String>, String)> = want
            .iter()
            .map(|(r, c, k)| (*r, Some(c.to_string()), k.to_string()))
            .collect();
        want.sort();
        assert_eq!(got_sorted, want);
    }
}
