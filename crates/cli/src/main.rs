//! `lance-context`: the operator CLI.
//!
//! `demo` is the main job on the embedded default (a registry of stores in a
//! local directory). `store …` works on stores by name, `plugin …` on schema
//! plugins; the dataset-level commands (`count`, `get`, `scan`, `status`,
//! `merge`, `compact` with `--uri`) read any dataset without a registry;
//! `dev …` holds the benchmarks and the crash trials.
//!
//! Layout: `args.rs` (shared argument types), `exit.rs` (exit codes from the
//! host's one error kind), `output.rs` (tables, JSON Lines, progress),
//! `input.rs` (record formats in), `commands/` (one file per command group).

mod args;
mod commands;
mod exit;
mod input;
mod logging;
mod output;

use std::process::ExitCode;

use anyhow::Result;
use clap::{CommandFactory, Parser, Subcommand};

use commands::{dataset, demo, dev, plugin, serve, store};
use output::Out;

#[derive(Parser, Debug)]
#[command(
    name = "lance-context",
    version,
    about = "Storage host for AI-agent data on Lance"
)]
struct Cli {
    /// Print JSON Lines (one object per record or result) instead of tables;
    /// the default when stdout is not a terminal.
    #[arg(long, global = true)]
    json: bool,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// The product end to end: four stores (three built-in plugins and a user
    /// schema) loaded through their plugins, maintenance, every kind of read.
    Demo(demo::DemoCommand),
    /// Stores by name in a data root, or through a server (`--server`):
    /// create, adopt, list, describe, drop, add, upsert, patch, get, scan,
    /// count, search, retrieve, export, delete, status, versions, merge,
    /// compact, index, named queries.
    Store(store::StoreArgs),
    /// Schema plugins: list, inspect a declaration, check a component.
    Plugin {
        #[command(subcommand)]
        command: plugin::PluginCommand,
    },
    /// The REST/JSON server over a data root's stores (docs/server.md).
    Serve(serve::ServeCommand),
    #[command(flatten)]
    Dataset(dataset::DatasetCommand),
    /// For developers of lance-context: benchmarks (bench, bench-plugins,
    /// bench-search, bench-server, bench-peer) and the crash trials (torture).
    Dev {
        #[command(subcommand)]
        command: dev::DevCommand,
    },
    /// Print a shell completion script (bash, zsh, fish, elvish, powershell).
    Completions { shell: clap_complete::Shell },
}

fn main() -> ExitCode {
    // A compiler child (see `lance_context_host::Compiler`): nothing else.
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some(lance_context_host::COMPILER_ARG) {
        let code = lance_context_host::compiler_main(&args[2..]);
        return ExitCode::from(u8::try_from(code).unwrap_or(1));
    }
    // Plugins compile in a child of this executable, bounded and killable.
    if let Ok(program) = std::env::current_exe() {
        lance_context_host::use_compiler_program(program);
    }
    restore_sigpipe();
    let cli = Cli::parse();
    let out = Out::new(cli.json);
    logging::init(out.json_errors);
    // Lance's futures are deep; 8 MiB per worker as for the main thread.
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_stack_size(8 << 20)
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the runtime: {e}");
            return ExitCode::from(1);
        }
    };
    let result = runtime.block_on(run(cli.command, out));
    // Tasks still running (a writer's shutdown) may log: they end first, so
    // that an error is the last line on stderr.
    drop(runtime);
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            let kind = exit::kind(&err);
            let code = exit::code(kind);
            // Lance's errors carry the source locations they were made at:
            // the build's file paths, nothing a user can act on.
            let message = lance_context_store::without_source_locations(&format!("{err:#}"));
            if out.json_errors {
                let mut error = serde_json::json!({
                    "kind": kind.as_str(),
                    "message": message,
                    "exit_code": code,
                });
                let details = exit::details(&err);
                if !details.is_null() {
                    error["details"] = details;
                }
                eprintln!("{}", serde_json::json!({ "error": error }));
            } else {
                eprintln!("error: {}", exit::printable(&message));
            }
            ExitCode::from(code)
        }
    }
}

/// Die quietly of SIGPIPE, as command-line tools do, when the reader of
/// stdout goes away (`lance-context store scan … | head`): Rust ignores
/// SIGPIPE, which turns every later print into a panic or an error.
fn restore_sigpipe() {
    #[cfg(unix)]
    #[allow(unsafe_code)]
    // SAFETY: setting a signal's disposition to its default, before any
    // thread is started; no handler runs Rust code.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
}

async fn run(command: Command, out: Out) -> Result<()> {
    match command {
        Command::Demo(c) => demo::run(c, out).await,
        Command::Store(args) => store::run(args, out).await,
        Command::Plugin { command } => command.execute(out),
        Command::Serve(c) => c.execute().await,
        Command::Dataset(c) => c.execute(out).await,
        Command::Dev { command } => command.execute().await,
        Command::Completions { shell } => {
            clap_complete::generate(
                shell,
                &mut Cli::command(),
                "lance-context",
                &mut std::io::stdout(),
            );
            Ok(())
        }
    }
}
