//! The hostile corpus: every misbehaviour of a plugin ends in its typed
//! error while the same host keeps serving the rollout plugin. Every case
//! runs inside a tokio runtime, as the CLI and the server run plugins (the
//! CLI cases spawn the real `lance-context` binary).

use std::sync::Arc;
use std::time::{Duration, Instant};

use arrow_array::{BinaryArray, Int64Array, RecordBatch, StringArray};
use arrow_schema::{DataType, Field, Schema};
use lance_context_host::{PinnedLoadError, PluginError, PluginLimits, PluginRuntime, Violation};
use lance_context_wire::craft;

use crate::plugins::{bytes, params, rollout_rows, runtime};
use crate::support::cli;

/// A one-row batch for the hostile plugin.
fn hostile(mode: &str, n: i64, payload: &[u8]) -> RecordBatch {
    RecordBatch::try_new(
        Arc::new(Schema::new(vec![
            Field::new("id", DataType::Utf8, false),
            Field::new("mode", DataType::Utf8, true),
            Field::new("payload", DataType::Binary, true),
            Field::new("n", DataType::Int64, true),
        ])),
        vec![
            Arc::new(StringArray::from(vec!["x"])),
            Arc::new(StringArray::from(vec![mode])),
            Arc::new(BinaryArray::from_iter_values([payload])),
            Arc::new(Int64Array::from(vec![n])),
        ],
    )
    .unwrap()
}

fn mode(m: &str) -> RecordBatch {
    hostile(m, 0, b"")
}

/// A one-row batch for the hostile plugin in mode `m`.
pub fn hostile_batch(m: &str) -> RecordBatch {
    mode(m)
}

fn limits() -> PluginLimits {
    PluginLimits {
        call_deadline: Duration::from_millis(500),
        memory_bytes: 64 << 20,
        output_bytes: 1 << 20,
        ..PluginLimits::default()
    }
}

#[derive(Clone, Copy, Debug)]
enum Export {
    Validate,
    Transform,
    Reduce,
}

fn run(
    plugin: &lance_context_host::LoadedPlugin,
    export: Export,
    batch: &RecordBatch,
) -> Result<(), PluginError> {
    match export {
        Export::Validate => plugin.validate(batch),
        Export::Transform => plugin.transform(batch, 1).map(drop),
        Export::Reduce => plugin.reduce("q", batch, 1).map(drop),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_misbehaviour_in_every_export_is_a_typed_error_and_the_host_keeps_serving() {
    let rt = runtime(limits());
    let good = rt.load("rollout", &bytes("rollout"), vec![]).unwrap();
    let bad = rt.load("hostile", &bytes("test_hostile"), vec![]).unwrap();
    let still_serving = || {
        good.validate(&rollout_rows(&["a"], &[Some("r")])).unwrap();
        good.transform(&rollout_rows(&["a"], &[Some("r")]), 1)
            .unwrap();
        bad.validate(&mode("behave")).unwrap();
    };
    for export in [Export::Validate, Export::Transform, Export::Reduce] {
        let started = Instant::now();
        let err = run(&bad, export, &mode("loop")).unwrap_err();
        assert!(
            matches!(err, PluginError::Timeout { .. }),
            "{export:?}: {err}"
        );
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "{export:?}: the deadline fired"
        );
        assert!(
            err.to_string().contains("hostile"),
            "names the plugin: {err}"
        );
        still_serving();

        let err = run(&bad, export, &mode("bomb")).unwrap_err();
        assert!(
            matches!(err, PluginError::MemoryLimit { .. }),
            "{export:?}: {err}"
        );
        still_serving();

        let err = run(&bad, export, &mode("panic")).unwrap_err();
        assert!(
            matches!(&err, PluginError::Panic { message, .. } if message.contains("panicked on purpose")),
            "{export:?}: {err}"
        );
        still_serving();

        let err = run(&bad, export, &mode("recurse")).unwrap_err();
        assert!(
            matches!(
                &err,
                PluginError::Trap { .. } | PluginError::MemoryLimit { .. }
            ),
            "{export:?}: {err}"
        );
        still_serving();

        // A sleep would park a host thread where no deadline reaches it: it
        // is refused at once instead.
        let started = Instant::now();
        let err = run(&bad, export, &mode("sleep")).unwrap_err();
        assert!(
            matches!(
                err,
                PluginError::Forbidden {
                    violation: Violation::Blocked,
                    ..
                }
            ),
            "{export:?}: {err}"
        );
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "{export:?}: did not sleep"
        );
        still_serving();

        let err = run(&bad, export, &mode("exit")).unwrap_err();
        assert!(
            matches!(
                err,
                PluginError::Forbidden {
                    violation: Violation::Exit,
                    ..
                }
            ),
            "{export:?}: {err}"
        );
        let err = run(&bad, export, &mode("random")).unwrap_err();
        assert!(
            matches!(
                err,
                PluginError::Forbidden {
                    violation: Violation::RandomTooLarge,
                    ..
                } | PluginError::MemoryLimit { .. }
            ),
            "{export:?}: {err}"
        );
        still_serving();

        // Writing to stderr is fine: a debug line, or a flood (captured,
        // bounded, never a trap).
        run(&bad, export, &mode("debug")).unwrap();
        run(&bad, export, &mode("stderr")).unwrap();
        still_serving();
    }

    // describe misbehaves the same way, at load.
    for (m, check) in [
        (
            "loop",
            (|e: &PluginError| matches!(e, PluginError::Timeout { .. }))
                as fn(&PluginError) -> bool,
        ),
        ("bomb", |e| matches!(e, PluginError::MemoryLimit { .. })),
        ("panic", |e| matches!(e, PluginError::Panic { .. })),
        ("sleep", |e| matches!(e, PluginError::Forbidden { .. })),
    ] {
        let err = rt
            .load("hostile", &bytes("test_hostile"), params(&[("mode", m)]))
            .unwrap_err();
        assert!(check(&err), "describe {m}: {err}");
        still_serving();
        // And `describe-text` (ABI 2), called on the same instance after it.
        let err = rt
            .load(
                "hostile",
                &bytes("test_hostile"),
                params(&[("text-mode", m)]),
            )
            .unwrap_err();
        assert!(check(&err), "describe-text {m}: {err}");
        still_serving();
    }
    // A text column that is not a column, or a tokenizer Lance lacks: the
    // declaration is refused with the problem named.
    for (p, field) in [
        (vec![("text", "nope")], "text_columns[0].column"),
        (
            vec![("text", "id"), ("tokenizer", "klingon")],
            "text_columns[0].tokenizer",
        ),
    ] {
        let err = rt
            .load("hostile", &bytes("test_hostile"), params(&p))
            .unwrap_err();
        assert!(
            matches!(&err, PluginError::InvalidDeclaration { problems, .. }
                if problems.iter().any(|x| x.field == field)),
            "{p:?}: {err}"
        );
    }
    // A 0.1.0 component claiming ABI 2 lacks `describe-text`: refused, typed.
    let err = rt
        .load("abi1", &bytes("test_abi1"), params(&[("abi", "2")]))
        .unwrap_err();
    assert!(
        matches!(&err, PluginError::InvalidDeclaration { problems, .. }
            if problems.iter().any(|x| x.message.contains("describe-text"))),
        "{err}"
    );
    // And an ABI this host does not know.
    let err = rt
        .load("abi1", &bytes("test_abi1"), params(&[("abi", "3")]))
        .unwrap_err();
    assert!(
        matches!(err, PluginError::UnsupportedAbi { found: 3, .. }),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plugin_output_is_untrusted_input() {
    let rt = runtime(limits());
    let good = rt.load("rollout", &bytes("rollout"), vec![]).unwrap();
    let bad = rt.load("hostile", &bytes("test_hostile"), vec![]).unwrap();
    let still_serving = || {
        good.transform(&rollout_rows(&["a"], &[Some("r")]), 1)
            .unwrap();
    };

    let err = bad.transform(&mode("garbage"), 0).unwrap_err();
    assert!(matches!(err, PluginError::MalformedOutput { .. }), "{err}");
    let err = bad.transform(&mode("lying"), 0).unwrap_err();
    assert!(
        matches!(&err, PluginError::SchemaMismatch { message, .. } if message.contains("mode")),
        "{err}"
    );
    // Larger than the output cap (1 MiB here): refused, not decoded.
    let err = bad
        .transform(&hostile("huge", 2 << 20, b""), 0)
        .unwrap_err();
    assert!(
        matches!(err, PluginError::OutputTooLarge { size, limit, .. } if size == 2 << 20 && limit == 1 << 20),
        "{err}"
    );
    still_serving();

    // Malformed but parseable Arrow IPC: each refused by the bounded decoder
    // before Arrow's reader sees it.
    for (what, stream) in [
        (
            "compressed buffer with a huge uncompressed length",
            craft::compressed_with_huge_length(),
        ),
        ("delta dictionaries", craft::delta_dictionaries(1000)),
        ("list without a child", craft::list_without_child()),
        ("integer of width 7", craft::int_of_width(7)),
        ("buffer outside the body", craft::buffer_outside_body()),
        (
            "rows claimed beyond the input",
            craft::rows_claimed(1 << 40),
        ),
        ("nesting 1000 deep", craft::nested_lists(1000)),
    ] {
        let err = bad.transform(&hostile("echo", 0, &stream), 0).unwrap_err();
        assert!(
            matches!(err, PluginError::MalformedOutput { .. }),
            "{what}: {err}"
        );
        still_serving();
    }

    // 100,000 row errors aliasing one 8 MiB string (800 GB if copied): the lift stops at the
    // host's bound instead of copying every alias.
    let started = Instant::now();
    let err = bad.validate(&hostile("alias", 100_000, b"")).unwrap_err();
    assert!(matches!(err, PluginError::MalformedOutput { .. }), "{err}");
    assert!(started.elapsed() < Duration::from_secs(30));
    still_serving();

    // Many ordinary row errors: the first thousand are kept, the total told.
    let many = hostile("errors", 5000, b"");
    let many =
        arrow_select::concat::concat_batches(&many.schema(), &vec![many.clone(); 5000]).unwrap();
    let err = bad.validate(&many).unwrap_err();
    let PluginError::Rejected { errors, total, .. } = &err else {
        panic!("{err}")
    };
    assert_eq!((errors.len(), *total), (1000, 5000));

    // Terminal escapes in plugin text are escaped, never passed through.
    let err = bad.validate(&mode("ansi")).unwrap_err();
    let shown = err.to_string();
    assert!(
        !shown.contains('\u{1b}') && !shown.contains('\r'),
        "{shown:?}"
    );
    let rows = err.row_errors().unwrap();
    assert!(rows[0].message.contains("\\u{1b}[31m"), "{rows:?}");
    assert!(!rows[0].column.as_deref().unwrap().contains('\u{1b}'));

    // Declarations are bounded and checked too.
    let err = rt
        .load(
            "hostile",
            &bytes("test_hostile"),
            params(&[("many-blobs", "1")]),
        )
        .unwrap_err();
    assert!(
        matches!(
            err,
            PluginError::OutputTooLarge {
                what: "blob columns",
                size: 5000,
                ..
            }
        ),
        "{err}"
    );
    let err = rt
        .load("hostile", &bytes("test_hostile"), params(&[("giant", "1")]))
        .unwrap_err();
    let PluginError::InvalidDeclaration { problems, .. } = &err else {
        panic!("{err}")
    };
    assert!(
        problems.iter().any(|p| p.field == "columns[1].type"),
        "{err}"
    );
    // A named query's filter is a plain predicate: no SQL function runs.
    let err = rt
        .load("hostile", &bytes("test_hostile"), params(&[("sql", "1")]))
        .unwrap_err();
    assert!(
        matches!(&err, PluginError::InvalidDeclaration { problems, .. }
            if problems.iter().any(|p| p.field == "queries[0].filter" && p.message.contains("repeat"))),
        "{err}"
    );
    // Columns a transform leaves out are filled with nulls within the cap.
    let wide = rt
        .load("hostile", &bytes("test_hostile"), params(&[("wide", "1")]))
        .unwrap();
    let many: Vec<&str> = vec!["count"; 100];
    let batch = RecordBatch::try_new(
        Arc::new(Schema::new(vec![
            Field::new("id", DataType::Utf8, false),
            Field::new("mode", DataType::Utf8, true),
        ])),
        vec![
            Arc::new(StringArray::from_iter_values(
                (0..100).map(|i| format!("r{i}")),
            )),
            Arc::new(StringArray::from(many)),
        ],
    )
    .unwrap();
    let err = wide.transform(&batch, 0).unwrap_err();
    assert!(
        matches!(
            err,
            PluginError::OutputTooLarge {
                what: "null columns to fill",
                ..
            }
        ),
        "{err}"
    );
    let err = rt
        .load("hostile", &bytes("test_hostile"), params(&[("abi", "99")]))
        .unwrap_err();
    assert!(
        matches!(err, PluginError::UnsupportedAbi { found: 99, .. }),
        "{err}"
    );
    let err = rt
        .load(
            "hostile",
            &bytes("test_hostile"),
            params(&[("broken", "1")]),
        )
        .unwrap_err();
    let PluginError::InvalidDeclaration { problems, .. } = &err else {
        panic!("{err}")
    };
    let fields: Vec<&str> = problems.iter().map(|p| p.field.as_str()).collect();
    assert_eq!(
        fields,
        [
            "columns[1].name",
            "columns[0].nullable",
            "columns[0].type",
            "blob_columns[0]",
            "vectors[0].dimension",
            "vectors[0].column",
            "secondary_key",
            "capabilities[0]",
            "capabilities[0]",
            "capabilities[0]"
        ],
        "{err}"
    );
    still_serving();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_share_no_state_and_keep_no_memory() {
    let rt = runtime(PluginLimits {
        memory_bytes: 400 << 20,
        // Filling 300 MiB is slow on a loaded 2-core machine; this test is
        // about memory and state, not the deadline.
        call_deadline: Duration::from_secs(20),
        ..limits()
    });
    let bad = rt.load("hostile", &bytes("test_hostile"), vec![]).unwrap();
    // 300 MiB kept in a static after a successful call: with a reused
    // instance the second call would need 600 MiB and hit the 400 MiB cap.
    for _ in 0..3 {
        bad.validate(&mode("hoard")).unwrap();
    }
    // A counter in a static: every call is the instance's first.
    for _ in 0..3 {
        let out = bad.transform(&mode("count"), 0).unwrap();
        let n = out
            .column_by_name("n")
            .unwrap()
            .as_any()
            .downcast_ref::<Int64Array>()
            .unwrap()
            .value(0);
        assert_eq!(n, 1, "state leaked from an earlier call");
    }
    // Randomness is the host's, not a fixed seed: two fresh instances mint
    // different ids.
    let minted = |_| {
        let out = bad.transform(&mode("uuid"), 0).unwrap();
        out.column_by_name("payload")
            .unwrap()
            .as_any()
            .downcast_ref::<BinaryArray>()
            .unwrap()
            .value(0)
            .to_vec()
    };
    let (a, b) = (minted(0), minted(1));
    assert_eq!(a.len(), 16);
    assert_ne!(a, b);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn components_the_sandbox_cannot_host_do_not_load() {
    let rt = runtime(limits());
    // A socket import: not provided, so the component does not load.
    let err = rt
        .load("net", &bytes("test_hostile_net"), vec![])
        .unwrap_err();
    assert!(
        matches!(&err, PluginError::Load { message, .. } if message.contains("wasi:sockets")),
        "{err}"
    );
    // A component of another world (here: an empty one).
    let empty = [0x00, 0x61, 0x73, 0x6d, 0x0d, 0x00, 0x01, 0x00];
    let err = rt.load("empty", &empty, vec![]).unwrap_err();
    assert!(
        matches!(&err, PluginError::Load { message, .. } if message.contains("not a schema plugin")),
        "{err}"
    );
    let err = rt.load("junk", b"not a component", vec![]).unwrap_err();
    assert!(matches!(err, PluginError::Load { .. }), "{err}");
    // Too large to compile.
    let small = runtime(PluginLimits {
        component_bytes: 1000,
        ..limits()
    });
    let err = small
        .load("rollout", &bytes("rollout"), vec![])
        .unwrap_err();
    assert!(
        matches!(
            err,
            PluginError::OutputTooLarge {
                what: "component",
                ..
            }
        ),
        "{err}"
    );
    rt.load("rollout", &bytes("rollout"), vec![]).unwrap();
}

/// A copy of `component` with one more core module instantiated at its top
/// level: a memory of `pages` 64 KiB pages (the memory bomb of a component
/// with several memories, each under the cap on its own).
fn with_extra_memory(component: &[u8], pages: u32) -> Vec<u8> {
    fn leb(mut v: u64, out: &mut Vec<u8>) {
        loop {
            let byte = (v & 0x7f) as u8;
            v >>= 7;
            if v == 0 {
                out.push(byte);
                break;
            }
            out.push(byte | 0x80);
        }
    }
    fn section(id: u8, body: &[u8], out: &mut Vec<u8>) {
        out.push(id);
        leb(body.len() as u64, out);
        out.extend_from_slice(body);
    }
    // Core modules at the top level decide the new module's index.
    let mut depth = 0;
    let mut modules = 0u64;
    for payload in wasmparser::Parser::new(0).parse_all(component) {
        match payload.unwrap() {
            wasmparser::Payload::ModuleSection { .. } if depth == 0 => modules += 1,
            wasmparser::Payload::ModuleSection { .. }
            | wasmparser::Payload::ComponentSection { .. } => depth += 1,
            wasmparser::Payload::End(_) if depth > 0 => depth -= 1,
            _ => {}
        }
    }
    // (module (memory pages))
    let mut memory = vec![0x01, 0x00];
    leb(u64::from(pages), &mut memory);
    let mut module = b"\0asm\x01\0\0\0".to_vec();
    section(5, &memory, &mut module);
    let mut out = component.to_vec();
    section(1, &module, &mut out);
    // (core instance (instantiate <modules>))
    let mut instance = vec![0x01, 0x00];
    leb(modules, &mut instance);
    instance.push(0x00);
    section(2, &instance, &mut out);
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_is_capped_over_all_memories_of_an_instance() {
    let rt = runtime(PluginLimits {
        memory_bytes: 64 << 20,
        ..limits()
    });
    // 63.75 MiB beside the plugin's own memory: each memory is under the
    // 64 MiB cap, together they are over it.
    let bomb = with_extra_memory(&bytes("test_hostile"), 1020);
    let err = rt.load("multi-memory", &bomb, vec![]).unwrap_err();
    assert!(matches!(err, PluginError::MemoryLimit { .. }), "{err}");
    // A small extra memory is within the cap: the same surgery loads.
    let fine = with_extra_memory(&bytes("test_hostile"), 1);
    rt.load("multi-memory", &fine, vec![]).unwrap();
    rt.load("rollout", &bytes("rollout"), vec![]).unwrap();
}

#[test]
fn dropping_the_runtime_keeps_the_deadline_of_its_plugins() {
    let rt = runtime(limits());
    let bad = rt.load("hostile", &bytes("test_hostile"), vec![]).unwrap();
    drop(rt);
    let started = Instant::now();
    let err = bad.validate(&mode("loop")).unwrap_err();
    assert!(matches!(err, PluginError::Timeout { .. }), "{err}");
    assert!(started.elapsed() < Duration::from_secs(10));
}

#[test]
fn the_compile_cache_runs_only_what_the_pin_approved() {
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("cache");
    let load = |name: &str| {
        let rt = PluginRuntime::new(PluginLimits::default(), Some(&cache)).unwrap();
        let plugin = rt.load(name, &bytes(name), vec![]).unwrap();
        (
            plugin.declaration().sha256.clone(),
            rt.cache_stats().unwrap(),
        )
    };
    let (rollout, stats) = load("rollout");
    assert_eq!((stats.hits, stats.misses, stats.rejected), (0, 1, 0));
    let (_, stats) = load("rollout");
    assert_eq!(
        (stats.hits, stats.rejected),
        (1, 0),
        "a second start hits the cache"
    );
    let (hostile, _) = load("test_hostile");

    // A pinned load (a store's open): the cached component is looked up by
    // the pin while the bytes are hashed, and used only when they match.
    let pinned = |name: &str, pin: &str| {
        let rt = PluginRuntime::new(PluginLimits::default(), Some(&cache)).unwrap();
        let loaded = rt
            .load_pinned("rollout", &bytes(name), pin, vec![])
            .map(|p| p.declaration().sha256.clone());
        (loaded, rt.cache_stats().unwrap())
    };
    let (loaded, stats) = pinned("rollout", &rollout);
    assert_eq!(loaded.unwrap(), rollout);
    assert_eq!((stats.hits, stats.misses), (1, 0), "from the cache");
    let (loaded, _) = pinned("test_hostile", &rollout);
    assert!(
        matches!(&loaded, Err(PinnedLoadError::Mismatch { found }) if *found == hostile),
        "{loaded:?}"
    );
    // Not cached under that pin: refused all the same, nothing compiled.
    let (loaded, stats) = pinned("rollout", &"0".repeat(64));
    assert!(
        matches!(&loaded, Err(PinnedLoadError::Mismatch { found }) if *found == rollout),
        "{loaded:?}"
    );
    assert_eq!(stats.hits, 0);
    // (Every runtime above is gone: no component of this process is mapped
    // from the entries changed in place below.)

    let entry = |sha: &str| {
        std::fs::read_dir(&cache)
            .unwrap()
            .flatten()
            .map(|e| e.path())
            .find(|p| p.file_name().unwrap().to_string_lossy().starts_with(sha))
            .unwrap()
    };
    // Plant the hostile plugin's compiled code under the rollout pin's name.
    std::fs::copy(entry(&hostile), entry(&rollout)).unwrap();
    let (sha, stats) = load("rollout");
    assert_eq!(sha, rollout);
    assert_eq!(stats.rejected, 1, "the planted entry was refused");
    // Flip one byte of the (re-written) entry's code.
    let path = entry(&rollout);
    let mut bytes_on_disk = std::fs::read(&path).unwrap();
    let last = bytes_on_disk.len() - 1;
    bytes_on_disk[last] ^= 0xff;
    std::fs::write(&path, bytes_on_disk).unwrap();
    let (_, stats) = load("rollout");
    assert_eq!(stats.rejected, 1, "the tampered entry was refused");
    let (_, stats) = load("rollout");
    assert_eq!(
        (stats.hits, stats.rejected),
        (1, 0),
        "and replaced by a good one"
    );

    #[cfg(unix)]
    {
        // A good entry that is not private to the cache's owner is never
        // read: its code would stay mapped from a file others can change.
        use std::os::unix::fs::PermissionsExt;
        let path = entry(&rollout);
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        let (_, stats) = load("rollout");
        assert_eq!(
            (stats.hits, stats.rejected, stats.not_private),
            (0, 1, 1),
            "an entry others may read or write is refused"
        );
        // (Replaced by a private one, which hits.)
        let (_, stats) = load("rollout");
        assert_eq!((stats.hits, stats.rejected), (1, 0));
        // One linked elsewhere (a second name others may hold) is refused.
        let path = entry(&rollout);
        std::fs::hard_link(&path, dir.path().join("elsewhere")).unwrap();
        let (_, stats) = load("rollout");
        assert_eq!(
            (stats.hits, stats.rejected, stats.not_private),
            (0, 1, 1),
            "an entry with two links is refused"
        );
    }

    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&cache).unwrap().permissions().mode();
        assert_eq!(mode & 0o077, 0, "the cache directory is private: {mode:o}");
        // One that others may write is refused.
        let open = dir.path().join("open");
        std::fs::create_dir(&open).unwrap();
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o777)).unwrap();
        let err = PluginRuntime::new(PluginLimits::default(), Some(&open)).unwrap_err();
        assert!(
            err.to_string().contains("writable by group or others"),
            "{err}"
        );
    }
}

#[test]
fn a_runtime_compiles_a_plugin_once_for_all_its_stores() {
    let dir = tempfile::tempdir().unwrap();
    let rt = PluginRuntime::new(PluginLimits::default(), Some(&dir.path().join("cache"))).unwrap();
    for _ in 0..3 {
        rt.load("rollout", &bytes("rollout"), vec![]).unwrap();
    }
    let stats = rt.cache_stats().unwrap();
    assert_eq!(
        (stats.hits, stats.misses),
        (0, 1),
        "compiled once, then kept in memory (not read from disk again)"
    );
}

#[test]
fn the_cli_reports_plugin_faults_and_keeps_working() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let plugin = lance_context_host::built_plugin("test_hostile");
    let plugin = plugin.to_str().unwrap();
    let (code, _, err) = cli(root, &["store", "create", "h", "--plugin", plugin], "");
    assert_eq!(code, 0, "{err}");
    let add = |line: &str| cli(root, &["store", "add", "h", "-"], line);

    // A plugin that prints a debug line works (it used to crash the CLI).
    let (code, _, err) = add(r#"{"id": "a", "mode": "debug"}"#);
    assert_eq!(code, 0, "{err}");
    let (code, _, err) = add(r#"{"id": "b", "mode": "stderr"}"#);
    assert_eq!(code, 0, "{err}");
    for (m, says) in [
        ("panic", "panicked on purpose"),
        ("loop", "deadline"),
        ("bomb", "memory limit"),
        ("sleep", "waited"),
        ("alias", "bounds"),
    ] {
        let (code, _, err) = add(&format!(r#"{{"id": "x", "mode": "{m}", "n": 1000000}}"#));
        assert_eq!(code, 6, "{m}: a plugin fault exits 6: {err}");
        assert!(err.contains(says), "{m}: {err}");
        assert!(!err.contains("Cannot start a runtime"), "{m}: {err}");
    }
    // Rejected rows are invalid input; plugin text reaches the terminal escaped.
    let (code, _, err) = add(r#"{"id": "x", "mode": "ansi"}"#);
    assert_eq!(code, 2, "{err}");
    assert!(!err.contains('\u{1b}'), "{err:?}");
    // Still serving.
    let (code, out, err) = cli(root, &["store", "get", "h", "a", "b"], "");
    assert_eq!(code, 0, "{err}");
    assert_eq!(out.lines().count(), 2, "{out}");
    let (code, out, err) = cli(root, &["plugin", "check", plugin], "");
    assert_eq!(code, 0, "{out}{err}");
}
