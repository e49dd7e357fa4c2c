//! The schema declaration a plugin's `describe` returns.

use std::collections::HashMap;

use arrow_schema::{DataType, Field, Schema};

pub use lance_context_wire::{
    ABI_VERSION, Capability, Metric, PRIMARY_KEY_METADATA, TOMBSTONE_CONTENT_TYPE,
};

/// A non-null Utf8 key column tagged as primary key.
pub fn key_field(name: &str) -> Field {
    Field::new(name, DataType::Utf8, false).with_metadata(HashMap::from([(
        PRIMARY_KEY_METADATA.to_string(),
        "true".to_string(),
    )]))
}

/// A vector column declaration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VectorColumn {
    pub name: String,
    pub dimension: u32,
    pub metric: Metric,
}

/// A text column indexed for full-text (BM25) search (Utf8 or LargeUtf8).
/// [`TextColumn::new`] gives Lance's default analysis: `simple` tokens,
/// English, lower-cased, stemmed, stop words removed, accents folded, tokens
/// over 40 bytes dropped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TextColumn {
    pub name: String,
    /// `simple`, `whitespace`, `raw` or `ngram`.
    pub tokenizer: String,
    /// Stemming and stop-word language, e.g. `English`.
    pub language: String,
    pub lower_case: bool,
    pub stem: bool,
    pub remove_stop_words: bool,
    pub ascii_folding: bool,
    pub max_token_length: Option<u32>,
}

impl TextColumn {
    /// `name` with the default analysis.
    pub fn new(name: &str) -> Self {
        Self {
            name: name.to_string(),
            tokenizer: "simple".to_string(),
            language: "English".to_string(),
            lower_case: true,
            stem: true,
            remove_stop_words: true,
            ascii_folding: true,
            max_token_length: Some(40),
        }
    }
}

/// Opt-in engine behaviours.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Capabilities {
    pub tombstones: bool,
    pub supersession: bool,
    pub lifecycle: bool,
    /// Key and secondary key unique among stored non-tombstone records.
    pub unique_keys: bool,
}

/// A named query: a filter template with `{param}` placeholders and an order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NamedQuery {
    pub name: String,
    pub description: String,
    pub params: Vec<String>,
    pub filter: String,
    /// `column` or `column desc`.
    pub order_by: Vec<String>,
    /// The rows go to [`crate::Plugin::reduce`], whose JSON is the result.
    pub reduce: bool,
}

/// What `describe` declares.
#[derive(Debug, Clone, PartialEq)]
pub struct Declaration {
    pub name: String,
    pub version: String,
    pub schema: Schema,
    pub key_column: String,
    pub blob_columns: Vec<String>,
    pub vector_columns: Vec<VectorColumn>,
    /// Full-text columns (ABI 2).
    pub text_columns: Vec<TextColumn>,
    pub secondary_key: Option<String>,
    pub capabilities: Capabilities,
    pub has_transform: bool,
    pub queries: Vec<NamedQuery>,
}

impl Declaration {
    /// A declaration keyed by `id`, with no blobs, vectors or capabilities.
    pub fn new(name: &str, version: &str, schema: Schema) -> Self {
        Self {
            name: name.to_string(),
            version: version.to_string(),
            schema,
            key_column: "id".to_string(),
            blob_columns: Vec::new(),
            vector_columns: Vec::new(),
            text_columns: Vec::new(),
            secondary_key: None,
            capabilities: Capabilities::default(),
            has_transform: false,
            queries: Vec::new(),
        }
    }

    /// Use another key column (e.g. datagen's `event_id`).
    pub fn with_key(mut self, key: &str) -> Self {
        self.key_column = key.to_string();
        self
    }

    /// Declare a vector column.
    pub fn with_vector(mut self, name: &str, dimension: u32, metric: Metric) -> Self {
        self.vector_columns.push(VectorColumn {
            name: name.to_string(),
            dimension,
            metric,
        });
        self
    }

    /// Declare a text column for full-text search, with the default
    /// analysis (see [`TextColumn::new`]; [`Self::with_text_column`] takes
    /// other options).
    pub fn with_text(self, name: &str) -> Self {
        self.with_text_column(TextColumn::new(name))
    }

    /// Declare a text column for full-text search.
    pub fn with_text_column(mut self, column: TextColumn) -> Self {
        self.text_columns.push(column);
        self
    }

    /// Declare a blob column.
    pub fn with_blob(mut self, name: &str) -> Self {
        self.blob_columns.push(name.to_string());
        self
    }

    /// Declare a named query, e.g. `with_query("trajectory", "…",
    /// &["rollout_id"], "rollout_id = {rollout_id}", &["sequence_order", "id"])`.
    pub fn with_query(
        mut self,
        name: &str,
        description: &str,
        params: &[&str],
        filter: &str,
        order_by: &[&str],
    ) -> Self {
        self.queries.push(NamedQuery {
            name: name.to_string(),
            description: description.to_string(),
            params: params.iter().map(|p| p.to_string()).collect(),
            filter: filter.to_string(),
            order_by: order_by.iter().map(|o| o.to_string()).collect(),
            reduce: false,
        });
        self
    }

    /// Declare a named query whose rows [`crate::Plugin::reduce`] turns into
    /// a JSON document.
    pub fn with_reduce_query(
        mut self,
        name: &str,
        description: &str,
        params: &[&str],
        filter: &str,
        order_by: &[&str],
    ) -> Self {
        self = self.with_query(name, description, params, filter, order_by);
        if let Some(q) = self.queries.last_mut() {
            q.reduce = true;
        }
        self
    }

    /// Say that `transform` does something.
    pub fn with_transform(mut self) -> Self {
        self.has_transform = true;
        self
    }
}
