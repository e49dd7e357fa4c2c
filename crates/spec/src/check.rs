//! The rules of a [`SchemaSpec`], one function each; [`SchemaSpec::check`]
//! runs them all and reports every problem found, naming its field.

use std::collections::{BTreeMap, HashSet};
use std::str::FromStr;
use std::sync::Arc;

use arrow_schema::{DataType, Field, Schema, TimeUnit};

use crate::error::{SpecErrors, SpecProblem};
use crate::query::{placeholders, quoted_placeholders};
use crate::spec::*;

/// Which key columns are allowed: `id` for every schema, plus `event_id` for
/// the built-in datagen schema (kept for compatibility with its data).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum KeyRule {
    /// The key must be `id`.
    #[default]
    IdOnly,
    /// A built-in schema: its documented key.
    Builtin,
}

/// Where a rule reports a problem: (field, message).
type Report<'r> = &'r mut dyn FnMut(String, String);

/// What the column rules found: the names declared, and the parsed type of
/// every column whose type is fine. The later rules look columns up here.
struct Columns<'a> {
    seen: HashSet<&'a str>,
    types: BTreeMap<&'a str, DataType>,
}

impl SchemaSpec {
    /// Check every rule; every problem found, or the Arrow schema (the key
    /// column tagged as the primary key).
    pub fn check(&self, key_rule: KeyRule) -> Result<Arc<Schema>, SpecErrors> {
        let mut problems = Vec::new();
        let mut p = |field: String, message: String| problems.push(SpecProblem { field, message });
        shape(self, &mut p);
        let Columns { seen, types } = columns(self, &mut p);
        key(self, key_rule, &types, &mut p);
        blob_columns(self, &seen, &types, &mut p);
        vectors(self, &seen, &types, &mut p);
        text_columns(self, &seen, &types, &mut p);
        secondary_key(self, &seen, &types, &mut p);
        capabilities(self, &types, &mut p);
        queries(self, &seen, &mut p);
        if !problems.is_empty() {
            return Err(SpecErrors {
                name: self.name.clone(),
                problems,
            });
        }
        let fields: Vec<Field> = self
            .columns
            .iter()
            .map(|c| {
                let mut metadata: std::collections::HashMap<String, String> =
                    c.metadata.clone().into_iter().collect();
                if c.name == self.key {
                    metadata.insert(PRIMARY_KEY_METADATA.to_string(), "true".to_string());
                }
                Field::new(&c.name, types[c.name.as_str()].clone(), c.nullable)
                    .with_metadata(metadata)
            })
            .collect();
        Ok(Arc::new(Schema::new(fields)))
    }
}

/// A name, and between one and [`MAX_COLUMNS`] columns.
fn shape(spec: &SchemaSpec, p: Report) {
    if spec.name.trim().is_empty() {
        p("name".into(), "the schema needs a name".into());
    }
    if spec.columns.is_empty() {
        p(
            "columns".into(),
            "a schema needs at least one column".into(),
        );
    }
    if spec.columns.len() > MAX_COLUMNS {
        p(
            "columns".into(),
            format!(
                "{} columns; a schema has at most {MAX_COLUMNS}",
                spec.columns.len()
            ),
        );
    }
}

/// Each column: a printable, unreserved, unique name; a supported Arrow type
/// within the size bounds; value rules that fit its type; printable
/// metadata. Together the fixed-width columns stay under
/// [`MAX_FIXED_ROW_BYTES`] a row.
fn columns<'a>(spec: &'a SchemaSpec, p: Report) -> Columns<'a> {
    let mut seen = HashSet::new();
    let mut types: BTreeMap<&'a str, DataType> = BTreeMap::new();
    let mut row_bytes: u128 = 0;
    for (i, c) in spec.columns.iter().enumerate() {
        let at = |what: &str| format!("columns[{i}]{what}");
        if let Err(why) = check_name(&c.name) {
            p(at(".name"), why.to_string());
        }
        if c.name.is_empty() {
            p(at(".name"), "a column needs a name".into());
        } else if RESERVED_COLUMNS.contains(&c.name.as_str()) || c.name.starts_with('_') {
            p(
                at(".name"),
                format!(
                    "'{}' is reserved (the engine's system columns: {}, and every other name starting with '_')",
                    c.name,
                    RESERVED_COLUMNS.join(", ")
                ),
            );
        }
        if !seen.insert(c.name.as_str()) {
            p(
                at(".name"),
                format!("column '{}' is declared twice", c.name),
            );
        }
        let parsed = type_text(&c.data_type).and_then(|()| {
            DataType::from_str(&c.data_type)
                .map_err(|e| TypeProblem::NotArrow(c.data_type.clone(), e))
        });
        match parsed {
            Err(why) => p(at(".type"), why.to_string()),
            Ok(t) => {
                if let Err(why) = supported(&t).and_then(|()| bounded(&t)) {
                    p(
                        at(".type"),
                        format!(
                            "column '{}': {why} (supported: {})",
                            c.name,
                            SUPPORTED_TYPES.join(", ")
                        ),
                    );
                } else {
                    row_bytes += fixed_bytes(&t);
                    types.insert(c.name.as_str(), t);
                }
            }
        }
        check_rules(c, types.get(c.name.as_str()), p, &at);
        if c.rules.default.is_some() {
            // The key is the caller's (a default would merge records), and
            // the capability columns are the engine's.
            if c.name == spec.key {
                p(
                    at(".rules.default"),
                    "the key column takes no default".into(),
                );
            } else if ENGINE_MANAGED.contains(&c.name.as_str()) {
                p(
                    at(".rules.default"),
                    format!(
                        "'{}' is managed by the engine's capabilities and takes no default",
                        c.name
                    ),
                );
            }
        }
        if let Some(t) = types.get(c.name.as_str())
            && let Err(why) = nested_names(t)
        {
            p(at(".type"), why.to_string());
        }
        for (k, v) in &c.metadata {
            if k.chars().chain(v.chars()).any(char::is_control) || k.len() + v.len() > MAX_TYPE_TEXT
            {
                p(
                    at(&format!(".metadata.{}", k.escape_default())),
                    "metadata keys and values are printable text of at most 1 KiB".into(),
                );
            }
            if v == TOMBSTONE_CONTENT_TYPE {
                p(
                    at(&format!(".metadata.{k}")),
                    "the tombstone content type is reserved".into(),
                );
            }
        }
    }
    if row_bytes > MAX_FIXED_ROW_BYTES {
        p(
            "columns".into(),
            format!(
                "a row's fixed-width columns take {row_bytes} bytes; at most {MAX_FIXED_ROW_BYTES}"
            ),
        );
    }
    Columns { seen, types }
}

/// The key: `id` (or, for built-ins, `event_id`), a declared non-null Utf8
/// column.
fn key(spec: &SchemaSpec, key_rule: KeyRule, types: &BTreeMap<&str, DataType>, p: Report) {
    match key_rule {
        KeyRule::IdOnly if spec.key != "id" => p(
            "key".into(),
            format!(
                "the key column must be 'id' (got '{}'); only the built-in datagen schema keeps 'event_id'",
                spec.key
            ),
        ),
        KeyRule::Builtin if spec.key != "id" && spec.key != "event_id" => p(
            "key".into(),
            format!(
                "the key column must be 'id' or 'event_id', got '{}'",
                spec.key
            ),
        ),
        _ => {}
    }
    match spec.columns.iter().position(|c| c.name == spec.key) {
        None => p(
            "key".into(),
            format!("the key column '{}' is not among the columns", spec.key),
        ),
        Some(i) => {
            let c = &spec.columns[i];
            if c.nullable {
                p(
                    format!("columns[{i}].nullable"),
                    format!("the key column '{}' must be non-null", c.name),
                );
            }
            if let Some(t) = types.get(c.name.as_str())
                && t != &DataType::Utf8
            {
                p(
                    format!("columns[{i}].type"),
                    format!("the key column '{}' must be Utf8, not {t}", c.name),
                );
            }
        }
    }
}

/// Blob columns: declared once each, Binary or LargeBinary.
fn blob_columns(
    spec: &SchemaSpec,
    seen: &HashSet<&str>,
    types: &BTreeMap<&str, DataType>,
    p: Report,
) {
    let mut blobs = HashSet::new();
    for (i, b) in spec.blob_columns.iter().enumerate() {
        let at = format!("blob_columns[{i}]");
        if !blobs.insert(b) {
            p(at.clone(), format!("'{b}' is listed twice"));
        }
        match types.get(b.as_str()) {
            None if !seen.contains(b.as_str()) => {
                p(at, format!("blob column '{b}' is not among the columns"))
            }
            Some(DataType::Binary | DataType::LargeBinary) | None => {}
            Some(t) => p(
                at,
                format!("blob column '{b}' must be Binary or LargeBinary, not {t}"),
            ),
        }
    }
}

/// Vector columns: declared once each, a positive dimension,
/// `FixedSizeList(dimension x Float32)`.
fn vectors(spec: &SchemaSpec, seen: &HashSet<&str>, types: &BTreeMap<&str, DataType>, p: Report) {
    let mut vectors = HashSet::new();
    for (i, v) in spec.vectors.iter().enumerate() {
        let at = |what: &str| format!("vectors[{i}]{what}");
        if !vectors.insert(&v.column) {
            p(at(".column"), format!("'{}' is declared twice", v.column));
        }
        if v.dimension <= 0 {
            p(
                at(".dimension"),
                format!("the dimension must be > 0, got {}", v.dimension),
            );
        }
        match types.get(v.column.as_str()) {
            None if !seen.contains(v.column.as_str()) => p(
                at(".column"),
                format!("vector column '{}' is not among the columns", v.column),
            ),
            Some(DataType::FixedSizeList(item, n))
                if item.data_type() == &DataType::Float32 && i64::from(*n) == v.dimension => {}
            None => {}
            Some(t) => p(
                at(".column"),
                format!(
                    "vector column '{}' must be FixedSizeList({} x Float32), not {t}",
                    v.column, v.dimension
                ),
            ),
        }
    }
}

/// Text columns: declared once each, `Utf8` or `LargeUtf8`, a known
/// tokenizer and language, a token length of at least 1.
fn text_columns(
    spec: &SchemaSpec,
    seen: &HashSet<&str>,
    types: &BTreeMap<&str, DataType>,
    p: Report,
) {
    use crate::spec::{TEXT_LANGUAGES, TEXT_TOKENIZERS};
    let mut columns = HashSet::new();
    for (i, t) in spec.text_columns.iter().enumerate() {
        let at = |what: &str| format!("text_columns[{i}]{what}");
        if !columns.insert(&t.column) {
            p(at(".column"), format!("'{}' is declared twice", t.column));
        }
        match types.get(t.column.as_str()) {
            None if !seen.contains(t.column.as_str()) => p(
                at(".column"),
                format!("text column '{}' is not among the columns", t.column),
            ),
            Some(DataType::Utf8 | DataType::LargeUtf8) | None => {}
            Some(other) => p(
                at(".column"),
                format!(
                    "text column '{}' must be Utf8 or LargeUtf8, not {other}",
                    t.column
                ),
            ),
        }
        if !TEXT_TOKENIZERS.contains(&t.tokenizer.as_str()) {
            p(
                at(".tokenizer"),
                format!(
                    "unknown tokenizer '{}' (one of {})",
                    t.tokenizer,
                    TEXT_TOKENIZERS.join(", ")
                ),
            );
        }
        if !TEXT_LANGUAGES.contains(&t.language.as_str()) {
            p(
                at(".language"),
                format!(
                    "unknown language '{}' (one of {})",
                    t.language,
                    TEXT_LANGUAGES.join(", ")
                ),
            );
        }
        if t.max_token_length == Some(0) {
            p(
                at(".max_token_length"),
                "must be at least 1 (or null for no limit)".into(),
            );
        }
    }
}

/// The secondary key: a declared Utf8 column other than the key.
fn secondary_key(
    spec: &SchemaSpec,
    seen: &HashSet<&str>,
    types: &BTreeMap<&str, DataType>,
    p: Report,
) {
    if let Some(s) = &spec.secondary_key {
        if s == &spec.key {
            p(
                "secondary_key".into(),
                format!("'{s}' is the key column already"),
            );
        }
        match types.get(s.as_str()) {
            None if !seen.contains(s.as_str()) => p(
                "secondary_key".into(),
                format!("the secondary key '{s}' is not among the columns"),
            ),
            Some(DataType::Utf8 | DataType::LargeUtf8) | None => {}
            Some(t) => p(
                "secondary_key".into(),
                format!("the secondary key '{s}' must be Utf8, not {t}"),
            ),
        }
    }
}

/// Capabilities: listed once each, with the columns each needs.
fn capabilities(spec: &SchemaSpec, types: &BTreeMap<&str, DataType>, p: Report) {
    let mut caps = HashSet::new();
    for (i, c) in spec.capabilities.iter().enumerate() {
        let at = format!("capabilities[{i}]");
        if !caps.insert(*c) {
            p(at.clone(), format!("'{c}' is listed twice"));
        }
        let needs: &[(&str, &str)] = match c {
            Capability::Tombstones => &[("content_type", "Utf8")],
            Capability::Supersession => &[("supersedes_id", "Utf8"), ("superseded_by_id", "Utf8")],
            Capability::Lifecycle => &[
                ("expires_at", "Timestamp"),
                ("lifecycle_status", "Utf8"),
                ("retired_at", "Timestamp"),
            ],
            Capability::UniqueKeys => &[],
        };
        for (column, kind) in needs {
            let ok = match types.get(column) {
                Some(DataType::Utf8) => *kind == "Utf8",
                Some(DataType::Timestamp(_, _)) => *kind == "Timestamp",
                _ => false,
            };
            if !ok {
                p(
                    at.clone(),
                    format!("capability '{c}' needs a {kind} column '{column}'"),
                );
            }
        }
    }
}

/// Named queries: a name, placeholders that are exactly the params (bare,
/// not quoted), printable text, orderings by declared columns.
fn queries(spec: &SchemaSpec, seen: &HashSet<&str>, p: Report) {
    let mut query_names = HashSet::new();
    for (i, q) in spec.queries.iter().enumerate() {
        let at = |what: &str| format!("queries[{i}]{what}");
        if q.name.is_empty()
            || !q
                .name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
        {
            p(
                at(".name"),
                format!("'{}': a query name is letters, digits, '_' and '-'", q.name),
            );
        }
        if !query_names.insert(q.name.as_str()) {
            p(at(".name"), format!("query '{}' is declared twice", q.name));
        }
        let used = match placeholders(&q.filter) {
            Ok(used) => used,
            Err(why) => {
                p(at(".filter"), why.to_string());
                Vec::new()
            }
        };
        for quoted in quoted_placeholders(&q.filter, &q.params) {
            p(
                at(".filter"),
                format!(
                    "'{{{quoted}}}' is inside quotes; write it bare (`col = {{{quoted}}}`): the host quotes the value"
                ),
            );
        }
        for u in &used {
            if !q.params.contains(u) {
                p(
                    at(".filter"),
                    format!("'{{{u}}}' is not one of the query's params"),
                );
            }
        }
        for param in &q.params {
            if !used.contains(param) {
                p(
                    at(".params"),
                    format!("'{param}' is not used in the filter"),
                );
            }
        }
        if q.filter.trim().is_empty() {
            p(at(".filter"), "a query needs a filter".into());
        }
        if q.filter
            .chars()
            .any(|c| c.is_control() && !matches!(c, '\t' | '\n' | '\r'))
        {
            p(
                at(".filter"),
                "the filter contains control characters".into(),
            );
        }
        if q.description.chars().any(char::is_control) {
            p(
                at(".description"),
                "the description contains control characters".into(),
            );
        }
        for param in &q.params {
            if param.is_empty() || !param.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
                p(
                    at(".params"),
                    format!(
                        "'{}': a parameter is letters, digits and '_'",
                        param.escape_default()
                    ),
                );
            }
        }
        for (j, o) in q.order_by.iter().enumerate() {
            let mut parts = o.split_whitespace();
            let column = parts.next().unwrap_or_default();
            let direction = parts.next();
            if !seen.contains(column) {
                p(
                    at(&format!(".order_by[{j}]")),
                    format!("unknown column '{column}'"),
                );
            }
            if direction
                .is_some_and(|d| !d.eq_ignore_ascii_case("asc") && !d.eq_ignore_ascii_case("desc"))
                || parts.next().is_some()
            {
                p(
                    at(&format!(".order_by[{j}]")),
                    format!("'{o}': write 'column', 'column asc' or 'column desc'"),
                );
            }
        }
    }
}

fn check_rules(c: &ColumnSpec, t: Option<&DataType>, p: Report, at: &impl Fn(&str) -> String) {
    let r = &c.rules;
    let stringy = matches!(t, Some(DataType::Utf8 | DataType::LargeUtf8) | None);
    let numeric = t.is_none_or(DataType::is_numeric);
    if (r.non_empty || r.one_of.is_some() || r.max_length.is_some()) && !stringy {
        p(
            at(".rules"),
            format!(
                "non_empty, one_of and max_length apply to strings; '{}' is not one",
                c.name
            ),
        );
    }
    if (r.min.is_some() || r.max.is_some()) && !numeric {
        p(
            at(".rules"),
            format!("min and max apply to numbers; '{}' is not one", c.name),
        );
    }
    if let (Some(min), Some(max)) = (r.min, r.max)
        && min > max
    {
        p(at(".rules"), format!("min {min} is above max {max}"));
    }
    if let Some(default) = &r.default
        && let Some(t) = t
        && let Err(why) = default_fits(default, t).and_then(|()| default_keeps_rules(default, t, r))
    {
        p(at(".rules.default"), why.to_string());
    }
    if let Some(values) = &r.one_of {
        if values.is_empty() {
            p(
                at(".rules.one_of"),
                "one_of needs at least one value".into(),
            );
        }
        if values.iter().any(|v| v == TOMBSTONE_CONTENT_TYPE) {
            p(
                at(".rules.one_of"),
                "the tombstone content type is reserved".into(),
            );
        }
    }
}

/// Whether a column default fits its type: `"now"` for timestamps, a
/// string for strings, an integer in range for integers, a number for
/// floats, a boolean for booleans; no default for other types.
fn default_fits(v: &serde_json::Value, t: &DataType) -> Result<(), BadDefault> {
    use serde_json::Value;
    let ok = match (t, v) {
        (DataType::Timestamp(..), Value::String(s)) => s == "now",
        (DataType::Timestamp(..), _) => false,
        (DataType::Utf8 | DataType::LargeUtf8, Value::String(_)) => true,
        (DataType::Dictionary(..), Value::String(_)) => true,
        (DataType::Boolean, Value::Bool(_)) => true,
        (DataType::Float32 | DataType::Float64, Value::Number(_)) => true,
        (t, Value::Number(n)) if t.is_integer() => match (n.as_i64(), n.as_u64()) {
            (Some(i), _) => int_in_range(t, i128::from(i)),
            (None, Some(u)) => int_in_range(t, i128::from(u)),
            _ => false,
        },
        _ => false,
    };
    match ok {
        true => Ok(()),
        false => Err(match t {
            DataType::Timestamp(..) => BadDefault::NotNow(v.clone()),
            t if t.is_integer() => BadDefault::NotInteger(v.clone(), t.clone()),
            DataType::Utf8 | DataType::LargeUtf8 | DataType::Dictionary(..) => {
                BadDefault::NotString(v.clone())
            }
            DataType::Boolean => BadDefault::NotBoolean(v.clone()),
            DataType::Float32 | DataType::Float64 => BadDefault::NotNumber(v.clone()),
            t => BadDefault::NoDefault(t.clone()),
        }),
    }
}

/// The columns the engine's capabilities manage (no default on them).
const ENGINE_MANAGED: &[&str] = &[
    "content_type",
    "supersedes_id",
    "superseded_by_id",
    "expires_at",
    "lifecycle_status",
    "retired_at",
];

/// A default must pass the column's own rules (it is filled after
/// validation, so it is checked here, once).
fn default_keeps_rules(
    v: &serde_json::Value,
    t: &DataType,
    r: &crate::spec::ColumnRules,
) -> Result<(), BadDefault> {
    if let Some(s) = v.as_str().filter(|_| !matches!(t, DataType::Timestamp(..))) {
        if r.non_empty && s.is_empty() {
            return Err(BadDefault::Empty);
        }
        if let Some(max) = r.max_length
            && s.chars().count() as u64 > max
        {
            return Err(BadDefault::TooLong(max));
        }
        if let Some(allowed) = &r.one_of
            && !allowed.iter().any(|a| a == s)
        {
            return Err(BadDefault::NotOneOf(s.to_string(), allowed.join(", ")));
        }
    }
    if let Some(x) = v.as_f64() {
        if *t == DataType::Float32 && x.is_finite() && x.abs() > f64::from(f32::MAX) {
            return Err(BadDefault::NotFloat32(v.clone()));
        }
        if let Some(min) = r.min
            && x < min
        {
            return Err(BadDefault::BelowMin(v.clone(), min));
        }
        if let Some(max) = r.max
            && x > max
        {
            return Err(BadDefault::AboveMax(v.clone(), max));
        }
    }
    Ok(())
}

/// Why a column's default does not fit the column.
#[derive(Debug)]
enum BadDefault {
    NotNow(serde_json::Value),
    NotInteger(serde_json::Value, DataType),
    NotString(serde_json::Value),
    NotBoolean(serde_json::Value),
    NotNumber(serde_json::Value),
    NoDefault(DataType),
    Empty,
    TooLong(u64),
    NotOneOf(String, String),
    NotFloat32(serde_json::Value),
    BelowMin(serde_json::Value, f64),
    AboveMax(serde_json::Value, f64),
}

impl std::fmt::Display for BadDefault {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::NotNow(v) => write!(f, "a timestamp's default is \"now\", got {v}"),
            Self::NotInteger(v, t) => write!(f, "the default {v} is not a {t} integer"),
            Self::NotString(v) => write!(f, "the default {v} is not a string"),
            Self::NotBoolean(v) => write!(f, "the default {v} is not a boolean"),
            Self::NotNumber(v) => write!(f, "the default {v} is not a number"),
            Self::NoDefault(t) => write!(f, "a {t} column takes no default"),
            Self::Empty => write!(f, "the default is empty but the column is non_empty"),
            Self::TooLong(max) => write!(f, "the default is longer than max_length {max}"),
            Self::NotOneOf(s, allowed) => write!(f, "the default '{s}' is not one of {allowed}"),
            Self::NotFloat32(v) => write!(f, "the default {v} is not a finite Float32"),
            Self::BelowMin(v, min) => write!(f, "the default {v} is below min {min}"),
            Self::AboveMax(v, max) => write!(f, "the default {v} is above max {max}"),
        }
    }
}

fn int_in_range(t: &DataType, v: i128) -> bool {
    let (lo, hi): (i128, i128) = match t {
        DataType::Int8 => (i8::MIN.into(), i8::MAX.into()),
        DataType::Int16 => (i16::MIN.into(), i16::MAX.into()),
        DataType::Int32 => (i32::MIN.into(), i32::MAX.into()),
        DataType::Int64 => (i64::MIN.into(), i64::MAX.into()),
        DataType::UInt8 => (0, u8::MAX.into()),
        DataType::UInt16 => (0, u16::MAX.into()),
        DataType::UInt32 => (0, u32::MAX.into()),
        DataType::UInt64 => (0, u64::MAX.into()),
        _ => return false,
    };
    (lo..=hi).contains(&v)
}

/// Why a name or a declared type is refused (the message of the
/// [`crate::SpecProblem`] naming its field).
#[derive(Debug)]
enum TypeProblem {
    NameTooLong(usize),
    ControlCharacters(String),
    TypeTooLong(usize),
    TooDeep(usize),
    NotArrow(String, arrow_schema::ArrowError),
    NestedName(String),
    ListTooWide(i32),
    ValueTooWide(u128),
    Zone(String),
    Unsupported(DataType),
}

impl std::fmt::Display for TypeProblem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::NameTooLong(n) => {
                write!(
                    f,
                    "a name is at most {MAX_NAME_BYTES} bytes, this one has {n}"
                )
            }
            Self::ControlCharacters(name) => {
                write!(f, "'{}' contains control characters", name.escape_default())
            }
            Self::TypeTooLong(n) => {
                write!(f, "the type is {n} bytes long; at most {MAX_TYPE_TEXT}")
            }
            Self::TooDeep(n) => {
                write!(
                    f,
                    "the type nests {n} levels deep; at most {MAX_TYPE_DEPTH}"
                )
            }
            Self::NotArrow(text, e) => write!(f, "'{text}' is not an Arrow type: {e}"),
            Self::NestedName(name) => write!(
                f,
                "the nested field name '{}' is not printable text of at most {MAX_NAME_BYTES} bytes",
                name.escape_default()
            ),
            Self::ListTooWide(n) => {
                write!(
                    f,
                    "a fixed-size list of {n} values; at most {MAX_FIXED_SIZE}"
                )
            }
            Self::ValueTooWide(bytes) => {
                write!(
                    f,
                    "one value takes {bytes} bytes; at most {MAX_FIXED_ROW_BYTES}"
                )
            }
            Self::Zone(zone) => write!(
                f,
                "timestamps are stored without a zone or in UTC, not '{zone}'"
            ),
            Self::Unsupported(t) => write!(f, "{t} is not supported"),
        }
    }
}

/// A name: 1 to [`MAX_NAME_BYTES`] bytes, no control characters (names
/// are printed on terminals).
fn check_name(name: &str) -> Result<(), TypeProblem> {
    if name.len() > MAX_NAME_BYTES {
        return Err(TypeProblem::NameTooLong(name.len()));
    }
    if name.chars().any(char::is_control) {
        return Err(TypeProblem::ControlCharacters(name.to_string()));
    }
    Ok(())
}

/// A type string short and shallow enough to parse (Arrow's parser recurses
/// once per level: 100,000 nested `List(` would overflow the stack).
fn type_text(text: &str) -> Result<(), TypeProblem> {
    if text.len() > MAX_TYPE_TEXT {
        return Err(TypeProblem::TypeTooLong(text.len()));
    }
    let (mut depth, mut deepest, mut quoted) = (0usize, 0usize, false);
    for c in text.chars() {
        match c {
            '"' => quoted = !quoted,
            '(' if !quoted => {
                depth += 1;
                deepest = deepest.max(depth);
            }
            ')' if !quoted => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    if deepest > MAX_TYPE_DEPTH {
        return Err(TypeProblem::TooDeep(deepest));
    }
    Ok(())
}

/// Names inside a nested type (struct fields, list items) are printable.
fn nested_names(t: &DataType) -> Result<(), TypeProblem> {
    let check = |name: &str| {
        if name.chars().any(char::is_control) || name.len() > MAX_NAME_BYTES {
            Err(TypeProblem::NestedName(name.to_string()))
        } else {
            Ok(())
        }
    };
    match t {
        DataType::List(f) | DataType::LargeList(f) | DataType::FixedSizeList(f, _) => {
            check(f.name())?;
            nested_names(f.data_type())
        }
        DataType::Struct(fields) => fields.iter().try_for_each(|f| {
            check(f.name())?;
            nested_names(f.data_type())
        }),
        _ => Ok(()),
    }
}

/// Nesting depth of a type (a primitive is 1).
fn depth(t: &DataType) -> usize {
    match t {
        DataType::List(f) | DataType::LargeList(f) | DataType::FixedSizeList(f, _) => {
            1 + depth(f.data_type())
        }
        DataType::Struct(fields) => {
            1 + fields
                .iter()
                .map(|f| depth(f.data_type()))
                .max()
                .unwrap_or(0)
        }
        _ => 1,
    }
}

/// Bytes one value's fixed-width parts take: what a null of the type costs
/// (a column of `n` nulls allocates about `n` times this).
pub fn fixed_width_bytes(t: &DataType) -> u128 {
    fixed_bytes(t)
}

fn fixed_bytes(t: &DataType) -> u128 {
    match t {
        DataType::FixedSizeList(f, n) => (*n).max(0) as u128 * fixed_bytes(f.data_type()),
        DataType::Struct(fields) => fields.iter().map(|f| fixed_bytes(f.data_type())).sum(),
        DataType::Boolean => 1,
        DataType::LargeUtf8 | DataType::LargeBinary | DataType::LargeList(_) => 8,
        DataType::Dictionary(k, _) => fixed_bytes(k),
        other => other.primitive_width().unwrap_or(4) as u128,
    }
}

/// Depth, list widths and bytes per value within the limits.
fn bounded(t: &DataType) -> Result<(), TypeProblem> {
    if depth(t) > MAX_TYPE_DEPTH {
        return Err(TypeProblem::TooDeep(depth(t)));
    }
    fn widths(t: &DataType) -> Result<(), TypeProblem> {
        match t {
            DataType::FixedSizeList(f, n) => {
                if *n > MAX_FIXED_SIZE {
                    return Err(TypeProblem::ListTooWide(*n));
                }
                widths(f.data_type())
            }
            DataType::List(f) | DataType::LargeList(f) => widths(f.data_type()),
            DataType::Struct(fields) => fields.iter().try_for_each(|f| widths(f.data_type())),
            _ => Ok(()),
        }
    }
    widths(t)?;
    let bytes = fixed_bytes(t);
    if bytes > MAX_FIXED_ROW_BYTES {
        return Err(TypeProblem::ValueTooWide(bytes));
    }
    Ok(())
}

/// Whether the generic path supports a type.
fn supported(t: &DataType) -> Result<(), TypeProblem> {
    match t {
        DataType::Boolean
        | DataType::Int8
        | DataType::Int16
        | DataType::Int32
        | DataType::Int64
        | DataType::UInt8
        | DataType::UInt16
        | DataType::UInt32
        | DataType::UInt64
        | DataType::Float32
        | DataType::Float64
        | DataType::Utf8
        | DataType::LargeUtf8
        | DataType::Binary
        | DataType::LargeBinary
        | DataType::Date32 => Ok(()),
        DataType::Timestamp(
            TimeUnit::Second | TimeUnit::Millisecond | TimeUnit::Microsecond | TimeUnit::Nanosecond,
            tz,
        ) => match tz.as_deref() {
            None | Some("UTC") | Some("+00:00") => Ok(()),
            Some(other) => Err(TypeProblem::Zone(other.to_string())),
        },
        DataType::Dictionary(k, v)
            if matches!(**k, DataType::Int8 | DataType::Int16 | DataType::Int32)
                && **v == DataType::Utf8 =>
        {
            Ok(())
        }
        DataType::List(f) | DataType::LargeList(f) => supported(f.data_type()),
        DataType::FixedSizeList(f, n) if *n > 0 => supported(f.data_type()),
        DataType::Struct(fields) if !fields.is_empty() => {
            fields.iter().try_for_each(|f| supported(f.data_type()))
        }
        other => Err(TypeProblem::Unsupported(other.clone())),
    }
}
