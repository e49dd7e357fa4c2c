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

/// The kind of a command's error (see [`error_kind`]; context added on the
/// way keeps the kind of the error it wraps).
pub fn kind(err: &anyhow::Error) -> ErrorKind {
    let err: &(dyn std::error::Error + 'static) = err.as_ref();
    error_kind(err)
}
