//! Builds the plugins workspace (`plugins/`) for wasm32-wasip2, so that
//! `cargo test` is one command and the host's tests load real components.
//!
//! The nested cargo runs in its own target dir (`plugins/target`; sharing the
//! host's would deadlock on cargo's lock) with the outer build's flags removed
//! (coverage and linker flags break the wasm build). Set
//! `LANCE_CONTEXT_PLUGINS_DIR` to a directory of prebuilt `.wasm` files to skip
//! the nested build.

use std::path::{Path, PathBuf};
use std::process::Command;

fn watch(dir: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        let name = entry.file_name();
        if name == "target" {
            continue;
        }
        if path.is_dir() {
            watch(&path);
        } else if path
            .extension()
            .is_some_and(|e| e == "rs" || e == "toml" || e == "wit" || e == "lock")
        {
            println!("cargo:rerun-if-changed={}", path.display());
        }
    }
}

fn main() {
    println!("cargo:rerun-if-env-changed=LANCE_CONTEXT_PLUGINS_DIR");
    if let Ok(dir) = std::env::var("LANCE_CONTEXT_PLUGINS_DIR") {
        println!("cargo:rustc-env=LANCE_CONTEXT_PLUGINS_DIR={dir}");
        return;
    }
    let manifest = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets it"));
    let root = manifest
        .join("../..")
        .canonicalize()
        .expect("workspace root");
    let plugins = root.join("plugins");
    watch(&plugins);
    watch(&root.join("wit"));
    // The spec crate is shared with the guest side (plugins/spec).
    watch(&root.join("crates/spec"));
    println!(
        "cargo:rerun-if-changed={}",
        root.join("rust-toolchain.toml").display()
    );

    let target_dir = plugins.join("target");
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut cmd = Command::new(cargo);
    cmd.current_dir(&plugins)
        .args([
            "build",
            "--release",
            "--locked",
            "--target",
            "wasm32-wasip2",
        ])
        .arg("--manifest-path")
        .arg(plugins.join("Cargo.toml"))
        .arg("--target-dir")
        .arg(&target_dir);
    for var in [
        "RUSTFLAGS",
        "CARGO_ENCODED_RUSTFLAGS",
        "CARGO_BUILD_RUSTFLAGS",
        "CARGO_BUILD_TARGET",
        "CARGO_TARGET_DIR",
        "CARGO_BUILD_TARGET_DIR",
        "RUSTC_WORKSPACE_WRAPPER",
        "RUSTC_WRAPPER",
        "CARGO_PROFILE_RELEASE_DEBUG",
    ] {
        cmd.env_remove(var);
    }
    let output = cmd.output().expect("running cargo for the plugins");
    if !output.status.success() {
        panic!(
            "building the plugins for wasm32-wasip2 failed (is the target installed? \
             `rustup target add wasm32-wasip2`):\n{}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
    let out = target_dir.join("wasm32-wasip2").join("release");
    println!(
        "cargo:rustc-env=LANCE_CONTEXT_PLUGINS_DIR={}",
        out.display()
    );
}
