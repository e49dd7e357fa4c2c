//! The `lance-context` binary, spawned for real on temporary roots: JSON
//! output shapes, exit codes per error kind, bad input files (nothing
//! written), dry runs, export → import round trips in every format, time
//! travel, search, completions and the demo run twice.

use std::path::Path;

use serde_json::Value;

use crate::support::cli;

const NOTES: &str = r#"{"name": "notes", "key": "id", "columns": [
    {"name": "id", "type": "Utf8", "nullable": false},
    {"name": "n", "type": "Int32", "rules": {"min": 0}},
    {"name": "tag", "type": "Utf8"},
    {"name": "at", "type": "Timestamp(Microsecond, None)"},
    {"name": "blob", "type": "LargeBinary"}]}"#;

/// Run with `--json`; (exit code, stdout's JSON lines, stderr).
fn json(root: &Path, args: &[&str], stdin: &str) -> (i32, Vec<Value>, String) {
    let mut all = vec!["--json"];
    all.extend_from_slice(args);
    let (code, out, err) = cli(root, &all, stdin);
    let values = out
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON: {l}: {e}")))
        .collect();
    (code, values, err)
}

/// Run and expect success; stdout's JSON lines.
fn ok(root: &Path, args: &[&str]) -> Vec<Value> {
    let (code, values, err) = json(root, args, "");
    assert_eq!(code, 0, "{args:?}: {err}");
    values
}

fn keys(v: &Value) -> Vec<&str> {
    let mut k: Vec<&str> = v
        .as_object()
        .unwrap_or_else(|| panic!("not an object: {v}"))
        .keys()
        .map(String::as_str)
        .collect();
    k.sort();
    k
}

/// A root with store `notes` (from a spec file); the spec file's path.
fn notes_root(root: &Path) -> String {
    let spec = root.join("notes.json");
    std::fs::write(&spec, NOTES).unwrap();
    let spec = spec.to_str().unwrap().to_string();
    ok(root, &["store", "create", "notes", "--spec", &spec]);
    spec
}

fn count(root: &Path, store: &str) -> u64 {
    ok(root, &["store", "count", store])[0]["count"]
        .as_u64()
        .unwrap()
}

const ROWS: &str = "{\"id\": \"a\", \"n\": 1, \"tag\": \"x\", \"at\": \"2026-11-30T10:00:00\", \"blob\": \"AP8=\"}\n\
                    {\"id\": \"b\", \"n\": 2, \"tag\": \"y\"}\n\
                    \n\
                    {\"id\": \"c\", \"n\": 3}\n";

#[test]
fn json_output_has_stable_shapes() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let spec = root.join("notes.json");
    std::fs::write(&spec, NOTES).unwrap();
    let created = ok(
        root,
        &["store", "create", "notes", "--spec", spec.to_str().unwrap()],
    );
    assert_eq!(
        keys(&created[0]),
        [
            "columns",
            "plugin",
            "plugin_version",
            "sha256",
            "store",
            "uri"
        ]
    );
    let (code, added, err) = json(root, &["store", "add", "notes", "-"], ROWS);
    assert_eq!(code, 0, "{err}");
    assert_eq!(
        keys(&added[0]),
        [
            "batches",
            "dry_run",
            "records",
            "records_per_second",
            "rejected",
            "seconds",
            "store"
        ]
    );
    assert_eq!(added[0]["records"], 3);
    let listed = ok(root, &["store", "list"]);
    assert_eq!(listed.len(), 1);
    assert_eq!(
        keys(&listed[0]),
        ["name", "plugin", "plugin_version", "state", "uri"]
    );
    let described = ok(root, &["store", "describe", "notes"]);
    assert_eq!(described[0]["name"], "notes");
    assert_eq!(described[0]["spec"]["key"], "id");
    // Records: one object per row, as `store add` reads them.
    let rows = ok(root, &["store", "scan", "notes", "--order-by", "id"]);
    assert_eq!(rows.len(), 3);
    assert_eq!(rows[0]["id"], "a");
    assert_eq!(rows[0]["n"], 1);
    let got = ok(root, &["store", "get", "notes", "b"]);
    assert_eq!(got[0]["tag"], "y");
    assert_eq!(ok(root, &["store", "count", "notes"])[0]["count"], 3);
    assert_eq!(
        ok(root, &["store", "count", "notes", "--filter", "n >= 2"])[0]["count"],
        2
    );
    let status = ok(root, &["store", "status", "notes"]);
    for k in [
        "bytes_on_disk",
        "fragments",
        "indexes",
        "pending_generations",
        "rows",
        "rows_in_base",
        "unmerged_rows",
        "version",
        "versions",
        "maintenance",
        "shard_manifests",
    ] {
        assert!(
            status[0].get(k).is_some(),
            "status lacks {k}: {}",
            status[0]
        );
    }
    let manifests = status[0]["shard_manifests"].as_array().unwrap();
    assert!(
        manifests
            .iter()
            .any(|m| m["versions"].as_u64() > Some(0) && m["newest_bytes"].as_u64() > Some(0)),
        "{}",
        status[0]
    );
    let merged = ok(root, &["store", "merge", "notes"]);
    assert_eq!(merged[0]["rows_upserted"], 3, "{}", merged[0]);
    for k in ["generations_merged", "keys_deleted", "passes", "seconds"] {
        assert!(merged[0].get(k).is_some(), "merge lacks {k}");
    }
    let compacted = ok(root, &["store", "compact", "notes"]);
    for k in [
        "fragments_added",
        "fragments_removed",
        "files_added",
        "files_removed",
    ] {
        assert!(compacted[0].get(k).is_some(), "compact lacks {k}");
    }
    let versions = ok(root, &["store", "versions", "notes"]);
    assert!(!versions.is_empty());
    assert_eq!(keys(&versions[0]), ["current", "timestamp", "version"]);
    assert_eq!(
        versions.iter().filter(|v| v["current"] == true).count(),
        1,
        "{versions:?}"
    );
    let deleted = ok(root, &["store", "delete", "notes", "a", "zz"]);
    assert_eq!(deleted[0], serde_json::json!({"key": "a", "deleted": true}));
    assert_eq!(
        deleted[1],
        serde_json::json!({"key": "zz", "deleted": false})
    );
    let inspected = ok(root, &["plugin", "inspect", "rollout"]);
    assert_eq!(inspected[0]["plugin"], "rollout");
    assert_eq!(inspected[0]["key"], "id");
    assert!(inspected[0]["columns"].as_array().unwrap().len() > 30);
    assert_eq!(
        keys(&inspected[0]["columns"][0]),
        ["metadata", "name", "nullable", "type"]
    );
    let plugins = ok(root, &["plugin", "list", "--root", "data"]);
    let names: Vec<&str> = plugins
        .iter()
        .map(|p| p["plugin"].as_str().unwrap())
        .collect();
    assert!(
        names.starts_with(&["rollout", "context", "datagen"]),
        "{names:?}"
    );
    let notes = plugins.iter().find(|p| p["plugin"] == "notes").unwrap();
    assert_eq!(notes["stores"], serde_json::json!(["notes"]));
    let queries = ok(root, &["store", "query", "notes"]);
    assert!(queries.is_empty());
    // An error, with --json, is one JSON object on stderr.
    let (code, _, err) = json(root, &["store", "describe", "nope"], "");
    assert_eq!(code, 3);
    let e: Value = serde_json::from_str(err.trim()).unwrap();
    assert_eq!(e["error"]["kind"], "not_found");
    assert_eq!(e["error"]["exit_code"], 3);
}

#[test]
fn exit_codes_follow_the_error_kind() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let spec = notes_root(root);
    let code = |args: &[&str]| {
        let (code, out, err) = cli(root, args, "");
        (code, format!("{out}{err}"))
    };
    // 4: exists.
    let (c, e) = code(&["store", "create", "notes", "--spec", &spec]);
    assert_eq!(c, 4, "{e}");
    // 3: no such store, key, version or file.
    let (c, e) = code(&["store", "scan", "nope"]);
    assert_eq!(c, 3, "{e}");
    let (c, e) = code(&["store", "add", "notes", "/no/such/file.jsonl"]);
    assert_eq!(c, 3, "{e}");
    let (c, e) = code(&["store", "get", "notes", "missing"]);
    assert_eq!(c, 3, "{e}");
    assert!(e.contains("missing"), "{e}");
    let (c, e) = code(&["store", "scan", "notes", "--as-of", "999"]);
    assert_eq!(c, 3, "{e}");
    assert!(e.contains("version 999"), "{e}");
    let (c, e) = code(&["count", "--uri", root.join("nowhere").to_str().unwrap()]);
    assert_eq!(c, 3, "{e}");
    // 2: invalid input — a bad filter, a bad --param, a declaration that
    // breaks the rules, an unknown built-in, a bad order, a bad vector.
    let (c, e) = code(&["store", "scan", "notes", "--filter", "nope = 1"]);
    assert_eq!(c, 2, "{e}");
    let (c, e) = code(&["store", "scan", "notes", "--order-by", "n:sideways"]);
    assert_eq!(c, 2, "{e}");
    let (c, e) = code(&[
        "store",
        "create",
        "ctx",
        "--plugin",
        "context",
        "--param",
        "embedding_dim=-3",
    ]);
    assert_eq!(c, 2, "{e}");
    let (c, e) = code(&["plugin", "inspect", "context", "--param", "bogus=1"]);
    assert_eq!(c, 2, "{e}");
    // An unquoted text value: the message says values are JSON.
    let (c, e) = code(&[
        "plugin",
        "inspect",
        "context",
        "--param",
        "distance_metric=cosine",
    ]);
    assert_eq!(c, 2, "{e}");
    assert!(e.contains("text in double quotes"), "{e}");
    let bad_spec = root.join("bad.json");
    std::fs::write(
        &bad_spec,
        r#"{"name": "bad", "key": "id", "columns": [{"name": "id", "type": "Int32"}]}"#,
    )
    .unwrap();
    let (c, e) = code(&[
        "store",
        "create",
        "bad",
        "--spec",
        bad_spec.to_str().unwrap(),
    ]);
    assert_eq!(c, 2, "{e}");
    let (c, e) = code(&["store", "create", "x", "--plugin", "nosuch"]);
    assert_eq!(c, 2, "{e}");
    let (c, e) = code(&["store", "drop", "notes"]);
    assert_eq!(c, 2, "{e}");
    assert!(e.contains("--yes"), "{e}");
    // Usage errors (clap) are 2 as well.
    let (c, _) = code(&["store", "get", "notes"]);
    assert_eq!(c, 2);
    // Not a vector store.
    let (c, e) = code(&["store", "index", "notes"]);
    assert_eq!(c, 2, "{e}");
    // The store is untouched by all of it.
    assert_eq!(count(root, "notes"), 0);
    let (c, e) = code(&["store", "drop", "notes", "--yes"]);
    assert_eq!(c, 0, "{e}");
    let (c, e) = code(&["store", "describe", "notes"]);
    assert_eq!(c, 3, "{e}");
}

/// Every kind of bad file is refused with its line (or row), and nothing
/// from it is written.
#[test]
fn bad_files_are_refused_by_line_and_write_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    notes_root(root);
    let file = |name: &str, bytes: &[u8]| {
        let p = root.join(name);
        std::fs::write(&p, bytes).unwrap();
        p.to_str().unwrap().to_string()
    };
    let cases: Vec<(&str, String, &str)> = vec![
        (
            "truncated line",
            file(
                "t.jsonl",
                b"{\"id\": \"a\", \"n\": 1}\n{\"id\": \"b\", \"n\"",
            ),
            "line 2",
        ),
        (
            "wrong type",
            file(
                "w.jsonl",
                b"{\"id\": \"a\", \"n\": 1}\n\n{\"id\": \"b\", \"n\": \"many\"}\n",
            ),
            "line 3",
        ),
        (
            "unknown column",
            file(
                "u.jsonl",
                b"{\"id\": \"a\"}\n{\"id\": \"b\"}\n{\"id\": \"c\", \"colour\": 1}\n",
            ),
            "line 3",
        ),
        (
            "not UTF-8",
            file("b.jsonl", b"{\"id\": \"a\"}\n{\"id\": \"\xff\xfe\"}\n"),
            "line 2: not UTF-8",
        ),
        ("empty file", file("e.jsonl", b"\n\n"), "no records"),
        (
            "a rule broken",
            file(
                "r.jsonl",
                b"{\"id\": \"a\", \"n\": 1}\n{\"id\": \"b\", \"n\": -5}\n",
            ),
            "line 2",
        ),
        (
            "corrupt Parquet",
            file("c.parquet", b"PAR1 this is not parquet at all"),
            "not a Parquet file",
        ),
        (
            "corrupt Arrow",
            file("c.arrow", b"ARROW1\0\0garbage"),
            "not an Arrow IPC file",
        ),
    ];
    for (what, path, says) in cases {
        let (code, out, err) = cli(root, &["store", "add", "notes", &path], "");
        assert_eq!(code, 2, "{what}: {out}{err}");
        assert!(err.contains(says), "{what}: expected '{says}' in: {err}");
        assert!(
            err.contains("nothing added") || what == "empty file" || what.starts_with("corrupt"),
            "{what}: {err}"
        );
        assert_eq!(count(root, "notes"), 0, "{what}: nothing is written");
    }
    // With batches of one record, the batches before the bad line stay and
    // the message says how many.
    let path = file(
        "later.jsonl",
        b"{\"id\": \"a\"}\n{\"id\": \"b\"}\n{\"id\": \"c\", \"n\": -1}\n{\"id\": \"d\"}\n",
    );
    let (code, _, err) = cli(
        root,
        &["store", "add", "notes", &path, "--batch-rows", "1"],
        "",
    );
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("line 3"), "{err}");
    assert!(err.contains("2 record(s) added before this batch"), "{err}");
    assert_eq!(count(root, "notes"), 2);
}

#[test]
fn a_dry_run_checks_everything_and_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    notes_root(root);
    let (code, out, err) = json(root, &["store", "add", "notes", "-", "--dry-run"], ROWS);
    assert_eq!(code, 0, "{err}");
    assert_eq!(out[0]["dry_run"], true);
    assert_eq!(out[0]["records"], 3);
    assert_eq!(count(root, "notes"), 0);
    // A dry run finds what the plugin would refuse.
    let (code, _, err) = cli(
        root,
        &["store", "add", "notes", "-", "--dry-run"],
        "{\"id\": \"a\", \"n\": -1}\n",
    );
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("line 1"), "{err}");
    assert_eq!(count(root, "notes"), 0);
    // A dry run claims no writer: the store's version is unchanged.
    let versions = ok(root, &["store", "versions", "notes"]);
    let (code, _, err) = cli(root, &["store", "add", "notes", "-", "--dry-run"], ROWS);
    assert_eq!(code, 0, "{err}");
    assert_eq!(ok(root, &["store", "versions", "notes"]), versions);
}

fn sorted_rows(root: &Path, store: &str) -> Vec<Value> {
    ok(
        root,
        &[
            "store",
            "scan",
            store,
            "--order-by",
            "id",
            "--columns",
            "id,n,tag,at,blob",
        ],
    )
}

#[test]
fn export_then_import_round_trips_in_every_format() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let spec = notes_root(root);
    let mut rows = String::new();
    for i in 0..2500 {
        rows.push_str(&format!(
            "{{\"id\": \"k{i:05}\", \"n\": {i}, \"tag\": \"t{}\", \"at\": \"2026-11-30T10:00:{:02}\", \"blob\": \"{:04}\"}}\n",
            i % 7,
            i % 60,
            i % 10_000
        ));
    }
    let (code, _, err) = cli(
        root,
        &["store", "add", "notes", "-", "--batch-rows", "1000"],
        &rows,
    );
    assert_eq!(code, 0, "{err}");
    let original = sorted_rows(root, "notes");
    assert_eq!(original.len(), 2500);
    for (format, file) in [
        ("jsonl", "out.jsonl"),
        ("arrow", "out.arrow"),
        ("parquet", "out.parquet"),
    ] {
        let path = root.join(file);
        let path = path.to_str().unwrap();
        let exported = ok(
            root,
            &["store", "export", "notes", "--format", format, "-o", path],
        );
        assert_eq!(exported[0]["records"], 2500, "{format}");
        let copy = format!("copy_{format}");
        ok(root, &["store", "create", &copy, "--spec", &spec]);
        // By extension, no --format.
        let added = ok(root, &["store", "add", &copy, path, "--batch-rows", "700"]);
        assert_eq!(added[0]["records"], 2500, "{format}");
        assert_eq!(added[0]["batches"], 4, "{format}");
        assert_eq!(sorted_rows(root, &copy), original, "{format} round trip");
    }
    // Filtered export to stdout, as JSON Lines.
    let (code, out, err) = cli(
        root,
        &["store", "export", "notes", "--filter", "n < 10"],
        "",
    );
    assert_eq!(code, 0, "{err}");
    assert_eq!(out.lines().count(), 10);
    // An Arrow stream on stdin.
    let (code, _, err) = cli(
        root,
        &[
            "store", "export", "notes", "--format", "arrow", "-o", "s.arrows", "--filter", "n < 5",
        ],
        "",
    );
    assert_eq!(code, 0, "{err}");
    ok(root, &["store", "create", "from_stdin", "--spec", &spec]);
    let stream = std::fs::read(root.join("s.arrows")).unwrap();
    let (code, _, err) = cli(
        root,
        &["store", "add", "from_stdin", "-", "--format", "arrow"],
        stream,
    );
    assert_eq!(code, 0, "{err}");
    assert_eq!(count(root, "from_stdin"), 5);
    // A Parquet file whose column is of another type is refused, naming it.
    let other = root.join("other.parquet");
    {
        use arrow_array::{Float64Array, RecordBatch, StringArray};
        use arrow_schema::{DataType, Field, Schema};
        use std::sync::Arc;
        let schema = Arc::new(Schema::new(vec![
            Field::new("id", DataType::Utf8, false),
            Field::new("n", DataType::Float64, true),
        ]));
        let batch = RecordBatch::try_new(
            schema.clone(),
            vec![
                Arc::new(StringArray::from(vec!["z"])),
                Arc::new(Float64Array::from(vec![1.5])),
            ],
        )
        .unwrap();
        let mut w = parquet::arrow::ArrowWriter::try_new(
            std::fs::File::create(&other).unwrap(),
            schema,
            None,
        )
        .unwrap();
        w.write(&batch).unwrap();
        w.close().unwrap();
    }
    let (code, _, err) = cli(
        root,
        &["store", "add", "from_stdin", other.to_str().unwrap()],
        "",
    );
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("column 'n'") && err.contains("rows 1–1"),
        "{err}"
    );
    assert_eq!(count(root, "from_stdin"), 5);
}

#[test]
fn time_travel_reads_an_earlier_version() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    notes_root(root);
    let (code, _, err) = cli(root, &["store", "add", "notes", "-"], ROWS);
    assert_eq!(code, 0, "{err}");
    ok(root, &["store", "merge", "notes"]);
    let before = ok(root, &["store", "versions", "notes"]);
    let merged_version = before.last().unwrap()["version"].as_u64().unwrap();
    let (code, _, err) = cli(
        root,
        &["store", "add", "notes", "-"],
        "{\"id\": \"d\", \"n\": 4}\n{\"id\": \"a\", \"n\": 100}\n",
    );
    assert_eq!(code, 0, "{err}");
    ok(root, &["store", "merge", "notes"]);
    assert_eq!(count(root, "notes"), 4);
    let v = merged_version.to_string();
    let old = ok(root, &["store", "count", "notes", "--as-of", &v]);
    assert_eq!(old[0]["count"], 3);
    let a = ok(root, &["store", "get", "notes", "a", "--as-of", &v]);
    assert_eq!(a[0]["n"], 1, "the value as of that version");
    let now = ok(root, &["store", "get", "notes", "a"]);
    assert_eq!(now[0]["n"], 100);
    let exported = ok(root, &["store", "export", "notes", "--as-of", &v]);
    assert_eq!(exported.len(), 3);
}

#[test]
fn the_demo_runs_twice_and_the_cli_reads_what_it_wrote() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let data = root.join("demo");
    let data = data.to_str().unwrap();
    let (code, first, err) = json(root, &["demo", "--data", data, "--rollouts", "8"], "");
    assert_eq!(code, 0, "{err}");
    // A normal run has nothing to report: no log line (Lance logs an error
    // for its MemWAL index on every scalar-index load; the default filter
    // leaves that out).
    assert!(err.trim().is_empty(), "a normal run logs nothing: {err}");
    let report = &first[0];
    assert_eq!(report["run"], 1);
    let steps: Vec<&str> = report["steps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["step"].as_str().unwrap())
        .collect();
    for step in [
        "stores",
        "load",
        "refused batch",
        "merge",
        "compact",
        "vector index",
        "point lookup",
        "filtered scan",
        "vector search",
        "trajectory",
        "item fold",
        "user query",
        "fresh reader",
    ] {
        assert!(steps.contains(&step), "{step} missing from {steps:?}");
    }
    assert_eq!(report["counts"]["rollouts"], 320);
    let second = ok(root, &["demo", "--data", data, "--rollouts", "8"]);
    assert_eq!(second[0]["run"], 2);
    assert_eq!(second[0]["counts"]["rollouts"], 640);
    assert_eq!(second[0]["counts"]["tickets"], 160);
    // The stores it made are ordinary stores.
    let listed = ok(root, &["store", "--root", data, "list"]);
    assert_eq!(listed.len(), 4);
    let near = ok(
        root,
        &[
            "store",
            "--root",
            data,
            "search",
            "memories",
            "--column",
            "embedding",
            "--vector",
            &format!("[{}]", vec!["0.5"; 32].join(",")),
            "--k",
            "3",
        ],
    );
    assert_eq!(near.len(), 3);
    let (code, _, err) = cli(
        root,
        &[
            "store",
            "--root",
            data,
            "search",
            "memories",
            "--column",
            "embedding",
            "--vector",
            "1,2",
        ],
        "",
    );
    assert_eq!(code, 2, "a vector of the wrong length: {err}");
    // Full-text search of the declared text column, and hybrid retrieval.
    let words = ok(
        root,
        &[
            "store",
            "--root",
            data,
            "search",
            "memories",
            "--column",
            "text_payload",
            "--text",
            "agent noted",
            "--k",
            "4",
        ],
    );
    assert_eq!(words.len(), 4);
    assert!(
        words.iter().all(|w| w["_score"].as_f64().unwrap() > 0.0),
        "{words:?}"
    );
    let fused = ok(
        root,
        &[
            "store",
            "--root",
            data,
            "retrieve",
            "memories",
            "--vector-column",
            "embedding",
            "--vector",
            &format!("[{}]", vec!["0.5"; 32].join(",")),
            "--text-column",
            "text_payload",
            "--text",
            "observation",
            "--k",
            "5",
            "--where",
            "tenant=acme",
            "--where",
            "id~mem",
        ],
    );
    assert!(!fused.is_empty() && fused.len() <= 5, "{fused:?}");
    assert!(fused.iter().all(|f| f["tenant"] == "acme"), "{fused:?}");
    assert!(fused[0]["_rrf_score"].as_f64().unwrap() > 0.0);
    for (args, why) in [
        (
            vec!["--column", "embedding", "--text", "x"],
            "a vector column searched for text",
        ),
        (vec!["--column", "nope", "--text", "x"], "an unknown column"),
        (
            vec![
                "--column",
                "text_payload",
                "--text",
                "x",
                "--where",
                "nope=1",
            ],
            "an unknown column in --where",
        ),
        (
            vec!["--column", "text_payload"],
            "neither --text nor --vector",
        ),
    ] {
        let mut all = vec!["store", "--root", data, "search", "memories"];
        all.extend(args);
        let (code, _, err) = cli(root, &all, "");
        assert_eq!(code, 2, "{why}: {err}");
    }
    let built = ok(root, &["store", "--root", data, "index", "memories"]);
    assert_eq!(built[0]["column"], "embedding");
    let state = cli(
        root,
        &[
            "store",
            "--root",
            data,
            "query",
            "events",
            "item_state",
            "--arg",
            "item_id=r1-item-0",
        ],
        "",
    );
    assert_eq!(state.0, 0, "{}", state.2);
    let state: Value = serde_json::from_str(state.1.trim()).unwrap();
    assert!(state["item"]["status"].is_string(), "{state}");

    // The dataset-level commands read the same data by URI.
    let uri = format!("{data}/stores/tickets");
    let n = ok(root, &["count", "--uri", &uri])[0]["count"]
        .as_u64()
        .unwrap();
    assert_eq!(n, 160);
    let rows = ok(
        root,
        &["scan", "--uri", &uri, "--limit", "2", "--order-by", "id"],
    );
    assert_eq!(rows.len(), 2);
    let id = rows[0]["id"].as_str().unwrap().to_string();
    assert_eq!(ok(root, &["get", "--uri", &uri, &id])[0]["id"], id.as_str());
    let status = ok(root, &["status", "--uri", &uri]);
    assert_eq!(status[0]["rows"], 160);
    assert!(
        ok(root, &["merge", "--uri", &uri])[0]
            .get("passes")
            .is_some()
    );
    assert!(
        ok(root, &["compact", "--uri", &uri])[0]
            .get("fragments_added")
            .is_some()
    );
    let (code, plan, err) = cli(root, &["scan", "--uri", &uri, "--explain"], "");
    assert_eq!(code, 0, "{err}");
    assert!(!plan.trim().is_empty());
}

/// `merge --uri URI --instance X` claims instance X, and the claim takes
/// over and merges every other shard's unmerged generations: the report
/// counts them (it said 0 generations merged).
#[test]
fn a_merge_under_another_instance_reports_what_its_claim_merged() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    notes_root(root);
    let (code, _, err) = cli(root, &["store", "add", "notes", "-"], ROWS);
    assert_eq!(code, 0, "{err}");
    let uri = ok(root, &["store", "describe", "notes"])[0]["uri"]
        .as_str()
        .unwrap()
        .to_string();
    let before = ok(root, &["status", "--uri", &uri]);
    assert!(
        before[0]["unmerged_rows"].as_u64().unwrap() > 0,
        "{before:?}"
    );
    let merged = ok(root, &["merge", "--uri", &uri, "--instance", "other"]);
    assert!(
        merged[0]["generations_merged"].as_u64().unwrap() >= 1,
        "{merged:?}"
    );
    assert_eq!(merged[0]["rows_upserted"], 3, "{merged:?}");
    let after = ok(root, &["status", "--uri", &uri]);
    assert_eq!(after[0]["unmerged_rows"], 0, "{after:?}");
}

#[test]
fn completions_are_printed_for_each_shell() {
    let dir = tempfile::tempdir().unwrap();
    for shell in ["bash", "zsh", "fish"] {
        let (code, out, err) = cli(dir.path(), &["completions", shell], "");
        assert_eq!(code, 0, "{err}");
        assert!(
            out.contains("lance-context") && out.contains("store"),
            "{shell}"
        );
    }
}

/// The host's one error kind: every typed error maps onto it, through any
/// context added on the way; the exit codes and (later) HTTP statuses are
/// one match on it.
#[test]
fn every_host_error_has_one_kind() {
    use lance_context_host::{
        ErrorKind, PipelineError, PluginError, QueryError, RegistryError, error_kind,
    };
    let kind = |e: anyhow::Error| {
        let e: &(dyn std::error::Error + 'static) = e.as_ref();
        error_kind(e)
    };
    let fault = PluginError::Timeout {
        plugin: "p".into(),
        deadline: std::time::Duration::from_secs(1),
    };
    assert_eq!(fault.kind(), ErrorKind::PluginFault);
    let wrapped = anyhow::Error::new(PipelineError::Plugin(fault)).context("line 3");
    assert_eq!(kind(wrapped), ErrorKind::PluginFault, "not invalid input");
    let rejected = PluginError::Rejected {
        plugin: "p".into(),
        errors: vec![],
        total: 1,
    };
    assert_eq!(rejected.kind(), ErrorKind::Rejected);
    assert_eq!(
        kind(RegistryError::Incomplete { name: "s".into() }.into()),
        ErrorKind::Unavailable
    );
    assert_eq!(
        kind(
            RegistryError::Store(lance_context_store::Error::Busy {
                message: "full".into()
            })
            .into()
        ),
        ErrorKind::Busy
    );
    assert_eq!(
        kind(RegistryError::NotFound { name: "s".into() }.into()),
        ErrorKind::NotFound
    );
    assert_eq!(
        kind(QueryError::Arguments("x".into()).into()),
        ErrorKind::InvalidInput
    );
    assert_eq!(
        kind(
            RegistryError::PluginTampered {
                name: "s".into(),
                path: "p".into(),
                expected: "a".into(),
                found: "b".into(),
            }
            .into()
        ),
        ErrorKind::Corrupt
    );
    assert_eq!(kind(anyhow::anyhow!("untyped")), ErrorKind::Internal);
    assert_eq!(ErrorKind::PluginFault.as_str(), "plugin_fault");
}

/// Findings of a review, each reproduced here: a copied root opens its own
/// data; exports write through devices and symlinks and leave no partial
/// file; Parquet as pyarrow writes it (list children named `element`)
/// imports; `get --columns` names blob columns; a BOM is not a problem.
#[test]
fn review_findings_stay_fixed() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let spec = notes_root(root);
    let (code, _, err) = cli(root, &["store", "add", "notes", "-"], ROWS);
    assert_eq!(code, 0, "{err}");

    // A copy of the root is a separate set of stores.
    let copy = root.join("copy");
    let status = std::process::Command::new("cp")
        .args([
            "-r",
            root.join("data").to_str().unwrap(),
            copy.to_str().unwrap(),
        ])
        .status()
        .unwrap();
    assert!(status.success());
    let copy = copy.to_str().unwrap();
    let (code, _, err) = cli(
        root,
        &["store", "--root", copy, "add", "notes", "-"],
        "{\"id\": \"only-in-copy\"}\n",
    );
    assert_eq!(code, 0, "{err}");
    assert_eq!(count(root, "notes"), 3, "the original is untouched");
    let described = ok(root, &["store", "--root", copy, "describe", "notes"]);
    assert!(
        described[0]["uri"].as_str().unwrap().starts_with(copy),
        "{}",
        described[0]
    );
    ok(root, &["store", "--root", copy, "drop", "notes", "--yes"]);
    assert_eq!(
        count(root, "notes"),
        3,
        "dropping the copy keeps the original"
    );

    // Export: a directory is refused before anything is written; a symlink
    // is followed (the link kept); nothing partial is left.
    let (code, _, err) = cli(root, &["store", "export", "notes", "-o", "."], "");
    assert_eq!(code, 2, "{err}");
    let (code, _, err) = cli(
        root,
        &["store", "export", "notes", "-o", "no/such/dir/x.jsonl"],
        "",
    );
    assert_eq!(code, 3, "{err}");
    std::fs::write(root.join("real.jsonl"), "old").unwrap();
    std::os::unix::fs::symlink(root.join("real.jsonl"), root.join("link.jsonl")).unwrap();
    ok(root, &["store", "export", "notes", "-o", "link.jsonl"]);
    assert!(
        std::fs::symlink_metadata(root.join("link.jsonl"))
            .unwrap()
            .file_type()
            .is_symlink()
    );
    assert_eq!(
        std::fs::read_to_string(root.join("real.jsonl"))
            .unwrap()
            .lines()
            .count(),
        3
    );
    // A device is written through, not replaced.
    ok(root, &["store", "export", "notes", "-o", "/dev/null"]);
    assert!(!std::fs::metadata("/dev/null").unwrap().is_file());
    let leftovers: Vec<_> = std::fs::read_dir(root)
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().ends_with(".partial"))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");

    // Parquet with a list column whose child is named `element`.
    let tagged = r#"{"name": "tagged", "key": "id", "columns": [
        {"name": "id", "type": "Utf8", "nullable": false},
        {"name": "tags", "type": "List(Utf8)"},
        {"name": "v", "type": "FixedSizeList(2 x Float32)"}]}"#;
    std::fs::write(root.join("tagged.json"), tagged).unwrap();
    ok(
        root,
        &["store", "create", "tagged", "--spec", "tagged.json"],
    );
    {
        use arrow_array::builder::{
            FixedSizeListBuilder, Float32Builder, ListBuilder, StringBuilder,
        };
        use arrow_array::{RecordBatch, StringArray};
        use std::sync::Arc;
        let mut tags = ListBuilder::new(StringBuilder::new()).with_field(Arc::new(
            arrow_schema::Field::new("element", arrow_schema::DataType::Utf8, true),
        ));
        tags.values().append_value("a");
        tags.append(true);
        let mut v = FixedSizeListBuilder::new(Float32Builder::new(), 2).with_field(Arc::new(
            arrow_schema::Field::new("element", arrow_schema::DataType::Float32, true),
        ));
        v.values().append_value(1.0);
        v.values().append_value(2.0);
        v.append(true);
        let batch = RecordBatch::try_from_iter(vec![
            (
                "id",
                Arc::new(StringArray::from(vec!["p1"])) as arrow_array::ArrayRef,
            ),
            ("tags", Arc::new(tags.finish()) as arrow_array::ArrayRef),
            ("v", Arc::new(v.finish()) as arrow_array::ArrayRef),
        ])
        .unwrap();
        let mut w = parquet::arrow::ArrowWriter::try_new(
            std::fs::File::create(root.join("pyarrow-style.parquet")).unwrap(),
            batch.schema(),
            None,
        )
        .unwrap();
        w.write(&batch).unwrap();
        w.close().unwrap();
    }
    let added = ok(root, &["store", "add", "tagged", "pyarrow-style.parquet"]);
    assert_eq!(added[0]["records"], 1);
    let row = ok(root, &["store", "get", "tagged", "p1"]);
    assert_eq!(row[0]["tags"], serde_json::json!(["a"]));

    // get --columns names a blob column; the key is always there.
    let blob = r#"{"name": "blobs", "key": "id", "blob_columns": ["b"], "columns": [
        {"name": "id", "type": "Utf8", "nullable": false},
        {"name": "b", "type": "LargeBinary"}]}"#;
    std::fs::write(root.join("blobs.json"), blob).unwrap();
    ok(root, &["store", "create", "blobs", "--spec", "blobs.json"]);
    // A byte-order mark before the first record is not a problem.
    let (code, _, err) = cli(
        root,
        &["store", "add", "blobs", "-"],
        "\u{feff}{\"id\": \"x\", \"b\": \"beef\"}\n",
    );
    assert_eq!(code, 0, "{err}");
    assert!(
        ok(root, &["store", "get", "blobs", "x"])[0]
            .get("b")
            .is_none()
    );
    let with_blob = ok(root, &["store", "get", "blobs", "x", "--columns", "b"]);
    assert_eq!(with_blob[0]["b"], "beef");
    assert_eq!(with_blob[0]["id"], "x");
    let _ = spec;
}

/// The plugin's row errors: one line per problem on stderr (or, with
/// --json, in the error's details), the records counted once each, lines
/// named in the input's numbering.
#[test]
fn rejected_records_are_named_by_line_once() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let spec = root.join("strict.json");
    std::fs::write(
        &spec,
        r#"{"name": "strict", "key": "id", "columns": [
            {"name": "id", "type": "Utf8", "nullable": false},
            {"name": "n", "type": "Int32", "rules": {"min": 0, "max": 5}},
            {"name": "s", "type": "Utf8", "rules": {"one_of": ["a"]}}]}"#,
    )
    .unwrap();
    ok(
        root,
        &[
            "store",
            "create",
            "strict",
            "--spec",
            spec.to_str().unwrap(),
        ],
    );
    let mut input = String::new();
    for i in 0..30 {
        input.push_str(&format!("{{\"id\": \"k{i}\", \"n\": 1}}\n"));
    }
    input.push_str("{\"id\": \"bad\", \"n\": 9, \"s\": \"z\"}\n");
    let (code, _, err) = cli(
        root,
        &["store", "add", "strict", "-", "--batch-rows", "20"],
        &input,
    );
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("rejected: line 31, column 'n'"), "{err}");
    assert!(err.contains("rejected: line 31, column 's'"), "{err}");
    assert!(
        err.contains("rejected 1 record(s) of the batch from line 21"),
        "{err}"
    );
    assert!(!err.contains("row 10"), "no batch-relative rows: {err}");
    let (code, _, err) = json(
        root,
        &["store", "add", "strict", "-", "--batch-rows", "20"],
        &input,
    );
    assert_eq!(code, 2);
    let e: Value = serde_json::from_str(err.trim()).expect("one JSON object on stderr");
    assert_eq!(e["error"]["kind"], "rejected");
    assert_eq!(e["error"]["details"]["row_errors"][0]["at"], "line 31");
}

/// A dirty file: every bad line is reported in one go (input problems
/// before the plugin runs), and with `--reject-file` the bad lines — input
/// problems and the plugin's refusals alike — go to the file with their
/// reasons while the rest is added: nothing lost, nothing twice.
#[test]
fn every_bad_line_is_reported_and_a_reject_file_sets_them_aside() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let spec = root.join("strict.json");
    std::fs::write(
        &spec,
        r#"{"name": "strict", "key": "id", "columns": [
            {"name": "id", "type": "Utf8", "nullable": false},
            {"name": "n", "type": "Int32", "rules": {"min": 0, "max": 5}}]}"#,
    )
    .unwrap();
    ok(
        root,
        &[
            "store",
            "create",
            "strict",
            "--spec",
            spec.to_str().unwrap(),
        ],
    );
    let lines = [
        r#"{"id": "k0", "n": 1}"#,
        r#"{not json"#,
        r#"{"id": "k1", "n": 2}"#,
        r#"{"id": "b", "n": "2"}"#,
        "",
        r#"{"id": "c", "n": 9}"#,
        r#"{"id": "k2", "n": 3}"#,
        r#"{"id": "d", "n": 1, "colour": "red"}"#,
    ];
    let input = lines.join("\n") + "\n";

    // Without a reject file: every input problem listed, nothing written.
    let (code, _, err) = cli(root, &["store", "add", "strict", "-"], &input);
    assert_eq!(code, 2, "{err}");
    for at in ["line 2:", "line 4, column 'n'", "line 8, column 'colour'"] {
        assert!(
            err.contains(&format!("refused: {at}")),
            "{at} missing: {err}"
        );
    }
    assert!(err.contains("3 record(s) do not fit the schema"), "{err}");
    assert_eq!(count(root, "strict"), 0);
    let (code, _, err) = json(root, &["store", "add", "strict", "-"], &input);
    assert_eq!(code, 2);
    let e: Value = serde_json::from_str(err.trim()).unwrap();
    let listed = e["error"]["details"]["input_errors"].as_array().unwrap();
    assert_eq!(listed.len(), 3, "{e}");
    assert_eq!(listed[1]["at"], "line 4");
    assert_eq!(listed[1]["column"], "n");

    // A dry run with a reject file writes the file, not the store.
    let rejects = root.join("rejects.jsonl");
    let reject_arg = rejects.to_str().unwrap();
    let (code, out, err) = json(
        root,
        &[
            "store",
            "add",
            "strict",
            "-",
            "--dry-run",
            "--reject-file",
            reject_arg,
        ],
        &input,
    );
    assert_eq!(code, 0, "{err}");
    assert_eq!(out[0]["records"], 3, "{out:?}");
    assert_eq!(out[0]["rejected"], 4, "{out:?}");
    assert_eq!(count(root, "strict"), 0);

    // For real: the good lines added, the bad ones in the file with why.
    let (code, out, err) = json(
        root,
        &["store", "add", "strict", "-", "--reject-file", reject_arg],
        &input,
    );
    assert_eq!(code, 0, "{err}");
    assert_eq!(out[0]["records"], 3, "{out:?}");
    assert_eq!(out[0]["rejected"], 4, "{out:?}");
    assert_eq!(count(root, "strict"), 3);
    let refused: Vec<Value> = std::fs::read_to_string(&rejects)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let at: Vec<u64> = refused
        .iter()
        .map(|r| r["line"].as_u64().unwrap())
        .collect();
    assert_eq!(at, [2, 4, 6, 8], "{refused:?}");
    assert_eq!(
        refused[0]["record"], "{not json",
        "a line that is not JSON kept as text"
    );
    assert_eq!(
        refused[1]["record"],
        serde_json::json!({"id": "b", "n": "2"})
    );
    assert_eq!(refused[1]["errors"][0]["column"], "n");
    assert_eq!(
        refused[2]["record"]["id"], "c",
        "the plugin's refusal: {refused:?}"
    );
    assert_eq!(refused[2]["errors"][0]["column"], "n");
    assert!(
        refused[2]["errors"][0]["message"]
            .as_str()
            .unwrap()
            .contains("at most 5"),
        "{refused:?}"
    );
    // Nothing lost: every non-blank line is either stored or in the file.
    let stored: Vec<Value> = ok(root, &["store", "scan", "strict"]);
    let mut ids: Vec<&str> = stored.iter().map(|r| r["id"].as_str().unwrap()).collect();
    ids.sort();
    assert_eq!(ids, ["k0", "k1", "k2"]);
    assert_eq!(stored.len() + refused.len(), 7);

    // Every record refused: nothing added, the file replaced, exit 0.
    let (code, out, err) = json(
        root,
        &["store", "add", "strict", "-", "--reject-file", reject_arg],
        r#"{"id": "k3", "n": 9}"#,
    );
    assert_eq!(code, 0, "{err}");
    assert_eq!(out[0]["records"], 0, "{out:?}");
    assert_eq!(out[0]["rejected"], 1, "{out:?}");
    assert_eq!(
        std::fs::read_to_string(&rejects).unwrap().lines().count(),
        1
    );
    assert_eq!(count(root, "strict"), 3);
}

/// The arguments that create a context store `ctx` (4-dimensional
/// embeddings).
const CREATE_CONTEXT_STORE: [&str; 7] = [
    "store",
    "create",
    "ctx",
    "--plugin",
    "context",
    "--param",
    "embedding_dim=4",
];

/// A root with a context store `ctx` (4-dimensional embeddings).
fn context_store() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    ok(dir.path(), &CREATE_CONTEXT_STORE);
    dir
}

/// With `--reject-file`, a refusal that is about the batch — a key the
/// plugin finds repeated, where each record passes on its own — blames no
/// record: the load stops and says why nothing was set aside. A repeat of a
/// record that is refused on its own is judged again once that record is
/// set aside, and added.
#[test]
fn a_repeated_key_refused_by_the_plugin_blames_no_record() {
    let dir = context_store();
    let root = dir.path();
    let input = [
        r#"{"id": "a", "run_id": "r"}"#,
        r#"{"id": "b", "run_id": "r"}"#,
        r#"{"id": "c", "run_id": "r"}"#,
        r#"{"id": "b", "run_id": "r", "text_payload": "again"}"#,
    ]
    .join("\n")
        + "\n";
    let rejects = root.join("rejects.jsonl");
    let reject_file = rejects.to_str().unwrap();
    let (code, _, err) = cli(
        root,
        &["store", "add", "ctx", "-", "--reject-file", reject_file],
        &input,
    );
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("line 4, column 'id'"), "{err}");
    assert!(err.contains("repeats an earlier record"), "{err}");
    assert!(err.contains("not set aside in the reject file"), "{err}");
    assert_eq!(std::fs::read_to_string(&rejects).unwrap(), "");
    assert_eq!(count(root, "ctx"), 0);

    // A record refused on its own (no run_id) and a later one with its id:
    // the first set aside, the second then added.
    let input = [
        r#"{"id": "e", "run_id": ""}"#,
        r#"{"id": "e", "run_id": "r", "text_payload": "good"}"#,
        r#"{"id": "f", "run_id": "r"}"#,
    ]
    .join("\n")
        + "\n";
    let (code, out, err) = json(
        root,
        &["store", "add", "ctx", "-", "--reject-file", reject_file],
        &input,
    );
    assert_eq!(code, 0, "{err}");
    assert_eq!(out[0]["records"], 2, "{out:?}");
    assert_eq!(out[0]["rejected"], 1, "{out:?}");
    let refused = std::fs::read_to_string(&rejects).unwrap();
    let refused: Value = serde_json::from_str(refused.trim()).unwrap();
    assert_eq!(refused["line"], 1, "{refused}");
    let e: Vec<Value> = ok(root, &["store", "get", "ctx", "e"]);
    assert_eq!(e[0]["text_payload"], "good", "{e:?}");
}

/// `store index` on a handful of merged rows trains the (scalar-quantised)
/// index on them: it covers every row, no warning, and searches use it.
#[test]
fn an_index_on_a_few_rows_covers_them() {
    let dir = context_store();
    let root = dir.path();
    let input: String = (0..20)
        .map(|i| {
            format!(r#"{{"id": "m{i}", "run_id": "r", "embedding": [{i}.0, 1.0, 0.5, 0.25]}}"#)
                + "\n"
        })
        .collect();
    let (code, _, err) = cli(root, &["store", "add", "ctx", "-"], &input);
    assert_eq!(code, 0, "{err}");
    let (code, _, err) = cli(root, &["store", "merge", "ctx"], "");
    assert_eq!(code, 0, "{err}");
    let (code, _, err) = cli(root, &["store", "index", "ctx"], "");
    assert_eq!(code, 0, "{err}");
    assert!(!err.contains("warning"), "{err}");
    let (code, out, err) = json(root, &["store", "index", "ctx"], "");
    assert_eq!(code, 0, "{err}");
    assert_eq!(out[0]["covers_all_rows"], true, "{out:?}");
    let (code, out, err) = json(
        root,
        &[
            "store",
            "search",
            "ctx",
            "--column",
            "embedding",
            "--vector",
            "[3.0, 1.0, 0.5, 0.25]",
            "--k",
            "1",
        ],
        "",
    );
    assert_eq!(code, 0, "{err}");
    assert_eq!(out[0]["id"], "m3", "{out:?}");
}

/// A read on a root that holds no registry is a mistyped --root: said, and
/// nothing created there.
#[test]
fn a_root_without_a_registry_is_not_created_by_reads() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    for args in [
        &["store", "list", "--root", "nowhere"][..],
        &["store", "get", "x", "k", "--root", "nowhere"],
        &["store", "describe", "x", "--root", "nowhere"],
    ] {
        let (code, _, err) = cli(root, args, "");
        assert_eq!(code, 3, "{args:?}: {err}");
        assert!(err.contains("no registry there"), "{args:?}: {err}");
    }
    assert!(!root.join("nowhere").exists());
}

/// The reject file is never the input, a directory or stdout; it is written
/// through a symlink; the engine's refusals of single records (a key that
/// exists, a repeat in the batch) are set aside like the plugin's; a refusal
/// of the whole batch (here: a default that cannot be filled for the batch)
/// is not blamed on a record.
#[test]
fn the_reject_file_is_safe_and_takes_single_record_refusals_only() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let spec = root.join("u.json");
    std::fs::write(
        &spec,
        r#"{"name": "u", "key": "id", "capabilities": ["unique_keys"], "columns": [
            {"name": "id", "type": "Utf8", "nullable": false},
            {"name": "n", "type": "Int32"}]}"#,
    )
    .unwrap();
    ok(
        root,
        &["store", "create", "u", "--spec", spec.to_str().unwrap()],
    );
    let (code, _, err) = cli(
        root,
        &["store", "add", "u", "-"],
        "{\"id\": \"a\", \"n\": 1}\n",
    );
    assert_eq!(code, 0, "{err}");
    let input = root.join("in.jsonl");
    std::fs::write(
        &input,
        "{\"id\": \"q0\", \"n\": 1}\n{\"id\": \"a\", \"n\": 2}\n{\"id\": \"q0\", \"n\": 3}\n{\"id\": \"q1\", \"n\": 4}\n",
    )
    .unwrap();
    let input_arg = input.to_str().unwrap();
    // Without a reject file the engine's refusal names the input's line.
    let (code, _, err) = cli(root, &["store", "add", "u", input_arg], "");
    assert_eq!(code, 4, "{err}");
    assert!(err.contains("line 2: id 'a' already exists"), "{err}");
    assert!(!err.contains("row 1"), "no batch-relative row: {err}");
    // Refused targets, before anything is added.
    let before = std::fs::read(&input).unwrap();
    for (target, says) in [
        (input_arg, "is the input file"),
        (root.to_str().unwrap(), "is a directory"),
        ("-", "give a file"),
    ] {
        let (code, _, err) = cli(
            root,
            &["store", "add", "u", input_arg, "--reject-file", target],
            "",
        );
        assert_eq!(code, 2, "{target}: {err}");
        assert!(err.contains(says), "{target}: {err}");
    }
    assert_eq!(
        std::fs::read(&input).unwrap(),
        before,
        "the input is untouched"
    );
    assert_eq!(count(root, "u"), 1);
    // Through a symlink: the target is written, the link kept.
    let target = root.join("rejects.jsonl");
    let link = root.join("rejects-link.jsonl");
    std::fs::write(&target, "old\n").unwrap();
    std::os::unix::fs::symlink(&target, &link).unwrap();
    let (code, out, err) = json(
        root,
        &[
            "store",
            "add",
            "u",
            input_arg,
            "--reject-file",
            link.to_str().unwrap(),
        ],
        "",
    );
    assert_eq!(code, 0, "{err}");
    assert_eq!(out[0]["records"], 2, "{out:?}");
    assert_eq!(out[0]["rejected"], 2, "{out:?}");
    assert!(link.symlink_metadata().unwrap().file_type().is_symlink());
    let refused: Vec<Value> = std::fs::read_to_string(&target)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let lines: Vec<u64> = refused
        .iter()
        .map(|r| r["line"].as_u64().unwrap())
        .collect();
    assert_eq!(lines, [2, 3], "{refused:?}");
    assert_eq!(
        refused[0]["errors"][0]["code"], "already_exists",
        "{refused:?}"
    );
    assert_eq!(
        refused[1]["record"],
        serde_json::json!({"id": "q0", "n": 3})
    );
    assert_eq!(refused[1]["errors"][0]["message"], "id 'q0' repeats line 1");
    assert_eq!(count(root, "u"), 3);

    // A default the plugin cannot fill for this batch (129 distinct values
    // in an Int8 dictionary) is the batch's problem, not its first record's.
    let spec = root.join("d.json");
    std::fs::write(
        &spec,
        r#"{"name": "d", "key": "id", "columns": [
            {"name": "id", "type": "Utf8", "nullable": false},
            {"name": "role", "type": "Dictionary(Int8, Utf8)", "nullable": false, "rules": {"default": "user"}}]}"#,
    )
    .unwrap();
    ok(
        root,
        &["store", "create", "d", "--spec", spec.to_str().unwrap()],
    );
    let mut roles: String = (0..128)
        .map(|i| format!("{{\"id\": \"e{i}\", \"role\": \"r{i}\"}}\n"))
        .collect();
    roles.push_str("{\"id\": \"e128\"}\n");
    let rejects = root.join("d-rejects.jsonl");
    let (code, _, err) = cli(
        root,
        &[
            "store",
            "add",
            "d",
            "-",
            "--reject-file",
            rejects.to_str().unwrap(),
        ],
        &roles,
    );
    assert_eq!(code, 2, "{err}");
    assert_eq!(
        std::fs::read_to_string(&rejects).unwrap(),
        "",
        "no record blamed"
    );
    assert_eq!(count(root, "d"), 0);
}

/// JSON values are never coerced: a fraction for an integer, a string for
/// a number, a number for a timestamp, a vector with a null, a NaN-like or
/// an out-of-range element or the wrong length — each refused, naming line
/// and column, and nothing written.
#[test]
fn json_values_are_not_coerced() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let spec = root.join("typed.json");
    std::fs::write(
        &spec,
        r#"{"name": "typed", "key": "id", "columns": [
            {"name": "id", "type": "Utf8", "nullable": false},
            {"name": "n", "type": "Int32"},
            {"name": "u", "type": "UInt8"},
            {"name": "at", "type": "Timestamp(Microsecond, None)"},
            {"name": "v", "type": "FixedSizeList(2 x Float32)"},
            {"name": "tags", "type": "List(Utf8)"},
            {"name": "lines", "type": "List(Struct(\"sku\": non-null Utf8, \"qty\": Int32))"}]}"#,
    )
    .unwrap();
    ok(
        root,
        &["store", "create", "typed", "--spec", spec.to_str().unwrap()],
    );
    let good = "{\"id\": \"ok\", \"n\": 3, \"u\": 255, \"at\": \"2026-11-30T10:00:00Z\", \"v\": [1.5, 2], \"tags\": [\"a\"]}\n";
    for (bad, column, says) in [
        ("\"n\": 3.99", "n", "expected an integer"),
        ("\"n\": \"2\"", "n", "expected an integer"),
        ("\"n\": 3000000000", "n", "out of range"),
        ("\"u\": -1", "u", "out of range"),
        ("\"at\": 1700000000", "at", "timestamp"),
        ("\"at\": \"yesterday\"", "at", "not a timestamp"),
        ("\"v\": [1.0]", "v", "expected 2 values"),
        ("\"v\": [1.0, null]", "v", "item 1 is null"),
        ("\"v\": [1e39, 1.0]", "v", "out of range for Float32"),
        ("\"tags\": [1]", "tags", "expected a string"),
        ("\"n\": 1, \"n\": 2", "", "given twice"),
        (
            "\"lines\": [{\"qty\": 1}]",
            "lines",
            "item 0: field 'sku' is required",
        ),
    ] {
        let input = format!("{good}{{\"id\": \"bad\", {bad}}}\n");
        let (code, _, err) = cli(root, &["store", "add", "typed", "-"], &input);
        assert_eq!(code, 2, "{bad}: {err}");
        assert!(err.contains("line 2"), "{bad}: {err}");
        if !column.is_empty() {
            assert!(err.contains(&format!("column '{column}'")), "{bad}: {err}");
        }
        assert!(err.contains(says), "{bad}: expected '{says}' in {err}");
        assert_eq!(count(root, "typed"), 0, "{bad}: nothing written");
    }
    let (code, _, err) = cli(root, &["store", "add", "typed", "-"], good);
    assert_eq!(code, 0, "{err}");
}

/// What the engine and the host report without failing a command reaches
/// stderr: as text, as `{"log": …}` JSON lines with `--json` (every stderr
/// line parses), not at all with `LANCE_CONTEXT_LOG=off`; a filter that does
/// not parse is said so and the default used. The report: a compile cache
/// entry that fails verification (recompiled, the command succeeds).
#[test]
fn warnings_reach_stderr_as_text_or_json_lines() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    // A newline in the cache's path (quoted by the warning) must not forge
    // a line of its own.
    let cache = root.join("cache\nforged line");
    let run = |args: &[&str], log: Option<&str>| -> (i32, String, String) {
        let mut command = std::process::Command::new(crate::support::cli_binary());
        command
            .args(args)
            .env("LANCE_CONTEXT_CACHE_DIR", &cache)
            .env_remove("LANCE_CONTEXT_LOG")
            .current_dir(root);
        if let Some(log) = log {
            command.env("LANCE_CONTEXT_LOG", log);
        }
        let out = command.output().unwrap();
        (
            out.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    // The plugin compiled into the private cache, then each entry spoiled.
    let create: Vec<&str> = std::iter::once("--json")
        .chain(CREATE_CONTEXT_STORE)
        .collect();
    let (code, _, err) = run(&create, None);
    assert_eq!(code, 0, "{err}");
    assert!(err.is_empty(), "nothing to report: {err}");
    let spoil = || {
        let mut spoiled = 0;
        for entry in std::fs::read_dir(&cache).unwrap() {
            let path = entry.unwrap().path();
            if path.extension().is_some_and(|e| e == "cwasm") {
                let mut bytes = std::fs::read(&path).unwrap();
                bytes[0] ^= 0xff;
                std::fs::write(&path, bytes).unwrap();
                spoiled += 1;
            }
        }
        assert!(spoiled > 0, "the plugin was cached");
    };

    spoil();
    let (code, _, err) = run(&["store", "count", "ctx"], None);
    assert_eq!(code, 0, "{err}");
    assert!(
        err.contains("WARN") && err.contains("compile cache entry failed verification"),
        "{err}"
    );
    assert!(
        err.contains("cache\\nforged line") && !err.lines().any(|l| l.starts_with("forged")),
        "control characters escaped: {err}"
    );

    spoil();
    let (code, out, err) = run(&["--json", "store", "count", "ctx"], None);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("\"count\""), "{out}");
    let lines: Vec<Value> = err
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON: {l}: {e}")))
        .collect();
    let warning = lines
        .iter()
        .find(|l| l["log"]["level"] == "WARN")
        .unwrap_or_else(|| panic!("no warning: {err}"));
    assert_eq!(
        warning["log"]["message"],
        "compile cache entry failed verification (its MAC does not match: planted, swapped or damaged); recompiling",
        "{warning}"
    );
    assert!(
        warning["log"]["target"]
            .as_str()
            .is_some_and(|t| t.starts_with("lance_context_host")),
        "{warning}"
    );
    assert!(
        warning["log"]["fields"]["path"]
            .as_str()
            .is_some_and(|p| p.ends_with(".cwasm")),
        "{warning}"
    );

    spoil();
    let (code, _, err) = run(&["store", "count", "ctx"], Some("off"));
    assert_eq!(code, 0, "{err}");
    assert!(err.is_empty(), "logging off: {err}");

    spoil();
    let (code, _, err) = run(&["store", "count", "ctx"], Some("lance_context=loud"));
    assert_eq!(code, 0, "{err}");
    assert!(
        err.contains("LANCE_CONTEXT_LOG=\"lance_context=loud\" is not a log filter")
            && err.contains("compile cache entry failed verification"),
        "the default filter is used: {err}"
    );
}
