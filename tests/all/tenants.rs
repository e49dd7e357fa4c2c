//! Many tenants on one host: no plugin, store or upload can stall, starve or
//! reach another. Loads (compile, describe) run off the async workers in a
//! bounded queue; compiles are bounded in time and memory and can be
//! stopped; call slots are per store as well as per runtime; plugin-supplied
//! numbers are checked. The server cases run a real `lance-context serve`
//! on loopback with real components.

use std::sync::Arc;
use std::time::{Duration, Instant};

use base64::Engine as _;
use lance_context_client::{Client, CreateStore, StoreApi};
use lance_context_host::{CompileLimit, Compiler, PluginError, PluginLimits, PluginRuntime};
use serde_json::{Value, json};

use crate::plugins::{bytes, params};
use crate::server::ServerProc;
use crate::support::{cli, cli_binary, compile_cache};

/// A component whose one function keeps `values` values live across as many
/// loops: its compile time grows with the square of `values` (debug test
/// build, 2 cores: 2,500 in 1.5 s, 5,000 in 5.5 s, 10,000 in ~20 s). `salt`
/// makes each one byte-different.
fn slow_component(values: u32, salt: i32) -> Vec<u8> {
    use wasm_encoder::{
        CodeSection, Component, Function, FunctionSection, Instruction, Module, ModuleSection,
        TypeSection, ValType,
    };
    let mut module = Module::new();
    let mut types = TypeSection::new();
    types.ty().function([ValType::I32], [ValType::I32]);
    module.section(&types);
    let mut functions = FunctionSection::new();
    functions.function(0);
    module.section(&functions);
    let mut body = Function::new([]);
    for i in 0..values {
        body.instruction(&Instruction::LocalGet(0));
        body.instruction(&Instruction::I32Const(i as i32 ^ salt));
        body.instruction(&Instruction::I32Add);
        body.instruction(&Instruction::Loop(wasm_encoder::BlockType::Empty));
        body.instruction(&Instruction::LocalGet(0));
        body.instruction(&Instruction::BrIf(0));
        body.instruction(&Instruction::End);
    }
    for _ in 1..values {
        body.instruction(&Instruction::I32Add);
    }
    body.instruction(&Instruction::End);
    let mut code = CodeSection::new();
    code.function(&body);
    module.section(&code);
    let mut component = Component::new();
    component.section(&ModuleSection(&module));
    component.finish()
}

/// A component whose module defines `n` globals (each initialised by an
/// extended constant expression when `extended`).
fn globals_component(n: u32) -> Vec<u8> {
    globals_of(n, false)
}

fn globals_of(n: u32, extended: bool) -> Vec<u8> {
    use wasm_encoder::{
        Component, ConstExpr, GlobalSection, GlobalType, Module, ModuleSection, ValType,
    };
    let mut module = Module::new();
    let mut globals = GlobalSection::new();
    for i in 0..n {
        globals.global(
            GlobalType {
                val_type: ValType::I32,
                mutable: true,
                shared: false,
            },
            &if extended {
                ConstExpr::i32_const(i as i32)
                    .with_i32_const(1)
                    .with_i32_add()
            } else {
                ConstExpr::i32_const(i as i32)
            },
        );
    }
    module.section(&globals);
    let mut component = Component::new();
    component.section(&ModuleSection(&module));
    component.finish()
}

/// Limits compiling in a child of the real binary.
fn child_limits() -> PluginLimits {
    PluginLimits {
        compiler: Compiler::Subprocess(cli_binary()),
        compile_deadline: Duration::from_secs(2),
        ..PluginLimits::default()
    }
}

fn runtime(limits: PluginLimits) -> PluginRuntime {
    PluginRuntime::new(limits, Some(compile_cache())).unwrap()
}

/// Compiler children of this process alive for longer than `age` (other
/// tests of this process may have younger ones).
fn compiler_children_older_than(age: Duration) -> usize {
    let uptime: f64 = std::fs::read_to_string("/proc/uptime")
        .unwrap()
        .split_whitespace()
        .next()
        .unwrap()
        .parse()
        .unwrap();
    let me = std::process::id().to_string();
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(Result::ok)
        .filter(|e| {
            let dir = e.path();
            let cmdline = std::fs::read(dir.join("cmdline")).unwrap_or_default();
            let stat = std::fs::read_to_string(dir.join("stat")).unwrap_or_default();
            // ppid is the 4th field, after the ")" closing the command name.
            let fields: Vec<String> = stat
                .rsplit_once(')')
                .map(|(_, rest)| rest.split_whitespace().map(str::to_string).collect())
                .unwrap_or_default();
            // After ")": state (0), ppid (1), …, starttime (19) in ticks.
            let started = fields
                .get(19)
                .and_then(|t| t.parse::<f64>().ok())
                .map(|t| t / 100.0)
                .unwrap_or(uptime);
            String::from_utf8_lossy(&cmdline).contains(lance_context_host::COMPILER_ARG)
                && fields.get(1) == Some(&me)
                && uptime - started > age.as_secs_f64()
        })
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_compile_past_its_deadline_is_stopped_and_tried_again_later() {
    // The good component of the end, compiled into the cache first (no
    // deadline): under a loaded machine its own compile could take longer
    // than this runtime's two seconds, which is not what is tested.
    runtime(PluginLimits::default())
        .load_async("hostile", bytes("test_hostile"), vec![])
        .await
        .unwrap();
    let rt = runtime(PluginLimits {
        failed_ttl: Duration::from_millis(1500),
        ..child_limits()
    });
    let slow = slow_component(10_000, 1);
    let started = Instant::now();
    let err = rt
        .load_async("slow", slow.clone(), vec![])
        .await
        .unwrap_err();
    let took = started.elapsed();
    assert!(
        matches!(
            &err,
            PluginError::Compile {
                limit: CompileLimit::Deadline(_),
                ..
            }
        ),
        "{err}"
    );
    assert!(
        took < Duration::from_secs(5),
        "the compile was not stopped at its deadline: {took:?}"
    );
    // The compiler was killed, not left burning CPU.
    assert_eq!(
        compiler_children_older_than(Duration::from_secs(3)),
        0,
        "a compiler child outlived its deadline"
    );
    // Remembered for a while: answered at once.
    let started = Instant::now();
    let again = rt
        .load_async("slow", slow.clone(), vec![])
        .await
        .unwrap_err();
    assert!(started.elapsed() < Duration::from_millis(500));
    assert_eq!(again.to_string(), err.to_string());
    // Then tried again, not refused forever.
    tokio::time::sleep(Duration::from_millis(1600)).await;
    let started = Instant::now();
    let retried = rt.load_async("slow", slow, vec![]).await.unwrap_err();
    assert!(
        started.elapsed() >= Duration::from_secs(2),
        "the retry did not compile again: {retried}"
    );
    // A good component compiles in a child and loads as before.
    let good = rt
        .load_async("hostile", bytes("test_hostile"), vec![])
        .await;
    assert!(good.is_ok(), "{:?}", good.err());
}

#[test]
fn a_component_past_the_shape_limits_is_refused_before_compiling() {
    let rt = runtime(child_limits());
    let started = Instant::now();
    let err = rt
        .load("globals", &globals_component(20_000), vec![])
        .unwrap_err();
    assert!(
        matches!(
            &err,
            PluginError::Compile {
                limit: CompileLimit::Shape {
                    what: "globals in a module",
                    found: 20_000,
                    ..
                },
                ..
            }
        ),
        "{err}"
    );
    assert!(
        err.to_string().contains("20000 globals in a module"),
        "{err}"
    );
    assert!(started.elapsed() < Duration::from_secs(1));
    assert_eq!(err.kind(), lance_context_host::ErrorKind::InvalidInput);
}

#[test]
fn a_compile_past_its_memory_limit_is_reported_as_such() {
    let rt = PluginRuntime::new(
        PluginLimits {
            // The rollout plugin needs ~50 MiB to compile.
            compile_memory_bytes: 32 << 20,
            compile_deadline: Duration::from_secs(30),
            ..child_limits()
        },
        None,
    )
    .unwrap();
    let err = rt.load("rollout", &bytes("rollout"), vec![]).unwrap_err();
    assert!(
        matches!(
            &err,
            PluginError::Compile {
                limit: CompileLimit::Memory(_),
                ..
            }
        ),
        "{err}"
    );
}

#[test]
fn a_failed_describe_is_remembered_for_a_while_then_run_again() {
    let rt = runtime(PluginLimits {
        call_deadline: Duration::from_millis(1000),
        failed_ttl: Duration::from_millis(2500),
        ..PluginLimits::default()
    });
    let hostile = bytes("test_hostile");
    let looping = params(&[("mode", "loop")]);
    let err = rt.load("hostile", &hostile, looping.clone()).unwrap_err();
    assert!(matches!(err, PluginError::Timeout { .. }), "{err}");
    let started = Instant::now();
    let again = rt.load("hostile", &hostile, looping.clone()).unwrap_err();
    assert!(matches!(again, PluginError::Timeout { .. }), "{again}");
    // (describe would take its whole deadline of 1 s)
    assert!(
        started.elapsed() < Duration::from_millis(700),
        "describe ran again"
    );
    // Other parameters are another load.
    assert!(rt.load("hostile", &hostile, vec![]).is_ok());
    std::thread::sleep(Duration::from_millis(2600));
    let started = Instant::now();
    let err = rt.load("hostile", &hostile, looping).unwrap_err();
    assert!(
        started.elapsed() >= Duration::from_millis(1000),
        "not run again after the ttl: {err} in {:?}",
        started.elapsed()
    );
}

#[test]
fn the_compile_cache_stays_within_its_size() {
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("cache");
    let rt = PluginRuntime::new(
        PluginLimits {
            cache_bytes: 1,
            ..PluginLimits::default()
        },
        Some(&cache),
    )
    .unwrap();
    rt.load("hostile", &bytes("test_hostile"), vec![]).unwrap();
    rt.load("rollout", &bytes("rollout"), vec![]).unwrap();
    let entries = std::fs::read_dir(&cache)
        .unwrap()
        .filter_map(Result::ok)
        .filter(|e| e.file_name().to_string_lossy().ends_with(".cwasm"))
        .count();
    assert_eq!(entries, 0, "entries past the cache size were kept");
    assert!(rt.cache_stats().unwrap().evicted >= 2);
}

#[test]
fn a_row_error_past_the_batch_is_a_plugin_fault() {
    let rt = runtime(PluginLimits::default());
    let plugin = rt.load("hostile", &bytes("test_hostile"), vec![]).unwrap();
    let batch = crate::sandbox::hostile_batch("rowmax");
    let err = plugin.validate(&batch).unwrap_err();
    assert!(matches!(err, PluginError::MalformedOutput { .. }), "{err}");
    assert!(err.is_fault());
    assert!(err.to_string().contains("4294967295"), "{err}");
}

#[test]
fn a_row_error_past_the_batch_is_a_plugin_fault_in_the_cli() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let wasm = lance_context_host::built_plugin("test_hostile");
    let wasm = wasm.to_str().unwrap();
    let sample = root.join("s.jsonl");
    std::fs::write(&sample, "{\"id\": \"a\", \"mode\": \"rowmax\"}\n").unwrap();
    let sample = sample.to_str().unwrap();
    // plugin check: the fault is a problem it lists (exit 2, as for every
    // problem it finds), not a crash of the host (exit 101 before).
    let (code, out, err) = cli(root, &["plugin", "check", wasm, "--sample", sample], "");
    assert_eq!(code, 2, "{out}{err}");
    assert!(
        out.contains("malformed output: a row error names row 4294967295"),
        "{out}"
    );
    assert!(!err.contains("panicked"), "{err}");
    // store create with that sample
    let (code, _, err) = cli(
        root,
        &[
            "store", "create", "h", "--plugin", wasm, "--sample", sample, "--root", ".",
        ],
        "",
    );
    assert_ne!(code, 0, "{err}");
    assert!(err.contains("row 4294967295"), "{err}");
    assert!(!err.contains("panicked"), "{err}");
    // add
    let (code, _, err) = cli(
        root,
        &["store", "create", "h", "--plugin", wasm, "--root", "."],
        "",
    );
    assert_eq!(code, 0, "{err}");
    let (code, _, err) = cli(
        root,
        &["store", "add", "h", "--root", "."],
        "{\"id\": \"b\", \"mode\": \"rowmax\"}\n",
    );
    assert_eq!(code, 6, "{err}");
    assert!(err.contains("row 4294967295"), "{err}");
}

fn create_with_wasm(name: &str, wasm: &[u8], params: &[(&str, &str)]) -> CreateStore {
    let mut create = CreateStore::builtin(name, "rollout");
    create.plugin = None;
    create.plugin_wasm_base64 = Some(base64::engine::general_purpose::STANDARD.encode(wasm));
    for (k, v) in params {
        create = create.param(k, json!(v));
    }
    create
}

/// p99 of `n` health requests to each of `a` and `b`, alternating, so that
/// both see the same noise from the rest of the machine.
async fn health_p99(a: &Client, b: &Client, n: usize) -> (Duration, Duration) {
    let mut times = (Vec::with_capacity(n), Vec::with_capacity(n));
    for _ in 0..n {
        let started = Instant::now();
        a.health().await.unwrap();
        times.0.push(started.elapsed());
        let started = Instant::now();
        b.health().await.unwrap();
        times.1.push(started.elapsed());
    }
    let p99 = |mut t: Vec<Duration>| {
        t.sort();
        t[(n * 99 / 100).min(n - 1)]
    };
    (p99(times.0), p99(times.1))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn health_answers_while_slow_compiles_and_looping_describes_load() {
    let dir = tempfile::tempdir().unwrap();
    let server = ServerProc::start(
        dir.path(),
        &[
            "--compile-deadline-secs",
            "10",
            "--plugin-load-wait-secs",
            "4",
        ],
    );
    let client = server.client();
    // An idle server beside it: the baseline under the same machine noise
    // (other tests, the compiles' CPU).
    let control_dir = tempfile::tempdir().unwrap();
    let control = ServerProc::start(control_dir.path(), &[]);
    let (idle, _) = health_p99(&client, &control.client(), 100).await;
    let hostile = bytes("test_hostile");
    let mut creates = Vec::new();
    for i in 0..8 {
        let c = client.clone();
        let slow = slow_component(20_000, 100 + i);
        creates.push(tokio::spawn(async move {
            let started = Instant::now();
            let r = c
                .create_store(&create_with_wasm(&format!("slow{i}"), &slow, &[]))
                .await;
            (started.elapsed(), r.map(|_| ()).map_err(|e| e.status()))
        }));
        let c = client.clone();
        let hostile = hostile.clone();
        creates.push(tokio::spawn(async move {
            let started = Instant::now();
            let r = c
                .create_store(&create_with_wasm(
                    &format!("loop{i}"),
                    &hostile,
                    &[("mode", "loop"), ("n", &i.to_string())],
                ))
                .await;
            (started.elapsed(), r.map(|_| ()).map_err(|e| e.status()))
        }));
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (loaded, baseline) = health_p99(&client, &control.client(), 200).await;
    let mut answers = Vec::new();
    for c in creates {
        answers.push(c.await.unwrap());
    }
    eprintln!(
        "/health p99: idle {idle:?}; while loads run {loaded:?}, an idle server beside it {baseline:?}"
    );
    let bound = baseline.max(Duration::from_millis(1)) * 10;
    assert!(
        loaded <= bound,
        "/health p99 {loaded:?} while loads run vs {baseline:?} on an idle server beside it (bound {bound:?})"
    );
    for (took, answer) in &answers {
        // Refused (400 compile, 502 describe, 503 busy), never accepted, and
        // never held past the load wait plus one load's own bounds.
        assert!(matches!(answer, Err(Some(400 | 502 | 503))), "{answer:?}");
        assert!(*took < Duration::from_secs(4 + 10 + 5 + 2), "{took:?}");
    }
    assert!(
        answers.iter().any(|(_, a)| *a == Err(Some(503))),
        "{answers:?}"
    );
    // The server still serves a good create.
    client
        .create_store(&CreateStore::builtin("good", "rollout"))
        .await
        .unwrap();
}

fn looping_record(i: usize) -> Value {
    json!({"id": format!("k{i}"), "mode": "loop"})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_store_whose_plugin_runs_hot_does_not_starve_another_store() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let wasm = lance_context_host::built_plugin("test_hostile");
    let (code, _, err) = cli(
        root,
        &[
            "store",
            "create",
            "hot",
            "--plugin",
            wasm.to_str().unwrap(),
            "--root",
            ".",
        ],
        "",
    );
    assert_eq!(code, 0, "{err}");
    let server = ServerProc::start(root, &[]);
    let client = server.client();
    client
        .create_store(&CreateStore::builtin("calm", "rollout"))
        .await
        .unwrap();
    // An idle server beside it, with a store like "calm": the baseline under
    // the same machine noise (the hot plugin's CPU, other tests).
    let control_dir = tempfile::tempdir().unwrap();
    let control = ServerProc::start(control_dir.path(), &[]);
    control
        .client()
        .create_store(&CreateStore::builtin("calm", "rollout"))
        .await
        .unwrap();
    let calm_add = |client: Client, i: usize| async move {
        let started = Instant::now();
        client
            .add(
                "calm",
                &[json!({"id": format!("c{i}"), "rollout_id": "r", "sequence_order": i})],
            )
            .await
            .unwrap();
        started.elapsed()
    };
    // Opened (its plugin loaded) before the burst.
    client
        .add("hot", &[json!({"id": "warm", "mode": ""})])
        .await
        .unwrap();
    let mut idle = Vec::new();
    for i in 0..10 {
        idle.push(calm_add(client.clone(), i).await);
    }
    idle.sort();
    let mut hot = Vec::new();
    for i in 0..32 {
        let client = client.clone();
        hot.push(tokio::spawn(async move {
            let _ = client.add("hot", &[looping_record(i)]).await;
        }));
    }
    // Every slot the hot store may take is taken (its calls loop for 5 s).
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let (mut loaded, mut beside) = (Vec::new(), Vec::new());
    for i in 10..20 {
        loaded.push(calm_add(client.clone(), i).await);
        beside.push(calm_add(control.client(), i).await);
    }
    loaded.sort();
    beside.sort();
    // The slowest add against the idle server's median at the same time:
    // one add stuck behind the hot store's calls is the starvation (21 s
    // before); the hot plugin's CPU use slows both servers alike.
    let (baseline, slowest) = (beside[5], loaded[9]);
    eprintln!(
        "add to another store: idle median {:?}; while another store's plugin loops: slowest {slowest:?}, an idle server's median {baseline:?}",
        idle[5]
    );
    assert!(
        slowest <= baseline.max(Duration::from_millis(5)) * 10,
        "an unrelated store's add took {slowest:?} (an idle server's median {baseline:?}) while another store's plugin looped"
    );
    drop(server);
    for h in hot {
        h.abort();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_large_write_is_prepared_in_bounded_parts() {
    use arrow_array::{Array, StringArray};
    let rt = runtime(PluginLimits::default());
    // 512 KiB of declared fixed-width data per row, filled with nulls.
    let wide = rt
        .load("hostile", &bytes("test_hostile"), params(&[("wide", "1")]))
        .unwrap();
    let rows = 150;
    let ids: Vec<String> = (0..rows).map(|i| format!("r{i}")).collect();
    let batch = arrow_array::RecordBatch::try_new(
        std::sync::Arc::new(arrow_schema::Schema::new(vec![arrow_schema::Field::new(
            "id",
            arrow_schema::DataType::Utf8,
            false,
        )])),
        vec![std::sync::Arc::new(StringArray::from(ids))],
    )
    .unwrap();
    let prepared = lance_context_host::prepare(&wide, &batch, 0).await.unwrap();
    assert_eq!(prepared.num_rows(), rows);
    assert_eq!(prepared.column_by_name("w").unwrap().null_count(), rows);
    // Row errors of a later part are numbered in the whole batch.
    let plugin = rt.load("hostile", &bytes("test_hostile"), vec![]).unwrap();
    let many = 20_000;
    let modes: Vec<&str> = (0..many)
        .map(|i| if i == 16_384 { "errors" } else { "" })
        .collect();
    let ids: Vec<String> = (0..many).map(|i| format!("r{i}")).collect();
    let batch = arrow_array::RecordBatch::try_new(
        std::sync::Arc::new(arrow_schema::Schema::new(vec![
            arrow_schema::Field::new("id", arrow_schema::DataType::Utf8, false),
            arrow_schema::Field::new("mode", arrow_schema::DataType::Utf8, true),
        ])),
        vec![
            std::sync::Arc::new(StringArray::from(ids)),
            std::sync::Arc::new(StringArray::from(modes)),
        ],
    )
    .unwrap();
    let err = lance_context_host::prepare(&plugin, &batch, 0)
        .await
        .unwrap_err();
    let rows: Vec<u32> = match &err {
        lance_context_host::PipelineError::Plugin(e) => {
            e.row_errors().unwrap().iter().map(|r| r.row).collect()
        }
        other => panic!("{other}"),
    };
    // (The hostile plugin reads its mode from a part's first row.)
    assert_eq!(rows, [16_384]);
}

#[test]
fn call_slots_are_per_plugin_within_the_runtime_cap() {
    let rt = Arc::new(runtime(PluginLimits {
        call_deadline: Duration::from_secs(2),
        max_concurrent_calls: 2,
        calls_per_plugin: 1,
        slot_wait: Duration::from_secs(10),
        ..PluginLimits::default()
    }));
    let hot = rt.load("hostile", &bytes("test_hostile"), vec![]).unwrap();
    let calm = rt.load("hostile", &bytes("test_hostile"), vec![]).unwrap();
    let third = rt.load("hostile", &bytes("test_hostile"), vec![]).unwrap();
    let looping = crate::sandbox::hostile_batch("loop");
    let quiet = crate::sandbox::hostile_batch("");
    // Two calls of the hot plugin: the second waits behind the first (its
    // own slot), leaving the runtime's second slot to others.
    let spawn = |p: lance_context_host::LoadedPlugin, b: arrow_array::RecordBatch| {
        std::thread::spawn(move || p.validate(&b))
    };
    let first = spawn(hot.clone(), looping.clone());
    let second = spawn(hot.clone(), looping.clone());
    std::thread::sleep(Duration::from_millis(300));
    let started = Instant::now();
    calm.validate(&quiet).unwrap();
    let calm_took = started.elapsed();
    assert!(
        calm_took < Duration::from_secs(1),
        "calm waited {calm_took:?}"
    );
    // With the calm plugin looping too, the runtime's two slots are taken:
    // a third plugin waits for one.
    let calm_loop = spawn(calm.clone(), looping.clone());
    std::thread::sleep(Duration::from_millis(300));
    let started = Instant::now();
    third.validate(&quiet).unwrap();
    assert!(
        started.elapsed() > Duration::from_millis(500),
        "the runtime cap did not hold"
    );
    for t in [first, second, calm_loop] {
        assert!(matches!(
            t.join().unwrap(),
            Err(PluginError::Timeout { .. })
        ));
    }
}

#[test]
fn a_compiler_panic_is_reported_as_such() {
    // Past the default shape limits; with them raised, 100,000 globals with
    // extended constant initialisers make Cranelift panic
    // (`MemFlagsSetOverflow`): contained in the compiler process and named.
    let mut limits = child_limits();
    limits.shape.globals = 1_000_000;
    limits.compile_deadline = Duration::from_secs(60);
    let rt = PluginRuntime::new(limits, None).unwrap();
    let err = rt
        .load("globals", &globals_of(100_000, true), vec![])
        .unwrap_err();
    assert!(
        matches!(
            &err,
            PluginError::Compile {
                limit: CompileLimit::CompilerPanic(_),
                ..
            }
        ),
        "{err}"
    );
    assert!(err.to_string().contains("MemFlagsSetOverflow"), "{err}");
}
