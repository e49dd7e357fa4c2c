//! `store export`: records out, streamed batch by batch, in a format
//! `store add` reads back.

use std::io::{BufWriter, IsTerminal, Write};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, Result};
use arrow_array::RecordBatch;
use arrow_schema::{Schema, SchemaRef};
use clap::Parser;
use futures::TryStreamExt;
use indicatif::ProgressBar;
use lance_context_host::{NamedStore, input_schema};
use lance_context_store::{BatchStream, ScanRequest};
use serde::Serialize;

use crate::args::{AsOf, usage};
use crate::input::Format;
use crate::output::Out;

#[derive(Parser, Debug)]
pub struct ExportCommand {
    pub name: String,
    /// The output format (default: by the output's extension, else JSON Lines).
    #[arg(long)]
    format: Option<Format>,
    /// The output file (`-` or absent: stdout). Written to a temporary name
    /// beside it and renamed when complete.
    #[arg(long, short = 'o')]
    output: Option<PathBuf>,
    /// SQL predicate: export only matching records.
    #[arg(long)]
    filter: Option<String>,
    /// Comma-separated columns (default: every declared column, blobs included).
    #[arg(long, value_delimiter = ',')]
    columns: Option<Vec<String>>,
    #[command(flatten)]
    pub as_of: AsOf,
}

#[derive(Debug, Serialize)]
struct Exported {
    store: String,
    records: usize,
    format: Format,
    output: String,
    seconds: f64,
}

enum Sink {
    Jsonl(arrow_json::LineDelimitedWriter<Box<dyn Write + Send>>),
    Arrow(arrow_ipc::writer::StreamWriter<Box<dyn Write + Send>>),
    Parquet(parquet::arrow::ArrowWriter<Box<dyn Write + Send>>),
}

impl Sink {
    fn write(&mut self, batch: &RecordBatch) -> Result<()> {
        match self {
            Self::Jsonl(w) => w.write(&lance_context_host::json_ready(batch)?)?,
            Self::Arrow(w) => w.write(batch)?,
            Self::Parquet(w) => w.write(batch)?,
        }
        Ok(())
    }

    fn finish(self) -> Result<()> {
        match self {
            Self::Jsonl(mut w) => {
                w.finish()?;
                w.into_inner().flush()?;
            }
            Self::Arrow(mut w) => {
                w.finish()?;
                w.into_inner()?.flush()?;
            }
            Self::Parquet(w) => {
                w.into_inner()?.flush()?;
            }
        }
        Ok(())
    }
}

/// Where an export writes.
enum Target {
    Stdout,
    /// A device or fifo (e.g. /dev/stdout): written through, never replaced.
    Direct(PathBuf),
    /// A regular file (new or replaced): written beside it under a
    /// temporary name, renamed over it when complete. A symlink is followed:
    /// the file it points to is replaced, the link kept.
    Atomic {
        temp: PathBuf,
        path: PathBuf,
    },
}

impl Target {
    fn of(output: Option<&PathBuf>) -> Result<Self> {
        let Some(path) = output.filter(|p| p.as_os_str() != "-") else {
            return Ok(Self::Stdout);
        };
        if path.as_os_str().to_string_lossy().ends_with('/') || path.is_dir() {
            return Err(usage(format!(
                "{} is a directory: give a file name",
                path.display()
            )));
        }
        match std::fs::metadata(path) {
            Ok(meta) if !meta.is_file() => Ok(Self::Direct(path.clone())),
            Ok(_) => {
                let real = std::fs::canonicalize(path)
                    .with_context(|| format!("resolving {}", path.display()))?;
                Ok(Self::atomic(real))
            }
            Err(_) => Ok(Self::atomic(path.clone())),
        }
    }

    fn atomic(path: PathBuf) -> Self {
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| "export".into());
        Self::Atomic {
            temp: path.with_file_name(format!(".{name}.partial")),
            path,
        }
    }
}

/// The writer of an export, and (for an atomic one) the temporary file and
/// the path it is renamed to.
type Opened = (Box<dyn Write + Send>, Option<(PathBuf, PathBuf)>);

impl Target {
    /// Open the target for writing.
    fn open(self) -> Result<Opened> {
        Ok(match self {
            Target::Stdout => (Box::new(std::io::stdout()), None),
            Target::Direct(path) => {
                let file = std::fs::OpenOptions::new()
                    .write(true)
                    .open(&path)
                    .with_context(|| format!("opening {}", path.display()))?;
                (Box::new(file), None)
            }
            Target::Atomic { temp, path } => {
                let file = std::fs::File::create(&temp)
                    .with_context(|| format!("creating {}", temp.display()))?;
                (Box::new(file), Some((temp, path)))
            }
        })
    }
}

impl Sink {
    /// A sink writing `format` to `writer`; `schema` is the records'.
    fn new(format: Format, writer: Box<dyn Write + Send>, schema: &SchemaRef) -> Result<Self> {
        Ok(match format {
            Format::Jsonl => Sink::Jsonl(arrow_json::LineDelimitedWriter::new(writer)),
            Format::Arrow => Sink::Arrow(arrow_ipc::writer::StreamWriter::try_new(writer, schema)?),
            Format::Parquet => Sink::Parquet(parquet::arrow::ArrowWriter::try_new(
                writer,
                schema.clone(),
                Some(
                    parquet::file::properties::WriterProperties::builder()
                        .set_compression(parquet::basic::Compression::ZSTD(Default::default()))
                        .build(),
                ),
            )?),
        })
    }
}

pub async fn run(named: &NamedStore, c: ExportCommand, out: Out) -> Result<()> {
    let to_stdout = c.output.as_ref().is_none_or(|p| p.as_os_str() == "-");
    let format = Format::pick(c.format, c.output.as_deref().filter(|_| !to_stdout));
    let columns = c.columns.unwrap_or_else(|| {
        named
            .spec()
            .columns
            .iter()
            .map(|col| col.name.clone())
            .collect()
    });
    let mut request = ScanRequest::new();
    request.filter = c.filter;
    request.projection = Some(columns.clone());
    let mut stream = named.scan_stream(request).await?;
    // The schema of what is written: the declared columns asked for.
    let declared = input_schema(named.plugin());
    let schema: SchemaRef = Arc::new(Schema::new(
        columns
            .iter()
            .filter_map(|name| declared.field_with_name(name).ok().cloned())
            .collect::<Vec<_>>(),
    ));
    if to_stdout && format != Format::Jsonl && std::io::stdout().is_terminal() {
        return Err(usage(format!(
            "refusing to write {format:?} (binary) to a terminal: give -o FILE or redirect stdout"
        )));
    }
    let (target, temp) = Target::of(c.output.as_ref())?.open()?;
    let writer: Box<dyn Write + Send> = Box::new(BufWriter::with_capacity(1 << 20, target));
    let started = Instant::now();
    let bar = out.bar(None, &format!("exporting {}", named.name()));
    let result = write_records(&mut stream, format, writer, schema, &bar).await;
    bar.finish_and_clear();
    let records = match result {
        Ok(n) => n,
        Err(e) => {
            if let Some((temp, _)) = &temp {
                let _ = std::fs::remove_file(temp);
            }
            return Err(e);
        }
    };
    let output = match &temp {
        Some((temp, path)) => {
            if let Err(e) = std::fs::rename(temp, path) {
                let _ = std::fs::remove_file(temp);
                return Err(anyhow::Error::new(e).context(format!(
                    "renaming {} to {}",
                    temp.display(),
                    path.display()
                )));
            }
            path.display().to_string()
        }
        None => c
            .output
            .as_ref()
            .map_or("-".to_string(), |p| p.display().to_string()),
    };
    let exported = Exported {
        store: named.name().to_string(),
        records,
        format,
        output,
        seconds: started.elapsed().as_secs_f64(),
    };
    // On stdout the records are the output: the summary goes nowhere.
    if !to_stdout {
        out.item(&exported, || {
            format!(
                "exported {} record(s) of '{}' to {} ({:?}, {:.1} s)",
                exported.records,
                exported.store,
                exported.output,
                exported.format,
                exported.seconds
            )
        })?;
    }
    Ok(())
}

/// Write every batch of `stream` to `writer` in `format` (the first batch's
/// schema, else `schema` when there is none), counting them on `bar`: the
/// records written.
async fn write_records(
    stream: &mut BatchStream,
    format: Format,
    writer: Box<dyn Write + Send>,
    schema: SchemaRef,
    bar: &ProgressBar,
) -> Result<usize> {
    let mut first: Option<RecordBatch> = stream.try_next().await?;
    let schema = first.as_ref().map(|b| b.schema()).unwrap_or(schema);
    let mut sink = Sink::new(format, writer, &schema)?;
    let mut records = 0;
    if let Some(batch) = first.take() {
        records += batch.num_rows();
        sink.write(&batch)?;
    }
    while let Some(batch) = stream.try_next().await? {
        records += batch.num_rows();
        sink.write(&batch)?;
        bar.set_position(records as u64);
        bar.set_message(format!("exported {records} record(s)"));
    }
    sink.finish()?;
    Ok(records)
}
