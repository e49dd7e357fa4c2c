//! A hostile plugin for the host's sandbox tests. Not for use.
//!
//! In `validate`, `transform` and `reduce`, the `mode` column of the first
//! row chooses the misbehaviour; in `describe`, the parameter `mode` does.
//! Every mode works in every export unless noted:
//!
//! | mode | does |
//! |---|---|
//! | `loop` | spins forever |
//! | `bomb` | allocates without bound |
//! | `panic` | panics |
//! | `recurse` | recurses without bound (stack overflow) |
//! | `sleep` | sleeps for an hour (a clock wait) |
//! | `stderr` | writes 1 MiB to stderr, a line at a time, then behaves |
//! | `debug` | writes one debug line to stderr, then behaves |
//! | `exit` | calls `std::process::exit` |
//! | `random` | asks for 1 GiB of random bytes |
//! | `hoard` | keeps 300 MiB allocated in a static, then behaves |
//! | `count` | (transform) returns `n` = how many calls this instance has seen |
//! | `garbage` | (transform) returns bytes that are not Arrow IPC |
//! | `lying` | (transform) returns `mode` as Int64 though it declares Utf8 |
//! | `echo` | (transform) returns the row's `payload` bytes verbatim |
//! | `huge` | (transform) returns `n` bytes of zeros |
//! | `alias` | (validate) returns `n` row errors whose messages all alias one 8 MiB string |
//! | `errors` | (validate) returns `n` ordinary row errors |
//! | `ansi` | (validate) returns a row error full of terminal escapes |
//! | `uuid` | (transform) returns `payload` = 16 random bytes |
//! | `undeclared` | (transform) returns a column `extra` it does not declare |
//!
//! The creation parameter `transform` (e.g. `transform="lying"`) sets the
//! transform's mode for every call, whatever the rows say.
//!
//! Describe-only parameters: `abi` sets the ABI version it claims; `broken`
//! declares a schema breaking several rules at once; `giant` declares a
//! `FixedSizeList(2147483647 x Float32)` column; `many-blobs` declares 5000
//! blob columns; `sql` declares a named query whose filter calls a SQL
//! function; `wide` adds a nullable `FixedSizeList(65536 x Float64)` column
//! (512 KiB of nulls per row when a transform leaves it out).

#[cfg(target_arch = "wasm32")]
mod component {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicI64, Ordering};

    use lance_context_plugin::arrow_array::cast::AsArray;
    use lance_context_plugin::arrow_array::types::Int64Type;
    use lance_context_plugin::arrow_array::{BinaryArray, Int64Array, RecordBatch};
    use lance_context_plugin::bindings::lance_context::plugin::types::{
        Capabilities, Metric, RowError, VectorColumn,
    };
    use lance_context_plugin::bindings::{
        BatchError, CallContext, DescribeError, Guest, SchemaDecl,
    };
    use lance_context_plugin::{DataType, Field, Schema, ipc, key_field};

    static CALLS: AtomicI64 = AtomicI64::new(0);
    static mut HOARD: Vec<Vec<u8>> = Vec::new();

    fn schema() -> Schema {
        Schema::new(vec![
            key_field("id"),
            Field::new("mode", DataType::Utf8, true),
            Field::new("payload", DataType::Binary, true),
            Field::new("n", DataType::Int64, true),
        ])
    }

    struct Input {
        mode: String,
        payload: Vec<u8>,
        n: i64,
        batches: Vec<RecordBatch>,
    }

    fn input(batch: Vec<u8>) -> Result<Input, BatchError> {
        let batches = ipc::decode(batch).map_err(|e| BatchError::MalformedInput(e.to_string()))?;
        let first = batches.first();
        let mode = first
            .and_then(|b| b.column_by_name("mode"))
            .map(|c| c.as_string::<i32>().value(0).to_string())
            .unwrap_or_default();
        let payload = first
            .and_then(|b| b.column_by_name("payload"))
            .map(|c| c.as_binary::<i32>().value(0).to_vec())
            .unwrap_or_default();
        let n = first
            .and_then(|b| b.column_by_name("n"))
            .map(|c| c.as_primitive::<Int64Type>().value(0))
            .unwrap_or_default();
        Ok(Input {
            mode,
            payload,
            n,
            batches,
        })
    }

    #[allow(unconditional_recursion)]
    fn recurse(depth: u64) -> u64 {
        std::hint::black_box(recurse(std::hint::black_box(depth + 1))) + 1
    }

    /// The misbehaviours every export shares; returns for modes that behave.
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
            "recurse" => {
                std::hint::black_box(recurse(0));
            }
            "sleep" => std::thread::sleep(std::time::Duration::from_secs(3600)),
            "stderr" => {
                let line = "x".repeat(1023);
                for _ in 0..1024 {
                    eprintln!("{line}");
                }
            }
            "debug" => eprintln!("debug: a third-party plugin's debug line"),
            "exit" => std::process::exit(3),
            "random" => {
                // One request for 1 GiB (nothing allocated here first).
                std::hint::black_box(wasip2::random::random::get_random_bytes(1 << 30));
            }
            "hoard" => {
                let kept: Vec<Vec<u8>> = (0..300).map(|_| vec![7u8; 1 << 20]).collect();
                // SAFETY: a single-threaded guest; nothing else touches HOARD.
                #[allow(static_mut_refs)]
                unsafe {
                    HOARD.extend(kept)
                };
            }
            _ => {}
        }
    }

    /// The row checks of `validate`, which `transform` applies first (as the
    /// contract says).
    fn checks(input: &Input) -> Result<(), BatchError> {
        match input.mode.as_str() {
            "alias" => {
                let big: &'static mut str = Box::leak("m".repeat(8 << 20).into_boxed_str());
                let (ptr, len) = (big.as_mut_ptr(), big.len());
                let errors = (0..input.n.max(1))
                    .map(|i| RowError {
                        row: i as u32,
                        column: None,
                        code: "alias".into(),
                        // SAFETY (of a sort): every message aliases one
                        // leaked buffer on purpose. The host must refuse
                        // to copy them all; this guest is never resumed.
                        message: unsafe { String::from_raw_parts(ptr, len, len) },
                    })
                    .collect();
                Err(BatchError::Rows(errors))
            }
            "errors" => Err(BatchError::Rows(
                (0..input.n.max(1))
                    .map(|i| RowError {
                        row: i as u32,
                        column: Some("mode".into()),
                        code: "bad".into(),
                        message: format!("row {i} is bad"),
                    })
                    .collect(),
            )),
            // A row index the batch does not have: the host must check it
            // before using it (it once computed `row + 1` on it).
            "rowmax" => Err(BatchError::Rows(vec![RowError {
                row: u32::MAX,
                column: Some("mode".into()),
                code: "rowmax".into(),
                message: "a row past the batch".into(),
            }])),
            "ansi" => Err(BatchError::Rows(vec![RowError {
                row: 0,
                column: Some("\u{1b}[2Jmode".into()),
                code: "ansi".into(),
                message: "\u{1b}[31mred\u{1b}[0m\r\nforged line".into(),
            }])),
            _ => Ok(()),
        }
    }

    struct Hostile;

    fn decl(schema: &Schema, abi: u32, has_transform: bool) -> Result<SchemaDecl, DescribeError> {
        Ok(SchemaDecl {
            name: "hostile".into(),
            version: "0.0.0".into(),
            abi_version: abi,
            arrow_schema: ipc::encode_schema(schema)
                .map_err(|e| DescribeError::InvalidParams(e.to_string()))?,
            key_column: "id".into(),
            blob_columns: vec![],
            vector_columns: vec![],
            secondary_key: None,
            capabilities: Capabilities::empty(),
            has_transform,
            queries: vec![],
        })
    }

    impl Guest for Hostile {
        /// `text=COLUMN` declares COLUMN a text column (with
        /// `tokenizer=NAME`, default `simple`); `text-mode=MODE` misbehaves
        /// here instead of in `describe`.
        fn describe_text(
            params: Vec<(String, String)>,
        ) -> Result<Vec<lance_context_plugin::bindings::TextColumn>, DescribeError> {
            let param = |k: &str| params.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone());
            if let Some(mode) = param("text-mode") {
                misbehave(&mode);
            }
            let Some(column) = param("text") else {
                return Ok(Vec::new());
            };
            let mut t = lance_context_plugin::TextColumn::new(&column);
            if let Some(tokenizer) = param("tokenizer") {
                t.tokenizer = tokenizer;
            }
            Ok(vec![lance_context_plugin::bindings::TextColumn {
                name: t.name,
                tokenizer: t.tokenizer,
                language: t.language,
                lower_case: t.lower_case,
                stem: t.stem,
                remove_stop_words: t.remove_stop_words,
                ascii_folding: t.ascii_folding,
                max_token_length: t.max_token_length,
            }])
        }

        fn describe(params: Vec<(String, String)>) -> Result<SchemaDecl, DescribeError> {
            let param = |k: &str| params.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone());
            if let Some(mode) = param("mode") {
                misbehave(&mode);
            }
            let abi = param("abi")
                .and_then(|v| v.parse().ok())
                .unwrap_or(lance_context_plugin::ABI_VERSION);
            if param("broken").is_some() {
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
                let mut d = decl(&broken, abi, false)?;
                d.blob_columns = vec!["_rowid".into()];
                d.vector_columns = vec![VectorColumn {
                    name: "vec".into(),
                    dimension: 0,
                    metric: Metric::Dot,
                }];
                d.secondary_key = Some("external_id".into());
                d.capabilities = Capabilities::LIFECYCLE;
                return Ok(d);
            }
            if param("giant").is_some() {
                let item = Arc::new(Field::new("item", DataType::Float32, true));
                let giant = Schema::new(vec![
                    key_field("id"),
                    Field::new("v", DataType::FixedSizeList(item, i32::MAX), true),
                ]);
                return decl(&giant, abi, false);
            }
            if param("sql").is_some() {
                let mut d = decl(&schema(), abi, true)?;
                d.queries = vec![
                    lance_context_plugin::bindings::lance_context::plugin::types::NamedQuery {
                        name: "expensive".into(),
                        description: String::new(),
                        params: vec![],
                        filter: "repeat(id, 50000000) <> ''".into(),
                        order_by: vec![],
                        reduce: false,
                    },
                ];
                return Ok(d);
            }
            if param("wide").is_some() {
                let item = Arc::new(Field::new("item", DataType::Float64, true));
                let mut fields: Vec<Field> = schema()
                    .fields()
                    .iter()
                    .map(|f| f.as_ref().clone())
                    .collect();
                fields.push(Field::new("w", DataType::FixedSizeList(item, 65536), true));
                return decl(&Schema::new(fields), abi, true);
            }
            if param("many-blobs").is_some() {
                let mut d = decl(&schema(), abi, false)?;
                d.blob_columns = (0..5000).map(|i| format!("b{i}")).collect();
                return Ok(d);
            }
            decl(&schema(), abi, true)
        }

        fn validate(batch: Vec<u8>, _context: CallContext) -> Result<(), BatchError> {
            let input = input(batch)?;
            misbehave(&input.mode);
            checks(&input)
        }

        fn reduce(
            _query: String,
            batch: Vec<u8>,
            _context: CallContext,
        ) -> Result<String, BatchError> {
            let input = input(batch)?;
            misbehave(&input.mode);
            Ok("{}".into())
        }

        fn transform(batch: Vec<u8>, context: CallContext) -> Result<Vec<u8>, BatchError> {
            let calls = CALLS.fetch_add(1, Ordering::SeqCst) + 1;
            let input = input(batch)?;
            misbehave(&input.mode);
            checks(&input)?;
            let rows: usize = input.batches.iter().map(|b| b.num_rows()).sum();
            let malformed = |e: ipc::WireError| BatchError::MalformedInput(e.to_string());
            // The creation parameter `transform` picks the mode for every
            // call (whatever the rows say): a plugin broken on every record.
            let mode = context
                .params
                .iter()
                .find(|(k, _)| k == "transform")
                .map(|(_, v)| v.trim_matches('"').to_string())
                .unwrap_or_else(|| input.mode.clone());
            match mode.as_str() {
                "undeclared" => {
                    // Returns a column the declaration does not have.
                    let extra = RecordBatch::try_new(
                        Arc::new(Schema::new(vec![Field::new(
                            "extra",
                            DataType::Int64,
                            true,
                        )])),
                        vec![Arc::new(Int64Array::from(vec![1; rows]))],
                    )
                    .map_err(|e| BatchError::MalformedInput(e.to_string()))?;
                    ipc::encode(&[extra]).map_err(malformed)
                }
                "garbage" => Ok(vec![
                    0xde, 0xad, 0xbe, 0xef, 0xff, 0xff, 0xff, 0x7f, 1, 2, 3,
                ]),
                "echo" => Ok(input.payload),
                "huge" => Ok(vec![0u8; input.n.max(0) as usize]),
                "lying" => {
                    // Declared `mode: Utf8`; returns `mode: Int64`.
                    let lie = RecordBatch::try_new(
                        Arc::new(Schema::new(vec![Field::new("mode", DataType::Int64, true)])),
                        vec![Arc::new(Int64Array::from(vec![1; rows]))],
                    )
                    .map_err(|e| BatchError::MalformedInput(e.to_string()))?;
                    ipc::encode(&[lie]).map_err(malformed)
                }
                "count" => {
                    let counted = RecordBatch::try_new(
                        Arc::new(Schema::new(vec![Field::new("n", DataType::Int64, true)])),
                        vec![Arc::new(Int64Array::from(vec![calls; rows]))],
                    )
                    .map_err(|e| BatchError::MalformedInput(e.to_string()))?;
                    ipc::encode(&[counted]).map_err(malformed)
                }
                "uuid" => {
                    let ids: Vec<Vec<u8>> = (0..rows)
                        .map(|_| wasip2::random::random::get_random_bytes(16))
                        .collect();
                    let minted = RecordBatch::try_new(
                        Arc::new(Schema::new(vec![Field::new(
                            "payload",
                            DataType::Binary,
                            true,
                        )])),
                        vec![Arc::new(BinaryArray::from_iter_values(ids))],
                    )
                    .map_err(|e| BatchError::MalformedInput(e.to_string()))?;
                    ipc::encode(&[minted]).map_err(malformed)
                }
                _ => ipc::encode(&input.batches).map_err(malformed),
            }
        }
    }

    lance_context_plugin::bindings::__export_schema_plugin!(
        Hostile with_types_in lance_context_plugin::bindings
    );
}
