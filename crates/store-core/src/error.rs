//! The engine's one error type.
//!
//! Every failure the engine can report is a variant of [`Error`]; callers act on
//! [`Error::kind`] (a small, stable [`ErrorKind`]) and never on the message text.
//! Lance errors are classified once, in [`Error::from_lance`], from Lance's typed
//! accessors (`fence_reason()`, `is_backpressure()`, `is_not_found()`, variants),
//! never from their `Display` output.

use std::fmt;

/// Result alias used throughout the engine.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What the caller can do about an error. Stable: the REST layer maps it to a
/// status code in one place, the CLI to an exit code.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorKind {
    /// The request or its data is wrong; retrying the same call fails again.
    InvalidInput,
    /// The store, row or object asked for does not exist.
    NotFound,
    /// The thing to create exists already.
    AlreadyExists,
    /// Another writer owns the shard, or a concurrent commit won. Reopen or retry.
    Conflict,
    /// Temporarily refused to protect memory or a running job; retry later.
    Busy,
    /// The writer is closed or latched after a fatal failure; reopen the store.
    Unavailable,
    /// Object store or Lance I/O failed.
    Storage,
    /// A bug or an invariant broken inside the engine.
    Internal,
}

/// Why a writer was fenced (mirrors Lance's `FenceReason`, owned here so callers
/// do not depend on Lance).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum FenceReason {
    /// Another writer claimed this shard with a higher epoch.
    PeerClaimedEpoch,
    /// This writer's own WAL persistence failed; it must reopen and replay.
    PersistenceFailure,
}

impl fmt::Display for FenceReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::PeerClaimedEpoch => "another writer claimed the shard",
            Self::PersistenceFailure => "this writer's WAL persistence failed",
        })
    }
}

/// A problem found in a batch handed to `add`, with where it is.
///
/// Rows are zero-based positions in the batch as given by the caller.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum BatchProblem {
    /// The batch has no rows.
    EmptyBatch,
    /// A column that the store's schema does not have.
    UnknownColumn { column: String },
    /// The same column name appears twice in the batch.
    DuplicateColumn { column: String },
    /// A column whose Arrow type differs from the store's.
    TypeMismatch {
        column: String,
        expected: String,
        found: String,
    },
    /// A non-nullable column is absent from the batch.
    MissingColumn { column: String },
    /// A null in a non-nullable column.
    NullValue { column: String, row: usize },
    /// A null key.
    NullKey { column: String, row: usize },
    /// An empty-string key.
    EmptyKey { column: String, row: usize },
    /// A value in a column that this (older) dataset does not store yet.
    ColumnNotInDataset { column: String, row: usize },
    /// A value the engine reserves (the tombstone content type).
    ReservedValue { column: String, row: usize },
    /// A key (or secondary key) repeats an earlier row of the batch.
    DuplicateInBatch {
        column: String,
        row: usize,
        first_row: usize,
        value: String,
    },
    /// A key (or secondary key) that a stored, non-tombstone row holds.
    AlreadyExists {
        column: String,
        row: usize,
        value: String,
    },
    /// An upsert row without its secondary key.
    MissingSecondaryKey { column: String, row: usize },
    /// An upsert's secondary key matches several visible records.
    Ambiguous {
        column: String,
        row: usize,
        value: String,
        matches: usize,
    },
    /// A row supersedes a record that is not current: absent, deleted, or
    /// superseded already (by `superseded_by`) — e.g. a concurrent patch of
    /// the same record won.
    NotCurrent {
        column: String,
        row: usize,
        value: String,
        superseded_by: Option<String>,
    },
    /// A key (or secondary key) longer than [`crate::MAX_KEY_BYTES`].
    KeyTooLong {
        column: String,
        row: usize,
        bytes: usize,
        max: usize,
    },
    /// A value in a column the engine manages: `superseded_by_id` (any
    /// value; `reserved` is `None`), or a value the engine reserves
    /// (`lifecycle_status` [`crate::RESERVED_STATUS`]).
    EngineManaged {
        column: String,
        row: usize,
        reserved: Option<String>,
    },
    /// A vector of a declared vector column the engine cannot rank: an
    /// element not finite, too large for its distances to stay finite, or
    /// all zero under the cosine metric.
    BadVector {
        column: String,
        row: usize,
        problem: crate::VectorProblem,
    },
    /// Rows that must become visible together (versions of one record
    /// written in one batch, linked through `supersedes_id`, or rows with
    /// the same key) are more than one atomic write can hold
    /// (`WriterSettings::max_memtable_rows`). Split the chain over batches.
    LinkedRowsTooMany {
        column: String,
        row: usize,
        rows: usize,
        max: usize,
    },
}

impl BatchProblem {
    /// The column the problem is in, when it is about one column.
    pub fn column(&self) -> Option<&str> {
        match self {
            Self::EmptyBatch => None,
            Self::UnknownColumn { column }
            | Self::DuplicateColumn { column }
            | Self::TypeMismatch { column, .. }
            | Self::MissingColumn { column }
            | Self::NullValue { column, .. }
            | Self::NullKey { column, .. }
            | Self::EmptyKey { column, .. }
            | Self::ColumnNotInDataset { column, .. }
            | Self::ReservedValue { column, .. }
            | Self::DuplicateInBatch { column, .. }
            | Self::AlreadyExists { column, .. }
            | Self::MissingSecondaryKey { column, .. }
            | Self::Ambiguous { column, .. }
            | Self::NotCurrent { column, .. }
            | Self::KeyTooLong { column, .. }
            | Self::EngineManaged { column, .. }
            | Self::BadVector { column, .. }
            | Self::LinkedRowsTooMany { column, .. } => Some(column),
        }
    }

    /// The row the problem is in, when it is about one row.
    pub fn row(&self) -> Option<usize> {
        match self {
            Self::NullValue { row, .. }
            | Self::NullKey { row, .. }
            | Self::EmptyKey { row, .. }
            | Self::ColumnNotInDataset { row, .. }
            | Self::ReservedValue { row, .. }
            | Self::DuplicateInBatch { row, .. }
            | Self::AlreadyExists { row, .. }
            | Self::MissingSecondaryKey { row, .. }
            | Self::Ambiguous { row, .. }
            | Self::NotCurrent { row, .. }
            | Self::KeyTooLong { row, .. }
            | Self::EngineManaged { row, .. }
            | Self::BadVector { row, .. }
            | Self::LinkedRowsTooMany { row, .. } => Some(*row),
            _ => None,
        }
    }
}

impl fmt::Display for BatchProblem {
    // One match over every variant: the clearest form (kept over 100 lines).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::EmptyBatch => write!(f, "the batch has no rows"),
            Self::UnknownColumn { column } => {
                write!(f, "column '{column}' is not in the store's schema")
            }
            Self::DuplicateColumn { column } => {
                write!(f, "column '{column}' appears more than once")
            }
            Self::TypeMismatch {
                column,
                expected,
                found,
            } => write!(f, "column '{column}' has type {found}, expected {expected}"),
            Self::MissingColumn { column } => {
                write!(f, "column '{column}' is required (non-nullable) but absent")
            }
            Self::NullValue { column, row } => {
                write!(f, "row {row}: column '{column}' is non-nullable but null")
            }
            Self::NullKey { column, row } => write!(f, "row {row}: key column '{column}' is null"),
            Self::EmptyKey { column, row } => {
                write!(f, "row {row}: key column '{column}' is an empty string")
            }
            Self::ColumnNotInDataset { column, row } => write!(
                f,
                "row {row}: column '{column}' has a value but this dataset was created \
                 without that column"
            ),
            Self::ReservedValue { column, row } => write!(
                f,
                "row {row}: column '{column}' holds the reserved tombstone value"
            ),
            Self::DuplicateInBatch {
                column,
                row,
                first_row,
                value,
            } => write!(
                f,
                "row {row}: {column} '{value}' repeats row {first_row} of the batch"
            ),
            Self::AlreadyExists { column, row, value } => {
                write!(f, "row {row}: {column} '{value}' already exists")
            }
            Self::MissingSecondaryKey { column, row } => {
                write!(f, "row {row}: an upsert needs a non-empty {column}")
            }
            Self::Ambiguous {
                column,
                row,
                value,
                matches,
            } => write!(
                f,
                "row {row}: {column} '{value}' matches {matches} visible records"
            ),
            Self::NotCurrent {
                column,
                row,
                value,
                superseded_by,
            } => match superseded_by {
                Some(by) => write!(
                    f,
                    "row {row}: {column} '{value}' was superseded already (by '{by}')"
                ),
                None => write!(f, "row {row}: {column} '{value}' names no current record"),
            },
            Self::KeyTooLong {
                column,
                row,
                bytes,
                max,
            } => write!(
                f,
                "row {row}: {column} is {bytes} bytes long, more than the {max} a key may have"
            ),
            Self::EngineManaged {
                column,
                row,
                reserved: None,
            } => write!(
                f,
                "row {row}: column '{column}' is set by the engine only; leave it null"
            ),
            Self::EngineManaged {
                column,
                row,
                reserved: Some(value),
            } => write!(
                f,
                "row {row}: {column} '{value}' is reserved for the engine; delete a record \
                 instead (its key then reads as absent)"
            ),
            Self::BadVector {
                column,
                row,
                problem,
            } => write!(f, "row {row}: vector column '{column}': {problem}"),
            Self::LinkedRowsTooMany {
                column,
                row,
                rows,
                max,
            } => write!(
                f,
                "row {row}: {rows} rows linked through {column} (or sharing a key) must be \
                 written together, more than one atomic write holds ({max} rows); split the \
                 chain over several batches"
            ),
        }
    }
}

/// The engine's error.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A batch given to `add` does not fit the store's schema. Nothing was written.
    #[error("invalid batch: {problem}")]
    InvalidBatch { problem: BatchProblem },

    /// An argument (filter, order-by, projection, configuration) is wrong.
    #[error("invalid argument: {message}")]
    InvalidArgument { message: String },

    /// The dataset, or something inside it, does not exist.
    #[error("not found: {what}")]
    NotFound { what: String },

    /// A dataset exists where one was to be created.
    #[error("already exists: {uri}")]
    AlreadyExists { uri: String },

    /// This instance's writer lost its shard. Rows it acknowledged are durable and
    /// were replayed by the writer that took over; the failed call wrote nothing
    /// that was acknowledged. The writer is latched until the store is reopened.
    #[error("writer for shard {shard} fenced: {reason}")]
    Fenced {
        shard: uuid::Uuid,
        reason: FenceReason,
    },

    /// Opening a writer on this shard could split a key across shards.
    #[error(
        "shard conflict: shard {other} holds {generations} unmerged generation(s) written by \
         another instance; writing through shard {ours} could return a key twice. Open the \
         store with that instance's id, or merge its shard into the base table first"
    )]
    ShardConflict {
        ours: uuid::Uuid,
        other: uuid::Uuid,
        generations: usize,
    },

    /// A row (or key to delete) falls in a bucket of a bucketed store that
    /// this instance does not own: nothing of the call was written. Send it
    /// to the instance owning the bucket.
    #[error(
        "row {row}: key {key:?} is in bucket {bucket} of {buckets}, which this instance does \
         not own (it owns {}); nothing was written: send the write to the bucket's owner",
        crate::store::buckets::describe_owned(owned)
    )]
    NotOwner {
        row: usize,
        key: String,
        bucket: u32,
        buckets: u32,
        owned: Vec<u32>,
    },

    /// The writer refused work to stay inside its memory budget; retry later.
    #[error("busy: {message}")]
    Busy { message: String },

    /// Another compaction of this store is running; this one did nothing.
    #[error("a compaction of this store is already running")]
    CompactionInProgress,

    /// A concurrent commit won; retry.
    #[error("commit conflict: {message}")]
    Conflict { message: String },

    /// The writer is closed or latched after a fatal error.
    #[error("writer unavailable: {message}")]
    WriterUnavailable { message: String },

    /// A Lance or object-store operation failed.
    #[error("storage error while {context}: {source}")]
    Storage {
        context: String,
        #[source]
        source: Box<lance::Error>,
    },

    /// An invariant inside the engine was broken.
    #[error("internal error: {message}")]
    Internal { message: String },
}

impl Error {
    /// The stable kind callers act on.
    pub fn kind(&self) -> ErrorKind {
        match self {
            Self::InvalidBatch {
                problem: BatchProblem::AlreadyExists { .. },
            } => ErrorKind::AlreadyExists,
            Self::InvalidBatch {
                problem:
                    BatchProblem::NotCurrent {
                        superseded_by: Some(_),
                        ..
                    },
            } => ErrorKind::Conflict,
            Self::InvalidBatch { .. } | Self::InvalidArgument { .. } => ErrorKind::InvalidInput,
            Self::NotFound { .. } => ErrorKind::NotFound,
            Self::AlreadyExists { .. } => ErrorKind::AlreadyExists,
            Self::Fenced { .. }
            | Self::ShardConflict { .. }
            | Self::NotOwner { .. }
            | Self::Conflict { .. }
            | Self::CompactionInProgress => ErrorKind::Conflict,
            Self::Busy { .. } => ErrorKind::Busy,
            Self::WriterUnavailable { .. } => ErrorKind::Unavailable,
            Self::Storage { .. } => ErrorKind::Storage,
            Self::Internal { .. } => ErrorKind::Internal,
        }
    }

    /// Whether this is a fencing error.
    pub fn is_fenced(&self) -> bool {
        matches!(self, Self::Fenced { .. })
    }

    /// The batch problem, when this is an [`Error::InvalidBatch`].
    pub fn batch_problem(&self) -> Option<&BatchProblem> {
        match self {
            Self::InvalidBatch { problem } => Some(problem),
            _ => None,
        }
    }

    pub(crate) fn batch(problem: BatchProblem) -> Self {
        Self::InvalidBatch { problem }
    }

    /// An `InvalidArgument` error (a caller's request is wrong).
    pub fn invalid_argument(message: impl Into<String>) -> Self {
        Self::InvalidArgument {
            message: message.into(),
        }
    }

    pub(crate) fn internal(message: impl Into<String>) -> Self {
        Self::Internal {
            message: message.into(),
        }
    }

    /// Classify a Lance error by its type (never its message). `context` says what
    /// the engine was doing; `shard` is the writer's shard for fencing errors.
    pub(crate) fn from_lance(
        context: impl Into<String>,
        shard: Option<uuid::Uuid>,
        err: lance::Error,
    ) -> Self {
        if let Some(reason) = err.fence_reason() {
            return Self::Fenced {
                shard: shard.unwrap_or_default(),
                reason: match reason {
                    lance_core::FenceReason::PeerClaimedEpoch => FenceReason::PeerClaimedEpoch,
                    lance_core::FenceReason::PersistenceFailure => FenceReason::PersistenceFailure,
                },
            };
        }
        if err.is_backpressure() {
            return Self::Busy {
                message: err.to_string(),
            };
        }
        let context = context.into();
        match &err {
            lance::Error::DatasetNotFound { path, .. } => Self::NotFound {
                what: format!("dataset {path}"),
            },
            lance::Error::DatasetAlreadyExists { uri, .. } => {
                Self::AlreadyExists { uri: uri.clone() }
            }
            lance::Error::CommitConflict { .. }
            | lance::Error::RetryableCommitConflict { .. }
            | lance::Error::TooMuchWriteContention { .. }
            | lance::Error::IncompatibleTransaction { .. } => Self::Conflict {
                message: format!("{context}: {err}"),
            },
            _ if err.is_not_found() => Self::NotFound {
                what: format!("{context}: {err}"),
            },
            _ => Self::Storage {
                context,
                source: Box::new(err),
            },
        }
    }
}

impl Error {
    /// Classify an error met while running a plan (a scan's stream, a merge's
    /// read). DataFusion carries Lance's errors inside its own; unwrapped
    /// (through Lance's own conversion, by type), a file gone or an I/O
    /// failure keeps its kind, so a caller can tell a read that outlived
    /// cleanup from a bug. Anything else is internal.
    pub(crate) fn from_datafusion(
        context: &str,
        err: lance::deps::datafusion::error::DataFusionError,
    ) -> Self {
        let err = lance::Error::from(err);
        let storage = err.is_not_found()
            || err.fence_reason().is_some()
            || err.is_backpressure()
            || matches!(
                err,
                lance::Error::IO { .. }
                    | lance::Error::Wrapped { .. }
                    | lance::Error::External { .. }
                    | lance::Error::CorruptFile { .. }
            );
        if storage {
            return Self::from_lance(context, None, err);
        }
        Self::internal(format!("{context}: {err}"))
    }
}

/// Turn a Lance result into an engine result with context.
pub(crate) trait LanceResultExt<T> {
    fn ctx(self, context: &str) -> Result<T>;
}

impl<T> LanceResultExt<T> for std::result::Result<T, lance::Error> {
    fn ctx(self, context: &str) -> Result<T> {
        self.map_err(|e| Error::from_lance(context, None, e))
    }
}

impl From<arrow_schema::ArrowError> for Error {
    fn from(err: arrow_schema::ArrowError) -> Self {
        Self::Internal {
            message: format!("arrow: {err}"),
        }
    }
}
