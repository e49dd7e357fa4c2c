//! Crash recovery with a real killed process: a child adds rows and reports each
//! acknowledgement; the parent kills it with SIGKILL mid-stream and checks that
//! every acknowledged row is there — from a fresh reader, and after a writer
//! reopens the shard (WAL replay).

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};

use lance_context_store::{Store, StoreConfig};

use crate::support::*;

const CHILD_URI: &str = "LC_TEST_CHILD_URI";

/// Child-process entry point, run by `acknowledged_rows_survive_a_killed_writer`
/// with the store URI in the environment. Adds batches forever, printing
/// `ACK <prefix>` after each add returns.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "child-process entry point; spawned by the crash tests"]
async fn child_writer_entry() {
    let uri = std::env::var(CHILD_URI).expect("run by the crash test");
    let store = Store::open_or_create(config(&uri)).await.unwrap();
    for i in 0.. {
        let prefix = format!("c{i:04}");
        store
            .add(&batch(&rows(&prefix, "child", 25)))
            .await
            .unwrap();
        println!("ACK {prefix}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acknowledged_rows_survive_a_killed_writer() {
    let (_dir, uri) = temp_uri();
    create(&uri).await.close().await.unwrap();

    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "crash::child_writer_entry",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_URI, &uri)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let stdout = BufReader::new(child.stdout.take().unwrap());
    let mut acked = Vec::new();
    for line in stdout.lines() {
        let line = line.unwrap();
        if let Some(prefix) = line.strip_prefix("ACK ") {
            acked.push(prefix.to_string());
            if acked.len() == 8 {
                break;
            }
        }
    }
    child.kill().unwrap(); // SIGKILL, mid-add
    child.wait().unwrap();
    assert_eq!(
        acked.len(),
        8,
        "the child acknowledged 8 adds before the kill"
    );

    // A fresh reader (no writer, no replay) sees every acknowledged row.
    let reader = Store::open_read_only(StoreConfig::new(&uri)).await.unwrap();
    for prefix in &acked {
        let n = reader
            .count(Some(&format!("id LIKE '{prefix}-%'")))
            .await
            .unwrap();
        assert_eq!(n, 25, "rows of acknowledged add {prefix}");
    }
    // Reopening the writer replays the WAL; nothing acknowledged is lost and
    // nothing is duplicated.
    let writer = Store::open(config(&uri)).await.unwrap();
    let total = writer.count(None).await.unwrap();
    assert!(total >= 8 * 25, "{total}");
    assert_eq!(total % 25, 0, "adds are whole: {total}");
    for prefix in &acked {
        let got = writer.get(&format!("{prefix}-00024")).await.unwrap();
        assert!(got.is_some(), "{prefix} lost after replay");
    }
    writer.add(&batch(&rows("after", "g", 1))).await.unwrap();
    assert_eq!(writer.count(None).await.unwrap(), total + 1);
}
