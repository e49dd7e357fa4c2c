//! Hybrid retrieval: a vector leg and a text leg fused by reciprocal rank
//! fusion (RRF).
//!
//! Each leg ranks its own candidates (its own limit); a row's fused score is
//! `Σ 1 / (rrf_k + rank)` over the legs that found it, ranks counted from 1.
//! Rows are ordered by that score, best first, ties by key. Each hit carries
//! its rank and score in every leg (null where the leg did not find it).

use std::collections::HashMap;
use std::sync::Arc;

use arrow_array::{Array, Float32Array, RecordBatch, StringArray, UInt32Array};
use arrow_schema::{DataType, Field, Schema};
use arrow_select::concat::concat_batches;

use super::{TextQuery, VectorQuery};
use crate::error::{Error, Result};

/// The default RRF constant (as in the RRF paper, Elasticsearch, Letta, Zep).
pub const DEFAULT_RRF_K: f32 = 60.0;

/// Columns a hybrid hit carries besides the row's own.
pub const RRF_SCORE_COLUMN: &str = "_rrf_score";
/// The row's rank in the vector leg (from 1; null when not found there).
pub const VECTOR_RANK_COLUMN: &str = "_vector_rank";
/// The row's rank in the text leg (from 1; null when not found there).
pub const TEXT_RANK_COLUMN: &str = "_text_rank";

/// Vector and text retrieval fused by reciprocal rank fusion.
#[derive(Debug, Clone, PartialEq)]
pub struct RetrieveQuery {
    /// The vector leg (its `k` is the leg's limit).
    pub vector: Option<VectorQuery>,
    /// The text leg (its `k` is the leg's limit).
    pub text: Option<TextQuery>,
    /// SQL predicate applied in every leg (with the leg's own, if any).
    pub filter: Option<String>,
    /// How many fused hits to return.
    pub k: usize,
    /// The RRF constant: larger flattens the weight of the top ranks.
    pub rrf_k: f32,
}

impl RetrieveQuery {
    /// Both legs, each fetching `k * 2` candidates (at least 20), `k` hits.
    pub fn new(vector: Option<VectorQuery>, text: Option<TextQuery>, k: usize) -> Self {
        Self {
            vector,
            text,
            filter: None,
            k,
            rrf_k: DEFAULT_RRF_K,
        }
    }

    /// Refuse a query no leg answers, or a constant that is not a finite
    /// number ≥ 0.
    pub(crate) fn check(&self) -> Result<()> {
        if self.vector.is_none() && self.text.is_none() {
            return Err(Error::invalid_argument(
                "retrieve needs a vector leg, a text leg or both",
            ));
        }
        if !self.rrf_k.is_finite() || self.rrf_k < 0.0 {
            return Err(Error::invalid_argument(format!(
                "rrf_k must be a finite number ≥ 0, got {}",
                self.rrf_k
            )));
        }
        Ok(())
    }
}

/// One leg's ranked result: rows (the store's columns and one score
/// column) best first.
pub(crate) struct Leg<'a> {
    pub batch: &'a RecordBatch,
    pub score_column: &'a str,
}

/// Fuse the legs' results; `columns` are the row columns of the output
/// (every leg's batch holds them first, then its score column).
pub(crate) fn fuse(
    key: &str,
    row_schema: &Arc<Schema>,
    vector: Option<Leg<'_>>,
    text: Option<Leg<'_>>,
    rrf_k: f32,
    k: usize,
) -> Result<RecordBatch> {
    struct Hit {
        row: RecordBatch,
        rrf: f32,
        ranks: [Option<u32>; 2],
        scores: [Option<f32>; 2],
    }
    let mut hits: HashMap<String, Hit> = HashMap::new();
    for (leg_no, leg) in [vector, text].into_iter().enumerate() {
        let Some(leg) = leg else { continue };
        let keys = leg
            .batch
            .column_by_name(key)
            .and_then(|c| c.as_any().downcast_ref::<StringArray>())
            .ok_or_else(|| Error::internal("retrieve lost the key column"))?;
        let scores = leg
            .batch
            .column_by_name(leg.score_column)
            .and_then(|c| c.as_any().downcast_ref::<Float32Array>())
            .ok_or_else(|| Error::internal("retrieve lost a leg's score"))?;
        let row_columns: Vec<usize> = row_schema
            .fields()
            .iter()
            .map(|f| leg.batch.schema().index_of(f.name()))
            .collect::<std::result::Result<_, _>>()?;
        let rows = leg.batch.project(&row_columns)?;
        for i in 0..leg.batch.num_rows() {
            let rank = i as u32 + 1;
            let hit = hits
                .entry(keys.value(i).to_string())
                .or_insert_with(|| Hit {
                    row: rows.slice(i, 1),
                    rrf: 0.0,
                    ranks: [None, None],
                    scores: [None, None],
                });
            hit.rrf += 1.0 / (rrf_k + rank as f32);
            hit.ranks[leg_no] = Some(rank);
            hit.scores[leg_no] = Some(scores.value(i));
        }
    }
    let mut ranked: Vec<(String, Hit)> = hits.into_iter().collect();
    ranked.sort_by(|a, b| b.1.rrf.total_cmp(&a.1.rrf).then_with(|| a.0.cmp(&b.0)));
    ranked.truncate(k);
    let rows: Vec<RecordBatch> = ranked.iter().map(|(_, h)| h.row.clone()).collect();
    let base = concat_batches(row_schema, &rows)?;
    let mut fields: Vec<arrow_schema::FieldRef> = base.schema().fields().iter().cloned().collect();
    let mut columns = base.columns().to_vec();
    let mut push = |name: &str, ty: DataType, nullable: bool, array: Arc<dyn Array>| {
        fields.push(Arc::new(Field::new(name, ty, nullable)));
        columns.push(array);
    };
    push(
        RRF_SCORE_COLUMN,
        DataType::Float32,
        false,
        Arc::new(Float32Array::from(
            ranked.iter().map(|(_, h)| h.rrf).collect::<Vec<_>>(),
        )),
    );
    for (leg, rank_name, score_name) in [
        (0, VECTOR_RANK_COLUMN, super::nearest::DISTANCE),
        (1, TEXT_RANK_COLUMN, super::SCORE_COLUMN),
    ] {
        push(
            rank_name,
            DataType::UInt32,
            true,
            Arc::new(UInt32Array::from(
                ranked.iter().map(|(_, h)| h.ranks[leg]).collect::<Vec<_>>(),
            )),
        );
        push(
            score_name,
            DataType::Float32,
            true,
            Arc::new(Float32Array::from(
                ranked
                    .iter()
                    .map(|(_, h)| h.scores[leg])
                    .collect::<Vec<_>>(),
            )),
        );
    }
    Ok(RecordBatch::try_new(
        Arc::new(Schema::new_with_metadata(
            fields,
            base.schema().metadata().clone(),
        )),
        columns,
    )?)
}
