//! Log lines on stderr: what the engine and the host report without failing
//! the command — a background merge that failed, a WAL write reclaimed and
//! retried, an index that could not be remapped after a compaction, a
//! compile cache entry that failed verification, connections cut at a
//! server's shutdown.
//!
//! `LANCE_CONTEXT_LOG` chooses what is shown, in the `RUST_LOG` syntax of
//! `tracing-subscriber`'s `EnvFilter` (`warn`, `lance_context=debug`,
//! `off`, …); [`DEFAULT`] when unset or empty. With `--json`, each log line
//! is a JSON object `{"log": {...}}` on stderr, as an error is
//! `{"error": {...}}`: every stderr line parses.

use std::io::Write;

use serde_json::{Map, Value};
use tracing::field::{Field, Visit};
use tracing::{Event, Subscriber};
use tracing_log::NormalizeEvent;
use tracing_subscriber::EnvFilter;
use tracing_subscriber::layer::{Context, Layer, SubscriberExt};
use tracing_subscriber::util::SubscriberInitExt;

/// The variable that sets the filter.
pub const VARIABLE: &str = "LANCE_CONTEXT_LOG";

/// Warnings and errors of lance-context itself (the engine, the host, the
/// CLI); errors only from the libraries under it (Lance, DataFusion,
/// wasmtime), whose warnings are about their own internals. Less
/// `lance::index`: Lance 14 logs an error for its own MemWAL index
/// (`Index __lance_mem_wal has no fields`) each time it loads a scalar
/// index, which is most reads; its real index errors are returned as errors.
pub const DEFAULT: &str = "error,lance::index=off,lance_context=warn";

/// Whether log lines are JSON (set once by [`init`]).
static JSON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();

/// Install the stderr logger: JSON lines with `json`, else text.
pub fn init(json: bool) {
    let _ = JSON.set(json);
    let (filter, refused) = match std::env::var(VARIABLE) {
        Ok(spec) if !spec.trim().is_empty() => match EnvFilter::try_new(&spec) {
            Ok(filter) => (filter, None),
            Err(e) => (EnvFilter::new(DEFAULT), Some((spec, e.to_string()))),
        },
        _ => (EnvFilter::new(DEFAULT), None),
    };
    let text = (!json).then(|| {
        tracing_subscriber::fmt::layer()
            .with_writer(|| Escaped(std::io::stderr()))
            .with_ansi(false)
    });
    let lines = json.then_some(JsonLines);
    // Another logger already installed (not the case in the binary) keeps
    // its place.
    let _ = tracing_subscriber::registry()
        .with(filter)
        .with(text)
        .with(lines)
        .try_init();
    if let Some((spec, why)) = refused {
        tracing::warn!("{VARIABLE}={spec:?} is not a log filter ({why}); using {DEFAULT:?}");
    }
}

/// A line for the operator on stderr that is not a warning (a server's
/// "requests need a bearer token"): as it is, or with `--json` a log line
/// `{"log": {"level": "INFO", …}}`, so that every stderr line parses. Shown
/// whatever the filter: it is the command's own output.
pub fn notice(message: &str) {
    if JSON.get().copied().unwrap_or(false) {
        json_line("INFO", "lance_context", message.into(), Map::new());
    } else {
        let _ = writeln!(std::io::stderr().lock(), "{message}");
    }
}

/// A text log line's writer: each event is one write of one line; control
/// characters inside it (a carriage return or newline in a message that
/// quotes an error, which could forge or overwrite a line) are escaped
/// ([`crate::exit::escaped`]). The line's own final newline is kept.
struct Escaped<W>(W);

impl<W: Write> Write for Escaped<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let text = String::from_utf8_lossy(buf);
        let (body, end) = match text.strip_suffix('\n') {
            Some(body) => (body, "\n"),
            None => (text.as_ref(), ""),
        };
        let line = crate::exit::escaped(body, &['\t']) + end;
        self.0.write_all(line.as_bytes())?;
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.0.flush()
    }
}

/// Log events as `{"log": {"level", "target", "message", "fields"}}` lines.
struct JsonLines;

impl<S: Subscriber> Layer<S> for JsonLines {
    fn on_event(&self, event: &Event<'_>, _: Context<'_, S>) {
        let mut fields = Fields(Map::new());
        event.record(&mut fields);
        let mut fields = fields.0;
        let message = fields.remove("message").unwrap_or(Value::Null);
        // A record of the `log` crate (Lance logs through it) comes with its
        // target, module, file and line as fields: its own metadata instead.
        let normalized = event.normalized_metadata();
        let meta = normalized.as_ref().unwrap_or_else(|| event.metadata());
        fields.retain(|name, _| !name.starts_with("log."));
        json_line(meta.level().as_str(), meta.target(), message, fields);
    }
}

/// Write `{"log": {"level", "target", "message", "fields"}}` (fields when
/// any) as one line: one write, so lines from several threads do not mix.
fn json_line(level: &str, target: &str, message: Value, fields: Map<String, Value>) {
    let mut log = Map::new();
    log.insert("level".into(), level.into());
    log.insert("target".into(), target.into());
    log.insert("message".into(), message);
    if !fields.is_empty() {
        log.insert("fields".into(), Value::Object(fields));
    }
    let line = serde_json::json!({ "log": log });
    let _ = writeln!(std::io::stderr().lock(), "{line}");
}

/// An event's fields as JSON values.
struct Fields(Map<String, Value>);

impl Visit for Fields {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.0
            .insert(field.name().into(), format!("{value:?}").into());
    }
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name().into(), value.into());
    }
    fn record_i64(&mut self, field: &Field, value: i64) {
        self.0.insert(field.name().into(), value.into());
    }
    fn record_u64(&mut self, field: &Field, value: u64) {
        self.0.insert(field.name().into(), value.into());
    }
    fn record_bool(&mut self, field: &Field, value: bool) {
        self.0.insert(field.name().into(), value.into());
    }
    fn record_f64(&mut self, field: &Field, value: f64) {
        self.0.insert(field.name().into(), value.into());
    }
}
