//! One error kind for everything the host reports: the engine's kinds plus
//! the plugin's own. The CLI's exit codes and the server's HTTP statuses are
//! each one `match` on [`ErrorKind`]; nothing recovers a kind from message
//! text.

use crate::plugin::PluginError;
use crate::spec::{BindError, SpecErrors};
use crate::{PipelineError, QueryError, QueryFailure, RegistryError};

/// What kind of failure an error of the host is (see [`error_kind`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorKind {
    /// The request, its arguments or its data are wrong (a bad name, an
    /// unknown column, a value of the wrong type, a declaration that breaks
    /// the rules, a component that is not a schema plugin). Retrying the
    /// same call fails again.
    InvalidInput,
    /// The schema's plugin refused rows of the input (every row error is in
    /// the error). Retrying the same rows fails again.
    Rejected,
    /// The store, record, version or file asked for does not exist.
    NotFound,
    /// The thing to create exists already.
    AlreadyExists,
    /// Another writer owns the shard, or a concurrent commit won: retry or
    /// reopen.
    Conflict,
    /// Refused for now to protect memory or a running job: retry later.
    Busy,
    /// The store's writer is closed or latched after a failure: reopen it.
    Unavailable,
    /// The plugin itself failed: a trap or panic, its deadline, its memory
    /// limit, a forbidden call, output that breaks the contract. Not the
    /// caller's fault; the host keeps serving.
    PluginFault,
    /// The object store or the local disk failed.
    Storage,
    /// A stored file is damaged or does not match what was pinned (a
    /// registry entry that does not parse, a plugin whose hash changed).
    Corrupt,
    /// A bug or a broken invariant.
    Internal,
}

impl ErrorKind {
    /// A stable lower-case name (`invalid_input`, `plugin_fault`, …), as
    /// the CLI's JSON errors and the server's error codes spell it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::InvalidInput => "invalid_input",
            Self::Rejected => "rejected",
            Self::NotFound => "not_found",
            Self::AlreadyExists => "already_exists",
            Self::Conflict => "conflict",
            Self::Busy => "busy",
            Self::Unavailable => "unavailable",
            Self::PluginFault => "plugin_fault",
            Self::Storage => "storage",
            Self::Corrupt => "corrupt",
            Self::Internal => "internal",
        }
    }
}

impl ErrorKind {
    /// Every kind, in declaration order.
    pub const ALL: [ErrorKind; 11] = [
        Self::InvalidInput,
        Self::Rejected,
        Self::NotFound,
        Self::AlreadyExists,
        Self::Conflict,
        Self::Busy,
        Self::Unavailable,
        Self::PluginFault,
        Self::Storage,
        Self::Corrupt,
        Self::Internal,
    ];

    /// The kind [`ErrorKind::as_str`] names (e.g. a server's error code).
    pub fn from_code(code: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|k| k.as_str() == code)
    }
}

impl std::fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl From<lance_context_store::ErrorKind> for ErrorKind {
    fn from(kind: lance_context_store::ErrorKind) -> Self {
        use lance_context_store::ErrorKind as K;
        match kind {
            K::InvalidInput => Self::InvalidInput,
            K::NotFound => Self::NotFound,
            K::AlreadyExists => Self::AlreadyExists,
            K::Conflict => Self::Conflict,
            K::Busy => Self::Busy,
            K::Unavailable => Self::Unavailable,
            K::Storage => Self::Storage,
            _ => Self::Internal,
        }
    }
}

impl PluginError {
    /// The kind: rows refused are [`ErrorKind::Rejected`]; parameters refused
    /// and components that are not schema plugins (or declare a schema that
    /// breaks the rules) are invalid input; a plugin that failed while
    /// running is a [`ErrorKind::PluginFault`].
    pub fn kind(&self) -> ErrorKind {
        match self {
            Self::Rejected { .. } => ErrorKind::Rejected,
            Self::InvalidParams { .. }
            | Self::Load { .. }
            | Self::UnsupportedAbi { .. }
            | Self::InvalidDeclaration { .. } => ErrorKind::InvalidInput,
            Self::Busy { .. } | Self::LoadBusy { .. } => ErrorKind::Busy,
            Self::Compile { limit, .. } => match limit {
                crate::plugin::CompileLimit::Unavailable(_) => ErrorKind::Unavailable,
                _ => ErrorKind::InvalidInput,
            },
            // The host handed the plugin something malformed: our bug.
            Self::MalformedInput { .. } => ErrorKind::Internal,
            Self::Timeout { .. }
            | Self::MemoryLimit { .. }
            | Self::Panic { .. }
            | Self::Forbidden { .. }
            | Self::Trap { .. }
            | Self::OutputTooLarge { .. }
            | Self::MalformedOutput { .. }
            | Self::SchemaMismatch { .. } => ErrorKind::PluginFault,
        }
    }
}

impl PipelineError {
    /// The kind (input that does not fit the schema is invalid input).
    pub fn kind(&self) -> ErrorKind {
        match self {
            Self::InvalidInput { .. } | Self::InvalidRecords { .. } => ErrorKind::InvalidInput,
            Self::Plugin(e) => e.kind(),
            Self::Store(e) => e.kind().into(),
        }
    }
}

impl QueryError {
    /// Always invalid input: the query's name or arguments are wrong.
    pub fn kind(&self) -> ErrorKind {
        ErrorKind::InvalidInput
    }
}

impl QueryFailure {
    /// The kind of the query, engine or plugin failure.
    pub fn kind(&self) -> ErrorKind {
        match self {
            Self::Query(e) => e.kind(),
            Self::Store(e) => e.kind().into(),
            Self::Plugin(e) => e.kind(),
        }
    }
}

impl RegistryError {
    /// The kind of a registry failure.
    pub fn kind(&self) -> ErrorKind {
        match self {
            Self::InvalidName { .. }
            | Self::Spec(_)
            | Self::UnknownPlugin { .. }
            | Self::MissingStorageOptions { .. }
            | Self::UriNotEmpty { .. }
            | Self::UpgradeRefused { .. }
            | Self::AdoptRefused { .. }
            | Self::CannotInfer { .. }
            | Self::UnsafeUri { .. }
            | Self::InvalidUri(_)
            | Self::UriRefused { .. }
            | Self::UriNotAllowed { .. } => ErrorKind::InvalidInput,
            Self::NotFound { .. } | Self::PluginMissing { .. } => ErrorKind::NotFound,
            Self::AlreadyExists { .. } => ErrorKind::AlreadyExists,
            Self::Incomplete { .. } => ErrorKind::Unavailable,
            Self::Plugin(e) => e.kind(),
            Self::ProbeFailed { .. } => ErrorKind::PluginFault,
            Self::Store(e) => e.kind().into(),
            Self::PluginTampered { .. } | Self::SpecChanged { .. } | Self::Corrupt { .. } => {
                ErrorKind::Corrupt
            }
            Self::Io { .. } => ErrorKind::Storage,
        }
    }
}

/// The kind of any error the host or engine returns, found by walking the
/// error and its sources for the first typed error this crate knows (so an
/// error wrapped with context keeps its kind). An error of no known type is
/// [`ErrorKind::Internal`]; an I/O error is [`ErrorKind::Storage`] (a file
/// that is not there, [`ErrorKind::NotFound`]).
pub fn error_kind(err: &(dyn std::error::Error + 'static)) -> ErrorKind {
    let mut next = Some(err);
    while let Some(e) = next {
        if let Some(kind) = known_kind(e) {
            return kind;
        }
        next = e.source();
    }
    ErrorKind::Internal
}

fn known_kind(e: &(dyn std::error::Error + 'static)) -> Option<ErrorKind> {
    if let Some(e) = e.downcast_ref::<RegistryError>() {
        return Some(e.kind());
    }
    if e.downcast_ref::<lance_context_store::UriError>().is_some() {
        return Some(ErrorKind::InvalidInput);
    }
    if let Some(e) = e.downcast_ref::<PipelineError>() {
        return Some(e.kind());
    }
    if let Some(e) = e.downcast_ref::<QueryFailure>() {
        return Some(e.kind());
    }
    if let Some(e) = e.downcast_ref::<QueryError>() {
        return Some(e.kind());
    }
    if let Some(e) = e.downcast_ref::<PluginError>() {
        return Some(e.kind());
    }
    if let Some(e) = e.downcast_ref::<crate::ServerError>() {
        return Some(e.kind());
    }
    if let Some(e) = e.downcast_ref::<lance_context_store::Error>() {
        return Some(e.kind().into());
    }
    if e.downcast_ref::<SpecErrors>().is_some() || e.downcast_ref::<BindError>().is_some() {
        return Some(ErrorKind::InvalidInput);
    }
    if let Some(io) = e.downcast_ref::<std::io::Error>() {
        return Some(match io.kind() {
            // A file the caller named is not there.
            std::io::ErrorKind::NotFound => ErrorKind::NotFound,
            std::io::ErrorKind::InvalidData => ErrorKind::InvalidInput,
            _ => ErrorKind::Storage,
        });
    }
    None
}
