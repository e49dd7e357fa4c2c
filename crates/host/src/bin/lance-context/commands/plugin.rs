//! `lance-context plugin …`: list, inspect and check schema plugins.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{Context, Result};
use clap::Subcommand;
use lance_context_host::{
    BUILTIN_PLUGINS, PluginError, PluginLimits, PluginRuntime, Registry, input_schema,
};
use serde::Serialize;

use crate::args::{parse_kv, usage};
use crate::output::Out;

#[derive(Subcommand, Debug)]
pub enum PluginCommand {
    /// List the built-in plugins and the plugins the stores of a data root pin.
    List {
        /// The data root whose stores' plugins to list.
        #[arg(long, default_value = "data")]
        root: PathBuf,
    },
    /// Print a plugin's declaration: its columns, key, vectors, capabilities.
    Inspect {
        /// A built-in plugin (rollout, context, datagen) or a path to a .wasm component.
        plugin: String,
        /// Creation parameter `name=json`; repeatable (e.g. `embedding_dim=8`).
        #[arg(long = "param", value_parser = parse_kv)]
        params: Vec<(String, String)>,
    },
    /// Load a component with the host's checks and report every problem found.
    Check {
        /// Path to a .wasm component (or a built-in plugin's name).
        plugin: String,
        #[arg(long = "param", value_parser = parse_kv)]
        params: Vec<(String, String)>,
    },
}

/// One row of `plugin list`.
#[derive(Debug, Serialize)]
struct Listed {
    plugin: String,
    version: String,
    sha256: String,
    /// `built-in`, or where a store's pin came from (`file:…`, `spec`, `builtin:…`).
    source: String,
    /// The stores that pin it.
    stores: Vec<String>,
}

/// `plugin inspect`: one object.
#[derive(Debug, Serialize)]
struct Inspected {
    plugin: String,
    version: String,
    abi_version: u32,
    sha256: String,
    key: String,
    secondary_key: Option<String>,
    vectors: Vec<serde_json::Value>,
    blob_columns: Vec<String>,
    capabilities: Vec<String>,
    transform: bool,
    columns: Vec<Column>,
}

#[derive(Debug, Serialize)]
struct Column {
    name: String,
    #[serde(rename = "type")]
    data_type: String,
    nullable: bool,
    metadata: BTreeMap<String, String>,
}

fn plugin_bytes(plugin: &str) -> Result<(String, Vec<u8>)> {
    let path = if plugin.ends_with(".wasm") || plugin.contains('/') {
        PathBuf::from(plugin)
    } else if let Some(bytes) = BUILTIN_PLUGINS
        .contains(&plugin)
        .then(|| lance_context_host::builtin_plugin_bytes(plugin))
        .flatten()
    {
        return Ok((plugin.to_string(), bytes.to_vec()));
    } else {
        return Err(usage(format!(
            "'{plugin}' is neither a built-in plugin ({}) nor a .wasm file",
            BUILTIN_PLUGINS.join(", ")
        )));
    };
    let bytes = std::fs::read(&path).with_context(|| format!("reading {}", path.display()))?;
    Ok((path.display().to_string(), bytes))
}

impl PluginCommand {
    pub fn execute(self, out: Out) -> Result<()> {
        let runtime = Arc::new(PluginRuntime::new(
            PluginLimits::default(),
            lance_context_host::default_cache_dir().as_deref(),
        )?);
        match self {
            Self::List { root } => list(runtime, root, out),
            Self::Inspect { plugin, params } => inspect(&runtime, &plugin, params, out),
            Self::Check { plugin, params } => check(&runtime, &plugin, params, out),
        }
    }
}

fn list(runtime: Arc<PluginRuntime>, root: PathBuf, out: Out) -> Result<()> {
    let mut rows: Vec<Listed> = Vec::new();
    for name in BUILTIN_PLUGINS {
        let (label, bytes) = plugin_bytes(name)?;
        let loaded = runtime.load(&label, &bytes, Vec::new())?;
        let d = loaded.declaration();
        rows.push(Listed {
            plugin: d.name.clone(),
            version: d.version.clone(),
            sha256: d.sha256.clone(),
            source: "built-in".into(),
            stores: Vec::new(),
        });
    }
    if root.join("registry").exists() {
        let registry = Registry::at(&root, runtime)?;
        for entry in registry.list()? {
            let pin = &entry.plugin;
            match rows
                .iter_mut()
                .find(|r| r.sha256 == pin.sha256 && r.plugin == pin.name)
            {
                Some(row) => row.stores.push(entry.name.clone()),
                None => rows.push(Listed {
                    plugin: pin.name.clone(),
                    version: pin.version.clone(),
                    sha256: pin.sha256.clone(),
                    source: pin.source.clone(),
                    stores: vec![entry.name.clone()],
                }),
            }
        }
    }
    out.list(
        &rows,
        &["plugin", "version", "sha256", "source", "stores"],
        |r| {
            vec![
                r.plugin.clone(),
                r.version.clone(),
                r.sha256.chars().take(12).collect(),
                r.source.clone(),
                r.stores.join(", "),
            ]
        },
        "no plugins",
    )
}

fn inspect(
    runtime: &PluginRuntime,
    plugin: &str,
    params: Vec<(String, String)>,
    out: Out,
) -> Result<()> {
    let (label, bytes) = plugin_bytes(plugin)?;
    let loaded = runtime.load(&label, &bytes, params)?;
    let d = loaded.declaration();
    let spec = &d.spec;
    let inspected = Inspected {
        plugin: d.name.clone(),
        version: d.version.clone(),
        abi_version: d.abi_version,
        sha256: d.sha256.clone(),
        key: spec.key.clone(),
        secondary_key: spec.secondary_key.clone(),
        vectors: spec
            .vectors
            .iter()
            .map(|v| {
                serde_json::json!({
                    "column": v.column,
                    "dimension": v.dimension,
                    "metric": v.metric.to_string(),
                })
            })
            .collect(),
        blob_columns: spec.blob_columns.clone(),
        capabilities: spec
            .capabilities
            .iter()
            .map(|c| c.as_str().to_string())
            .collect(),
        transform: d.has_transform,
        columns: d
            .schema
            .fields()
            .iter()
            .map(|f| Column {
                name: f.name().clone(),
                data_type: f.data_type().to_string(),
                nullable: f.is_nullable(),
                metadata: f
                    .metadata()
                    .iter()
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect(),
            })
            .collect(),
    };
    if out.json {
        return out.item(&inspected, String::new);
    }
    println!(
        "plugin {} {} (ABI {}), sha256 {}",
        inspected.plugin, inspected.version, inspected.abi_version, inspected.sha256
    );
    println!("key: {}", inspected.key);
    if let Some(k) = &inspected.secondary_key {
        println!("secondary key: {k}");
    }
    for v in &spec.vectors {
        println!(
            "vector: {} (dimension {}, {})",
            v.column, v.dimension, v.metric
        );
    }
    if !inspected.blob_columns.is_empty() {
        println!("blob columns: {}", inspected.blob_columns.join(", "));
    }
    println!(
        "capabilities: {}",
        if inspected.capabilities.is_empty() {
            "none".to_string()
        } else {
            inspected.capabilities.join(", ")
        }
    );
    println!("transform: {}", if d.has_transform { "yes" } else { "no" });
    out.list(
        &inspected.columns,
        &["#", "column", "type", "null", "metadata"],
        |c| {
            vec![
                (inspected
                    .columns
                    .iter()
                    .position(|x| x.name == c.name)
                    .unwrap_or(0)
                    + 1)
                .to_string(),
                c.name.clone(),
                c.data_type.clone(),
                if c.nullable { "yes" } else { "no" }.to_string(),
                c.metadata
                    .iter()
                    .map(|(k, v)| format!("{k}={v}"))
                    .collect::<Vec<_>>()
                    .join(" "),
            ]
        },
        "",
    )
}

/// What `plugin check` found: every check, passed or not.
#[derive(Debug, Default, Serialize)]
struct Checked {
    plugin: String,
    checks: Vec<Check>,
    problems: usize,
}

#[derive(Debug, Serialize)]
struct Check {
    ok: bool,
    message: String,
}

impl Checked {
    fn ok(&mut self, message: impl Into<String>) {
        self.checks.push(Check {
            ok: true,
            message: message.into(),
        });
    }

    fn problem(&mut self, message: impl Into<String>) {
        self.problems += 1;
        self.checks.push(Check {
            ok: false,
            message: message.into(),
        });
    }
}

fn check(
    runtime: &PluginRuntime,
    plugin: &str,
    params: Vec<(String, String)>,
    out: Out,
) -> Result<()> {
    let (label, bytes) = plugin_bytes(plugin)?;
    let mut checked = Checked {
        plugin: label.clone(),
        ..Default::default()
    };
    let result = check_loaded(runtime, plugin, &label, &bytes, params, &mut checked);
    out.item(&checked, || {
        let mut s = format!("checked {label} ({} bytes)", bytes.len());
        for c in &checked.checks {
            s.push_str(&format!(
                "\n{}: {}",
                if c.ok { "ok" } else { "problem" },
                c.message
            ));
        }
        if checked.problems == 0 {
            s.push_str("\nno problems found");
        }
        s
    })?;
    result?;
    if checked.problems > 0 {
        return Err(usage(format!("{} problem(s) found", checked.problems)));
    }
    Ok(())
}

fn check_loaded(
    runtime: &PluginRuntime,
    plugin: &str,
    label: &str,
    bytes: &[u8],
    params: Vec<(String, String)>,
    checked: &mut Checked,
) -> Result<()> {
    let loaded = match runtime.load(label, bytes, params) {
        Ok(loaded) => loaded,
        Err(PluginError::InvalidDeclaration { plugin, problems }) => {
            checked.ok("compiles, links as a schema plugin, describe succeeds");
            for p in &problems {
                checked.problem(format!("the declaration of {plugin}: {p}"));
            }
            return Ok(());
        }
        Err(e) => {
            checked.problem(e.to_string());
            return Ok(());
        }
    };
    checked.ok("compiles, links as a schema plugin, describe succeeds");
    // A user's plugin is held to the user-schema rules (key `id`); the
    // built-ins keep theirs.
    let builtin = BUILTIN_PLUGINS.contains(&plugin);
    if !builtin
        && let Err(e) = loaded
            .declaration()
            .spec
            .check(lance_context_host::spec::KeyRule::IdOnly)
    {
        for p in &e.problems {
            checked.problem(format!(
                "the declaration breaks the rules for a store's schema: {p}"
            ));
        }
        return Ok(());
    }
    checked.ok(format!(
        "ABI {}, key column '{}', declared columns present",
        loaded.declaration().abi_version,
        loaded.declaration().key_column()
    ));
    // Probe the calls with one all-null row: row errors are the plugin
    // working; traps and bad outputs are problems.
    let schema = input_schema(&loaded);
    let columns = schema
        .fields()
        .iter()
        .map(|f| arrow_array::new_null_array(f.data_type(), 1))
        .collect();
    let one_row = arrow_array::RecordBatch::try_new(schema, columns)?;
    match loaded.validate(&one_row) {
        Ok(()) => checked.ok("validate accepts an all-null row"),
        Err(e) if e.row_errors().is_some() => checked.ok(format!(
            "validate answers with row errors ({} for an all-null row)",
            e.row_errors().map(<[_]>::len).unwrap_or(0)
        )),
        Err(e) => checked.problem(format!("validate: {e}")),
    }
    if loaded.declaration().has_transform {
        match loaded.transform(&one_row, 0) {
            Ok(_) => checked.ok("transform output matches the declared schema"),
            Err(e) if e.row_errors().is_some() => checked.ok("transform answers with row errors"),
            // An all-null row may legitimately not fit a non-null column.
            Err(e) => checked.ok(format!("(note) transform of an all-null row: {e}")),
        }
    }
    Ok(())
}
