//! The registry's operations: create, adopt, list, describe, drop.

use base64::Engine as _;
use lance_context_client::{AdoptStore, Adopted, CreateStore, Dropped, PluginInfo, StoreInfo};
use serde_json::Value;

use super::{ApiError, Embedded};
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
        let mut options = CreateOptions::new(source);
        options.params = params(create.params);
        options.uri = create.uri;
        options.storage_options = self.config.storage_options.clone();
        // The registry serialises creates of one name; other stores'
        // operations go on meanwhile.
        let entry = self.create_open(&create.name, options).await?;
        Ok(info(entry))
    }

    pub(super) async fn adopt_dataset(
        &self,
        name: &str,
        adopt: AdoptStore,
    ) -> Result<Adopted, ApiError> {
        self.check_uri(&adopt.uri)?;
        let source =
            schema_source(name, adopt.plugin, adopt.plugin_wasm_base64, adopt.spec).await?;
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
            .dropping(name, async {
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
            bytes: tokio::task::spawn_blocking(move || {
                base64::engine::general_purpose::STANDARD
                    .decode(b64.as_bytes())
                    .map_err(|e| ApiError::invalid(format!("plugin_wasm_base64: not base64: {e}")))
            })
            .await
            .map_err(|e| {
                ApiError::of_kind(ErrorKind::Internal, format!("decoding the plugin: {e}"))
            })??,
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
