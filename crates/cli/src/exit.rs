//! Exit codes: one `match` on the host's [`ErrorKind`].

use lance_context_host::{ErrorKind, error_kind};

/// The exit code of a failed command.
///
/// | code | meaning |
/// |---|---|
/// | 1 | anything else: storage failure, damaged files, a bug |
/// | 2 | invalid input: arguments, a declaration, a record or batch refused |
/// | 3 | not found: store, record, version, file |
/// | 4 | conflict or already exists |
/// | 5 | busy or writer unavailable: retry later or reopen |
/// | 6 | plugin fault: the plugin trapped, ran past a limit or broke the contract |
pub fn code(kind: ErrorKind) -> u8 {
    match kind {
        ErrorKind::InvalidInput | ErrorKind::Rejected => 2,
        ErrorKind::NotFound => 3,
        ErrorKind::AlreadyExists | ErrorKind::Conflict => 4,
        ErrorKind::Busy | ErrorKind::Unavailable => 5,
        ErrorKind::PluginFault => 6,
        _ => 1,
    }
}

/// A refusal the command words itself (e.g. the plugin's row errors of a
/// batch, already listed by line), with its kind and structured details.
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub struct Refused {
    pub kind: ErrorKind,
    pub message: String,
    pub details: serde_json::Value,
}

/// The kind of a command's error (see [`error_kind`]; context added on the
/// way keeps the kind of the error it wraps).
pub fn kind(err: &anyhow::Error) -> ErrorKind {
    if let Some(refused) = err.chain().find_map(|e| e.downcast_ref::<Refused>()) {
        return refused.kind;
    }
    let err: &(dyn std::error::Error + 'static) = err.as_ref();
    error_kind(err)
}

/// The structured details of a refusal, if the error carries them.
pub fn details(err: &anyhow::Error) -> serde_json::Value {
    err.chain()
        .find_map(|e| e.downcast_ref::<Refused>())
        .map(|r| r.details.clone())
        .unwrap_or(serde_json::Value::Null)
}

/// Text for a terminal: control characters (escape sequences a typed key or
/// a filter may carry) shown escaped; newlines and tabs kept.
pub fn printable(text: &str) -> String {
    escaped(text, &['\n', '\t'])
}

/// `text` with its control characters but `keep` shown escaped (`\n`,
/// `\r`, `\u{1b}`).
pub fn escaped(text: &str, keep: &[char]) -> String {
    text.chars()
        .flat_map(|c| match c {
            c if keep.contains(&c) => vec![c],
            c if c.is_control() => c.escape_default().collect(),
            c => vec![c],
        })
        .collect()
}
