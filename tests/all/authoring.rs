//! Plugin authoring: the probe `plugin check` and `store create` run (a
//! transform returning an undeclared column, or a column of the wrong
//! type, is caught before a store pins the plugin), and `store upgrade`
//! (same schema: re-pinned; another schema: refused with the difference).

use std::sync::Arc;

use lance_context_host::{
    CreateOptions, PluginLimits, PluginRuntime, ProbeLevel, Registry, RegistryError, SchemaSource,
    built_plugin,
};
use serde_json::Value;

use crate::support::cli;

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

fn hostile_with(transform: &str) -> CreateOptions {
    let mut options = CreateOptions::new(SchemaSource::Plugin {
        label: "hostile.wasm".into(),
        bytes: std::fs::read(built_plugin("test_hostile")).unwrap(),
    });
    options.params = vec![("transform".into(), format!("\"{transform}\""))];
    options
}

/// A component with the same code and a different hash: a custom section
/// appended (valid anywhere between a component's sections).
fn rebuilt(bytes: &[u8]) -> Vec<u8> {
    let name = b"lance-context-test";
    let payload = b"a rebuild";
    let mut out = bytes.to_vec();
    out.push(0); // custom section
    out.push((1 + name.len() + payload.len()) as u8);
    out.push(name.len() as u8);
    out.extend_from_slice(name);
    out.extend_from_slice(payload);
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transform_breaking_its_declaration_fails_the_probe_and_no_store_pins_it() {
    let dir = tempfile::tempdir().unwrap();
    let reg = registry(dir.path());
    for (transform, says) in [("undeclared", "extra"), ("lying", "mode")] {
        let err = reg
            .create(&format!("h-{transform}"), hostile_with(transform))
            .await
            .map(drop)
            .unwrap_err();
        match &err {
            RegistryError::ProbeFailed { problems, .. } => assert!(
                problems.iter().any(|p| p.contains(says)),
                "{transform}: {problems:?}"
            ),
            other => panic!("{transform}: {other}"),
        }
        assert_eq!(err.kind(), lance_context_host::ErrorKind::PluginFault);
        // Nothing was claimed or pinned: the name is free.
        assert!(matches!(
            reg.describe(&format!("h-{transform}")),
            Err(RegistryError::NotFound { .. })
        ));
    }
    assert!(
        !dir.path().join("plugins").exists()
            || std::fs::read_dir(dir.path().join("plugins"))
                .unwrap()
                .next()
                .is_none(),
        "no plugin file pinned"
    );
    // The same plugin with a working transform is created.
    reg.create("h-ok", hostile_with("behave")).await.unwrap();

    // The built-ins and the example pass the probe with no problem or warning.
    let runtime = PluginRuntime::new(
        PluginLimits::default(),
        Some(crate::support::compile_cache()),
    )
    .unwrap();
    for (name, params) in [
        ("rollout", vec![]),
        (
            "context",
            vec![("embedding_dim".to_string(), "4".to_string())],
        ),
        ("datagen", vec![]),
        ("example", vec![]),
    ] {
        let plugin = runtime
            .load(name, &std::fs::read(built_plugin(name)).unwrap(), params)
            .unwrap();
        let samples = lance_context_host::builtin_samples(name).map(str::as_bytes);
        let report = lance_context_host::probe(&plugin, samples);
        for level in [ProbeLevel::Problem, ProbeLevel::Warning] {
            assert!(report.at(level).is_empty(), "{name}: {report:?}");
        }
        assert!(
            report.checks.iter().any(|c| c.level == ProbeLevel::Ok),
            "{name}: {report:?}"
        );
    }
}

/// `plugin check` reports the probe's problems (exit 2) and runs sample
/// records; `store create` refuses the plugin (exit 6, a plugin fault).
#[test]
fn plugin_check_and_store_create_refuse_a_broken_transform() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let root_arg = root.to_str().unwrap();
    let hostile = built_plugin("test_hostile");
    let plugin = hostile.to_str().unwrap();
    let (code, out, err) = cli(
        root,
        &[
            "--json",
            "plugin",
            "check",
            plugin,
            "--param",
            "transform=\"undeclared\"",
        ],
        "",
    );
    assert_eq!(code, 2, "{out}{err}");
    let report: Value = serde_json::from_str(out.trim()).unwrap();
    assert!(report["problems"].as_u64().unwrap() >= 1, "{report}");
    let problems: Vec<&str> = report["checks"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["level"] == "problem")
        .map(|c| c["message"].as_str().unwrap())
        .collect();
    assert!(problems.iter().any(|p| p.contains("extra")), "{problems:?}");

    let (code, _, err) = cli(
        root,
        &[
            "store",
            "create",
            "h",
            "--root",
            root_arg,
            "--plugin",
            plugin,
            "--param",
            "transform=\"lying\"",
        ],
        "",
    );
    assert_eq!(code, 6, "{err}");
    assert!(err.contains("failed its probe"), "{err}");
    // A plugin with only warnings is created, and the warnings are said.
    let (code, _, err) = cli(
        root,
        &[
            "store", "create", "h-ok", "--root", root_arg, "--plugin", plugin,
        ],
        "",
    );
    assert_eq!(code, 0, "{err}");
    assert!(
        err.contains("warning: a record without non-nullable column 'id' is accepted"),
        "{err}"
    );
    let (code, _, err) = cli(root, &["store", "describe", "h", "--root", root_arg], "");
    assert_eq!(code, 3, "no entry was left: {err}");

    // Samples: records the caller expects the plugin to accept.
    let samples = root.join("samples.jsonl");
    std::fs::write(&samples, "{\"id\": \"s1\", \"mode\": \"behave\"}\n").unwrap();
    let (code, out, err) = cli(
        root,
        &[
            "plugin",
            "check",
            plugin,
            "--sample",
            samples.to_str().unwrap(),
        ],
        "",
    );
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("1 sample record(s): accepted"), "{out}");
}

/// `store upgrade`: a rebuild declaring the same schema is re-pinned (the
/// old file removed, the data untouched); a plugin declaring another schema
/// is refused with the difference, and the store keeps its plugin.
#[test]
fn upgrade_repins_the_same_schema_and_refuses_another() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let r = root.to_str().unwrap();
    let example = built_plugin("example");
    let (code, _, err) = cli(
        root,
        &[
            "store",
            "create",
            "notes",
            "--root",
            r,
            "--plugin",
            example.to_str().unwrap(),
        ],
        "",
    );
    assert_eq!(code, 0, "{err}");
    let (code, _, err) = cli(
        root,
        &["store", "add", "notes", "--root", r, "-"],
        "{\"id\": \"n1\", \"text\": \"first\", \"priority\": 2}\n",
    );
    assert_eq!(code, 0, "{err}");
    let describe = |root: &std::path::Path| -> Value {
        let (code, out, err) = cli(
            root,
            &["--json", "store", "describe", "notes", "--root", r],
            "",
        );
        assert_eq!(code, 0, "{err}");
        serde_json::from_str(out.trim()).unwrap()
    };
    let before = describe(root);
    let old_sha = before["plugin"]["sha256"].as_str().unwrap().to_string();

    // A rebuild with the same schema.
    let new = root.join("notes-v2.wasm");
    std::fs::write(&new, rebuilt(&std::fs::read(&example).unwrap())).unwrap();
    let (code, out, err) = cli(
        root,
        &[
            "--json",
            "store",
            "upgrade",
            "notes",
            "--root",
            r,
            "--plugin",
            new.to_str().unwrap(),
        ],
        "",
    );
    assert_eq!(code, 0, "{err}");
    let upgraded: Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(upgraded["from"]["sha256"], old_sha.as_str());
    let new_sha = upgraded["to"]["sha256"].as_str().unwrap().to_string();
    assert_ne!(new_sha, old_sha);
    assert_eq!(upgraded["removed_plugin_file"], true, "{upgraded}");
    let after = describe(root);
    assert_eq!(after["plugin"]["sha256"], new_sha.as_str());
    assert_eq!(after["plugin"]["source"], "file:notes-v2.wasm");
    assert_eq!(after["spec"], before["spec"]);
    // The store works through the new pin: old data read, new data added.
    let (code, out, err) = cli(root, &["store", "get", "notes", "--root", r, "n1"], "");
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("first"), "{out}");
    let (code, _, err) = cli(
        root,
        &["store", "add", "notes", "--root", r, "-"],
        "{\"id\": \"n2\", \"text\": \"second\", \"priority\": 3}\n",
    );
    assert_eq!(code, 0, "{err}");

    // Another schema: refused, saying what differs; the pin is unchanged.
    let rollout = built_plugin("rollout");
    let (code, _, err) = cli(
        root,
        &[
            "store",
            "upgrade",
            "notes",
            "--root",
            r,
            "--plugin",
            rollout.to_str().unwrap(),
        ],
        "",
    );
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("declares a different schema"), "{err}");
    assert_eq!(describe(root)["plugin"]["sha256"], new_sha.as_str());

    // A store from a spec file is run by the built-in spec plugin: refused.
    let spec = root.join("s.json");
    std::fs::write(
        &spec,
        r#"{"name": "s", "key": "id", "columns": [{"name": "id", "type": "Utf8", "nullable": false}]}"#,
    )
    .unwrap();
    let (code, _, err) = cli(
        root,
        &[
            "store",
            "create",
            "s",
            "--root",
            r,
            "--spec",
            spec.to_str().unwrap(),
        ],
        "",
    );
    assert_eq!(code, 0, "{err}");
    let (code, _, err) = cli(
        root,
        &[
            "store",
            "upgrade",
            "s",
            "--root",
            r,
            "--plugin",
            new.to_str().unwrap(),
        ],
        "",
    );
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("spec"), "{err}");
}

/// `plugin new`: the crate it writes builds for wasm32-wasip2 as generated,
/// its native unit tests pass, and the component passes `plugin check`
/// (with its sample records) and serves a store.
#[test]
fn a_new_plugin_crate_builds_passes_its_tests_and_the_check() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let crate_dir = root.join("orders");
    let (code, out, err) = cli(
        root,
        &[
            "--json",
            "plugin",
            "new",
            "orders",
            "--dir",
            crate_dir.to_str().unwrap(),
        ],
        "",
    );
    assert_eq!(code, 0, "{out}{err}");
    let created: Value = serde_json::from_str(out.trim()).unwrap();
    for file in [
        "Cargo.toml",
        "src/lib.rs",
        "README.md",
        "rust-toolchain.toml",
        "samples.jsonl",
    ] {
        assert!(crate_dir.join(file).is_file(), "{file} missing: {created}");
    }
    // Names a crate cannot take are refused.
    for bad in ["test", "lance-context-plugin", "Orders"] {
        let (code, _, err) = cli(root, &["plugin", "new", bad], "");
        assert_eq!(code, 2, "{bad}: {err}");
    }
    // A second run into the same directory is refused, not overwritten.
    let (code, _, err) = cli(
        root,
        &[
            "plugin",
            "new",
            "orders",
            "--dir",
            crate_dir.to_str().unwrap(),
        ],
        "",
    );
    assert_eq!(code, 2, "{err}");

    // Build it as its author would, sharing the plugins workspace's target
    // dir and lock file so the SDK and Arrow are not compiled again.
    let plugins = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../plugins");
    std::fs::copy(plugins.join("Cargo.lock"), crate_dir.join("Cargo.lock")).unwrap();
    let cargo = |args: &[&str]| {
        let out = std::process::Command::new(std::env::var("CARGO").unwrap_or("cargo".into()))
            .args(args)
            .arg("--target-dir")
            .arg(plugins.join("target"))
            .current_dir(&crate_dir)
            .env_remove("RUSTC_WORKSPACE_WRAPPER")
            .env_remove("RUSTC_WRAPPER")
            .env_remove("CARGO_TARGET_DIR")
            .env_remove("RUSTFLAGS")
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "cargo {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    cargo(&["test", "--quiet"]);
    cargo(&["build", "--release", "--target", "wasm32-wasip2"]);
    let component = plugins.join("target/wasm32-wasip2/release/orders.wasm");
    assert!(component.is_file(), "{}", component.display());
    let component = component.to_str().unwrap();

    let samples = crate_dir.join("samples.jsonl");
    let (code, out, err) = cli(
        root,
        &[
            "plugin",
            "check",
            component,
            "--sample",
            samples.to_str().unwrap(),
        ],
        "",
    );
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("2 sample record(s): accepted"), "{out}");
    assert!(!out.contains("problem:"), "{out}");
    assert!(!out.contains("warning:"), "{out}");

    // And it serves a store: the clock fills created_at; rules refuse.
    let (code, _, err) = cli(
        root,
        &["store", "create", "orders", "--plugin", component],
        "",
    );
    assert_eq!(code, 0, "{err}");
    let (code, _, err) = cli(
        root,
        &["store", "add", "orders", samples.to_str().unwrap()],
        "",
    );
    assert_eq!(code, 0, "{err}");
    let (code, out, err) = cli(root, &["--json", "store", "get", "orders", "o1"], "");
    assert_eq!(code, 0, "{err}");
    let o1: Value = serde_json::from_str(out.trim()).unwrap();
    assert!(o1["created_at"].is_string(), "{o1}");
    let (code, _, err) = cli(
        root,
        &["store", "add", "orders", "-"],
        r#"{"id": "o3", "customer": "c", "amount_cents": -5, "currency": "XYZ"}"#,
    );
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("amount_cents must be at least 0"), "{err}");
}

const DEFAULTS_SPEC: &str = r#"{
  "name": "tickets",
  "key": "id",
  "columns": [
    {"name": "id", "type": "Utf8", "nullable": false},
    {"name": "status", "type": "Utf8", "nullable": false, "rules": {"one_of": ["open", "closed"], "default": "open"}},
    {"name": "priority", "type": "Int32", "nullable": false, "rules": {"min": 1, "max": 5, "default": 3}},
    {"name": "opened_at", "type": "Timestamp(µs, \"UTC\")", "nullable": false, "rules": {"default": "now"}},
    {"name": "urgent", "type": "Boolean", "rules": {"default": false}},
    {"name": "embedding", "type": "FixedSizeList(3 x Float32)"}
  ],
  "vectors": [{"column": "embedding", "dimension": 3, "metric": "cosine"}]
}"#;

/// A declarative spec fills defaults (the clock for a timestamp, constants
/// otherwise), checks vectors (finite; not zero under cosine), refuses a
/// default of the wrong type, and `describe` shows its rules as written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spec_fills_defaults_checks_vectors_and_shows_its_rules_as_written() {
    use arrow_array::cast::AsArray;
    use arrow_array::types::{Int32Type, TimestampMicrosecondType};
    use lance_context_host::spec::SchemaSpec;
    use lance_context_host::{PipelineError, PluginError, rows_from_json};

    let dir = tempfile::tempdir().unwrap();
    let reg = registry(dir.path());
    let spec = SchemaSpec::from_json(DEFAULTS_SPEC).unwrap();
    let named = reg
        .create("t", CreateOptions::new(SchemaSource::Spec(spec)))
        .await
        .unwrap();
    let named = &named;
    let add = |lines: &str| {
        let batch = rows_from_json(named.plugin(), lines.as_bytes());
        async move { named.add(&batch?).await.map(drop) }
    };
    let before = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_micros() as i64;
    add(r#"{"id": "a"}"#).await.unwrap();
    add(r#"{"id": "b", "status": "closed", "priority": 5, "opened_at": "2026-01-01T00:00:00Z", "urgent": true}"#)
        .await
        .unwrap();
    let got = named.lookup(&["a", "b"], None).await.unwrap();
    let column = |name: &str| got.column_by_name(name).unwrap().clone();
    let status = column("status");
    let status: Vec<&str> = status.as_string::<i32>().iter().flatten().collect();
    assert_eq!(status, ["open", "closed"]);
    let priority = column("priority");
    let priority: Vec<i32> = priority
        .as_primitive::<Int32Type>()
        .iter()
        .flatten()
        .collect();
    assert_eq!(priority, [3, 5]);
    let opened = column("opened_at");
    let opened = opened.as_primitive::<TimestampMicrosecondType>();
    assert!(opened.value(0) >= before, "filled from the clock");
    assert_eq!(opened.value(1), 1_767_225_600_000_000, "given, kept");
    let urgent = column("urgent");
    assert!(!urgent.as_boolean().value(0));
    assert!(urgent.as_boolean().value(1));

    // Vectors: a zero vector under cosine, a NaN element (Arrow input can
    // carry one; JSON cannot).
    let err = add(r#"{"id": "z", "embedding": [0, 0, 0]}"#)
        .await
        .unwrap_err();
    let PipelineError::Plugin(PluginError::Rejected { errors, .. }) = &err else {
        panic!("{err}")
    };
    assert_eq!(errors[0].code, "non_zero", "{err}");
    let nan = {
        use arrow_array::{ArrayRef, FixedSizeListArray, Float32Array, RecordBatch, StringArray};
        use arrow_schema::{DataType, Field, Schema};
        let item = Arc::new(Field::new("item", DataType::Float32, true));
        let values = Float32Array::from(vec![1.0, f32::NAN, 0.5]);
        let list = FixedSizeListArray::new(item.clone(), 3, Arc::new(values), None);
        RecordBatch::try_new(
            Arc::new(Schema::new(vec![
                Field::new("id", DataType::Utf8, false),
                Field::new("embedding", DataType::FixedSizeList(item, 3), true),
            ])),
            vec![
                Arc::new(StringArray::from(vec!["n"])) as ArrayRef,
                Arc::new(list),
            ],
        )
        .unwrap()
    };
    let err = named.add(&nan).await.unwrap_err();
    let PipelineError::Plugin(PluginError::Rejected { errors, .. }) = &err else {
        panic!("{err}")
    };
    assert_eq!(errors[0].code, "finite", "{err}");
    assert_eq!(
        named.count(None).await.unwrap(),
        2,
        "refused adds write nothing"
    );

    // Shown as written: integers stay integers, the rules and defaults are
    // in the spec (not an escaped parameter).
    let shown = reg.describe("t").unwrap().for_display();
    assert_eq!(
        shown["spec"]["columns"][2]["rules"],
        serde_json::json!({"min": 1, "max": 5, "default": 3})
    );
    assert_eq!(shown["spec"]["columns"][3]["rules"]["default"], "now");
    assert_eq!(shown["params"], serde_json::json!([]));

    // A default of the wrong type is refused at create, naming the field.
    for (column, default, says) in [
        (2, "300000000000", "Int32"),
        (3, "\"yesterday\"", "now"),
        (4, "\"no\"", "boolean"),
        (0, "\"same-key\"", "key column"),
        (1, "\"green\"", "not one of"),
        (2, "100", "above max"),
    ] {
        let mut spec = SchemaSpec::from_json(DEFAULTS_SPEC).unwrap();
        spec.columns[column].rules.default = Some(serde_json::from_str(default).unwrap());
        let err = reg
            .create("bad", CreateOptions::new(SchemaSource::Spec(spec)))
            .await
            .map(drop)
            .unwrap_err();
        let text = err.to_string();
        assert!(
            text.contains(&format!("columns[{column}].rules.default")) && text.contains(says),
            "{text}"
        );
    }
}
