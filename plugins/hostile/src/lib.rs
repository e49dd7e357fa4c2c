//! A hostile plugin for the host's sandbox tests: what it does is chosen by the
//! `mode` column of a batch's first row (or, for `describe`, by parameters):
//! `loop` spins forever, `bomb` allocates without bound, `panic` panics,
//! `garbage` returns bytes that are not Arrow IPC, `lying` returns a batch that
//! does not match its declared schema; the parameter `abi` sets the ABI version
//! it claims, the parameter `broken` makes it declare a schema breaking several
//! rules at once. Anything else behaves.

#[cfg(target_arch = "wasm32")]
mod component {
    use std::sync::Arc;

    use lance_context_plugin::arrow_array::cast::AsArray;
    use lance_context_plugin::arrow_array::{Int64Array, RecordBatch};
    use lance_context_plugin::bindings::lance_context::plugin::types::{
        Capabilities, Metric, VectorColumn,
    };
    use lance_context_plugin::bindings::{
        BatchError, CallContext, DescribeError, Guest, SchemaDecl,
    };
    use lance_context_plugin::{DataType, Field, Schema, ipc, key_field};

    fn schema() -> Schema {
        Schema::new(vec![
            key_field("id"),
            Field::new("mode", DataType::Utf8, true),
        ])
    }

    fn mode(batch: Vec<u8>) -> Result<(String, Vec<RecordBatch>), BatchError> {
        let batches = ipc::decode(batch).map_err(BatchError::MalformedInput)?;
        let mode = batches
            .first()
            .and_then(|b| b.column_by_name("mode"))
            .map(|c| c.as_string::<i32>().value(0).to_string())
            .unwrap_or_default();
        Ok((mode, batches))
    }

    fn misbehave(mode: &str) {
        match mode {
            "loop" => {
                let mut n: u64 = 0;
                loop {
                    n = std::hint::black_box(n.wrapping_add(1));
                }
            }
            "bomb" => {
                let mut hoard: Vec<Vec<u8>> = Vec::new();
                loop {
                    hoard.push(std::hint::black_box(vec![1u8; 1 << 20]));
                }
            }
            "panic" => panic!("hostile plugin panicked on purpose"),
            _ => {}
        }
    }

    struct Hostile;

    impl Guest for Hostile {
        fn describe(params: Vec<(String, String)>) -> Result<SchemaDecl, DescribeError> {
            let abi = params
                .iter()
                .find(|(k, _)| k == "abi")
                .and_then(|(_, v)| v.parse().ok())
                .unwrap_or(lance_context_plugin::ABI_VERSION);
            if params.iter().any(|(k, _)| k == "broken") {
                // A declaration breaking several rules at once: a nullable
                // Int64 key, a reserved column name, a blob column that is
                // not binary, a zero-width vector, a secondary key that does
                // not exist, and lifecycle without its columns.
                let item = Arc::new(Field::new("item", DataType::Float32, true));
                let broken = Schema::new(vec![
                    Field::new("id", DataType::Int64, true),
                    Field::new("_rowid", DataType::Utf8, true),
                    Field::new("vec", DataType::FixedSizeList(item, 2), true),
                ]);
                return Ok(SchemaDecl {
                    name: "hostile".into(),
                    version: "0.0.0".into(),
                    abi_version: abi,
                    arrow_schema: ipc::encode_schema(&broken)
                        .map_err(DescribeError::InvalidParams)?,
                    key_column: "id".into(),
                    blob_columns: vec!["_rowid".into()],
                    vector_columns: vec![VectorColumn {
                        name: "vec".into(),
                        dimension: 0,
                        metric: Metric::Dot,
                    }],
                    secondary_key: Some("external_id".into()),
                    capabilities: Capabilities::LIFECYCLE,
                    has_transform: false,
                    queries: vec![],
                });
            }
            Ok(SchemaDecl {
                name: "hostile".into(),
                version: "0.0.0".into(),
                abi_version: abi,
                arrow_schema: ipc::encode_schema(&schema())
                    .map_err(DescribeError::InvalidParams)?,
                key_column: "id".into(),
                blob_columns: vec![],
                vector_columns: vec![],
                secondary_key: None,
                capabilities: Capabilities::empty(),
                has_transform: true,
                queries: vec![],
            })
        }

        fn validate(batch: Vec<u8>, _context: CallContext) -> Result<(), BatchError> {
            let (mode, _) = mode(batch)?;
            misbehave(&mode);
            Ok(())
        }

        fn reduce(
            _query: String,
            batch: Vec<u8>,
            _context: CallContext,
        ) -> Result<String, BatchError> {
            let (mode, _) = mode(batch)?;
            misbehave(&mode);
            Ok("{}".into())
        }

        fn transform(batch: Vec<u8>, _context: CallContext) -> Result<Vec<u8>, BatchError> {
            let (mode, batches) = mode(batch)?;
            misbehave(&mode);
            match mode.as_str() {
                "garbage" => Ok(vec![
                    0xde, 0xad, 0xbe, 0xef, 0xff, 0xff, 0xff, 0x7f, 1, 2, 3,
                ]),
                "lying" => {
                    // Declared `mode: Utf8`; returns `mode: Int64`.
                    let b = &batches[0];
                    let lie = RecordBatch::try_new(
                        Arc::new(Schema::new(vec![
                            key_field("id"),
                            Field::new("mode", DataType::Int64, true),
                        ])),
                        vec![
                            b.column(0).clone(),
                            Arc::new(Int64Array::from(vec![1; b.num_rows()])),
                        ],
                    )
                    .map_err(|e| BatchError::MalformedInput(e.to_string()))?;
                    ipc::encode(&[lie]).map_err(BatchError::MalformedInput)
                }
                _ => ipc::encode(&batches).map_err(BatchError::MalformedInput),
            }
        }
    }

    lance_context_plugin::bindings::__export_schema_plugin!(
        Hostile with_types_in lance_context_plugin::bindings
    );
}
