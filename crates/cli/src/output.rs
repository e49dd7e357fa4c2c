//! What commands print: a table on a terminal, JSON Lines when stdout is
//! piped or with `--json`; progress on stderr only when it is a terminal.
//!
//! JSON field names are stable (docs/cli.md lists them). Records print as one
//! JSON object per row, exactly as `store add` reads them back.

use std::io::{IsTerminal, Write};
use std::time::Duration;

use anyhow::Result;
use arrow_array::{Array, RecordBatch};
use arrow_cast::display::{ArrayFormatter, FormatOptions};
use comfy_table::{ContentArrangement, Table, presets::UTF8_FULL_CONDENSED};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use serde::Serialize;

/// Widest cell of a record table on a terminal (JSON output is never cut).
const CELL_CHARS: usize = 60;

/// Where a command's output goes, and in which form.
#[derive(Debug, Clone, Copy)]
pub struct Out {
    /// JSON Lines instead of tables and sentences.
    pub json: bool,
    /// `--json` was given: errors are JSON on stderr too (piped output
    /// alone keeps errors readable).
    pub json_errors: bool,
}

impl Out {
    /// JSON when asked, or when stdout is not a terminal.
    pub fn new(json: bool) -> Self {
        Self {
            json: json || !std::io::stdout().is_terminal(),
            json_errors: json,
        }
    }

    /// Rows of a store: JSON Lines, or a table.
    pub fn rows(&self, batch: &RecordBatch) -> Result<()> {
        if self.json {
            return json_lines(batch);
        }
        if batch.num_rows() == 0 {
            println!("(no rows)");
            return Ok(());
        }
        let batch = lance_context_host::json_ready(batch)?;
        let options = FormatOptions::default();
        let formatters = batch
            .columns()
            .iter()
            .map(|c| ArrayFormatter::try_new(c.as_ref(), &options))
            .collect::<Result<Vec<_>, _>>()?;
        let headers = batch
            .schema()
            .fields()
            .iter()
            .map(|f| f.name().clone())
            .collect();
        let rows = (0..batch.num_rows())
            .map(|row| {
                formatters
                    .iter()
                    .zip(batch.columns())
                    .map(|(f, c)| c.is_valid(row).then(|| f.value(row).to_string()))
                    .collect()
            })
            .collect();
        print_records(headers, rows);
        Ok(())
    }

    /// Records as the store API answers them (a JSON array of objects):
    /// one JSON line each, as received, or a table with the columns in the
    /// order the records give them.
    pub fn records(&self, rows: &lance_context_client::Rows) -> Result<()> {
        // Borrowed from the text: no allocation per record.
        let records: Vec<&serde_json::value::RawValue> = serde_json::from_str(rows.as_json())?;
        if self.json {
            // Buffered: stdout alone writes (and flushes) line by line.
            let stdout = std::io::stdout();
            let mut out = std::io::BufWriter::with_capacity(1 << 16, stdout.lock());
            for record in &records {
                out.write_all(record.get().as_bytes())?;
                out.write_all(b"\n")?;
            }
            out.flush()?;
            return Ok(());
        }
        if records.is_empty() {
            println!("(no rows)");
            return Ok(());
        }
        let mut headers: Vec<String> = Vec::new();
        let mut cells = Vec::with_capacity(records.len());
        for record in &records {
            let Ordered(fields) = serde_json::from_str(record.get())?;
            for (k, _) in &fields {
                if !headers.contains(k) {
                    headers.push(k.clone());
                }
            }
            cells.push(fields);
        }
        let rows = cells
            .into_iter()
            .map(|fields| {
                headers
                    .iter()
                    .map(
                        |c| match fields.iter().find(|(k, _)| k == c).map(|(_, v)| v) {
                            None | Some(serde_json::Value::Null) => None,
                            Some(serde_json::Value::String(s)) => Some(s.clone()),
                            Some(other) => Some(other.to_string()),
                        },
                    )
                    .collect()
            })
            .collect();
        print_records(headers, rows);
        Ok(())
    }

    /// One result object: a JSON line, or the sentence `human` gives.
    pub fn item<T: Serialize>(&self, value: &T, human: impl FnOnce() -> String) -> Result<()> {
        if self.json {
            println!("{}", serde_json::to_string(value)?);
        } else {
            println!("{}", human());
        }
        Ok(())
    }

    /// A list: one JSON line per item, or a table with `headers` whose
    /// cells `cells` gives per item.
    pub fn list<T: Serialize>(
        &self,
        items: &[T],
        headers: &[&str],
        cells: impl Fn(&T) -> Vec<String>,
        empty: &str,
    ) -> Result<()> {
        if self.json {
            return write_lines(items);
        }
        if items.is_empty() {
            println!("{empty}");
            return Ok(());
        }
        let mut table = new_table();
        table.set_header(headers.to_vec());
        for item in items {
            table.add_row(cells(item));
        }
        println!("{table}");
        Ok(())
    }

    /// A bar over `len` units (records, bytes) when stderr is a terminal
    /// and the output is not JSON; hidden otherwise.
    pub fn bar(&self, len: Option<u64>, what: &str) -> ProgressBar {
        let bar = match len {
            Some(len) => ProgressBar::with_draw_target(Some(len), self.draw_target()),
            None => ProgressBar::with_draw_target(None, self.draw_target()),
        };
        let template = match len {
            Some(_) => "{spinner} {msg} [{elapsed_precise}] {wide_bar} {percent}% ETA {eta}",
            None => "{spinner} {msg} [{elapsed_precise}]",
        };
        if let Ok(style) = ProgressStyle::with_template(template) {
            bar.set_style(style);
        }
        bar.set_message(what.to_string());
        bar.enable_steady_tick(Duration::from_millis(120));
        bar
    }

    /// A spinner for work of unknown length (merge, compaction, index build).
    pub fn spinner(&self, what: &str) -> ProgressBar {
        self.bar(None, what)
    }

    fn draw_target(&self) -> ProgressDrawTarget {
        if self.json || !std::io::stderr().is_terminal() {
            ProgressDrawTarget::hidden()
        } else {
            ProgressDrawTarget::stderr()
        }
    }
}

/// A batch as JSON Lines on stdout.
pub fn json_lines(batch: &RecordBatch) -> Result<()> {
    let stdout = std::io::stdout();
    let mut writer = arrow_json::LineDelimitedWriter::new(stdout.lock());
    writer.write(&lance_context_host::json_ready(batch)?)?;
    writer.finish()?;
    Ok(())
}

fn new_table() -> Table {
    let mut table = Table::new();
    table.load_preset(UTF8_FULL_CONDENSED);
    // Fit the terminal's width when it has a usable one; otherwise (a pty
    // of unknown size) let the table be as wide as its cells.
    table.set_content_arrangement(match table.width() {
        Some(w) if w >= 40 => ContentArrangement::Dynamic,
        _ => ContentArrangement::Disabled,
    });
    table
}

fn terminal_width() -> Option<usize> {
    Table::new().width().map(usize::from).filter(|w| *w >= 40)
}

/// One JSON object per line.
/// A JSON object's fields in the order written (`serde_json::Map` sorts
/// them).
struct Ordered(Vec<(String, serde_json::Value)>);

impl<'de> serde::Deserialize<'de> for Ordered {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Fields;
        impl<'de> serde::de::Visitor<'de> for Fields {
            type Value = Ordered;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a record (a JSON object)")
            }
            fn visit_map<M: serde::de::MapAccess<'de>>(
                self,
                mut map: M,
            ) -> Result<Ordered, M::Error> {
                let mut fields = Vec::new();
                while let Some(field) = map.next_entry()? {
                    fields.push(field);
                }
                Ok(Ordered(fields))
            }
        }
        deserializer.deserialize_map(Fields)
    }
}

fn write_lines<T: Serialize>(items: &[T]) -> Result<()> {
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    for item in items {
        serde_json::to_writer(&mut out, item)?;
        out.write_all(b"\n")?;
    }
    Ok(())
}

/// Records on a terminal (`None`: null): a table with long cells cut (JSON
/// shows them whole) — or, when more columns than fit side by side, one
/// block per record with a line per non-null column — then the count.
fn print_records(headers: Vec<String>, rows: Vec<Vec<Option<String>>>) {
    let width = terminal_width().unwrap_or(120);
    if headers.len() * 14 > width {
        let pad = headers.iter().map(|c| c.chars().count()).max().unwrap_or(0);
        for (i, row) in rows.iter().enumerate() {
            println!("── record {} ──", i + 1);
            for (name, value) in headers.iter().zip(row) {
                if let Some(value) = value {
                    println!("{name:<pad$}  {}", cut(value));
                }
            }
        }
    } else {
        let mut table = new_table();
        table.set_header(headers);
        for row in &rows {
            table.add_row(
                row.iter()
                    .map(|v| v.as_deref().map_or_else(|| "null".to_string(), cut))
                    .collect::<Vec<_>>(),
            );
        }
        println!("{table}");
    }
    println!("({} row(s))", rows.len());
}

/// One line, control characters (terminal escapes) shown escaped, cut to
/// [`CELL_CHARS`].
fn cut(text: &str) -> String {
    let one_line: String = text
        .chars()
        .flat_map(|c| match c {
            '\n' | '\r' | '\t' => vec![' '],
            c if c.is_control() => c.escape_default().collect(),
            c => vec![c],
        })
        .collect();
    if one_line.chars().count() <= CELL_CHARS {
        return one_line;
    }
    let mut s: String = one_line.chars().take(CELL_CHARS - 1).collect();
    s.push('…');
    s
}
