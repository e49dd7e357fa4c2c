//! The contract (`wit/plugin.wit`, `lance-context:plugin@0.2.0`): the only
//! module that sees the generated bindings, and the conversions of what a
//! plugin returns into bounded host types.
//!
//! Results are lifted into owned values by wasmtime, which charges every
//! byte it copies out of the guest against the store's *hostcall fuel*; the
//! runtime sets that fuel per call to the call's output cap. So a plugin that
//! returns a million row errors aliasing one 100 MB string makes the lift
//! fail at the cap (reported as [`PluginError::MalformedOutput`]) instead of
//! making the host copy every alias. What survives the lift is bounded again
//! here: row errors beyond [`MAX_ROW_ERRORS`] are counted, not kept, and
//! plugin text is cut and escaped ([`plugin_text`]). Declarations are exact:
//! a list or a string over its bound is refused, never cut.

use super::error::{PluginError, RowError, plugin_text};

// The core world: what every component exports (0.1.0's functions). A 0.2.0
// component's `describe-text` is looked up on the instance by name
// ([`DESCRIBE_TEXT`]), so 0.1.0 components load unchanged.
wasmtime::component::bindgen!({
    world: "schema-plugin-core",
    path: "../../wit",
});

pub(crate) use lance_context::plugin::types::{Capabilities, Metric, TextColumn};

/// The export ABI 2 components add: their text columns.
pub(crate) const DESCRIBE_TEXT: &str = "describe-text";

/// Bound what `describe-text` returned: names and options printable, the
/// list within [`MAX_DECLARATION_ITEMS`].
pub(crate) fn text_columns(
    plugin: &str,
    list: Vec<TextColumn>,
) -> Result<Vec<crate::spec::TextSpec>, PluginError> {
    items(plugin, "text columns", list)?
        .into_iter()
        .map(|t| {
            Ok(crate::spec::TextSpec {
                column: text(plugin, "a text column's name", t.name)?,
                tokenizer: text(plugin, "a text column's tokenizer", t.tokenizer)?,
                language: text(plugin, "a text column's language", t.language)?,
                lower_case: t.lower_case,
                stem: t.stem,
                remove_stop_words: t.remove_stop_words,
                ascii_folding: t.ascii_folding,
                max_token_length: t.max_token_length,
            })
        })
        .collect()
}

/// Longest plugin-supplied message kept (row errors, refusals, panics).
pub(crate) const MAX_MESSAGE: usize = 1024;
/// Longest plugin-supplied name kept (plugin name, version, column, code).
pub(crate) const MAX_NAME: usize = 256;
/// Row errors kept from one call (the total is still reported).
pub(crate) const MAX_ROW_ERRORS: usize = 1000;
/// Entries of one declaration list (blob columns, vectors, queries, params…).
pub(crate) const MAX_DECLARATION_ITEMS: usize = 1024;
/// Bytes of one declaration string (a filter, a description, a column name).
pub(crate) const MAX_DECLARATION_TEXT: usize = 16 << 10;
/// Bytes `describe` may hand the host in all (its hostcall fuel).
pub(crate) const DESCRIBE_BYTES: usize = 8 << 20;
/// Bytes of row errors and messages a failed call may hand the host.
pub(crate) const ERROR_BYTES: usize = 64 << 20;

/// A `batch-error` about a batch of `batch_rows` rows as a host error: the
/// first [`MAX_ROW_ERRORS`] row errors (printable) with the total, or the
/// malformed-input message. A row error naming a row the batch does not
/// have is the plugin's malformed output (its row is a plugin-supplied
/// number: checked before anything uses it).
pub(crate) fn batch_error(plugin: &str, e: BatchError, batch_rows: usize) -> PluginError {
    match e {
        BatchError::Rows(rows) => {
            if let Some(bad) = rows
                .iter()
                .find(|r| usize::try_from(r.row).map_or(true, |row| row >= batch_rows))
            {
                return PluginError::MalformedOutput {
                    plugin: plugin.to_string(),
                    message: format!(
                        "a row error names row {} of a batch of {batch_rows} rows",
                        bad.row
                    ),
                };
            }
            let total = rows.len();
            let errors = rows
                .into_iter()
                .take(MAX_ROW_ERRORS)
                .map(|r| RowError {
                    row: r.row,
                    column: r.column.map(|c| plugin_text(&c, MAX_NAME)),
                    code: plugin_text(&r.code, MAX_NAME),
                    message: plugin_text(&r.message, MAX_MESSAGE),
                })
                .collect();
            PluginError::Rejected {
                plugin: plugin.to_string(),
                errors,
                total,
            }
        }
        BatchError::MalformedInput(message) => PluginError::MalformedInput {
            plugin: plugin.to_string(),
            message: plugin_text(&message, MAX_MESSAGE),
        },
    }
}

/// A declaration as the plugin gave it: bounded, names printable, not yet
/// checked against the spec rules.
#[derive(Debug)]
pub(crate) struct RawDeclaration {
    pub name: String,
    pub version: String,
    pub abi_version: u32,
    pub arrow_schema: Vec<u8>,
    pub key_column: String,
    pub blob_columns: Vec<String>,
    pub vectors: Vec<(String, u32, Metric)>,
    /// From `describe-text` (ABI 2); none for ABI 1.
    pub text_columns: Vec<crate::spec::TextSpec>,
    pub secondary_key: Option<String>,
    pub capabilities: Vec<crate::spec::Capability>,
    pub has_transform: bool,
    pub queries: Vec<crate::spec::QuerySpec>,
}

fn too_many(plugin: &str, what: &'static str, size: usize, limit: usize) -> PluginError {
    PluginError::OutputTooLarge {
        plugin: plugin.to_string(),
        what,
        size,
        limit,
    }
}

fn items<T>(plugin: &str, what: &'static str, list: Vec<T>) -> Result<Vec<T>, PluginError> {
    if list.len() > MAX_DECLARATION_ITEMS {
        return Err(too_many(plugin, what, list.len(), MAX_DECLARATION_ITEMS));
    }
    Ok(list)
}

fn text(plugin: &str, what: &'static str, s: String) -> Result<String, PluginError> {
    if s.len() > MAX_DECLARATION_TEXT {
        return Err(too_many(plugin, what, s.len(), MAX_DECLARATION_TEXT));
    }
    Ok(s)
}

fn texts(plugin: &str, what: &'static str, list: Vec<String>) -> Result<Vec<String>, PluginError> {
    items(plugin, what, list)?
        .into_iter()
        .map(|s| text(plugin, what, s))
        .collect()
}

/// Bound a declaration (see the module docs).
pub(crate) fn declaration(plugin: &str, d: SchemaDecl) -> Result<RawDeclaration, PluginError> {
    let vectors = items(plugin, "vector columns", d.vector_columns)?
        .into_iter()
        .map(|v| {
            Ok((
                text(plugin, "a vector column's name", v.name)?,
                v.dimension,
                v.metric,
            ))
        })
        .collect::<Result<Vec<_>, PluginError>>()?;
    let queries = items(plugin, "queries", d.queries)?
        .into_iter()
        .map(|q| {
            Ok(crate::spec::QuerySpec {
                name: text(plugin, "a query's name", q.name)?,
                description: text(plugin, "a query's description", q.description)?,
                params: texts(plugin, "a query's params", q.params)?,
                filter: text(plugin, "a query's filter", q.filter)?,
                order_by: texts(plugin, "a query's order", q.order_by)?,
                reduce: q.reduce,
            })
        })
        .collect::<Result<Vec<_>, PluginError>>()?;
    use crate::spec::Capability;
    let capabilities = [
        (Capabilities::TOMBSTONES, Capability::Tombstones),
        (Capabilities::SUPERSESSION, Capability::Supersession),
        (Capabilities::LIFECYCLE, Capability::Lifecycle),
        (Capabilities::UNIQUE_KEYS, Capability::UniqueKeys),
    ]
    .into_iter()
    .filter(|(flag, _)| d.capabilities.contains(*flag))
    .map(|(_, name)| name)
    .collect();
    Ok(RawDeclaration {
        name: plugin_text(&d.name, MAX_NAME),
        version: plugin_text(&d.version, MAX_NAME),
        abi_version: d.abi_version,
        arrow_schema: d.arrow_schema,
        key_column: text(plugin, "the key column's name", d.key_column)?,
        blob_columns: texts(plugin, "blob columns", d.blob_columns)?,
        vectors,
        text_columns: Vec::new(),
        secondary_key: d
            .secondary_key
            .map(|s| text(plugin, "the secondary key's name", s))
            .transpose()?,
        capabilities,
        has_transform: d.has_transform,
        queries,
    })
}
