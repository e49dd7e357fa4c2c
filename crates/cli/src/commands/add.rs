//! `lance-context store add`: a file's records through the store API, a
//! batch per call — the same code where the data root is and with
//! `--server`. Each batch goes as read (JSON Lines text, or Arrow IPC for
//! Arrow and Parquet input); the store's refusals are said by the input's
//! line or row. (`--dry-run` and `--reject-file` run the plugin in this
//! process: `store.rs`.)

use std::path::PathBuf;

use anyhow::Result;
use lance_context_client::{ClientError, RecordsBody, StoreApi};
use serde_json::Value;

use crate::args::usage;
use crate::input::{Format, Input, Raw};
use crate::output::Out;

use super::through::{Via, failed};

/// Where each record of a batch came from: JSON Lines' line numbers, or
/// the first row's number and the count of Arrow or Parquet rows.
enum Origin {
    Lines(Vec<usize>),
    Rows(usize, usize),
}

impl Origin {
    /// Record `record` of the batch in the input's terms ("line 31").
    fn at(&self, record: u64) -> String {
        match self {
            Self::Lines(lines) => {
                format!("line {}", lines.get(record as usize).copied().unwrap_or(0))
            }
            Self::Rows(first, _) => format!("row {}", first + record as usize),
        }
    }

    /// The batch's first record ("line 21").
    fn start(&self) -> String {
        self.at(0)
    }

    /// The batch's extent ("lines 21–40", "rows 1–500").
    fn span(&self) -> String {
        match self {
            Self::Lines(lines) => format!(
                "lines {}–{}",
                lines.first().copied().unwrap_or(0),
                lines.last().copied().unwrap_or(0)
            ),
            Self::Rows(first, n) => format!("rows {first}–{}", first + (*n).max(1) - 1),
        }
    }
}

/// Add every batch of `file` (stdin when `None`) to store `name`.
pub async fn add<A: StoreApi>(
    api: &A,
    via: Via,
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
    loop {
        let raw = match input.next_raw() {
            Ok(Some(raw)) => raw,
            Ok(None) => break,
            Err(e) => {
                bar.finish_and_clear();
                return Err(e.context(super::store::stopped_at(added, false)));
            }
        };
        let (body, origin) = match raw {
            Raw::Lines { lines, text } => (RecordsBody::JsonLines(text), Origin::Lines(lines)),
            Raw::Batch { batch, first } => {
                let rows = batch.num_rows();
                let bytes = lance_context_wire::encode(&[batch])
                    .map_err(|e| usage(format!("encoding rows {first}…: {e}")))?;
                (RecordsBody::Arrow(bytes), Origin::Rows(first, rows))
            }
        };
        match api.add_records(name, body).await {
            Ok(done) => added += done.added,
            Err(e) => {
                bar.finish_and_clear();
                return Err(refused(e, via, &origin, added, out, &bar));
            }
        }
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
    let through = match via {
        Via::Local => "",
        Via::Server => " through the server",
    };
    out.item(
        &serde_json::json!({
            "store": name, "records": added, "rejected": 0, "batches": batches, "dry_run": false,
            "seconds": seconds, "records_per_second": added as f64 / seconds.max(1e-9),
        }),
        || {
            format!(
                "added {added} record(s) to '{name}'{through} in {batches} batch(es), {seconds:.1} s ({:.0} records/s)",
                added as f64 / seconds.max(1e-9)
            )
        },
    )
}

/// A batch's refusal in the input's terms: each problem named by its line
/// or row (printed on stderr unless `--json`, else in the details), and
/// what happened to the input so far.
fn refused(
    e: ClientError,
    via: Via,
    origin: &Origin,
    added: usize,
    out: Out,
    bar: &indicatif::ProgressBar,
) -> anyhow::Error {
    let ClientError::Api { status, mut error } = e else {
        return failed(e, via);
    };
    let stopped = super::store::stopped_at(added, false);
    let plugin = error.details["row_errors"].is_array();
    let key = if plugin { "row_errors" } else { "input_errors" };
    let total = error.details["total"].as_u64();
    let details = &mut error.details;
    let message = if let Some(rows) = details[key].as_array_mut() {
        // Where each problem is, as the input says it ("line 31"); the
        // batch's own record number means nothing to the user.
        let mut records = std::collections::BTreeSet::new();
        for r in rows.iter_mut() {
            let record = r["record"].as_u64().unwrap_or(0);
            records.insert(record);
            r["at"] = Value::String(origin.at(record));
            if let Some(r) = r.as_object_mut() {
                r.remove("record");
            }
        }
        if !out.json_errors {
            let verb = if plugin { "rejected" } else { "refused" };
            super::store::print_listed(bar, &Value::Array(rows.clone()), verb);
        }
        let listed = rows.len();
        if let Some(d) = details.as_object_mut() {
            for k in ["record", "column", "total"] {
                d.remove(k);
            }
        }
        let more = match total {
            Some(total) if total > listed as u64 => {
                format!(" ({total} problems in all; the first {listed} listed)")
            }
            _ => String::new(),
        };
        let whereabouts = if out.json_errors {
            ""
        } else {
            " (listed above)"
        };
        match plugin {
            true => format!(
                "{stopped}: the plugin rejected {} record(s) of the batch from {}{more}{whereabouts}",
                records.len(),
                origin.start()
            ),
            false => format!(
                "{stopped}: {} record(s) do not fit the schema{more}{whereabouts}",
                records.len()
            ),
        }
    } else if let Some(record) = details["record"].as_u64() {
        let at = origin.at(record);
        // The engine's refusal of one record, said in the input's terms.
        let said = match (
            details["first_record"].as_u64(),
            details["problem"].as_str(),
        ) {
            (Some(first), _) => format!(
                "{} '{}' repeats {}",
                details["column"].as_str().unwrap_or_default(),
                details["value"].as_str().unwrap_or_default(),
                origin.at(first)
            ),
            (None, Some(problem)) => problem.to_string(),
            (None, None) => error.message.clone(),
        };
        *details = serde_json::json!({"at": at, "column": details["column"].clone()});
        format!("{stopped}: {at}: {said}")
    } else if error.code == "deadline" {
        // The write goes on past the deadline: it may land.
        format!(
            "{} ({added} record(s) added before this batch; this batch may still land: \
             look its keys up before sending it again)",
            error.message
        )
    } else if error.code == "invalid_input" {
        // About the batch as a whole (e.g. a column of another type).
        format!("{stopped}: {}: {}", origin.span(), error.message)
    } else {
        format!("{stopped}: {}", error.message)
    };
    error.message = message;
    failed(ClientError::Api { status, error }, via)
}
