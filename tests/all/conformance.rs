//! The store API's conformance suite: one script of every operation, run
//! against each implementation of [`StoreApi`] — the embedded one keeping
//! stores open (as the server runs it), the embedded one opening a store
//! per call (as the CLI runs it), and the client of a real server on
//! loopback. Each run is checked on its own, and the three transcripts
//! (every value and every error: status, code, message, details) must be
//! the same once what differs by nature (time, a data root's path, a fresh
//! id) is masked.

use std::path::Path;
use std::sync::Arc;

use base64::Engine as _;

use lance_context_client::{
    ClientError, Condition, CountParams, CreateStore, GetMany, ListParams, QueryRequest,
    RecordsBody, RetrieveRequest, SearchRequest, StoreApi, TextLeg, UpgradeStore, VectorLeg,
};
use lance_context_host::{
    Embedded, EmbeddedConfig, PluginLimits, PluginRuntime, Registry, Residency,
};
use serde_json::{Value, json};

use crate::server::ServerProc;

const TICKETS: &str = r#"{"name": "tickets", "key": "id", "columns": [
    {"name": "id", "type": "Utf8", "nullable": false},
    {"name": "team", "type": "Utf8", "rules": {"one_of": ["a", "b"]}},
    {"name": "n", "type": "Int32", "rules": {"min": 0}},
    {"name": "data", "type": "LargeBinary"}],
  "queries": [{"name": "by_team", "description": "one team", "params": ["team"],
               "filter": "team = {team}", "order_by": ["id"]}]}"#;

/// Every step's outcome, in order.
#[derive(Debug, Default)]
struct Transcript {
    steps: Vec<(String, Value)>,
}

impl Transcript {
    /// Record a call's outcome: its value, or its error as the API gives it.
    fn note<T: serde::Serialize>(&mut self, step: &str, result: Result<T, ClientError>) -> Value {
        let outcome = match result {
            Ok(v) => json!({"ok": serde_json::to_value(v).unwrap()}),
            Err(ClientError::Api { status, error }) => json!({"error": {
                "status": status, "code": error.code, "message": error.message,
                "details": error.details,
            }}),
            Err(other) => panic!("{step}: not an API error: {other}"),
        };
        self.steps.push((step.to_string(), outcome.clone()));
        outcome
    }

    fn ok(&mut self, step: &str, result: Result<impl serde::Serialize, ClientError>) -> Value {
        let outcome = self.note(step, result);
        match outcome.get("ok") {
            Some(v) => v.clone(),
            None => panic!("{step}: {outcome}"),
        }
    }

    fn err(&mut self, step: &str, result: Result<impl serde::Serialize, ClientError>) -> Value {
        let outcome = self.note(step, result);
        match outcome.get("error") {
            Some(e) => e.clone(),
            None => panic!("{step}: expected an error, got {outcome}"),
        }
    }
}

/// The script: every operation of the trait, values and errors, with the
/// answers every implementation must give checked as it goes.
async fn script<A: StoreApi>(api: &A) -> Transcript {
    let mut t = Transcript::default();
    let stores = t.ok("list (empty)", api.list_stores().await);
    assert_eq!(stores, json!([]));

    // The registry.
    let tickets = CreateStore::spec("tickets", serde_json::from_str(TICKETS).unwrap());
    let info = t.ok("create tickets", api.create_store(&tickets).await);
    assert_eq!(info["name"], "tickets");
    let again = t.err("create tickets again", api.create_store(&tickets).await);
    assert_eq!(
        (again["status"].as_u64(), again["code"].as_str()),
        (Some(409), Some("already_exists"))
    );
    let neither = CreateStore {
        name: "nothing".into(),
        ..CreateStore::default()
    };
    // A component under a file name of the caller's (spaces, any script).
    let named = CreateStore {
        name: "named".into(),
        plugin_wasm_base64: Some(
            base64::engine::general_purpose::STANDARD.encode(crate::plugins::bytes("rollout")),
        ),
        plugin_file_name: Some("my plügin v2.wasm".into()),
        ..CreateStore::default()
    };
    let info = t.ok(
        "create from a named component",
        api.create_store(&named).await,
    );
    assert_eq!(info["plugin"]["source"], "file:my plügin v2.wasm", "{info}");
    t.ok("drop it", api.drop_store("named").await);
    let e = t.err("create from nothing", api.create_store(&neither).await);
    assert_eq!(e["code"], "invalid_input");
    let e = t.err(
        "create with a bad name",
        api.create_store(&CreateStore::builtin("../up", "rollout"))
            .await,
    );
    assert_eq!(e["code"], "invalid_input");
    t.ok(
        "create mem",
        api.create_store(&CreateStore::builtin("mem", "context").param("embedding_dim", json!(4)))
            .await,
    );
    let described = t.ok("describe tickets", api.describe_store("tickets").await);
    assert_eq!(described["spec"]["key"], "id");
    let e = t.err("describe missing", api.describe_store("nope").await);
    assert_eq!(
        (e["status"].as_u64(), e["code"].as_str()),
        (Some(404), Some("not_found"))
    );
    let names: Vec<String> = api
        .list_stores()
        .await
        .unwrap()
        .into_iter()
        .map(|s| s.name)
        .collect();
    assert_eq!(names, ["mem", "tickets"]);

    // (In parts: one future of every step overflows a test thread's stack.)
    Box::pin(adds(api, &mut t)).await;
    Box::pin(reads(api, &mut t)).await;
    Box::pin(writes(api, &mut t)).await;
    Box::pin(searches(api, &mut t)).await;
    Box::pin(maintenance(api, &mut t)).await;
    t
}

/// The records of the tickets store.
fn ticket_records() -> Vec<Value> {
    (0..12)
        .map(|i| json!({"id": format!("t{i:02}"), "team": if i % 2 == 0 {"a"} else {"b"}, "n": i, "data": "3q2+7w=="}))
        .collect()
}

/// Adds in the three forms, and refusals that name the record.
async fn adds<A: StoreApi>(api: &A, t: &mut Transcript) {
    let records = ticket_records();
    let added = t.ok("add array", api.add("tickets", &records[..8]).await);
    assert_eq!(added["added"], 8);
    let lines: String = records[8..10].iter().map(|r| format!("{r}\n")).collect();
    let added = t.ok(
        "add lines",
        api.add_records("tickets", RecordsBody::JsonLines(lines.into_bytes()))
            .await,
    );
    assert_eq!(added["added"], 2);
    let arrow = tickets_arrow(&records[10..]);
    let added = t.ok(
        "add arrow",
        api.add_records("tickets", RecordsBody::Arrow(arrow)).await,
    );
    assert_eq!(added["added"], 2);
    let bad = [
        json!({"id": "x1", "team": "a", "n": 1}),
        json!({"id": "x2", "team": "z", "n": -1}),
    ];
    let e = t.err("add refused", api.add("tickets", &bad).await);
    assert_eq!(e["status"], 422, "{e}");
    assert!(
        e["details"]["row_errors"]
            .as_array()
            .is_some_and(|r| r.iter().all(|r| r["record"] == 1)),
        "{e}"
    );
    let e = t.err(
        "add a line that is not JSON",
        api.add_records(
            "tickets",
            RecordsBody::JsonLines(b"{\"id\": \"y\"}\n\n{oops\n".to_vec()),
        )
        .await,
    );
    assert_eq!(
        (e["code"].as_str(), e["details"]["line"].as_u64()),
        (Some("invalid_input"), Some(3)),
        "{e}"
    );
    let e = t.err(
        "add a wrong type",
        api.add("tickets", &[json!({"id": "y", "n": "many"})]).await,
    );
    assert_eq!(
        (e["code"].as_str(), e["details"]["column"].as_str()),
        (Some("invalid_input"), Some("n")),
        "{e}"
    );
    let e = t.err(
        "add an Arrow stream that is not one",
        api.add_records("tickets", RecordsBody::Arrow(b"not arrow".to_vec()))
            .await,
    );
    assert_eq!(e["code"], "invalid_input");
    let e = t.err(
        "add to a missing store",
        api.add("nope", &records[..1]).await,
    );
    assert_eq!(e["code"], "not_found");
    assert!(
        api.get("tickets", "x1").await.unwrap().is_none(),
        "nothing of a refused batch"
    );
}

/// Reads: get, lookups, pages, counts, named queries.
async fn reads<A: StoreApi>(api: &A, t: &mut Transcript) {
    let one = t.ok("get", api.get("tickets", "t03").await);
    assert_eq!(
        (one["n"].as_i64(), one["data"].as_str()),
        (Some(3), Some("3q2+7w=="))
    );
    let none = t.ok("get missing", api.get("tickets", "zz").await);
    assert_eq!(none, Value::Null);
    // A key a URL path cannot carry (the client reads it by a lookup).
    let none = t.ok("get a dot-dot key", api.get("tickets", "..").await);
    assert_eq!(none, Value::Null);
    let many = t.ok(
        "get_many",
        api.get_many("tickets", &["t11", "zz", "t00"]).await,
    );
    assert_eq!(many.as_array().map(Vec::len), Some(2));
    let mut params = ListParams {
        limit: Some(5),
        columns: Some("id,n".into()),
        ..ListParams::default()
    };
    let mut seen = Vec::new();
    loop {
        let page = t.ok("list page", api.list("tickets", &params).await);
        seen.extend(
            page["records"]
                .as_array()
                .unwrap()
                .iter()
                .map(|r| r["id"].as_str().unwrap().to_string()),
        );
        match page["next_cursor"].as_str() {
            Some(c) => params.cursor = Some(c.into()),
            None => break,
        }
    }
    assert_eq!(
        seen,
        (0..12).map(|i| format!("t{i:02}")).collect::<Vec<_>>()
    );
    let filtered = t.ok(
        "list filtered",
        api.list(
            "tickets",
            &ListParams {
                filter: Some("n >= 9".into()),
                order_by: Some("n:desc".into()),
                ..ListParams::default()
            },
        )
        .await,
    );
    assert_eq!(filtered["records"][0]["n"], 11);
    for (step, params) in [
        (
            "list a filter that calls a function",
            ListParams {
                filter: Some("lower(id) = 'x'".into()),
                ..ListParams::default()
            },
        ),
        (
            "list a bad limit",
            ListParams {
                limit: Some(0),
                ..ListParams::default()
            },
        ),
        (
            "list a bad cursor",
            ListParams {
                cursor: Some("!!".into()),
                ..ListParams::default()
            },
        ),
        (
            "list a bad order",
            ListParams {
                order_by: Some("n:sideways".into()),
                ..ListParams::default()
            },
        ),
    ] {
        let e = t.err(step, api.list("tickets", &params).await);
        assert_eq!(e["code"], "invalid_input", "{step}: {e}");
    }
    let by_team = t.ok(
        "query",
        api.query("tickets", "by_team", &[("team", "a")]).await,
    );
    assert_eq!(by_team["records"].as_array().map(Vec::len), Some(6));
    t.err("query unknown", api.query("tickets", "nope", &[]).await);
    t.err(
        "query without its argument",
        api.query("tickets", "by_team", &[]).await,
    );

    let projected = t.ok(
        "lookup with columns",
        api.lookup(
            "tickets",
            &GetMany {
                keys: vec!["t01".into(), "zz".into()],
                columns: Some(vec!["n".into()]),
                as_of: None,
            },
        )
        .await,
    );
    assert_eq!(projected, json!([{"id": "t01", "n": 1}]), "the key always");
    let e = t.err(
        "lookup an unknown column",
        api.lookup(
            "tickets",
            &GetMany {
                keys: vec!["t01".into()],
                columns: Some(vec!["nope".into()]),
                as_of: None,
            },
        )
        .await,
    );
    assert_eq!(e["code"], "invalid_input", "{e}");
    let e = t.err(
        "lookup a column named twice",
        api.lookup(
            "tickets",
            &GetMany {
                keys: vec!["t01".into()],
                columns: Some(vec!["n".into(), "n".into()]),
                as_of: None,
            },
        )
        .await,
    );
    assert_eq!(e["code"], "invalid_input", "{e}");
    let e = t.err(
        "list too many columns",
        api.list(
            "tickets",
            &ListParams {
                columns: Some(vec!["n"; 1001].join(",")),
                ..ListParams::default()
            },
        )
        .await,
    );
    assert_eq!(e["code"], "invalid_input", "{e}");
    // Pages by offset in an order with ties: each record once.
    let mut by_team = Vec::new();
    for offset in [0, 5, 10] {
        let page = t.ok(
            "list a page by offset in an order with ties",
            api.list(
                "tickets",
                &ListParams {
                    order_by: Some("team".into()),
                    columns: Some("id,team".into()),
                    limit: Some(5),
                    offset: Some(offset),
                    ..ListParams::default()
                },
            )
            .await,
        );
        for r in page["records"].as_array().unwrap() {
            assert_eq!(r.as_object().map(|o| o.len()), Some(2), "{r}");
            by_team.push(r["id"].as_str().unwrap().to_string());
        }
    }
    let distinct: std::collections::BTreeSet<&String> = by_team.iter().collect();
    assert_eq!((by_team.len(), distinct.len()), (12, 12), "{by_team:?}");
    // A page by cursor with columns that leave out the key: the key is not
    // added to the records.
    let page = t.ok(
        "list columns without the key",
        api.list(
            "tickets",
            &ListParams {
                columns: Some("n".into()),
                limit: Some(3),
                ..ListParams::default()
            },
        )
        .await,
    );
    assert_eq!(page["records"][0], json!({"n": 0}), "{page}");
    assert!(page["next_cursor"].is_string(), "{page}");
    let all = t.ok("count", api.count("tickets", &CountParams::default()).await);
    assert_eq!(all["count"], 12);
    let some = t.ok(
        "count filtered",
        api.count(
            "tickets",
            &CountParams {
                filter: Some("n >= 9".into()),
                as_of: None,
            },
        )
        .await,
    );
    assert_eq!(some["count"], 3);
    let e = t.err(
        "count a filter that calls a function",
        api.count(
            "tickets",
            &CountParams {
                filter: Some("lower(id) = 'x'".into()),
                as_of: None,
            },
        )
        .await,
    );
    assert_eq!(e["code"], "invalid_input", "{e}");
}

/// Deletes, upserts and patches.
async fn writes<A: StoreApi>(api: &A, t: &mut Transcript) {
    let records = ticket_records();
    let d = t.ok("delete", api.delete("tickets", "t00").await);
    assert_eq!(d["deleted"], true);
    let d = t.ok("delete again", api.delete("tickets", "t00").await);
    assert_eq!(d["deleted"], false);
    t.ok(
        "add two to delete",
        api.add(
            "tickets",
            &[
                json!({"id": "d1", "team": "a", "n": 1}),
                json!({"id": "d2", "team": "b", "n": 2}),
            ],
        )
        .await,
    );
    let d = t.ok(
        "delete many",
        api.delete_many("tickets", &["d1", "zz", "d2"]).await,
    );
    assert_eq!(
        d,
        json!([{"key": "d1", "deleted": true}, {"key": "zz", "deleted": false}, {"key": "d2", "deleted": true}])
    );
    t.ok(
        "add one to delete twice",
        api.add("tickets", &[json!({"id": "d3", "team": "a", "n": 3})])
            .await,
    );
    let d = t.ok(
        "delete a key given twice",
        api.delete_many("tickets", &["d3", "d3"]).await,
    );
    assert_eq!(
        d,
        json!([{"key": "d3", "deleted": true}, {"key": "d3", "deleted": false}])
    );
    let e = t.err(
        "delete many in a missing store",
        api.delete_many("nope", &["a"]).await,
    );
    assert_eq!(e["code"], "not_found");

    // Supersession: upsert, a dry run, patch; refused where not declared.
    let e = t.err(
        "upsert where not declared",
        api.upsert("tickets", &records[..1]).await,
    );
    assert_eq!(e["details"]["capability"], "supersession", "{e}");
    let e = t.err(
        "patch where not declared",
        api.patch("tickets", "t01", &json!({"n": 5})).await,
    );
    assert_eq!(e["details"]["capability"], "supersession", "{e}");
    let memories: Vec<Value> = (0..30)
        .map(|i| {
            json!({"id": format!("c{i:02}"), "run_id": "run", "text_payload": format!("note {i}"),
                        "embedding": [i as f32, 0.0, 1.0, 0.5]})
        })
        .collect();
    t.ok("add memories", api.add("mem", &memories).await);
    let up = t.ok(
        "upsert",
        api.upsert(
            "mem",
            &[json!({"id": "u1", "external_id": "ext-1", "run_id": "run", "text_payload": "a"})],
        )
        .await,
    );
    assert_eq!(up["outcomes"][0]["inserted"], true);
    let next = [json!({"id": "u2", "external_id": "ext-1", "run_id": "run", "text_payload": "b"})];
    let checked = t.ok("check upsert", api.check_upsert("mem", &next).await);
    assert_eq!(
        (
            checked["dry_run"].as_bool(),
            checked["outcomes"][0]["replaced_id"].as_str()
        ),
        (Some(true), Some("u1"))
    );
    assert!(
        api.get("mem", "u2").await.unwrap().is_none(),
        "a dry run writes nothing"
    );
    let up = t.ok("upsert again", api.upsert("mem", &next).await);
    assert_eq!(up["outcomes"][0]["replaced_id"], "u1");
    let patched = t.ok(
        "patch",
        api.patch("mem", "c01", &json!({"text_payload": "revised"}))
            .await,
    );
    assert_eq!(patched["supersedes"], "c01");
    let e = t.err(
        "patch missing",
        api.patch("mem", "zz", &json!({"text_payload": "x"})).await,
    );
    assert_eq!(e["code"], "not_found");
    let e = t.err(
        "patch with a non-object",
        api.patch("mem", "c02", &json!([1])).await,
    );
    assert_eq!(e["code"], "invalid_input");
}

/// Search and retrieval.
async fn searches<A: StoreApi>(api: &A, t: &mut Transcript) {
    let near = t.ok(
        "search vector",
        api.search(
            "mem",
            &SearchRequest::vector("embedding", vec![7.0, 0.0, 1.0, 0.5], 3),
        )
        .await,
    );
    assert_eq!(near[0]["id"], "c07");
    let words = t.ok(
        "search text",
        api.search("mem", &SearchRequest::text("text_payload", "note", 3))
            .await,
    );
    assert_eq!(words.as_array().map(Vec::len), Some(3));
    let e = t.err(
        "search a non-text column",
        api.search("mem", &SearchRequest::text("embedding", "note", 3))
            .await,
    );
    assert_eq!(e["code"], "invalid_input");
    let e = t.err(
        "search a non-finite vector",
        api.search(
            "mem",
            &SearchRequest::vector("embedding", vec![f32::NAN, 0.0, 1.0, 0.5], 3),
        )
        .await,
    );
    assert_eq!(e["code"], "invalid_input");
    let fused = t.ok(
        "retrieve",
        api.retrieve(
            "mem",
            &RetrieveRequest {
                vector: Some(VectorLeg {
                    column: "embedding".into(),
                    vector: vec![7.0, 0.0, 1.0, 0.5],
                    k: None,
                }),
                text: Some(TextLeg {
                    column: "text_payload".into(),
                    text: "note".into(),
                    operator: None,
                    k: None,
                }),
                k: 3,
                rrf_k: None,
                filter: None,
                conditions: vec![Condition::eq("id", "c07")],
            },
        )
        .await,
    );
    assert_eq!(fused[0]["id"], "c07");
    let e = t.err(
        "retrieve with a non-finite rrf_k",
        api.retrieve(
            "mem",
            &RetrieveRequest {
                vector: None,
                text: Some(TextLeg {
                    column: "text_payload".into(),
                    text: "note".into(),
                    operator: None,
                    k: None,
                }),
                k: 3,
                rrf_k: Some(f32::INFINITY),
                filter: None,
                conditions: Vec::new(),
            },
        )
        .await,
    );
    assert_eq!(e["code"], "invalid_input");
}

/// Maintenance and state, time travel, drops. (A resident store may have
/// merged in the background already.)
async fn maintenance<A: StoreApi>(api: &A, t: &mut Transcript) {
    let merged = t.ok("merge", api.merge("mem").await);
    assert!(merged["generations_merged"].is_u64(), "{merged}");
    t.ok("compact", api.compact("tickets").await);
    let indexed = t.ok("index", api.index("mem", None).await);
    assert_eq!(indexed["indexed"], json!(["embedding"]));
    let e = t.err(
        "index where none is declared",
        api.index("tickets", None).await,
    );
    assert_eq!(e["code"], "invalid_input");
    let stats = t.ok("stats", api.stats("tickets").await);
    assert_eq!(stats["rows"], 11);
    t.err("stats of a missing store", api.stats("nope").await);

    // Time travel: reads at a version of the base table. (How many
    // versions there are depends on background maintenance: not in the
    // transcript.)
    t.ok("merge tickets", api.merge("tickets").await);
    let versions = api.versions("tickets").await.unwrap();
    let current = versions
        .iter()
        .find(|v| v.current)
        .expect("a current version");
    assert!(current.timestamp.is_some());
    let at = Some(current.version);
    t.ok(
        "add after the version",
        api.add("tickets", &[json!({"id": "late", "team": "a", "n": 50})])
            .await,
    );
    let then = t.ok(
        "count as of",
        api.count(
            "tickets",
            &CountParams {
                filter: None,
                as_of: at,
            },
        )
        .await,
    );
    assert_eq!(then["count"], 11);
    let now = t.ok(
        "count now",
        api.count("tickets", &CountParams::default()).await,
    );
    assert_eq!(now["count"], 12);
    let page = t.ok(
        "list as of",
        api.list(
            "tickets",
            &ListParams {
                filter: Some("n >= 9".into()),
                as_of: at,
                ..ListParams::default()
            },
        )
        .await,
    );
    assert_eq!(page["records"].as_array().map(Vec::len), Some(3));
    let missing = t.ok(
        "lookup as of",
        api.lookup(
            "tickets",
            &GetMany {
                keys: vec!["late".into(), "t05".into()],
                columns: None,
                as_of: at,
            },
        )
        .await,
    );
    assert_eq!(missing.as_array().map(Vec::len), Some(1), "{missing}");
    let by_team = t.ok(
        "query as of",
        api.query_with(
            "tickets",
            "by_team",
            &QueryRequest {
                args: [("team".to_string(), "a".to_string())].into(),
                as_of: at,
            },
        )
        .await,
    );
    assert_eq!(by_team["records"].as_array().map(Vec::len), Some(5));
    let e = t.err(
        "count as of a version that does not exist",
        api.count(
            "tickets",
            &CountParams {
                filter: None,
                as_of: Some(1 << 40),
            },
        )
        .await,
    );
    assert_eq!(
        (e["code"].as_str(), e["details"]["as_of"].as_u64()),
        (Some("not_found"), Some(1 << 40)),
        "{e}"
    );
    t.err("versions of a missing store", api.versions("nope").await);

    // Upgrades: a store's plugin replaced by a build of the same schema;
    // the store answers through it at once.
    let same = UpgradeStore {
        plugin: Some("context".into()),
        ..UpgradeStore::default()
    };
    let upgraded = t.ok("upgrade", api.upgrade("mem", &same).await);
    assert_eq!(upgraded["from"]["sha256"], upgraded["to"]["sha256"]);
    assert_eq!(upgraded["removed_plugin_file"], false);
    assert!(api.get("mem", "c02").await.unwrap().is_some());
    let other = UpgradeStore {
        plugin: Some("rollout".into()),
        ..UpgradeStore::default()
    };
    let e = t.err(
        "upgrade to another schema",
        api.upgrade("mem", &other).await,
    );
    assert_eq!(e["code"], "invalid_input", "{e}");
    let e = t.err("upgrade a spec store", api.upgrade("tickets", &same).await);
    assert_eq!(e["code"], "invalid_input", "{e}");
    let unknown = UpgradeStore {
        plugin: Some("nope".into()),
        ..UpgradeStore::default()
    };
    let e = t.err(
        "upgrade to an unknown built-in",
        api.upgrade("mem", &unknown).await,
    );
    assert_eq!(e["code"], "invalid_input", "{e}");
    let e = t.err(
        "upgrade with a file name that is a path",
        api.upgrade(
            "mem",
            &UpgradeStore {
                plugin_wasm_base64: Some("AGFzbQ==".into()),
                plugin_file_name: Some("../x.wasm".into()),
                ..UpgradeStore::default()
            },
        )
        .await,
    );
    assert_eq!(e["code"], "invalid_input", "{e}");
    t.err("upgrade a missing store", api.upgrade("nope", &same).await);

    // Drops.
    let dropped = t.ok("drop", api.drop_store("tickets").await);
    assert_eq!(dropped["data_deleted"], true);
    t.err("drop again", api.drop_store("tickets").await);
    let names: Vec<String> = api
        .list_stores()
        .await
        .unwrap()
        .into_iter()
        .map(|s| s.name)
        .collect();
    assert_eq!(names, ["mem"]);
}

/// `records` of the tickets store as an Arrow IPC stream.
fn tickets_arrow(records: &[Value]) -> Vec<u8> {
    use arrow_array::{Int32Array, LargeBinaryArray, RecordBatch, StringArray};
    use arrow_schema::{DataType, Field, Schema};
    let schema = Arc::new(Schema::new(vec![
        Field::new("id", DataType::Utf8, false),
        Field::new("team", DataType::Utf8, true),
        Field::new("n", DataType::Int32, true),
        Field::new("data", DataType::LargeBinary, true),
    ]));
    let s =
        |k: &str| StringArray::from_iter(records.iter().map(|r| r[k].as_str().map(str::to_string)));
    let batch = RecordBatch::try_new(
        schema,
        vec![
            Arc::new(s("id")),
            Arc::new(s("team")),
            Arc::new(Int32Array::from_iter(
                records.iter().map(|r| r["n"].as_i64().map(|n| n as i32)),
            )),
            Arc::new(LargeBinaryArray::from_iter(
                records
                    .iter()
                    .map(|_| Some(&[0xde_u8, 0xad, 0xbe, 0xef][..])),
            )),
        ],
    )
    .unwrap();
    lance_context_wire::encode(&[batch]).unwrap()
}

/// What differs between runs by nature: times, durations, sizes on disk,
/// the data root's path, generated ids.
fn masked(value: &Value, root: &str) -> Value {
    const VOLATILE: &[&str] = &[
        "created_at",
        "seconds",
        "bytes_on_disk",
        "bytes",
        "newest_bytes",
        "unmerged_bytes",
        "peak_buffered_bytes",
        // A merge's time per phase.
        "phases",
        "_score",
        "_distance",
        "_rrf_score",
        "records_per_second",
    ];
    match value {
        Value::Object(map) => Value::Object(
            map.iter()
                .map(|(k, v)| match VOLATILE.contains(&k.as_str()) {
                    true => (k.clone(), Value::String("<masked>".into())),
                    false => (k.clone(), masked(v, root)),
                })
                .collect(),
        ),
        Value::Array(items) => Value::Array(items.iter().map(|v| masked(v, root)).collect()),
        Value::String(s) if is_uuid(s) => Value::String("<uuid>".into()),
        Value::String(s) => Value::String(s.replace(root, "<root>")),
        other => other.clone(),
    }
}

fn is_uuid(s: &str) -> bool {
    s.len() == 36
        && s.chars().enumerate().all(|(i, c)| match i {
            8 | 13 | 18 | 23 => c == '-',
            _ => c.is_ascii_hexdigit(),
        })
}

fn embedded(root: &Path, residency: Residency) -> Embedded {
    let runtime = Arc::new(
        PluginRuntime::new(
            PluginLimits::default(),
            Some(crate::support::compile_cache()),
        )
        .unwrap(),
    );
    let registry = Registry::at(root, runtime).unwrap();
    Embedded::new(
        registry,
        EmbeddedConfig {
            residency,
            ..EmbeddedConfig::default()
        },
    )
}

/// A maintenance report's or a store state's figures depend on when
/// background maintenance ran (a resident store merges on its own): their
/// fields are compared, and of the state the row count.
fn shape(step: &str, outcome: Value) -> Value {
    let Some(ok) = outcome.get("ok").and_then(Value::as_object) else {
        return outcome;
    };
    match step {
        "merge" | "compact" | "stats" | "status" => json!({
            // Said only when there is something to say.
            "fields": ok.keys().filter(|k| !matches!(k.as_str(), "maintenance_reason" | "last_background_error")).collect::<Vec<_>>(),
            "rows": ok.get("rows"),
        }),
        // How many fragments the base table has when the index is built
        // depends on background merges too.
        "index" => json!({
            "fields": ok.keys().collect::<Vec<_>>(),
            "column": ok.get("column"),
            "rows_in_base": ok.get("rows_in_base"),
            "covers_all_rows": ok.get("covers_all_rows"),
        }),
        _ => outcome,
    }
}

fn compare(name: &str, a: &Transcript, a_root: &Path, b: &Transcript, b_root: &Path) {
    assert_eq!(a.steps.len(), b.steps.len(), "{name}: the same steps");
    for ((step, x), (_, y)) in a.steps.iter().zip(&b.steps) {
        let x = shape(step, masked(x, a_root.to_str().unwrap()));
        let y = shape(step, masked(y, b_root.to_str().unwrap()));
        assert_eq!(x, y, "{name}: step '{step}' differs");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_operation_answers_the_same_embedded_and_through_a_server() {
    let resident_root = tempfile::tempdir().unwrap();
    let resident = embedded(resident_root.path(), Residency::Resident);
    // Boxed: the script's future is large (every operation inline).
    let resident_transcript = Box::pin(script(&resident)).await;
    resident.shutdown().await.unwrap();

    let per_call_root = tempfile::tempdir().unwrap();
    let per_call = embedded(per_call_root.path(), Residency::PerCall);
    let per_call_transcript = Box::pin(script(&per_call)).await;
    per_call.shutdown().await.unwrap();

    let server_root = tempfile::tempdir().unwrap();
    let server = ServerProc::start(server_root.path(), &[]);
    let server_transcript = Box::pin(script(&server.client())).await;

    compare(
        "resident vs per call",
        &resident_transcript,
        resident_root.path(),
        &per_call_transcript,
        per_call_root.path(),
    );
    compare(
        "embedded vs server",
        &resident_transcript,
        resident_root.path(),
        &server_transcript,
        server_root.path(),
    );
}

/// The CLI's store commands, each run where the data root is and through
/// a server: the same exit code, the same output (masked as above), the
/// same error kind and details.
#[test]
fn every_store_command_answers_the_same_locally_and_through_a_server() {
    let dir = tempfile::tempdir().unwrap();
    let local_root = dir.path().join("local");
    let server_root = dir.path().join("served");
    std::fs::create_dir_all(&server_root).unwrap();
    let server = ServerProc::start(&server_root, &[]);
    let spec = dir.path().join("tickets.json");
    std::fs::write(&spec, TICKETS).unwrap();
    let spec = spec.to_str().unwrap().to_string();
    let tickets: String = (0..6)
        .map(|i| {
            format!(
                "{}\n",
                json!({"id": format!("t{i}"), "team": if i % 2 == 0 {"a"} else {"b"}, "n": i})
            )
        })
        .collect();
    let memories: String = (0..25)
        .map(|i| format!("{}\n", json!({"id": format!("c{i:02}"), "run_id": "run", "text_payload": format!("note {i}"), "embedding": [i as f32, 0.0, 1.0, 0.5]})))
        .collect();
    // More than one page (10,000) of the server's.
    let many: String = (0..10_005)
        .map(|i| {
            format!(
                "{}\n",
                json!({"id": format!("m{i:05}"), "team": "a", "n": i})
            )
        })
        .collect();
    let upserts = format!(
        "{}\n",
        json!({"id": "u1", "external_id": "ext-1", "run_id": "run", "text_payload": "a"})
    );
    let upserts_again = format!(
        "{}\n",
        json!({"id": "u2", "external_id": "ext-1", "run_id": "run", "text_payload": "b"})
    );
    let sample = dir.path().join("sample.jsonl");
    std::fs::write(&sample, "{\"id\": \"s1\", \"team\": \"a\", \"n\": 1}\n").unwrap();
    let sample = sample.to_str().unwrap().to_string();
    let bad_sample = dir.path().join("bad-sample.jsonl");
    std::fs::write(&bad_sample, "{\"id\": \"s1\", \"team\": \"z\", \"n\": 1}\n").unwrap();
    let bad_sample = bad_sample.to_str().unwrap().to_string();
    // (step, arguments after `store`, stdin)
    let steps: Vec<(&str, Vec<&str>, &str)> = vec![
        (
            "create tickets",
            vec!["create", "tickets", "--spec", &spec],
            "",
        ),
        (
            "create tickets again",
            vec!["create", "tickets", "--spec", &spec],
            "",
        ),
        (
            "create mem",
            vec![
                "create",
                "mem",
                "--plugin",
                "context",
                "--param",
                "embedding_dim=4",
            ],
            "",
        ),
        ("list", vec!["list"], ""),
        ("describe", vec!["describe", "mem"], ""),
        ("describe missing", vec!["describe", "nope"], ""),
        ("add", vec!["add", "tickets", "-"], &tickets),
        (
            "add refused",
            vec!["add", "tickets", "-"],
            "{\"id\": \"x\", \"team\": \"z\"}\n",
        ),
        ("add memories", vec!["add", "mem", "-"], &memories),
        ("get", vec!["get", "tickets", "t1", "t2"], ""),
        (
            "get some columns",
            vec!["get", "tickets", "t1", "t3", "--columns", "n"],
            "",
        ),
        (
            "get as of the first version",
            vec!["get", "tickets", "t1", "--as-of", "1"],
            "",
        ),
        (
            "count as of the first version",
            vec!["count", "tickets", "--as-of", "1"],
            "",
        ),
        (
            "scan as of the first version",
            vec!["scan", "tickets", "--as-of", "1"],
            "",
        ),
        (
            "query as of the first version",
            vec![
                "query", "tickets", "by_team", "--arg", "team=b", "--as-of", "1",
            ],
            "",
        ),
        ("versions", vec!["versions", "tickets"], ""),
        ("versions of a missing store", vec!["versions", "nope"], ""),
        (
            "create with a sample",
            vec!["create", "sampled", "--spec", &spec, "--sample", &sample],
            "",
        ),
        (
            "create with a sample the plugin refuses",
            vec![
                "create",
                "refusing",
                "--spec",
                &spec,
                "--sample",
                &bad_sample,
            ],
            "",
        ),
        ("get missing", vec!["get", "tickets", "t1", "zz"], ""),
        (
            "scan",
            vec![
                "scan",
                "tickets",
                "--filter",
                "n >= 2",
                "--order-by",
                "n:desc",
            ],
            "",
        ),
        ("create many", vec!["create", "many", "--spec", &spec], ""),
        ("add many", vec!["add", "many", "-"], &many),
        (
            "scan many in an order",
            vec!["scan", "many", "--order-by", "n:desc", "--columns", "id,n"],
            "",
        ),
        (
            "scan many with a limit",
            vec!["scan", "many", "--limit", "10003", "--columns", "id"],
            "",
        ),
        (
            "scan many from an offset",
            vec!["scan", "many", "--offset", "9990", "--columns", "id"],
            "",
        ),
        (
            "count many",
            vec!["count", "many", "--filter", "n >= 5"],
            "",
        ),
        ("count", vec!["count", "tickets"], ""),
        (
            "count filtered",
            vec!["count", "tickets", "--filter", "team = 'a'"],
            "",
        ),
        ("queries", vec!["query", "tickets"], ""),
        (
            "query",
            vec!["query", "tickets", "by_team", "--arg", "team=b"],
            "",
        ),
        ("delete", vec!["delete", "tickets", "t0", "zz"], ""),
        (
            "upsert where not declared",
            vec!["upsert", "tickets", "-"],
            &upserts,
        ),
        ("upsert", vec!["upsert", "mem", "-"], &upserts),
        (
            "upsert dry run",
            vec!["upsert", "mem", "--dry-run", "-"],
            &upserts_again,
        ),
        ("upsert again", vec!["upsert", "mem", "-"], &upserts_again),
        (
            "patch",
            vec![
                "patch",
                "mem",
                "c01",
                "--set",
                "{\"text_payload\": \"revised\"}",
            ],
            "",
        ),
        (
            "patch missing",
            vec!["patch", "mem", "zz", "--set", "{\"text_payload\": \"x\"}"],
            "",
        ),
        (
            "search",
            vec![
                "search",
                "mem",
                "--column",
                "embedding",
                "--vector",
                "[7, 0, 1, 0.5]",
                "--k",
                "2",
            ],
            "",
        ),
        (
            "retrieve",
            vec![
                "retrieve",
                "mem",
                "--text-column",
                "text_payload",
                "--text",
                "note",
                "--k",
                "2",
            ],
            "",
        ),
        ("upgrade", vec!["upgrade", "mem", "--plugin", "context"], ""),
        (
            "upgrade a spec store",
            vec!["upgrade", "tickets", "--plugin", "rollout"],
            "",
        ),
        ("merge", vec!["merge", "mem"], ""),
        ("compact", vec!["compact", "tickets"], ""),
        ("index", vec!["index", "mem"], ""),
        ("index where none is declared", vec!["index", "tickets"], ""),
        ("status", vec!["status", "tickets"], ""),
        ("drop without --yes", vec!["drop", "tickets"], ""),
        ("drop", vec!["drop", "tickets", "--yes"], ""),
        ("get from a dropped store", vec!["get", "tickets", "t1"], ""),
    ];
    let run = |via: &[&str], args: &[&str], stdin: &str| {
        let mut all = vec!["--json", "store"];
        all.extend_from_slice(via);
        all.extend_from_slice(args);
        crate::support::cli(dir.path(), &all, stdin)
    };
    let local_via = ["--root", local_root.to_str().unwrap()];
    let server_via = ["--server", server.url.as_str()];
    for (step, args, stdin) in &steps {
        let (local_code, local_out, local_err) = run(&local_via, args, stdin);
        let (server_code, server_out, server_err) = run(&server_via, args, stdin);
        assert_eq!(
            local_code, server_code,
            "{step}: exit codes differ\nlocal: {local_err}\nserver: {server_err}"
        );
        let shown = |out: &str, root: &Path| -> Vec<Value> {
            out.lines()
                .map(|l| shape(step, json!({"ok": masked(&serde_json::from_str(l).unwrap(), root.to_str().unwrap())})))
                .collect()
        };
        // What differs by nature: a create's or a drop's location, and the
        // data root's files a drop removed (said only where the root is).
        let located = |mut v: Vec<Value>| {
            for v in &mut v {
                if let Some(uri) = v["ok"].get_mut("uri") {
                    *uri = json!("<uri>");
                }
                if let Some(ok) = v["ok"].as_object_mut() {
                    ok.remove("entry");
                    ok.remove("plugin_file");
                }
            }
            v
        };
        let expected_lines = match *step {
            "scan many in an order" => Some(10_005),
            "scan many with a limit" => Some(10_003),
            "scan many from an offset" => Some(15),
            _ => None,
        };
        if let Some(n) = expected_lines {
            assert_eq!(local_out.lines().count(), n, "{step}: locally");
            assert_eq!(server_out.lines().count(), n, "{step}: through the server");
        }
        // Without an order, which rows a limit or an offset picks is the
        // store's choice (a server pages in key order): their counts are
        // compared, above.
        // The base table's versions (and their times) depend on when
        // background maintenance ran (a server's stores merge on their own).
        let unordered = matches!(
            *step,
            "scan many with a limit" | "scan many from an offset" | "versions"
        );
        if !unordered {
            assert_eq!(
                located(shown(&local_out, &local_root)),
                located(shown(&server_out, &server_root)),
                "{step}: outputs differ"
            );
        }
        if local_code != 0 {
            let error = |err: &str| -> Value {
                let line = err
                    .lines()
                    .rev()
                    .find(|l| l.starts_with("{\"error\""))
                    .unwrap_or_else(|| panic!("{step}: no JSON error in {err}"));
                let e: Value = serde_json::from_str(line).unwrap();
                json!({"kind": e["error"]["kind"], "details": e["error"]["details"]})
            };
            assert_eq!(
                error(&local_err),
                error(&server_err),
                "{step}: errors differ"
            );
        }
    }
}

/// A store of the hostile test plugin (`{"mode": "loop"}` spins until the
/// call deadline).
fn hostile(name: &str) -> CreateStore {
    let wasm = std::fs::read(lance_context_host::built_plugin("test_hostile")).unwrap();
    let mut create = CreateStore::builtin(name, "rollout");
    create.plugin = None;
    create.plugin_wasm_base64 = Some(base64::engine::general_purpose::STANDARD.encode(wasm));
    create
}

fn code_of<T: std::fmt::Debug>(result: &Result<T, ClientError>) -> Option<&str> {
    match result {
        Err(ClientError::Api { error, .. }) => Some(error.code.as_str()),
        _ => None,
    }
}

/// A store dropped while an operation runs on it: no call meanwhile opens
/// it again (which would fence the running operation and keep a handle on
/// deleted data), and every call after the drop finds no store.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_store_dropped_while_busy_is_gone_for_every_later_call() {
    let root = tempfile::tempdir().unwrap();
    let api = Arc::new(embedded(root.path(), Residency::Resident));
    api.create_store(&hostile("hot")).await.unwrap();
    api.add("hot", &[json!({"id": "warm", "mode": ""})])
        .await
        .unwrap();
    // Spins in the plugin until the call deadline (5 s), holding a slot.
    let busy = tokio::spawn({
        let api = api.clone();
        async move { api.add("hot", &[json!({"id": "k", "mode": "loop"})]).await }
    });
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    let dropping = tokio::spawn({
        let api = api.clone();
        async move { api.drop_store("hot").await }
    });
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    let during = api.get("hot", "warm").await;
    assert_eq!(code_of(&during), Some("not_found"), "{during:?}");
    let busy = busy.await.unwrap();
    assert_eq!(code_of(&busy), Some("plugin_fault"), "{busy:?}");
    let dropped = dropping.await.unwrap().unwrap();
    assert!(dropped.data_deleted);
    let get = api.get("hot", "warm").await;
    assert_eq!(code_of(&get), Some("not_found"), "{get:?}");
    let add = api.add("hot", &[json!({"id": "late", "mode": ""})]).await;
    assert_eq!(code_of(&add), Some("not_found"), "{add:?}");
    let stats = api.stats("hot").await;
    assert_eq!(code_of(&stats), Some("not_found"), "{stats:?}");
    // The name is free again, and the new store works.
    let tickets = CreateStore::spec("hot", serde_json::from_str(TICKETS).unwrap());
    api.create_store(&tickets).await.unwrap();
    api.add("hot", &[json!({"id": "t1", "team": "a", "n": 1})])
        .await
        .unwrap();
    assert!(api.get("hot", "t1").await.unwrap().is_some());
    api.shutdown().await.unwrap();
}

/// Calls on a name while it is being created wait for the create and use
/// its store: no second writer fences the create's, so writes go on after.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn calls_racing_a_create_do_not_fence_the_new_store() {
    let root = tempfile::tempdir().unwrap();
    let api = Arc::new(embedded(root.path(), Residency::Resident));
    for round in 0..6 {
        let name = format!("s{round}");
        // A caller polling the name while it is created (in this task,
        // interleaved with the create at every await).
        let stop = std::sync::atomic::AtomicBool::new(false);
        let poll = async {
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let _ = api.get(&name, "x").await;
                tokio::task::yield_now().await;
            }
        };
        let tickets = CreateStore::spec(&name, serde_json::from_str(TICKETS).unwrap());
        let create = async {
            let created = api.create_store(&tickets).await;
            stop.store(true, std::sync::atomic::Ordering::Relaxed);
            created
        };
        let ((), created) = tokio::join!(poll, create);
        created.unwrap();
        for i in 0..3 {
            let added = api
                .add(
                    &name,
                    &[json!({"id": format!("t{i}"), "team": "a", "n": i})],
                )
                .await;
            assert!(added.is_ok(), "round {round}, add {i}: {added:?}");
        }
    }
    api.shutdown().await.unwrap();
}

/// An operator's write where the data root is (here `store merge`) fences
/// a running server's writer; the server takes the store back at its next
/// write, which says to retry, and every write after it lands.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_fenced_by_an_operators_command_takes_its_store_back() {
    let dir = tempfile::tempdir().unwrap();
    let server = ServerProc::start(dir.path(), &[]);
    let client = server.client();
    let tickets = CreateStore::spec("tickets", serde_json::from_str(TICKETS).unwrap());
    client.create_store(&tickets).await.unwrap();
    let record = |i: usize| json!({"id": format!("t{i}"), "team": "a", "n": i});
    client.add("tickets", &[record(0)]).await.unwrap();
    let (code, _, err) = tokio::task::spawn_blocking({
        let root = dir.path().to_path_buf();
        move || crate::support::cli(&root, &["store", "merge", "tickets", "--root", "."], "")
    })
    .await
    .unwrap();
    assert_eq!(code, 0, "{err}");
    // The first write may find the writer fenced: refused (it did not
    // land), saying to retry.
    let first = client.add("tickets", &[record(1)]).await;
    if let Err(ClientError::Api { error, .. }) = &first {
        assert!(error.message.contains("retry"), "{error:?}");
        client.add("tickets", &[record(1)]).await.unwrap();
    }
    for i in 2..6 {
        client.add("tickets", &[record(i)]).await.unwrap();
    }
    assert_eq!(client.stats("tickets").await.unwrap().rows, 6);
}

/// An operation's deadline counts the open of its store: a caller gets
/// `deadline` when opening the store (here: compiling its plugin in a
/// runtime without a compile cache) takes longer, instead of waiting for
/// the open; the open finishes on its own and the next call finds the
/// store open. Times are compared with the same open measured unbounded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operation_past_its_deadline_while_its_store_opens_answers_in_time() {
    use std::time::{Duration, Instant};
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let api = embedded(root, Residency::Resident);
    api.create_store(&CreateStore::builtin("runs", "rollout"))
        .await
        .unwrap();
    api.add("runs", &[json!({"id": "m1", "rollout_id": "r1"})])
        .await
        .unwrap();
    api.shutdown().await.unwrap();
    // A runtime of its own, no compile cache: each open compiles the plugin.
    let fresh = |deadline: Option<Duration>| {
        let runtime = Arc::new(PluginRuntime::new(PluginLimits::default(), None).unwrap());
        Embedded::new(
            Registry::at(root, runtime).unwrap(),
            EmbeddedConfig {
                deadline,
                ..EmbeddedConfig::default()
            },
        )
    };
    let unbounded = fresh(None);
    let started = Instant::now();
    assert!(unbounded.get("runs", "m1").await.unwrap().is_some());
    let open_time = started.elapsed();
    unbounded.shutdown().await.unwrap();

    let deadline = open_time / 10;
    let bounded = fresh(Some(deadline));
    let started = Instant::now();
    let refused = bounded.get("runs", "m1").await;
    let took = started.elapsed();
    assert_eq!(code_of(&refused), Some("deadline"), "{refused:?}");
    assert!(
        took < open_time / 2,
        "answered after {took:?}; the open takes {open_time:?}, the deadline is {deadline:?}"
    );
    // The open went on: the store is found open, and answers.
    let ready = Instant::now();
    loop {
        match bounded.get("runs", "m1").await {
            Ok(found) => {
                assert!(found.is_some());
                break;
            }
            Err(ClientError::Api { error, .. }) if error.code == "deadline" => {
                assert!(ready.elapsed() < open_time * 20, "never opened");
                tokio::time::sleep(open_time / 10).await;
            }
            Err(e) => panic!("{e}"),
        }
    }
    bounded.shutdown().await.unwrap();
}

/// A read at a version (`as_of`) opens the store for that read only, but in
/// a slot of the resident store like any other operation: a burst of them
/// is bounded by the store's concurrency limit (the rest answer `busy`),
/// not a store opened per request without limit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_at_a_version_are_bounded_like_any_operation() {
    use std::time::Duration;
    let dir = tempfile::tempdir().unwrap();
    let runtime = Arc::new(
        PluginRuntime::new(
            PluginLimits::default(),
            Some(crate::support::compile_cache()),
        )
        .unwrap(),
    );
    let api = Arc::new(Embedded::new(
        Registry::at(dir.path(), runtime).unwrap(),
        EmbeddedConfig {
            store_concurrency: 1,
            queue_wait: Duration::from_millis(1),
            ..EmbeddedConfig::default()
        },
    ));
    let tickets = CreateStore::spec("tickets", serde_json::from_str(TICKETS).unwrap());
    api.create_store(&tickets).await.unwrap();
    api.add("tickets", &ticket_records()).await.unwrap();
    api.merge("tickets").await.unwrap();
    let version = api
        .versions("tickets")
        .await
        .unwrap()
        .into_iter()
        .find(|v| v.current)
        .unwrap()
        .version;
    let at = CountParams {
        filter: None,
        as_of: Some(version),
    };
    assert_eq!(api.count("tickets", &at).await.unwrap().count, 12);
    let mut burst = tokio::task::JoinSet::new();
    for _ in 0..8 {
        let (api, at) = (api.clone(), at.clone());
        burst.spawn(async move { api.count("tickets", &at).await });
    }
    let (mut counted, mut busy) = (0, 0);
    while let Some(done) = burst.join_next().await {
        match done.unwrap() {
            Ok(c) => {
                assert_eq!(c.count, 12);
                counted += 1;
            }
            Err(ClientError::Api { error, .. }) if error.code == "busy" => busy += 1,
            Err(e) => panic!("{e}"),
        }
    }
    assert!(counted >= 1 && busy >= 1, "{counted} counted, {busy} busy");
    api.shutdown().await.unwrap();
}

/// A read at a version of a store kept open uses the plugin it holds: no
/// second load (which would take one of the runtime's loaders, shared by
/// every tenant). Shown by removing the pinned component from disk after
/// the store is open: the versioned read still answers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_at_a_version_loads_no_plugin_again() {
    let dir = tempfile::tempdir().unwrap();
    let api = embedded(dir.path(), Residency::Resident);
    let create = CreateStore {
        name: "runs".into(),
        plugin_wasm_base64: Some(
            base64::engine::general_purpose::STANDARD.encode(crate::plugins::bytes("rollout")),
        ),
        ..CreateStore::default()
    };
    api.create_store(&create).await.unwrap();
    api.add("runs", &[json!({"id": "m1", "rollout_id": "r1"})])
        .await
        .unwrap();
    api.merge("runs").await.unwrap();
    let version = api
        .versions("runs")
        .await
        .unwrap()
        .into_iter()
        .find(|v| v.current)
        .unwrap()
        .version;
    let pinned: Vec<_> = std::fs::read_dir(dir.path().join("registry/plugins"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "wasm"))
        .collect();
    assert_eq!(pinned.len(), 1, "{pinned:?}");
    std::fs::remove_file(&pinned[0]).unwrap();
    let at = CountParams {
        filter: None,
        as_of: Some(version),
    };
    assert_eq!(api.count("runs", &at).await.unwrap().count, 1);
    api.shutdown().await.unwrap();
}
