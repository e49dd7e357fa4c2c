//! `lance-context store --server URL …`: the store commands whose output
//! differs from the store API's answers (create, drop, add, get, scan,
//! count, query, delete), through a running server (`lance-context serve`).

use std::path::PathBuf;

use anyhow::Result;
use lance_context_client::{Client, ClientError, CreateStore, ListParams, QueryResult, StoreApi};
use serde_json::Value;

use crate::args::{ScanArgs, usage};
use crate::input::{Format, Input, Raw};
use crate::output::Out;

use super::through::{self, Via};

/// A server's answer as this CLI's error.
fn failed(e: ClientError) -> anyhow::Error {
    through::failed(e, Via::Server)
}

/// `store create --server`.
pub async fn create(client: &Client, create: CreateStore, out: Out) -> Result<()> {
    let info = client.create_store(&create).await.map_err(failed)?;
    let columns = info.spec["columns"].as_array().map_or(0, Vec::len);
    let created = serde_json::json!({
        "store": info.name,
        "uri": info.uri,
        "columns": columns,
        "plugin": info.plugin.name,
        "plugin_version": info.plugin.version,
        "sha256": info.plugin.sha256,
    });
    out.item(&created, || {
        format!(
            "created store '{}' at {} ({columns} columns, plugin {} {} sha256 {}) through the server",
            info.name,
            info.uri,
            info.plugin.name,
            info.plugin.version,
            &info.plugin.sha256[..12.min(info.plugin.sha256.len())]
        )
    })
}

/// `store drop --server`.
pub async fn drop(client: &Client, name: &str, out: Out) -> Result<()> {
    let dropped = client.drop_store(name).await.map_err(failed)?;
    out.item(&dropped, || {
        format!(
            "dropped store '{}' through the server\n{}  {}",
            dropped.store,
            match dropped.data_deleted {
                true => "removed data:",
                false => "kept data:   ",
            },
            dropped.uri
        )
    })
}

/// `store count --server`: the store's row count when nothing is
/// filtered, else the matching records' keys counted page by page.
pub async fn count(client: &Client, name: &str, filter: Option<String>) -> Result<u64> {
    let Some(filter) = filter else {
        return Ok(client.stats(name).await.map_err(failed)?.rows);
    };
    let key = key_of(client, name).await?;
    let mut params = ListParams {
        filter: Some(filter),
        columns: Some(key),
        limit: Some(10_000),
        ..Default::default()
    };
    let mut count = 0u64;
    loop {
        let page = client.list(name, &params).await.map_err(failed)?;
        count += page.records.values()?.len() as u64;
        match page.next_cursor {
            Some(cursor) => params.cursor = Some(cursor),
            None => return Ok(count),
        }
    }
}

/// `store delete --server`: each key in turn (one request each).
pub async fn delete(client: &Client, name: &str, keys: &[String], out: Out) -> Result<()> {
    let mut deleted: Vec<lance_context_client::Deleted> = Vec::with_capacity(keys.len());
    for key in keys {
        match client.delete(name, key).await {
            Ok(d) => deleted.push(d),
            // Said: which keys were deleted before this one failed.
            Err(e) if deleted.iter().any(|d| d.deleted) => {
                let done: Vec<&str> = deleted
                    .iter()
                    .filter(|d| d.deleted)
                    .map(|d| d.key.as_str())
                    .collect();
                return Err(failed(e).context(format!(
                    "deleting '{key}' (deleted before it: {})",
                    done.join(", ")
                )));
            }
            Err(e) => return Err(failed(e)),
        }
    }
    through::print_deleted(&out, &deleted)
}

/// Add a file's records through the server, a batch per request.
pub async fn add(
    client: &Client,
    name: &str,
    file: Option<&PathBuf>,
    format: Option<Format>,
    batch_rows: usize,
    out: Out,
) -> Result<()> {
    let format = Format::pick(format, file.map(PathBuf::as_path));
    let mut input = Input::open(file, format, batch_rows)?;
    let bar = out.bar(input.total, &format!("adding to {name}"));
    let (mut added, mut batches) = (0usize, 0usize);
    let started = std::time::Instant::now();
    while let Some(raw) = input.next_raw()? {
        let (result, lines, first) = match raw {
            Raw::Lines { lines, text } => (
                client
                    .raw(
                        "POST",
                        &format!("/api/v1/stores/{name}/records"),
                        "application/x-ndjson",
                        text,
                    )
                    .await
                    .map_err(failed)?,
                Some(lines),
                0,
            ),
            Raw::Batch { batch, first } => {
                let bytes = lance_context_wire::encode(&[batch])
                    .map_err(|e| usage(format!("encoding rows {first}…: {e}")))?;
                (
                    client
                        .raw(
                            "POST",
                            &format!("/api/v1/stores/{name}/records"),
                            "application/vnd.apache.arrow.stream",
                            bytes,
                        )
                        .await
                        .map_err(failed)?,
                    None,
                    first,
                )
            }
        };
        let (status, body) = result;
        let at = |record: u64| match &lines {
            Some(lines) => format!("line {}", lines.get(record as usize).copied().unwrap_or(0)),
            None => format!("row {}", first + record as usize),
        };
        if status != 201 {
            let error: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
            let mut message = error["error"]["message"]
                .as_str()
                .unwrap_or("the server refused the batch")
                .to_string();
            let mut details = error["error"]["details"].clone();
            let (verb, key) = if details["row_errors"].is_array() {
                ("rejected", "row_errors")
            } else {
                ("refused", "input_errors")
            };
            let total = details["total"].as_u64();
            if let Some(rows) = details[key].as_array_mut() {
                // Where each problem is, as a local store says it ("line 31").
                // (The batch's own record number means nothing to the user.)
                for r in rows.iter_mut() {
                    let place = at(r["record"].as_u64().unwrap_or(0));
                    r["at"] = Value::String(place);
                    if let Some(r) = r.as_object_mut() {
                        r.remove("record");
                    }
                }
                if !out.json_errors {
                    for r in rows.iter() {
                        let line = format!(
                            "{verb}: {}{}: {}",
                            r["at"].as_str().unwrap_or_default(),
                            r["column"]
                                .as_str()
                                .map(|c| format!(", column '{c}'"))
                                .unwrap_or_default(),
                            r["message"].as_str().unwrap_or_default()
                        );
                        // The server's text, escaped as errors are.
                        eprintln!("{}", crate::exit::printable(&line));
                    }
                }
                let total = total.unwrap_or(rows.len() as u64);
                let whereabouts = if out.json_errors {
                    "listed in the details"
                } else {
                    "listed above"
                };
                message = format!("{total} record problem(s), {whereabouts}");
            } else if let Some(record) = details["record"].as_u64() {
                message = format!("{}: {message}", at(record));
            }
            let code = error["error"]["code"].as_str().unwrap_or("internal");
            bar.finish_and_clear();
            return Err(failed(ClientError::Api {
                status,
                error: lance_context_client::ApiError {
                    code: code.to_string(),
                    message: match code {
                        // The write goes on past the deadline: it may land.
                        "deadline" => format!(
                            "{message} ({added} record(s) added before this batch; this batch \
                             may still land: look its keys up before sending it again)"
                        ),
                        _ => format!(
                            "{message} ({added} record(s) added before this batch, none from it)"
                        ),
                    },
                    // With --json the problems travel here (in the error
                    // object on stderr), as from a local store.
                    details: if out.json_errors {
                        details
                    } else {
                        Value::Null
                    },
                },
            }));
        }
        let reply: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
        added += reply["added"].as_u64().unwrap_or(0) as usize;
        batches += 1;
        match input.total {
            Some(_) => bar.set_position(input.progress),
            None => bar.set_position(added as u64),
        }
    }
    bar.finish_and_clear();
    if added == 0 {
        return Err(usage("no records in the input"));
    }
    let seconds = started.elapsed().as_secs_f64();
    out.item(
        &serde_json::json!({
            "store": name, "records": added, "rejected": 0, "batches": batches, "dry_run": false,
            "seconds": seconds, "records_per_second": added as f64 / seconds.max(1e-9),
        }),
        || format!("added {added} record(s) to '{name}' through the server in {batches} batch(es), {seconds:.1} s"),
    )
}

pub async fn get(client: &Client, name: &str, ids: &[String], out: Out) -> Result<()> {
    let keys: Vec<&str> = ids.iter().map(String::as_str).collect();
    let key = key_of(client, name).await?;
    let records = client
        .get_many(name, &keys)
        .await
        .map_err(failed)?
        .values()?;
    out.values(&records)?;
    let found = records
        .iter()
        .filter_map(|r| r.get(&key).and_then(Value::as_str))
        .collect();
    super::report::missing(&key, &keys, &found)
}

/// The key column of store `name`, from its declaration.
async fn key_of(client: &Client, name: &str) -> Result<String> {
    Ok(
        client.describe_store(name).await.map_err(failed)?.spec["key"]
            .as_str()
            .unwrap_or("id")
            .to_string(),
    )
}

/// `store scan --server`: every matching record (or `--limit` of them),
/// as where the data root is, fetched a page (at most 10,000 records) at a
/// time: in key order by the server's cursor when no order or offset is
/// given, else by offsets in the given order (the key's when none).
pub async fn scan(client: &Client, name: &str, scan: ScanArgs, out: Out) -> Result<()> {
    const PAGE: usize = 10_000;
    let by_cursor = scan.order_by.is_empty() && scan.offset.is_none();
    let order_by = match (by_cursor, scan.order_by.is_empty()) {
        (true, _) => None,
        (false, false) => Some(scan.order_by.join(",")),
        // An offset needs a stable order: the key's.
        (false, true) => Some(key_of(client, name).await?),
    };
    let mut params = ListParams {
        filter: scan.filter,
        order_by,
        columns: scan.columns.map(|c| c.join(",")),
        limit: None,
        offset: scan.offset,
        cursor: None,
    };
    let mut all = Vec::new();
    loop {
        let want = scan.limit.map_or(PAGE, |l| (l - all.len()).min(PAGE));
        if want == 0 {
            break;
        }
        params.limit = Some(want);
        let page = client.list(name, &params).await.map_err(failed)?;
        let rows = page.records.values()?;
        let got = rows.len();
        all.extend(rows);
        if got < want {
            break;
        }
        match (by_cursor, page.next_cursor) {
            (true, Some(cursor)) => params.cursor = Some(cursor),
            (true, None) => break,
            (false, _) => params.offset = Some(params.offset.unwrap_or(0) + got),
        }
    }
    out.values(&all)
}

pub async fn query(
    client: &Client,
    name: &str,
    query: &str,
    args: &[(String, String)],
    out: Out,
) -> Result<()> {
    let args: Vec<(&str, &str)> = args.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    match client.query(name, query, &args).await.map_err(failed)? {
        QueryResult::Reduced { result } => {
            println!("{}", result.get());
            Ok(())
        }
        QueryResult::Records { records } => out.values(&records.values()?),
    }
}
