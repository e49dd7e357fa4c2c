//! Named queries, search and hybrid retrieval.

use lance_context_client::{QueryRequest, QueryResult, RetrieveRequest, Rows, SearchRequest};

use super::json::rows;
use super::records::{blame_filter, checked_filter};
use super::{Access, ApiError, Embedded};

impl Embedded {
    pub(super) async fn run_query(
        &self,
        name: &str,
        query: &str,
        request: QueryRequest,
    ) -> Result<QueryResult, ApiError> {
        let query = query.to_string();
        let args: Vec<(String, String)> = request.args.into_iter().collect();
        self.on_store(name, Access::read(request.as_of), move |store| async move {
            let reduces = store
                .named
                .spec()
                .queries
                .iter()
                .any(|q| q.name == query && q.reduce);
            if reduces {
                // Valid JSON by construction (the host parsed the plugin's output).
                let result = store.named.reduce(&query, &args).await?;
                return Ok(QueryResult::Reduced { result });
            }
            let batch = store.named.query(&query, &args).await?;
            Ok(QueryResult::Records {
                records: rows(&batch)?,
            })
        })
        .await
    }

    pub(super) async fn search_column(
        &self,
        name: &str,
        mut request: SearchRequest,
    ) -> Result<Rows, ApiError> {
        request.filter = checked_filter(request.filter, self.config.trusted_filters)?;
        if let Some(message) = request.non_finite() {
            return Err(ApiError::invalid(message));
        }
        self.on_store(name, Access::Read, move |store| async move {
            let had_filter = request.filter.is_some() || !request.conditions.is_empty();
            match crate::search::search(&store.named, request).await {
                Ok(batch) => rows(&batch),
                Err(e) => Err(blame_filter(&store, had_filter, e).await),
            }
        })
        .await
    }

    pub(super) async fn retrieve_hybrid(
        &self,
        name: &str,
        mut request: RetrieveRequest,
    ) -> Result<Rows, ApiError> {
        request.filter = checked_filter(request.filter, self.config.trusted_filters)?;
        if let Some(message) = request.non_finite() {
            return Err(ApiError::invalid(message));
        }
        self.on_store(name, Access::Read, move |store| async move {
            let had_filter = request.filter.is_some() || !request.conditions.is_empty();
            match crate::search::retrieve(&store.named, request).await {
                Ok(batch) => rows(&batch),
                Err(e) => Err(blame_filter(&store, had_filter, e).await),
            }
        })
        .await
    }
}
