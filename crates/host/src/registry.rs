//! The registry: a durable catalogue of stores under a data root.
//!
//! ```text
//! <root>/registry/stores/<name>.json      one entry per store
//! <root>/registry/plugins/<sha256>.wasm   the plugin bytes each store pins
//! <root>/stores/<name>/                   a store's data, unless created with a uri
//! ```
//!
//! An entry records the store's name, uri, the *keys* of its storage options
//! (never their values: pass the options again on open), the plugin's name,
//! version and sha256, the [`SchemaSpec`] it declared, the creation parameters
//! and when it was created. The plugin bytes are kept in the data root by hash,
//! so a store is self-contained: it reopens on any machine from the root alone.
//!
//! - **Create** claims the name first (an exclusive create of the entry file:
//!   of concurrent creates of one name exactly one wins, the others get
//!   [`RegistryError::AlreadyExists`]), then stores the plugin bytes, creates
//!   the dataset, and marks the entry ready. A failed create removes its claim.
//! - **Open** re-reads the pinned plugin bytes and refuses them if their hash
//!   is not the pinned one ([`RegistryError::PluginTampered`]); re-runs
//!   `describe` with the recorded parameters and refuses a spec that differs
//!   from the recorded one ([`RegistryError::SpecChanged`]: specs are immutable
//!   in v1; there is no upgrade path yet).
//! - **Drop** deletes the data (every version, WAL shard and index), the entry,
//!   and the plugin bytes when no other store pins them, and reports each.
//!
//! The catalogue lives in a local directory; a store's data may be anywhere
//! Lance can write (a local path, `s3://…`).

use std::collections::{BTreeSet, HashMap};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use lance_context_store::{
    CanonicalLocation, IndexSettings, Location, RecordCapabilities, Store, StoreConfig,
    VectorColumn, VectorIndexKind,
};
use serde::{Deserialize, Serialize};

mod adopt;

pub use adopt::{AdoptOptions, AdoptReport, ColumnReport, ColumnVerdict, ShardReport};

use crate::named::NamedStore;
use crate::plugin::{LoadedPlugin, PluginError, PluginRuntime};
use crate::spec::{Capability, KeyRule, SchemaSpec, SpecErrors};

/// Names the registry keeps for itself.
pub const RESERVED_NAMES: &[&str] = &["_registry", "_stats"];

/// The built-in schemas, by name (`spec` is the generic declarative one).
pub const BUILTIN_PLUGINS: &[&str] = &["rollout", "context", "datagen"];

/// Why a registry operation failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RegistryError {
    /// The store name breaks the naming rules.
    #[error("invalid store name '{name}': {reason}")]
    InvalidName {
        /// The store name.
        name: String,
        /// Why.
        reason: String,
    },
    /// A store of that name exists (or is being created).
    #[error("store '{name}' already exists")]
    AlreadyExists {
        /// The store name.
        name: String,
    },
    /// No store of that name.
    #[error("no store named '{name}'")]
    NotFound {
        /// The store name.
        name: String,
    },
    /// The entry was claimed by a create that did not finish (it failed or is
    /// still running). Drop it to free the name.
    #[error(
        "store '{name}' was not fully created (a create failed or is running); drop it to free the name"
    )]
    Incomplete {
        /// The store name.
        name: String,
    },
    /// The schema breaks the spec rules (every problem found).
    #[error(transparent)]
    Spec(#[from] SpecErrors),
    /// The plugin failed to load, declare or run.
    #[error(transparent)]
    Plugin(#[from] PluginError),
    /// The plugin source is not one the registry knows.
    #[error("unknown built-in plugin '{name}' (built-ins: {})", BUILTIN_PLUGINS.join(", "))]
    UnknownPlugin {
        /// The store name.
        name: String,
    },
    /// The plugin failed the probe run before a store pins it (see
    /// [`crate::probe`]): it trapped, or its output does not match its
    /// declaration.
    #[error("plugin {plugin} failed its probe, so no store pins it: {}", problems.join("; "))]
    ProbeFailed {
        /// The plugin.
        plugin: String,
        /// Every problem found.
        problems: Vec<String>,
    },
    /// The store's plugin cannot be replaced by this one.
    #[error("store '{name}' cannot be upgraded: {reason}")]
    UpgradeRefused {
        /// The store name.
        name: String,
        /// Why (for a schema that differs, the first difference).
        reason: String,
    },
    /// The stored plugin bytes do not hash to the pinned sha256.
    #[error(
        "store '{name}': the plugin file {path} has sha256 {found}, but the store pins {expected}; refusing to load it"
    )]
    PluginTampered {
        /// The store name.
        name: String,
        /// The file.
        path: PathBuf,
        /// The sha256 the store pins.
        expected: String,
        /// The sha256 the file has.
        found: String,
    },
    /// The pinned plugin bytes are gone.
    #[error("store '{name}': the pinned plugin file {path} is missing")]
    PluginMissing {
        /// The store name.
        name: String,
        /// The file.
        path: PathBuf,
    },
    /// The plugin now declares a different spec than the store was created with.
    #[error(
        "store '{name}': the plugin declares a different schema than the store was created with: {message}"
    )]
    SpecChanged {
        /// The store name.
        name: String,
        /// What went wrong.
        message: String,
    },
    /// Storage options the store was created with were not given.
    #[error(
        "store '{name}' was created with storage options {keys:?}; pass them to open it (values are never recorded)"
    )]
    MissingStorageOptions {
        /// The store name.
        name: String,
        /// The storage option keys missing.
        keys: Vec<String>,
    },
    /// The storage engine failed.
    #[error(transparent)]
    Store(#[from] lance_context_store::Error),
    /// A file of the catalogue could not be read or written.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// An entry does not parse, or names a plugin digest that is not one.
    #[error("{path}: corrupt registry entry: {message}")]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// What went wrong.
        message: String,
    },
    /// The location given for a new store already holds files.
    #[error(
        "store '{name}': {uri} is not empty; a store is created only where nothing is (choose another --uri)"
    )]
    UriNotEmpty {
        /// The store name.
        name: String,
        /// The location.
        uri: String,
    },
    /// The uri names no place Lance would write to as it says (see
    /// [`lance_context_store::resolve_uri`]).
    #[error(transparent)]
    InvalidUri(#[from] lance_context_store::UriError),
    /// A new store's location is, contains or is inside data that is not
    /// its own.
    #[error("store '{name}': refusing to place it at {uri}: {reason}")]
    UriRefused {
        /// The store name.
        name: String,
        /// The location, as given.
        uri: String,
        /// Whose data it would reach.
        reason: UriConflict,
    },
    /// The uri is outside the locations this caller may create stores in
    /// (the server's allowed prefixes).
    #[error(
        "uri '{uri}' is outside the locations stores may be created in here ({}); leave the uri out to create the store in the data root",
        allowed.join(", ")
    )]
    UriNotAllowed {
        /// The location, as given.
        uri: String,
        /// The allowed prefixes.
        allowed: Vec<String>,
    },
    /// The dataset to adopt conflicts with the plugin's declaration: the
    /// report names every column and why (nothing was registered).
    #[error(
        "store '{name}': the dataset at {} cannot be adopted with {}: {}",
        report.uri,
        report.plugin,
        report.conflicts().join("; ")
    )]
    AdoptRefused {
        /// The store name.
        name: String,
        /// The whole comparison.
        report: Box<AdoptReport>,
    },
    /// No schema was given for an adoption and none could be inferred.
    #[error("cannot tell the schema of the dataset at {uri}: {reason}; give --plugin or --spec")]
    CannotInfer {
        /// The dataset's location.
        uri: String,
        /// Why.
        reason: String,
    },
    /// Drop refused to delete a location that is not (only) this store's data.
    #[error("store '{name}': refusing to delete {uri}: {reason}")]
    UnsafeUri {
        /// The store name.
        name: String,
        /// The location.
        uri: String,
        /// Why.
        reason: String,
    },
}

type Result<T, E = RegistryError> = std::result::Result<T, E>;

/// Whose data a store's location would reach (see [`RegistryError::UriRefused`]
/// and [`RegistryError::UnsafeUri`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum UriConflict {
    /// The data root, or a directory containing it.
    #[error("it is the data root or contains it")]
    DataRoot,
    /// The registry's own files.
    #[error("it is the registry, inside it or around it")]
    Registry,
    /// A store of another data root's registry (the note it keeps with
    /// the data says so, and that registry still has it there).
    #[error("it is store '{name}' of the data root {root}")]
    OtherRoot {
        /// That registry's data root.
        root: String,
        /// The store's name there.
        name: String,
    },
    /// Another store's data (whatever the spelling of either uri).
    #[error("it overlaps store '{name}' at {uri}")]
    Store {
        /// The other store.
        name: String,
        /// Its uri.
        uri: String,
    },
    /// The data root's `stores/`, where every store created without a uri
    /// goes.
    #[error("it is the data root's stores directory, where every store without a uri goes")]
    StoresDir,
    /// Another name's place in the data root's `stores/`
    /// (`<root>/stores/<other>`, where a store of that name would go).
    #[error(
        "it is {place} or inside it, where store '{slot}' would go (under the data root's stores/ a store goes in its own name's place)"
    )]
    OtherPlace {
        /// The name whose place it is.
        slot: String,
        /// The place.
        place: String,
    },
}

/// Where a store's schema comes from.
#[derive(Clone)]
pub enum SchemaSource {
    /// A built-in plugin: `rollout`, `context` or `datagen`.
    Builtin(String),
    /// A compiled plugin (`.wasm` component bytes; the label names it in errors).
    Plugin {
        /// Names the plugin in errors (e.g. its file name).
        label: String,
        /// The component's bytes.
        bytes: Vec<u8>,
    },
    /// A declarative spec, run by the built-in generic `spec` plugin.
    Spec(SchemaSpec),
}

impl std::fmt::Debug for SchemaSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Builtin(name) => f.debug_tuple("Builtin").field(name).finish(),
            Self::Plugin { label, bytes } => f
                .debug_struct("Plugin")
                .field("label", label)
                .field("bytes", &bytes.len())
                .finish(),
            Self::Spec(spec) => f.debug_tuple("Spec").field(&spec.name).finish(),
        }
    }
}

/// How to create a store. Its `Debug` output shows the storage options'
/// keys only.
#[derive(Clone)]
pub struct CreateOptions {
    /// Where the schema comes from.
    pub source: SchemaSource,
    /// Creation parameters given to the plugin's `describe` (not for `Spec`).
    pub params: Vec<(String, String)>,
    /// Where the data goes; default `<root>/stores/<name>`.
    pub uri: Option<String>,
    /// Object-store options; only their keys are recorded.
    pub storage_options: HashMap<String, String>,
    /// JSON Lines of records the plugin should accept: the probe run before
    /// the plugin is pinned runs them too (see [`crate::probe`]).
    pub probe_samples: Option<Vec<u8>>,
    /// Buckets of the key column for scale-out (1, the default: none; see
    /// `lance_context_store::StoreConfig::with_buckets`).
    pub buckets: u32,
    /// The buckets the created store's handle writes (`None`: all; see
    /// `lance_context_store::StoreConfig::with_owned_buckets`).
    pub owned_buckets: Option<Vec<u32>>,
}

impl std::fmt::Debug for CreateOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut keys: Vec<&String> = self.storage_options.keys().collect();
        keys.sort();
        f.debug_struct("CreateOptions")
            .field("source", &self.source)
            .field("params", &self.params)
            .field("uri", &self.uri)
            .field("storage_option_keys", &keys)
            .finish()
    }
}

impl CreateOptions {
    /// Options for `source` with no parameters, default location, no storage options.
    pub fn new(source: SchemaSource) -> Self {
        Self {
            source,
            params: Vec::new(),
            uri: None,
            storage_options: HashMap::new(),
            probe_samples: None,
            buckets: 1,
            owned_buckets: None,
        }
    }
}

/// A catalogue entry.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StoreEntry {
    /// The store name.
    pub name: String,
    /// `creating` until the dataset exists, then `ready`.
    pub state: EntryState,
    /// The location.
    pub uri: String,
    /// Keys of the storage options the store was created with.
    pub storage_option_keys: Vec<String>,
    /// The plugin the store pins.
    pub plugin: PluginPin,
    /// The schema declaration the store was created with.
    pub spec: SchemaSpec,
    /// The plugin's creation parameters.
    pub params: Vec<(String, String)>,
    /// RFC 3339, UTC.
    pub created_at: String,
    /// Registered by [`Registry::adopt`] over a dataset that was already
    /// there: an adoption that did not finish (state `creating`) is
    /// dropped without deleting that dataset.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub adopted: bool,
}

impl StoreEntry {
    /// The schema as its author wrote it: for a store created from a spec
    /// file, that spec — its rules and defaults included, numbers as written
    /// (the plugin's declaration carries no rules) — else the declared spec.
    pub fn spec_as_written(&self) -> SchemaSpec {
        if self.plugin.source == "spec"
            && let Some((_, text)) = self.params.iter().find(|(k, _)| k == "spec")
            && let Ok(spec) = SchemaSpec::from_json(text)
        {
            return spec;
        }
        self.spec.clone()
    }

    /// The entry as `store describe` and the server show it: the schema as
    /// written ([`Self::spec_as_written`]) and the parameters other than a
    /// spec store's `spec` (it is the schema shown).
    pub fn for_display(&self) -> serde_json::Value {
        let mut shown = self.clone();
        shown.spec = self.spec_as_written();
        if self.plugin.source == "spec" {
            shown.params.retain(|(k, _)| k != "spec");
        }
        serde_json::to_value(&shown).unwrap_or(serde_json::Value::Null)
    }
}

/// A catalogue entry's state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EntryState {
    /// Being created.
    Creating,
    /// Ready to open.
    Ready,
}

/// The plugin a store pins.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PluginPin {
    /// The name its declaration gives.
    pub name: String,
    /// The plugin's version.
    pub version: String,
    /// Hex sha256 of the component bytes (also their file name in the root).
    pub sha256: String,
    /// `builtin:<name>`, `spec`, or `file:<label>`.
    pub source: String,
}

/// What [`Registry::drop_store`] removed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DropReport {
    /// The store name.
    pub name: String,
    /// The data location deleted.
    pub uri: String,
    /// The entry file deleted.
    pub entry: PathBuf,
    /// The plugin file deleted (no other store pinned it), if any.
    pub plugin_file: Option<PathBuf>,
    /// Whether the data was deleted: not for an adoption that did not
    /// finish (the dataset was there before it).
    pub data_deleted: bool,
}

/// The registry under one data root.
#[derive(Debug, Clone)]
pub struct Registry {
    root: PathBuf,
    runtime: Arc<PluginRuntime>,
}

/// Check a store name: 1–128 ASCII chars, `[A-Za-z0-9_][A-Za-z0-9._-]*`, not reserved.
pub fn check_name(name: &str) -> Result<()> {
    let invalid = |reason: &str| RegistryError::InvalidName {
        name: name.to_string(),
        reason: reason.to_string(),
    };
    if name.is_empty() || name.len() > 128 {
        return Err(invalid("a name is 1 to 128 characters"));
    }
    let mut chars = name.chars();
    let first = chars.next().expect("not empty");
    if !(first.is_ascii_alphanumeric() || first == '_') {
        return Err(invalid("a name starts with a letter, digit or '_'"));
    }
    if let Some(c) = chars.find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'))) {
        return Err(invalid(&format!(
            "'{c}' is not allowed (letters, digits, '_', '.', '-')"
        )));
    }
    if RESERVED_NAMES.contains(&name) {
        return Err(invalid("the name is reserved"));
    }
    Ok(())
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> RegistryError + '_ {
    move |source| RegistryError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// Write `bytes` to `path` atomically (a temporary file, then rename).
fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    let tmp = path.with_extension(format!("tmp-{}", uuid_like()));
    let mut file = std::fs::File::create(&tmp).map_err(io(&tmp))?;
    file.write_all(bytes).map_err(io(&tmp))?;
    file.sync_all().map_err(io(&tmp))?;
    std::fs::rename(&tmp, path).map_err(io(path))
}

fn uuid_like() -> String {
    format!(
        "{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0)
    )
}

/// An exclusive lock on a file of the registry, held until dropped (the OS
/// releases it if the process dies, so a crashed create never wedges a name).
#[derive(Debug)]
struct Lock(std::fs::File);

impl Lock {
    /// Wait for the lock at `path`.
    fn acquire(path: &Path) -> Result<Self> {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(path)
            .map_err(io(path))?;
        file.lock().map_err(io(path))?;
        Ok(Self(file))
    }
}

impl Drop for Lock {
    fn drop(&mut self) {
        let _ = self.0.unlock();
    }
}

/// Whether `digest` is a hex sha256 (what an entry may name as its plugin
/// file: anything else could be a path).
fn is_sha256(digest: &str) -> bool {
    digest.len() == 64
        && digest
            .bytes()
            .all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

/// The canonical location of a local directory.
fn canonical_dir(dir: &Path) -> Result<CanonicalLocation> {
    Ok(CanonicalLocation::of(&dir.to_string_lossy())?)
}

/// Whether `uri`, given over an interface that confines stores (the
/// server), is inside one of the `allowed` prefixes ([`CanonicalLocation`]:
/// however either is spelt). Refused as [`RegistryError::UriNotAllowed`];
/// a uri that does not resolve is [`RegistryError::InvalidUri`].
pub fn check_uri_allowed(uri: &str, allowed: &[String]) -> Result<()> {
    let target = CanonicalLocation::of(uri)?;
    for prefix in allowed {
        if CanonicalLocation::of(prefix)?.contains(&target) {
            return Ok(());
        }
    }
    Err(RegistryError::UriNotAllowed {
        uri: uri.to_string(),
        allowed: allowed.to_vec(),
    })
}

/// What [`Registry::entries`] found.
#[derive(Debug, Default)]
struct Entries {
    /// The entries that read.
    read: Vec<StoreEntry>,
    /// The name and recorded uri of entries that do not read.
    unread_uris: Vec<Unread>,
    /// The bytes of entries that do not read.
    unread_bytes: Vec<Vec<u8>>,
}

/// An entry that does not read, and the uri it records.
#[derive(Debug)]
struct Unread {
    name: String,
    uri: String,
}

/// The `uri` an entry's bytes record, if they are a JSON object with one.
fn recorded_uri(bytes: &[u8]) -> Option<String> {
    let value: serde_json::Value = serde_json::from_slice(bytes).ok()?;
    value.get("uri")?.as_str().map(str::to_string)
}

impl Registry {
    /// The registry under `root` (created when absent), loading plugins with
    /// `runtime`.
    pub fn at(root: impl Into<PathBuf>, runtime: Arc<PluginRuntime>) -> Result<Self> {
        let root = root.into();
        // Recorded uris are absolute, so entries do not depend on the cwd.
        let root = std::path::absolute(&root).map_err(io(&root))?;
        for dir in [
            root.join("registry/stores"),
            root.join("registry/plugins"),
            root.join("registry/locks"),
        ] {
            std::fs::create_dir_all(&dir).map_err(io(&dir))?;
        }
        Ok(Self { root, runtime })
    }

    /// The data root.
    pub fn root(&self) -> &Path {
        &self.root
    }

    fn entry_path(&self, name: &str) -> PathBuf {
        // Every caller checked the name (it becomes a file name).
        debug_assert!(check_name(name).is_ok(), "{name}");
        self.root.join(format!("registry/stores/{name}.json"))
    }

    fn plugin_path(&self, sha256: &str) -> PathBuf {
        debug_assert!(is_sha256(sha256));
        self.root.join(format!("registry/plugins/{sha256}.wasm"))
    }

    /// The lock a create or drop of `name` holds for its whole run (waited
    /// for off the async threads).
    async fn name_lock(&self, name: &str) -> Result<Lock> {
        // The name becomes a file name: it is checked first, so `../x`
        // never reaches the file system.
        check_name(name)?;
        let path = self.root.join(format!("registry/locks/{name}.lock"));
        tokio::task::spawn_blocking(move || Lock::acquire(&path))
            .await
            .map_err(|e| RegistryError::Io {
                path: self.root.join("registry/locks"),
                source: std::io::Error::other(e.to_string()),
            })?
    }

    /// The lock around claiming a name with its plugin file, and around
    /// deciding that a plugin file is no longer pinned.
    fn pins_lock(&self) -> Result<Lock> {
        Lock::acquire(&self.root.join("registry/locks/pins.lock"))
    }

    /// What data other than `name`'s own the location `uri` would reach,
    /// compared in canonical form ([`CanonicalLocation`]: whatever the
    /// spelling, symlinks followed): the data root or anything containing
    /// it, the registry, another registered store's data (inside, around or
    /// the same). For a new store (`new`), also the data root's `stores/`
    /// and any other name's place in it (`<root>/stores/<other>`): that is
    /// where a store of that name goes. An existing store is not held to
    /// that rule, so a store placed there before it existed still drops
    /// (the registered store of that name, if any, is protected anyway).
    /// One check for create and drop.
    fn location_conflict(&self, name: &str, uri: &str, new: bool) -> Result<Option<UriConflict>> {
        let target = CanonicalLocation::of(uri)?;
        let root = canonical_dir(&self.root)?;
        if target.contains(&root) {
            return Ok(Some(UriConflict::DataRoot));
        }
        if target.overlaps(&canonical_dir(&self.root.join("registry"))?) {
            return Ok(Some(UriConflict::Registry));
        }
        let entries = self.entries()?;
        let others = entries
            .read
            .iter()
            .map(|e| (&e.name, &e.uri))
            .chain(entries.unread_uris.iter().map(|u| (&u.name, &u.uri)));
        for (other, other_uri) in others {
            // An entry whose uri no longer resolves holds no data Lance
            // could reach through it.
            let Ok(at) = CanonicalLocation::of(other_uri) else {
                continue;
            };
            if other != name && target.overlaps(&at) {
                return Ok(Some(UriConflict::Store {
                    name: other.clone(),
                    uri: other_uri.clone(),
                }));
            }
        }
        let stores = canonical_dir(&self.root.join("stores"))?;
        if new && stores.contains(&target) {
            return Ok(match stores.child_towards(&target) {
                None => Some(UriConflict::StoresDir),
                Some(slot) if slot != name => Some(UriConflict::OtherPlace {
                    slot: slot.to_string(),
                    place: self.root.join("stores").join(slot).display().to_string(),
                }),
                Some(_) => None,
            });
        }
        Ok(None)
    }

    /// Refuse a new store's location unless Lance writes all of it where the
    /// uri says ([`lance_context_store::check_new_uri`]) and it reaches no
    /// one else's data ([`Self::location_conflict`]).
    fn check_new_location(&self, name: &str, uri: &str) -> Result<()> {
        lance_context_store::check_new_uri(uri)?;
        match self.location_conflict(name, uri, true)? {
            Some(reason) => Err(RegistryError::UriRefused {
                name: name.to_string(),
                uri: uri.to_string(),
                reason,
            }),
            None => Ok(()),
        }
    }

    /// Refuse to delete `uri` unless it is only `name`'s data: a Lance
    /// dataset (or nothing), not the data root or anything containing it,
    /// not the registry, not inside or around another store's data.
    async fn check_drop_target(
        &self,
        name: &str,
        uri: &str,
        storage_options: &HashMap<String, String>,
    ) -> Result<bool> {
        let unsafe_uri = |reason: String| RegistryError::UnsafeUri {
            name: name.to_string(),
            uri: uri.to_string(),
            reason,
        };
        if let Some(conflict) = self.location_conflict(name, uri, false)? {
            return Err(unsafe_uri(conflict.to_string()));
        }
        let mut config = StoreConfig::new(uri);
        config.storage_options = storage_options.clone();
        match Store::probe(&config).await? {
            Location::Empty => Ok(false),
            Location::Dataset => Ok(true),
            Location::Other => Err(unsafe_uri(
                "it is not a Lance dataset (no _versions/); delete it yourself if you mean to"
                    .into(),
            )),
        }
    }

    /// Create a store: check the name and the schema (every problem), claim
    /// the name, pin the plugin, create the dataset. Returns it opened.
    pub async fn create(&self, name: &str, options: CreateOptions) -> Result<NamedStore> {
        check_name(name)?;
        // The location before anything runs or is written (checked again
        // when the name is claimed: a store created meanwhile counts).
        let uri = match &options.uri {
            Some(uri) => absolute_uri(uri)?,
            None => self
                .root
                .join("stores")
                .join(name)
                .to_string_lossy()
                .into_owned(),
        };
        self.check_new_location(name, &uri)?;
        let resolved = resolve_source(&options.source, &options.params)?;
        let (plugin, probe_warnings) = self
            .load_and_probe(&resolved, &options.source, options.probe_samples.clone())
            .await?;
        let declared = plugin.declaration().clone();
        let Resolved {
            bytes,
            params,
            source,
            ..
        } = resolved;

        let mut keys: Vec<String> = options.storage_options.keys().cloned().collect();
        keys.sort();
        let mut entry = StoreEntry {
            name: name.to_string(),
            state: EntryState::Creating,
            uri,
            storage_option_keys: keys,
            plugin: PluginPin {
                name: declared.name.clone(),
                version: declared.version.clone(),
                sha256: declared.sha256.clone(),
                source,
            },
            spec: declared.spec.clone(),
            params,
            created_at: chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
            adopted: false,
        };

        // One create or drop of a name at a time (held to the end).
        let _name = self.name_lock(name).await?;
        if self.entry_path(name).exists() {
            return Err(RegistryError::AlreadyExists {
                name: name.to_string(),
            });
        }
        let config = store_config(&entry, &plugin, &options.storage_options)
            .with_buckets(options.buckets)
            .with_owned_buckets(options.owned_buckets.clone());
        if Store::probe(&config).await? != Location::Empty {
            return Err(RegistryError::UriNotEmpty {
                name: name.to_string(),
                uri: entry.uri.clone(),
            });
        }
        let path = self.claim_entry(name, &entry, &declared.sha256, &bytes)?;
        let created = match Store::create(config.clone()).await {
            Ok(store) => Ok(store),
            // Someone else's data appeared meanwhile: leave it.
            Err(e @ lance_context_store::Error::AlreadyExists { .. }) => Err(e.into()),
            // A create that failed part-way: the location was empty before,
            // so everything there is what this create wrote.
            Err(e) => {
                let _ = Store::destroy(&config).await;
                Err(e.into())
            }
        };
        match created {
            Ok(store) => {
                entry.state = EntryState::Ready;
                write_atomic(&path, &self.stored_form(&entry))?;
                self.note_owner(&config, name).await;
                Ok(NamedStore::new(entry, plugin, store).with_probe_warnings(probe_warnings))
            }
            Err(e) => {
                // Free the name.
                let _ = std::fs::remove_file(&path);
                Err(e)
            }
        }
    }

    /// Claim `name` with `entry` (state `creating`) and pin its plugin
    /// (`bytes` under `sha256`) together, under the pins lock: a drop
    /// deciding that the plugin file is unpinned sees this entry, or runs
    /// before it; a concurrent create or adoption of an overlapping location
    /// has claimed its name (and is seen here) or waits. The caller holds
    /// the name lock. The entry's path.
    pub(crate) fn claim_entry(
        &self,
        name: &str,
        entry: &StoreEntry,
        sha256: &str,
        bytes: &[u8],
    ) -> Result<PathBuf> {
        let _pins = self.pins_lock()?;
        self.check_new_location(name, &entry.uri)?;
        let path = self.entry_path(name);
        let claim = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&path);
        match claim {
            Ok(mut file) => {
                let json = self.stored_form(entry);
                file.write_all(&json)
                    .and_then(|()| file.sync_all())
                    .map_err(io(&path))?;
            }
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                return Err(RegistryError::AlreadyExists {
                    name: name.to_string(),
                });
            }
            Err(e) => return Err(io(&path)(e)),
        }
        if let Err(e) = self.pin_plugin(name, sha256, bytes) {
            let _ = std::fs::remove_file(&path);
            return Err(e);
        }
        Ok(path)
    }

    /// Keep the plugin bytes under their hash (an existing file must hash right).
    fn pin_plugin(&self, name: &str, sha256: &str, bytes: &[u8]) -> Result<()> {
        let path = self.plugin_path(sha256);
        match std::fs::read(&path) {
            Ok(existing) => {
                let found = crate::sha256_hex(&existing);
                if found != sha256 {
                    return Err(RegistryError::PluginTampered {
                        name: name.to_string(),
                        path,
                        expected: sha256.to_string(),
                        found,
                    });
                }
                Ok(())
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => write_atomic(&path, bytes),
            Err(e) => Err(io(&path)(e)),
        }
    }

    /// The entry of `name`.
    pub fn describe(&self, name: &str) -> Result<StoreEntry> {
        check_name(name)?;
        let path = self.entry_path(name);
        let text = match std::fs::read(&path) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(RegistryError::NotFound {
                    name: name.to_string(),
                });
            }
            Err(e) => return Err(io(&path)(e)),
        };
        let entry: StoreEntry =
            serde_json::from_slice(&text).map_err(|e| RegistryError::Corrupt {
                path: path.clone(),
                message: e.to_string(),
            })?;
        if !is_sha256(&entry.plugin.sha256) {
            return Err(RegistryError::Corrupt {
                path,
                message: "the plugin digest is not a hex sha256".into(),
            });
        }
        if entry.name != name {
            return Err(RegistryError::Corrupt {
                path,
                message: format!("the entry names store '{}'", entry.name),
            });
        }
        let mut entry = entry;
        // A store in the root's own `stores/` is recorded relative to the
        // root: a copied or moved root opens its own copy of the data.
        if !entry.uri.contains("://") && Path::new(&entry.uri).is_relative() {
            entry.uri = self.root.join(&entry.uri).to_string_lossy().into_owned();
        }
        Ok(entry)
    }

    /// An entry as written to disk: the default location (`ROOT/stores/NAME`)
    /// recorded relative to the root.
    fn stored_form(&self, entry: &StoreEntry) -> Vec<u8> {
        let mut stored = entry.clone();
        let default = self.root.join("stores").join(&entry.name);
        if Path::new(&entry.uri) == default {
            stored.uri = format!("stores/{}", entry.name);
        }
        serde_json::to_vec_pretty(&stored).expect("an entry serializes")
    }

    /// Every entry, by name. A file under `registry/stores/` that is not a
    /// regular `<name>.json` file is skipped, and so is an entry that does
    /// not read (it does not parse, names another store, …): each is logged
    /// as a warning, and `describe` of its name reports why. One damaged
    /// entry does not hide the others or fail every caller of the listing.
    pub fn list(&self) -> Result<Vec<StoreEntry>> {
        Ok(self.entries()?.read)
    }

    /// The entries under `registry/stores/`: those that read, and for those
    /// that do not, their raw bytes (so a plugin they may pin is kept) and
    /// the uri they record, if any can be found (so their data is not
    /// overlapped).
    fn entries(&self) -> Result<Entries> {
        let dir = self.root.join("registry/stores");
        let mut names = BTreeSet::new();
        for item in std::fs::read_dir(&dir).map_err(io(&dir))? {
            let item = item.map_err(io(&dir))?;
            let file = item.file_name().to_string_lossy().into_owned();
            let Some(name) = file.strip_suffix(".json") else {
                continue;
            };
            if check_name(name).is_err() {
                continue;
            }
            // Not following links: an entry is a file the registry wrote.
            if !item.file_type().is_ok_and(|t| t.is_file()) {
                tracing::warn!(path = %item.path().display(), "not a registry entry (not a regular file): skipped");
                continue;
            }
            names.insert(name.to_string());
        }
        let mut entries = Entries::default();
        for name in names {
            match self.describe(&name) {
                Ok(entry) => entries.read.push(entry),
                Err(e) => {
                    tracing::warn!(store = %name, error = %e, "a registry entry does not read: skipped");
                    let path = self.entry_path(&name);
                    let bytes = std::fs::read(&path).unwrap_or_default();
                    if let Some(uri) = recorded_uri(&bytes) {
                        let uri = match !uri.contains("://") && Path::new(&uri).is_relative() {
                            true => self.root.join(&uri).to_string_lossy().into_owned(),
                            false => uri,
                        };
                        entries.unread_uris.push(Unread { name, uri });
                    }
                    entries.unread_bytes.push(bytes);
                }
            }
        }
        Ok(entries)
    }

    /// Load the plugin a store pins, checking its hash and its spec (on the
    /// runtime's loaders, see [`PluginRuntime::load_async`]).
    pub async fn plugin(&self, entry: &StoreEntry) -> Result<LoadedPlugin> {
        let path = self.plugin_path(&entry.plugin.sha256);
        let bytes = match std::fs::read(&path) {
            Ok(bytes) => bytes,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(RegistryError::PluginMissing {
                    name: entry.name.clone(),
                    path,
                });
            }
            Err(e) => return Err(io(&path)(e)),
        };
        // The hash is checked by the load, beside the compile cache's read.
        let plugin = self
            .runtime
            .load_pinned_async(
                &entry.plugin.name,
                bytes,
                entry.plugin.sha256.clone(),
                entry.params.clone(),
            )
            .await
            .map_err(|e| match e {
                crate::PinnedLoadError::Mismatch { found } => RegistryError::PluginTampered {
                    name: entry.name.clone(),
                    path,
                    expected: entry.plugin.sha256.clone(),
                    found,
                },
                crate::PinnedLoadError::Plugin(e) => e.into(),
            })?;
        let declared = &plugin.declaration().spec;
        if declared != &entry.spec {
            return Err(RegistryError::SpecChanged {
                name: entry.name.clone(),
                message: spec_difference(&entry.spec, declared),
            });
        }
        Ok(plugin)
    }

    /// Open a store by name with its writer (see [`Registry::open_with`]).
    pub async fn open(
        &self,
        name: &str,
        storage_options: &HashMap<String, String>,
    ) -> Result<NamedStore> {
        self.open_with(name, storage_options, false, |c| c).await
    }

    /// Open a store by name: entry, pinned plugin (hash and spec checked),
    /// then the dataset with the recorded uri and schema. `read_only` opens no
    /// writer; `tune` adjusts the engine config (maintenance, instance id, …).
    pub async fn open_with(
        &self,
        name: &str,
        storage_options: &HashMap<String, String>,
        read_only: bool,
        tune: impl FnOnce(StoreConfig) -> StoreConfig,
    ) -> Result<NamedStore> {
        let entry = self.describe(name)?;
        if entry.state != EntryState::Ready {
            return Err(RegistryError::Incomplete {
                name: name.to_string(),
            });
        }
        let missing: Vec<String> = entry
            .storage_option_keys
            .iter()
            .filter(|k| !storage_options.contains_key(*k))
            .cloned()
            .collect();
        if !missing.is_empty() {
            return Err(RegistryError::MissingStorageOptions {
                name: name.to_string(),
                keys: missing,
            });
        }
        let plugin = self.plugin(&entry).await?;
        let config = tune(store_config(&entry, &plugin, storage_options));
        let store = if read_only {
            Store::open_read_only(config).await?
        } else {
            Store::open(config).await?
        };
        Ok(NamedStore::new(entry, plugin, store))
    }

    /// Drop a store: its data, its entry, and its plugin file when no other
    /// store pins it. Close the store everywhere first. The data is deleted
    /// only if it is this store's alone (see [`RegistryError::UnsafeUri`]).
    pub async fn drop_store(
        &self,
        name: &str,
        storage_options: &HashMap<String, String>,
    ) -> Result<DropReport> {
        check_name(name)?;
        let _name = self.name_lock(name).await?;
        let entry = self.describe(name)?;
        // An adoption that did not finish registered someone's existing
        // dataset: only the entry goes.
        let unfinished_adoption = entry.adopted && entry.state != EntryState::Ready;
        let mut data_deleted = false;
        if !unfinished_adoption
            && self
                .check_drop_target(name, &entry.uri, storage_options)
                .await?
        {
            let mut config = StoreConfig::new(&entry.uri);
            config.storage_options = storage_options.clone();
            Store::destroy(&config).await?;
            data_deleted = true;
        }
        let _pins = self.pins_lock()?;
        let path = self.entry_path(name);
        std::fs::remove_file(&path).map_err(io(&path))?;
        let plugin_file = self.remove_if_unpinned(&entry.plugin.sha256)?;
        Ok(DropReport {
            name: name.to_string(),
            uri: entry.uri,
            entry: path,
            plugin_file,
            data_deleted,
        })
    }
}

/// What [`Registry::upgrade`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UpgradeReport {
    /// The store name.
    pub name: String,
    /// The pin before.
    pub from: PluginPin,
    /// The pin now.
    pub to: PluginPin,
    /// The old plugin's file, removed when no store pins it any more.
    pub removed_plugin_file: Option<PathBuf>,
    /// What the probe of the new plugin warned about.
    pub probe_warnings: Vec<String>,
}

impl Registry {
    /// Replace the plugin store `name` pins by `bytes` (a component, `label`
    /// naming it in errors and in the pin's source, `file:<label>`): the new
    /// plugin must declare exactly the schema the store was created with
    /// (the difference is the error otherwise), and pass the probe
    /// ([`crate::probe`]). The entry is re-pinned atomically; a store open
    /// elsewhere (a running server) keeps the old plugin until reopened.
    pub async fn upgrade(
        &self,
        name: &str,
        label: &str,
        bytes: &[u8],
        samples: Option<Vec<u8>>,
    ) -> Result<UpgradeReport> {
        let _name = self.name_lock(name).await?;
        let mut entry = self.describe(name)?;
        if entry.state != EntryState::Ready {
            return Err(RegistryError::Incomplete {
                name: name.to_string(),
            });
        }
        if entry.plugin.source == "spec" {
            return Err(RegistryError::UpgradeRefused {
                name: name.to_string(),
                reason: "it was created from a spec file and is run by the built-in spec plugin; create a new store from the changed spec and move the records (store export | store add)"
                    .into(),
            });
        }
        let plugin = self
            .runtime
            .load_async(label, bytes.to_vec(), entry.params.clone())
            .await?;
        let declared = plugin.declaration().clone();
        // The stored data's shape must not change; named queries and
        // full-text indexes (built on open when missing) may.
        let without_queries = |spec: &SchemaSpec| SchemaSpec {
            queries: Vec::new(),
            text_columns: Vec::new(),
            ..spec.clone()
        };
        if without_queries(&declared.spec) != without_queries(&entry.spec) {
            return Err(RegistryError::UpgradeRefused {
                name: name.to_string(),
                reason: format!(
                    "the new plugin declares a different schema: {}; an upgrade must declare the same schema (create a new store for a new one and move the records: store export | store add)",
                    spec_difference(&entry.spec, &declared.spec)
                ),
            });
        }
        let probe_warnings = probe_before_pin(&plugin, label, samples).await?;
        let from = entry.plugin.clone();
        let to = PluginPin {
            name: declared.name.clone(),
            version: declared.version.clone(),
            sha256: declared.sha256.clone(),
            source: format!("file:{label}"),
        };
        let _pins = self.pins_lock()?;
        self.pin_plugin(name, &to.sha256, bytes)?;
        entry.plugin = to.clone();
        entry.spec = declared.spec.clone();
        let path = self.entry_path(name);
        write_atomic(&path, &self.stored_form(&entry))?;
        let removed_plugin_file = self.remove_if_unpinned(&from.sha256)?;
        Ok(UpgradeReport {
            name: name.to_string(),
            from,
            to,
            removed_plugin_file,
            probe_warnings,
        })
    }

    /// Remove the plugin file of `sha256` when no entry pins it any more
    /// (call holding the pins lock); the path removed.
    fn remove_if_unpinned(&self, sha256: &str) -> Result<Option<PathBuf>> {
        let entries = self.entries()?;
        // An entry that does not read may still pin it: kept if its bytes
        // name the digest.
        let named_by_unread = entries
            .unread_bytes
            .iter()
            .any(|b| b.windows(sha256.len()).any(|w| w == sha256.as_bytes()));
        if named_by_unread || entries.read.iter().any(|e| e.plugin.sha256 == sha256) {
            return Ok(None);
        }
        let path = self.plugin_path(sha256);
        match std::fs::remove_file(&path) {
            Ok(()) => Ok(Some(path)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(io(&path)(e)),
        }
    }
}

/// `uri` with a relative local path made absolute against the current
/// directory (what Lance would open), so that the checks, the writes and
/// the recorded entry all name the same place (an entry's relative uri is
/// read against the data root).
pub(crate) fn absolute_uri(uri: &str) -> Result<String> {
    if uri.contains("://") || uri.to_ascii_lowercase().starts_with("file:") {
        return Ok(uri.to_string());
    }
    let path = Path::new(uri);
    if path.is_absolute() {
        return Ok(uri.to_string());
    }
    let absolute = std::path::absolute(path).map_err(io(path))?;
    Ok(absolute.to_string_lossy().into_owned())
}

/// The note a registry keeps with each store's data
/// (`_lance_context/registry.json`): which data root registered it, under
/// which name — so that another data root does not adopt a live store.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct OwnerNote {
    pub(crate) root: String,
    pub(crate) name: String,
}

/// The note's file name under `_lance_context/`.
pub(crate) const OWNER_NOTE: &str = "registry.json";

impl Registry {
    /// Keep the owner note with a store's data (best effort: a store
    /// without one is only less protected from another root's adoption).
    pub(crate) async fn note_owner(&self, config: &StoreConfig, name: &str) {
        let note = OwnerNote {
            root: self.root.to_string_lossy().into_owned(),
            name: name.to_string(),
        };
        let bytes = serde_json::to_vec(&note).unwrap_or_default();
        if let Err(e) = Store::write_note(config, OWNER_NOTE, &bytes).await {
            tracing::warn!(store = name, "keeping the registry note with the data: {e}");
        }
    }

    /// The store of another data root the dataset at `uri` still is, by
    /// the note kept with it: that root's registry has the named store at
    /// this same location. A copy of a store's data (the note copied with
    /// it, the store elsewhere) or a store since dropped is no one's.
    pub(crate) async fn other_owner(
        &self,
        config: &StoreConfig,
        uri: &str,
    ) -> Result<Option<UriConflict>> {
        let Some(bytes) = Store::read_note(config, OWNER_NOTE).await? else {
            return Ok(None);
        };
        let Ok(note) = serde_json::from_slice::<OwnerNote>(&bytes) else {
            return Ok(None);
        };
        // The note is data: its name becomes a file name only when valid.
        if check_name(&note.name).is_err() {
            return Ok(None);
        }
        let root = PathBuf::from(&note.root);
        let entry_file = root.join(format!("registry/stores/{}.json", note.name));
        let Ok(text) = std::fs::read(&entry_file) else {
            return Ok(None);
        };
        let Ok(entry) = serde_json::from_slice::<StoreEntry>(&text) else {
            return Ok(None);
        };
        let their_uri = match !entry.uri.contains("://") && Path::new(&entry.uri).is_relative() {
            true => root.join(&entry.uri).to_string_lossy().into_owned(),
            false => entry.uri.clone(),
        };
        let (Ok(theirs), Ok(ours)) = (
            CanonicalLocation::of(&their_uri),
            CanonicalLocation::of(uri),
        ) else {
            return Ok(None);
        };
        Ok(theirs.overlaps(&ours).then_some(UriConflict::OtherRoot {
            root: note.root,
            name: note.name,
        }))
    }
}

/// A schema source made concrete: the component's bytes, the parameters
/// its `describe` gets, the pin's source, the label naming it in errors, and
/// the key rule its declaration is held to.
pub(crate) struct Resolved {
    pub(crate) bytes: Vec<u8>,
    pub(crate) params: Vec<(String, String)>,
    pub(crate) source: String,
    pub(crate) label: String,
    pub(crate) key_rule: KeyRule,
}

/// The component and parameters of `source` (a spec is checked here, every
/// problem with its field, before anything runs).
pub(crate) fn resolve_source(
    source: &SchemaSource,
    params: &[(String, String)],
) -> Result<Resolved> {
    Ok(match source {
        SchemaSource::Builtin(plugin) => {
            if !BUILTIN_PLUGINS.contains(&plugin.as_str()) {
                return Err(RegistryError::UnknownPlugin {
                    name: plugin.clone(),
                });
            }
            let bytes = crate::builtin_plugin_bytes(plugin)
                .ok_or_else(|| RegistryError::UnknownPlugin {
                    name: plugin.clone(),
                })?
                .to_vec();
            Resolved {
                bytes,
                params: params.to_vec(),
                source: format!("builtin:{plugin}"),
                label: plugin.clone(),
                key_rule: KeyRule::Builtin,
            }
        }
        SchemaSource::Plugin { label, bytes } => Resolved {
            bytes: bytes.clone(),
            params: params.to_vec(),
            source: format!("file:{label}"),
            label: label.clone(),
            key_rule: KeyRule::IdOnly,
        },
        SchemaSource::Spec(spec) => {
            spec.check(KeyRule::IdOnly)?;
            if let Some((param, _)) = params.first() {
                return Err(PluginError::InvalidParams {
                    plugin: "spec".into(),
                    message: format!(
                        "a store from a spec takes no parameters (got '{param}'); put everything in the spec"
                    ),
                }
                .into());
            }
            let bytes = crate::builtin_plugin_bytes("spec-plugin")
                .ok_or_else(|| RegistryError::UnknownPlugin {
                    name: "spec-plugin".into(),
                })?
                .to_vec();
            Resolved {
                bytes,
                params: vec![("spec".to_string(), spec.to_json())],
                source: "spec".to_string(),
                label: spec.name.clone(),
                key_rule: KeyRule::IdOnly,
            }
        }
    })
}

impl Registry {
    /// Load `resolved` on the runtime's loaders (a slow compile or describe
    /// holds no async worker), check its declaration, and probe it on
    /// generated records (a broken transform fails here, not on the store's
    /// first add): the plugin and the probe's warnings.
    pub(crate) async fn load_and_probe(
        &self,
        resolved: &Resolved,
        source: &SchemaSource,
        samples: Option<Vec<u8>>,
    ) -> Result<(LoadedPlugin, Vec<String>)> {
        let plugin = self
            .runtime
            .load_async(
                &resolved.label,
                resolved.bytes.clone(),
                resolved.params.clone(),
            )
            .await?;
        // Loading checked the built-in key rule; user schemas key by `id`.
        if resolved.key_rule == KeyRule::IdOnly {
            plugin.declaration().spec.check(resolved.key_rule)?;
        }
        let samples = samples.or_else(|| match source {
            SchemaSource::Builtin(name) => {
                crate::builtin_samples(name).map(|s| s.as_bytes().to_vec())
            }
            _ => None,
        });
        let warnings = probe_before_pin(&plugin, &resolved.label, samples).await?;
        Ok((plugin, warnings))
    }
}

/// Probe `plugin` ([`crate::probe`], off the async workers): `Err` with
/// every problem when a store must not pin it, else its warnings.
async fn probe_before_pin(
    plugin: &LoadedPlugin,
    label: &str,
    samples: Option<Vec<u8>>,
) -> Result<Vec<String>> {
    let probed = plugin.clone();
    let failed = |problems| RegistryError::ProbeFailed {
        plugin: label.to_string(),
        problems,
    };
    let report = tokio::task::spawn_blocking(move || crate::probe(&probed, samples.as_deref()))
        .await
        .map_err(|e| failed(vec![format!("the probe did not finish: {e}")]))?;
    match report.problems() {
        problems if problems.is_empty() => Ok(report.at(crate::ProbeLevel::Warning)),
        problems => Err(failed(problems)),
    }
}

/// The engine config of a store: uri, the declared schema and key, vector
/// columns, the storage options given.
pub fn store_config(
    entry: &StoreEntry,
    plugin: &LoadedPlugin,
    storage_options: &HashMap<String, String>,
) -> StoreConfig {
    let spec = &plugin.declaration().spec;
    let vector_columns = spec
        .vectors
        .iter()
        .map(|v| VectorColumn {
            column: v.column.clone(),
            dimension: v.dimension as usize,
            metric: v.metric,
            kind: VectorIndexKind::IvfSq,
        })
        .collect();
    StoreConfig::new(&entry.uri)
        .with_schema(plugin.declaration().schema.clone())
        .with_key_column(&spec.key)
        .with_storage_options(storage_options.clone())
        .with_indexes(IndexSettings {
            vector_columns,
            text_columns: spec.text_columns.clone(),
            ..IndexSettings::default()
        })
        .with_capabilities(RecordCapabilities {
            tombstones: spec.has(Capability::Tombstones),
            supersession: spec.has(Capability::Supersession),
            lifecycle: spec.has(Capability::Lifecycle),
            unique_keys: spec.has(Capability::UniqueKeys),
            secondary_key: spec.secondary_key.clone(),
        })
}

/// Where two specs first differ, for [`RegistryError::SpecChanged`].
fn spec_difference(recorded: &SchemaSpec, now: &SchemaSpec) -> String {
    if recorded.key != now.key {
        return format!("key '{}' is now '{}'", recorded.key, now.key);
    }
    for (a, b) in recorded.columns.iter().zip(&now.columns) {
        if a != b {
            return format!(
                "column '{}' ({}, nullable {}) is now '{}' ({}, nullable {})",
                a.name, a.data_type, a.nullable, b.name, b.data_type, b.nullable
            );
        }
    }
    if recorded.columns.len() != now.columns.len() {
        let names = |cols: &[crate::spec::ColumnSpec]| -> Vec<String> {
            cols.iter().map(|c| c.name.clone()).collect()
        };
        let (before, after) = (names(&recorded.columns), names(&now.columns));
        let added: Vec<&String> = after.iter().filter(|c| !before.contains(c)).collect();
        let removed: Vec<&String> = before.iter().filter(|c| !after.contains(c)).collect();
        let list = |v: &[&String]| {
            v.iter()
                .map(|c| format!("'{c}'"))
                .collect::<Vec<_>>()
                .join(", ")
        };
        return match (added.is_empty(), removed.is_empty()) {
            (false, true) => format!("column(s) {} added", list(&added)),
            (true, false) => format!("column(s) {} removed", list(&removed)),
            _ => format!(
                "{} columns are now {}",
                recorded.columns.len(),
                now.columns.len()
            ),
        };
    }
    if recorded.name != now.name {
        return format!(
            "the schema's name '{}' is now '{}'",
            recorded.name, now.name
        );
    }
    "blob columns, vectors, text columns, secondary key or capabilities differ".to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_follow_the_rules() {
        for good in ["a", "A_1", "_x", "0.b-c", &"n".repeat(128)] {
            assert!(check_name(good).is_ok(), "{good}");
        }
        for bad in [
            "",
            &"n".repeat(129),
            "-a",
            ".a",
            "a/b",
            "a b",
            "é",
            "_registry",
            "_stats",
        ] {
            assert!(
                matches!(check_name(bad), Err(RegistryError::InvalidName { .. })),
                "{bad}"
            );
        }
    }
}
