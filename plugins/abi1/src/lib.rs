//! A component built against the frozen `lance-context:plugin@0.1.0`
//! contract (`wit/released/0.1.0`): it reports ABI version 1 and exports no
//! `describe-text`, exactly as every component built before 0.2.0. The host's
//! tests load it to keep such components loading unchanged. Its schema:
//! `id`, `text`, `embedding` (2 dims, L2); it accepts every batch.

wit_bindgen::generate!({
    world: "schema-plugin",
    path: "../../wit/released/0.1.0",
});

use lance_context::plugin::types::{Capabilities, Metric, VectorColumn};
use lance_context_plugin::{DataType, Field, Schema, ipc, key_field};
use std::sync::Arc;

struct Abi1;

impl Guest for Abi1 {
    /// `abi=N` reports ABI version N (tests of a component that claims a
    /// version it does not implement).
    fn describe(params: Vec<(String, String)>) -> Result<SchemaDecl, DescribeError> {
        let abi_version = params
            .iter()
            .find(|(k, _)| k == "abi")
            .and_then(|(_, v)| v.parse().ok())
            .unwrap_or(1);
        let item = Arc::new(Field::new("item", DataType::Float32, true));
        let schema = Schema::new(vec![
            key_field("id"),
            Field::new("text", DataType::Utf8, true),
            Field::new("embedding", DataType::FixedSizeList(item, 2), true),
        ]);
        let arrow_schema =
            ipc::encode_schema(&schema).map_err(|e| DescribeError::InvalidParams(e.to_string()))?;
        Ok(SchemaDecl {
            name: "abi1".into(),
            version: "0.1.0".into(),
            abi_version,
            arrow_schema,
            key_column: "id".into(),
            blob_columns: Vec::new(),
            vector_columns: vec![VectorColumn {
                name: "embedding".into(),
                dimension: 2,
                metric: Metric::L2,
            }],
            secondary_key: None,
            capabilities: Capabilities::empty(),
            has_transform: false,
            queries: Vec::new(),
        })
    }

    fn validate(_batch: Vec<u8>, _context: CallContext) -> Result<(), BatchError> {
        Ok(())
    }

    fn transform(_batch: Vec<u8>, _context: CallContext) -> Result<Vec<u8>, BatchError> {
        Err(BatchError::MalformedInput("no transform".into()))
    }

    fn reduce(_q: String, _b: Vec<u8>, _c: CallContext) -> Result<String, BatchError> {
        Err(BatchError::MalformedInput("no reduce".into()))
    }
}

export!(Abi1);
