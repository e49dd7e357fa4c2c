//! The declaration's types and the constants both sides share.

use std::collections::BTreeMap;
use std::str::FromStr;

use arrow_schema::Schema;
use serde::{Deserialize, Serialize};

use crate::error::UnknownValue;
use crate::query::QuerySpec;

/// The plugin contract's ABI version (`lance-context:plugin@0.2.0`): what a
/// plugin's `describe` reports and the host checks.
pub const ABI_VERSION: u32 = 2;

/// The ABI versions the host loads: 1 (`lance-context:plugin@0.1.0`, no
/// text columns) and 2.
pub const SUPPORTED_ABI_VERSIONS: &[u32] = &[1, 2];

/// Field metadata marking the key column (Lance's unenforced primary key;
/// the MemWAL merges on it).
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
    /// Text columns indexed for full-text (BM25) search.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub text_columns: Vec<TextSpec>,
    /// A caller-side key (e.g. `external_id`).
    #[serde(default)]
    pub secondary_key: Option<String>,
    /// Opt-in engine behaviours (see [`Capability`]).
    #[serde(default)]
    pub capabilities: Vec<Capability>,
    /// Named queries of the schema (e.g. rollout's `trajectory`).
    #[serde(default)]
    pub queries: Vec<QuerySpec>,
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
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        serialize_with = "as_written"
    )]
    pub min: Option<f64>,
    /// Numbers: at most this.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        serialize_with = "as_written"
    )]
    pub max: Option<f64>,
    /// Strings: one of these.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub one_of: Option<Vec<String>>,
    /// Strings: at most this many characters.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_length: Option<u64>,
    /// The value filled when a record leaves the column absent or null:
    /// `"now"` for a timestamp (the host's clock at the add), else a constant
    /// of the column's type (a string, a number, a boolean). A column with a
    /// default may be non-nullable and still be left out of the input.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default: Option<serde_json::Value>,
}

/// A number as it was most likely written: an integral value (within the
/// integers a double holds exactly) as an integer, so `"min": 1` reads back
/// as `1`, not `1.0`.
fn as_written<S: serde::Serializer>(v: &Option<f64>, s: S) -> Result<S::Ok, S::Error> {
    match v {
        Some(x) if x.is_finite() && x.fract() == 0.0 && x.abs() <= 9_007_199_254_740_992.0 => {
            s.serialize_i64(*x as i64)
        }
        Some(x) => s.serialize_f64(*x),
        None => s.serialize_none(),
    }
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
    /// The distance metric.
    pub metric: Metric,
}

/// A text column indexed for full-text search (a BM25 inverted index), and
/// how its text is cut into terms. The same analysis applies to the stored
/// text and to queries. The defaults are Lance's: `simple` tokens, English,
/// lower-cased, stemmed, stop words removed, accents folded, tokens longer
/// than 40 bytes dropped.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TextSpec {
    /// A `Utf8` or `LargeUtf8` column.
    pub column: String,
    /// `simple` (split on whitespace and punctuation), `whitespace`, `raw`
    /// (the whole value is one term) or `ngram`.
    #[serde(default = "simple")]
    pub tokenizer: String,
    /// The language of stemming and stop words (see [`TEXT_LANGUAGES`]).
    #[serde(default = "english")]
    pub language: String,
    #[serde(default = "yes")]
    pub lower_case: bool,
    #[serde(default = "yes")]
    pub stem: bool,
    #[serde(default = "yes")]
    pub remove_stop_words: bool,
    /// Fold accented letters to ASCII (`café` matches `cafe`).
    #[serde(default = "yes")]
    pub ascii_folding: bool,
    /// Tokens longer than this many bytes are dropped (`null`: none are).
    #[serde(default = "forty")]
    pub max_token_length: Option<u32>,
}

fn simple() -> String {
    "simple".into()
}

fn english() -> String {
    "English".into()
}

fn forty() -> Option<u32> {
    Some(40)
}

impl TextSpec {
    /// A text column with the default analysis.
    pub fn new(column: impl Into<String>) -> Self {
        Self {
            column: column.into(),
            tokenizer: simple(),
            language: english(),
            lower_case: true,
            stem: true,
            remove_stop_words: true,
            ascii_folding: true,
            max_token_length: forty(),
        }
    }
}

/// The tokenizers a text column may use.
pub const TEXT_TOKENIZERS: &[&str] = &["simple", "whitespace", "raw", "ngram"];

/// The languages of stemming and stop words.
pub const TEXT_LANGUAGES: &[&str] = &[
    "Arabic",
    "Danish",
    "Dutch",
    "English",
    "Finnish",
    "French",
    "German",
    "Greek",
    "Hungarian",
    "Italian",
    "Norwegian",
    "Portuguese",
    "Romanian",
    "Russian",
    "Spanish",
    "Swedish",
    "Tamil",
    "Turkish",
];

/// Distance metric of a vector column; in JSON `l2`, `cosine` or `dot`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Metric {
    /// Euclidean distance.
    #[default]
    L2,
    /// 1 − cosine similarity.
    Cosine,
    /// Negative dot product.
    Dot,
}

/// An opt-in engine behaviour a schema declares; in JSON its snake_case name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Capability {
    /// Delete writes a tombstone row (needs `content_type`).
    Tombstones,
    /// Records are replaced by new versions linked through `supersedes_id` /
    /// `superseded_by_id`.
    Supersession,
    /// Expired (`expires_at`) and retired (`lifecycle_status`, `retired_at`)
    /// records are hidden from reads.
    Lifecycle,
    /// The key, and the secondary key when declared, are unique among stored
    /// non-tombstone records on add.
    UniqueKeys,
}

macro_rules! named_values {
    ($ty:ident, $what:literal, $($variant:ident => $name:literal),+ $(,)?) => {
        impl $ty {
            /// Every value, in declaration order.
            pub const ALL: &'static [$ty] = &[$($ty::$variant),+];

            /// The value's name (its JSON form).
            pub fn as_str(self) -> &'static str {
                match self {
                    $($ty::$variant => $name),+
                }
            }
        }

        impl std::fmt::Display for $ty {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.as_str())
            }
        }

        impl FromStr for $ty {
            type Err = UnknownValue;

            fn from_str(s: &str) -> Result<Self, UnknownValue> {
                match s {
                    $($name => Ok($ty::$variant),)+
                    _ => Err(UnknownValue {
                        what: $what,
                        value: s.to_string(),
                        known: [$($name),+].join(", "),
                    }),
                }
            }
        }
    };
}

named_values!(Metric, "metric", L2 => "l2", Cosine => "cosine", Dot => "dot");
named_values!(
    Capability,
    "capability",
    Tombstones => "tombstones",
    Supersession => "supersession",
    Lifecycle => "lifecycle",
    UniqueKeys => "unique_keys",
);

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
            text_columns: Vec::new(),
            secondary_key: None,
            capabilities: Vec::new(),
            queries: Vec::new(),
        }
    }

    /// Whether a capability is declared.
    pub fn has(&self, capability: Capability) -> bool {
        self.capabilities.contains(&capability)
    }
}
