//! Search and retrieval requests (the client's JSON shapes) run against a
//! named store: one path for the REST server and the CLI, so both accept the
//! same requests and refuse the same ones with the same typed errors.

use arrow_array::RecordBatch;
use lance_context_client::{Condition, RetrieveRequest, SearchRequest, TextOperator};
use lance_context_store::{
    Error, FilterValue, MAX_TEXT_QUERY, RetrieveQuery, TextQuery, VectorQuery,
};
use serde_json::Value;

use crate::NamedStore;

/// The most rows a search or a leg returns.
pub const MAX_SEARCH_K: usize = 10_000;

/// Run a search request: a vector search (rows with `_distance`) or a text
/// search (rows with `_score`). Blob columns are left out of the rows, as in
/// every other read.
pub async fn search(store: &NamedStore, request: SearchRequest) -> Result<RecordBatch, Error> {
    check_k("k", request.k)?;
    let filter = store.filter_of(request.filter.as_deref(), &conditions(&request.conditions)?)?;
    let batch = match (request.vector, request.text) {
        (Some(vector), None) => {
            if request.operator.is_some() {
                return Err(Error::invalid_argument(
                    "'operator' applies to text search only",
                ));
            }
            let mut query = VectorQuery::new(&request.column, vector, request.k);
            query.filter = filter;
            if request.nprobes == Some(0) {
                return Err(Error::invalid_argument("nprobes must be at least 1"));
            }
            query.nprobes = request.nprobes;
            store.nearest(&query).await?
        }
        (None, Some(text)) => {
            if request.nprobes.is_some() {
                return Err(Error::invalid_argument(
                    "'nprobes' applies to vector search only",
                ));
            }
            let mut query = TextQuery::new(&request.column, check_text(text)?, request.k);
            query.filter = filter;
            query.operator = operator(request.operator);
            store.search_text(&query).await?
        }
        (Some(_), Some(_)) => {
            return Err(Error::invalid_argument(
                "give 'vector' or 'text', not both (retrieve fuses the two)",
            ));
        }
        (None, None) => {
            return Err(Error::invalid_argument(
                "give 'vector' (a vector search) or 'text' (a text search)",
            ));
        }
    };
    without_blobs(store, batch)
}

/// Run a retrieval: the legs given, fused by reciprocal rank fusion.
pub async fn retrieve(store: &NamedStore, request: RetrieveRequest) -> Result<RecordBatch, Error> {
    check_k("k", request.k)?;
    let filter = store.filter_of(request.filter.as_deref(), &conditions(&request.conditions)?)?;
    let leg_k = |k: Option<usize>| -> Result<usize, Error> {
        let k = k.unwrap_or((request.k * 2).max(20)).min(MAX_SEARCH_K);
        check_k("a leg's k", k)?;
        Ok(k)
    };
    let vector = match request.vector {
        Some(leg) => Some(VectorQuery::new(&leg.column, leg.vector, leg_k(leg.k)?)),
        None => None,
    };
    let text = match request.text {
        Some(leg) => {
            let mut query = TextQuery::new(&leg.column, check_text(leg.text)?, leg_k(leg.k)?);
            query.operator = operator(leg.operator);
            Some(query)
        }
        None => None,
    };
    let mut query = RetrieveQuery::new(vector, text, request.k);
    query.filter = filter;
    if let Some(rrf_k) = request.rrf_k {
        query.rrf_k = rrf_k;
    }
    let batch = store.retrieve(&query).await?;
    without_blobs(store, batch)
}

fn check_k(what: &str, k: usize) -> Result<(), Error> {
    if k == 0 || k > MAX_SEARCH_K {
        return Err(Error::invalid_argument(format!(
            "{what} must be 1..={MAX_SEARCH_K}, got {k}"
        )));
    }
    Ok(())
}

fn check_text(text: String) -> Result<String, Error> {
    if text.len() > MAX_TEXT_QUERY {
        return Err(Error::invalid_argument(format!(
            "the query text is {} bytes; at most {MAX_TEXT_QUERY} are accepted",
            text.len()
        )));
    }
    Ok(text)
}

fn operator(op: Option<TextOperator>) -> lance_context_store::TextOperator {
    match op {
        Some(TextOperator::And) => lance_context_store::TextOperator::And,
        Some(TextOperator::Or) | None => lance_context_store::TextOperator::Or,
    }
}

fn without_blobs(store: &NamedStore, batch: RecordBatch) -> Result<RecordBatch, Error> {
    let spec = store.spec();
    let keep: Vec<usize> = batch
        .schema()
        .fields()
        .iter()
        .enumerate()
        .filter(|(_, f)| !spec.blob_columns.contains(f.name()))
        .map(|(i, _)| i)
        .collect();
    Ok(batch.project(&keep)?)
}

/// The typed conditions of a request, checked: each names a column and
/// exactly one test.
pub fn conditions(list: &[Condition]) -> Result<Vec<lance_context_store::Condition>, Error> {
    if list.len() > 64 {
        return Err(Error::invalid_argument(format!(
            "at most 64 conditions are accepted, got {}",
            list.len()
        )));
    }
    list.iter()
        .enumerate()
        .map(|(i, c)| condition(c).map_err(|m| Error::invalid_argument(format!("where[{i}]: {m}"))))
        .collect()
}

/// Why a condition of a request is not one (said after "where[N]: ").
#[derive(Debug, thiserror::Error)]
enum BadCondition {
    #[error(
        "a condition on '{0}' takes exactly one of eq, in, a range (gt/gte/lt/lte) or contains"
    )]
    NotOneTest(String),
    #[error("{0} is out of range")]
    OutOfRange(serde_json::Number),
    #[error("values are booleans, numbers or strings, not {0}")]
    NotScalar(Value),
}

fn condition(c: &Condition) -> Result<lance_context_store::Condition, BadCondition> {
    use lance_context_store::Condition as C;
    let column = c.column.clone();
    let range = [&c.gt, &c.gte, &c.lt, &c.lte].iter().any(|b| b.is_some());
    let kinds = [
        c.eq.is_some(),
        c.one_of.is_some(),
        range,
        c.contains.is_some(),
    ]
    .iter()
    .filter(|k| **k)
    .count();
    if kinds != 1 {
        return Err(BadCondition::NotOneTest(c.column.clone()));
    }
    let bound = |v: &Option<Value>| v.as_ref().map(value).transpose();
    Ok(if let Some(v) = &c.eq {
        C::Eq {
            column,
            value: value(v)?,
        }
    } else if let Some(values) = &c.one_of {
        C::In {
            column,
            values: values.iter().map(value).collect::<Result<_, _>>()?,
        }
    } else if let Some(v) = &c.contains {
        C::Contains {
            column,
            value: value(v)?,
        }
    } else {
        C::Range {
            column,
            gt: bound(&c.gt)?,
            gte: bound(&c.gte)?,
            lt: bound(&c.lt)?,
            lte: bound(&c.lte)?,
        }
    })
}

fn value(v: &Value) -> Result<FilterValue, BadCondition> {
    match v {
        Value::Bool(b) => Ok(FilterValue::Bool(*b)),
        Value::Number(n) => match (n.as_i64(), n.as_f64()) {
            (Some(i), _) => Ok(FilterValue::Int(i)),
            (None, Some(x)) => Ok(FilterValue::Float(x)),
            _ => Err(BadCondition::OutOfRange(n.clone())),
        },
        Value::String(s) => Ok(FilterValue::Text(s.clone())),
        other => Err(BadCondition::NotScalar(other.clone())),
    }
}
