//! The previous implementation's GenericStore declaration (lance-context
//! 0.6.x): a mapping of column name to type, as a user passes it to
//! `GenericStore.open(uri, schema={...})`, or the form that store records in
//! its dataset's `lance-context:schema_spec` metadata
//! (`{"columns": [[name, type], ...]}`).
//!
//! Types: `"string"`, `"int32"`, `"int64"`, `"float32"`, `"float64"`,
//! `"bool"`, `"timestamp"`, `"binary"`, or the full form `{"type": ...,
//! "nullable": bool}` with `"large": true` for a string, `"blob": true` for
//! binary, `"item": {...}` for `"list"`, and `"dim"`, `"metric"` for
//! `"vector"`. They map to the Arrow types that store wrote, so a dataset it
//! created reads with this spec: `Utf8` (`LargeUtf8` when large), `Int32`,
//! `Int64`, `Float32`, `Float64`, `Boolean`, `Timestamp(µs)`, `LargeBinary`
//! (marked `lance-context:blob` when blob), `List(T)`, and
//! `FixedSizeList(dim x Float32)` with a vector declaration (metric `l2`
//! when null or absent). The key is `id`, as that store required.

use std::collections::BTreeMap;
use std::str::FromStr;

use serde_json::Value;

use crate::error::{SpecErrors, SpecProblem};
use crate::spec::{ColumnRules, ColumnSpec, Metric, SchemaSpec, VectorSpec};

/// Field metadata the previous implementation (and the built-in plugins) put
/// on a blob column.
pub const BLOB_FIELD_METADATA: &str = "lance-context:blob";

/// The schema metadata key where the previous GenericStore recorded its
/// declaration.
pub const PREVIOUS_SPEC_METADATA: &str = "lance-context:schema_spec";

/// The previous implementation's type names.
const PREVIOUS_TYPES: &str =
    "string, int32, int64, float32, float64, bool, timestamp, binary, vector, list";

/// Whether `value` is the previous implementation's declaration (a mapping
/// of columns, or its recorded `{"columns": [[name, type], ...]}` form)
/// rather than this host's spec (which has `name`, `key` and `columns` as
/// objects).
pub fn is_previous_form(value: &Value) -> bool {
    let Some(object) = value.as_object() else {
        return false;
    };
    match object.get("columns") {
        Some(Value::Array(columns)) => columns.first().is_some_and(Value::is_array),
        // A mapping: none of this host's spec fields, every value a type.
        _ => {
            !object.contains_key("key")
                && !object.is_empty()
                && object
                    .values()
                    .all(|v| v.is_string() || v.get("type").is_some_and(Value::is_string))
        }
    }
}

/// A JSON object's members in the order written.
struct Ordered(Vec<(String, Value)>);

impl<'de> serde::Deserialize<'de> for Ordered {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Visit;
        impl<'de> serde::de::Visitor<'de> for Visit {
            type Value = Ordered;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("an object")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut map: A,
            ) -> Result<Ordered, A::Error> {
                let mut out = Vec::new();
                while let Some((k, v)) = map.next_entry::<String, Value>()? {
                    out.push((k, v));
                }
                Ok(Ordered(out))
            }
        }
        d.deserialize_map(Visit)
    }
}

impl SchemaSpec {
    /// The spec named `name` for the previous implementation's declaration
    /// in `text` (JSON; see the module docs), its columns in the order
    /// written; every problem, each naming its column.
    pub fn from_previous(name: &str, text: &str) -> Result<Self, SpecErrors> {
        let value: Value = serde_json::from_str(text).map_err(|e| SpecErrors {
            name: name.to_string(),
            problems: vec![SpecProblem {
                field: format!("line {}, column {}", e.line(), e.column()),
                message: e.to_string(),
            }],
        })?;
        let ordered = match &value {
            Value::Object(_) if !value.get("columns").is_some_and(Value::is_array) => {
                serde_json::from_str::<Ordered>(text).ok()
            }
            _ => None,
        };
        let pairs: Vec<(String, &Value)> = match value.get("columns") {
            Some(Value::Array(columns)) => columns
                .iter()
                .enumerate()
                .map(|(i, pair)| match pair.as_array().map(Vec::as_slice) {
                    Some([Value::String(n), t]) => (n.clone(), t),
                    _ => (format!("columns[{i}]"), &Value::Null),
                })
                .collect(),
            _ => ordered
                .as_ref()
                .map(|o| o.0.iter().map(|(k, v)| (k.clone(), v)).collect())
                .unwrap_or_default(),
        };
        let mut spec = SchemaSpec {
            name: name.to_string(),
            key: "id".to_string(),
            columns: Vec::new(),
            blob_columns: Vec::new(),
            vectors: Vec::new(),
            text_columns: Vec::new(),
            secondary_key: None,
            capabilities: Vec::new(),
            queries: Vec::new(),
        };
        let mut problems = Vec::new();
        for (column, declared) in pairs {
            match previous_column(&column, declared) {
                Ok(c) => {
                    if c.blob {
                        spec.blob_columns.push(column.clone());
                    }
                    if let Some((dimension, metric)) = c.vector {
                        spec.vectors.push(VectorSpec {
                            column: column.clone(),
                            dimension,
                            metric,
                        });
                    }
                    let mut metadata = BTreeMap::new();
                    if c.blob {
                        metadata.insert(BLOB_FIELD_METADATA.to_string(), "true".to_string());
                    }
                    spec.columns.push(ColumnSpec {
                        name: column,
                        data_type: c.data_type,
                        nullable: c.nullable,
                        rules: ColumnRules::default(),
                        metadata,
                    });
                }
                Err(p) => problems.push(p),
            }
        }
        if !problems.is_empty() {
            return Err(SpecErrors {
                name: name.to_string(),
                problems,
            });
        }
        Ok(spec)
    }
}

struct PreviousColumn {
    data_type: String,
    nullable: bool,
    blob: bool,
    vector: Option<(i64, Metric)>,
}

/// A problem with `column` of the previous declaration.
fn problem(column: &str, message: impl Into<String>) -> SpecProblem {
    SpecProblem {
        field: column.to_string(),
        message: message.into(),
    }
}

/// One column of the previous declaration; a problem names the column.
fn previous_column(column: &str, declared: &Value) -> Result<PreviousColumn, SpecProblem> {
    let (kind, full) = match declared {
        Value::String(kind) => (kind.as_str(), None),
        Value::Object(o) => match o.get("type").and_then(Value::as_str) {
            Some(kind) => (kind, Some(o)),
            None => return Err(problem(column, "a type needs \"type\"")),
        },
        other => {
            return Err(problem(
                column,
                format!(
                    "a type is a name ({PREVIOUS_TYPES}) or an object with \"type\", got {other}"
                ),
            ));
        }
    };
    let flag = |name: &str| {
        full.and_then(|o| o.get(name))
            .and_then(Value::as_bool)
            .unwrap_or(false)
    };
    let nullable = full
        .and_then(|o| o.get("nullable"))
        .and_then(Value::as_bool)
        .unwrap_or(true);
    let mut out = PreviousColumn {
        data_type: String::new(),
        nullable,
        blob: false,
        vector: None,
    };
    out.data_type = match kind {
        "string" if flag("large") => "LargeUtf8".into(),
        "string" => "Utf8".into(),
        "int32" => "Int32".into(),
        "int64" => "Int64".into(),
        "float32" => "Float32".into(),
        "float64" => "Float64".into(),
        "bool" => "Boolean".into(),
        "timestamp" => "Timestamp(µs)".into(),
        "binary" => {
            out.blob = flag("blob");
            "LargeBinary".into()
        }
        "list" => {
            let item = full
                .and_then(|o| o.get("item"))
                .ok_or_else(|| problem(column, "a list needs \"item\" (a type)"))?;
            let inner = previous_column(column, item)
                .map_err(|p| problem(column, format!("item: {}", p.message)))?;
            if inner.vector.is_some() || inner.blob {
                return Err(problem(
                    column,
                    "a list's item cannot be a vector or a blob",
                ));
            }
            format!("List({})", inner.data_type)
        }
        "vector" => {
            let dim = full
                .and_then(|o| o.get("dim"))
                .and_then(Value::as_i64)
                .filter(|d| *d > 0)
                .ok_or_else(|| problem(column, "a vector needs \"dim\", an integer > 0"))?;
            let metric = match full.and_then(|o| o.get("metric")) {
                None | Some(Value::Null) => Metric::L2,
                Some(Value::String(m)) => {
                    Metric::from_str(m).map_err(|e| problem(column, e.to_string()))?
                }
                Some(other) => {
                    return Err(problem(
                        column,
                        format!("metric: expected a name, got {other}"),
                    ));
                }
            };
            out.vector = Some((dim, metric));
            format!("FixedSizeList({dim} x Float32)")
        }
        other => {
            return Err(problem(
                column,
                format!("unknown type '{other}' (known: {PREVIOUS_TYPES})"),
            ));
        }
    };
    Ok(out)
}
