//! # lance-context-spec
//!
//! `SchemaSpec`: the one declaration every schema produces — a plugin's
//! `describe`, or a declarative spec file run by the built-in `spec` plugin —
//! and its rules.
//!
//! The rules are checked when a plugin loads and when a store is created, and
//! every problem is reported (one [`SpecProblem`] each, naming the field), not
//! just the first. A spec is immutable once a store is created from it
//! (reopening with a different spec is an error: the host's registry).
//!
//! # The JSON form
//! The registry records a spec, and users write one for a store without a
//! plugin of their own (`lance-context store create NAME --spec FILE`):
//!
//! ```json
//! {
//!   "name": "notes",
//!   "key": "id",
//!   "columns": [
//!     {"name": "id", "type": "Utf8", "nullable": false},
//!     {"name": "text", "type": "Utf8", "nullable": false, "rules": {"non_empty": true}},
//!     {"name": "priority", "type": "Int32", "rules": {"min": 1, "max": 5}},
//!     {"name": "kind", "type": "Utf8", "rules": {"one_of": ["note", "task"]}},
//!     {"name": "embedding", "type": "FixedSizeList(4 x Float32)"}
//!   ],
//!   "vectors": [{"column": "embedding", "dimension": 4, "metric": "cosine"}],
//!   "blob_columns": [],
//!   "secondary_key": null,
//!   "capabilities": []
//! }
//! ```
//!
//! The previous implementation's GenericStore declaration (a mapping of
//! column to `"string"`, `"float32"`, `{"type": "vector", "dim": 4}`, …) is
//! read as it is: see [`SchemaSpec::from_previous`].
//!
//! `type` is Arrow's own type syntax (what `DataType`'s `Display` prints and
//! its parser reads): see [`SUPPORTED_TYPES`]. `nullable` defaults to true;
//! the key column is tagged as the primary key by the host.

mod check;
mod error;
mod json;
mod previous;
mod query;
mod spec;
#[cfg(test)]
mod tests;

pub use check::{KeyRule, fixed_width_bytes};
pub use error::{SpecErrors, SpecProblem, UnknownValue};
pub use json::PREVIOUS_FORM_NAME;
pub use previous::{BLOB_FIELD_METADATA, PREVIOUS_SPEC_METADATA, is_previous_form};
pub use query::{BindError, QuerySpec};
pub use spec::*;
