//! Maintenance and state: merge, compact, index, stats, versions.

use std::time::Instant;

use lance_context_client::{
    CompactionReport, IndexBuilt, Indexed, MergeReport, StoreStatus, TableVersion,
};

use super::{Access, ApiError, Embedded};

impl Embedded {
    pub(super) async fn merge_now(&self, name: &str) -> Result<MergeReport, ApiError> {
        self.on_store(name, Access::Write, |store| async move {
            let t = Instant::now();
            let s = store.named.merge().await?;
            Ok(crate::merge_report(&s, t.elapsed().as_secs_f64()))
        })
        .await
    }

    pub(super) async fn compact_now(&self, name: &str) -> Result<CompactionReport, ApiError> {
        self.on_store(name, Access::Read, |store| async move {
            let t = Instant::now();
            let s = store.named.compact().await?;
            Ok(crate::compaction_report(&s, t.elapsed().as_secs_f64()))
        })
        .await
    }

    pub(super) async fn build_indexes(
        &self,
        name: &str,
        column: Option<String>,
    ) -> Result<Indexed, ApiError> {
        self.on_store(name, Access::Read, move |store| async move {
            let columns: Vec<String> = match column {
                Some(c) => vec![c],
                None => store
                    .named
                    .spec()
                    .vectors
                    .iter()
                    .map(|v| v.column.clone())
                    .collect(),
            };
            if columns.is_empty() {
                return Err(ApiError::invalid(format!(
                    "store '{}' declares no vector column to index",
                    store.named.name()
                )));
            }
            let mut indexes = Vec::with_capacity(columns.len());
            for column in &columns {
                let t = Instant::now();
                store.named.build_vector_index(column).await?;
                let seconds = t.elapsed().as_secs_f64();
                // An index trained on too few rows (a product quantizer
                // needs 256) covers none of them: said, not reported built.
                let stats = store.named.stats().await?;
                let index = stats.index(&format!("{column}_idx"));
                indexes.push(IndexBuilt {
                    column: column.clone(),
                    seconds,
                    covers_all_rows: index.is_some_and(|i| i.covers_all_rows),
                    unindexed_fragments: index
                        .map_or(stats.fragments as u64, |i| i.unindexed_fragments as u64),
                    fragments: stats.fragments as u64,
                    rows_in_base: stats.rows_in_base,
                });
            }
            Ok(Indexed {
                indexed: columns,
                indexes,
            })
        })
        .await
    }

    pub(super) async fn table_versions(&self, name: &str) -> Result<Vec<TableVersion>, ApiError> {
        self.on_store(name, Access::Read, |store| async move {
            Ok(store
                .named
                .versions()
                .await?
                .into_iter()
                .map(|v| TableVersion {
                    version: v.version,
                    timestamp: chrono::DateTime::from_timestamp_micros(v.timestamp_micros)
                        .map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Micros, true)),
                    current: v.current,
                })
                .collect())
        })
        .await
    }

    pub(super) async fn status(&self, name: &str) -> Result<StoreStatus, ApiError> {
        self.on_store(name, Access::Read, |store| async move {
            let s = store.named.stats().await?;
            let rows = store.named.count(None).await?;
            Ok(crate::store_status(&s, rows))
        })
        .await
    }
}
