//! `store export`: records out, streamed batch by batch, in a format
//! `store add` reads back.

use std::io::{BufWriter, Write};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, Result};
use arrow_array::RecordBatch;
use arrow_schema::{Schema, SchemaRef};
use clap::Parser;
use futures::TryStreamExt;
use lance_context_host::{NamedStore, input_schema};
use lance_context_store::ScanRequest;
use serde::Serialize;

use crate::args::AsOf;
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
            Self::Jsonl(w) => w.write(batch)?,
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
    let (target, temp): (Box<dyn Write + Send>, Option<(PathBuf, PathBuf)>) = if to_stdout {
        (Box::new(std::io::stdout()), None)
    } else {
        let path = c.output.clone().unwrap_or_default();
        let temp = path.with_file_name(format!(
            ".{}.partial",
            path.file_name()
                .and_then(|n| n.to_str())
                .unwrap_or("export")
        ));
        let file =
            std::fs::File::create(&temp).with_context(|| format!("creating {}", temp.display()))?;
        (Box::new(file), Some((temp, path)))
    };
    let writer: Box<dyn Write + Send> = Box::new(BufWriter::with_capacity(1 << 20, target));
    let mut first: Option<RecordBatch> = None;
    let started = Instant::now();
    let bar = out.bar(None, &format!("exporting {}", named.name()));
    let result: Result<usize> = async {
        let batch = stream.try_next().await?;
        let schema = batch.as_ref().map(|b| b.schema()).unwrap_or(schema);
        first = batch;
        let mut sink = match format {
            Format::Jsonl => Sink::Jsonl(arrow_json::LineDelimitedWriter::new(writer)),
            Format::Arrow => {
                Sink::Arrow(arrow_ipc::writer::StreamWriter::try_new(writer, &schema)?)
            }
            Format::Parquet => Sink::Parquet(parquet::arrow::ArrowWriter::try_new(
                writer,
                schema.clone(),
                Some(
                    parquet::file::properties::WriterProperties::builder()
                        .set_compression(parquet::basic::Compression::ZSTD(Default::default()))
                        .build(),
                ),
            )?),
        };
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
    .await;
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
            std::fs::rename(temp, path)
                .with_context(|| format!("renaming {} to {}", temp.display(), path.display()))?;
            path.display().to_string()
        }
        None => "-".to_string(),
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
