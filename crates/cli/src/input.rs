//! Records in: JSON Lines, Arrow IPC (stream or file) and Parquet, from a
//! file or stdin, streamed in batches of at most `batch_rows` — never the
//! whole input in memory. Every row keeps its position in the input (the
//! line for JSON Lines, the row for Arrow and Parquet, 1-based) so that a
//! refusal names it.

use std::fs::File;
use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use arrow_array::RecordBatch;
use arrow_schema::ArrowError;
use lance_context_host::{LoadedPlugin, PipelineError, conform, json_ready, json_rows};

use crate::args::usage;

/// An input or output format of records.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Format {
    /// JSON Lines: one JSON object per line.
    Jsonl,
    /// Arrow IPC: the stream format (or, from a file, the file format).
    Arrow,
    /// Parquet (a file, not stdin).
    Parquet,
}

impl Format {
    /// The format `given`, else the one the file's extension names, else
    /// JSON Lines.
    pub fn pick(given: Option<Format>, path: Option<&Path>) -> Format {
        given.unwrap_or_else(|| {
            match path
                .and_then(|p| p.extension())
                .and_then(|e| e.to_str())
                .map(str::to_ascii_lowercase)
                .as_deref()
            {
                Some("arrow" | "arrows" | "ipc" | "feather") => Format::Arrow,
                Some("parquet" | "pq") => Format::Parquet,
                _ => Format::Jsonl,
            }
        })
    }
}

/// Where each row of a chunk came from: its 1-based line (JSON Lines) or
/// row (Arrow, Parquet) in the input.
#[derive(Debug, Clone)]
pub enum Positions {
    /// JSON Lines: the line of each row.
    Lines(Vec<usize>),
    /// Arrow and Parquet: the row of each row.
    Rows(Vec<usize>),
}

impl Positions {
    /// `line 12` or `row 12` for the chunk's `row`-th row.
    pub fn name(&self, row: usize) -> String {
        match self {
            Self::Lines(lines) => format!("line {}", lines.get(row).copied().unwrap_or(0)),
            Self::Rows(rows) => format!("row {}", rows.get(row).copied().unwrap_or(0)),
        }
    }

    /// `("line", 12)`: the unit and number of the chunk's `row`-th row.
    pub fn at(&self, row: usize) -> (&'static str, usize) {
        match self {
            Self::Lines(lines) => ("line", lines.get(row).copied().unwrap_or(0)),
            Self::Rows(rows) => ("row", rows.get(row).copied().unwrap_or(0)),
        }
    }

    /// Where the chunk starts, e.g. `line 3`.
    pub fn start(&self) -> String {
        self.name(0)
    }

    /// The positions of the rows kept (`keep[i]`: row `i` stays).
    pub fn retain(&mut self, keep: &[bool]) {
        match self {
            Self::Lines(l) | Self::Rows(l) => retain_mask(l, keep),
        }
    }

    /// How many rows.
    pub fn len(&self) -> usize {
        match self {
            Self::Lines(l) | Self::Rows(l) => l.len(),
        }
    }
}

/// Keep the items whose `keep` flag is set.
pub fn retain_mask<T>(items: &mut Vec<T>, keep: &[bool]) {
    let mut i = 0;
    items.retain(|_| {
        i += 1;
        keep.get(i - 1).copied().unwrap_or(false)
    });
}

/// A batch of input rows, and where they came from; with a lenient read
/// (`--reject-file`), the input records refused before the plugin ran.
#[derive(Debug)]
pub struct Chunk {
    /// The good rows (`None` when every record of the chunk was refused).
    pub batch: Option<RecordBatch>,
    pub positions: Positions,
    /// JSON Lines: each row's line as read (what a reject file keeps).
    pub texts: Option<Vec<String>>,
    pub refused: Vec<Refusal>,
}

/// A refused input record: where it is, the record (its JSON, or the line's
/// text when it is not JSON), and why.
#[derive(Debug, Clone)]
pub struct Refusal {
    pub unit: &'static str,
    pub at: usize,
    pub record: serde_json::Value,
    /// The line's exact bytes, base64, when it is not UTF-8 text.
    pub raw_base64: Option<String>,
    pub errors: Vec<RefusalReason>,
}

/// One reason a record was refused.
#[derive(Debug, Clone, serde::Serialize)]
pub struct RefusalReason {
    pub column: Option<String>,
    pub code: String,
    pub message: String,
}

impl Refusal {
    /// The line of the reject file: `{"line": N, "errors": [...], "record": ...}`.
    pub fn to_json(&self) -> serde_json::Value {
        let mut v = serde_json::json!({
            "errors": self.errors,
            "record": self.record,
        });
        v[self.unit] = self.at.into();
        if let Some(raw) = &self.raw_base64 {
            v["record_base64"] = raw.clone().into();
        }
        v
    }

    /// The record as JSON: the line's JSON value as written, else its text.
    pub fn of_line(line: usize, text: &str, errors: Vec<RefusalReason>) -> Self {
        Self {
            unit: "line",
            at: line,
            record: serde_json::from_str(text)
                .unwrap_or_else(|_| serde_json::Value::String(text.to_string())),
            raw_base64: None,
            errors,
        }
    }
}

/// Rows of `batch` as JSON objects (the CLI's JSON form), by index.
pub fn rows_as_json(batch: &RecordBatch, rows: &[usize]) -> Vec<serde_json::Value> {
    rows.iter()
        .map(|&row| {
            let one = batch.slice(row, 1);
            json_ready(&one)
                .ok()
                .and_then(|b| {
                    let mut w = arrow_json::ArrayWriter::new(Vec::new());
                    w.write(&b).ok()?;
                    w.finish().ok()?;
                    serde_json::from_slice::<Vec<serde_json::Value>>(&w.into_inner()).ok()
                })
                .and_then(|mut v| v.pop())
                .unwrap_or(serde_json::Value::Null)
        })
        .collect()
}

/// Records read from a file or stdin, a chunk at a time.
pub struct Input {
    source: Source,
    batch_rows: usize,
    /// Input bytes read so far (JSON Lines) or rows (Arrow, Parquet).
    pub progress: u64,
    /// Set records that do not fit aside (in [`Chunk::refused`]) instead of
    /// failing the chunk.
    pub lenient: bool,
    /// Lines that are not UTF-8 text, set aside by a lenient read.
    unreadable: Vec<Refusal>,
    /// The input's size in the unit of `progress`, when known.
    pub total: Option<u64>,
}

enum Source {
    Jsonl {
        reader: Box<dyn BufRead>,
        line: usize,
    },
    Batches {
        batches: Box<dyn Iterator<Item = Result<RecordBatch, ArrowError>>>,
        pending: Vec<RecordBatch>,
        pending_rows: usize,
        next_row: usize,
        done: bool,
    },
}

impl Input {
    /// Open `path` (`None` or `-`: stdin) as `format`.
    pub fn open(path: Option<&PathBuf>, format: Format, batch_rows: usize) -> Result<Self> {
        let path = path.filter(|p| p.as_os_str() != "-");
        let open = |p: &Path| File::open(p).with_context(|| format!("opening {}", p.display()));
        let (source, total) = match format {
            Format::Jsonl => {
                let (reader, total): (Box<dyn BufRead>, _) = match path {
                    Some(p) => {
                        let file = open(p)?;
                        let len = file.metadata().map(|m| m.len()).ok();
                        (Box::new(BufReader::with_capacity(1 << 20, file)), len)
                    }
                    None => (Box::new(BufReader::new(std::io::stdin())), None),
                };
                (Source::Jsonl { reader, line: 0 }, total)
            }
            Format::Arrow => {
                let batches: Box<dyn Iterator<Item = Result<RecordBatch, ArrowError>>> = match path
                {
                    Some(p) => {
                        let mut file = open(p)?;
                        let mut magic = [0u8; 6];
                        let is_file_format =
                            file.read_exact(&mut magic).is_ok() && &magic == b"ARROW1";
                        let file = open(p)?;
                        if is_file_format {
                            Box::new(
                                arrow_ipc::reader::FileReader::try_new_buffered(file, None)
                                    .map_err(|e| not_format(p, "an Arrow IPC file", e))?,
                            )
                        } else {
                            Box::new(
                                arrow_ipc::reader::StreamReader::try_new_buffered(file, None)
                                    .map_err(|e| not_format(p, "an Arrow IPC stream", e))?,
                            )
                        }
                    }
                    None => Box::new(
                        arrow_ipc::reader::StreamReader::try_new_buffered(std::io::stdin(), None)
                            .map_err(|e| {
                                usage(format!(
                                    "stdin is not an Arrow IPC stream ({e}); the Arrow file format needs a path"
                                ))
                            })?,
                    ),
                };
                (batches_source(batches), None)
            }
            Format::Parquet => {
                let Some(p) = path else {
                    return Err(usage(
                        "Parquet is read from a file (it is not streamable from stdin): give a path",
                    ));
                };
                let builder =
                    parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder::try_new(open(
                        p,
                    )?)
                    .map_err(|e| usage(format!("{} is not a Parquet file: {e}", p.display())))?;
                let rows = builder.metadata().file_metadata().num_rows().max(0) as u64;
                let reader = builder
                    .with_batch_size(batch_rows.min(65_536))
                    .build()
                    .map_err(|e| usage(format!("reading {}: {e}", p.display())))?;
                (batches_source(Box::new(reader)), Some(rows))
            }
        };
        Ok(Self {
            source,
            batch_rows,
            progress: 0,
            total,
            lenient: false,
            unreadable: Vec::new(),
        })
    }

    /// The next chunk (at most `batch_rows` rows), matched to the plugin's
    /// input schema; `None` at the end. Records that do not fit are an
    /// error listing every one by line (or, [`Self::lenient`], set aside in
    /// [`Chunk::refused`]).
    pub fn next_chunk(&mut self, plugin: &LoadedPlugin) -> Result<Option<Chunk>> {
        match self.next_raw()? {
            None => Ok(None),
            Some(Raw::Lines { lines, text }) => {
                let mut refused = std::mem::take(&mut self.unreadable);
                if lines.is_empty() {
                    // Every line of the chunk was unreadable.
                    return Ok(Some(Chunk {
                        batch: None,
                        positions: Positions::Lines(lines),
                        texts: Some(Vec::new()),
                        refused,
                    }));
                }
                let read = json_rows(plugin, text.as_slice()).map_err(|e| {
                    let at = match &e {
                        PipelineError::InvalidInput { row: Some(row), .. } => {
                            format!("line {}", lines.get(*row).copied().unwrap_or(0))
                        }
                        _ => format!("lines {}–{}", lines[0], lines[lines.len() - 1]),
                    };
                    anyhow::Error::new(e).context(at)
                })?;
                if !read.problems.is_empty() && !self.lenient {
                    return Err(invalid_records(&read.problems, &lines));
                }
                let texts: Vec<&str> = std::str::from_utf8(&text)
                    .unwrap_or_default()
                    .split('\n')
                    .collect();
                for p in &read.problems {
                    refused.push(Refusal::of_line(
                        lines.get(p.row).copied().unwrap_or(0),
                        texts.get(p.row).copied().unwrap_or_default(),
                        vec![RefusalReason {
                            column: p.column.clone(),
                            code: "invalid_input".into(),
                            message: p.message.clone(),
                        }],
                    ));
                }
                refused.sort_by_key(|r| r.at);
                let kept = read.kept.iter().map(|&row| lines[row]).collect();
                let kept_texts = read
                    .kept
                    .iter()
                    .map(|&row| texts.get(row).copied().unwrap_or_default().to_string())
                    .collect();
                Ok(Some(Chunk {
                    batch: read.batch,
                    positions: Positions::Lines(kept),
                    texts: Some(kept_texts),
                    refused,
                }))
            }
            Some(Raw::Batch { batch, first }) => {
                let take = batch.num_rows();
                let batch = conform(plugin, &batch).map_err(|e| {
                    anyhow::Error::new(e).context(format!("rows {first}–{}", first + take - 1))
                })?;
                Ok(Some(Chunk {
                    batch: Some(batch),
                    positions: Positions::Rows((first..first + take).collect()),
                    texts: None,
                    refused: Vec::new(),
                }))
            }
        }
    }

    /// The next chunk as read, not yet matched to a schema (for a server,
    /// which matches it itself).
    pub fn next_raw(&mut self) -> Result<Option<Raw>> {
        match &mut self.source {
            Source::Jsonl { reader, line } => {
                let mut lines: Vec<usize> = Vec::new();
                let mut text: Vec<u8> = Vec::new();
                let mut buf = Vec::new();
                while lines.len() < self.batch_rows {
                    buf.clear();
                    let n = reader
                        .read_until(b'\n', &mut buf)
                        .context("reading the input")?;
                    if n == 0 {
                        break;
                    }
                    *line += 1;
                    self.progress += n as u64;
                    let Ok(mut s) = std::str::from_utf8(&buf) else {
                        if self.lenient {
                            self.unreadable.push(not_utf8(&buf, *line));
                            continue;
                        }
                        return Err(usage(format!("line {line}: not UTF-8 text")));
                    };
                    if *line == 1 {
                        // A byte-order mark some editors write.
                        s = s.strip_prefix('\u{feff}').unwrap_or(s);
                    }
                    if s.trim().is_empty() {
                        continue;
                    }
                    text.extend_from_slice(s.trim_end_matches(['\n', '\r']).as_bytes());
                    text.push(b'\n');
                    lines.push(*line);
                }
                if lines.is_empty() && self.unreadable.is_empty() {
                    return Ok(None);
                }
                Ok(Some(Raw::Lines { lines, text }))
            }
            Source::Batches {
                batches,
                pending,
                pending_rows,
                next_row,
                done,
            } => {
                while !*done && *pending_rows < self.batch_rows {
                    match batches.next() {
                        None => *done = true,
                        Some(batch) => {
                            let batch = batch.map_err(|e| {
                                usage(format!(
                                    "reading the input after row {}: {e}",
                                    *next_row + *pending_rows
                                ))
                            })?;
                            *pending_rows += batch.num_rows();
                            pending.push(batch);
                        }
                    }
                }
                if *pending_rows == 0 {
                    return Ok(None);
                }
                let schema = pending[0].schema();
                let all = arrow_select::concat::concat_batches(&schema, pending.iter())
                    .map_err(|e| usage(format!("the input's batches differ in schema: {e}")))?;
                let take = all.num_rows().min(self.batch_rows);
                let chunk = all.slice(0, take);
                pending.clear();
                *pending_rows = all.num_rows() - take;
                if *pending_rows > 0 {
                    pending.push(all.slice(take, *pending_rows));
                }
                let first = *next_row + 1;
                *next_row += take;
                self.progress += take as u64;
                Ok(Some(Raw::Batch {
                    batch: chunk,
                    first,
                }))
            }
        }
    }
}

/// The refusal of input line `line` (`buf`, its line end included) that is
/// not UTF-8 text: the line lossily decoded and its bytes in base64.
fn not_utf8(buf: &[u8], line: usize) -> Refusal {
    use base64::Engine as _;
    let bytes = buf.strip_suffix(b"\n").unwrap_or(buf);
    let bytes = bytes.strip_suffix(b"\r").unwrap_or(bytes);
    Refusal {
        unit: "line",
        at: line,
        record: serde_json::Value::String(String::from_utf8_lossy(bytes).into_owned()),
        raw_base64: Some(base64::engine::general_purpose::STANDARD.encode(bytes)),
        errors: vec![RefusalReason {
            column: None,
            code: "invalid_input".into(),
            message: "not UTF-8 text".into(),
        }],
    }
}

/// A chunk as read (see [`Input::next_raw`]).
pub enum Raw {
    /// JSON Lines: the text (blank lines dropped) and each record's line.
    Lines { lines: Vec<usize>, text: Vec<u8> },
    /// Arrow or Parquet rows, the first one's 1-based number.
    Batch { batch: RecordBatch, first: usize },
}

fn batches_source(batches: Box<dyn Iterator<Item = Result<RecordBatch, ArrowError>>>) -> Source {
    Source::Batches {
        batches,
        pending: Vec::new(),
        pending_rows: 0,
        next_row: 0,
        done: false,
    }
}

fn not_format(path: &Path, what: &str, e: ArrowError) -> anyhow::Error {
    usage(format!("{} is not {what}: {e}", path.display()))
}

/// The error for records that do not fit the schema: every one listed by
/// line (on stderr by the caller, in `details.input_errors` with `--json`).
fn invalid_records(
    problems: &[lance_context_host::InputProblem],
    lines: &[usize],
) -> anyhow::Error {
    let listed: Vec<serde_json::Value> = problems
        .iter()
        .take(lance_context_host::MAX_LISTED_PROBLEMS)
        .map(|p| {
            serde_json::json!({
                "at": format!("line {}", lines.get(p.row).copied().unwrap_or(0)),
                "column": p.column,
                "message": p.message,
            })
        })
        .collect();
    let first = listed
        .first()
        .and_then(|v| v["at"].as_str())
        .unwrap_or("line ?")
        .to_string();
    let more = match problems.len() {
        n if n > listed.len() => format!(" ({n} in all; the first {} listed)", listed.len()),
        _ => String::new(),
    };
    crate::exit::Refused {
        kind: lance_context_host::ErrorKind::InvalidInput,
        message: format!(
            "{} record(s) do not fit the schema, the first at {first}{more}",
            problems.len()
        ),
        details: serde_json::json!({ "input_errors": listed, "total": problems.len() }),
    }
    .into()
}
