//! The CI-sized run of the crash trials (`lance-context dev torture`): as many
//! seeded trials as fit in the time budget, at least 50, with a fresh base
//! seed each run (printed, so a failure can be replayed with `--seed`).

#[test]
fn crash_trials_lose_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let seconds = std::env::var("LC_TORTURE_SECONDS").unwrap_or_else(|_| "150".into());
    let (code, out, err) = crate::support::cli(
        dir.path(),
        &[
            "dev",
            "torture",
            "--trials",
            "100000",
            "--min-trials",
            "50",
            "--max-seconds",
            &seconds,
        ],
        "",
    );
    println!("{out}");
    assert_eq!(code, 0, "{out}\n{err}");
    assert!(
        out.contains("rows lost: 0, deletes undone: 0, keys duplicated: 0"),
        "{out}"
    );
}

/// The trials whose seeds found a defect, replayed on every run. A trial's
/// schedule comes from its seed but the moment of the kill is timing, so a
/// replay need not hit the same window: each defect also has a deterministic
/// test of its own (docs/reliability.md, "What they found").
#[test]
fn the_seeds_that_found_defects_replay_clean() {
    for seed in ["46", "1796032029941228911", "1796032029941228944"] {
        let dir = tempfile::tempdir().unwrap();
        let (code, out, err) = crate::support::cli(
            dir.path(),
            &["dev", "torture", "--trials", "1", "--seed", seed],
            "",
        );
        assert_eq!(code, 0, "seed {seed}:\n{out}\n{err}");
        assert!(
            out.contains("rows lost: 0, deletes undone: 0, keys duplicated: 0, failed trials: 0"),
            "seed {seed}: {out}"
        );
    }
}
