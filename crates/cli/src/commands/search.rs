//! `store search` (vector or text) and `store retrieve` (both, fused by
//! RRF): the arguments become the REST API's request bodies, run by the same
//! code locally (`lance_context_host::search`) or sent to a server.

use anyhow::Result;
use clap::Parser;
use lance_context_client::{
    Condition, RetrieveRequest, SearchRequest, TextLeg, TextOperator, VectorLeg,
};

use crate::args::{ensure_usage, usage};

#[derive(Parser, Debug)]
pub struct SearchCommand {
    pub name: String,
    /// The vector or text column to search (a store may have several).
    #[arg(long)]
    column: String,
    /// The query vector (a vector search): a JSON array or comma-separated
    /// numbers.
    #[arg(long, allow_hyphen_values = true, conflicts_with = "text")]
    vector: Option<String>,
    /// The query text (a full-text search, by BM25, of a declared text
    /// column).
    #[arg(long)]
    text: Option<String>,
    /// Text search: every term must match (default: any term).
    #[arg(long, requires = "text")]
    all_terms: bool,
    /// How many rows.
    #[arg(long, default_value_t = 10)]
    k: usize,
    /// SQL predicate applied before ranking.
    #[arg(long)]
    filter: Option<String>,
    /// A typed condition (repeatable; all must hold): `COL=V`, `COL>V`,
    /// `COL>=V`, `COL<V`, `COL<=V`, `COL~V` (a list holds V, or a text
    /// holds it), or a JSON object (`{"column":"c","in":[1,2]}`). V is read
    /// as JSON when it parses (numbers, true, "quoted"), else as text.
    #[arg(long = "where", value_name = "CONDITION")]
    conditions: Vec<String>,
    /// IVF partitions to probe in the vector index (more: better recall,
    /// slower).
    #[arg(long)]
    nprobes: Option<usize>,
}

#[derive(Parser, Debug)]
pub struct RetrieveCommand {
    pub name: String,
    /// The vector leg's column.
    #[arg(long, requires = "vector")]
    vector_column: Option<String>,
    /// The vector leg's query vector.
    #[arg(long, allow_hyphen_values = true, requires = "vector_column")]
    vector: Option<String>,
    /// The text leg's column.
    #[arg(long, requires = "text")]
    text_column: Option<String>,
    /// The text leg's query.
    #[arg(long, requires = "text_column")]
    text: Option<String>,
    /// The text leg: every term must match.
    #[arg(long, requires = "text")]
    all_terms: bool,
    /// Fused hits returned.
    #[arg(long, default_value_t = 10)]
    k: usize,
    /// Candidates each leg ranks (default: twice --k, at least 20).
    #[arg(long)]
    leg_k: Option<usize>,
    /// The RRF constant: score = Σ 1 / (rrf_k + rank).
    #[arg(long, default_value_t = lance_context_store::DEFAULT_RRF_K)]
    rrf_k: f32,
    /// SQL predicate applied in every leg.
    #[arg(long)]
    filter: Option<String>,
    /// A typed condition applied in every leg (see `store search --where`).
    #[arg(long = "where", value_name = "CONDITION")]
    conditions: Vec<String>,
}

impl SearchCommand {
    pub fn request(&self) -> Result<SearchRequest> {
        ensure_usage(self.vector.is_some() || self.text.is_some(), || {
            "give --vector (a vector search) or --text (a text search)".into()
        })?;
        Ok(SearchRequest {
            column: self.column.clone(),
            vector: self.vector.as_deref().map(parse_vector).transpose()?,
            text: self.text.clone(),
            operator: self.all_terms.then_some(TextOperator::And),
            k: self.k,
            filter: self.filter.clone(),
            conditions: parse_conditions(&self.conditions)?,
            nprobes: self.nprobes,
        })
    }
}

impl RetrieveCommand {
    pub fn request(&self) -> Result<RetrieveRequest> {
        ensure_usage(self.vector.is_some() || self.text.is_some(), || {
            "give a vector leg (--vector-column, --vector), a text leg (--text-column, --text) or both".into()
        })?;
        let vector = match (&self.vector_column, &self.vector) {
            (Some(column), Some(v)) => Some(VectorLeg {
                column: column.clone(),
                vector: parse_vector(v)?,
                k: self.leg_k,
            }),
            _ => None,
        };
        let text = match (&self.text_column, &self.text) {
            (Some(column), Some(t)) => Some(TextLeg {
                column: column.clone(),
                text: t.clone(),
                operator: self.all_terms.then_some(TextOperator::And),
                k: self.leg_k,
            }),
            _ => None,
        };
        Ok(RetrieveRequest {
            vector,
            text,
            k: self.k,
            rrf_k: Some(self.rrf_k),
            filter: self.filter.clone(),
            conditions: parse_conditions(&self.conditions)?,
        })
    }
}

/// A query vector: a JSON array or comma-separated numbers.
pub fn parse_vector(text: &str) -> Result<Vec<f32>> {
    let trimmed = text.trim();
    if trimmed.starts_with('[') {
        return serde_json::from_str::<Vec<f32>>(trimmed)
            .map_err(|e| usage(format!("--vector: {e}")));
    }
    trimmed
        .split(',')
        .map(|v| {
            v.trim()
                .parse::<f32>()
                .map_err(|e| usage(format!("--vector: '{v}': {e}")))
        })
        .collect()
}

/// `--where` arguments as conditions.
pub fn parse_conditions(list: &[String]) -> Result<Vec<Condition>> {
    list.iter().map(|c| parse_condition(c)).collect()
}

fn parse_condition(text: &str) -> Result<Condition> {
    let text = text.trim();
    if text.starts_with('{') {
        return serde_json::from_str(text)
            .map_err(|e| usage(format!("--where {text}: not a condition object: {e}")));
    }
    // Longest operators first.
    for op in [">=", "<=", ">", "<", "~", "="] {
        if let Some((column, value)) = text.split_once(op) {
            let column = column.trim();
            ensure_usage(!column.is_empty(), || {
                format!("--where {text}: no column before '{op}'")
            })?;
            let value = value.trim();
            let value = serde_json::from_str::<serde_json::Value>(value)
                .ok()
                .filter(|v| !v.is_object() && !v.is_array() && !v.is_null())
                .unwrap_or_else(|| serde_json::Value::String(value.to_string()));
            let mut c = Condition {
                column: column.to_string(),
                ..Condition::default()
            };
            match op {
                ">=" => c.gte = Some(value),
                "<=" => c.lte = Some(value),
                ">" => c.gt = Some(value),
                "<" => c.lt = Some(value),
                "~" => c.contains = Some(value),
                _ => c.eq = Some(value),
            }
            return Ok(c);
        }
    }
    Err(usage(format!(
        "--where {text}: expected COL=V, COL>V, COL>=V, COL<V, COL<=V, COL~V or a JSON object"
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn conditions_parse_from_the_command_line() {
        let c = parse_condition("n>=3").unwrap();
        assert_eq!(c.column, "n");
        assert_eq!(c.gte, Some(serde_json::json!(3)));
        let c = parse_condition("tags~red").unwrap();
        assert_eq!(c.contains, Some(serde_json::json!("red")));
        let c = parse_condition(r#"{"column":"k","in":["a","b"]}"#).unwrap();
        assert_eq!(
            c.one_of,
            Some(vec![serde_json::json!("a"), serde_json::json!("b")])
        );
        assert!(parse_condition("novalue").is_err());
    }
}
