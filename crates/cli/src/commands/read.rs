//! The reading store commands — `get`, `scan`, `count`, `query`, `search`,
//! `retrieve`, `versions` — over the store API: one code path, where the
//! data root is (each read opens the store read-only: no writer is
//! claimed) and with `--server`.

use anyhow::Result;
use lance_context_client::{CountParams, GetMany, ListParams, QueryRequest, QueryResult, StoreApi};
use serde_json::Value;

use super::search::{RetrieveCommand, SearchCommand};
use super::through::{Via, failed};
use crate::args::ScanArgs;
use crate::output::Out;

/// `store get`: the records with these keys, then a not-found error naming
/// the keys that have none (exit code 3).
pub async fn get<A: StoreApi>(
    api: &A,
    via: Via,
    name: &str,
    ids: &[String],
    columns: Option<Vec<String>>,
    as_of: Option<u64>,
    out: Out,
) -> Result<()> {
    let key = key_of(api, via, name).await?;
    let keys: Vec<&str> = ids.iter().map(String::as_str).collect();
    // Each record once, however often its key is asked for.
    let mut asked = std::collections::HashSet::new();
    let unique: Vec<String> = ids.iter().filter(|k| asked.insert(*k)).cloned().collect();
    let mut found_keys = std::collections::HashSet::new();
    let mut printed = Vec::new();
    // As many keys per lookup as the implementation takes at once.
    for chunk in unique.chunks(api.page_limit().max(1)) {
        let request = GetMany {
            keys: chunk.to_vec(),
            columns: columns.clone(),
            as_of,
        };
        let rows = api
            .lookup(name, &request)
            .await
            .map_err(|e| failed(e, via))?;
        for record in rows.values()? {
            if let Some(k) = record.get(&key).and_then(Value::as_str) {
                found_keys.insert(k.to_string());
            }
        }
        printed.push(rows);
    }
    for rows in &printed {
        out.records(rows)?;
    }
    let found = found_keys.iter().map(String::as_str).collect();
    super::report::missing(&key, &keys, &found)
}

/// The key column of store `name`, from its declaration.
async fn key_of<A: StoreApi>(api: &A, via: Via, name: &str) -> Result<String> {
    let info = api.describe_store(name).await.map_err(|e| failed(e, via))?;
    Ok(info.spec["key"].as_str().unwrap_or("id").to_string())
}

/// `store scan`: every matching record (or `--limit` of them), read a page
/// at a time (the implementation's largest: 10,000 through a server, the
/// whole store in one read where the data root is): in key order by the
/// API's cursor when no order or offset is given, else by offsets in the
/// given order (the key's when none; ties in key order).
pub async fn scan<A: StoreApi>(
    api: &A,
    via: Via,
    name: &str,
    scan: ScanArgs,
    as_of: Option<u64>,
    out: Out,
) -> Result<()> {
    let by_cursor = scan.order_by.is_empty() && scan.offset.is_none();
    let order_by = match (by_cursor, scan.order_by.is_empty()) {
        (true, _) => None,
        (false, false) => Some(scan.order_by.join(",")),
        // An offset needs a stable order: the key's.
        (false, true) => Some(key_of(api, via, name).await?),
    };
    let mut params = ListParams {
        filter: scan.filter,
        order_by,
        columns: scan.columns.map(|c| c.join(",")),
        limit: None,
        offset: scan.offset,
        cursor: None,
        as_of,
    };
    let mut pages = Vec::new();
    let mut read = 0usize;
    let page_limit = api.page_limit().max(1);
    loop {
        let want = scan
            .limit
            .map_or(page_limit, |l| (l - read).min(page_limit));
        if want == 0 {
            break;
        }
        params.limit = Some(want);
        let page = api.list(name, &params).await.map_err(|e| failed(e, via))?;
        let got = page.records.values()?.len();
        read += got;
        pages.push(page.records);
        if got < want {
            break;
        }
        match (by_cursor, page.next_cursor) {
            (true, Some(cursor)) => params.cursor = Some(cursor),
            (true, None) => break,
            (false, _) => params.offset = Some(params.offset.unwrap_or(0) + got),
        }
    }
    print_pages(&out, pages)
}

/// Pages of records printed as one list: JSON lines page after page, or
/// one table (the pages' JSON joined as written: columns keep their order).
fn print_pages(out: &Out, pages: Vec<lance_context_client::Rows>) -> Result<()> {
    if out.json || pages.len() == 1 {
        for page in &pages {
            out.records(page)?;
        }
        return Ok(());
    }
    let inner: Vec<&str> = pages
        .iter()
        .map(|p| {
            let text = p.as_json().trim();
            text.strip_prefix('[')
                .and_then(|t| t.strip_suffix(']'))
                .unwrap_or(text)
                .trim()
        })
        .filter(|t| !t.is_empty())
        .collect();
    let joined = format!("[{}]", inner.join(","));
    out.records(&lance_context_client::Rows::from_json(joined)?)
}

/// `store count`.
pub async fn count<A: StoreApi>(
    api: &A,
    via: Via,
    name: &str,
    filter: Option<String>,
    as_of: Option<u64>,
    out: Out,
) -> Result<()> {
    let params = CountParams { filter, as_of };
    let count = api
        .count(name, &params)
        .await
        .map_err(|e| failed(e, via))?
        .count;
    out.item(&serde_json::json!({ "count": count }), || count.to_string())
}

/// `store query NAME QUERY`: a named query's records or reduced JSON; with
/// no query, the schema's queries.
pub async fn query<A: StoreApi>(
    api: &A,
    via: Via,
    name: &str,
    query: Option<&str>,
    args: Vec<(String, String)>,
    as_of: Option<u64>,
    out: Out,
) -> Result<()> {
    let Some(query) = query else {
        let info = api.describe_store(name).await.map_err(|e| failed(e, via))?;
        return print_queries(&out, &info.spec);
    };
    let request = QueryRequest {
        args: args.into_iter().collect(),
        as_of,
    };
    match api
        .query_with(name, query, &request)
        .await
        .map_err(|e| failed(e, via))?
    {
        QueryResult::Reduced { result } => {
            println!("{}", result.get());
            Ok(())
        }
        QueryResult::Records { records } => out.records(&records),
    }
}

/// A schema's named queries (`store query NAME` without a query), from its
/// declaration.
fn print_queries(out: &Out, spec: &Value) -> Result<()> {
    let queries: Vec<Value> = spec["queries"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|q| {
            serde_json::json!({
                "query": q["name"],
                "params": q["params"],
                "description": q["description"],
                "reduce": q["reduce"].as_bool().unwrap_or(false),
            })
        })
        .collect();
    out.list(
        &queries,
        &["query", "arguments", "description"],
        |q| {
            vec![
                q["query"].as_str().unwrap_or_default().to_string(),
                q["params"]
                    .as_array()
                    .map(|ps| {
                        ps.iter()
                            .map(|p| format!("--arg {}=…", p.as_str().unwrap_or("")))
                            .collect::<Vec<_>>()
                            .join(" ")
                    })
                    .unwrap_or_default(),
                format!(
                    "{}{}",
                    q["description"].as_str().unwrap_or_default(),
                    if q["reduce"].as_bool().unwrap_or(false) {
                        " (reduces to JSON)"
                    } else {
                        ""
                    }
                ),
            ]
        },
        "the schema declares no named queries",
    )
}

/// `store search`.
pub async fn search<A: StoreApi>(api: &A, via: Via, c: &SearchCommand, out: Out) -> Result<()> {
    let rows = api
        .search(&c.name, &c.request()?)
        .await
        .map_err(|e| failed(e, via))?;
    out.records(&rows)
}

/// `store retrieve`.
pub async fn retrieve<A: StoreApi>(api: &A, via: Via, c: &RetrieveCommand, out: Out) -> Result<()> {
    let rows = api
        .retrieve(&c.name, &c.request()?)
        .await
        .map_err(|e| failed(e, via))?;
    out.records(&rows)
}

/// `store versions`: the base table's kept versions (what `--as-of` reads).
pub async fn versions<A: StoreApi>(api: &A, via: Via, name: &str, out: Out) -> Result<()> {
    let versions = api.versions(name).await.map_err(|e| failed(e, via))?;
    out.list(
        &versions,
        &["version", "committed (UTC)", "current"],
        |v| {
            vec![
                v.version.to_string(),
                v.timestamp.clone().unwrap_or_default(),
                if v.current {
                    "*".to_string()
                } else {
                    String::new()
                },
            ]
        },
        "no versions",
    )
}
