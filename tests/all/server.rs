//! The REST/JSON server end to end: a real `lance-context serve` process on
//! loopback, driven through the client crate.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};

use lance_context_client::{Client, CreateStore, ListParams, QueryResult, SearchRequest, StoreApi};
use serde_json::{Value, json};

use crate::support::{cli_binary, compile_cache};

/// A server process; killed when dropped.
pub struct ServerProc {
    child: Child,
    pub url: String,
}

impl ServerProc {
    pub fn start(root: &Path, extra: &[&str]) -> Self {
        Self::spawn(root, extra, Stdio::piped())
    }

    /// [`Self::start`], its stderr (the log) written to `log`: a server
    /// that logs much is never held by a full pipe.
    pub fn start_logging(root: &Path, extra: &[&str], log: &Path) -> Self {
        let file = std::fs::File::create(log).unwrap();
        Self::spawn(root, extra, Stdio::from(file))
    }

    fn spawn(root: &Path, extra: &[&str], stderr: Stdio) -> Self {
        let mut child = Command::new(cli_binary())
            .args([
                "serve",
                "--root",
                root.to_str().unwrap(),
                "--addr",
                "127.0.0.1:0",
            ])
            .args(extra)
            .env("LANCE_CONTEXT_CACHE_DIR", compile_cache())
            .env_remove("LANCE_CONTEXT_TOKENS")
            .stdout(Stdio::piped())
            .stderr(stderr)
            .spawn()
            .unwrap();
        let mut line = String::new();
        BufReader::new(child.stdout.as_mut().unwrap())
            .read_line(&mut line)
            .unwrap();
        let url = line
            .trim()
            .strip_prefix("listening on ")
            .unwrap_or_else(|| panic!("no address printed: {line:?}"))
            .to_string();
        Self { child, url }
    }

    pub fn client(&self) -> Client {
        Client::new(&self.url)
    }

    /// `host:port`, for raw TCP clients.
    pub fn addr(&self) -> String {
        self.url.trim_start_matches("http://").to_string()
    }

    /// The server's open file descriptors (Linux: `/proc/<pid>/fd`).
    pub fn open_fds(&self) -> usize {
        std::fs::read_dir(format!("/proc/{}/fd", self.child.id()))
            .unwrap()
            .count()
    }

    /// SIGTERM, then the exit status.
    pub fn terminate(mut self) -> std::process::ExitStatus {
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        let status = self.child.wait().unwrap();
        std::mem::forget(self);
        status
    }
}

impl Drop for ServerProc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

const TICKETS: &str = r#"{"name": "tickets", "key": "id", "columns": [
    {"name": "id", "type": "Utf8", "nullable": false},
    {"name": "team", "type": "Utf8", "rules": {"one_of": ["a", "b"]}},
    {"name": "n", "type": "Int32", "rules": {"min": 0}},
    {"name": "data", "type": "LargeBinary"}],
  "queries": [{"name": "by_team", "description": "one team", "params": ["team"],
               "filter": "team = {team}", "order_by": ["id"]}]}"#;

/// The `tickets` store of [`TICKETS`], to create.
fn tickets() -> CreateStore {
    CreateStore::spec("tickets", serde_json::from_str(TICKETS).unwrap())
}

fn status_of<T: std::fmt::Debug>(r: Result<T, lance_context_client::ClientError>) -> (u16, String) {
    match r {
        Ok(v) => panic!("expected an error, got {v:?}"),
        Err(e) => (e.status().unwrap_or(0), e.to_string()),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_store_is_served_through_the_client() {
    let dir = tempfile::tempdir().unwrap();
    let server = ServerProc::start(dir.path(), &[]);
    let c = server.client();
    assert_eq!(c.health().await.unwrap()["status"], "ok");

    // A built-in store and a user spec store.
    let runs = c
        .create_store(&CreateStore::builtin("runs", "rollout"))
        .await
        .unwrap();
    assert_eq!(runs.plugin.name, "rollout");
    c.create_store(&tickets()).await.unwrap();
    let names: Vec<String> = c
        .list_stores()
        .await
        .unwrap()
        .into_iter()
        .map(|s| s.name)
        .collect();
    assert_eq!(names, ["runs", "tickets"]);

    let steps: Vec<Value> = (0..5)
        .map(|i| json!({"id": format!("m{i}"), "rollout_id": "r1", "sequence_order": 4 - i}))
        .collect();
    assert_eq!(c.add("runs", &steps).await.unwrap().added, 5);
    let m2 = c.get("runs", "m2").await.unwrap().unwrap();
    assert_eq!(m2["sequence_order"], 2);
    assert_eq!(m2["role"], "assistant", "the plugin's transform filled it");
    assert!(c.get("runs", "nope").await.unwrap().is_none());
    let many = c
        .get_many("runs", &["m4", "zz", "m0"])
        .await
        .unwrap()
        .values()
        .unwrap();
    assert_eq!(many.len(), 2);
    match c
        .query("runs", "trajectory", &[("rollout_id", "r1")])
        .await
        .unwrap()
    {
        QueryResult::Records { records } => {
            let order: Vec<i64> = records
                .values()
                .unwrap()
                .iter()
                .map(|r| r["sequence_order"].as_i64().unwrap())
                .collect();
            assert_eq!(order, [0, 1, 2, 3, 4]);
        }
        other => panic!("{other:?}"),
    }

    // Paging by cursor walks every record once.
    let tickets: Vec<Value> = (0..25)
        .map(|i| {
            json!({"id": format!("t{i:02}"), "team": if i % 2 == 0 {"a"} else {"b"}, "n": i,
                   "data": "3q2+7w=="})
        })
        .collect();
    c.add("tickets", &tickets).await.unwrap();
    let mut seen = Vec::new();
    let mut params = ListParams {
        limit: Some(10),
        columns: Some("id,data".into()),
        ..ListParams::default()
    };
    loop {
        let page = c.list("tickets", &params).await.unwrap();
        let records = page.records.values().unwrap();
        seen.extend(
            records
                .iter()
                .map(|r| r["id"].as_str().unwrap().to_string()),
        );
        assert_eq!(records[0]["data"], "3q2+7w==", "binary as base64");
        match page.next_cursor {
            Some(cursor) => params.cursor = Some(cursor),
            None => break,
        }
    }
    assert_eq!(seen.len(), 25);
    assert_eq!(
        seen,
        (0..25).map(|i| format!("t{i:02}")).collect::<Vec<_>>()
    );
    let filtered = c
        .list(
            "tickets",
            &ListParams {
                filter: Some("n >= 20".into()),
                order_by: Some("n:desc".into()),
                ..ListParams::default()
            },
        )
        .await
        .unwrap();
    let filtered = filtered.records.values().unwrap();
    assert_eq!(filtered.len(), 5);
    assert_eq!(filtered[0]["n"], 24);
    match c
        .query("tickets", "by_team", &[("team", "a")])
        .await
        .unwrap()
    {
        QueryResult::Records { records } => assert_eq!(records.values().unwrap().len(), 13),
        other => panic!("{other:?}"),
    }
    let deleted = c.delete("tickets", "t00").await.unwrap();
    assert!(deleted.deleted);
    assert!(!c.delete("tickets", "t00").await.unwrap().deleted);

    // Context: vectors, upsert and patch (supersession).
    c.create_store(&CreateStore::builtin("mem", "context").param("embedding_dim", json!(4)))
        .await
        .unwrap();
    let memories: Vec<Value> = (0..40)
        .map(|i| {
            json!({"id": format!("c{i}"), "run_id": "run", "text_payload": format!("note {i}"),
                   "embedding": [i as f32, 0.0, 1.0, 0.5]})
        })
        .collect();
    c.add("mem", &memories).await.unwrap();
    let near = c
        .search(
            "mem",
            &SearchRequest::vector("embedding", vec![7.0, 0.0, 1.0, 0.5], 3),
        )
        .await
        .unwrap()
        .values()
        .unwrap();
    assert_eq!(near[0]["id"], "c7");
    // Text search and hybrid retrieval through the server: the same typed
    // errors as the library (400 with the reason).
    let words = c
        .search("mem", &SearchRequest::text("text_payload", "note", 3))
        .await
        .unwrap()
        .values()
        .unwrap();
    assert_eq!(words.len(), 3, "{words:?}");
    assert!(
        words.iter().all(|r| r["_score"].as_f64().is_some()),
        "{words:?}"
    );
    let fused = c
        .retrieve(
            "mem",
            &lance_context_client::RetrieveRequest {
                vector: Some(lance_context_client::VectorLeg {
                    column: "embedding".into(),
                    vector: vec![7.0, 0.0, 1.0, 0.5],
                    k: None,
                }),
                text: Some(lance_context_client::TextLeg {
                    column: "text_payload".into(),
                    text: "note".into(),
                    operator: None,
                    k: None,
                }),
                k: 3,
                rrf_k: None,
                filter: None,
                conditions: vec![lance_context_client::Condition::eq("id", "c7")],
            },
        )
        .await
        .unwrap()
        .values()
        .unwrap();
    assert_eq!(fused.len(), 1, "{fused:?}");
    assert_eq!(fused[0]["id"], "c7");
    assert_eq!(fused[0]["_vector_rank"], 1);
    let wrong = c
        .search("mem", &SearchRequest::text("embedding", "note", 3))
        .await
        .unwrap_err();
    assert_eq!(wrong.status(), Some(400), "{wrong}");
    assert!(
        wrong.to_string().contains("not a declared text column"),
        "{wrong}"
    );
    let patched = c
        .patch("mem", "c1", &json!({"text_payload": "revised"}))
        .await
        .unwrap();
    assert_eq!(patched.supersedes, "c1");
    // A lookup by key still finds the old version, marked superseded.
    let old = c.get("mem", "c1").await.unwrap().unwrap();
    assert_eq!(old["superseded_by_id"], patched.id.as_str());
    let new = c.get("mem", &patched.id).await.unwrap().unwrap();
    assert_eq!(new["text_payload"], "revised");
    let up = c
        .upsert(
            "mem",
            &[json!({"id": "u1", "external_id": "ext-1", "run_id": "run", "text_payload": "a"})],
        )
        .await
        .unwrap();
    assert!(up.outcomes[0].inserted && !up.dry_run);
    // A dry run: the outcome of superseding u1, nothing written.
    let next = [json!({"id": "u2", "external_id": "ext-1", "run_id": "run", "text_payload": "b"})];
    let checked = c.check_upsert("mem", &next).await.unwrap();
    assert!(checked.dry_run);
    assert_eq!(
        (
            checked.outcomes[0].inserted,
            checked.outcomes[0].replaced_id.as_deref()
        ),
        (false, Some("u1"))
    );
    assert!(
        c.get("mem", "u2").await.unwrap().is_none(),
        "a dry run wrote"
    );
    let u1 = c.get("mem", "u1").await.unwrap().unwrap();
    assert!(u1["superseded_by_id"].is_null(), "a dry run superseded u1");
    // Refused as the upsert would be: u1 is taken.
    let taken = [json!({"id": "u1", "external_id": "ext-2", "run_id": "run", "text_payload": "b"})];
    match c.check_upsert("mem", &taken).await {
        Err(lance_context_client::ClientError::Api { status, .. }) => assert_eq!(status, 409),
        other => panic!("{other:?}"),
    }
    // A key that exists (a unique-keys schema): 409, naming the record.
    match c
        .add(
            "mem",
            &[
                json!({"id": "fresh", "run_id": "run", "text_payload": "a"}),
                json!({"id": "u1", "run_id": "run", "text_payload": "b"}),
            ],
        )
        .await
    {
        Err(lance_context_client::ClientError::Api { status, error }) => {
            assert_eq!(status, 409, "{error:?}");
            assert_eq!(error.details["record"], 1, "{error:?}");
            assert_eq!(error.details["column"], "id", "{error:?}");
        }
        other => panic!("{other:?}"),
    }

    // Admin.
    let merged = c.merge("mem").await.unwrap();
    assert!(merged.rows_upserted > 0, "{merged:?}");
    c.compact("mem").await.unwrap();
    let indexed = c.index("mem", None).await.unwrap();
    assert_eq!(indexed.indexed, ["embedding"]);
    let stats = c.stats("mem").await.unwrap();
    assert_eq!(stats.rows, 41, "{stats:?}");
    assert!(
        stats.indexes.iter().any(|i| i.columns == ["embedding"]),
        "{stats:?}"
    );
    let dropped = c.drop_store("tickets").await.unwrap();
    assert_eq!(dropped.store, "tickets");
    assert_eq!(status_of(c.describe_store("tickets").await).0, 404);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_gets_a_typed_status_and_says_where() {
    let dir = tempfile::tempdir().unwrap();
    let server = ServerProc::start(dir.path(), &["--body-limit-mib", "1"]);
    let c = server.client();
    c.create_store(&tickets()).await.unwrap();
    c.create_store(&CreateStore::builtin("mem", "context").param("embedding_dim", json!(4)))
        .await
        .unwrap();
    let add = |store: &'static str, body: Value| {
        let c = c.clone();
        async move {
            let records = body.as_array().cloned().unwrap();
            c.add(store, &records).await
        }
    };
    fn expect<T: std::fmt::Debug>(
        r: Result<T, lance_context_client::ClientError>,
        status: u16,
        says: &str,
    ) {
        let (got, message) = status_of(r);
        assert_eq!(got, status, "{message}");
        assert!(message.contains(says), "expected '{says}' in: {message}");
    }
    expect(
        add("tickets", json!([{"id": "a"}, {"id": "b", "colour": 1}])).await,
        400,
        "unknown field 'colour'",
    );
    expect(
        add(
            "tickets",
            json!([{"id": "a", "n": 1}, {"id": "b", "n": "many"}]),
        )
        .await,
        400,
        "record 1",
    );
    expect(
        add("tickets", json!([{"id": "a", "n": -1}])).await,
        422,
        "at least 0",
    );
    // A missing key: the plugin's row error, naming the column.
    expect(add("tickets", json!([{"n": 1}])).await, 422, "column 'id'");
    expect(
        add(
            "mem",
            json!([{"id": "v", "run_id": "r", "embedding": [1.0, 2.0]}]),
        )
        .await,
        400,
        "embedding",
    );
    expect(
        add("tickets", json!([{"id": "x", "data": "not base64!"}])).await,
        400,
        "base64",
    );
    expect(
        add("nope", json!([{"id": "a"}])).await,
        404,
        "no store named 'nope'",
    );
    expect(
        c.upsert("tickets", &[json!({"id": "a"})]).await,
        400,
        "supersession",
    );
    // Malformed JSON, a non-array, an oversized body, a wrong content type.
    let raw = |body: &[u8], ct: &str| {
        let c = c.clone();
        let body = body.to_vec();
        let ct = ct.to_string();
        async move {
            c.raw("POST", "/api/v1/stores/tickets/records", &ct, body)
                .await
                .unwrap()
        }
    };
    let (s, body) = raw(b"[{\"id\": ", "application/json").await;
    assert_eq!(s, 400, "{}", String::from_utf8_lossy(&body));
    let error: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(error["error"]["code"], "invalid_input");
    let (s, _) = raw(b"{\"id\": \"a\"}", "application/json").await;
    assert_eq!(s, 400);
    let (s, body) = raw(&vec![b' '; 2 << 20], "application/json").await;
    assert_eq!(s, 413, "{}", String::from_utf8_lossy(&body));
    let (s, _) = raw(b"id=a", "text/csv").await;
    assert_eq!(s, 415);
    // JSON Lines bodies work.
    let (s, body) = raw(
        b"{\"id\": \"l1\"}\n{\"id\": \"l2\"}\n",
        "application/x-ndjson",
    )
    .await;
    assert_eq!(s, 201, "{}", String::from_utf8_lossy(&body));
    // Every bad line of a JSON Lines body, by its line (blank lines count).
    let (s, body) = raw(
        b"{\"id\": \"m1\"}\ngarbage\n\n{\"id\": \"m2\", \"n\": \"3\"}\ngarbage2\n",
        "application/x-ndjson",
    )
    .await;
    assert_eq!(s, 400, "{}", String::from_utf8_lossy(&body));
    let error: Value = serde_json::from_slice(&body).unwrap();
    let lines: Vec<u64> = error["error"]["details"]["input_errors"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["line"].as_u64().unwrap())
        .collect();
    assert_eq!(lines, [2, 4, 5], "{error}");
    assert!(
        error["error"]["message"]
            .as_str()
            .unwrap()
            .starts_with("line 2:"),
        "{error}"
    );
    // Every record of an array that is not an object.
    let (s, body) = raw(b"[{\"id\": \"o1\"}, 1, \"x\"]", "application/json").await;
    assert_eq!(s, 400);
    let error: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(error["error"]["details"]["total"], 2, "{error}");
    // A member given twice is refused, not last-wins.
    let (s, body) = raw(b"[{\"id\": \"d1\", \"id\": \"d2\"}]", "application/json").await;
    assert_eq!(s, 400);
    assert!(String::from_utf8_lossy(&body).contains("given twice"));
    // Nothing from a refused request was written.
    let stats = c.stats("tickets").await.unwrap();
    assert_eq!(stats.rows, 2, "{stats:?}");
    // A filter that is not a plain predicate is refused.
    let r = c
        .list(
            "tickets",
            &ListParams {
                filter: Some("repeat(id, 100) = 'x'".into()),
                ..ListParams::default()
            },
        )
        .await;
    assert_eq!(status_of(r).0, 400);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_and_roles_guard_every_route() {
    let dir = tempfile::tempdir().unwrap();
    let tokens = dir.path().join("tokens.json");
    std::fs::write(
        &tokens,
        r#"{"tokens": [
            {"token": "admin-token-0123456789", "role": "admin"},
            {"token": "write-token-0123456789", "role": "write", "stores": ["a"]},
            {"token": "read-token-01234567890", "role": "read"}]}"#,
    )
    .unwrap();
    let server = ServerProc::start(dir.path(), &["--tokens", tokens.to_str().unwrap()]);
    let anon = server.client();
    let admin = server.client().with_token("admin-token-0123456789");
    let writer = server.client().with_token("write-token-0123456789");
    let reader = server.client().with_token("read-token-01234567890");
    let wrong = server.client().with_token("nope-nope-nope-nope-nope");
    let spec: Value = serde_json::from_str(TICKETS).unwrap();
    assert_eq!(status_of(anon.list_stores().await).0, 401);
    assert_eq!(status_of(wrong.list_stores().await).0, 401);
    assert_eq!(
        status_of(
            writer
                .create_store(&CreateStore::spec("a", spec.clone()))
                .await
        )
        .0,
        403
    );
    admin
        .create_store(&CreateStore::spec("a", spec.clone()))
        .await
        .unwrap();
    admin
        .create_store(&CreateStore::spec("b", spec))
        .await
        .unwrap();
    writer.add("a", &[json!({"id": "1"})]).await.unwrap();
    assert_eq!(
        status_of(writer.add("b", &[json!({"id": "1"})]).await).0,
        403
    );
    assert_eq!(
        status_of(reader.add("a", &[json!({"id": "2"})]).await).0,
        403
    );
    assert!(reader.get("a", "1").await.unwrap().is_some());
    assert_eq!(status_of(reader.merge("a").await).0, 403);
    let visible: Vec<String> = writer
        .list_stores()
        .await
        .unwrap()
        .into_iter()
        .map(|s| s.name)
        .collect();
    assert_eq!(visible, ["a"], "a token limited to stores sees only those");
    // Health needs no token.
    assert_eq!(anon.health().await.unwrap()["status"], "ok");
    drop(server);

    // Listening beyond loopback needs tokens.
    let (code, _, err) = crate::support::cli(
        dir.path(),
        &["serve", "--root", "data", "--addr", "0.0.0.0:0"],
        "",
    );
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("without tokens"), "{err}");
}

/// Adds from many tasks while the store merges and compacts; then SIGTERM
/// mid-load: every add that was acknowledged is there after a restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_and_restart_keep_every_acknowledged_add() {
    let dir = tempfile::tempdir().unwrap();
    let server = ServerProc::start(dir.path(), &[]);
    let c = server.client();
    c.create_store(&tickets()).await.unwrap();
    let mut tasks = tokio::task::JoinSet::new();
    for t in 0..6 {
        let c = c.clone();
        tasks.spawn(async move {
            let mut acked = Vec::new();
            for i in 0..1000 {
                let id = format!("k{t}-{i}");
                match c.add("tickets", &[json!({"id": id, "n": i})]).await {
                    Ok(_) => acked.push(id),
                    Err(_) => break,
                }
            }
            acked
        });
    }
    // Maintenance racing the adds.
    for _ in 0..2 {
        tokio::time::sleep(std::time::Duration::from_millis(300)).await;
        c.merge("tickets").await.unwrap();
        c.compact("tickets").await.unwrap();
    }
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    let status = server.terminate();
    assert!(status.success(), "graceful shutdown exits 0: {status}");
    let mut acked = Vec::new();
    while let Some(done) = tasks.join_next().await {
        acked.extend(done.unwrap());
    }
    assert!(acked.len() > 10, "the load ran: {}", acked.len());
    let server = ServerProc::start(dir.path(), &[]);
    let c = server.client();
    let mut missing = Vec::new();
    for chunk in acked.chunks(500) {
        let keys: Vec<&str> = chunk.iter().map(String::as_str).collect();
        let found = c
            .get_many("tickets", &keys)
            .await
            .unwrap()
            .values()
            .unwrap();
        if found.len() != keys.len() {
            let got: std::collections::HashSet<&str> =
                found.iter().map(|r| r["id"].as_str().unwrap()).collect();
            missing.extend(
                keys.iter()
                    .filter(|k| !got.contains(*k))
                    .map(|k| k.to_string()),
            );
        }
    }
    assert!(missing.is_empty(), "acknowledged but lost: {missing:?}");
}

/// Generated malformed bodies at the add route: never a 5xx, never a crash.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_bodies_never_get_a_server_error() {
    let dir = tempfile::tempdir().unwrap();
    let server = ServerProc::start(dir.path(), &[]);
    let c = server.client();
    c.create_store(&tickets()).await.unwrap();
    let mut seed = 0x0005_DEEC_E66D_u64;
    let mut next = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    let values = [
        json!(null),
        json!(true),
        json!(-1),
        json!(1.5e300),
        json!("x"),
        json!(""),
        json!([1, 2]),
        json!({"k": 1}),
        json!("3q2+7w=="),
        json!(i64::MAX),
    ];
    let fields = ["id", "team", "n", "data", "zz", ""];
    for round in 0..300 {
        let (body, ct) = match next() % 4 {
            0 => (
                (0..(next() % 64))
                    .map(|_| (next() % 256) as u8)
                    .collect::<Vec<u8>>(),
                "application/json",
            ),
            1 => {
                let records: Vec<Value> = (0..1 + next() % 4)
                    .map(|_| {
                        let mut o = serde_json::Map::new();
                        for _ in 0..next() % 5 {
                            o.insert(
                                fields[(next() % fields.len() as u64) as usize].to_string(),
                                values[(next() % values.len() as u64) as usize].clone(),
                            );
                        }
                        Value::Object(o)
                    })
                    .collect();
                (serde_json::to_vec(&records).unwrap(), "application/json")
            }
            2 => (
                values[(next() % values.len() as u64) as usize]
                    .to_string()
                    .into_bytes(),
                "application/x-ndjson",
            ),
            _ => (
                (0..(next() % 200))
                    .map(|_| (next() % 256) as u8)
                    .collect::<Vec<u8>>(),
                "application/vnd.apache.arrow.stream",
            ),
        };
        let (status, reply) = c
            .raw("POST", "/api/v1/stores/tickets/records", ct, body.clone())
            .await
            .unwrap();
        assert!(
            status < 500,
            "round {round}: {status} for {:?}: {}",
            String::from_utf8_lossy(&body),
            String::from_utf8_lossy(&reply)
        );
    }
    assert_eq!(c.health().await.unwrap()["status"], "ok");
}

/// The OpenAPI document: generated from the routes' own annotations, valid
/// OpenAPI 3.1 (checked by openapi-spec-validator, which `make test-deps`
/// installs with moto), and listing every route the server answers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_openapi_document_is_valid_and_lists_every_route() {
    let dir = tempfile::tempdir().unwrap();
    let server = ServerProc::start(dir.path(), &[]);
    let c = server.client();
    let (status, body) = c
        .raw(
            "GET",
            "/api/v1/openapi.json",
            "application/json",
            Vec::new(),
        )
        .await
        .unwrap();
    assert_eq!(status, 200);
    let doc: Value = serde_json::from_slice(&body).unwrap();
    assert!(
        doc["openapi"].as_str().unwrap().starts_with("3.1"),
        "{}",
        doc["openapi"]
    );
    let paths = doc["paths"].as_object().unwrap();
    for (path, methods) in [
        ("/health", &["get"][..]),
        ("/ready", &["get"]),
        ("/api/v1/stores", &["get", "post"]),
        ("/api/v1/stores/{name}", &["get", "delete"]),
        ("/api/v1/stores/{name}/records", &["get", "post"]),
        (
            "/api/v1/stores/{name}/records/{key}",
            &["get", "delete", "patch"],
        ),
        ("/api/v1/stores/{name}/lookup", &["post"]),
        ("/api/v1/stores/{name}/upsert", &["post"]),
        ("/api/v1/stores/{name}/queries/{query}", &["post"]),
        ("/api/v1/stores/{name}/search", &["post"]),
        ("/api/v1/stores/{name}/merge", &["post"]),
        ("/api/v1/stores/{name}/compact", &["post"]),
        ("/api/v1/stores/{name}/index", &["post"]),
        ("/api/v1/stores/{name}/stats", &["get"]),
        ("/api/v1/openapi.json", &["get"]),
    ] {
        let item = paths
            .get(path)
            .unwrap_or_else(|| panic!("{path} missing from the document"));
        for m in methods {
            assert!(item.get(*m).is_some(), "{m} {path} missing");
        }
        // Every documented route answers (not the fallback's "no such route").
        let url_path = path
            .replace("{name}", "nope")
            .replace("{key}", "k")
            .replace("{query}", "q");
        let (status, body) = c
            .raw(
                &methods[0].to_uppercase(),
                &url_path,
                "application/json",
                b"{}".to_vec(),
            )
            .await
            .unwrap();
        assert!(
            !String::from_utf8_lossy(&body).contains("no such route"),
            "{path}: {status}"
        );
    }
    // Every API operation documents its errors and its answer's schema.
    for (path, item) in paths {
        for (method, op) in item.as_object().unwrap() {
            let responses = op["responses"].as_object().unwrap();
            if path.starts_with("/api/v1/stores") {
                for status in ["400", "404", "500", "503"] {
                    assert!(
                        responses.contains_key(status),
                        "{method} {path}: no {status}"
                    );
                }
                let ok = responses
                    .iter()
                    .find(|(s, _)| s.starts_with('2'))
                    .unwrap_or_else(|| panic!("{method} {path}: no 2xx"));
                assert!(
                    ok.1["content"]["application/json"]["schema"].is_object(),
                    "{method} {path}: the answer has no schema: {}",
                    ok.1
                );
            }
        }
    }
    // Health, readiness and the document need no token; the API does.
    for path in ["/health", "/ready", "/api/v1/openapi.json"] {
        assert_eq!(paths[path]["get"]["security"], json!([{}]), "{path}");
    }
    assert_eq!(doc["security"], json!([{"bearer": []}]));
    // The Arrow body is binary, not an array of numbers; bounds are stated.
    let add = &paths["/api/v1/stores/{name}/records"]["post"]["requestBody"]["content"];
    assert_eq!(
        add["application/vnd.apache.arrow.stream"]["schema"],
        json!({"$ref": "#/components/schemas/ArrowStream"}),
    );
    assert_eq!(
        doc["components"]["schemas"]["ArrowStream"]["format"],
        "binary"
    );
    let limit = paths["/api/v1/stores/{name}/records"]["get"]["parameters"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == "limit")
        .unwrap();
    assert_eq!(limit["schema"]["maximum"], 10000, "{limit}");
    let file = dir.path().join("openapi.json");
    std::fs::write(&file, &body).unwrap();
    let out = std::process::Command::new("python3")
        .args([
            "-c",
            "import json, sys\nfrom openapi_spec_validator import validate\nvalidate(json.load(open(sys.argv[1])))",
            file.to_str().unwrap(),
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "openapi-spec-validator: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The CLI through a server: add (JSON Lines and Arrow), get, scan, query;
/// refusals name the input's lines; exit codes as locally.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_works_through_a_server() {
    let dir = tempfile::tempdir().unwrap();
    let tokens = dir.path().join("tokens.json");
    std::fs::write(
        &tokens,
        r#"{"tokens": [{"token": "admin-token-0123456789", "role": "admin"}]}"#,
    )
    .unwrap();
    let server = ServerProc::start(dir.path(), &["--tokens", tokens.to_str().unwrap()]);
    let c = server.client().with_token("admin-token-0123456789");
    c.create_store(&tickets()).await.unwrap();
    let url = server.url.clone();
    let root = dir.path().to_path_buf();
    let run = move |args: Vec<String>, stdin: String| {
        let root = root.clone();
        let url = url.clone();
        async move {
            tokio::task::spawn_blocking(move || {
                let mut all = vec![
                    "--json".to_string(),
                    "store".into(),
                    "--server".into(),
                    url,
                    "--token".into(),
                    "admin-token-0123456789".into(),
                ];
                all.extend(args);
                let refs: Vec<&str> = all.iter().map(String::as_str).collect();
                crate::support::cli(&root, &refs, stdin)
            })
            .await
            .unwrap()
        }
    };
    let mut lines = String::new();
    for i in 0..30 {
        lines.push_str(&format!(
            "{{\"id\": \"t{i:02}\", \"team\": \"a\", \"n\": {i}}}\n"
        ));
    }
    let (code, out, err) = run(
        vec![
            "add".into(),
            "tickets".into(),
            "-".into(),
            "--batch-rows".into(),
            "7".into(),
        ],
        lines,
    )
    .await;
    assert_eq!(code, 0, "{err}");
    let added: Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(added["records"], 30);
    assert_eq!(added["batches"], 5);
    let (code, _, err) = run(
        vec!["add".into(), "tickets".into(), "-".into()],
        "{\"id\": \"ok\"}\n\n{\"id\": \"bad\", \"n\": -3}\n".into(),
    )
    .await;
    assert_eq!(code, 2, "{err}");
    // With --json, stderr is one error object; its details name the input's
    // line, as from a local store.
    let e: Value = serde_json::from_str(err.trim()).expect("one JSON object on stderr");
    assert_eq!(e["error"]["kind"], "rejected", "{e}");
    assert_eq!(
        e["error"]["details"]["row_errors"][0]["at"], "line 3",
        "the input's line: {e}"
    );
    let (code, out, err) = run(
        vec!["get".into(), "tickets".into(), "t03".into()],
        String::new(),
    )
    .await;
    assert_eq!(code, 0, "{err}");
    assert_eq!(serde_json::from_str::<Value>(out.trim()).unwrap()["n"], 3);
    let (code, _, err) = run(
        vec!["get".into(), "tickets".into(), "zz".into()],
        String::new(),
    )
    .await;
    assert_eq!(code, 3, "{err}");
    let (code, out, err) = run(
        vec![
            "scan".into(),
            "tickets".into(),
            "--filter".into(),
            "n < 12".into(),
        ],
        String::new(),
    )
    .await;
    assert_eq!(code, 0, "{err}");
    assert_eq!(out.lines().count(), 12);
    let (code, out, err) = run(
        vec![
            "query".into(),
            "tickets".into(),
            "by_team".into(),
            "--arg".into(),
            "team=a".into(),
        ],
        String::new(),
    )
    .await;
    assert_eq!(code, 0, "{err}");
    assert_eq!(out.lines().count(), 30);
    // Maintenance goes through the server as well; what needs the data
    // root is refused, saying so.
    let (code, out, err) = run(vec!["merge".into(), "tickets".into()], String::new()).await;
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("merged"), "{out}");
    let (code, out, err) = run(vec!["versions".into(), "tickets".into()], String::new()).await;
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("\"current\":true"),
        "the current version marked: {out}"
    );
    let (code, _, err) = run(
        vec![
            "export".into(),
            "tickets".into(),
            "--output".into(),
            "x.jsonl".into(),
        ],
        String::new(),
    )
    .await;
    assert_eq!(code, 2, "not over --server: {err}");
    assert!(err.contains("needs the data root"), "{err}");
}

/// Findings of a review, each reproduced here: a half-sent request does not
/// hold shutdown; errors axum answers itself are JSON; a filter that cannot
/// be evaluated is 400, not 500; an anonymous create is 401 before its body
/// is read; the bearer scheme is case-insensitive.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn review_findings_of_the_server_stay_fixed() {
    use std::io::Write;
    let dir = tempfile::tempdir().unwrap();
    let tokens = dir.path().join("tokens.json");
    std::fs::write(
        &tokens,
        r#"{"tokens": [{"token": "admin-token-0123456789", "role": "admin"}]}"#,
    )
    .unwrap();
    let server = ServerProc::start(
        dir.path(),
        &[
            "--tokens",
            tokens.to_str().unwrap(),
            "--request-timeout-secs",
            "1",
        ],
    );
    let c = server.client().with_token("admin-token-0123456789");
    c.create_store(&tickets()).await.unwrap();
    c.add("tickets", &[json!({"id": "a", "n": 1})])
        .await
        .unwrap();
    // 401 before the body is read.
    let (status, _) = server
        .client()
        .raw(
            "POST",
            "/api/v1/stores",
            "application/json",
            b"garbage".to_vec(),
        )
        .await
        .unwrap();
    assert_eq!(status, 401);
    // A lower-case scheme.
    let lower = reqwest_like_get(
        &server.url,
        "/api/v1/stores",
        "bearer admin-token-0123456789",
    );
    assert_eq!(lower, 200);
    // A wrong method: JSON error body.
    let (status, body) = c
        .raw(
            "PUT",
            "/api/v1/stores/tickets/records/a",
            "application/json",
            Vec::new(),
        )
        .await
        .unwrap();
    assert_eq!(status, 405);
    let e: Value = serde_json::from_slice(&body).expect("a JSON error body");
    assert_eq!(e["error"]["code"], "method_not_allowed");
    // A query string that does not parse: JSON too.
    let (status, body) = c
        .raw(
            "GET",
            "/api/v1/stores/tickets/records?limit=abc",
            "application/json",
            Vec::new(),
        )
        .await
        .unwrap();
    assert_eq!(status, 400);
    assert!(serde_json::from_slice::<Value>(&body).is_ok());
    // A filter that cannot be evaluated on the store: 400.
    let r = c
        .list(
            "tickets",
            &ListParams {
                filter: Some("id > 5".into()),
                ..ListParams::default()
            },
        )
        .await;
    let (status, message) = status_of(r);
    assert_eq!(status, 400, "{message}");
    // A client that sends half a request, then shutdown: the server still stops.
    let addr = server.url.trim_start_matches("http://").to_string();
    let mut half = std::net::TcpStream::connect(&addr).unwrap();
    half.write_all(b"POST /api/v1/stores/tickets/records HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer admin-token-0123456789\r\nContent-Length: 100\r\n\r\n[{")
        .unwrap();
    std::thread::sleep(std::time::Duration::from_millis(200));
    let started = std::time::Instant::now();
    let status = server.terminate();
    assert!(status.success(), "{status}");
    assert!(
        started.elapsed() < std::time::Duration::from_secs(15),
        "shutdown took {:?}",
        started.elapsed()
    );
    drop(half);
}

/// Findings of a security review, over REST: the engine's input limits
/// answer 400 naming the record and column — a search vector whose
/// distances overflow (before: 200 with null distances), a stored vector
/// likewise, a 2,000-byte id (before: stored), a value of a column only the
/// engine writes (before: stored) — and a re-added id answers 409
/// `already_exists` in a unique-key store, 201 elsewhere (newest wins).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn engine_input_limits_answer_400_with_the_record() {
    let dir = tempfile::tempdir().unwrap();
    let server = ServerProc::start(dir.path(), &[]);
    let c = server.client();
    c.create_store(&tickets()).await.unwrap();
    c.create_store(&CreateStore::builtin("mem", "context").param("embedding_dim", json!(4)))
        .await
        .unwrap();
    let record = |id: &str| json!({"id": id, "run_id": "r", "embedding": [0.1, 0.2, 0.3, 0.4]});
    c.add("mem", &[record("a")]).await.unwrap();
    let post = |path: String, body: Value| {
        let c = c.clone();
        async move {
            let (status, body) = c
                .raw(
                    "POST",
                    &path,
                    "application/json",
                    body.to_string().into_bytes(),
                )
                .await
                .unwrap();
            let body: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
            (status, body)
        }
    };
    let search = |vector: Value| {
        post(
            "/api/v1/stores/mem/search".into(),
            json!({"column": "embedding", "vector": vector, "k": 5}),
        )
    };
    let (status, body) = search(json!([3.4e38, 0.0, 0.0, 0.0])).await;
    assert_eq!(status, 400, "{body}");
    assert_eq!(body["error"]["code"], "invalid_input", "{body}");
    let (status, body) = search(json!([0.1, 0.2, 0.3, 0.5])).await;
    assert_eq!(status, 200, "{body}");
    assert!(body["records"][0]["_distance"].is_number(), "{body}");

    let add = |records: Value| post("/api/v1/stores/mem/records".into(), records);
    let long = "k".repeat(2000);
    let mut with_huge = record("h");
    with_huge["embedding"] = json!([3.0e38, 0.0, 0.0, 0.0]);
    let mut superseded = record("s");
    superseded["superseded_by_id"] = json!("a");
    let mut deleted = record("d");
    deleted["lifecycle_status"] = json!("deleted");
    for (refused, column, says) in [
        (record(&long), "id", "2000 bytes"),
        (with_huge, "embedding", "overflow"),
        (superseded, "superseded_by_id", "engine"),
        (deleted, "lifecycle_status", "reserved"),
    ] {
        let (status, body) = add(json!([record("ok"), refused])).await;
        assert_eq!(status, 400, "{body}");
        assert_eq!(body["error"]["details"]["record"], 1, "{body}");
        assert_eq!(body["error"]["details"]["column"], column, "{body}");
        let message = body["error"]["message"].as_str().unwrap();
        assert!(message.contains(says), "{body}");
    }
    // Nothing of a refused request was written; the one record is there.
    assert_eq!(c.stats("mem").await.unwrap().rows, 1);

    // A re-added id: 409 in a store with unique keys, naming the record…
    let (status, body) = add(json!([record("a")])).await;
    assert_eq!(status, 409, "{body}");
    assert_eq!(body["error"]["code"], "already_exists", "{body}");
    assert_eq!(body["error"]["details"]["record"], 0, "{body}");
    // …and newest wins elsewhere.
    for _ in 0..2 {
        c.add("tickets", &[json!({"id": "t", "n": 1})])
            .await
            .unwrap();
    }
    assert_eq!(c.stats("tickets").await.unwrap().rows, 1);
}

/// A GET with a raw Authorization header; the status.
fn reqwest_like_get(url: &str, path: &str, authorization: &str) -> u16 {
    use std::io::{Read, Write};
    let addr = url.trim_start_matches("http://");
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: x\r\nAuthorization: {authorization}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut answer = String::new();
    s.read_to_string(&mut answer).unwrap();
    answer
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0)
}

/// `lance-context --json serve`: every stderr line is one JSON object — the
/// server's own notices (`{"log": {"level": "INFO", …}}`) and nothing from
/// Lance's logging — through a store's creation, adds and keyed reads, up to
/// the shutdown.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_json_every_stderr_line_of_the_server_parses() {
    let dir = tempfile::tempdir().unwrap();
    let mut server = ServerProc::start(dir.path(), &["--json"]);
    let c = server.client();
    c.create_store(&tickets()).await.unwrap();
    let records: Vec<Value> = (0..20)
        .map(|i| json!({"id": format!("t{i}"), "team": "a", "n": i}))
        .collect();
    c.add("tickets", &records).await.unwrap();
    c.merge("tickets").await.unwrap();
    assert!(c.get("tickets", "t3").await.unwrap().is_some());
    let stderr = server.child.stderr.take().unwrap();
    assert!(server.terminate().success());
    let mut err = String::new();
    std::io::Read::read_to_string(&mut BufReader::new(stderr), &mut err).unwrap();
    let lines: Vec<Value> = err
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON: {l}: {e}")))
        .collect();
    let messages: Vec<&str> = lines
        .iter()
        .map(|l| l["log"]["message"].as_str().unwrap_or_default())
        .collect();
    assert!(
        messages
            .iter()
            .any(|m| m.starts_with("no tokens configured"))
            && messages.iter().any(|m| m.starts_with("stopped")),
        "{err}"
    );
    assert!(
        lines.iter().all(|l| l["log"]["level"] == "INFO"),
        "nothing to warn of: {err}"
    );
}

/// Read from `s` until the server closes it (end of stream or a reset) or
/// `within` passes; the time it took to close, with what was read.
fn wait_closed(
    s: &mut std::net::TcpStream,
    within: std::time::Duration,
) -> (Option<std::time::Duration>, Vec<u8>) {
    use std::io::Read;
    let started = std::time::Instant::now();
    let mut got = Vec::new();
    let mut buf = [0u8; 8192];
    while started.elapsed() < within {
        s.set_read_timeout(Some(std::time::Duration::from_millis(100)))
            .unwrap();
        match s.read(&mut buf) {
            Ok(0) => return (Some(started.elapsed()), got),
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) => {}
            Err(_) => return (Some(started.elapsed()), got),
        }
    }
    (None, got)
}

/// One raw request on a new connection (the server closes it: the request
/// says `Connection: close` or is refused); the status and the body.
fn raw_exchange(addr: &str, request: &[u8]) -> (u16, Vec<u8>) {
    use std::io::Write;
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    // The server may answer before reading everything sent.
    let _ = s.write_all(request);
    let (closed, answer) = wait_closed(&mut s, std::time::Duration::from_secs(10));
    assert!(closed.is_some(), "the connection stayed open");
    let text = String::from_utf8_lossy(&answer);
    let status = text
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = match answer.windows(4).position(|w| w == b"\r\n\r\n") {
        Some(at) => answer[at + 4..].to_vec(),
        None => Vec::new(),
    };
    (status, body)
}

/// Issue 37: a connection that sends part of a request line and stops, one
/// that sends a header line every half second, and one that stays idle
/// after a complete request are each closed by the server at its timeout
/// (before: held for minutes); a kept-alive connection idle past the header
/// timeout, but within the idle timeout, still serves its next request.
#[test]
fn slow_and_idle_connections_are_closed_at_their_timeouts() {
    use std::io::Write;
    use std::time::{Duration, Instant};
    let dir = tempfile::tempdir().unwrap();
    let server = ServerProc::start(
        dir.path(),
        &["--header-timeout-secs", "1", "--idle-timeout-secs", "2"],
    );
    let addr = server.addr();
    // (a) half a request line, then nothing.
    let half = {
        let addr = addr.clone();
        std::thread::spawn(move || {
            let mut s = std::net::TcpStream::connect(&addr).unwrap();
            s.write_all(b"GET /hea").unwrap();
            wait_closed(&mut s, Duration::from_secs(6)).0
        })
    };
    // (b) a header line every 0.5 s.
    let trickle = {
        let addr = addr.clone();
        std::thread::spawn(move || {
            let mut s = std::net::TcpStream::connect(&addr).unwrap();
            let started = Instant::now();
            s.write_all(b"GET /health HTTP/1.1\r\nHost: x\r\n").unwrap();
            for i in 0..12 {
                if write!(s, "X-Slow-{i}: 1\r\n").is_err() {
                    return Some(started.elapsed());
                }
                if wait_closed(&mut s, Duration::from_millis(500)).0.is_some() {
                    return Some(started.elapsed());
                }
            }
            None
        })
    };
    // (c) a complete request, an idle wait longer than the header timeout,
    // a second request, then idle until the server closes.
    let idle = {
        let addr = addr.clone();
        std::thread::spawn(move || {
            let mut s = std::net::TcpStream::connect(&addr).unwrap();
            let mut answers = Vec::new();
            for _ in 0..2 {
                s.write_all(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
                    .unwrap();
                let (closed, got) = wait_closed(&mut s, Duration::from_millis(1500));
                assert!(closed.is_none(), "closed within the idle timeout");
                answers.push(String::from_utf8_lossy(&got).to_string());
            }
            (answers, wait_closed(&mut s, Duration::from_secs(6)).0)
        })
    };
    // Every case is checked before failing, so that each one's result shows.
    let mut problems = Vec::new();
    let half = half.join().unwrap();
    if half.is_none_or(|t| t >= Duration::from_secs(3)) {
        problems.push(format!("a half-sent request line was held: {half:?}"));
    }
    let trickle = trickle.join().unwrap();
    if trickle.is_none_or(|t| t >= Duration::from_secs(3)) {
        problems.push(format!(
            "a connection sending a header line every 0.5 s was held: {trickle:?}"
        ));
    }
    let (answers, idle) = idle.join().unwrap();
    if !answers.iter().all(|a| a.starts_with("HTTP/1.1 200")) {
        problems.push(format!("a kept-alive request failed: {answers:?}"));
    }
    if !idle.is_some_and(|t| t >= Duration::from_millis(300) && t < Duration::from_secs(3)) {
        problems.push(format!(
            "an idle connection was not closed at the idle timeout: {idle:?}"
        ));
    }
    assert!(problems.is_empty(), "{problems:#?}");
}

/// Issue 37: with `--max-connections 8`, 50 connections that send nothing
/// do not raise the server's open files beyond the cap (before: one each),
/// `/health` still answers while they are open (the longest-idle one is
/// closed to make room), and once the header timeout has closed them the
/// server's files are back to where they were.
#[test]
fn the_connection_cap_bounds_the_servers_open_files() {
    use std::time::Duration;
    let dir = tempfile::tempdir().unwrap();
    let server = ServerProc::start(
        dir.path(),
        &[
            "--max-connections",
            "8",
            "--header-timeout-secs",
            "3",
            "--idle-timeout-secs",
            "3",
        ],
    );
    let addr = server.addr();
    let health = b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
    assert_eq!(raw_exchange(&addr, health).0, 200);
    let base = server.open_fds();
    let idle: Vec<std::net::TcpStream> = (0..50)
        .map(|_| std::net::TcpStream::connect(&addr).unwrap())
        .collect();
    std::thread::sleep(Duration::from_millis(500));
    let open = server.open_fds();
    assert!(
        open <= base + 8 + 2,
        "{open} files open with 50 idle connections (base {base}, cap 8)"
    );
    let started = std::time::Instant::now();
    assert_eq!(raw_exchange(&addr, health).0, 200);
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "/health waited {:?} behind idle connections",
        started.elapsed()
    );
    assert!(server.open_fds() <= base + 8 + 2);
    // The header timeout closes them all.
    std::thread::sleep(Duration::from_secs(4));
    assert_eq!(raw_exchange(&addr, health).0, 200);
    let after = server.open_fds();
    assert!(after <= base + 1, "{after} files open after (base {base})");
    drop(idle);
}

/// Issue 37: a URI or a request head too large is answered with the API's
/// JSON error body (before: 414 and 431 with empty bodies), as is a request
/// line that does not parse.
#[test]
fn oversized_uris_and_heads_get_json_error_bodies() {
    let dir = tempfile::tempdir().unwrap();
    let server = ServerProc::start(dir.path(), &[]);
    let addr = server.addr();
    let long_uri = format!(
        "GET /api/v1/stores/{} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
        "a".repeat(100_000)
    );
    let many_headers: String = (0..100)
        .map(|i| format!("X-Filler-{i}: {}\r\n", "v".repeat(1000)))
        .collect();
    let one_header = format!("X-Filler: {}\r\n", "v".repeat(100_000));
    let head = |headers: &str| {
        format!("GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n{headers}\r\n")
    };
    let mut problems = Vec::new();
    for (what, request, status, code) in [
        ("a 100 KB URI", long_uri, 414, "uri_too_long"),
        (
            "100 KB in 100 headers",
            head(&many_headers),
            431,
            "headers_too_large",
        ),
        (
            "a 100 KB header",
            head(&one_header),
            431,
            "headers_too_large",
        ),
        (
            "a request line that does not parse",
            "GE(T / HTTP/1.1\r\nHost: x\r\n\r\n".to_string(),
            400,
            "invalid_input",
        ),
    ] {
        let (got, body) = raw_exchange(&addr, request.as_bytes());
        let e: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
        if got != status || e["error"]["code"] != code || !e["error"]["message"].is_string() {
            problems.push(format!(
                "{what}: {got} {:?}, expected {status} with code {code}",
                String::from_utf8_lossy(&body)
            ));
        }
    }
    assert!(problems.is_empty(), "{problems:#?}");
    // The server still serves.
    let health = b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
    assert_eq!(raw_exchange(&addr, health).0, 200);
}

/// GET `path` without a token; the status.
async fn status_of_get(server: &ServerProc, path: &str) -> u16 {
    server
        .client()
        .raw("GET", path, "application/json", Vec::new())
        .await
        .unwrap()
        .0
}

/// An admin token limited to store `a` cannot reach another tenant's data
/// through a store's uri, however it is spelt (the registry's table of
/// spellings), nor put a store outside the server's allowed prefixes (by
/// default `<root>/stores/`), nor name storage the server does not have: each
/// create is a 400 naming the uri, with no source file paths in it. After
/// every attempt the other tenants' stores keep their records, the listing
/// and `/ready` answer 200, and they still drop. A store name that is a path
/// (`..%2F..`) on DELETE is a 400 that leaves nothing on disk.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_scoped_admin_cannot_reach_other_tenants_data_through_a_uri() {
    let dir = tempfile::tempdir().unwrap();
    let dir = std::fs::canonicalize(dir.path()).unwrap();
    let root = dir.join("root");
    let root_arg = root.to_str().unwrap();
    // Store c, outside the root, is the operator's (the CLI is unrestricted).
    let spec_file = dir.join("tickets.json");
    std::fs::write(&spec_file, TICKETS).unwrap();
    let c_uri = dir.join("elsewhere/c").to_string_lossy().into_owned();
    let (code, _, err) = crate::support::cli(
        &dir,
        &[
            "store",
            "create",
            "c",
            "--root",
            root_arg,
            "--spec",
            spec_file.to_str().unwrap(),
            "--uri",
            &c_uri,
        ],
        "",
    );
    assert_eq!(code, 0, "{err}");
    let tokens = dir.join("tokens.json");
    std::fs::write(
        &tokens,
        r#"{"tokens": [
            {"token": "admin-a-token-0123456789", "role": "admin", "stores": ["a"]},
            {"token": "admin-token-0123456789", "role": "admin"}]}"#,
    )
    .unwrap();
    let server = ServerProc::start(&root, &["--tokens", tokens.to_str().unwrap()]);
    let tenant = server.client().with_token("admin-a-token-0123456789");
    let admin = server.client().with_token("admin-token-0123456789");
    let spec: Value = serde_json::from_str(TICKETS).unwrap();
    let create_a = |uri: &str| CreateStore {
        uri: Some(uri.to_string()),
        ..CreateStore::spec("a", spec.clone())
    };

    // Before any other store exists: a store around the stores directory
    // would hold every later tenant's data (and its drop would wipe them).
    let (status, message) = status_of(
        tenant
            .create_store(&create_a(&format!("FILE://{root_arg}/stores")))
            .await,
    );
    assert_eq!(status, 400, "{message}");

    admin
        .create_store(&CreateStore::spec("b", spec.clone()))
        .await
        .unwrap();
    for victim in ["b", "c"] {
        admin
            .add(victim, &[json!({"id": "1", "n": 1})])
            .await
            .unwrap();
    }
    std::os::unix::fs::symlink(root.join("stores/b"), dir.join("link")).unwrap();

    let mut refused = crate::registry::hostile_uris(&dir, &root);
    refused.extend([
        // Outside the allowed prefix (the root's stores/).
        dir.join("free/a").to_string_lossy().into_owned(),
        format!("file://{}/free/a", dir.display()),
        // Storage this server does not have, or may not use.
        "s3://bucket/tenants/a".to_string(),
        "http://127.0.0.1:9/a".to_string(),
        "https://127.0.0.1:9/a".to_string(),
        "gs://bucket/a".to_string(),
        "az://container/a".to_string(),
        "memory:///a".to_string(),
    ]);
    for uri in refused {
        let before = crate::registry::tree(&dir);
        let (status, message) = status_of(tenant.create_store(&create_a(&uri)).await);
        assert_eq!(status, 400, "{uri}: {message}");
        assert!(
            message.contains(&uri),
            "{uri}: the message names it: {message}"
        );
        assert!(
            !message.contains(".rs:"),
            "{uri}: a source path in the message: {message}"
        );
        assert_eq!(crate::registry::tree(&dir), before, "{uri}: it wrote");
        for victim in ["b", "c"] {
            assert!(
                admin.get(victim, "1").await.unwrap().is_some(),
                "{uri}: {victim}"
            );
        }
        assert_eq!(status_of_get(&server, "/ready").await, 200, "{uri}");
        assert_eq!(admin.list_stores().await.unwrap().len(), 2, "{uri}");
    }

    // A stray directory where entries are does not break the listing.
    std::fs::create_dir_all(root.join("registry/stores/zz.json/_versions")).unwrap();
    assert_eq!(admin.list_stores().await.unwrap().len(), 2);
    assert_eq!(status_of_get(&server, "/ready").await, 200);

    // A name that is a path: 400, and nothing on disk.
    let before = crate::registry::tree(&dir);
    for path in [
        "/api/v1/stores/..%2F..%2F..%2Fpwned",
        "/api/v1/stores/..%2F..%2Fpwned",
    ] {
        let (status, body) = admin
            .raw("DELETE", path, "application/json", Vec::new())
            .await
            .unwrap();
        assert_eq!(status, 400, "{path}: {}", String::from_utf8_lossy(&body));
    }
    assert_eq!(crate::registry::tree(&dir), before);

    // Its own place is the tenant's; the other stores still drop.
    let own = format!("file://{root_arg}/stores/a");
    tenant.create_store(&create_a(&own)).await.unwrap();
    tenant.drop_store("a").await.unwrap();
    for victim in ["b", "c"] {
        admin.drop_store(victim).await.unwrap();
    }
    assert!(!root.join("stores/b").exists());
    assert!(!dir.join("elsewhere/c").exists());
}

/// `serve --allow-uri-prefix` replaces the default prefix (the root's
/// `stores/`): a uri inside a given prefix is created however it is spelt,
/// the root's `stores/` is refused unless given too, a store without a uri
/// still goes to the root; a prefix that names no location stops the server
/// at start.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn allowed_uri_prefixes_replace_the_default_and_are_checked_at_start() {
    let dir = tempfile::tempdir().unwrap();
    let dir = std::fs::canonicalize(dir.path()).unwrap();
    let root = dir.join("root");
    let tenants = format!("{}/tenants/", dir.display());
    let server = ServerProc::start(&root, &["--allow-uri-prefix", &tenants]);
    let c = server.client();
    let spec: Value = serde_json::from_str(TICKETS).unwrap();
    let create = |name: &str, uri: Option<String>| CreateStore {
        uri,
        ..CreateStore::spec(name, spec.clone())
    };
    let inside = format!("FILE://{}/tenants/x/../a", dir.display());
    let a = c.create_store(&create("a", Some(inside))).await.unwrap();
    assert!(dir.join("tenants/a/_versions").is_dir(), "{a:?}");
    let own_place = format!("{}/stores/b", root.display());
    let (status, message) = status_of(c.create_store(&create("b", Some(own_place))).await);
    assert_eq!(status, 400, "{message}");
    assert!(message.contains("outside the locations"), "{message}");
    c.create_store(&create("b", None)).await.unwrap();
    assert!(root.join("stores/b/_versions").is_dir());
    for name in ["a", "b"] {
        c.drop_store(name).await.unwrap();
    }
    drop(server);

    let (code, _, err) = crate::support::cli(
        &dir,
        &[
            "serve",
            "--root",
            root.to_str().unwrap(),
            "--addr",
            "127.0.0.1:0",
            "--allow-uri-prefix",
            "http://127.0.0.1:9/stores/",
        ],
        "",
    );
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("no storage for scheme 'http'"), "{err}");
}
