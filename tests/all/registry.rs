//! The registry: stores created by name from a built-in plugin, a compiled
//! custom plugin or a declarative spec file, reopened after a restart, refused
//! when their plugin file is tampered with or their spec changes, created
//! concurrently, dropped.

use std::collections::HashMap;
use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::types::Int32Type;
use lance_context_host::PipelineError;
use lance_context_host::spec::SchemaSpec;
use lance_context_host::{
    CreateOptions, EntryState, NamedStore, Registry, RegistryError, SchemaSource,
};
use lance_context_host::{PluginError, PluginLimits, PluginRuntime};

const NOTES_SPEC: &str = r#"{
  "name": "tickets",
  "key": "id",
  "columns": [
    {"name": "id", "type": "Utf8", "nullable": false},
    {"name": "title", "type": "Utf8", "nullable": false, "rules": {"non_empty": true}},
    {"name": "state", "type": "Utf8", "rules": {"one_of": ["open", "closed"]}},
    {"name": "priority", "type": "Int32", "rules": {"min": 1, "max": 3}},
    {"name": "tags", "type": "List(Utf8)"},
    {"name": "embedding", "type": "FixedSizeList(2 x Float32)"}
  ],
  "vectors": [{"column": "embedding", "dimension": 2, "metric": "l2"}]
}"#;

fn registry(root: &std::path::Path) -> Registry {
    let runtime = Arc::new(
        PluginRuntime::new(
            PluginLimits::default(),
            Some(crate::support::compile_cache()),
        )
        .unwrap(),
    );
    Registry::at(root, runtime).unwrap()
}

fn no_options() -> HashMap<String, String> {
    HashMap::new()
}

async fn add_json(named: &NamedStore, lines: &str) -> Result<(), PipelineError> {
    let batch = lance_context_host::rows_from_json(named.plugin(), lines.as_bytes())?;
    named.add(&batch).await?;
    Ok(())
}

fn int(batch: &arrow_array::RecordBatch, column: &str) -> i32 {
    batch
        .column_by_name(column)
        .unwrap()
        .as_primitive::<Int32Type>()
        .value(0)
}

/// add (rules enforced, nothing written from a rejected batch) → merge →
/// compaction → get, for a store created by name.
async fn exercise(named: &NamedStore, row: impl Fn(usize, i32) -> String) {
    for round in 0..3 {
        let lines: Vec<String> = (0..4)
            .map(|i| row(round * 4 + i, 1 + i as i32 % 3))
            .collect();
        add_json(named, &lines.join("\n")).await.unwrap();
        named.merge().await.unwrap();
    }
    // A batch with one bad row is refused whole, naming row and column.
    let bad = [row(100, 2), row(101, 9)].join("\n");
    let err = add_json(named, &bad).await.unwrap_err();
    let PipelineError::Plugin(PluginError::Rejected { errors, .. }) = &err else {
        panic!("{err}")
    };
    assert_eq!(
        (errors[0].row, errors[0].column.as_deref()),
        (1, Some("priority")),
        "{err}"
    );
    assert!(named.get("n100").await.unwrap().is_none());
    named.compact().await.unwrap();
    let got = named.get("n6").await.unwrap().expect("n6");
    assert_eq!(int(&got, "priority"), 3);
    assert_eq!(named.count(None).await.unwrap(), 12);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spec_file_store_and_a_custom_plugin_store_work_like_builtins_and_reopen_by_name() {
    let root = tempfile::tempdir().unwrap();
    let reg = registry(root.path());

    // A store from a declarative spec (no plugin of the user's own).
    let spec = SchemaSpec::from_json(NOTES_SPEC).unwrap();
    let tickets = reg
        .create("tickets", CreateOptions::new(SchemaSource::Spec(spec)))
        .await
        .unwrap();
    assert_eq!(tickets.entry().plugin.source, "spec");
    exercise(&tickets, |i, p| {
        format!(
            r#"{{"id": "n{i}", "title": "t{i}", "state": "open", "priority": {p}, "tags": ["a"], "embedding": [{i}.0, 1.0]}}"#
        )
    })
    .await;
    // The spec's other rules, through the component.
    let err = add_json(&tickets, r#"{"id": "x", "title": "", "state": "lost"}"#)
        .await
        .unwrap_err();
    let PipelineError::Plugin(PluginError::Rejected { errors, .. }) = &err else {
        panic!("{err}")
    };
    let codes: Vec<&str> = errors.iter().map(|e| e.code.as_str()).collect();
    assert_eq!(codes, ["non_empty", "one_of"], "{err}");

    // A store from a compiled custom plugin (the example plugin's file).
    let bytes = std::fs::read(lance_context_host::built_plugin("example")).unwrap();
    let notes = reg
        .create(
            "notes",
            CreateOptions::new(SchemaSource::Plugin {
                label: "example.wasm".into(),
                bytes,
            }),
        )
        .await
        .unwrap();
    exercise(&notes, |i, p| {
        // The example's rule: priority 1 to 5 (9 is out).
        format!(r#"{{"id": "n{i}", "text": "note {i}", "priority": {p}}}"#)
    })
    .await;

    // And a built-in, with parameters.
    let mut options = CreateOptions::new(SchemaSource::Builtin("context".into()));
    options.params = vec![("embedding_dim".into(), "3".into())];
    let context = reg.create("ctx", options).await.unwrap();

    let recorded: Vec<_> = [&tickets, &notes, &context]
        .iter()
        .map(|n| n.entry().clone())
        .collect();
    for n in [tickets, notes, context] {
        n.close().await.unwrap();
    }
    drop(reg);

    // Restart: a new runtime and registry over the same root.
    let reg = registry(root.path());
    let names: Vec<String> = reg.list().unwrap().into_iter().map(|e| e.name).collect();
    assert_eq!(names, ["ctx", "notes", "tickets"]);
    for entry in &recorded {
        let named = reg.open(&entry.name, &no_options()).await.unwrap();
        assert_eq!(named.entry(), entry);
        assert_eq!(named.plugin().declaration().spec, entry.spec);
        assert_eq!(named.entry().state, EntryState::Ready);
        named.close().await.unwrap();
    }
    let ctx = reg.describe("ctx").unwrap();
    assert_eq!(ctx.params, [("embedding_dim".to_string(), "3".to_string())]);
    assert_eq!(ctx.plugin.name, "context");
    let tickets = reg.open("tickets", &no_options()).await.unwrap();
    assert_eq!(tickets.count(None).await.unwrap(), 12);
    // The spec's rules survive the restart (they travel as its parameter).
    assert!(
        add_json(&tickets, r#"{"id": "y", "title": "t", "priority": 7}"#)
            .await
            .is_err()
    );
    tickets.close().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tampered_plugin_file_or_a_changed_spec_is_refused() {
    let root = tempfile::tempdir().unwrap();
    let reg = registry(root.path());
    let named = reg
        .create(
            "r",
            CreateOptions::new(SchemaSource::Builtin("rollout".into())),
        )
        .await
        .unwrap();
    named.close().await.unwrap();
    let pinned = root.path().join(format!(
        "registry/plugins/{}.wasm",
        named.entry().plugin.sha256
    ));
    let original = std::fs::read(&pinned).unwrap();

    // One flipped byte.
    let mut tampered = original.clone();
    let last = tampered.len() - 1;
    tampered[last] ^= 0xff;
    std::fs::write(&pinned, &tampered).unwrap();
    let err = reg.open("r", &no_options()).await.unwrap_err();
    assert!(
        matches!(&err, RegistryError::PluginTampered { expected, .. } if *expected == named.entry().plugin.sha256),
        "{err}"
    );
    // Gone altogether.
    std::fs::remove_file(&pinned).unwrap();
    let err = reg.open("r", &no_options()).await.unwrap_err();
    assert!(matches!(err, RegistryError::PluginMissing { .. }), "{err}");
    std::fs::write(&pinned, &original).unwrap();
    reg.open("r", &no_options())
        .await
        .unwrap()
        .close()
        .await
        .unwrap();

    // A recorded spec that no longer matches what the plugin declares.
    let entry_path = root.path().join("registry/stores/r.json");
    let text = std::fs::read_to_string(&entry_path).unwrap();
    let changed = text.replacen("\"nullable\": true", "\"nullable\": false", 1);
    assert_ne!(text, changed);
    std::fs::write(&entry_path, changed).unwrap();
    let err = reg.open("r", &no_options()).await.unwrap_err();
    assert!(
        matches!(&err, RegistryError::SpecChanged { message, .. } if message.contains("nullable")),
        "{err}"
    );

    // An entry left by a create that never finished: refused, and droppable.
    let creating = text.replacen("\"state\": \"ready\"", "\"state\": \"creating\"", 1);
    assert_ne!(text, creating);
    std::fs::write(&entry_path, creating).unwrap();
    let err = reg.open("r", &no_options()).await.unwrap_err();
    assert!(matches!(err, RegistryError::Incomplete { .. }), "{err}");
    reg.drop_store("r", &no_options()).await.unwrap();
    assert!(reg.list().unwrap().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_creates_of_one_name_have_exactly_one_winner() {
    let root = tempfile::tempdir().unwrap();
    let reg = registry(root.path());
    let tasks: Vec<_> = (0..6)
        .map(|_| {
            let reg = reg.clone();
            tokio::spawn(async move {
                reg.create(
                    "same",
                    CreateOptions::new(SchemaSource::Builtin("datagen".into())),
                )
                .await
            })
        })
        .collect();
    let mut won = 0;
    for t in tasks {
        match t.await.unwrap() {
            Ok(named) => {
                won += 1;
                named.close().await.unwrap();
            }
            Err(RegistryError::AlreadyExists { name }) => assert_eq!(name, "same"),
            Err(e) => panic!("{e}"),
        }
    }
    assert_eq!(won, 1);
    assert_eq!(reg.list().unwrap().len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_names_and_bad_specs_are_refused_with_every_problem_and_nothing_created() {
    let root = tempfile::tempdir().unwrap();
    let reg = registry(root.path());
    let rollout = || CreateOptions::new(SchemaSource::Builtin("rollout".into()));
    for bad in ["", "_registry", "a/b", "-x"] {
        assert!(
            matches!(
                reg.create(bad, rollout()).await,
                Err(RegistryError::InvalidName { .. })
            ),
            "{bad}"
        );
    }
    assert!(matches!(
        reg.create(
            "x",
            CreateOptions::new(SchemaSource::Builtin("nope".into()))
        )
        .await,
        Err(RegistryError::UnknownPlugin { .. })
    ));
    // An unknown metric is refused where the spec is read, naming its field.
    let err = SchemaSpec::from_json(&NOTES_SPEC.replace("\"l2\"", "\"hamming\"")).unwrap_err();
    assert_eq!(err.problems[0].field, "vectors[0].metric", "{err}");
    let mut spec = SchemaSpec::from_json(NOTES_SPEC).unwrap();
    spec.columns[0].nullable = true;
    spec.columns[3].data_type = "Decimal128(10, 2)".into();
    let err = reg
        .create("bad", CreateOptions::new(SchemaSource::Spec(spec)))
        .await
        .unwrap_err();
    let RegistryError::Spec(errors) = &err else {
        panic!("{err}")
    };
    let fields: Vec<&str> = errors.problems.iter().map(|p| p.field.as_str()).collect();
    assert_eq!(fields, ["columns[3].type", "columns[0].nullable",], "{err}");
    // A user plugin keyed by something other than `id` is refused (only the
    // built-in datagen keeps `event_id`).
    let datagen = std::fs::read(lance_context_host::built_plugin("datagen")).unwrap();
    let err = reg
        .create(
            "keyed",
            CreateOptions::new(SchemaSource::Plugin {
                label: "copy-of-datagen.wasm".into(),
                bytes: datagen,
            }),
        )
        .await
        .unwrap_err();
    assert!(
        matches!(&err, RegistryError::Spec(e) if e.problems[0].field == "key"),
        "{err}"
    );
    assert!(reg.list().unwrap().is_empty());
    assert!(!root.path().join("stores/bad").exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn storage_option_keys_are_recorded_never_their_values_and_drop_says_what_it_removed() {
    let root = tempfile::tempdir().unwrap();
    let reg = registry(root.path());
    let mut options = CreateOptions::new(SchemaSource::Builtin("rollout".into()));
    options.storage_options = HashMap::from([("secret_token".into(), "hunter2".into())]);
    let a = reg.create("a", options).await.unwrap();
    a.close().await.unwrap();
    let text = std::fs::read_to_string(root.path().join("registry/stores/a.json")).unwrap();
    assert!(text.contains("secret_token") && !text.contains("hunter2"));
    let err = reg.open("a", &no_options()).await.unwrap_err();
    assert!(
        matches!(&err, RegistryError::MissingStorageOptions { keys, .. } if keys == &["secret_token"]),
        "{err}"
    );
    let with = HashMap::from([("secret_token".to_string(), "hunter2".to_string())]);
    reg.open("a", &with).await.unwrap().close().await.unwrap();

    // Two stores pin the same plugin: dropping one keeps the file.
    let b = reg
        .create(
            "b",
            CreateOptions::new(SchemaSource::Builtin("rollout".into())),
        )
        .await
        .unwrap();
    b.close().await.unwrap();
    let report = reg.drop_store("a", &with).await.unwrap();
    assert_eq!(report.plugin_file, None);
    assert!(!std::path::Path::new(&report.uri).exists());
    assert!(!report.entry.exists());
    let report = reg.drop_store("b", &no_options()).await.unwrap();
    let plugin_file = report.plugin_file.expect("the last pin removes the file");
    assert!(!plugin_file.exists());
    assert!(reg.list().unwrap().is_empty());
    assert!(matches!(
        reg.describe("a"),
        Err(RegistryError::NotFound { .. })
    ));
    // The name is free again.
    reg.create(
        "a",
        CreateOptions::new(SchemaSource::Builtin("rollout".into())),
    )
    .await
    .unwrap()
    .close()
    .await
    .unwrap();
}

fn strings(batch: &arrow_array::RecordBatch, column: &str) -> Vec<String> {
    batch
        .column_by_name(column)
        .unwrap()
        .as_string::<i32>()
        .iter()
        .map(|v| v.unwrap_or_default().to_string())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn named_queries_are_part_of_the_schema() {
    let root = tempfile::tempdir().unwrap();
    let reg = registry(root.path());
    let rollout = reg
        .create(
            "r",
            CreateOptions::new(SchemaSource::Builtin("rollout".into())),
        )
        .await
        .unwrap();
    let lines = [
        r#"{"id": "c", "rollout_id": "r1", "sequence_order": 2, "role": "tool"}"#,
        r#"{"id": "a", "rollout_id": "r1", "sequence_order": 0}"#,
        r#"{"id": "x", "rollout_id": "r2", "sequence_order": 0}"#,
        r#"{"id": "b2", "rollout_id": "r1", "sequence_order": 1}"#,
        r#"{"id": "b1", "rollout_id": "r1", "sequence_order": 1}"#,
    ];
    add_json(&rollout, &lines.join("\n")).await.unwrap();
    let arg = |k: &str, v: &str| vec![(k.to_string(), v.to_string())];
    let t = rollout
        .query("trajectory", &arg("rollout_id", "r1"))
        .await
        .unwrap();
    assert_eq!(strings(&t, "id"), ["a", "b1", "b2", "c"]);
    // A value with a quote is a literal, not SQL.
    let t = rollout
        .query("trajectory", &arg("rollout_id", "r1' OR '1'='1"))
        .await
        .unwrap();
    assert_eq!(t.num_rows(), 0);
    let err = rollout.query("trajectory", &[]).await.unwrap_err();
    assert!(
        err.to_string().contains("needs the parameter 'rollout_id'"),
        "{err}"
    );
    let err = rollout
        .query("trajectory", &arg("rollout_id", ""))
        .await
        .unwrap_err();
    assert!(err.to_string().contains("must not be empty"), "{err}");
    let err = rollout.query("fold", &[]).await.unwrap_err();
    assert!(
        err.to_string()
            .contains("no query 'fold' (queries: trajectory, group)"),
        "{err}"
    );
    rollout.close().await.unwrap();

    // A user's spec declares its own.
    let mut spec = SchemaSpec::from_json(NOTES_SPEC).unwrap();
    spec.queries = vec![lance_context_host::spec::QuerySpec {
        name: "by_state".into(),
        description: "tickets in a state, most urgent first".into(),
        params: vec!["state".into()],
        filter: "state = {state}".into(),
        order_by: vec!["priority desc".into(), "id".into()],
        reduce: false,
    }];
    let tickets = reg
        .create("t", CreateOptions::new(SchemaSource::Spec(spec)))
        .await
        .unwrap();
    let lines = [
        r#"{"id": "1", "title": "a", "state": "open", "priority": 1}"#,
        r#"{"id": "2", "title": "b", "state": "open", "priority": 3}"#,
        r#"{"id": "3", "title": "c", "state": "closed", "priority": 3}"#,
    ];
    add_json(&tickets, &lines.join("\n")).await.unwrap();
    let open = tickets
        .query("by_state", &arg("state", "open"))
        .await
        .unwrap();
    assert_eq!(strings(&open, "id"), ["2", "1"]);
    tickets.close().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_context_plugin_gets_its_capabilities_from_the_engine() {
    use lance_context_store::{PatchTarget, ScanRequest};
    let root = tempfile::tempdir().unwrap();
    let reg = registry(root.path());
    let mut options = CreateOptions::new(SchemaSource::Builtin("context".into()));
    options.params = vec![("embedding_dim".into(), "2".into())];
    let ctx = reg.create("ctx", options).await.unwrap();
    let lines = [
        r#"{"id": "a", "run_id": "r", "session_id": "s", "external_id": "ea", "text_payload": "one"}"#,
        r#"{"id": "b", "run_id": "r", "session_id": "s", "text_payload": "two"}"#,
    ];
    add_json(&ctx, &lines.join("\n")).await.unwrap();
    // Unique ids: re-adding `a` is refused.
    let err = add_json(&ctx, r#"{"id": "a", "run_id": "r2"}"#)
        .await
        .unwrap_err();
    assert!(err.to_string().contains("id 'a' already exists"), "{err}");

    // Delete: a tombstone; the key is free again.
    assert_eq!(ctx.delete(&["b", "zz"]).await.unwrap(), [true, false]);
    assert!(ctx.get("b").await.unwrap().is_none());
    add_json(&ctx, r#"{"id": "b", "run_id": "r3", "session_id": "s"}"#)
        .await
        .unwrap();

    // Upsert by external_id: replaces `a`, which the session query no longer shows.
    let batch = lance_context_host::rows_from_json(
        ctx.plugin(),
        r#"{"id": "a2", "run_id": "r4", "session_id": "s", "external_id": "ea", "text_payload": "one, revised"}"#
            .as_bytes(),
    )
    .unwrap();
    let out = ctx.upsert(&batch).await.unwrap();
    assert_eq!(out[0].replaced_id.as_deref(), Some("a"));
    let arg = vec![("session_id".to_string(), "s".to_string())];
    let session = ctx.query("session", &arg).await.unwrap();
    let mut ids = strings(&session, "id");
    ids.sort();
    assert_eq!(ids, ["a2", "b"]);

    // Patch: a new version through the plugin (defaults filled), superseding.
    let patch = arrow_array::RecordBatch::try_new(
        Arc::new(arrow_schema::Schema::new(vec![arrow_schema::Field::new(
            "tenant",
            arrow_schema::DataType::Utf8,
            true,
        )])),
        vec![Arc::new(arrow_array::StringArray::from(vec![Some("t1")]))],
    )
    .unwrap();
    let v = ctx
        .patch(&PatchTarget::SecondaryKey("ea".into()), &patch)
        .await
        .unwrap()
        .expect("a visible record");
    assert_eq!(v.replaced_id, "a2");
    let visible = ctx.scan(ScanRequest::new()).await.unwrap();
    let mut ids = strings(&visible, "id");
    ids.sort();
    let mut want = vec!["b".to_string(), v.id.clone()];
    want.sort();
    assert_eq!(ids, want);
    let row = ctx.get(&v.id).await.unwrap().unwrap();
    assert_eq!(strings(&row, "tenant"), ["t1"]);
    assert_eq!(strings(&row, "session_id"), ["s"]);
    ctx.close().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_datagen_fold_is_a_reducing_named_query() {
    let root = tempfile::tempdir().unwrap();
    let reg = registry(root.path());
    let datagen = reg
        .create(
            "events",
            CreateOptions::new(SchemaSource::Builtin("datagen".into())),
        )
        .await
        .unwrap();
    let common = r#""item_id": "i1", "root_item_id": "i1", "checkpoint_id": "c", "run_id": "r", "writer_epoch": "w", "schema_version": 2"#;
    let step = r#""step_name": "gen", "step_index": 0"#;
    let lines = [
        format!(
            r#"{{"event_id": "e0", "item_seq": 1, "event_type": "ITEM_CREATED", "status": "running", "query_tags_json": "{{\"k\": 1}}", {common}}}"#
        ),
        format!(
            r#"{{"event_id": "e1", "item_seq": 2, "event_type": "STEP_STARTED", "step_kind": "sequence", {step}, {common}}}"#
        ),
        format!(
            r#"{{"event_id": "e2", "item_seq": 3, "event_type": "FIELD_SET", "step_kind": "leaf", {step}, "field_name": "answer", "field_type": "str", "codec_version": 1, "value_kind": "str", "value_str": "42", {common}}}"#
        ),
        format!(
            r#"{{"event_id": "e3", "item_seq": 4, "event_type": "STEP_COMPLETED", "step_kind": "leaf", {step}, {common}}}"#
        ),
        format!(
            r#"{{"event_id": "e4", "item_seq": 5, "event_type": "TERMINAL", "status": "completed", {common}}}"#
        ),
    ];
    add_json(&datagen, &lines.join("\n")).await.unwrap();
    let arg = vec![("item_id".to_string(), "i1".to_string())];
    let json = |raw: Box<serde_json::value::RawValue>| -> serde_json::Value {
        serde_json::from_str(raw.get()).unwrap()
    };
    let state = json(datagen.reduce("item_state", &arg).await.unwrap());
    let item = &state["item"];
    assert_eq!(item["status"], "completed");
    assert_eq!(item["fields"]["answer"]["value"], "42");
    assert_eq!(item["query_tags"]["k"], 1);
    assert_eq!(item["started"], serde_json::json!(["gen"]));
    let trajectory = json(datagen.reduce("item_trajectory", &arg).await.unwrap());
    assert_eq!(trajectory.as_array().unwrap().len(), 1);
    assert_eq!(trajectory[0]["item_seq"], 4);
    // An item never created folds to null; raw events stay a plain query.
    let none = json(
        datagen
            .reduce("item_state", &[("item_id".into(), "nope".into())])
            .await
            .unwrap(),
    );
    assert_eq!(none, serde_json::json!({"item": null}));
    assert_eq!(
        datagen.query("item_events", &arg).await.unwrap().num_rows(),
        5
    );
    assert!(datagen.reduce("item_events", &arg).await.is_err());
    // A second event at item_seq 5 (another batch): the fold names the row.
    add_json(
        &datagen,
        &format!(
            r#"{{"event_id": "e5", "item_seq": 5, "event_type": "TERMINAL", "status": "filtered", {common}}}"#
        ),
    )
    .await
    .unwrap();
    let err = datagen.reduce("item_state", &arg).await.unwrap_err();
    assert!(
        matches!(&err, lance_context_host::QueryFailure::Plugin(PluginError::Rejected { errors, .. }) if errors[0].row == 5),
        "{err}"
    );
    datagen.close().await.unwrap();
}

/// Every type the spec rules accept goes through the generic path: JSON in,
/// the spec plugin, the engine, read back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_supported_type_round_trips_through_a_spec_store() {
    let spec = r#"{
      "name": "types",
      "key": "id",
      "columns": [
        {"name": "id", "type": "Utf8", "nullable": false},
        {"name": "b", "type": "Boolean"},
        {"name": "i8", "type": "Int8"}, {"name": "i16", "type": "Int16"},
        {"name": "i32", "type": "Int32"}, {"name": "i64", "type": "Int64"},
        {"name": "u8", "type": "UInt8"}, {"name": "u16", "type": "UInt16"},
        {"name": "u32", "type": "UInt32"}, {"name": "u64", "type": "UInt64"},
        {"name": "f32", "type": "Float32"}, {"name": "f64", "type": "Float64"},
        {"name": "s", "type": "Utf8"}, {"name": "ls", "type": "LargeUtf8"},
        {"name": "bin", "type": "Binary"}, {"name": "lbin", "type": "LargeBinary"},
        {"name": "d", "type": "Date32"},
        {"name": "ts", "type": "Timestamp(µs)"},
        {"name": "tsu", "type": "Timestamp(ms, \"UTC\")"},
        {"name": "dict", "type": "Dictionary(Int16, Utf8)"},
        {"name": "l", "type": "List(Int32)"},
        {"name": "ll", "type": "LargeList(Utf8)"},
        {"name": "v", "type": "FixedSizeList(3 x Float32)"},
        {"name": "st", "type": "Struct(\"a\": Int64, \"b\": Utf8)"}
      ]
    }"#;
    let root = tempfile::tempdir().unwrap();
    let reg = registry(root.path());
    let named = reg
        .create(
            "types",
            CreateOptions::new(SchemaSource::Spec(SchemaSpec::from_json(spec).unwrap())),
        )
        .await
        .unwrap();
    let row = r#"{"id": "r", "b": true, "i8": -8, "i16": -16, "i32": -32, "i64": -64,
        "u8": 8, "u16": 16, "u32": 32, "u64": 64, "f32": 1.5, "f64": 2.5,
        "s": "s", "ls": "ls", "bin": "aGk=", "lbin": "aGk=", "d": "2026-11-29",
        "ts": "2026-11-29T12:00:00", "tsu": "2026-11-29T12:00:00Z", "dict": "x",
        "l": [1, 2], "ll": ["a"], "v": [1.0, 2.0, 3.0], "st": {"a": 1, "b": "x"}}"#
        .replace('\n', " ");
    add_json(&named, &row).await.unwrap();
    named.merge().await.unwrap();
    let got = named.get("r").await.unwrap().expect("the row");
    let schema = named.plugin().declaration().schema.clone();
    for field in schema.fields() {
        let column = got.column_by_name(field.name()).unwrap();
        assert_eq!(column.data_type(), field.data_type(), "{}", field.name());
        assert!(column.is_valid(0), "{} came back null", field.name());
    }
    named.close().await.unwrap();
}

fn notes_spec() -> SchemaSource {
    SchemaSource::Spec(SchemaSpec::from_json(NOTES_SPEC).unwrap())
}

/// Rewrite a store's entry file (what someone with write access to the data
/// root could do).
fn edit_entry(root: &std::path::Path, name: &str, edit: impl FnOnce(&mut serde_json::Value)) {
    let path = root.join(format!("registry/stores/{name}.json"));
    let mut entry: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    edit(&mut entry);
    std::fs::write(&path, serde_json::to_vec(&entry).unwrap()).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drop_deletes_only_the_stores_own_data() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("root");
    let reg = registry(&root);
    for name in ["a", "b", "c", "d"] {
        reg.create(name, CreateOptions::new(notes_spec()))
            .await
            .unwrap()
            .close()
            .await
            .unwrap();
    }
    let precious = dir.path().join("precious");
    std::fs::create_dir_all(&precious).unwrap();
    std::fs::write(precious.join("thesis.txt"), "years of work").unwrap();
    let b_data = root.join("stores/b");
    for (name, uri, why) in [
        ("a", root.to_string_lossy().into_owned(), "data root"),
        (
            "b",
            root.join("stores").to_string_lossy().into_owned(),
            "overlaps store",
        ),
        (
            "c",
            b_data.to_string_lossy().into_owned(),
            "overlaps store 'b'",
        ),
        (
            "d",
            precious.to_string_lossy().into_owned(),
            "not a Lance dataset",
        ),
    ] {
        let honest = reg.describe(name).unwrap().uri;
        edit_entry(&root, name, |e| e["uri"] = serde_json::json!(uri));
        let err = reg.drop_store(name, &no_options()).await.unwrap_err();
        assert!(
            matches!(&err, RegistryError::UnsafeUri { reason, .. } if reason.contains(why)),
            "{name}: {err}"
        );
        edit_entry(&root, name, |e| e["uri"] = serde_json::json!(honest));
    }
    assert!(precious.join("thesis.txt").exists());
    assert!(b_data.join("_versions").exists());
    assert!(root.join("registry/stores/b.json").exists());
    // The honest store drops.
    reg.drop_store("b", &no_options()).await.unwrap();
    assert!(!b_data.exists());

    // An entry naming a plugin "digest" that is a path is corrupt, never read.
    edit_entry(&root, "c", |e| {
        e["plugin"]["sha256"] = serde_json::json!("../../../../etc/passwd")
    });
    assert!(matches!(
        reg.describe("c"),
        Err(RegistryError::Corrupt { .. })
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_is_created_only_where_nothing_is() {
    let dir = tempfile::tempdir().unwrap();
    let reg = registry(&dir.path().join("root"));
    let busy = dir.path().join("busy");
    std::fs::create_dir_all(&busy).unwrap();
    std::fs::write(busy.join("keep.me"), "mine").unwrap();
    let mut options = CreateOptions::new(notes_spec());
    options.uri = Some(busy.to_string_lossy().into_owned());
    let err = reg.create("n", options).await.unwrap_err();
    assert!(matches!(err, RegistryError::UriNotEmpty { .. }), "{err}");
    assert!(
        busy.join("keep.me").exists(),
        "nothing of the caller's was touched"
    );
    assert!(matches!(
        reg.describe("n"),
        Err(RegistryError::NotFound { .. })
    ));
    // An empty directory is fine.
    let empty = dir.path().join("empty");
    std::fs::create_dir_all(&empty).unwrap();
    let mut options = CreateOptions::new(notes_spec());
    options.uri = Some(empty.to_string_lossy().into_owned());
    reg.create("n", options)
        .await
        .unwrap()
        .close()
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn creates_and_drops_sharing_a_plugin_file_never_lose_it() {
    let dir = tempfile::tempdir().unwrap();
    let reg = registry(&dir.path().join("root"));
    for round in 0..3 {
        let old = format!("old{round}");
        let new = format!("new{round}");
        reg.create(&old, CreateOptions::new(notes_spec()))
            .await
            .unwrap()
            .close()
            .await
            .unwrap();
        let options = no_options();
        let (dropped, created) = tokio::join!(
            reg.drop_store(&old, &options),
            reg.create(&new, CreateOptions::new(notes_spec()))
        );
        dropped.unwrap();
        created.unwrap().close().await.unwrap();
        // The new store pins the same plugin file: it must still be there.
        let named = reg.open(&new, &no_options()).await.unwrap();
        named.close().await.unwrap();
        reg.drop_store(&new, &no_options()).await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_two_parameter_query_cannot_be_injected() {
    let dir = tempfile::tempdir().unwrap();
    let reg = registry(dir.path());
    let spec = SchemaSpec::from_json(
        r#"{"name": "items", "key": "id", "columns": [
            {"name": "id", "type": "Utf8", "nullable": false},
            {"name": "tenant", "type": "Utf8"},
            {"name": "item", "type": "Utf8"}],
          "queries": [{"name": "q", "params": ["t", "i"],
                       "filter": "tenant = {t} AND item = {i}"}]}"#,
    )
    .unwrap();
    let named = reg
        .create("items", CreateOptions::new(SchemaSource::Spec(spec)))
        .await
        .unwrap();
    add_json(
        &named,
        r#"{"id": "1", "tenant": "a", "item": "x"}
{"id": "2", "tenant": "b", "item": "y"}"#,
    )
    .await
    .unwrap();
    let args = |t: &str, i: &str| {
        vec![
            ("t".to_string(), t.to_string()),
            ("i".to_string(), i.to_string()),
        ]
    };
    assert_eq!(
        named.query("q", &args("a", "x")).await.unwrap().num_rows(),
        1
    );
    let injected = named
        .query("q", &args("{i}", " OR 1=1 OR tenant="))
        .await
        .unwrap();
    assert_eq!(
        injected.num_rows(),
        0,
        "the injection returned other tenants' rows"
    );
    named.close().await.unwrap();
}

/// The spellings of a location that another store's data or the registry
/// hides behind, under `dir` (the victims: store `b` at `<root>/stores/b`,
/// store `c` at `<dir>/elsewhere/c`; `<dir>/link` a symlink to `b`'s data).
pub fn hostile_uris(dir: &std::path::Path, root: &std::path::Path) -> Vec<String> {
    let r = root.to_str().unwrap();
    let d = dir.to_str().unwrap();
    let bare = r.trim_start_matches('/');
    vec![
        // Upper- and mixed-case schemes: the stores directory and b's data.
        format!("FILE://{r}/stores"),
        format!("File://{r}/stores/b/sub"),
        // file: with no, one, two and three slashes.
        format!("file:{bare}/stores/b/sub"),
        format!("file:{r}/stores/b/sub"),
        format!("file:/{r}/stores/b/sub"),
        format!("file://{r}/stores/b/sub"),
        // Percent-encoding of the path.
        format!("file://{r}/stor%65s/b/sub"),
        format!("file://{r}/stores%2Fb%2Fsub"),
        // Dot segments, plain and in a file uri.
        format!("{r}/stores/x/../b/sub"),
        format!("file://{r}/stores/x/%2e%2e/b/sub"),
        format!("{r}/./stores/b/sub"),
        // A symlink to another store's data.
        format!("{d}/link"),
        format!("{d}/link/sub"),
        // A trailing slash.
        format!("{r}/stores/b/"),
        // The data root, the registry and inside it.
        r.to_string(),
        format!("{r}/"),
        format!("{r}/registry"),
        format!("{r}/registry/stores/zz.json"),
        format!("{r}/registry/plugins/x"),
        // Another store's subdirectory; a parent of another store.
        format!("{r}/stores/b/sub"),
        format!("{d}/elsewhere/c/sub"),
        format!("{d}/elsewhere"),
        format!("{r}/stores"),
        // The default place of a store not created yet.
        format!("{r}/stores/q"),
    ]
}

/// Every file and directory under `dir`, relative, sorted.
pub fn tree(dir: &std::path::Path) -> Vec<String> {
    fn walk(base: &std::path::Path, at: &std::path::Path, out: &mut Vec<String>) {
        let Ok(items) = std::fs::read_dir(at) else {
            return;
        };
        for item in items.flatten() {
            let path = item.path();
            out.push(path.strip_prefix(base).unwrap().display().to_string());
            if item.file_type().is_ok_and(|t| t.is_dir()) {
                walk(base, &path, out);
            }
        }
    }
    let mut out = Vec::new();
    walk(dir, dir, &mut out);
    out.sort();
    out
}

/// Whatever a new store's uri says (case, slashes, percent-encoding, dot
/// segments, a symlink, a trailing slash), it cannot be the data root, the
/// registry, another store's data or place, or contain them: each create is
/// refused as invalid input before anything is written, and the other
/// stores keep their records, list, and drop.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_stores_uri_cannot_reach_other_data_whatever_its_spelling() {
    let dir = tempfile::tempdir().unwrap();
    let dir = std::fs::canonicalize(dir.path()).unwrap();
    let root = dir.join("root");
    let reg = registry(&root);
    let record = r#"{"id": "1", "title": "mine"}"#;
    let b = reg
        .create("b", CreateOptions::new(notes_spec()))
        .await
        .unwrap();
    add_json(&b, record).await.unwrap();
    b.close().await.unwrap();
    let mut options = CreateOptions::new(notes_spec());
    options.uri = Some(dir.join("elsewhere/c").to_string_lossy().into_owned());
    let c = reg.create("c", options).await.unwrap();
    add_json(&c, record).await.unwrap();
    c.close().await.unwrap();
    std::os::unix::fs::symlink(root.join("stores/b"), dir.join("link")).unwrap();

    // What a refused create must leave as it was (a lock file of the
    // store's own, valid name is not data).
    let data = |dir: &std::path::Path| -> Vec<String> {
        tree(dir)
            .into_iter()
            .filter(|p| !p.starts_with("root/registry/locks"))
            .collect()
    };
    for uri in hostile_uris(&dir, &root) {
        let before = data(&dir);
        let mut options = CreateOptions::new(notes_spec());
        options.uri = Some(uri.clone());
        match reg.create("a", options).await {
            Ok(a) => {
                let at = a.entry().uri.clone();
                a.close().await.unwrap();
                panic!("{uri}: created at {at}");
            }
            Err(e) => assert_eq!(
                e.kind(),
                lance_context_host::ErrorKind::InvalidInput,
                "{uri}: {e}"
            ),
        }
        assert_eq!(data(&dir), before, "{uri}: the refused create wrote");
        let names: Vec<String> = reg.list().unwrap().into_iter().map(|e| e.name).collect();
        assert_eq!(names, ["b", "c"], "{uri}");
        for victim in ["b", "c"] {
            let named = reg.open(victim, &no_options()).await.unwrap();
            assert_eq!(named.count(None).await.unwrap(), 1, "{uri}: {victim}");
            named.close().await.unwrap();
        }
    }

    // A location of its own is fine however it is spelt; the store lands
    // where the uri says, decoded once, dot segments resolved.
    let mut options = CreateOptions::new(notes_spec());
    options.uri = Some(format!("FILE://{}/own%20place/x/../a/", dir.display()));
    let a = reg.create("a", options).await.unwrap();
    a.close().await.unwrap();
    assert!(dir.join("own place/a/_versions").is_dir());
    reg.drop_store("a", &no_options()).await.unwrap();
    assert!(!dir.join("own place/a").exists());
    for victim in ["b", "c"] {
        let report = reg.drop_store(victim, &no_options()).await.unwrap();
        assert!(!std::path::Path::new(&report.uri).exists(), "{victim}");
    }
}

/// A name that is not one never becomes a path (no lock file, no entry read
/// outside the registry), and stray or damaged files under the registry's
/// `stores/` do not stop the listing or a drop.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn traversal_names_and_stray_registry_files_touch_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("root");
    let reg = registry(&root);
    reg.create("b", CreateOptions::new(notes_spec()))
        .await
        .unwrap()
        .close()
        .await
        .unwrap();
    let before = tree(dir.path());
    for name in ["../../../pwned", "../../stores/b", "a/b", ".."] {
        let err = reg.drop_store(name, &no_options()).await.unwrap_err();
        assert!(
            matches!(err, RegistryError::InvalidName { .. }),
            "{name}: {err}"
        );
        let bytes = std::fs::read(lance_context_host::built_plugin("example")).unwrap();
        let err = reg.upgrade(name, "x.wasm", &bytes, None).await.unwrap_err();
        assert!(
            matches!(err, RegistryError::InvalidName { .. }),
            "{name}: {err}"
        );
    }
    assert_eq!(tree(dir.path()), before, "a refused name left files");

    // A directory and a file that does not parse, where entries are.
    std::fs::create_dir_all(root.join("registry/stores/zz.json/_versions")).unwrap();
    std::fs::write(root.join("registry/stores/junk.json"), "{not json").unwrap();
    let names: Vec<String> = reg.list().unwrap().into_iter().map(|e| e.name).collect();
    assert_eq!(names, ["b"]);
    reg.drop_store("b", &no_options()).await.unwrap();
    assert!(reg.list().unwrap().is_empty());
}
