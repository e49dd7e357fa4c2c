//! The JSON form of a [`SchemaSpec`].

use std::str::FromStr;

use crate::error::{SpecErrors, SpecProblem};
use crate::spec::{Capability, Metric, SchemaSpec};

/// The name a spec parsed from the previous implementation's declaration
/// gets.
pub const PREVIOUS_FORM_NAME: &str = "generic";

impl SchemaSpec {
    /// Parse the JSON form, or the previous implementation's GenericStore
    /// declaration (a mapping of column to type; see
    /// [`SchemaSpec::from_previous`]), which gets the name
    /// [`PREVIOUS_FORM_NAME`]. Syntax errors name the line and column; an
    /// unknown metric or capability names its field (`vectors[0].metric`,
    /// `capabilities[1]`), every one of them.
    pub fn from_json(text: &str) -> Result<Self, SpecErrors> {
        let syntax = |e: serde_json::Error| SpecErrors {
            name: "(unparsed)".into(),
            problems: vec![SpecProblem {
                field: format!("line {}, column {}", e.line(), e.column()),
                message: e.to_string(),
            }],
        };
        let value: serde_json::Value = serde_json::from_str(text).map_err(syntax)?;
        if crate::previous::is_previous_form(&value) {
            return Self::from_previous(PREVIOUS_FORM_NAME, text);
        }
        let mut problems = Vec::new();
        let strings = |key: &str| -> Vec<(usize, Option<&str>)> {
            value
                .get(key)
                .and_then(|v| v.as_array())
                .map(|a| a.iter().map(|v| v.as_str()).enumerate().collect())
                .unwrap_or_default()
        };
        for (i, v) in value
            .get("vectors")
            .and_then(|v| v.as_array())
            .into_iter()
            .flatten()
            .enumerate()
        {
            if let Some(Err(e)) = v
                .get("metric")
                .and_then(|m| m.as_str())
                .map(Metric::from_str)
            {
                problems.push(SpecProblem {
                    field: format!("vectors[{i}].metric"),
                    message: e.to_string(),
                });
            }
        }
        for (i, c) in strings("capabilities") {
            if let Some(Err(e)) = c.map(Capability::from_str) {
                problems.push(SpecProblem {
                    field: format!("capabilities[{i}]"),
                    message: e.to_string(),
                });
            }
        }
        if !problems.is_empty() {
            return Err(SpecErrors {
                name: value
                    .get("name")
                    .and_then(|n| n.as_str())
                    .unwrap_or("(unparsed)")
                    .to_string(),
                problems,
            });
        }
        // Read again from the text, so that errors name the line.
        serde_json::from_str(text).map_err(syntax)
    }

    /// The JSON form (pretty).
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).expect("a spec serializes")
    }
}
