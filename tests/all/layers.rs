//! The crates' layering (docs/architecture.md): each depends only on the
//! layers below it, and the library a Rust program embeds
//! (`lance-context-host`) pulls in no command-line crate, directly or
//! through another.

use std::collections::BTreeSet;
use std::process::Command;

/// The workspace's crates, each with the workspace crates it may use.
const LAYERS: &[(&str, &[&str])] = &[
    ("lance-context-spec", &[]),
    ("lance-context-wire", &["lance-context-spec"]),
    (
        "lance-context-store",
        &["lance-context-spec", "lance-context-wire"],
    ),
    ("lance-context-client", &[]),
    (
        "lance-context-host",
        &[
            "lance-context-spec",
            "lance-context-wire",
            "lance-context-store",
            "lance-context-client",
        ],
    ),
    (
        "lance-context-cli",
        &[
            "lance-context-spec",
            "lance-context-wire",
            "lance-context-store",
            "lance-context-client",
            "lance-context-host",
        ],
    ),
];

/// What only the command line needs (comfy-table is not here: Arrow's
/// pretty printer, which Lance's DataFusion pulls in, uses it).
const COMMAND_LINE: &[&str] = &["clap", "clap_complete", "indicatif", "lance-context-cli"];

/// What only the command line needs, which the host must not name itself.
const COMMAND_LINE_DIRECT: &[&str] = &["comfy-table", "anyhow", "tracing-subscriber"];

fn cargo(args: &[&str]) -> String {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = Command::new(cargo)
        .args(args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "cargo {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn each_crate_depends_only_on_the_layers_below() {
    let metadata: serde_json::Value = serde_json::from_str(&cargo(&[
        "metadata",
        "--format-version",
        "1",
        "--no-deps",
        "--offline",
    ]))
    .unwrap();
    let packages = metadata["packages"].as_array().unwrap();
    for (name, allowed) in LAYERS {
        let package = packages
            .iter()
            .find(|p| p["name"] == *name)
            .unwrap_or_else(|| panic!("{name} is not in the workspace"));
        // Normal and build dependencies: what the crate ships with.
        let used: BTreeSet<&str> = package["dependencies"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|d| d["kind"].as_str() != Some("dev"))
            .filter_map(|d| d["name"].as_str())
            .filter(|d| d.starts_with("lance-context-"))
            .collect();
        let forbidden: Vec<&&str> = used.iter().filter(|d| !allowed.contains(d)).collect();
        assert!(
            forbidden.is_empty(),
            "{name} depends on {forbidden:?}: a layer above it (docs/architecture.md)"
        );
        if *name == "lance-context-host" {
            let named: Vec<&str> = package["dependencies"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|d| d["kind"].as_str() != Some("dev"))
                .filter_map(|d| d["name"].as_str())
                .filter(|d| COMMAND_LINE_DIRECT.contains(d) || COMMAND_LINE.contains(d))
                .collect();
            assert!(
                named.is_empty(),
                "lance-context-host depends on {named:?}: command-line crates belong in crates/cli"
            );
        }
    }
}

#[test]
fn the_host_library_pulls_in_no_command_line_crate() {
    let tree = cargo(&[
        "tree",
        "--offline",
        "-p",
        "lance-context-host",
        "-e",
        "normal",
        "--prefix",
        "none",
        "--format",
        "{p}",
    ]);
    let crates: BTreeSet<&str> = tree
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .collect();
    assert!(crates.contains("wasmtime"), "cargo tree read: {tree}");
    let found: Vec<&&str> = COMMAND_LINE
        .iter()
        .filter(|c| crates.contains(**c))
        .collect();
    assert!(
        found.is_empty(),
        "lance-context-host depends on {found:?}: command-line crates belong in crates/cli"
    );
}
