//! Full-text (BM25) search over a declared text column, composed over the
//! base table's inverted index and an exact scoring of the unmerged tier.
//!
//! # Scores
//!
//! Every row returned is scored with one BM25 (Lance's: k1 = 1.2, b = 0.75)
//! against one set of corpus statistics: the base table's index (documents,
//! tokens, and for each query term the documents holding it) plus every
//! unmerged row's. The fresh tier is scored exactly, by tokenizing its rows
//! with the column's analyzer; the base table's candidates come from Lance's
//! index and are scored again the same way, so a score from either tier is
//! the same number for the same text. Without unmerged rows the scores are
//! the index's own.

use std::collections::HashSet;
use std::sync::Arc;

use arrow_array::{Array, LargeStringArray, RecordBatch, StringArray};
use arrow_select::concat::concat_batches;
use datafusion::logical_expr::Expr;
use futures::TryStreamExt;
use lance::dataset::mem_wal::{LsmScanner, ShardSnapshot, arrow_schema_with_field_ids};
use lance::deps::datafusion;
use lance::index::DatasetIndexExt;
use lance::index::DatasetIndexInternalExt;
use lance_index::metrics::NoOpMetricsCollector;
use lance_index::scalar::FullTextSearchQuery;
use lance_index::scalar::inverted::query::{FtsQuery, MatchQuery, Operator};
use lance_index::scalar::inverted::tokenizer::document_tokenizer::LanceTokenizer;
use lance_index::scalar::inverted::{InvertedIndex, MemBM25Scorer, Scorer};
use lance_tokenizer::TokenStream;

use super::{ReadView, combined_filter};
use crate::config::TextColumn;
use crate::conform::Schemas;
use crate::error::{Error, LanceResultExt, Result};

/// The score column of a text search (higher is better).
pub const SCORE_COLUMN: &str = "_score";

/// How the terms of a text query combine.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum TextOperator {
    /// A row matches when it holds any term (ranked by BM25).
    #[default]
    Or,
    /// A row matches only when it holds every term.
    And,
}

/// A full-text query over a declared text column.
#[derive(Debug, Clone, PartialEq)]
pub struct TextQuery {
    /// The text column.
    pub column: String,
    /// The query text, analysed like the column's values.
    pub query: String,
    /// How many rows to return.
    pub k: usize,
    /// SQL predicate applied before ranking.
    pub filter: Option<String>,
    /// How the query's terms combine.
    pub operator: TextOperator,
}

impl TextQuery {
    /// The `k` best rows for `query` in `column`, any term matching.
    pub fn new(column: impl Into<String>, query: impl Into<String>, k: usize) -> Self {
        Self {
            column: column.into(),
            query: query.into(),
            k,
            filter: None,
            operator: TextOperator::Or,
        }
    }
}

/// The longest query text accepted (bytes).
pub const MAX_TEXT_QUERY: usize = 16 << 10;

/// One document's share of the statistics: its length and the counts of the
/// query's terms in it.
struct Doc {
    length: u32,
    counts: Vec<u32>,
}

/// The column's analyzer and the query's distinct terms.
pub(crate) struct Analyzer {
    tokenizer: Box<dyn LanceTokenizer>,
    terms: Vec<String>,
}

impl Analyzer {
    pub(crate) fn new(declared: &TextColumn, query: &str) -> Result<Self> {
        let mut tokenizer = crate::engine::text_index_params(declared)?
            .build()
            .map_err(|e| {
                Error::invalid_argument(format!("text column '{}': {e}", declared.column))
            })?;
        let mut terms = Vec::new();
        let mut seen = HashSet::new();
        let mut stream = tokenizer.token_stream_for_search(query);
        while stream.advance() {
            let text = stream.token().text.clone();
            if seen.insert(text.clone()) {
                terms.push(text);
            }
        }
        drop(stream);
        Ok(Self { tokenizer, terms })
    }

    /// The analysed text of every row of `column` in `batch` (a null is
    /// an empty text).
    fn docs(&mut self, batch: &RecordBatch, column: &str) -> Result<Vec<Doc>> {
        Ok(texts(batch, column)?
            .into_iter()
            .map(|text| self.doc(text.as_deref().unwrap_or("")))
            .collect())
    }

    fn doc(&mut self, text: &str) -> Doc {
        let mut counts = vec![0u32; self.terms.len()];
        let mut length = 0u32;
        let mut stream = self.tokenizer.token_stream_for_doc(text);
        while stream.advance() {
            length = length.saturating_add(1);
            let token = &stream.token().text;
            if let Some(i) = self.terms.iter().position(|t| t == token) {
                counts[i] = counts[i].saturating_add(1);
            }
        }
        Doc { length, counts }
    }
}

/// Corpus statistics: documents, tokens, and documents per query term.
#[derive(Debug, Clone, Default)]
struct Stats {
    docs: usize,
    tokens: u64,
    term_docs: Vec<usize>,
}

impl Stats {
    fn add(&mut self, doc: &Doc) {
        self.docs += 1;
        self.tokens += u64::from(doc.length);
        for (n, count) in self.term_docs.iter_mut().zip(&doc.counts) {
            if *count > 0 {
                *n += 1;
            }
        }
    }

    fn scorer(&self, terms: &[String]) -> MemBM25Scorer {
        MemBM25Scorer::new(
            self.tokens,
            self.docs.max(1),
            terms
                .iter()
                .cloned()
                .zip(self.term_docs.iter().copied())
                .collect(),
        )
    }
}

/// BM25 of one document; `None` when it does not match.
fn score(
    doc: &Doc,
    terms: &[String],
    scorer: &MemBM25Scorer,
    operator: TextOperator,
) -> Option<f32> {
    let mut total = 0.0f32;
    let mut matched = 0usize;
    for (term, &count) in terms.iter().zip(&doc.counts) {
        if count == 0 {
            continue;
        }
        matched += 1;
        total += scorer.query_weight(term) * scorer.doc_weight(count, doc.length);
    }
    let wanted = match operator {
        TextOperator::Or => matched > 0,
        TextOperator::And => matched == terms.len(),
    };
    wanted.then_some(total)
}

fn texts(batch: &RecordBatch, column: &str) -> Result<Vec<Option<String>>> {
    let array = batch
        .column_by_name(column)
        .ok_or_else(|| Error::internal(format!("text search lost column '{column}'")))?;
    if let Some(a) = array.as_any().downcast_ref::<StringArray>() {
        return Ok(a.iter().map(|v| v.map(str::to_string)).collect());
    }
    if let Some(a) = array.as_any().downcast_ref::<LargeStringArray>() {
        return Ok(a.iter().map(|v| v.map(str::to_string)).collect());
    }
    Err(Error::invalid_argument(format!(
        "'{column}' is not a Utf8 or LargeUtf8 column"
    )))
}

fn keys(batch: &RecordBatch, key: &str) -> Result<Vec<String>> {
    let keys = batch
        .column_by_name(key)
        .and_then(|c| c.as_any().downcast_ref::<StringArray>())
        .ok_or_else(|| Error::internal("text search lost the key column"))?;
    Ok((0..keys.len()).map(|i| keys.value(i).to_string()).collect())
}

/// The base table's statistics for `terms` from its full-text index (every
/// segment), or `None` when the column has no index yet.
async fn base_stats(
    dataset: &lance::Dataset,
    declared: &TextColumn,
    terms: &[String],
) -> Result<Option<Stats>> {
    let name = crate::engine::text_index_name(&declared.column);
    let segments = dataset
        .load_indices_by_name(&name)
        .await
        .ctx("listing indexes")?;
    if segments.is_empty() {
        return Ok(None);
    }
    let mut stats = Stats {
        term_docs: vec![0; terms.len()],
        ..Stats::default()
    };
    for segment in segments {
        let index = dataset
            .open_scalar_index(&declared.column, &segment.uuid, &NoOpMetricsCollector)
            .await
            .ctx("opening the full-text index")?;
        let inverted = index
            .as_any()
            .downcast_ref::<InvertedIndex>()
            .ok_or_else(|| Error::internal(format!("index {name} is not an inverted index")))?;
        let (tokens, docs, term_docs) = inverted
            .bm25_stats_for_terms(terms, None)
            .await
            .ctx("reading the full-text index's statistics")?;
        stats.tokens += tokens;
        stats.docs += docs;
        for (total, n) in stats.term_docs.iter_mut().zip(term_docs) {
            *total += n;
        }
    }
    Ok(Some(stats))
}

/// The unmerged rows `scanner` reads: `columns`, those `filter` keeps.
async fn fresh_batches<S: AsRef<str>>(
    scanner: LsmScanner,
    columns: &[S],
    filter: Option<&Expr>,
) -> Result<Vec<RecordBatch>> {
    let columns: Vec<&str> = columns.iter().map(AsRef::as_ref).collect();
    let mut scanner = scanner
        .project(&columns)
        .map_err(|e| Error::from_lance("projecting", None, e))?;
    if let Some(expr) = filter {
        scanner = scanner.filter_expr(expr.clone());
    }
    scanner
        .try_into_stream()
        .await
        .ctx("reading generations")?
        .try_collect()
        .await
        .map_err(|e| Error::from_datafusion("reading generations", e))
}

/// The rows best matching `query.query` in a declared text column, by BM25,
/// with a `_score` column, best first (ties by key). See the module docs for
/// how the two tiers' scores are made one.
pub(crate) async fn search_text(
    view: &ReadView,
    schemas: &Schemas,
    declared: &TextColumn,
    query: &TextQuery,
    store_params: &lance::io::ObjectStoreParams,
    hide: Option<&Expr>,
) -> Result<RecordBatch> {
    let out_schema = schemas
        .conform_for_read(&RecordBatch::new_empty(schemas.stored.clone()), None)?
        .schema();
    let mut analyzer = Analyzer::new(declared, &query.query)?;
    if query.k == 0 || analyzer.terms.is_empty() {
        return with_score(RecordBatch::new_empty(out_schema), Vec::new());
    }
    let terms = analyzer.terms.clone();
    let filter = combined_filter(schemas, query.filter.as_deref(), hide)?;
    let columns = schemas.readable_columns();
    if !columns.contains(&declared.column) {
        return Err(Error::invalid_argument(format!(
            "'{}' is not readable in this store",
            declared.column
        )));
    }

    let fresh_snapshots: Vec<ShardSnapshot> = view
        .shards
        .iter()
        .filter(|s| s.unmerged > 0)
        .map(|s| s.snapshot.clone())
        .collect();
    let search = TextSearch {
        view,
        schemas,
        declared,
        query,
        store_params,
        filter,
        columns,
        fresh_snapshots,
    };

    // Statistics: the base index's, plus every unmerged row's (filtered or
    // not: the corpus is the store).
    let mut stats = base_stats(&view.dataset, declared, &terms)
        .await?
        .unwrap_or_else(|| Stats {
            term_docs: vec![0; terms.len()],
            ..Stats::default()
        });
    let fresh_rows = search.fresh_rows(&mut analyzer, &mut stats).await?;
    let scorer = stats.scorer(&terms);
    let mut ranked: Vec<(f32, String, RecordBatch)> = fresh_rows
        .into_iter()
        .filter_map(|(doc, key, row)| {
            score(&doc, &terms, &scorer, query.operator).map(|s| (s, key, row))
        })
        .collect();
    ranked.extend(search.base_ranked(&mut analyzer, &terms, &scorer).await?);
    ranked.sort_by(|a, b| b.0.total_cmp(&a.0).then_with(|| a.1.cmp(&b.1)));
    ranked.truncate(query.k);
    let scores: Vec<f32> = ranked.iter().map(|r| r.0).collect();
    let rows: Vec<RecordBatch> = ranked.into_iter().map(|r| r.2).collect();
    with_score(concat_batches(&out_schema, &rows)?, scores)
}

/// One text search's inputs, shared by its reads of the two tiers.
struct TextSearch<'a> {
    view: &'a ReadView,
    schemas: &'a Schemas,
    declared: &'a TextColumn,
    query: &'a TextQuery,
    store_params: &'a lance::io::ObjectStoreParams,
    /// The caller's filter and the visibility rule.
    filter: Option<Expr>,
    /// The readable columns.
    columns: Vec<String>,
    /// The shards with unmerged rows.
    fresh_snapshots: Vec<ShardSnapshot>,
}

impl TextSearch<'_> {
    /// A scanner of the unmerged tier alone.
    fn fresh_scanner(&self) -> LsmScanner {
        let (view, schemas) = (self.view, self.schemas);
        LsmScanner::without_base_table(
            schemas.stored.clone(),
            view.dataset.uri().to_string(),
            self.fresh_snapshots.clone(),
            vec![schemas.key.clone()],
        )
        .with_identity_schema(Arc::new(arrow_schema_with_field_ids(view.dataset.schema())))
        .with_store_params(self.store_params.clone())
        .with_session(view.dataset.session())
        .with_sstable_cache(view.generations.clone())
    }

    /// The unmerged rows that match (the filter's), each with its analysed
    /// text and key; every unmerged row is added to `stats`.
    async fn fresh_rows(
        &self,
        analyzer: &mut Analyzer,
        stats: &mut Stats,
    ) -> Result<Vec<(Doc, String, RecordBatch)>> {
        let (schemas, declared, filter, columns) =
            (self.schemas, self.declared, &self.filter, &self.columns);
        let mut fresh_rows: Vec<(Doc, String, RecordBatch)> = Vec::new();
        if !self.fresh_snapshots.is_empty() {
            // Every unmerged row counts in the statistics; without a filter the
            // same read yields the candidates, with one a second, filtered read
            // does.
            let keep = |fresh_rows: &mut Vec<(Doc, String, RecordBatch)>,
                        batch: &RecordBatch,
                        docs: Vec<Doc>|
             -> Result<()> {
                let batch = schemas.conform_for_read(batch, None)?;
                let keys = keys(&batch, &schemas.key)?;
                for (row, doc) in docs.into_iter().enumerate() {
                    if doc.counts.iter().any(|c| *c > 0) {
                        fresh_rows.push((doc, keys[row].clone(), batch.slice(row, 1)));
                    }
                }
                Ok(())
            };
            let stats_columns: Vec<String> = if filter.is_none() {
                columns.clone()
            } else {
                vec![schemas.key.clone(), declared.column.clone()]
            };
            for batch in fresh_batches(self.fresh_scanner(), &stats_columns, None).await? {
                let docs = analyzer.docs(&batch, &declared.column)?;
                for doc in &docs {
                    stats.add(doc);
                }
                if filter.is_none() {
                    keep(&mut fresh_rows, &batch, docs)?;
                }
            }
            if let Some(expr) = filter {
                for batch in fresh_batches(self.fresh_scanner(), columns, Some(expr)).await? {
                    let docs = analyzer.docs(&batch, &declared.column)?;
                    keep(&mut fresh_rows, &batch, docs)?;
                }
            }
        }
        Ok(fresh_rows)
    }

    /// The base table's matching rows with their scores.
    async fn base_ranked(
        &self,
        analyzer: &mut Analyzer,
        terms: &[String],
        scorer: &MemBM25Scorer,
    ) -> Result<Vec<(f32, String, RecordBatch)>> {
        let (view, schemas, declared, query) = (self.view, self.schemas, self.declared, self.query);
        // Base table candidates, through its index, without rows the fresh tier
        // shadows, scored again against the whole store's statistics.
        let base_rows = view.dataset.count_rows(None).await.ctx("counting rows")?;
        let mut fetch = (query.k * 2).max(query.k + 10);
        if base_rows > 0 {
            loop {
                let (found, returned) = self.base_candidates(fetch).await?;
                let conformed = schemas.conform_for_read(&found, None)?;
                let found_keys = keys(&conformed, &schemas.key)?;
                let mut base_ranked = Vec::new();
                for (row, text) in texts(&conformed, &declared.column)?.into_iter().enumerate() {
                    let doc = analyzer.doc(text.as_deref().unwrap_or(""));
                    if let Some(s) = score(&doc, terms, scorer, query.operator) {
                        base_ranked.push((s, found_keys[row].clone(), conformed.slice(row, 1)));
                    }
                }
                let live = base_ranked.len();
                if live >= query.k || returned < fetch || fetch as u64 >= base_rows as u64 {
                    return Ok(base_ranked);
                }
                fetch = (fetch * 2).min(base_rows);
            }
        }
        Ok(Vec::new())
    }

    /// Up to `fetch` of the base table's best candidates by its index, less
    /// those the fresh tier shadows, and how many the index returned.
    async fn base_candidates(&self, fetch: usize) -> Result<(RecordBatch, usize)> {
        let (view, schemas, declared, query) = (self.view, self.schemas, self.declared, self.query);
        let mut scan = view.dataset.scan();
        scan.project(&self.columns).ctx("projecting")?;
        if let Some(expr) = &self.filter {
            scan.filter_expr(expr.clone());
            scan.prefilter(true);
        }
        let operator = match query.operator {
            TextOperator::Or => Operator::Or,
            TextOperator::And => Operator::And,
        };
        let fts = FullTextSearchQuery::new_query(FtsQuery::Match(
            MatchQuery::new(query.query.clone())
                .with_column(Some(declared.column.clone()))
                .with_operator(operator),
        ))
        .limit(Some(fetch as i64));
        scan.full_text_search(fts)
            .map_err(|e| Error::invalid_argument(format!("text search: {e}")))?;
        scan.limit(Some(fetch as i64), None).ctx("limiting")?;
        let found = scan
            .try_into_batch()
            .await
            .ctx("searching the base table")?;
        let returned = found.num_rows();
        let found = if self.fresh_snapshots.is_empty() || returned == 0 {
            found
        } else {
            let keys = found.project(&[found.schema().index_of(&schemas.key)?])?;
            let shadowed = self
                .fresh_scanner()
                .contains_pks(&keys)
                .await
                .ctx("checking keys rewritten since the base")?;
            let keep =
                arrow_array::BooleanArray::from(shadowed.iter().map(|s| !s).collect::<Vec<bool>>());
            arrow_select::filter::filter_record_batch(&found, &keep)?
        };
        Ok((found, returned))
    }
}

fn with_score(batch: RecordBatch, scores: Vec<f32>) -> Result<RecordBatch> {
    super::nearest::with_column(batch, SCORE_COLUMN, scores)
}

/// Exact BM25 of every row of `batch` for `query` against the statistics of
/// `batch` alone, for checking the engine's scores (benchmarks, tests): the
/// scores by row, `None` where the row does not match.
pub fn exact_bm25(
    declared: &TextColumn,
    query: &str,
    operator: TextOperator,
    batch: &RecordBatch,
) -> Result<Vec<Option<f32>>> {
    let mut analyzer = Analyzer::new(declared, query)?;
    let terms = analyzer.terms.clone();
    let docs: Vec<Doc> = texts(batch, &declared.column)?
        .into_iter()
        .map(|t| analyzer.doc(t.as_deref().unwrap_or("")))
        .collect();
    let mut stats = Stats {
        term_docs: vec![0; terms.len()],
        ..Stats::default()
    };
    docs.iter().for_each(|d| stats.add(d));
    let scorer = stats.scorer(&terms);
    Ok(docs
        .iter()
        .map(|d| score(d, &terms, &scorer, operator))
        .collect())
}
