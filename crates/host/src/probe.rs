//! Probing a plugin before a store trusts it (`plugin check`, and every
//! `store create` before it pins the plugin).
//!
//! Records are generated from the declaration — complete ones, ones with
//! only the non-nullable columns, and for each non-nullable column one that
//! leaves it null — and each goes through what an add runs (`transform` when
//! declared, else `validate`). A plugin passes when:
//! - it never traps, panics, runs out of time or memory, or answers with
//!   garbage;
//! - every output it returns matches the declaration (column names, types,
//!   row count — checked by the host as on every add);
//! - it never accepts a record whose non-nullable column stays null (the
//!   engine would refuse that add), i.e. it refuses such a record or fills
//!   the column.
//!
//! A generated record the plugin refuses with row errors is not a problem
//! (its rules may need values the probe cannot guess); records the caller
//! gives (`samples`) are run the same way.

use arrow_array::{Array, RecordBatch};
use arrow_schema::{DataType, SchemaRef};
use base64::Engine as _;
use serde_json::{Value, json};

use crate::plugin::{LoadedPlugin, PluginError};
use crate::{PipelineError, rows_from_json, to_input};

/// What a probe found: each check, passed or not.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct ProbeReport {
    /// The checks in the order run.
    pub checks: Vec<ProbeCheck>,
}

/// One check of a probe.
#[derive(Debug, Clone, serde::Serialize)]
pub struct ProbeCheck {
    /// How it went.
    pub level: ProbeLevel,
    /// What was checked, or what is wrong.
    pub message: String,
}

/// How a check went.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ProbeLevel {
    /// Passed.
    Ok,
    /// Something the probe could not check, and why.
    Note,
    /// The plugin works, but a caller will meet an error it could have
    /// named better (e.g. a null in a non-nullable column left to the
    /// engine to refuse instead of a row error).
    Warning,
    /// The plugin is broken: a store must not pin it.
    Problem,
}

impl ProbeReport {
    /// The messages of the checks at `level`.
    pub fn at(&self, level: ProbeLevel) -> Vec<String> {
        self.checks
            .iter()
            .filter(|c| c.level == level)
            .map(|c| c.message.clone())
            .collect()
    }

    /// The problems' messages (a store must not pin the plugin).
    pub fn problems(&self) -> Vec<String> {
        self.at(ProbeLevel::Problem)
    }

    fn push(&mut self, level: ProbeLevel, message: impl Into<String>) {
        self.checks.push(ProbeCheck {
            level,
            message: message.into(),
        });
    }

    fn ok(&mut self, message: impl Into<String>) {
        self.push(ProbeLevel::Ok, message);
    }

    fn note(&mut self, message: impl Into<String>) {
        self.push(ProbeLevel::Note, message);
    }

    fn warning(&mut self, message: impl Into<String>) {
        self.push(ProbeLevel::Warning, message);
    }

    fn problem(&mut self, message: impl Into<String>) {
        self.push(ProbeLevel::Problem, message);
    }
}

/// Probe `plugin` with records generated from its declaration, and with
/// `samples` (JSON Lines the caller expects it to accept) when given. Runs
/// the plugin (blocking): call it off the async runtime's workers.
pub fn probe(plugin: &LoadedPlugin, samples: Option<&[u8]>) -> ProbeReport {
    let mut probe = Probe::new(plugin);
    // A fault ends the probe early: the report so far says what it was.
    let _ = probe.all(samples);
    probe.report
}

/// A fault stopped the probe (it is in the report already).
struct Stopped;

/// A probe under way: the plugin, what the probe writes, the report so far.
struct Probe<'a> {
    plugin: &'a LoadedPlugin,
    declared: SchemaRef,
    key: String,
    /// Non-nullable columns the probe can write.
    required: Vec<String>,
    report: ProbeReport,
}

impl<'a> Probe<'a> {
    /// Start a probe of `plugin`: the columns it can check, and a note for
    /// each it cannot.
    fn new(plugin: &'a LoadedPlugin) -> Self {
        let mut report = ProbeReport::default();
        let declared = plugin.declaration().schema.clone();
        let key = plugin.declaration().key_column().to_string();
        // Non-nullable columns the probe can write (a type it cannot is left
        // out of every check, and said so).
        let mut required = Vec::new();
        for f in declared.fields().iter().filter(|f| !f.is_nullable()) {
            match *f.name() == key || sample(f.data_type(), 0).is_some() {
                true => required.push(f.name().clone()),
                false => report.note(format!(
                    "non-nullable column '{}' ({}) is not probed: the probe writes no values of that type",
                    f.name(),
                    f.data_type()
                )),
            }
        }
        Probe {
            plugin,
            declared,
            key,
            required,
            report,
        }
    }

    /// Every check, in order; stops at the first fault.
    fn all(&mut self, samples: Option<&[u8]>) -> Result<(), Stopped> {
        let accepted_records = self.generated(samples.is_some())?;
        self.together(&accepted_records)?;
        self.left_null(&accepted_records)?;
        if let Some(samples) = samples {
            self.samples(samples);
        }
        Ok(())
    }

    /// A complete record: every column the probe can write (`variant` picks
    /// the values).
    fn complete(&self, variant: usize) -> Value {
        let mut object = serde_json::Map::new();
        for f in self.declared.fields() {
            let value = if *f.name() == self.key {
                Some(json!(format!("probe-{variant}")))
            } else {
                sample(f.data_type(), variant)
            };
            if let Some(v) = value {
                object.insert(f.name().clone(), v);
            }
        }
        Value::Object(object)
    }

    /// Complete records (two variants), then only the non-nullable columns,
    /// one at a time: the records the plugin accepts.
    fn generated(&mut self, has_samples: bool) -> Result<Vec<Value>, Stopped> {
        let plugin = self.plugin;
        let mut accepted = 0usize;
        let mut refused = false;
        let mut generated = vec![
            ("a complete record".to_string(), self.complete(0)),
            ("a second complete record".to_string(), self.complete(1)),
        ];
        let mut minimal = self.complete(2);
        if let Some(object) = minimal.as_object_mut() {
            object.retain(|name, _| self.required.contains(name));
        }
        generated.push((
            "a record with only the non-nullable columns".to_string(),
            minimal,
        ));
        let mut accepted_records = Vec::new();
        let report = &mut self.report;
        for (what, record) in &generated {
            match run(plugin, record) {
                Outcome::Accepted(out) => {
                    accepted += 1;
                    accepted_records.push(record.clone());
                    match nulls_in(&out, &self.required) {
                        Some(column) => report.problem(format!(
                            "{what} is accepted with non-nullable column '{column}' null in the output: the engine would refuse the add"
                        )),
                        None => report.ok(format!(
                            "{what}: accepted; the output matches the declaration"
                        )),
                    }
                }
                Outcome::Refused(errors) => {
                    let first = errors.first().map(|(_, m)| m.clone()).unwrap_or_default();
                    report.note(format!("{what}: refused by the plugin's rules ({first})"));
                    refused = true;
                }
                Outcome::Unusable(why) => report.note(format!("{what}: not probed ({why})")),
                Outcome::Fault(e) => {
                    // One fault is enough: a plugin that loops would cost a
                    // deadline per probe.
                    report.problem(format!("{what}: {e}"));
                    return Err(Stopped);
                }
            }
        }
        if accepted == 0 && refused {
            let message = "every generated record was refused by the plugin's rules, so its output was not checked on a complete record — pass records it accepts (--sample FILE) to check it";
            // A transform never run is a transform never checked: say it loudly.
            match plugin.declaration().has_transform && !has_samples {
                true => report.warning(message),
                false => report.note(message),
            }
        }
        Ok(accepted_records)
    }

    /// The accepted records together, as one batch of several rows.
    fn together(&mut self, accepted_records: &[Value]) -> Result<(), Stopped> {
        if accepted_records.len() <= 1 {
            return Ok(());
        }
        let plugin = self.plugin;
        let report = &mut self.report;
        let lines: Vec<String> = accepted_records.iter().map(Value::to_string).collect();
        match rows_from_json(plugin, lines.join("\n").as_bytes()) {
            Ok(batch) => match prepare(plugin, &batch) {
                Ok(out) if out.num_rows() == batch.num_rows() => report.ok(format!(
                    "{} accepted records in one batch: the output matches the declaration",
                    batch.num_rows()
                )),
                Ok(out) => report.problem(format!(
                    "{} records in, {} out",
                    batch.num_rows(),
                    out.num_rows()
                )),
                Err(e) if e.row_errors().is_some() => report.problem(format!(
                    "records accepted one at a time are refused together: {e}"
                )),
                Err(e) => {
                    report.problem(format!("the accepted records in one batch: {e}"));
                    return Err(Stopped);
                }
            },
            Err(e) => report.note(format!(
                "the accepted records in one batch: not probed ({e})"
            )),
        }
        Ok(())
    }

    /// One probe per non-nullable column: left null, the plugin must refuse
    /// the record or fill the column.
    fn left_null(&mut self, accepted_records: &[Value]) -> Result<(), Stopped> {
        // Each from a record the plugin accepts, when one was: then a refusal
        // is about the column left out.
        let base = accepted_records
            .first()
            .cloned()
            .unwrap_or_else(|| self.complete(3));
        let plugin = self.plugin;
        let report = &mut self.report;
        for column in &self.required {
            let mut record = base.clone();
            if let Some(object) = record.as_object_mut() {
                object.remove(column);
            }
            match run(plugin, &record) {
                Outcome::Accepted(out) => match nulls_in(&out, std::slice::from_ref(column)) {
                    Some(_) => report.warning(format!(
                        "a record without non-nullable column '{column}' is accepted and the column is not filled: the engine refuses such an add, without naming the record — refuse it with a row error or fill it in transform"
                    )),
                    None => report.ok(format!(
                        "a record without '{column}': the plugin fills it"
                    )),
                },
                // Only a row error naming the column counts: a refusal for
                // another reason says nothing about this column.
                Outcome::Refused(errors) if errors.iter().any(|(c, _)| c.as_deref() == Some(column)) => {
                    report.ok(format!("a record without '{column}': refused with a row error"))
                }
                Outcome::Refused(errors) => report.note(format!(
                    "a record without '{column}': refused for another reason ({}), so not checked",
                    errors.first().map(|(_, m)| m.as_str()).unwrap_or("")
                )),
                Outcome::Unusable(why) => {
                    report.note(format!("a record without '{column}': not probed ({why})"))
                }
                Outcome::Fault(e) => {
                    report.problem(format!("a record without '{column}': {e}"));
                    return Err(Stopped);
                }
            }
        }
        Ok(())
    }

    /// The caller's sample records, which the plugin must accept.
    fn samples(&mut self, samples: &[u8]) {
        let plugin = self.plugin;
        let report = &mut self.report;
        match rows_from_json(plugin, samples) {
            Err(PipelineError::InvalidRecords { problems, total }) => report.problem(format!(
                "{total} sample record(s) do not fit the schema: {}",
                problems
                    .iter()
                    .map(|p| format!("line {}: {}", p.row + 1, p.message))
                    .collect::<Vec<_>>()
                    .join("; ")
            )),
            Err(e) => report.problem(format!("the sample records: {e}")),
            Ok(batch) => match prepare(plugin, &batch) {
                Ok(out) => match nulls_in(&out, &self.required) {
                    Some(column) => report.problem(format!(
                        "the sample records are accepted with non-nullable column '{column}' null in the output: the engine would refuse the add"
                    )),
                    None => report.ok(format!(
                        "{} sample record(s): accepted; the output matches the declaration",
                        batch.num_rows()
                    )),
                },
                Err(e) if e.row_errors().is_some() => report.problem(format!(
                    "the plugin refuses sample records: {}",
                    e.row_errors()
                        .unwrap_or_default()
                        .iter()
                        .map(|r| match &r.column {
                            Some(c) => format!("line {}, column '{c}': {}", u64::from(r.row) + 1, r.message),
                            None => format!("line {}: {}", u64::from(r.row) + 1, r.message),
                        })
                        .collect::<Vec<_>>()
                        .join("; ")
                )),
                Err(e) => report.problem(format!("the sample records: {e}")),
            },
        }
    }
}

enum Outcome {
    /// The plugin accepted the record: what an add would store.
    Accepted(RecordBatch),
    /// The plugin refused it with row errors: (column, message) each.
    Refused(Vec<(Option<String>, String)>),
    /// The generated record does not fit the input schema (a type the probe
    /// cannot write as JSON).
    Unusable(String),
    /// The plugin failed: a trap, a deadline, bad output, output that does
    /// not match the declaration.
    Fault(PluginError),
}

fn run(plugin: &LoadedPlugin, record: &Value) -> Outcome {
    let line = record.to_string();
    let batch = match rows_from_json(plugin, line.as_bytes()) {
        Ok(batch) => batch,
        Err(e) => return Outcome::Unusable(e.to_string()),
    };
    match prepare(plugin, &batch) {
        Ok(out) => Outcome::Accepted(out),
        Err(e) => match e.row_errors() {
            Some(rows) => Outcome::Refused(
                rows.iter()
                    .map(|r| (r.column.clone(), r.to_string()))
                    .collect(),
            ),
            None => Outcome::Fault(e),
        },
    }
}

/// What an add runs on `batch`, without the engine.
fn prepare(plugin: &LoadedPlugin, batch: &RecordBatch) -> Result<RecordBatch, PluginError> {
    let input = to_input(plugin, batch).map_err(|e| match e {
        PipelineError::Plugin(p) => p,
        other => PluginError::MalformedOutput {
            plugin: plugin.declaration().name.clone(),
            message: other.to_string(),
        },
    })?;
    plugin.prepare(&input, crate::now_micros())
}

/// The first of `columns` with a null in `batch` (or absent from it).
fn nulls_in(batch: &RecordBatch, columns: &[String]) -> Option<String> {
    columns
        .iter()
        .find(|c| batch.column_by_name(c).is_none_or(|a| a.null_count() > 0))
        .cloned()
}

/// A JSON value of type `dt` (the pipeline's JSON form), or `None` for a
/// type the probe leaves null.
fn sample(dt: &DataType, variant: usize) -> Option<Value> {
    use DataType::*;
    let n = variant as i64;
    Some(match dt {
        Utf8 | LargeUtf8 | Utf8View => json!(format!("probe-{variant}")),
        Dictionary(_, value) => return sample(value, variant),
        Boolean => json!(variant % 2 == 1),
        Int8 | Int16 | Int32 | Int64 | UInt8 | UInt16 | UInt32 | UInt64 => json!(n % 2),
        Float16 | Float32 | Float64 => json!(0.5),
        Binary | LargeBinary | BinaryView => {
            json!(base64::engine::general_purpose::STANDARD.encode(b"probe"))
        }
        Date32 | Date64 => json!("2026-01-01"),
        Timestamp(_, Some(_)) => json!("2026-01-01T00:00:00Z"),
        Timestamp(_, None) => json!("2026-01-01T00:00:00"),
        FixedSizeList(child, len) => {
            let items: Option<Vec<Value>> = (0..*len)
                .map(|i| match child.data_type() {
                    Float16 | Float32 | Float64 => Some(json!(0.25 + 0.125 * (i as f64))),
                    other => sample(other, variant),
                })
                .collect();
            Value::Array(items?)
        }
        List(child) | LargeList(child) => match variant {
            1 => json!([]),
            _ => Value::Array(vec![sample(child.data_type(), variant)?]),
        },
        Struct(fields) => {
            let mut object = serde_json::Map::new();
            for f in fields {
                if let Some(v) = sample(f.data_type(), variant) {
                    object.insert(f.name().clone(), v);
                }
            }
            Value::Object(object)
        }
        _ => return None,
    })
}
