//! Compiling a component within bounds the host can enforce.
//!
//! Cranelift's compile time grows faster than linearly with some shapes of
//! code (one function keeping tens of thousands of values live compiles for
//! minutes), its memory with the size of the component, and a valid but
//! absurd component can make it panic. A thread cannot be stopped, so a
//! deadline on a compile thread bounds only the wait, not the work. Hence:
//!
//! - **Shape first** ([`check_shape`]): a cheap parse refuses components
//!   with more core modules, functions, globals, locals or function-body
//!   bytes than [`ShapeLimits`] allow, before anything compiles. Globals are
//!   also what instantiation pays for per call (each one is host memory of
//!   the instance), so this bounds instantiation work too.
//! - **A child process** ([`Compiler::Subprocess`], what the CLI and the
//!   server use): the host's own executable compiles the component in a
//!   process of its own (`lance-context __compile-plugin`), at a lower CPU
//!   priority, with its data segment capped (`RLIMIT_DATA`, the compile
//!   memory limit) and its CPU time capped (`RLIMIT_CPU`); the parent kills it
//!   at the compile deadline. What it hands back is the serialized artifact,
//!   which the parent loads. A compile that ran out of time or memory, or
//!   that panicked, is reported as such.
//! - In process ([`Compiler::InProcess`], the library's default when no
//!   executable was named with [`use_compiler_program`]): a thread and a
//!   deadline on the wait — the wait is bounded, the work is not.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use wasmtime::Engine;
use wasmtime::component::Component;

use super::error::{CompileLimit, PluginError};

/// The argument that makes the host's executable a compiler child.
pub const COMPILER_ARG: &str = "__compile-plugin";

/// Exit status of a compiler child whose compiler panicked.
const EXIT_PANIC: i32 = 3;
/// Exit status of a compiler child that refused or failed to compile.
const EXIT_FAILED: i32 = 2;

/// Where components are compiled.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Compiler {
    /// On a thread of this process: the wait is bounded, the work is not.
    InProcess,
    /// In a child process of this executable (`PROGRAM __compile-plugin`),
    /// bounded in time, memory and CPU, killed at the deadline.
    Subprocess(PathBuf),
}

static PROGRAM: OnceLock<PathBuf> = OnceLock::new();

/// Name the executable that compiles components in a child process: one
/// whose `main` hands `__compile-plugin` to [`compiler_main`]. Runtimes
/// created with [`super::PluginLimits::default`] afterwards use it. The first
/// call wins.
pub fn use_compiler_program(program: impl Into<PathBuf>) {
    let _ = PROGRAM.set(program.into());
}

impl Default for Compiler {
    fn default() -> Self {
        match PROGRAM.get() {
            Some(program) => Self::Subprocess(program.clone()),
            None => Self::InProcess,
        }
    }
}

/// Bounds on a component's shape, checked before it is compiled.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShapeLimits {
    /// Core modules in the component (nested ones included).
    pub core_modules: usize,
    /// Functions defined in one core module.
    pub functions: usize,
    /// Globals (defined and imported) of one core module.
    pub globals: usize,
    /// Locals of one function.
    pub locals: u64,
    /// Bytes of one function's body.
    pub function_bytes: usize,
}

impl Default for ShapeLimits {
    /// Generous for real plugins (the built-in ones, with Arrow inside, have
    /// 1 module of ~6k functions, a few globals, bodies under 64 KiB).
    fn default() -> Self {
        Self {
            core_modules: 16,
            functions: 100_000,
            globals: 10_000,
            locals: 50_000,
            function_bytes: 1 << 20,
        }
    }
}

/// Refuse a component whose shape is past `limits` (or that does not parse).
pub(crate) fn check_shape(bytes: &[u8], limits: &ShapeLimits) -> Result<(), CompileLimit> {
    let over = |what: &'static str, found: u64, limit: u64| {
        if found > limit {
            Err(CompileLimit::Shape { what, found, limit })
        } else {
            Ok(())
        }
    };
    let mut modules = 0u64;
    let mut functions = 0u64;
    let mut globals = 0u64;
    for payload in wasmparser::Parser::new(0).parse_all(bytes) {
        let payload = payload.map_err(|e| CompileLimit::Invalid(e.to_string()))?;
        match payload {
            wasmparser::Payload::Version {
                encoding: wasmparser::Encoding::Module,
                ..
            } => {
                modules += 1;
                functions = 0;
                globals = 0;
                over("core modules", modules, limits.core_modules as u64)?;
            }
            wasmparser::Payload::ImportSection(imports) => {
                for import in imports.into_imports() {
                    let import = import.map_err(|e| CompileLimit::Invalid(e.to_string()))?;
                    if matches!(import.ty, wasmparser::TypeRef::Global(_)) {
                        globals += 1;
                    }
                }
                over("globals in a module", globals, limits.globals as u64)?;
            }
            wasmparser::Payload::GlobalSection(section) => {
                globals = globals.saturating_add(u64::from(section.count()));
                over("globals in a module", globals, limits.globals as u64)?;
            }
            wasmparser::Payload::FunctionSection(section) => {
                functions = functions.saturating_add(u64::from(section.count()));
                over("functions in a module", functions, limits.functions as u64)?;
            }
            wasmparser::Payload::CodeSectionEntry(body) => {
                let size = body.range().len() as u64;
                over(
                    "bytes of a function body",
                    size,
                    limits.function_bytes as u64,
                )?;
                let mut locals = 0u64;
                let reader = body
                    .get_locals_reader()
                    .map_err(|e| CompileLimit::Invalid(e.to_string()))?;
                for local in reader {
                    let (count, _) = local.map_err(|e| CompileLimit::Invalid(e.to_string()))?;
                    locals = locals.saturating_add(u64::from(count));
                }
                over("locals of a function", locals, limits.locals)?;
            }
            _ => {}
        }
    }
    Ok(())
}

/// What a compile in a child may use.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ChildBounds {
    pub deadline: Duration,
    pub memory_bytes: usize,
    pub max_wasm_stack: usize,
}

/// Compile `bytes` in a child process of `program`, killed at the deadline;
/// the artifact it returns is loaded on `engine`.
pub(crate) fn compile_in_child(
    program: &Path,
    engine: &Engine,
    bounds: ChildBounds,
    label: &str,
    bytes: &[u8],
) -> Result<Component, PluginError> {
    let failed = |limit: CompileLimit| PluginError::Compile {
        plugin: label.to_string(),
        limit,
    };
    let cpu_seconds = bounds.deadline.as_secs().saturating_add(2);
    let mut child = Command::new(program)
        .arg(COMPILER_ARG)
        .arg(bounds.memory_bytes.to_string())
        .arg(cpu_seconds.to_string())
        .arg(bounds.max_wasm_stack.to_string())
        .env_clear()
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| {
            failed(CompileLimit::Unavailable(format!(
                "starting the compiler {}: {e}",
                program.display()
            )))
        })?;
    let started = Instant::now();
    let mut stdin = child.stdin.take().expect("piped");
    let input = bytes.to_vec();
    let writer = std::thread::spawn(move || {
        let _ = stdin.write_all(&input);
    });
    let stdout = child.stdout.take().expect("piped");
    // The artifact is machine code for the component: a few times its size.
    let cap = (bytes.len() as u64).saturating_mul(32).max(64 << 20);
    let reader = std::thread::spawn(move || read_bounded(stdout, cap));
    let stderr = child.stderr.take().expect("piped");
    let errors = std::thread::spawn(move || read_bounded(stderr, 64 << 10));
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break Some(status),
            Ok(None) if started.elapsed() >= bounds.deadline => {
                let _ = child.kill();
                let _ = child.wait();
                break None;
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(5)),
            Err(e) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(failed(CompileLimit::Unavailable(format!(
                    "waiting for the compiler: {e}"
                ))));
            }
        }
    };
    let _ = writer.join();
    let artifact = reader.join().unwrap_or_default();
    let message = String::from_utf8_lossy(&errors.join().unwrap_or_default())
        .trim()
        .to_string();
    let Some(status) = status else {
        return Err(failed(CompileLimit::Deadline(bounds.deadline)));
    };
    if !status.success() {
        return Err(failed(child_failure(status, message, bounds)));
    }
    deserialize_own(engine, &artifact).map_err(|e| {
        failed(CompileLimit::Invalid(format!(
            "loading the compiled code: {e:#}"
        )))
    })
}

/// Why a compiler child ended without an artifact.
fn child_failure(
    status: std::process::ExitStatus,
    message: String,
    bounds: ChildBounds,
) -> CompileLimit {
    #[cfg(unix)]
    {
        use std::os::unix::process::ExitStatusExt;
        match status.signal() {
            // RLIMIT_CPU: SIGXCPU, then SIGKILL at the hard limit.
            Some(libc::SIGXCPU) | Some(libc::SIGKILL) => {
                return CompileLimit::Deadline(bounds.deadline);
            }
            // An allocation past RLIMIT_DATA aborts the child.
            Some(libc::SIGABRT) if message.contains("memory allocation") => {
                return CompileLimit::Memory(bounds.memory_bytes);
            }
            _ => {}
        }
    }
    match status.code() {
        Some(EXIT_PANIC) => CompileLimit::CompilerPanic(message),
        Some(EXIT_FAILED) => CompileLimit::Invalid(message),
        _ if message.contains("memory allocation") => CompileLimit::Memory(bounds.memory_bytes),
        _ => CompileLimit::Invalid(format!("the compiler ended with {status}: {message}")),
    }
}

fn read_bounded(mut from: impl Read, cap: u64) -> Vec<u8> {
    let mut out = Vec::new();
    let _ = (&mut from).take(cap).read_to_end(&mut out);
    // Drain the rest so the child never blocks on a full pipe.
    let _ = std::io::copy(&mut from, &mut std::io::sink());
    out
}

/// Load an artifact a compiler child of this process wrote.
#[allow(unsafe_code)]
fn deserialize_own(engine: &Engine, artifact: &[u8]) -> wasmtime::Result<Component> {
    // SAFETY: wasmtime requires that the bytes come from `Component::serialize`
    // of a trusted source. These come, over a private pipe, from a child of
    // this process running this program's own compiler (`compiler_main`) on
    // an engine configured by the same `engine_config`; nothing else writes
    // that pipe. wasmtime itself checks the engine configuration and version
    // recorded in the artifact.
    unsafe { Component::deserialize(engine, artifact) }
}

/// The compiler child's `main`: `args` are what follow `__compile-plugin`
/// (memory bytes, CPU seconds, wasm stack); the component comes on stdin,
/// the artifact goes to stdout. Returns the exit status.
pub fn compiler_main(args: &[String]) -> i32 {
    let number = |i: usize| args.get(i).and_then(|a| a.parse::<u64>().ok());
    let (Some(memory), Some(cpu), Some(stack)) = (number(0), number(1), number(2)) else {
        eprintln!("usage: {COMPILER_ARG} MEMORY_BYTES CPU_SECONDS MAX_WASM_STACK");
        return EXIT_FAILED;
    };
    if let Err(e) = limit_self(memory, cpu) {
        eprintln!("setting the compiler's limits: {e}");
        return EXIT_FAILED;
    }
    let mut bytes = Vec::new();
    if let Err(e) = std::io::stdin().read_to_end(&mut bytes) {
        eprintln!("reading the component: {e}");
        return EXIT_FAILED;
    }
    let mut config = super::runtime::engine_config(stack as usize);
    // One core: the other serves requests meanwhile.
    config.parallel_compilation(false);
    let engine = match Engine::new(&config) {
        Ok(engine) => engine,
        Err(e) => {
            eprintln!("{e:#}");
            return EXIT_FAILED;
        }
    };
    std::panic::set_hook(Box::new(|_| {}));
    let compiled = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        Component::new(&engine, &bytes).and_then(|c| c.serialize())
    }));
    match compiled {
        Ok(Ok(artifact)) => match std::io::stdout().lock().write_all(&artifact) {
            Ok(()) => 0,
            Err(e) => {
                eprintln!("writing the compiled code: {e}");
                EXIT_FAILED
            }
        },
        Ok(Err(e)) => {
            eprintln!("{e:#}");
            EXIT_FAILED
        }
        Err(panic) => {
            let text = panic
                .downcast_ref::<String>()
                .map(String::as_str)
                .or_else(|| panic.downcast_ref::<&str>().copied())
                .unwrap_or("(no message)");
            eprintln!("{text}");
            EXIT_PANIC
        }
    }
}

/// Cap this process's data segment and CPU time, lower its priority, and
/// keep it from writing a core file.
#[allow(unsafe_code)]
fn limit_self(memory: u64, cpu_seconds: u64) -> std::io::Result<()> {
    let set = |resource, soft: u64, hard: u64| {
        let limit = libc::rlimit {
            rlim_cur: soft as libc::rlim_t,
            rlim_max: hard as libc::rlim_t,
        };
        // SAFETY: setrlimit reads the struct we pass and changes only this
        // process's limits.
        match unsafe { libc::setrlimit(resource, &limit) } {
            0 => Ok(()),
            _ => Err(std::io::Error::last_os_error()),
        }
    };
    set(libc::RLIMIT_DATA, memory, memory)?;
    set(libc::RLIMIT_CPU, cpu_seconds, cpu_seconds.saturating_add(1))?;
    set(libc::RLIMIT_CORE, 0, 0)?;
    // SAFETY: setpriority changes only this process's scheduling priority.
    // Failing to lower it is harmless.
    let _ = unsafe { libc::setpriority(libc::PRIO_PROCESS, 0, 10) };
    Ok(())
}
