//! `lance-context plugin new NAME`: a standalone plugin crate that builds
//! for wasm32-wasip2 and passes `plugin check` as generated.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use serde::Serialize;

use crate::args::{ensure_usage, usage};
use crate::output::Out;

/// The SDK this binary was built with (a source checkout's `plugins/sdk`).
const BUILT_WITH_SDK: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../plugins/sdk");

/// The toolchain the project pins (a new crate pins the same one).
const TOOLCHAIN: &str = include_str!("../../../../rust-toolchain.toml");

/// The template of a new crate's `src/lib.rs`; [`lib_rs`] fills in `{schema}`
/// (the schema's name) and `{ty}` (the plugin's type). Every other brace is
/// the generated code's own.
const LIB_RS: &str = include_str!("templates/lib.rs.txt");

#[derive(Debug, Serialize)]
struct Created {
    crate_name: String,
    dir: PathBuf,
    files: Vec<PathBuf>,
    /// The component `cargo build --release --target wasm32-wasip2` writes.
    component: PathBuf,
}

/// Write the crate `name` under `dir` (default `./NAME`); `sdk` is a path to
/// the SDK crate or a git URL of the repository holding it.
pub fn new(name: &str, dir: Option<PathBuf>, sdk: Option<String>, out: Out) -> Result<()> {
    ensure_usage(valid_name(name), || {
        format!(
            "'{name}' is not a crate name: lowercase letters, digits, '-' and '_', starting with a letter (at most 64), and not a Rust keyword, a standard crate or the SDK's name"
        )
    })?;
    let dir = dir.unwrap_or_else(|| PathBuf::from(name));
    ensure_usage(!dir.exists() || dir.is_dir(), || {
        format!("{} exists and is not a directory", dir.display())
    })?;
    if dir.exists() && std::fs::read_dir(&dir)?.next().is_some() {
        return Err(usage(format!(
            "{} exists and is not empty; pick another --dir",
            dir.display()
        )));
    }
    let sdk = sdk_dependency(sdk)?;
    let lib = name.replace('-', "_");
    let files: [(&str, String); 6] = [
        ("Cargo.toml", cargo_toml(name, &sdk)),
        ("rust-toolchain.toml", TOOLCHAIN.to_string()),
        ("src/lib.rs", lib_rs(name)),
        ("README.md", readme(name, &lib)),
        (".gitignore", "/target\n/data\n".to_string()),
        ("samples.jsonl", samples()),
    ];
    std::fs::create_dir_all(dir.join("src"))
        .with_context(|| format!("creating {}", dir.display()))?;
    let mut written = Vec::new();
    for (file, text) in &files {
        let path = dir.join(file);
        std::fs::write(&path, text).with_context(|| format!("writing {}", path.display()))?;
        written.push(path);
    }
    let created = Created {
        crate_name: name.to_string(),
        component: dir
            .join("target/wasm32-wasip2/release")
            .join(format!("{lib}.wasm")),
        dir: dir.clone(),
        files: written,
    };
    out.item(&created, || {
        format!(
            "created the plugin crate '{name}' in {d}\n\nnext:\n  cd {d}\n  cargo test                                     # the plugin's logic, natively\n  cargo build --release --target wasm32-wasip2   # the component\n  lance-context plugin check {c} --sample samples.jsonl\n  lance-context store create {name} --plugin {c}",
            d = dir.display(),
            c = Path::new("target/wasm32-wasip2/release")
                .join(format!("{lib}.wasm"))
                .display(),
        )
    })
}

fn valid_name(name: &str) -> bool {
    let mut chars = name.chars();
    let lib = name.replace('-', "_");
    matches!(chars.next(), Some(c) if c.is_ascii_lowercase())
        && name.len() <= 64
        && chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '_')
        && !RESERVED.contains(&lib.as_str())
}

/// Names a crate cannot take: Rust's keywords, the standard crates, and
/// the SDK's own name.
const RESERVED: &[&str] = &[
    "abstract",
    "alloc",
    "as",
    "async",
    "await",
    "become",
    "box",
    "break",
    "const",
    "continue",
    "core",
    "crate",
    "do",
    "dyn",
    "else",
    "enum",
    "extern",
    "false",
    "final",
    "fn",
    "for",
    "gen",
    "if",
    "impl",
    "in",
    "lance_context_plugin",
    "let",
    "loop",
    "macro",
    "match",
    "mod",
    "move",
    "mut",
    "override",
    "priv",
    "proc_macro",
    "pub",
    "ref",
    "return",
    "self",
    "static",
    "std",
    "struct",
    "super",
    "test",
    "trait",
    "true",
    "try",
    "type",
    "typeof",
    "unsafe",
    "unsized",
    "use",
    "virtual",
    "where",
    "while",
    "yield",
];

/// The dependency line of the SDK: `{ path = "…" }` or `{ git = "…" }`.
fn sdk_dependency(sdk: Option<String>) -> Result<String> {
    let toml_string = |s: &str| serde_json::to_string(s).expect("a string serialises");
    match sdk {
        Some(s)
            if s.starts_with("https://") || s.starts_with("http://") || s.starts_with("git@") =>
        {
            Ok(format!("{{ git = {} }}", toml_string(&s)))
        }
        Some(p) => {
            let path = Path::new(&p);
            ensure_usage(path.join("Cargo.toml").is_file(), || {
                format!(
                    "--sdk {p}: no Cargo.toml there (give the SDK crate's directory, plugins/sdk in the repository, or a git URL)"
                )
            })?;
            let path = std::fs::canonicalize(path)?;
            Ok(format!(
                "{{ path = {} }}",
                toml_string(&path.to_string_lossy())
            ))
        }
        None => {
            let built = Path::new(BUILT_WITH_SDK);
            match std::fs::canonicalize(built) {
                Ok(path) if path.join("Cargo.toml").is_file() => Ok(format!(
                    "{{ path = {} }}",
                    toml_string(&path.to_string_lossy())
                )),
                _ => Err(usage(format!(
                    "the SDK this binary was built with ({BUILT_WITH_SDK}) is not on this machine; pass --sdk PATH (the repository's plugins/sdk) or --sdk GIT_URL"
                ))),
            }
        }
    }
}

fn cargo_toml(name: &str, sdk: &str) -> String {
    format!(
        r#"[package]
name = "{name}"
version = "0.1.0"
edition = "2024"
publish = false

[lib]
# cdylib: the wasm component; rlib: `cargo test` of the plugin's logic, natively.
crate-type = ["cdylib", "rlib"]

[dependencies]
# The plugin SDK (the contract, Arrow, the wire format).
lance-context-plugin = {sdk}

# Speed over size: validate and transform run on every add.
[profile.release]
opt-level = 3
lto = true
codegen-units = 1
panic = "abort"
strip = true

# A crate of its own, never a member of an enclosing workspace.
[workspace]
"#
    )
}

/// The generated crate's `src/lib.rs`: [`LIB_RS`] with `{schema}` and `{ty}`
/// filled in.
fn lib_rs(name: &str) -> String {
    let schema = name.replace('-', "_");
    let ty = format!("{}Schema", pascal(name));
    LIB_RS.replace("{schema}", &schema).replace("{ty}", &ty)
}

/// `my-orders` → `MyOrders`.
fn pascal(name: &str) -> String {
    name.split(['-', '_'])
        .filter(|p| !p.is_empty())
        .map(|p| {
            let mut c = p.chars();
            match c.next() {
                Some(first) => first.to_ascii_uppercase().to_string() + c.as_str(),
                None => String::new(),
            }
        })
        .collect()
}

fn samples() -> String {
    [
        r#"{"id": "o1", "customer": "c1", "amount_cents": 1250, "currency": "EUR"}"#,
        r#"{"id": "o2", "customer": "c2", "amount_cents": 0, "currency": "USD", "note": "free sample", "created_at": "2026-11-30T10:00:00Z"}"#,
    ]
    .join("\n")
        + "\n"
}

fn readme(name: &str, lib: &str) -> String {
    format!(
        r#"# {name}: a lance-context schema plugin

A schema plugin declares a store's columns, validates every record added to
the store and may fill values (here: `created_at` from the host's clock). It
runs sandboxed as a WebAssembly component.

## Build and check

```sh
cargo test                                     # the plugin's logic, natively
cargo build --release --target wasm32-wasip2   # the component
lance-context plugin check target/wasm32-wasip2/release/{lib}.wasm --sample samples.jsonl
```

`plugin check` loads the component with the host's checks and probes it with
records generated from its declaration (and the sample records): it reports
a transform whose output does not match the declared schema, a non-nullable
column left null, a trap or a timeout. `store create` runs the same probe.

## Use

```sh
lance-context store create {name} --plugin target/wasm32-wasip2/release/{lib}.wasm
lance-context store add {name} samples.jsonl
lance-context store scan {name}
```

After a fix, rebuild and `lance-context store upgrade {name} --plugin
target/wasm32-wasip2/release/{lib}.wasm` (the schema must stay the same).

## Notes

- `crate-type = ["cdylib", "rlib"]`: the component, and native tests.
- `export_plugin!` is behind `#[cfg(target_arch = "wasm32")]`, so the crate
  also builds natively.
- The release profile (opt-level 3, LTO, `panic = "abort"`) keeps the
  component fast: validate and transform run on every add.
- `rust-toolchain.toml` pins the toolchain lance-context is built and tested
  with, with the `wasm32-wasip2` target.
"#
    )
}
