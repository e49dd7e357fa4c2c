//! # lance-context-spec
//!
//! `SchemaSpec`: the one declaration every schema produces — a plugin's
//! `describe`, or a declarative spec file run by the built-in `spec` plugin —
//! and its rules.
//!
//! The rules are checked when a plugin loads and when a store is created, and
//! every problem is reported (one [`SpecProblem`] each, naming the field), not
//! just the first. A spec is immutable once a store is created from it
//! (reopening with a different spec is an error: the host's registry).
//!
//! # The JSON form
//! The registry records a spec, and users write one for a store without a
//! plugin of their own (`lance-context store create NAME --spec FILE`):
//!
//! ```json
//! {
//!   "name": "notes",
//!   "key": "id",
//!   "columns": [
//!     {"name": "id", "type": "Utf8", "nullable": false},
//!     {"name": "text", "type": "Utf8", "nullable": false, "rules": {"non_empty": true}},
//!     {"name": "priority", "type": "Int32", "rules": {"min": 1, "max": 5}},
//!     {"name": "kind", "type": "Utf8", "rules": {"one_of": ["note", "task"]}},
//!     {"name": "embedding", "type": "FixedSizeList(4 x Float32)"}
//!   ],
//!   "vectors": [{"column": "embedding", "dimension": 4, "metric": "cosine"}],
//!   "blob_columns": [],
//!   "secondary_key": null,
//!   "capabilities": []
//! }
//! ```
//!
//! `type` is Arrow's own type syntax (what `DataType`'s `Display` prints and
//! its parser reads): see [`SUPPORTED_TYPES`]. `nullable` defaults to true;
//! the key column is tagged as the primary key by the host.

use std::collections::{BTreeMap, HashSet};
use std::str::FromStr;
use std::sync::Arc;

use arrow_schema::{DataType, Field, Schema, TimeUnit};
use serde::{Deserialize, Serialize};

/// The field-metadata tag marking the key column (Lance's unenforced primary
/// key; the MemWAL merges on it).
pub const PRIMARY_KEY_METADATA: &str = "lance-schema:unenforced-primary-key";

/// The reserved tombstone content type: no value of any column may be it.
pub const TOMBSTONE_CONTENT_TYPE: &str = "application/vnd.lance-context.tombstone";

/// Column names the storage engine reserves (any other `_`-prefixed name is
/// reserved too).
pub const RESERVED_COLUMNS: &[&str] = &["_rowid", "_rowaddr", "_mem_wal", "_tombstone"];

/// The Arrow types a spec may use (the generic JSON → Arrow → Lance path reads
/// and stores all of them), in Arrow's type syntax. Lists, fixed-size lists and
/// structs nest any of them.
pub const SUPPORTED_TYPES: &[&str] = &[
    "Boolean",
    "Int8",
    "Int16",
    "Int32",
    "Int64",
    "UInt8",
    "UInt16",
    "UInt32",
    "UInt64",
    "Float32",
    "Float64",
    "Utf8",
    "LargeUtf8",
    "Binary",
    "LargeBinary",
    "Date32",
    "Timestamp(µs) / Timestamp(µs, \"UTC\") (also ms, s, ns)",
    "Dictionary(Int8|Int16|Int32, Utf8)",
    "List(T)",
    "LargeList(T)",
    "FixedSizeList(N x T)",
    "Struct(\"name\": T, …)",
];

/// Most columns a schema may declare.
pub const MAX_COLUMNS: usize = 1024;
/// Longest column (or other declared) name, in bytes.
pub const MAX_NAME_BYTES: usize = 256;
/// Longest type string, in bytes.
pub const MAX_TYPE_TEXT: usize = 1024;
/// Deepest type nesting (`List(List(Int32))` is 3).
pub const MAX_TYPE_DEPTH: usize = 8;
/// Widest fixed-size list.
pub const MAX_FIXED_SIZE: i32 = 1 << 16;
/// Most bytes one row's fixed-width parts may take (a column of nulls is
/// allocated at this size per row), per column and for the whole row.
pub const MAX_FIXED_ROW_BYTES: u128 = 4 << 20;

/// A schema: columns, key, and what the engine does with them.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SchemaSpec {
    /// The schema's name (e.g. "rollout", or a user's).
    pub name: String,
    /// The key column.
    pub key: String,
    /// The columns, in order.
    pub columns: Vec<ColumnSpec>,
    /// Columns holding large binary payloads.
    #[serde(default)]
    pub blob_columns: Vec<String>,
    /// Vector columns.
    #[serde(default)]
    pub vectors: Vec<VectorSpec>,
    /// A caller-side key (e.g. `external_id`).
    #[serde(default)]
    pub secondary_key: Option<String>,
    /// Opt-in engine behaviours: `tombstones`, `supersession`, `lifecycle`,
    /// `unique_keys` (the key, and the secondary key when declared, are unique
    /// among stored non-tombstone records on add).
    #[serde(default)]
    pub capabilities: Vec<String>,
    /// Named queries of the schema (e.g. rollout's `trajectory`).
    #[serde(default)]
    pub queries: Vec<QuerySpec>,
}

/// A named query: rows matching `filter` (SQL; `{param}` placeholders are
/// filled with the caller's values as string literals), ordered by
/// `order_by` (`column` or `column desc`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct QuerySpec {
    pub name: String,
    #[serde(default)]
    pub description: String,
    #[serde(default)]
    pub params: Vec<String>,
    pub filter: String,
    #[serde(default)]
    pub order_by: Vec<String>,
    /// The rows go to the plugin's `reduce`, whose JSON is the result (only a
    /// compiled plugin can reduce; a declarative spec cannot).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub reduce: bool,
}

/// Why a named query's arguments do not bind.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum BindError {
    /// An argument names no parameter of the query.
    UnknownParam {
        query: String,
        param: String,
        params: Vec<String>,
    },
    /// A parameter was not given.
    MissingParam { query: String, param: String },
    /// A parameter was given empty.
    EmptyParam { query: String, param: String },
    /// The query's filter template is malformed (an unclosed placeholder).
    Template { query: String, message: String },
}

impl std::fmt::Display for BindError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::UnknownParam {
                query,
                param,
                params,
            } => write!(
                f,
                "query '{query}' has no parameter '{param}' (parameters: {})",
                params.join(", ")
            ),
            Self::MissingParam { query, param } => {
                write!(f, "query '{query}' needs the parameter '{param}'")
            }
            Self::EmptyParam { query, param } => {
                write!(f, "query '{query}': '{param}' must not be empty")
            }
            Self::Template { query, message } => write!(f, "query '{query}': {message}"),
        }
    }
}

impl std::error::Error for BindError {}

/// A piece of a filter template.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Piece<'a> {
    /// SQL text, copied as it is.
    Text(&'a str),
    /// A `{name}` placeholder outside any quotes.
    Param(&'a str),
}

/// Split a filter template into text and placeholders, in one pass. Braces
/// inside single-quoted strings or double-quoted identifiers are text, not
/// placeholders (the check refuses a placeholder written inside quotes: the
/// host quotes values itself).
fn pieces(filter: &str) -> Result<Vec<Piece<'_>>, String> {
    let mut out = Vec::new();
    let mut text_start = 0;
    let mut quote: Option<char> = None;
    let mut chars = filter.char_indices();
    while let Some((i, c)) = chars.next() {
        match (quote, c) {
            (Some(q), c) if c == q => quote = None,
            (Some(_), _) => {}
            (None, '\'' | '"') => quote = Some(c),
            (None, '{') => {
                let rest = &filter[i + 1..];
                let end = rest
                    .find('}')
                    .ok_or_else(|| format!("'{{' at byte {i} is not closed"))?;
                out.push(Piece::Text(&filter[text_start..i]));
                out.push(Piece::Param(&rest[..end]));
                text_start = i + 1 + end + 1;
                // Skip the placeholder's characters.
                for _ in 0..rest[..=end].chars().count() {
                    chars.next();
                }
            }
            (None, _) => {}
        }
    }
    out.push(Piece::Text(&filter[text_start..]));
    Ok(out)
}

impl QuerySpec {
    /// The filter with each `{param}` replaced by its value as a SQL string
    /// literal (quotes doubled), in one pass over the template: a value is
    /// never scanned again, so a value that looks like a placeholder stays
    /// text inside its literal. Every parameter must be given, non-empty,
    /// and nothing else.
    pub fn bind(&self, args: &[(String, String)]) -> Result<String, BindError> {
        for (name, _) in args {
            if !self.params.contains(name) {
                return Err(BindError::UnknownParam {
                    query: self.name.clone(),
                    param: name.clone(),
                    params: self.params.clone(),
                });
            }
        }
        let value = |p: &str| -> Result<&str, BindError> {
            let value = args
                .iter()
                .find(|(n, _)| n == p)
                .map(|(_, v)| v.as_str())
                .ok_or_else(|| BindError::MissingParam {
                    query: self.name.clone(),
                    param: p.to_string(),
                })?;
            if value.is_empty() {
                return Err(BindError::EmptyParam {
                    query: self.name.clone(),
                    param: p.to_string(),
                });
            }
            Ok(value)
        };
        for p in &self.params {
            value(p)?;
        }
        let pieces = pieces(&self.filter).map_err(|message| BindError::Template {
            query: self.name.clone(),
            message,
        })?;
        let mut filter = String::with_capacity(self.filter.len() + 16);
        for piece in pieces {
            match piece {
                Piece::Text(t) => filter.push_str(t),
                Piece::Param(p) => {
                    filter.push('\'');
                    filter.push_str(&value(p)?.replace('\'', "''"));
                    filter.push('\'');
                }
            }
        }
        Ok(filter)
    }

    /// The order: (column, descending).
    pub fn order(&self) -> Vec<(String, bool)> {
        self.order_by
            .iter()
            .map(|o| {
                let mut parts = o.split_whitespace();
                let column = parts.next().unwrap_or_default().to_string();
                let desc = parts.next().is_some_and(|d| d.eq_ignore_ascii_case("desc"));
                (column, desc)
            })
            .collect()
    }
}

/// The `{name}` placeholders of a filter template (outside quotes).
fn placeholders(filter: &str) -> Result<Vec<String>, String> {
    Ok(pieces(filter)?
        .into_iter()
        .filter_map(|p| match p {
            Piece::Param(name) => Some(name.to_string()),
            Piece::Text(_) => None,
        })
        .collect())
}

/// Placeholders of `params` written inside quotes (`'{p}'`): they would
/// never be filled, and suggest the author meant to quote the value. One pass
/// over the filter; each `{name}` inside quotes is looked up once.
fn quoted_placeholders(filter: &str, params: &[String]) -> Vec<String> {
    let params: HashSet<&str> = params.iter().map(String::as_str).collect();
    let mut quoted = Vec::new();
    let mut quote: Option<char> = None;
    let mut name: Option<String> = None;
    for c in filter.chars() {
        match (quote, c) {
            (Some(q), c) if c == q => {
                quote = None;
                name = None;
            }
            (Some(_), '{') => name = Some(String::new()),
            (Some(_), '}') => {
                if let Some(n) = name.take()
                    && params.contains(n.as_str())
                    && !quoted.contains(&n)
                {
                    quoted.push(n);
                }
            }
            (Some(_), c) => {
                if let Some(n) = name.as_mut() {
                    n.push(c);
                }
            }
            (None, '\'' | '"') => quote = Some(c),
            (None, _) => {}
        }
    }
    quoted
}

/// One column.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ColumnSpec {
    pub name: String,
    /// Arrow type syntax, e.g. `Utf8`, `List(Int32)`, `FixedSizeList(4 x Float32)`.
    #[serde(rename = "type")]
    pub data_type: String,
    #[serde(default = "yes")]
    pub nullable: bool,
    /// Value rules (declarative specs; a plugin checks its own rules in code).
    #[serde(default, skip_serializing_if = "ColumnRules::is_empty")]
    pub rules: ColumnRules,
    /// Field metadata (besides the primary-key tag, which the host sets).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub metadata: BTreeMap<String, String>,
}

fn yes() -> bool {
    true
}

/// Per-column value rules of a declarative spec; checked row by row by the
/// built-in `spec` plugin.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ColumnRules {
    /// Strings: not empty when present.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub non_empty: bool,
    /// Numbers: at least this.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min: Option<f64>,
    /// Numbers: at most this.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max: Option<f64>,
    /// Strings: one of these.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub one_of: Option<Vec<String>>,
    /// Strings: at most this many characters.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_length: Option<u64>,
}

impl ColumnRules {
    fn is_empty(&self) -> bool {
        *self == Self::default()
    }
}

/// A vector column.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VectorSpec {
    pub column: String,
    /// > 0; the column must be `FixedSizeList(dimension x Float32)`.
    pub dimension: i64,
    /// `l2`, `cosine` or `dot`.
    pub metric: String,
}

/// One problem with a spec, naming the field.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpecProblem {
    /// Where: `key`, `columns[2].type`, `vectors[0].metric`, …
    pub field: String,
    pub message: String,
}

impl std::fmt::Display for SpecProblem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.field, self.message)
    }
}

/// Every problem found, in spec order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpecErrors {
    pub name: String,
    pub problems: Vec<SpecProblem>,
}

impl std::fmt::Display for SpecErrors {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} problem(s) in schema '{}': ",
            self.problems.len(),
            self.name
        )?;
        for (i, p) in self.problems.iter().enumerate() {
            if i > 0 {
                f.write_str("; ")?;
            }
            write!(f, "{p}")?;
        }
        Ok(())
    }
}

impl std::error::Error for SpecErrors {}

/// The capabilities a spec may declare.
pub const CAPABILITIES: &[&str] = &["tombstones", "supersession", "lifecycle", "unique_keys"];

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

impl SchemaSpec {
    /// The spec of an Arrow schema (types printed in Arrow's syntax; field
    /// metadata kept except the primary-key tag).
    pub fn from_arrow(name: &str, key: &str, schema: &Schema) -> Self {
        Self {
            name: name.to_string(),
            key: key.to_string(),
            columns: schema
                .fields()
                .iter()
                .map(|f| ColumnSpec {
                    name: f.name().clone(),
                    data_type: f.data_type().to_string(),
                    nullable: f.is_nullable(),
                    rules: ColumnRules::default(),
                    metadata: f
                        .metadata()
                        .iter()
                        .filter(|(k, _)| k.as_str() != PRIMARY_KEY_METADATA)
                        .map(|(k, v)| (k.clone(), v.clone()))
                        .collect(),
                })
                .collect(),
            blob_columns: Vec::new(),
            vectors: Vec::new(),
            secondary_key: None,
            capabilities: Vec::new(),
            queries: Vec::new(),
        }
    }

    /// Parse the JSON form. Syntax errors name the line and column.
    pub fn from_json(text: &str) -> Result<Self, SpecErrors> {
        serde_json::from_str(text).map_err(|e| SpecErrors {
            name: "(unparsed)".into(),
            problems: vec![SpecProblem {
                field: format!("line {}, column {}", e.line(), e.column()),
                message: e.to_string(),
            }],
        })
    }

    /// The JSON form (pretty).
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).expect("a spec serializes")
    }

    /// Whether a capability is declared.
    pub fn has(&self, capability: &str) -> bool {
        self.capabilities.iter().any(|c| c == capability)
    }

    /// Check every rule; every problem found, or the Arrow schema (the key
    /// column tagged as the primary key).
    pub fn check(&self, key_rule: KeyRule) -> Result<Arc<Schema>, SpecErrors> {
        let mut problems = Vec::new();
        let mut p = |field: String, message: String| problems.push(SpecProblem { field, message });
        if self.name.trim().is_empty() {
            p("name".into(), "the schema needs a name".into());
        }
        if self.columns.is_empty() {
            p(
                "columns".into(),
                "a schema needs at least one column".into(),
            );
        }
        if self.columns.len() > MAX_COLUMNS {
            p(
                "columns".into(),
                format!(
                    "{} columns; a schema has at most {MAX_COLUMNS}",
                    self.columns.len()
                ),
            );
        }
        let mut seen = HashSet::new();
        let mut types: BTreeMap<&str, DataType> = BTreeMap::new();
        let mut row_bytes: u128 = 0;
        for (i, c) in self.columns.iter().enumerate() {
            let at = |what: &str| format!("columns[{i}]{what}");
            if let Err(why) = check_name(&c.name) {
                p(at(".name"), why);
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
                    .map_err(|e| format!("'{}' is not an Arrow type: {e}", c.data_type))
            });
            match parsed {
                Err(why) => p(at(".type"), why),
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
            check_rules(c, types.get(c.name.as_str()), &mut p, &at);
            if let Some(t) = types.get(c.name.as_str())
                && let Err(why) = nested_names(t)
            {
                p(at(".type"), why);
            }
            for (k, v) in &c.metadata {
                if k.chars().chain(v.chars()).any(char::is_control)
                    || k.len() + v.len() > MAX_TYPE_TEXT
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
        // Key.
        match key_rule {
            KeyRule::IdOnly if self.key != "id" => p(
                "key".into(),
                format!(
                    "the key column must be 'id' (got '{}'); only the built-in datagen schema keeps 'event_id'",
                    self.key
                ),
            ),
            KeyRule::Builtin if self.key != "id" && self.key != "event_id" => p(
                "key".into(),
                format!(
                    "the key column must be 'id' or 'event_id', got '{}'",
                    self.key
                ),
            ),
            _ => {}
        }
        match self.columns.iter().position(|c| c.name == self.key) {
            None => p(
                "key".into(),
                format!("the key column '{}' is not among the columns", self.key),
            ),
            Some(i) => {
                let c = &self.columns[i];
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
        // Blob columns.
        let mut blobs = HashSet::new();
        for (i, b) in self.blob_columns.iter().enumerate() {
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
        // Vectors.
        let mut vectors = HashSet::new();
        for (i, v) in self.vectors.iter().enumerate() {
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
            if !["l2", "cosine", "dot"].contains(&v.metric.as_str()) {
                p(
                    at(".metric"),
                    format!("the metric must be l2, cosine or dot, got '{}'", v.metric),
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
        // Secondary key.
        if let Some(s) = &self.secondary_key {
            if s == &self.key {
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
        // Capabilities and the columns they need.
        let mut caps = HashSet::new();
        for (i, c) in self.capabilities.iter().enumerate() {
            let at = format!("capabilities[{i}]");
            if !caps.insert(c.as_str()) {
                p(at.clone(), format!("'{c}' is listed twice"));
            }
            let needs: &[(&str, &str)] = match c.as_str() {
                "tombstones" => &[("content_type", "Utf8")],
                "supersession" => &[("supersedes_id", "Utf8"), ("superseded_by_id", "Utf8")],
                "lifecycle" => &[
                    ("expires_at", "Timestamp"),
                    ("lifecycle_status", "Utf8"),
                    ("retired_at", "Timestamp"),
                ],
                "unique_keys" => &[],
                other => {
                    p(
                        at.clone(),
                        format!(
                            "unknown capability '{other}' (known: {})",
                            CAPABILITIES.join(", ")
                        ),
                    );
                    &[]
                }
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
        // Named queries.
        let mut query_names = HashSet::new();
        for (i, q) in self.queries.iter().enumerate() {
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
                    p(at(".filter"), why);
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
                if param.is_empty() || !param.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
                {
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
                if direction.is_some_and(|d| {
                    !d.eq_ignore_ascii_case("asc") && !d.eq_ignore_ascii_case("desc")
                }) || parts.next().is_some()
                {
                    p(
                        at(&format!(".order_by[{j}]")),
                        format!("'{o}': write 'column', 'column asc' or 'column desc'"),
                    );
                }
            }
        }
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

fn check_rules(
    c: &ColumnSpec,
    t: Option<&DataType>,
    p: &mut impl FnMut(String, String),
    at: &impl Fn(&str) -> String,
) {
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

/// A name: 1 to [`MAX_NAME_BYTES`] bytes, no control characters (names
/// are printed on terminals).
fn check_name(name: &str) -> Result<(), String> {
    if name.len() > MAX_NAME_BYTES {
        return Err(format!(
            "a name is at most {MAX_NAME_BYTES} bytes, this one has {}",
            name.len()
        ));
    }
    if name.chars().any(char::is_control) {
        return Err(format!(
            "'{}' contains control characters",
            name.escape_default()
        ));
    }
    Ok(())
}

/// A type string short and shallow enough to parse (Arrow's parser recurses
/// once per level: 100,000 nested `List(` would overflow the stack).
fn type_text(text: &str) -> Result<(), String> {
    if text.len() > MAX_TYPE_TEXT {
        return Err(format!(
            "the type is {} bytes long; at most {MAX_TYPE_TEXT}",
            text.len()
        ));
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
        return Err(format!(
            "the type nests {deepest} levels deep; at most {MAX_TYPE_DEPTH}"
        ));
    }
    Ok(())
}

/// Names inside a nested type (struct fields, list items) are printable.
fn nested_names(t: &DataType) -> Result<(), String> {
    let check = |name: &str| {
        if name.chars().any(char::is_control) || name.len() > MAX_NAME_BYTES {
            Err(format!(
                "the nested field name '{}' is not printable text of at most {MAX_NAME_BYTES} bytes",
                name.escape_default()
            ))
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
fn bounded(t: &DataType) -> Result<(), String> {
    if depth(t) > MAX_TYPE_DEPTH {
        return Err(format!(
            "the type nests {} levels deep; at most {MAX_TYPE_DEPTH}",
            depth(t)
        ));
    }
    fn widths(t: &DataType) -> Result<(), String> {
        match t {
            DataType::FixedSizeList(f, n) => {
                if *n > MAX_FIXED_SIZE {
                    return Err(format!(
                        "a fixed-size list of {n} values; at most {MAX_FIXED_SIZE}"
                    ));
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
        return Err(format!(
            "one value takes {bytes} bytes; at most {MAX_FIXED_ROW_BYTES}"
        ));
    }
    Ok(())
}

/// Whether the generic path supports a type.
fn supported(t: &DataType) -> Result<(), String> {
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
            Some(other) => Err(format!(
                "timestamps are stored without a zone or in UTC, not '{other}'"
            )),
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
        other => Err(format!("{other} is not supported")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn good() -> SchemaSpec {
        SchemaSpec::from_json(
            r#"{
              "name": "notes",
              "key": "id",
              "columns": [
                {"name": "id", "type": "Utf8", "nullable": false},
                {"name": "text", "type": "Utf8", "nullable": false, "rules": {"non_empty": true}},
                {"name": "priority", "type": "Int32", "rules": {"min": 1, "max": 5}},
                {"name": "at", "type": "Timestamp(µs)"},
                {"name": "tags", "type": "List(Utf8)"},
                {"name": "embedding", "type": "FixedSizeList(4 x Float32)"}
              ],
              "vectors": [{"column": "embedding", "dimension": 4, "metric": "cosine"}]
            }"#,
        )
        .unwrap()
    }

    #[test]
    fn a_good_spec_gives_a_keyed_schema_and_round_trips() {
        let spec = good();
        let schema = spec.check(KeyRule::IdOnly).unwrap();
        assert_eq!(
            schema.field(0).metadata().get(PRIMARY_KEY_METADATA),
            Some(&"true".to_string())
        );
        // Back from Arrow: the same columns (value rules live in the spec only).
        let back = SchemaSpec::from_arrow("notes", "id", &schema);
        let shape = |s: &SchemaSpec| {
            s.columns
                .iter()
                .map(|c| (c.name.clone(), c.data_type.clone(), c.nullable))
                .collect::<Vec<_>>()
        };
        assert_eq!(shape(&back), shape(&spec));
        assert_eq!(SchemaSpec::from_json(&spec.to_json()).unwrap(), spec);
    }

    fn problems(spec: &SchemaSpec) -> Vec<String> {
        spec.check(KeyRule::IdOnly)
            .unwrap_err()
            .problems
            .iter()
            .map(|p| p.field.clone())
            .collect()
    }

    #[test]
    fn every_problem_is_reported_naming_its_field() {
        let mut spec = good();
        spec.key = "event_id".into();
        spec.columns[2].data_type = "Float16".into();
        spec.columns[3].name = "_rowid".into();
        spec.columns.push(spec.columns[1].clone());
        spec.vectors[0].dimension = 0;
        spec.vectors[0].metric = "manhattan".into();
        spec.capabilities = vec!["telepathy".into()];
        assert_eq!(
            problems(&spec),
            [
                "columns[2].type",
                "columns[3].name",
                "columns[6].name",
                "key",
                "key",
                "vectors[0].dimension",
                "vectors[0].metric",
                "vectors[0].column",
                "capabilities[0]"
            ]
        );
    }

    #[test]
    fn each_rule_names_its_field() {
        type Mutation = Box<dyn Fn(&mut SchemaSpec)>;
        let cases: Vec<(&str, Mutation, &str)> = vec![
            (
                "nullable key",
                Box::new(|s| s.columns[0].nullable = true),
                "columns[0].nullable",
            ),
            (
                "key not Utf8",
                Box::new(|s| s.columns[0].data_type = "Int64".into()),
                "columns[0].type",
            ),
            (
                "_mem_wal",
                Box::new(|s| s.columns[1].name = "_mem_wal".into()),
                "columns[1].name",
            ),
            (
                "_anything",
                Box::new(|s| s.columns[1].name = "_x".into()),
                "columns[1].name",
            ),
            (
                "not a type",
                Box::new(|s| s.columns[1].data_type = "Text".into()),
                "columns[1].type",
            ),
            (
                "blob not binary",
                Box::new(|s| s.blob_columns = vec!["text".into()]),
                "blob_columns[0]",
            ),
            (
                "blob missing",
                Box::new(|s| s.blob_columns = vec!["nope".into()]),
                "blob_columns[0]",
            ),
            (
                "vector width",
                Box::new(|s| s.vectors[0].dimension = 8),
                "vectors[0].column",
            ),
            (
                "secondary key missing",
                Box::new(|s| s.secondary_key = Some("external_id".into())),
                "secondary_key",
            ),
            (
                "capability without its columns",
                Box::new(|s| s.capabilities = vec!["tombstones".into()]),
                "capabilities[0]",
            ),
            (
                "tombstones without content_type",
                Box::new(|s| s.capabilities = vec!["tombstones".into()]),
                "capabilities[0]",
            ),
            (
                "tombstone value",
                Box::new(|s| s.columns[1].rules.one_of = Some(vec![TOMBSTONE_CONTENT_TYPE.into()])),
                "columns[1].rules.one_of",
            ),
            (
                "min on a string",
                Box::new(|s| s.columns[1].rules.min = Some(1.0)),
                "columns[1].rules",
            ),
            (
                "zoned timestamp",
                Box::new(|s| s.columns[3].data_type = "Timestamp(µs, \"+08:00\")".into()),
                "columns[3].type",
            ),
        ];
        for (what, mutate, field) in cases {
            let mut spec = good();
            mutate(&mut spec);
            assert_eq!(problems(&spec), [field], "{what}");
        }
    }

    #[test]
    fn named_queries_bind_their_params_and_are_checked() {
        let mut spec = good();
        spec.queries = vec![QuerySpec {
            name: "by_text".into(),
            description: String::new(),
            params: vec!["text".into()],
            filter: "text = {text} AND priority > 1".into(),
            order_by: vec!["priority desc".into(), "id".into()],
            reduce: false,
        }];
        assert!(spec.check(KeyRule::IdOnly).is_ok());
        let q = &spec.queries[0];
        assert_eq!(
            q.bind(&[("text".into(), "it's".into())]).unwrap(),
            "text = 'it''s' AND priority > 1"
        );
        assert!(matches!(
            q.bind(&[]),
            Err(BindError::MissingParam { param, .. }) if param == "text"
        ));
        assert!(q.bind(&[("text".into(), String::new())]).is_err());
        assert!(q.bind(&[("x".into(), "1".into())]).is_err());
        assert_eq!(
            q.order(),
            [("priority".to_string(), true), ("id".to_string(), false)]
        );
        // Two parameters: a value that looks like a placeholder, or like SQL,
        // stays inside its own literal (the template is filled in one pass).
        let two = QuerySpec {
            name: "two".into(),
            description: String::new(),
            params: vec!["t".into(), "i".into()],
            filter: "tenant = {t} AND item = {i}".into(),
            order_by: vec![],
            reduce: false,
        };
        assert_eq!(
            two.bind(&[
                ("t".into(), "{i}".into()),
                ("i".into(), " OR 1=1 OR tenant=".into())
            ])
            .unwrap(),
            "tenant = '{i}' AND item = ' OR 1=1 OR tenant='"
        );
        // Braces inside quotes are text, not placeholders.
        let braces = QuerySpec {
            name: "braces".into(),
            description: String::new(),
            params: vec!["t".into()],
            filter: "note = '{literal}' AND tenant = {t}".into(),
            order_by: vec![],
            reduce: false,
        };
        assert_eq!(
            braces.bind(&[("t".into(), "a".into())]).unwrap(),
            "note = '{literal}' AND tenant = 'a'"
        );
        spec.queries.push(QuerySpec {
            name: "by text".into(),
            description: String::new(),
            params: vec!["unused".into()],
            filter: "text = {other}".into(),
            order_by: vec!["nope".into(), "id sideways".into()],
            reduce: false,
        });
        spec.queries.push(QuerySpec {
            name: "quoted".into(),
            description: String::new(),
            params: vec!["t".into()],
            filter: "text = '{t}'".into(),
            order_by: vec![],
            reduce: false,
        });
        assert_eq!(
            problems(&spec),
            [
                "queries[1].name",
                "queries[1].filter",
                "queries[1].params",
                "queries[1].order_by[0]",
                "queries[1].order_by[1]",
                "queries[2].filter",
                "queries[2].params"
            ]
        );
    }

    #[test]
    fn the_datagen_key_is_for_builtins_only() {
        let mut spec = good();
        spec.columns[0].name = "event_id".into();
        spec.key = "event_id".into();
        assert!(spec.check(KeyRule::Builtin).is_ok());
        assert_eq!(problems(&spec), ["key"]);
    }

    #[test]
    fn syntax_errors_name_the_line() {
        let err = SchemaSpec::from_json("{\n \"name\": 3\n}").unwrap_err();
        assert!(err.problems[0].field.starts_with("line 2"), "{err}");
        let err =
            SchemaSpec::from_json(r#"{"name":"a","key":"id","columns":[],"extra":1}"#).unwrap_err();
        assert!(err.to_string().contains("extra"), "{err}");
    }

    #[test]
    fn declared_types_are_bounded_before_and_after_parsing() {
        let with_type = |t: &str| {
            let mut spec = good();
            spec.columns[1].data_type = t.to_string();
            spec.columns[1].rules = ColumnRules::default();
            spec.check(KeyRule::IdOnly).map(|_| ())
        };
        // 100,000 nested `List(` would overflow Arrow's recursive parser: the
        // text is refused before it is parsed.
        let deep = format!("{}Int32{}", "List(".repeat(100_000), ")".repeat(100_000));
        let err = with_type(&deep).unwrap_err();
        assert!(err.to_string().contains("bytes long"), "{err}");
        let nine = format!("{}Int32{}", "List(".repeat(9), ")".repeat(9));
        let err = with_type(&nine).unwrap_err();
        assert!(err.to_string().contains("levels deep"), "{err}");
        assert!(with_type(&format!("{}Int32{}", "List(".repeat(7), ")".repeat(7))).is_ok());
        // A giant fixed-size list (a column of nulls would be n x rows).
        let err = with_type("FixedSizeList(2147483647 x Float32)").unwrap_err();
        assert!(err.to_string().contains("at most 65536"), "{err}");
        let err = with_type("FixedSizeList(65536 x FixedSizeList(65536 x Float32))").unwrap_err();
        assert!(err.to_string().contains("bytes"), "{err}");
        assert!(with_type("FixedSizeList(4096 x Float32)").is_ok());
        // Names are printable.
        let mut spec = good();
        spec.columns[1].name = "bad\u{1b}[2J".into();
        assert!(problems(&spec).contains(&"columns[1].name".to_string()));
        let mut spec = good();
        spec.columns = (0..2000)
            .map(|i| ColumnSpec {
                name: if i == 0 { "id".into() } else { format!("c{i}") },
                data_type: "Utf8".into(),
                nullable: i != 0,
                rules: ColumnRules::default(),
                metadata: BTreeMap::new(),
            })
            .collect();
        assert!(problems(&spec).contains(&"columns".to_string()));
    }
}
