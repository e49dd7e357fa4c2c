//! Typed filters: conditions on columns compiled to a SQL predicate, so
//! callers need not write (or quote) SQL. The same conditions are offered by
//! the library, the CLI, the REST API and the Rust client.

use arrow_schema::{DataType, Schema};

use crate::error::{Error, Result};

/// A value in a condition.
#[derive(Debug, Clone, PartialEq)]
pub enum FilterValue {
    Bool(bool),
    Int(i64),
    Float(f64),
    /// Text; for a timestamp column, an RFC 3339 time
    /// (`2026-01-02T03:04:05Z`) or a date (`2026-01-02`).
    Text(String),
}

/// One condition on one column.
#[derive(Debug, Clone, PartialEq)]
pub enum Condition {
    /// `column = value`.
    Eq { column: String, value: FilterValue },
    /// `column` is one of `values`.
    In {
        column: String,
        values: Vec<FilterValue>,
    },
    /// A range on a number or timestamp column; each bound optional.
    Range {
        column: String,
        gt: Option<FilterValue>,
        gte: Option<FilterValue>,
        lt: Option<FilterValue>,
        lte: Option<FilterValue>,
    },
    /// A list column holds `value` as an element; a text column (e.g. JSON
    /// metadata) holds `value` as a substring.
    Contains { column: String, value: FilterValue },
}

impl Condition {
    fn column(&self) -> &str {
        match self {
            Condition::Eq { column, .. }
            | Condition::In { column, .. }
            | Condition::Range { column, .. }
            | Condition::Contains { column, .. } => column,
        }
    }
}

/// The longest list of `in` values accepted.
pub const MAX_IN_VALUES: usize = 10_000;

/// `conditions` (all must hold) as one SQL predicate over `schema`, the
/// store's logical schema; `None` when there are none. An unknown column, a
/// value of the wrong kind for its column or a condition the column's type
/// cannot answer is an `InvalidArgument` naming the condition.
pub fn compile_conditions(schema: &Schema, conditions: &[Condition]) -> Result<Option<String>> {
    let mut parts = Vec::new();
    for (i, condition) in conditions.iter().enumerate() {
        let at = |m: Unfit| Error::invalid_argument(format!("condition {i}: {m}"));
        let name = condition.column();
        let field = schema
            .field_with_name(name)
            .map_err(|_| at(Unfit::NoColumn(name.to_string())))?;
        let column = identifier(name);
        let ty = field.data_type();
        let value = |v: &FilterValue| literal(ty, v).map_err(at);
        let part = match condition {
            Condition::Eq { value: v, .. } => {
                scalar_only(ty).map_err(at)?;
                format!("{column} = {}", value(v)?)
            }
            Condition::In { values, .. } => {
                scalar_only(ty).map_err(at)?;
                if values.is_empty() {
                    return Err(at(Unfit::EmptyIn));
                }
                if values.len() > MAX_IN_VALUES {
                    return Err(at(Unfit::LongIn(values.len())));
                }
                let list: Vec<String> = values.iter().map(value).collect::<Result<_>>()?;
                format!("{column} IN ({})", list.join(", "))
            }
            Condition::Range {
                gt, gte, lt, lte, ..
            } => {
                if !(ty.is_numeric() || matches!(ty, DataType::Timestamp(..) | DataType::Date32)) {
                    return Err(at(Unfit::NotOrdered(name.to_string(), ty.clone())));
                }
                let mut bounds = Vec::new();
                for (op, bound) in [(">", gt), (">=", gte), ("<", lt), ("<=", lte)] {
                    if let Some(b) = bound {
                        bounds.push(format!("{column} {op} {}", value(b)?));
                    }
                }
                if bounds.is_empty() {
                    return Err(at(Unfit::NoBound));
                }
                bounds.join(" AND ")
            }
            Condition::Contains { value: v, .. } => match ty {
                DataType::List(item) | DataType::LargeList(item) => {
                    format!(
                        "array_has({column}, {})",
                        literal(item.data_type(), v).map_err(at)?
                    )
                }
                DataType::Utf8 | DataType::LargeUtf8 => match v {
                    FilterValue::Text(t) => format!("strpos({column}, {}) > 0", quote(t)),
                    _ => return Err(at(Unfit::ContainsNotText)),
                },
                other => {
                    return Err(at(Unfit::NotContainer(name.to_string(), other.clone())));
                }
            },
        };
        parts.push(format!("({part})"));
    }
    Ok((!parts.is_empty()).then(|| parts.join(" AND ")))
}

/// Why a condition does not fit the store's columns (said after
/// "condition N: ").
#[derive(Debug, thiserror::Error)]
enum Unfit {
    #[error("no column '{0}'")]
    NoColumn(String),
    #[error("'in' needs at least one value")]
    EmptyIn,
    #[error("'in' takes at most {MAX_IN_VALUES} values, got {0}")]
    LongIn(usize),
    #[error("a range needs a number or timestamp column; '{0}' is {1}")]
    NotOrdered(String, DataType),
    #[error("a range needs at least one bound")]
    NoBound,
    #[error("'contains' on a text column takes text")]
    ContainsNotText,
    #[error("'contains' needs a list or text column; '{0}' is {1}")]
    NotContainer(String, DataType),
    #[error("a {0} column cannot be compared to a value")]
    NotScalar(DataType),
    #[error("{0} is not a finite number")]
    NotFinite(f64),
    #[error("'{0}' is not a date (YYYY-MM-DD): {1}")]
    NotDate(String, chrono::ParseError),
    #[error("'{0}' is not a time (RFC 3339, e.g. 2026-01-02T03:04:05Z, or a date 2026-01-02)")]
    NotTime(String),
    #[error("{} does not fit a {ty} column", describe(.value))]
    WrongKind { value: FilterValue, ty: DataType },
}

fn scalar_only(ty: &DataType) -> std::result::Result<(), Unfit> {
    match ty {
        DataType::List(_)
        | DataType::LargeList(_)
        | DataType::FixedSizeList(..)
        | DataType::Struct(_)
        | DataType::Map(..)
        | DataType::Binary
        | DataType::LargeBinary => Err(Unfit::NotScalar(ty.clone())),
        _ => Ok(()),
    }
}

/// A column name as a SQL identifier (backquoted unless plain).
fn identifier(name: &str) -> String {
    let plain = name
        .chars()
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
    if plain {
        name.to_string()
    } else {
        format!("`{}`", name.replace('`', "``"))
    }
}

fn quote(text: &str) -> String {
    format!("'{}'", text.replace('\'', "''"))
}

/// `value` as a SQL literal for a column of type `ty`.
fn literal(ty: &DataType, value: &FilterValue) -> std::result::Result<String, Unfit> {
    match (ty, value) {
        (DataType::Boolean, FilterValue::Bool(b)) => Ok(b.to_string()),
        (t, FilterValue::Int(n)) if t.is_numeric() => Ok(n.to_string()),
        (t, FilterValue::Float(x)) if t.is_floating() || t.is_numeric() => {
            if x.is_finite() {
                Ok(format!("{x:?}"))
            } else {
                Err(Unfit::NotFinite(*x))
            }
        }
        (DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View, FilterValue::Text(t)) => {
            Ok(quote(t))
        }
        (DataType::Timestamp(..), FilterValue::Text(t)) => {
            let micros = parse_time(t)?;
            Ok(format!("to_timestamp_micros({micros})"))
        }
        (DataType::Timestamp(..), FilterValue::Int(n)) => Ok(format!("to_timestamp_micros({n})")),
        (DataType::Date32, FilterValue::Text(t)) => {
            chrono::NaiveDate::parse_from_str(t, "%Y-%m-%d")
                .map_err(|e| Unfit::NotDate(t.clone(), e))?;
            Ok(format!("DATE {}", quote(t)))
        }
        (ty, value) => Err(Unfit::WrongKind {
            value: value.clone(),
            ty: ty.clone(),
        }),
    }
}

fn describe(value: &FilterValue) -> String {
    match value {
        FilterValue::Bool(b) => format!("the boolean {b}"),
        FilterValue::Int(n) => format!("the number {n}"),
        FilterValue::Float(x) => format!("the number {x}"),
        FilterValue::Text(t) => format!("the text {t:?}"),
    }
}

/// An RFC 3339 time or a date (midnight UTC) as microseconds since the epoch.
fn parse_time(text: &str) -> std::result::Result<i64, Unfit> {
    if let Ok(t) = chrono::DateTime::parse_from_rfc3339(text) {
        return Ok(t.timestamp_micros());
    }
    if let Ok(d) = chrono::NaiveDate::parse_from_str(text, "%Y-%m-%d") {
        return Ok(d
            .and_hms_opt(0, 0, 0)
            .unwrap_or_default()
            .and_utc()
            .timestamp_micros());
    }
    Err(Unfit::NotTime(text.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow_schema::{Field, TimeUnit};
    use std::sync::Arc;

    fn schema() -> Schema {
        Schema::new(vec![
            Field::new("id", DataType::Utf8, false),
            Field::new("n", DataType::Int64, true),
            Field::new(
                "at",
                DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into())),
                true,
            ),
            Field::new(
                "tags",
                DataType::List(Arc::new(Field::new("item", DataType::Utf8, true))),
                true,
            ),
            Field::new("odd name", DataType::Utf8, true),
        ])
    }

    #[test]
    fn conditions_compile_to_quoted_predicates() {
        let s = schema();
        let got = compile_conditions(
            &s,
            &[
                Condition::Eq {
                    column: "odd name".into(),
                    value: FilterValue::Text("it's".into()),
                },
                Condition::In {
                    column: "n".into(),
                    values: vec![FilterValue::Int(1), FilterValue::Int(2)],
                },
                Condition::Range {
                    column: "at".into(),
                    gt: None,
                    gte: Some(FilterValue::Text("1970-01-01T00:00:01Z".into())),
                    lt: None,
                    lte: None,
                },
                Condition::Contains {
                    column: "tags".into(),
                    value: FilterValue::Text("a".into()),
                },
            ],
        )
        .unwrap()
        .unwrap();
        assert_eq!(
            got,
            "(`odd name` = 'it''s') AND (n IN (1, 2)) AND (at >= to_timestamp_micros(1000000)) \
             AND (array_has(tags, 'a'))"
        );
    }

    #[test]
    fn wrong_conditions_say_which_and_why() {
        let s = schema();
        let e = compile_conditions(
            &s,
            &[Condition::Eq {
                column: "n".into(),
                value: FilterValue::Text("x".into()),
            }],
        )
        .unwrap_err();
        assert!(matches!(e, Error::InvalidArgument { .. }), "{e}");
        assert!(e.to_string().contains("condition 0"), "{e}");
        let e = compile_conditions(
            &s,
            &[Condition::Range {
                column: "tags".into(),
                gt: Some(FilterValue::Int(1)),
                gte: None,
                lt: None,
                lte: None,
            }],
        )
        .unwrap_err();
        assert!(e.to_string().contains("range"), "{e}");
        assert!(compile_conditions(&s, &[]).unwrap().is_none());
    }
}
