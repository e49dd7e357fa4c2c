//! [`PluginError`], and the one function that makes plugin-supplied text safe
//! to store and print.

use std::time::Duration;

use crate::spec::SpecProblem;

use super::ABI_VERSION;

/// One row-level problem reported by a plugin: the SDK's type, which both
/// sides of the contract share.
pub use lance_context_wire::RowError;

/// What a plugin did that the sandbox does not allow (see the `plugin`
/// module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Violation {
    /// Waited on a clock or a stream that is not ready (sleep, blocking
    /// poll): time does not pass inside the sandbox, so a wait never ends.
    Blocked,
    /// Called `exit`.
    Exit,
    /// Asked for more random bytes in one call than the sandbox hands out.
    RandomTooLarge,
}

impl std::fmt::Display for Violation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Blocked => {
                "it waited (sleep or a blocking poll), which never ends in the sandbox"
            }
            Self::Exit => "it called exit",
            Self::RandomTooLarge => "it asked for more random bytes at once than the sandbox gives",
        })
    }
}

/// Why a component was not compiled (see [`super::compile`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CompileLimit {
    /// Its shape is past a [`super::ShapeLimits`] bound.
    #[error("it has {found} {what}, more than the limit of {limit}")]
    Shape {
        /// What was counted.
        what: &'static str,
        /// How many it has.
        found: u64,
        /// The limit.
        limit: u64,
    },
    /// Compiling ran past the compile deadline and was stopped. Not
    /// remembered for longer than a failed load is: it is tried again.
    #[error("compiling took longer than {0:?} and was stopped")]
    Deadline(Duration),
    /// Compiling needed more memory than the compile memory limit.
    #[error("compiling needed more than the compile memory limit of {0} bytes and was stopped")]
    Memory(usize),
    /// The compiler (Cranelift) panicked on this component.
    #[error("the compiler panicked on it: {0}")]
    CompilerPanic(String),
    /// It is not a valid component (or its compiled code did not load).
    #[error("{0}")]
    Invalid(String),
    /// The compiler could not be run (a host problem, not the component's).
    #[error("the compiler is unavailable: {0}")]
    Unavailable(String),
}

/// A plugin failure, always naming the plugin. Text that came from the plugin
/// (names, messages, row errors, panic messages) is bounded in length and has
/// its control characters escaped, so it is safe to print on a terminal.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum PluginError {
    /// The bytes are not a component this host can compile or link (wrong
    /// world, an import the sandbox does not provide, too large).
    #[error("plugin {plugin}: cannot load: {message}")]
    Load {
        /// The plugin's name.
        plugin: String,
        /// What went wrong.
        message: String,
    },
    /// The component was not compiled: its shape is past the limits, the
    /// compile ran out of time or memory, or the compiler failed on it.
    #[error("plugin {plugin}: cannot compile: {limit}")]
    Compile {
        /// The plugin's name.
        plugin: String,
        /// Why.
        limit: CompileLimit,
    },
    /// The plugin was built against an ABI this host does not speak.
    #[error(
        "plugin {plugin}: ABI version {found} is not supported (this host speaks 1 and {ABI_VERSION})"
    )]
    UnsupportedAbi {
        /// The plugin's name.
        plugin: String,
        /// The ABI version the plugin reports.
        found: u32,
    },
    /// `describe` refused the creation parameters.
    #[error("plugin {plugin}: invalid parameters: {message}")]
    InvalidParams {
        /// The plugin's name.
        plugin: String,
        /// What went wrong.
        message: String,
    },
    /// The declaration breaks the spec rules (every problem found).
    #[error("plugin {plugin}: invalid declaration: {}", problems.iter().map(ToString::to_string).collect::<Vec<_>>().join("; "))]
    InvalidDeclaration {
        /// The plugin's name.
        plugin: String,
        /// Every problem found.
        problems: Vec<SpecProblem>,
    },
    /// `validate` or `transform` rejected rows. `errors` holds the first ones
    /// (up to the host's cap), `total` how many the plugin reported.
    #[error("plugin {plugin}: {total} row error(s), first: {}", errors.first().map(ToString::to_string).unwrap_or_default())]
    Rejected {
        /// The plugin's name.
        plugin: String,
        /// The first row errors (up to the cap).
        errors: Vec<RowError>,
        /// How many row errors the plugin reported.
        total: usize,
    },
    /// The call ran past its deadline.
    #[error("plugin {plugin}: call exceeded its deadline of {deadline:?}")]
    Timeout {
        /// The plugin's name.
        plugin: String,
        /// The deadline per call.
        deadline: Duration,
    },
    /// The instance tried to use more memory (all its memories and tables
    /// together) than the cap.
    #[error("plugin {plugin}: exceeded its memory limit of {limit} bytes")]
    MemoryLimit {
        /// The plugin's name.
        plugin: String,
        /// The limit.
        limit: usize,
    },
    /// The guest panicked.
    #[error("plugin {plugin}: panicked: {message}")]
    Panic {
        /// The plugin's name.
        plugin: String,
        /// What went wrong.
        message: String,
    },
    /// The plugin did something the sandbox forbids.
    #[error("plugin {plugin}: stopped: {violation}")]
    Forbidden {
        /// The plugin's name.
        plugin: String,
        /// What the plugin tried.
        violation: Violation,
    },
    /// Any other trap (stack overflow, unreachable code, too many instances…).
    #[error("plugin {plugin}: trapped: {message}")]
    Trap {
        /// The plugin's name.
        plugin: String,
        /// What went wrong.
        message: String,
    },
    /// An output (a batch, a declaration field, a reduce result, an error
    /// list) is larger than its cap.
    #[error("plugin {plugin}: {what} of {size} exceeds the limit of {limit}")]
    OutputTooLarge {
        /// The plugin's name.
        plugin: String,
        /// What was measured.
        what: &'static str,
        /// Its size.
        size: usize,
        /// The limit.
        limit: usize,
    },
    /// The output is not valid Arrow IPC of the contract, or not JSON.
    #[error("plugin {plugin}: malformed output: {message}")]
    MalformedOutput {
        /// The plugin's name.
        plugin: String,
        /// What went wrong.
        message: String,
    },
    /// The output does not match the declared schema.
    #[error("plugin {plugin}: output does not match the declared schema: {message}")]
    SchemaMismatch {
        /// The plugin's name.
        plugin: String,
        /// What went wrong.
        message: String,
    },
    /// The plugin reported its input as malformed (a host bug or version skew).
    #[error("plugin {plugin}: rejected its input as malformed: {message}")]
    MalformedInput {
        /// The plugin's name.
        plugin: String,
        /// What went wrong.
        message: String,
    },
    /// The load queue stayed full (or no loader picked this load up) for
    /// longer than the load wait allows.
    #[error(
        "plugin {plugin}: no loader came free within {waited:?} ({queued} loads queued); retry later"
    )]
    LoadBusy {
        /// The plugin's name.
        plugin: String,
        /// How long the load waited.
        waited: Duration,
        /// Loads queued or running when it gave up.
        queued: usize,
    },
    /// Every call slot stayed busy for longer than the wait allows.
    #[error("plugin {plugin}: no call slot came free within {waited:?}; the host is busy")]
    Busy {
        /// The plugin's name.
        plugin: String,
        /// How long the call waited.
        waited: Duration,
    },
}

impl PluginError {
    /// The row errors, when rows were rejected.
    pub fn row_errors(&self) -> Option<&[RowError]> {
        match self {
            Self::Rejected { errors, .. } => Some(errors),
            _ => None,
        }
    }

    /// Whether the plugin itself failed (a trap, a deadline, a limit, a bad
    /// output) rather than the caller's data or parameters being refused.
    pub fn is_fault(&self) -> bool {
        !matches!(
            self,
            Self::Rejected { .. }
                | Self::InvalidParams { .. }
                | Self::MalformedInput { .. }
                | Self::Busy { .. }
                | Self::LoadBusy { .. }
        ) && !matches!(
            self,
            Self::Compile {
                limit: CompileLimit::Unavailable(_),
                ..
            }
        )
    }

    /// Whether the call was refused for lack of capacity (retry later).
    pub fn is_busy(&self) -> bool {
        matches!(self, Self::Busy { .. } | Self::LoadBusy { .. })
    }
}

/// Whether a character changes how a terminal shows text: a control
/// character (ANSI escapes, newlines, carriage returns, C1 controls) or a
/// bidirectional override or isolate (which reorder what follows).
fn is_unsafe(c: char) -> bool {
    c.is_control()
        || matches!(c, '\u{061C}' | '\u{200E}' | '\u{200F}' | '\u{202A}'..='\u{202E}' | '\u{2066}'..='\u{2069}')
}

/// Plugin-supplied text made safe to keep and print: at most `max` bytes (cut
/// at a character boundary, marked with `…`), every character that changes
/// how a terminal shows text written as a `\u{..}` escape.
pub(crate) fn plugin_text(text: &str, max: usize) -> String {
    let mut out = String::with_capacity(text.len().min(max) + 8);
    for c in text.chars() {
        if out.len() >= max {
            out.push('…');
            break;
        }
        if is_unsafe(c) {
            out.extend(c.escape_unicode());
        } else {
            out.push(c);
        }
    }
    out
}

/// Longest message an error keeps.
const MAX_ERROR_TEXT: usize = 4 << 10;
/// Declaration problems an error keeps.
const MAX_PROBLEMS: usize = 100;

impl PluginError {
    /// Every text field made safe to print (see [`plugin_text`]): applied to
    /// each error leaving the runtime, whatever produced its text.
    // One match over every variant: the clearest form (kept over 100 lines).
    pub(crate) fn sanitized(self) -> Self {
        let t = |s: String| plugin_text(&s, MAX_ERROR_TEXT);
        let name = |s: String| plugin_text(&s, super::abi::MAX_NAME);
        match self {
            Self::Load { plugin, message } => Self::Load {
                plugin: name(plugin),
                message: t(message),
            },
            Self::Compile { plugin, limit } => Self::Compile {
                plugin: name(plugin),
                limit: match limit {
                    CompileLimit::CompilerPanic(m) => CompileLimit::CompilerPanic(t(m)),
                    CompileLimit::Invalid(m) => CompileLimit::Invalid(t(m)),
                    CompileLimit::Unavailable(m) => CompileLimit::Unavailable(t(m)),
                    other => other,
                },
            },
            Self::UnsupportedAbi { plugin, found } => Self::UnsupportedAbi {
                plugin: name(plugin),
                found,
            },
            Self::InvalidParams { plugin, message } => Self::InvalidParams {
                plugin: name(plugin),
                message: t(message),
            },
            Self::InvalidDeclaration { plugin, problems } => Self::InvalidDeclaration {
                plugin: name(plugin),
                problems: problems
                    .into_iter()
                    .take(MAX_PROBLEMS)
                    .map(|p| SpecProblem {
                        field: plugin_text(&p.field, super::abi::MAX_NAME),
                        message: t(p.message),
                    })
                    .collect(),
            },
            Self::Rejected {
                plugin,
                errors,
                total,
            } => Self::Rejected {
                plugin: name(plugin),
                errors,
                total,
            },
            Self::Timeout { plugin, deadline } => Self::Timeout {
                plugin: name(plugin),
                deadline,
            },
            Self::MemoryLimit { plugin, limit } => Self::MemoryLimit {
                plugin: name(plugin),
                limit,
            },
            Self::Panic { plugin, message } => Self::Panic {
                plugin: name(plugin),
                message: t(message),
            },
            Self::Forbidden { plugin, violation } => Self::Forbidden {
                plugin: name(plugin),
                violation,
            },
            Self::Trap { plugin, message } => Self::Trap {
                plugin: name(plugin),
                message: t(message),
            },
            Self::OutputTooLarge {
                plugin,
                what,
                size,
                limit,
            } => Self::OutputTooLarge {
                plugin: name(plugin),
                what,
                size,
                limit,
            },
            Self::MalformedOutput { plugin, message } => Self::MalformedOutput {
                plugin: name(plugin),
                message: t(message),
            },
            Self::SchemaMismatch { plugin, message } => Self::SchemaMismatch {
                plugin: name(plugin),
                message: t(message),
            },
            Self::MalformedInput { plugin, message } => Self::MalformedInput {
                plugin: name(plugin),
                message: t(message),
            },
            Self::Busy { plugin, waited } => Self::Busy {
                plugin: name(plugin),
                waited,
            },
            Self::LoadBusy {
                plugin,
                waited,
                queued,
            } => Self::LoadBusy {
                plugin: name(plugin),
                waited,
                queued,
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plugin_text_escapes_controls_and_bounds_length() {
        assert_eq!(plugin_text("ok", 10), "ok");
        assert_eq!(plugin_text("\u{1b}[31mred", 64), "\\u{1b}[31mred");
        assert_eq!(plugin_text("a\nb\r", 64), "a\\u{a}b\\u{d}");
        let long = "é".repeat(100);
        let cut = plugin_text(&long, 11);
        assert!(cut.len() <= 11 + '…'.len_utf8() + 1, "{cut}");
        assert!(cut.ends_with('…'));
        // C1 controls and bidirectional overrides too.
        assert_eq!(plugin_text("a\u{9b}b\u{202e}c", 64), "a\\u{9b}b\\u{202e}c");
    }
}
