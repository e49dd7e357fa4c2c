//! The registry's operations: create, adopt, list, describe, drop, upgrade.

use base64::Engine as _;
use lance_context_client::{
    AdoptStore, Adopted, CreateStore, Dropped, PinnedPlugin, PluginInfo, StoreInfo, UpgradeStore,
    Upgraded,
};
use serde_json::Value;

use super::{ApiError, Embedded, Hold};
use crate::spec::SchemaSpec;
use crate::{CreateOptions, ErrorKind, SchemaSource, StoreEntry};

impl Embedded {
    pub(super) async fn create(&self, create: CreateStore) -> Result<StoreInfo, ApiError> {
        // A caller of the API goes only where the operator allows.
        if let Some(uri) = &create.uri {
            self.check_uri(uri)?;
        }
        let source = schema_source(
            &create.name,
            create.plugin,
            create.plugin_wasm_base64,
            create.spec,
        )
        .await?
        .ok_or_else(|| ApiError::invalid("give exactly one of plugin, plugin_wasm_base64, spec"))?;
        let source = named_file(source, create.plugin_file_name.as_deref())?;
        let mut options = CreateOptions::new(source);
        options.params = params(create.params);
        options.uri = create.uri;
        options.storage_options = self.config.storage_options.clone();
        options.probe_samples = samples(&create.samples)?;
        options.buckets = create.buckets.unwrap_or(1);
        options.owned_buckets = self.config.owned_buckets.clone();
        // The registry serialises creates of one name; other stores'
        // operations go on meanwhile.
        let (entry, warnings) = self.create_open(&create.name, options).await?;
        Ok(StoreInfo {
            probe_warnings: warnings,
            ..info(entry)
        })
    }

    pub(super) async fn adopt_dataset(
        &self,
        name: &str,
        adopt: AdoptStore,
    ) -> Result<Adopted, ApiError> {
        self.check_uri(&adopt.uri)?;
        let file_name = adopt.plugin_file_name.as_deref();
        let source =
            schema_source(name, adopt.plugin, adopt.plugin_wasm_base64, adopt.spec).await?;
        let source = match source {
            Some(source) => Some(named_file(source, file_name)?),
            None if file_name.is_some() => return Err(no_component()),
            None => None,
        };
        let options = crate::AdoptOptions {
            uri: adopt.uri,
            source,
            params: params(adopt.params),
            storage_options: self.config.storage_options.clone(),
            dry_run: adopt.dry_run,
        };
        let report = self.registry.adopt(name, options).await?;
        serde_json::to_value(&report)
            .and_then(serde_json::from_value)
            .map_err(|e| ApiError::of_kind(ErrorKind::Internal, format!("the report: {e}")))
    }

    pub(super) fn stores(&self) -> Result<Vec<StoreInfo>, ApiError> {
        Ok(self.registry.list()?.into_iter().map(info).collect())
    }

    pub(super) fn describe(&self, name: &str) -> Result<StoreInfo, ApiError> {
        Ok(info(self.registry.describe(name)?))
    }

    pub(super) async fn drop_named(&self, name: &str) -> Result<Dropped, ApiError> {
        // Its running operations end first; then its writer is released.
        let report = self
            .holding(name, Hold::Dropping, async {
                Ok(self
                    .registry
                    .drop_store(name, &self.config.storage_options)
                    .await?)
            })
            .await?;
        Ok(Dropped {
            store: report.name,
            uri: report.uri,
            data_deleted: report.data_deleted,
            plugin_file_removed: report.plugin_file.is_some(),
        })
    }

    pub(super) async fn upgrade_plugin(
        &self,
        name: &str,
        request: UpgradeStore,
    ) -> Result<Upgraded, ApiError> {
        let (label, bytes) = match (request.plugin, request.plugin_wasm_base64) {
            (Some(builtin), None) => {
                if request.plugin_file_name.is_some() {
                    return Err(no_component());
                }
                let bytes = crate::builtin_plugin_bytes(&builtin).ok_or_else(|| {
                    ApiError::invalid(format!(
                        "plugin '{builtin}': not a built-in plugin (rollout, context, datagen); send a component as plugin_wasm_base64"
                    ))
                })?;
                (builtin, bytes.to_vec())
            }
            (None, Some(b64)) => {
                let label = match &request.plugin_file_name {
                    Some(given) => plugin_file_name(given)?,
                    None => format!("{name}.wasm"),
                };
                (label, decoded(b64).await?)
            }
            _ => {
                return Err(ApiError::invalid(
                    "give exactly one of plugin, plugin_wasm_base64",
                ));
            }
        };
        let samples = samples(&request.samples)?;
        // The store's running operations end and its handle is closed
        // first: the operations after the upgrade open it with the new
        // plugin.
        let report = self
            .holding(name, Hold::Upgrading, async {
                Ok(self
                    .registry()
                    .upgrade(name, &label, &bytes, samples)
                    .await?)
            })
            .await?;
        let pinned = |pin: &crate::PluginPin| PinnedPlugin {
            plugin: pin.name.clone(),
            version: pin.version.clone(),
            sha256: pin.sha256.clone(),
        };
        Ok(Upgraded {
            store: report.name.clone(),
            from: pinned(&report.from),
            to: pinned(&report.to),
            removed_plugin_file: report.removed_plugin_file.is_some(),
            probe_warnings: report.probe_warnings,
        })
    }

    /// A uri from a caller: where the configured prefixes allow (absolute,
    /// and reaching no other store's data: the registry checks that).
    fn check_uri(&self, uri: &str) -> Result<(), ApiError> {
        let Some(allowed) = &self.config.allowed_uri_prefixes else {
            return Ok(());
        };
        if !uri.contains("://") && !std::path::Path::new(uri).is_absolute() {
            return Err(ApiError::invalid(format!(
                "uri '{uri}': give an absolute path or a URL (a store without uri goes under the data root)"
            )));
        }
        crate::check_uri_allowed(uri, allowed)?;
        Ok(())
    }
}

/// `source` with its component named `file_name` when one is given (only
/// a component has a file name).
fn named_file(source: SchemaSource, file_name: Option<&str>) -> Result<SchemaSource, ApiError> {
    match (source, file_name) {
        (source, None) => Ok(source),
        (SchemaSource::Plugin { bytes, .. }, Some(name)) => Ok(SchemaSource::Plugin {
            label: plugin_file_name(name)?,
            bytes,
        }),
        (_, Some(_)) => Err(no_component()),
    }
}

fn no_component() -> ApiError {
    ApiError::invalid("plugin_file_name names a component: give it with plugin_wasm_base64")
}

/// A component's file name from a caller, for its pin (`file:NAME`): a
/// file name, not a path — at most 128 characters, no control characters,
/// no `/` or `\`, not starting with `.` (it is shown in the pin and in
/// errors, never used as a path).
fn plugin_file_name(given: &str) -> Result<String, ApiError> {
    let plain = !given.is_empty()
        && given.chars().count() <= 128
        && !given.starts_with('.')
        && !given
            .chars()
            .any(|c| c.is_control() || matches!(c, '/' | '\\'));
    match plain {
        true => Ok(given.to_string()),
        false => Err(ApiError::invalid(format!(
            "plugin_file_name {:?}: give a file name (at most 128 characters, no '/', '\\' or control characters, not starting with '.')",
            given.chars().take(140).collect::<String>()
        ))),
    }
}

/// The probe's sample records as the registry takes them (JSON Lines);
/// `None` when there are none.
fn samples(records: &[Value]) -> Result<Option<Vec<u8>>, ApiError> {
    if records.is_empty() {
        return Ok(None);
    }
    let mut lines = Vec::new();
    for (i, record) in records.iter().enumerate() {
        if !record.is_object() {
            return Err(ApiError::invalid(format!(
                "samples[{i}]: a record is a JSON object"
            )));
        }
        serde_json::to_writer(&mut lines, record)
            .map_err(|e| ApiError::invalid(format!("samples[{i}]: {e}")))?;
        lines.push(b'\n');
    }
    Ok(Some(lines))
}

/// Creation parameters as the plugin takes them: each value's JSON text.
fn params(given: std::collections::BTreeMap<String, Value>) -> Vec<(String, String)> {
    given.into_iter().map(|(k, v)| (k, v.to_string())).collect()
}

/// A registry entry as the API shows it.
pub(crate) fn info(entry: StoreEntry) -> StoreInfo {
    let spec = serde_json::to_value(entry.spec_as_written()).unwrap_or(Value::Null);
    let params = entry
        .params
        .iter()
        // A spec store's spec is `spec` itself.
        .filter(|(k, _)| !(entry.plugin.source == "spec" && k == "spec"))
        .map(|(k, v)| {
            let value = serde_json::from_str(v).unwrap_or_else(|_| Value::String(v.clone()));
            (k.clone(), value)
        })
        .collect();
    StoreInfo {
        name: entry.name,
        state: format!("{:?}", entry.state).to_lowercase(),
        uri: entry.uri,
        plugin: PluginInfo {
            name: entry.plugin.name,
            version: entry.plugin.version,
            sha256: entry.plugin.sha256,
            source: entry.plugin.source,
        },
        spec,
        created_at: entry.created_at,
        params,
        storage_option_keys: entry.storage_option_keys,
        adopted: entry.adopted,
        probe_warnings: Vec::new(),
    }
}

/// The schema source of a create or adopt: at most one of a built-in
/// plugin, a component (base64, decoded off the async workers: megabytes),
/// a spec; `None` when none is given.
async fn schema_source(
    name: &str,
    plugin: Option<String>,
    plugin_wasm_base64: Option<String>,
    spec: Option<Value>,
) -> Result<Option<SchemaSource>, ApiError> {
    Ok(match (plugin, plugin_wasm_base64, spec) {
        (None, None, None) => None,
        (Some(p), None, None) => Some(SchemaSource::Builtin(p)),
        (None, Some(b64), None) => Some(SchemaSource::Plugin {
            label: format!("{name}.wasm"),
            bytes: decoded(b64).await?,
        }),
        (None, None, Some(spec)) => Some(SchemaSource::Spec(
            SchemaSpec::from_json(&spec.to_string()).map_err(ApiError::from)?,
        )),
        _ => {
            return Err(ApiError::invalid(
                "give exactly one of plugin, plugin_wasm_base64, spec",
            ));
        }
    })
}

/// A component's bytes from base64, decoded off the async workers
/// (megabytes).
async fn decoded(b64: String) -> Result<Vec<u8>, ApiError> {
    tokio::task::spawn_blocking(move || {
        base64::engine::general_purpose::STANDARD
            .decode(b64.as_bytes())
            .map_err(|e| ApiError::invalid(format!("plugin_wasm_base64: not base64: {e}")))
    })
    .await
    .map_err(|e| ApiError::of_kind(ErrorKind::Internal, format!("decoding the plugin: {e}")))?
}
