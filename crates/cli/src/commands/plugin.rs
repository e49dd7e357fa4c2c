//! `lance-context plugin …`: list, inspect and check schema plugins.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{Context, Result};
use clap::Subcommand;
use lance_context_host::{
    BUILTIN_PLUGINS, LoadedPlugin, PluginDeclaration, PluginError, PluginLimits, PluginRuntime,
    ProbeLevel, Registry,
};
use serde::Serialize;

use crate::args::{ensure_usage, parse_kv, usage};
use crate::output::Out;

#[derive(Subcommand, Debug)]
pub enum PluginCommand {
    /// Write a new plugin crate (Cargo.toml with the crate type and release
    /// profile, the SDK dependency, a plugin with a validate rule and a
    /// transform filling a timestamp, native unit tests, sample records and
    /// a README with the build and check commands).
    New {
        /// The crate's name (lowercase letters, digits, '-', '_').
        name: String,
        /// Where to write it (default: ./NAME; must be empty or absent).
        #[arg(long)]
        dir: Option<PathBuf>,
        /// The SDK: the path of the repository's plugins/sdk, or a git URL
        /// of the repository (default: the SDK this binary was built from).
        #[arg(long)]
        sdk: Option<String>,
    },
    /// List the built-in plugins and the plugins the stores of a data root pin.
    List {
        /// The data root whose stores' plugins to list.
        #[arg(long, default_value = "data")]
        root: PathBuf,
    },
    /// Print a plugin's declaration: its columns, key, vectors, capabilities.
    Inspect {
        /// A built-in plugin (rollout, context, datagen), a path to a .wasm
        /// component, or a store's name (the plugin it pins, with its
        /// creation parameters).
        plugin: String,
        /// Creation parameter `name=json`; repeatable (e.g. `embedding_dim=8`).
        #[arg(long = "param", value_parser = parse_kv)]
        params: Vec<(String, String)>,
        /// The data root whose stores a store's name refers to.
        #[arg(long, default_value = "data")]
        root: PathBuf,
    },
    /// Load a component with the host's checks, probe it with records
    /// generated from its declaration (what `store create` runs before it
    /// pins a plugin) and report every problem found.
    Check {
        /// Path to a .wasm component (or a built-in plugin's name).
        plugin: String,
        #[arg(long = "param", value_parser = parse_kv)]
        params: Vec<(String, String)>,
        /// JSON Lines of records the plugin should accept: run through it
        /// too, its output checked against the declaration.
        #[arg(long, value_name = "FILE")]
        sample: Option<PathBuf>,
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
    /// Named queries: `{"name", "params", "description", "reduce"}`.
    queries: Vec<serde_json::Value>,
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
        let runtime = || -> Result<Arc<PluginRuntime>> {
            Ok(Arc::new(PluginRuntime::new(
                PluginLimits::default(),
                lance_context_host::default_cache_dir().as_deref(),
            )?))
        };
        match self {
            Self::New { name, dir, sdk } => super::plugin_new::new(&name, dir, sdk, out),
            Self::List { root } => list(runtime()?, root, out),
            Self::Inspect {
                plugin,
                params,
                root,
            } => inspect(runtime()?, &plugin, params, &root, out),
            Self::Check {
                plugin,
                params,
                sample,
            } => check(runtime()?.as_ref(), &plugin, params, sample, out),
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
    runtime: Arc<PluginRuntime>,
    plugin: &str,
    params: Vec<(String, String)>,
    root: &std::path::Path,
    out: Out,
) -> Result<()> {
    let loaded = load_inspected(runtime, plugin, params, root)?;
    let d = loaded.declaration();
    let inspected = inspected(d);
    if out.json {
        return out.item(&inspected, String::new);
    }
    print_inspected(&inspected, d);
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

/// The plugin `inspect` names, loaded: a store's (under `root`), a
/// built-in or a `.wasm` file.
fn load_inspected(
    runtime: Arc<PluginRuntime>,
    plugin: &str,
    params: Vec<(String, String)>,
    root: &std::path::Path,
) -> Result<LoadedPlugin> {
    let is_file = plugin.ends_with(".wasm") || plugin.contains('/');
    // A store of that name under the root comes first (also over a
    // built-in's name: `--root` elsewhere inspects the built-in).
    // (Only an existing registry is opened: opening creates one.)
    let registry = match root.join("registry/stores").is_dir() {
        true => Some(Registry::at(root, runtime.clone())?),
        false => None,
    };
    let is_store = !is_file
        && registry
            .as_ref()
            .is_some_and(|r| r.describe(plugin).is_ok());
    let loaded = if is_store || (!is_file && !BUILTIN_PLUGINS.contains(&plugin)) {
        // A store's name: the plugin it pins (hash checked), its parameters.
        let Some(registry) = registry else {
            return Err(usage(format!(
                "'{plugin}' is not a built-in plugin ({}), a .wasm file, or a store: there is no data root at {}",
                BUILTIN_PLUGINS.join(", "),
                root.display()
            )));
        };
        let entry = registry.describe(plugin).map_err(|e| {
            anyhow::Error::new(e).context(format!(
                "'{plugin}' is not a built-in plugin ({}), a .wasm file, or a store under {}",
                BUILTIN_PLUGINS.join(", "),
                root.display()
            ))
        })?;
        ensure_usage(params.is_empty(), || {
            "--param: a store's plugin is inspected with the parameters it was created with".into()
        })?;
        // The CLI runs this command on its multi-thread runtime.
        tokio::task::block_in_place(|| {
            tokio::runtime::Handle::current().block_on(registry.plugin(&entry))
        })?
    } else {
        let (label, bytes) = plugin_bytes(plugin)?;
        runtime.load(&label, &bytes, params)?
    };
    Ok(loaded)
}

/// What `inspect` reports of a declaration.
fn inspected(d: &PluginDeclaration) -> Inspected {
    let spec = &d.spec;
    Inspected {
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
        queries: spec
            .queries
            .iter()
            .map(|q| {
                serde_json::json!({
                    "name": q.name,
                    "params": q.params,
                    "description": q.description,
                    "reduce": q.reduce,
                })
            })
            .collect(),
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
    }
}

/// `inspect`'s text before the table of columns: the plugin, its key,
/// vectors, blob columns, capabilities, transform and queries.
fn print_inspected(inspected: &Inspected, d: &PluginDeclaration) {
    let spec = &d.spec;
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
    for q in &spec.queries {
        println!(
            "query: {}({}){}{}",
            q.name,
            q.params.join(", "),
            if q.reduce { ", reducing" } else { "" },
            if q.description.is_empty() {
                String::new()
            } else {
                format!(" — {}", q.description)
            }
        );
    }
}

/// What `plugin check` found: every check, passed or not.
#[derive(Debug, Default, Serialize)]
struct Checked {
    plugin: String,
    checks: Vec<Check>,
    problems: usize,
    warnings: usize,
}

#[derive(Debug, Serialize)]
struct Check {
    /// `ok`, `note`, `warning` or `problem`.
    level: ProbeLevel,
    message: String,
}

impl Checked {
    fn ok(&mut self, message: impl Into<String>) {
        self.push(ProbeLevel::Ok, message.into());
    }

    fn problem(&mut self, message: impl Into<String>) {
        self.push(ProbeLevel::Problem, message.into());
    }

    fn push(&mut self, level: ProbeLevel, message: String) {
        match level {
            ProbeLevel::Problem => self.problems += 1,
            ProbeLevel::Warning => self.warnings += 1,
            _ => {}
        }
        self.checks.push(Check { level, message });
    }
}

fn check(
    runtime: &PluginRuntime,
    plugin: &str,
    params: Vec<(String, String)>,
    sample: Option<PathBuf>,
    out: Out,
) -> Result<()> {
    let (label, bytes) = plugin_bytes(plugin)?;
    let sample = sample
        .map(|p| std::fs::read(&p).with_context(|| format!("reading {}", p.display())))
        .transpose()?;
    let mut checked = Checked {
        plugin: label.clone(),
        ..Default::default()
    };
    let result = check_loaded(
        runtime,
        plugin,
        &label,
        &bytes,
        params,
        sample.as_deref(),
        &mut checked,
    );
    out.item(&checked, || {
        let mut s = format!("checked {label} ({} bytes)", bytes.len());
        for c in &checked.checks {
            s.push_str(&format!(
                "\n{}: {}",
                match c.level {
                    ProbeLevel::Ok => "ok",
                    ProbeLevel::Note => "note",
                    ProbeLevel::Warning => "warning",
                    ProbeLevel::Problem => "problem",
                },
                c.message
            ));
        }
        if checked.problems == 0 {
            s.push_str(&match checked.warnings {
                0 => "\nno problems found".to_string(),
                n => format!("\nno problems found, {n} warning(s)"),
            });
        }
        s
    })?;
    result?;
    if checked.problems > 0 {
        return Err(crate::exit::Refused {
            kind: lance_context_host::ErrorKind::InvalidInput,
            message: format!("{} problem(s) found (listed above)", checked.problems),
            details: serde_json::Value::Null,
        }
        .into());
    }
    Ok(())
}

fn check_loaded(
    runtime: &PluginRuntime,
    plugin: &str,
    label: &str,
    bytes: &[u8],
    params: Vec<(String, String)>,
    sample: Option<&[u8]>,
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
    // The probe `store create` runs: generated records (complete ones, and
    // one per non-nullable column left null) through validate/transform,
    // outputs checked against the declaration.
    // A built-in is checked on its own sample records too.
    let builtin_samples = builtin
        .then(|| lance_context_host::builtin_samples(plugin))
        .flatten()
        .map(str::as_bytes);
    for c in lance_context_host::probe(&loaded, sample.or(builtin_samples)).checks {
        checked.push(c.level, c.message);
    }
    Ok(())
}
