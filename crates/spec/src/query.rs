//! Named queries: their declaration, and binding a caller's arguments.

use std::collections::HashSet;

use serde::{Deserialize, Serialize};

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

/// A filter template's `{` without its `}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Unclosed {
    /// The brace's byte offset.
    pub at: usize,
}

impl std::fmt::Display for Unclosed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "'{{' at byte {} is not closed", self.at)
    }
}

/// Split a filter template into text and placeholders, in one pass. Braces
/// inside single-quoted strings or double-quoted identifiers are text, not
/// placeholders (the check refuses a placeholder written inside quotes: the
/// host quotes values itself).
fn pieces(filter: &str) -> Result<Vec<Piece<'_>>, Unclosed> {
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
                let end = rest.find('}').ok_or(Unclosed { at: i })?;
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
        let pieces = pieces(&self.filter).map_err(|e| BindError::Template {
            query: self.name.clone(),
            message: e.to_string(),
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
pub(crate) fn placeholders(filter: &str) -> Result<Vec<String>, Unclosed> {
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
pub(crate) fn quoted_placeholders(filter: &str, params: &[String]) -> Vec<String> {
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
