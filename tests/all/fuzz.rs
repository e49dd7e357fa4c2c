//! Bounded property tests over the inputs users and plugins hand the host:
//! JSON Lines → batch, SchemaSpec JSON, SQL filters (the host's decode of
//! plugin IPC is fuzzed in `crates/wire`). Each case is a seeded mutation of
//! a valid input; every answer must be `Ok` or a typed error — never a panic.
//! `LC_FUZZ_SEED` and `LC_FUZZ_CASES` (a multiplier) reproduce or lengthen a
//! run; a failure prints its seed.

use std::sync::Arc;

use lance_context_host::PluginLimits;
use lance_context_host::spec::{KeyRule, SchemaSpec};
use lance_context_store::{ScanRequest, Store};

use crate::plugins::{bytes, runtime};
use crate::support::*;

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

fn base_seed() -> u64 {
    std::env::var("LC_FUZZ_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0xF022)
}

fn cases(n: usize) -> usize {
    n * std::env::var("LC_FUZZ_CASES")
        .ok()
        .and_then(|s| s.parse::<usize>().ok())
        .unwrap_or(1)
}

/// Tokens that stress a parser: boundary numbers, odd strings, nesting.
const TOKENS: &[&str] = &[
    "null",
    "true",
    "-0",
    "1e309",
    "-9223372036854775809",
    "18446744073709551616",
    "1.5",
    "\"\\u0000\"",
    "\"\\ud800\"",
    "[]",
    "{}",
    "[[[[[[[[[[[[[[[[]]]]]]]]]]]]]]]]",
    "\"2024-02-30T25:61:61Z\"",
    "\"é\u{1b}[2J\"",
    ",",
    ":",
    "\"",
    "]",
    "}",
    "NaN",
    "[1,2,3,4,5,6,7,8,9]",
    "\"x\"",
];

/// Mutate `text`: flip a byte, splice a token, cut, duplicate a span.
fn mutate(rng: &mut Rng, text: &str) -> String {
    let mut bytes = text.as_bytes().to_vec();
    for _ in 0..1 + rng.below(3) {
        if bytes.is_empty() {
            bytes.extend_from_slice(TOKENS[rng.below(TOKENS.len())].as_bytes());
            continue;
        }
        let at = rng.below(bytes.len());
        match rng.below(4) {
            0 => bytes[at] = rng.next() as u8,
            1 => {
                let token = TOKENS[rng.below(TOKENS.len())].as_bytes();
                bytes.splice(at..at, token.iter().copied());
            }
            2 => bytes.truncate(at),
            _ => {
                let end = (at + 1 + rng.below(16)).min(bytes.len());
                let span = bytes[at..end].to_vec();
                bytes.splice(at..at, span);
            }
        }
    }
    String::from_utf8_lossy(&bytes).into_owned()
}

#[test]
fn json_lines_to_a_batch_never_panics() {
    let rt = runtime(PluginLimits::default());
    let rollout = rt.load("rollout", &bytes("rollout"), vec![]).unwrap();
    let notes = rt.load("example", &bytes("example"), vec![]).unwrap();
    let seeds = [
        (
            &rollout,
            r#"{"id": "a", "rollout_id": "r", "sequence_order": 3, "role": "assistant", "content": "hi", "reward": 0.5}"#,
        ),
        (
            &rollout,
            r#"{"id": "b", "rollout_id": "r", "created_at": "2024-01-02T03:04:05Z", "metadata": "{}"}"#,
        ),
        (
            &notes,
            r#"{"id": "n", "text": "t", "priority": 2, "embedding": [1, 0, 0, 0]}"#,
        ),
    ];
    let base = base_seed();
    for case in 0..cases(2000) {
        let seed = base
            .wrapping_add(case as u64)
            .wrapping_mul(0x9E37_79B9_7F4A_7C15)
            | 1;
        let mut rng = Rng(seed);
        let (plugin, line) = seeds[rng.below(seeds.len())];
        let input = format!("{}\n{}", mutate(&mut rng, line), seeds[0].1);
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            lance_context_host::rows_from_json(plugin, input.as_bytes()).map(|b| b.num_rows())
        }));
        assert!(
            result.is_ok(),
            "seed {seed}: rows_from_json panicked on {input:?}"
        );
    }
}

#[test]
fn spec_json_never_panics() {
    let seed_spec = r#"{"name": "n", "key": "id", "columns": [
        {"name": "id", "type": "Utf8", "nullable": false},
        {"name": "p", "type": "Int32", "rules": {"min": 1, "max": 5}},
        {"name": "l", "type": "List(Struct(\"a\": Timestamp(µs, \"UTC\")))"},
        {"name": "v", "type": "FixedSizeList(4 x Float32)"},
        {"name": "d", "type": "Dictionary(Int32, Utf8)"}],
        "vectors": [{"column": "v", "dimension": 4, "metric": "cosine"}],
        "queries": [{"name": "q", "params": ["p"], "filter": "p = {p}", "order_by": ["p desc"]}]}"#;
    SchemaSpec::from_json(seed_spec)
        .unwrap()
        .check(KeyRule::IdOnly)
        .unwrap();
    let base = base_seed();
    for case in 0..cases(5000) {
        let seed = base
            .wrapping_add(case as u64)
            .wrapping_mul(0x9E37_79B9_7F4A_7C15)
            | 1;
        let mut rng = Rng(seed);
        let text = mutate(&mut rng, seed_spec);
        let result = std::panic::catch_unwind(|| {
            SchemaSpec::from_json(&text).map(|spec| spec.check(KeyRule::IdOnly).is_ok())
        });
        assert!(
            result.is_ok(),
            "seed {seed}: the spec check panicked on {text:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sql_filters_never_panic_the_engine() {
    let (_dir, uri) = temp_uri();
    let store = Arc::new(
        Store::create(config(&uri).with_manual_maintenance())
            .await
            .unwrap(),
    );
    store.add(&batch(&rows("k", "g", 20))).await.unwrap();
    let filters = [
        "n > 3 AND grp = 'g'",
        "id IN ('k-00001', 'k-00002') OR score IS NULL",
        "note LIKE '%x%' AND NOT (n BETWEEN 1 AND 5)",
        "(id = 'a') OR (1=1)",
        "CAST(n AS VARCHAR) = '3'",
    ];
    let base = base_seed();
    for case in 0..cases(200) {
        let seed = base
            .wrapping_add(case as u64)
            .wrapping_mul(0x9E37_79B9_7F4A_7C15)
            | 1;
        let mut rng = Rng(seed);
        let pick = filters[rng.below(filters.len())];
        let filter = mutate(&mut rng, pick);
        let store = store.clone();
        let scan = tokio::spawn({
            let filter = filter.clone();
            async move {
                store
                    .scan(ScanRequest::new().filter(filter).limit(5))
                    .await
                    .map(|b| b.num_rows())
            }
        })
        .await;
        assert!(
            scan.is_ok(),
            "seed {seed}: a scan with filter {filter:?} panicked"
        );
    }
}
