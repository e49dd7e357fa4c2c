//! Adopting datasets written by the previous implementation (the public
//! `lance-context` 0.6.7 package): the fixtures in
//! `tests/fixtures/previous/data` were written by it
//! (`tests/fixtures/previous/make_fixtures.sh`), with rows in the base table,
//! in WAL generations and only in the WAL; `expected/*.jsonl` holds what it
//! acknowledged. Everything runs through the CLI (and the server) on copies.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use lance_context_client::StoreApi as _;
use serde_json::{Value, json};

use crate::server::ServerProc;
use crate::support::{base_table, cli, cli_binary, compile_cache};

/// The fixtures written by the previous implementation.
pub(crate) fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/previous/data")
}

/// A copy of the fixture datasets (adoption replays and merges in place).
fn copy_fixtures() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let old = dir.path().join("old");
    copy_dir(&fixtures(), &old);
    (dir, old)
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), &target).unwrap();
        }
    }
}

/// Every file under `dir` (relative path → bytes).
fn files(dir: &Path) -> BTreeMap<PathBuf, Vec<u8>> {
    let mut out = BTreeMap::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                stack.push(path);
            } else {
                out.insert(
                    path.strip_prefix(dir).unwrap().to_path_buf(),
                    std::fs::read(&path).unwrap(),
                );
            }
        }
    }
    out
}

/// What the previous implementation acknowledged for `store`.
pub(crate) fn expected(store: &str) -> Vec<Value> {
    std::fs::read_to_string(fixtures().join(format!("expected/{store}.jsonl")))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

pub(crate) fn json_lines(text: &str) -> Vec<Value> {
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect()
}

/// `expected`'s fields equal in `got` (numbers within float32 precision).
fn same_values(expected: &Value, got: &Value) -> bool {
    match (expected, got) {
        (Value::Number(a), Value::Number(b)) => {
            (a.as_f64().unwrap() - b.as_f64().unwrap()).abs() < 1e-5
        }
        (Value::Array(a), Value::Array(b)) => {
            a.len() == b.len() && a.iter().zip(b).all(|(x, y)| same_values(x, y))
        }
        (Value::Object(a), Value::Object(b)) => a
            .iter()
            .all(|(k, v)| same_values(v, b.get(k).unwrap_or(&Value::Null))),
        (a, b) => a == b,
    }
}

/// The key column of a fixture store.
fn key_of(store: &str) -> &'static str {
    match store {
        "datagen" => "event_id",
        _ => "id",
    }
}

/// Adopt `store` (a dry run first, which changes nothing), read back
/// every acknowledged row, add one, merge, compact; the merged dataset
/// read by plain Lance holds every key once.
async fn adopt_and_check(store: &str, readable_before: usize, new_record: Value) {
    let (dir, old) = copy_fixtures();
    let root = dir.path().join("root");
    std::fs::create_dir_all(&root).unwrap();
    let uri = old.join(format!("{store}.lance"));
    let uri_s = uri.to_str().unwrap();
    let want = expected(store);

    let before = files(&uri);
    let (code, out, err) = cli(
        &root,
        &[
            "--json",
            "store",
            "adopt",
            store,
            "--uri",
            uri_s,
            "--dry-run",
        ],
        "",
    );
    assert_eq!(code, 0, "{store}: dry run: {err}");
    let report: Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(report["compatible"], true, "{report}");
    assert_eq!(report["registered"], false);
    assert!(report["inferred_from"].is_string(), "{report}");
    assert!(
        report["columns"]
            .as_array()
            .unwrap()
            .iter()
            .all(|c| c["verdict"] == "same"),
        "{store}: every column of the old schema is the plugin's: {report}"
    );
    assert_eq!(
        report["rows_before"],
        json!(readable_before),
        "{store}: what a reader saw before (the WAL-only rows not yet): {report}"
    );
    assert_eq!(files(&uri), before, "{store}: a dry run writes nothing");
    let (_, listed, _) = cli(&root, &["--json", "store", "list"], "");
    assert!(listed.trim().is_empty(), "a dry run registers nothing");

    let (code, out, err) = cli(
        &root,
        &["--json", "store", "adopt", store, "--uri", uri_s],
        "",
    );
    assert_eq!(code, 0, "{store}: {err}");
    let report: Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(report["registered"], true, "{report}");
    assert_eq!(
        report["rows_after"],
        json!(want.len()),
        "{store}: every acknowledged row is visible after adoption: {report}"
    );
    // No existing data file was rewritten (adoption adds files only).
    let after = files(&uri);
    for (path, bytes) in &before {
        if path.starts_with("data") {
            assert_eq!(
                after.get(path),
                Some(bytes),
                "{store}: {} changed",
                path.display()
            );
        }
    }

    // Every acknowledged row, with the same values.
    let key = key_of(store);
    let keys: Vec<String> = want
        .iter()
        .map(|r| r[key].as_str().unwrap().to_string())
        .collect();
    let columns: Vec<String> = want[0].as_object().unwrap().keys().cloned().collect();
    let mut args = vec!["--json", "store", "get", store];
    args.extend(keys.iter().map(String::as_str));
    let joined = columns.join(",");
    args.extend(["--columns", joined.as_str()]);
    let (code, out, err) = cli(&root, &args, "");
    assert_eq!(code, 0, "{store}: {err}");
    let got: HashMap<String, Value> = json_lines(&out)
        .into_iter()
        .map(|r| (r[key].as_str().unwrap().to_string(), r))
        .collect();
    for row in &want {
        let k = row[key].as_str().unwrap();
        let found = got
            .get(k)
            .unwrap_or_else(|| panic!("{store}: {k} acknowledged by the old system is missing"));
        assert!(same_values(row, found), "{store}: {k}: {row} != {found}");
    }
    let (_, out, _) = cli(&root, &["--json", "store", "count", store], "");
    assert_eq!(json_lines(&out)[0]["count"], json!(want.len()), "{store}");

    // It takes new records, merges and compacts.
    let (code, _, err) = cli(
        &root,
        &["--json", "store", "add", store],
        format!("{new_record}\n"),
    );
    assert_eq!(code, 0, "{store}: add: {err}");
    for op in ["merge", "compact"] {
        let (code, _, err) = cli(&root, &["--json", "store", op, store], "");
        assert_eq!(code, 0, "{store}: {op}: {err}");
    }
    let (_, out, _) = cli(&root, &["--json", "store", "count", store], "");
    assert_eq!(
        json_lines(&out)[0]["count"],
        json!(want.len() + 1),
        "{store}"
    );
    let (_, out, _) = cli(&root, &["--json", "store", "status", store], "");
    let status = &json_lines(&out)[0];
    assert_eq!(status["unmerged_rows"], 0, "{store}: {status}");

    // Plain Lance reads the merged base: every key once.
    let mut seen: HashMap<String, usize> = HashMap::new();
    for batch in base_table(uri_s, &[key]).await {
        let column = batch.column(0);
        let strings = arrow_array::cast::AsArray::as_string::<i32>(column.as_ref());
        for k in strings.iter().flatten() {
            *seen.entry(k.to_string()).or_default() += 1;
        }
    }
    assert!(
        seen.values().all(|n| *n == 1),
        "{store}: a key twice in the base"
    );
    for k in &keys {
        assert!(
            seen.contains_key(k),
            "{store}: {k} not in the merged base table"
        );
    }
    drop(dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_generic_store_adopts_with_its_base_generation_and_wal_rows() {
    adopt_and_check(
        "generic",
        60,
        json!({"id": "g-new", "user": "new", "score": 1.5, "vec": [1.0, 0.0, 0.0, 1.0]}),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rollout_store_adopts_with_the_rows_only_its_wal_held() {
    adopt_and_check(
        "rollout",
        45,
        json!({"id": "r-new", "rollout_id": "ro-d", "problem_id": "p9", "sequence_order": 0}),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_datagen_store_adopts_keyed_by_event_id() {
    adopt_and_check(
        "datagen",
        12,
        json!({"event_id": "e-new", "item_id": "item-9", "root_item_id": "item-9",
               "item_seq": 1, "checkpoint_id": "item-9\u{0}created", "event_type": "ITEM_CREATED",
               "attempt": 0, "run_id": "run-2", "writer_epoch": "w", "status": "running",
               "event_ts": "2026-01-01T00:00:00Z", "schema_version": 2}),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_context_store_adopts_with_its_versions_and_deletes_honoured() {
    adopt_and_check(
        "context",
        28,
        json!({"id": "c-new", "run_id": "r-new", "text_payload": "a note after adoption",
               "external_id": "ext-new"}),
    )
    .await;
}

/// The context capabilities on an adopted store: the record the old store
/// superseded stays hidden (it was given its back-link), the deleted one
/// stays deleted, an upsert supersedes the current version, text search
/// finds it; the named queries of rollout and datagen answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn adopted_stores_keep_the_old_semantics_and_answer_named_queries() {
    let (dir, old) = copy_fixtures();
    let root = dir.path().join("root");
    std::fs::create_dir_all(&root).unwrap();
    for store in ["context", "rollout", "datagen"] {
        let uri = old.join(format!("{store}.lance"));
        let (code, _, err) = cli(
            &root,
            &[
                "--json",
                "store",
                "adopt",
                store,
                "--uri",
                uri.to_str().unwrap(),
            ],
            "",
        );
        assert_eq!(code, 0, "{err}");
    }
    let want = expected("context");
    let revised = want.iter().find(|r| r["external_id"] == "ext-0-1").unwrap();
    let superseded = revised["supersedes_id"].as_str().unwrap();
    // Hidden from scans, present (with its back-link) to a lookup by key.
    let (_, out, _) = cli(
        &root,
        &[
            "--json",
            "store",
            "scan",
            "context",
            "--filter",
            "external_id = 'ext-0-1'",
        ],
        "",
    );
    let rows = json_lines(&out);
    assert_eq!(rows.len(), 1, "{out}");
    assert_eq!(rows[0]["text_payload"], "note 0-1, revised");
    let (_, out, _) = cli(
        &root,
        &["--json", "store", "get", "context", superseded],
        "",
    );
    let old_version = &json_lines(&out)[0];
    assert_eq!(
        old_version["superseded_by_id"], revised["id"],
        "{old_version}"
    );
    // The deleted record stays deleted.
    let (_, out, _) = cli(
        &root,
        &[
            "--json",
            "store",
            "scan",
            "context",
            "--filter",
            "external_id = 'ext-1-2'",
        ],
        "",
    );
    assert!(json_lines(&out).is_empty(), "{out}");
    // An upsert through external_id supersedes the current version.
    {
        let server = ServerProc::start(&root.join("data"), &[]);
        let upserted = server
            .client()
            .upsert(
                "context",
                &[json!({"id": "c-up", "run_id": "r", "external_id": "ext-0-1", "text_payload": "third"})],
            )
            .await
            .unwrap();
        let text = serde_json::to_string(&upserted).unwrap();
        assert!(text.contains(revised["id"].as_str().unwrap()), "{text}");
    }
    let (_, out, _) = cli(
        &root,
        &[
            "--json",
            "store",
            "scan",
            "context",
            "--filter",
            "external_id = 'ext-0-1'",
        ],
        "",
    );
    let rows = json_lines(&out);
    assert_eq!(rows.len(), 1, "{out}");
    assert_eq!(rows[0]["text_payload"], "third");
    // Full-text search over the adopted rows (the index built on adoption).
    let (code, out, err) = cli(
        &root,
        &[
            "--json",
            "store",
            "search",
            "context",
            "--column",
            "text_payload",
            "--text",
            "single",
        ],
        "",
    );
    assert_eq!(code, 0, "{err}");
    assert_eq!(json_lines(&out).len(), 4, "{out}");

    // A vector index over the adopted embeddings, and a search through it.
    let (code, _, err) = cli(&root, &["--json", "store", "index", "context"], "");
    assert_eq!(code, 0, "{err}");
    let (code, out, err) = cli(
        &root,
        &[
            "--json",
            "store",
            "search",
            "context",
            "--column",
            "embedding",
            "--vector",
            "[3, 1, 0, 0, 0, 0, 0, 2]",
            "--k",
            "3",
        ],
        "",
    );
    assert_eq!(code, 0, "{err}");
    let hits = json_lines(&out);
    assert_eq!(hits.len(), 3, "{out}");
    assert_eq!(hits[0]["external_id"], "ext-2-3", "the nearest: {out}");
    // The rollout rows only the old WAL held, in trajectory order.
    let (code, out, err) = cli(
        &root,
        &[
            "--json",
            "store",
            "query",
            "rollout",
            "trajectory",
            "--arg",
            "rollout_id=ro-c",
        ],
        "",
    );
    assert_eq!(code, 0, "{err}");
    let orders: Vec<i64> = json_lines(&out)
        .iter()
        .map(|r| r["sequence_order"].as_i64().unwrap())
        .collect();
    assert_eq!(orders, (45..60).collect::<Vec<_>>());
    // A datagen item folded from the adopted events.
    let (code, out, err) = cli(
        &root,
        &[
            "--json",
            "store",
            "query",
            "datagen",
            "item_state",
            "--arg",
            "item_id=item-1",
        ],
        "",
    );
    assert_eq!(code, 0, "{err}");
    let item = &json_lines(&out)[0]["item"];
    assert_eq!(item["status"], "completed", "{item}");
    assert_eq!(item["fields"]["answer"]["value"], "a11", "{item}");
    drop(dir);
}

/// A schema that does not fit is refused with the whole column report, and
/// nothing is registered or written; a dataset with nothing to infer from
/// asks for a schema.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_incompatible_dataset_is_refused_column_by_column() {
    let (dir, old) = copy_fixtures();
    let root = dir.path().join("root");
    std::fs::create_dir_all(&root).unwrap();
    let uri = old.join("generic.lance");
    let before = files(&uri);
    let spec = dir.path().join("wrong.json");
    std::fs::write(
        &spec,
        r#"{"id": {"type": "string", "nullable": false}, "user": "string",
            "score": "float64", "turns": {"type": "int64", "nullable": false},
            "extra": {"type": "string", "nullable": false}}"#,
    )
    .unwrap();
    let (code, out, err) = cli(
        &root,
        &[
            "--json",
            "store",
            "adopt",
            "g",
            "--uri",
            uri.to_str().unwrap(),
            "--spec",
            spec.to_str().unwrap(),
        ],
        "",
    );
    assert_eq!(code, 2, "refused as invalid input: {out} {err}");
    let report: Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(report["compatible"], false);
    let verdicts: HashMap<String, String> = report["columns"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            (
                c["column"].as_str().unwrap().to_string(),
                c["verdict"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    assert_eq!(verdicts["id"], "same");
    assert_eq!(verdicts["score"], "type_conflict");
    assert_eq!(verdicts["turns"], "nullability_conflict");
    assert_eq!(verdicts["extra"], "missing_required");
    assert_eq!(
        verdicts["tags"], "undeclared",
        "a column the schema leaves out"
    );
    for column in ["score", "turns", "extra"] {
        assert!(err.contains(column), "the error names {column}: {err}");
    }
    assert_eq!(files(&uri), before, "nothing written");
    let (_, listed, _) = cli(&root, &["--json", "store", "list"], "");
    assert!(listed.trim().is_empty(), "nothing registered: {listed}");

    // Plain Lance data with no recorded declaration and no known columns.
    let plain = dir.path().join("plain.lance");
    {
        let schema = std::sync::Arc::new(arrow_schema::Schema::new(vec![
            arrow_schema::Field::new("id", arrow_schema::DataType::Utf8, false).with_metadata(
                [(
                    "lance-schema:unenforced-primary-key".to_string(),
                    "true".to_string(),
                )]
                .into(),
            ),
        ]));
        let batch = arrow_array::RecordBatch::try_new(
            schema.clone(),
            vec![std::sync::Arc::new(arrow_array::StringArray::from(vec![
                "a",
            ]))],
        )
        .unwrap();
        let reader = arrow_array::RecordBatchIterator::new(vec![Ok(batch)], schema);
        lance::Dataset::write(reader, plain.to_str().unwrap(), None)
            .await
            .unwrap();
    }
    let (code, _, err) = cli(
        &root,
        &["store", "adopt", "p", "--uri", plain.to_str().unwrap()],
        "",
    );
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("give --plugin or --spec"), "{err}");
    // Given a spec, it adopts.
    let spec = dir.path().join("plain.json");
    std::fs::write(&spec, r#"{"id": {"type": "string", "nullable": false}}"#).unwrap();
    let (code, _, err) = cli(
        &root,
        &[
            "store",
            "adopt",
            "p",
            "--uri",
            plain.to_str().unwrap(),
            "--spec",
            spec.to_str().unwrap(),
        ],
        "",
    );
    assert_eq!(code, 0, "{err}");
    let (_, out, _) = cli(&root, &["--json", "store", "count", "p"], "");
    assert_eq!(json_lines(&out)[0]["count"], 1);
    // Nothing to adopt, and another store's data, are refused.
    let (code, _, err) = cli(
        &root,
        &[
            "store",
            "adopt",
            "q",
            "--uri",
            dir.path().join("nothing").to_str().unwrap(),
        ],
        "",
    );
    assert_ne!(code, 0);
    assert!(err.contains("nothing to adopt"), "{err}");
    let (code, _, err) = cli(
        &root,
        &[
            "store",
            "adopt",
            "q",
            "--uri",
            plain.to_str().unwrap(),
            "--spec",
            spec.to_str().unwrap(),
        ],
        "",
    );
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("store 'p'"), "{err}");
    drop(dir);
}

/// `store create --spec` takes the previous GenericStore's schema mapping
/// file as it is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn store_create_takes_the_previous_schema_mapping_as_it_is() {
    let dir = tempfile::tempdir().unwrap();
    let spec = dir.path().join("schema.json");
    std::fs::write(
        &spec,
        r#"{
            "id":     {"type": "string", "nullable": false},
            "user":   "string",
            "score":  "float32",
            "tags":   {"type": "list", "item": {"type": "string"}},
            "vec":    {"type": "vector", "dim": 3, "metric": "cosine"},
            "video":  {"type": "binary", "blob": true}
        }"#,
    )
    .unwrap();
    let (code, _, err) = cli(
        dir.path(),
        &["store", "create", "notes", "--spec", spec.to_str().unwrap()],
        "",
    );
    assert_eq!(code, 0, "{err}");
    let (code, _, err) = cli(
        dir.path(),
        &["store", "add", "notes"],
        r#"{"id": "a", "user": "u", "score": 0.5, "tags": ["x"], "vec": [1, 0, 0], "video": "AAEC"}"#,
    );
    assert_eq!(code, 0, "{err}");
    let (_, out, _) = cli(
        dir.path(),
        &[
            "--json",
            "store",
            "get",
            "notes",
            "a",
            "--columns",
            "id,score,tags,video",
        ],
        "",
    );
    let row = &json_lines(&out)[0];
    assert_eq!(row["video"], "AAEC");
    assert_eq!(row["tags"], json!(["x"]));
    let (_, out, _) = cli(dir.path(), &["--json", "store", "describe", "notes"], "");
    let entry: Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(entry["spec"]["vectors"][0]["metric"], "cosine", "{entry}");
    assert_eq!(entry["spec"]["blob_columns"], json!(["video"]), "{entry}");
}

/// Over REST, for admins: a dry run (200), an adoption (201), a refusal
/// with the report in `details.adopt_report`, a uri outside the allowed
/// prefixes (400), and a token scoped to other stores (403).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn adoption_over_rest_is_for_admins_inside_the_allowed_prefixes() {
    let (dir, old) = copy_fixtures();
    let root = dir.path().join("root");
    std::fs::create_dir_all(&root).unwrap();
    let tokens = dir.path().join("tokens.json");
    std::fs::write(
        &tokens,
        r#"{"tokens": [
            {"token": "admin-token-0123456789", "role": "admin"},
            {"token": "scoped-admin-012345678", "role": "admin", "stores": ["other"]},
            {"token": "runs-admin-0123456789", "role": "admin", "stores": ["runs"]},
            {"token": "write-token-0123456789", "role": "write"}]}"#,
    )
    .unwrap();
    let server = ServerProc::start(
        &root,
        &[
            "--tokens",
            tokens.to_str().unwrap(),
            "--allow-uri-prefix",
            old.to_str().unwrap(),
        ],
    );
    let admin = server.client().with_token("admin-token-0123456789");
    let uri = old.join("rollout.lance");
    let mut request = lance_context_client::AdoptStore::new(uri.to_str().unwrap());
    request.dry_run = true;
    let report = admin.adopt("runs", &request).await.unwrap();
    assert!(report.compatible && !report.registered, "{report:?}");
    assert_eq!(report.rows_before, 45);
    for (token, status) in [
        ("write-token-0123456789", 403),
        ("scoped-admin-012345678", 403),
    ] {
        let err = server
            .client()
            .with_token(token)
            .adopt("runs", &request)
            .await
            .unwrap_err();
        assert_eq!(err.status(), Some(status), "{token}: {err}");
    }
    let outside = lance_context_client::AdoptStore::new(cli_binary().to_str().unwrap());
    let err = admin.adopt("runs", &outside).await.unwrap_err();
    assert_eq!(err.status(), Some(400), "{err}");

    request.dry_run = false;
    let report = admin.adopt("runs", &request).await.unwrap();
    assert!(report.registered);
    assert_eq!(report.rows_after, Some(60));
    let page = admin
        .list("runs", &lance_context_client::ListParams::default())
        .await
        .unwrap();
    assert_eq!(page.records.values().unwrap().len(), 60);

    let mut wrong =
        lance_context_client::AdoptStore::new(old.join("generic.lance").to_str().unwrap());
    wrong.plugin = Some("rollout".into());
    let err = admin.adopt("g", &wrong).await.unwrap_err();
    assert_eq!(err.status(), Some(400), "{err}");
    let lance_context_client::ClientError::Api { error, .. } = &err else {
        panic!("{err}")
    };
    let columns = error.details["adopt_report"]["columns"].as_array().unwrap();
    assert!(
        columns
            .iter()
            .any(|c| c["column"] == "rollout_id" && c["verdict"] == "missing_required"),
        "{columns:?}"
    );
    let _ = compile_cache();
    drop(server);
    drop(dir);
}

/// The `sh` blocks of docs/migrating.md, in order.
pub(crate) fn guide_blocks() -> Vec<String> {
    let guide = Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/migrating.md");
    let text = std::fs::read_to_string(&guide).unwrap();
    let mut blocks = Vec::new();
    let mut current: Option<String> = None;
    for line in text.lines() {
        match (&mut current, line.trim_end()) {
            (None, "```sh") => current = Some(String::new()),
            (Some(block), "```") => {
                blocks.push(std::mem::take(block));
                current = None;
            }
            (Some(block), l) => {
                block.push_str(l);
                block.push('\n');
            }
            (None, _) => {}
        }
    }
    blocks
}

/// Run a guide block as a user would: one `sh -e` script in `work`, with
/// `lance-context` on the PATH and `env` set.
pub(crate) fn run_block(block: &str, work: &Path, env: &[(&str, String)]) {
    let bin_dir = cli_binary().parent().unwrap().to_path_buf();
    let path = format!(
        "{}:{}",
        bin_dir.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let out = std::process::Command::new("sh")
        .args(["-e", "-c", block])
        .current_dir(work)
        .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
        .env("PATH", &path)
        .env("LANCE_CONTEXT_CACHE_DIR", compile_cache())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{block}\n--- stdout\n{}\n--- stderr\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The `sh` blocks of docs/migrating.md, in order, as a user would run them
/// (`$OLD` the old datasets; the object-store block, which names `$OLD_S3`,
/// runs in `storage_options::an_adoption_reaches_the_object_store`); then
/// what they were meant to do.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_command_of_the_migration_guide_runs() {
    let blocks: Vec<String> = guide_blocks()
        .into_iter()
        .filter(|b| !b.contains("$OLD_S3"))
        .collect();
    assert!(
        blocks.len() >= 6,
        "the guide's shell blocks: {}",
        blocks.len()
    );
    let (dir, old) = copy_fixtures();
    let work = dir.path().join("work");
    std::fs::create_dir_all(&work).unwrap();
    for block in &blocks {
        run_block(block, &work, &[("OLD", old.display().to_string())]);
    }
    for (store, rows) in [
        ("memories", expected("context").len()),
        ("runs", expected("rollout").len()),
        ("events", expected("datagen").len()),
        ("tickets", expected("generic").len()),
        ("tickets-copy", expected("generic").len()),
    ] {
        let (_, out, err) = cli(&work, &["--json", "store", "count", store], "");
        assert_eq!(json_lines(&out)[0]["count"], json!(rows), "{store}: {err}");
    }
    let (_, out, _) = cli(
        &work,
        &[
            "--json",
            "store",
            "get",
            "tickets-copy",
            "g065",
            "--columns",
            "id,raw,vec",
        ],
        "",
    );
    let copied = &json_lines(&out)[0];
    assert_eq!(copied["raw"], "QUFB", "{copied}");
    drop(dir);
}

/// An adoption cut short between claiming the name and finishing (a crash;
/// here its entry is put back in that state) leaves an incomplete entry:
/// dropping it removes the entry and never the dataset, which was the
/// user's before; adopting again then works.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_an_unfinished_adoption_keeps_the_dataset() {
    let (dir, old) = copy_fixtures();
    let root = dir.path().join("root");
    std::fs::create_dir_all(&root).unwrap();
    let uri = old.join("rollout.lance");
    let uri_s = uri.to_str().unwrap();
    let (code, _, err) = cli(&root, &["store", "adopt", "runs", "--uri", uri_s], "");
    assert_eq!(code, 0, "{err}");
    let entry_path = root.join("data/registry/stores/runs.json");
    let mut entry: Value = serde_json::from_slice(&std::fs::read(&entry_path).unwrap()).unwrap();
    assert_eq!(entry["adopted"], true, "{entry}");
    entry["state"] = json!("creating");
    std::fs::write(&entry_path, serde_json::to_vec(&entry).unwrap()).unwrap();

    let (code, _, err) = cli(&root, &["store", "count", "runs"], "");
    assert_ne!(code, 0);
    assert!(err.contains("not fully created"), "{err}");
    let (code, out, err) = cli(&root, &["--json", "store", "drop", "runs", "--yes"], "");
    assert_eq!(code, 0, "{err}");
    let dropped: Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(dropped["data_deleted"], false, "{dropped}");
    assert!(uri.join("_versions").is_dir(), "the dataset is still there");
    let (code, out, _) = cli(&root, &["--json", "count", "--uri", uri_s], "");
    assert_eq!(code, 0);
    assert_eq!(
        json_lines(&out)[0]["count"],
        json!(expected("rollout").len())
    );

    let (code, _, err) = cli(&root, &["store", "adopt", "runs", "--uri", uri_s], "");
    assert_eq!(code, 0, "adopted again: {err}");
    // A finished adoption is a store like any other: drop deletes its data.
    let (code, out, err) = cli(&root, &["--json", "store", "drop", "runs", "--yes"], "");
    assert_eq!(code, 0, "{err}");
    let dropped: Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(dropped["data_deleted"], true, "{dropped}");
    assert!(!uri.join("_versions").exists());
    drop(dir);
}

/// Write a plain Lance dataset (no MemWAL) at `uri` from `batch`.
async fn plain_dataset(uri: &Path, batch: arrow_array::RecordBatch) {
    let schema = batch.schema();
    let reader = arrow_array::RecordBatchIterator::new(vec![Ok(batch)], schema);
    lance::Dataset::write(reader, uri.to_str().unwrap(), None)
        .await
        .unwrap();
}

fn pk(field: arrow_schema::Field) -> arrow_schema::Field {
    field.with_metadata(
        [(
            "lance-schema:unenforced-primary-key".to_string(),
            "true".to_string(),
        )]
        .into(),
    )
}

/// What would read wrong is refused, each with its verdict: struct fields
/// in another order (same types: values would swap), a second primary-key
/// tag, a column in Lance's blob encoding, keys repeated in the base table.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn adoption_refuses_what_would_read_wrong() {
    use arrow_array::{
        ArrayRef, Int32Array, LargeBinaryArray, RecordBatch, StringArray, StructArray,
    };
    use arrow_schema::{DataType, Field, Fields, Schema};
    use std::sync::Arc;
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("root");
    std::fs::create_dir_all(&root).unwrap();

    // Struct fields b, a in the dataset; the spec declares a, b.
    let fields = Fields::from(vec![
        Field::new("b", DataType::Int32, true),
        Field::new("a", DataType::Int32, true),
    ]);
    let s = StructArray::new(
        fields.clone(),
        vec![
            Arc::new(Int32Array::from(vec![1])) as ArrayRef,
            Arc::new(Int32Array::from(vec![2])) as ArrayRef,
        ],
        None,
    );
    let schema = Arc::new(Schema::new(vec![
        pk(Field::new("id", DataType::Utf8, false)),
        Field::new("s", DataType::Struct(fields), true),
        pk(Field::new("t", DataType::Utf8, false)),
        Field::new("raw", DataType::LargeBinary, true)
            .with_metadata([("lance-encoding:blob".to_string(), "true".to_string())].into()),
    ]));
    let batch = RecordBatch::try_new(
        schema,
        vec![
            Arc::new(StringArray::from(vec!["k1"])),
            Arc::new(s),
            Arc::new(StringArray::from(vec!["x"])),
            Arc::new(LargeBinaryArray::from_opt_vec(vec![Some(
                b"abc".as_slice(),
            )])),
        ],
    )
    .unwrap();
    let odd = dir.path().join("odd.lance");
    plain_dataset(&odd, batch).await;
    let spec = dir.path().join("odd.json");
    std::fs::write(
        &spec,
        r#"{"name": "odd", "key": "id", "columns": [
            {"name": "id", "type": "Utf8", "nullable": false},
            {"name": "s", "type": "Struct(\"a\": Int32, \"b\": Int32)"},
            {"name": "t", "type": "Utf8", "nullable": false},
            {"name": "raw", "type": "LargeBinary"}]}"#,
    )
    .unwrap();
    let (code, out, err) = cli(
        &root,
        &[
            "--json",
            "store",
            "adopt",
            "odd",
            "--uri",
            odd.to_str().unwrap(),
            "--spec",
            spec.to_str().unwrap(),
            "--dry-run",
        ],
        "",
    );
    assert_eq!(code, 2, "{out} {err}");
    let report: Value = serde_json::from_str(out.trim()).unwrap();
    let verdict = |c: &str| {
        report["columns"]
            .as_array()
            .unwrap()
            .iter()
            .find(|x| x["column"] == c)
            .unwrap()["verdict"]
            .clone()
    };
    assert_eq!(verdict("id"), "same", "{report}");
    assert_eq!(verdict("s"), "type_conflict", "{report}");
    assert_eq!(verdict("t"), "extra_key_tag", "{report}");
    // Lance writes a blob-encoded column as a blob struct (file format 2.1)
    // or as LargeBinary marked lance-encoding:blob (2.0): refused either way.
    assert!(
        verdict("raw") == "blob_encoding" || verdict("raw") == "type_conflict",
        "{report}"
    );

    // Keys repeated in the base table (plain Lance keeps no key unique).
    let schema = Arc::new(Schema::new(vec![
        pk(Field::new("id", DataType::Utf8, false)),
        Field::new("v", DataType::Int32, true),
    ]));
    let batch = RecordBatch::try_new(
        schema,
        vec![
            Arc::new(StringArray::from(vec!["a", "b", "a", "c"])),
            Arc::new(Int32Array::from(vec![1, 2, 3, 4])),
        ],
    )
    .unwrap();
    let dup = dir.path().join("dup.lance");
    plain_dataset(&dup, batch).await;
    let spec = dir.path().join("dup.json");
    std::fs::write(
        &spec,
        r#"{"id": {"type": "string", "nullable": false}, "v": "int32"}"#,
    )
    .unwrap();
    let (code, out, err) = cli(
        &root,
        &[
            "--json",
            "store",
            "adopt",
            "dup",
            "--uri",
            dup.to_str().unwrap(),
            "--spec",
            spec.to_str().unwrap(),
        ],
        "",
    );
    assert_eq!(code, 2, "{out} {err}");
    let report: Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(report["duplicate_keys"], json!(["a"]), "{report}");
    assert_eq!(report["duplicates_checked"], true);
    assert!(err.contains("'a'"), "{err}");
    let (_, listed, _) = cli(&root, &["--json", "store", "list"], "");
    assert!(listed.trim().is_empty(), "nothing registered: {listed}");
}

/// Another data root's live store is not adopted (the note its registry
/// keeps with the data says whose it is); a copy of its data is anyone's.
/// A relative --uri is the current directory's. A given parameter keeps
/// the others read from the dataset.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_roots_store_is_not_adopted_and_relative_uris_are_the_cwds() {
    let (dir, old) = copy_fixtures();
    let work = dir.path().join("work");
    std::fs::create_dir_all(&work).unwrap();
    let live = dir.path().join("live.lance");
    let root_a = dir.path().join("root-a");
    let (code, _, err) = cli(
        dir.path(),
        &[
            "store",
            "create",
            "live",
            "--root",
            root_a.to_str().unwrap(),
            "--plugin",
            "rollout",
            "--uri",
            live.to_str().unwrap(),
        ],
        "",
    );
    assert_eq!(code, 0, "{err}");
    let (code, _, err) = cli(
        &work,
        &["store", "adopt", "stolen", "--uri", live.to_str().unwrap()],
        "",
    );
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("store 'live' of the data root"), "{err}");
    // A copy of its data is not that store.
    let copy = dir.path().join("copy.lance");
    copy_dir(&live, &copy);
    let (code, _, err) = cli(
        &work,
        &["store", "adopt", "copied", "--uri", copy.to_str().unwrap()],
        "",
    );
    assert_eq!(code, 0, "{err}");

    // Relative to the current directory, and recorded as such.
    let rel_dir = work.join("old");
    copy_dir(&old.join("rollout.lance"), &rel_dir.join("rollout.lance"));
    let (code, _, err) = cli(
        &work,
        &["store", "adopt", "runs", "--uri", "old/rollout.lance"],
        "",
    );
    assert_eq!(code, 0, "{err}");
    let (_, out, err) = cli(&work, &["--json", "store", "count", "runs"], "");
    assert_eq!(json_lines(&out)[0]["count"], json!(60), "{err}");
    let (_, out, _) = cli(&work, &["--json", "store", "describe", "runs"], "");
    let entry: Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(
        entry["uri"],
        json!(rel_dir.join("rollout.lance").to_str().unwrap()),
        "{entry}"
    );

    // So is a relative --uri of a create (it was read against the data root).
    let (code, _, err) = cli(
        &work,
        &[
            "store",
            "create",
            "relstore",
            "--plugin",
            "rollout",
            "--uri",
            "rel/store",
        ],
        "",
    );
    assert_eq!(code, 0, "{err}");
    let (code, _, err) = cli(
        &work,
        &["store", "add", "relstore"],
        r#"{"id": "m1", "rollout_id": "r1", "problem_id": "p1"}"#,
    );
    assert_eq!(code, 0, "{err}");
    let (_, out, err) = cli(&work, &["--json", "store", "count", "relstore"], "");
    assert_eq!(json_lines(&out)[0]["count"], json!(1), "{err}");
    assert!(work.join("rel/store/_versions").is_dir());

    // --param embedding_dim keeps the metric read from the dataset.
    let (code, out, err) = cli(
        &work,
        &[
            "--json",
            "store",
            "adopt",
            "ctx",
            "--uri",
            old.join("context.lance").to_str().unwrap(),
            "--param",
            "embedding_dim=8",
            "--dry-run",
        ],
        "",
    );
    assert_eq!(code, 0, "{err}");
    let report: Value = serde_json::from_str(out.trim()).unwrap();
    assert!(
        report["params"]
            .as_array()
            .unwrap()
            .iter()
            .any(|p| p[0] == "distance_metric" && p[1] == "\"cosine\""),
        "{report}"
    );
    drop(dir);
}
