//! What commands print: a table on a terminal, JSON Lines when stdout is
//! piped or with `--json`; progress on stderr only when it is a terminal.
//!
//! JSON field names are stable (docs/cli.md lists them). Records print as one
//! JSON object per row, exactly as `store add` reads them back.

use std::io::{IsTerminal, Write};
use std::time::Duration;

use anyhow::Result;
use arrow_array::RecordBatch;
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
        let batch = &lance_context_host::json_ready(batch)?;
        // Wide records (more columns than fit side by side) print one
        // block per record, a line per column.
        let width = terminal_width().unwrap_or(120);
        if batch.num_columns() * 14 > width {
            print!("{}", record_blocks(batch)?);
        } else {
            println!("{}", record_table(batch)?);
        }
        println!("({} row(s))", batch.num_rows());
        Ok(())
    }

    /// Records as JSON values (from a server): JSON Lines, or a table.
    pub fn values(&self, records: &[serde_json::Value]) -> Result<()> {
        if self.json {
            let stdout = std::io::stdout();
            let mut out = stdout.lock();
            for r in records {
                serde_json::to_writer(&mut out, r)?;
                out.write_all(b"\n")?;
            }
            return Ok(());
        }
        if records.is_empty() {
            println!("(no rows)");
            return Ok(());
        }
        let mut columns: Vec<String> = Vec::new();
        for r in records {
            for k in r.as_object().map(|o| o.keys()).into_iter().flatten() {
                if !columns.contains(k) {
                    columns.push(k.clone());
                }
            }
        }
        let cell = |v: Option<&serde_json::Value>| match v {
            None | Some(serde_json::Value::Null) => "null".to_string(),
            Some(serde_json::Value::String(s)) => cut(s),
            Some(other) => cut(&other.to_string()),
        };
        let width = terminal_width().unwrap_or(120);
        if columns.len() * 14 > width {
            let pad = columns.iter().map(|c| c.chars().count()).max().unwrap_or(0);
            for (i, r) in records.iter().enumerate() {
                println!("── record {} ──", i + 1);
                for c in &columns {
                    if let Some(v) = r.get(c).filter(|v| !v.is_null()) {
                        println!("{c:<pad$}  {}", cell(Some(v)));
                    }
                }
            }
        } else {
            let mut table = new_table();
            table.set_header(columns.clone());
            for r in records {
                table.add_row(columns.iter().map(|c| cell(r.get(c))).collect::<Vec<_>>());
            }
            println!("{table}");
        }
        println!("({} row(s))", records.len());
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
            let stdout = std::io::stdout();
            let mut out = stdout.lock();
            for item in items {
                serde_json::to_writer(&mut out, item)?;
                out.write_all(b"\n")?;
            }
            return Ok(());
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

/// A record batch as a table, long cells cut (JSON shows them whole).
fn record_table(batch: &RecordBatch) -> Result<Table> {
    let options = FormatOptions::default().with_null("null");
    let formatters = batch
        .columns()
        .iter()
        .map(|c| ArrayFormatter::try_new(c.as_ref(), &options))
        .collect::<Result<Vec<_>, _>>()?;
    let mut table = new_table();
    table.set_header(
        batch
            .schema()
            .fields()
            .iter()
            .map(|f| f.name().clone())
            .collect::<Vec<_>>(),
    );
    for row in 0..batch.num_rows() {
        let mut cells = Vec::with_capacity(formatters.len());
        for formatter in &formatters {
            cells.push(cut(&formatter.value(row).to_string()));
        }
        table.add_row(cells);
    }
    Ok(table)
}

fn terminal_width() -> Option<usize> {
    Table::new().width().map(usize::from).filter(|w| *w >= 40)
}

/// Records as blocks: `column  value` lines, a rule between records.
fn record_blocks(batch: &RecordBatch) -> Result<String> {
    let options = FormatOptions::default().with_null("null");
    let formatters = batch
        .columns()
        .iter()
        .map(|c| ArrayFormatter::try_new(c.as_ref(), &options))
        .collect::<Result<Vec<_>, _>>()?;
    let schema = batch.schema();
    let names: Vec<&str> = schema.fields().iter().map(|f| f.name().as_str()).collect();
    let pad = names.iter().map(|n| n.chars().count()).max().unwrap_or(0);
    let mut text = String::new();
    for row in 0..batch.num_rows() {
        text.push_str(&format!("── record {} ──\n", row + 1));
        for (name, formatter) in names.iter().zip(&formatters) {
            let value = formatter.value(row).to_string();
            if value == "null" {
                continue;
            }
            text.push_str(&format!("{name:<pad$}  {}\n", cut(&value)));
        }
    }
    Ok(text)
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
