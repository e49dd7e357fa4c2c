//! What is wrong with a spec, naming the field.

/// One problem with a spec, naming the field.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpecProblem {
    /// Where: `key`, `columns[2].type`, `vectors[0].metric`, …
    pub field: String,
    pub message: String,
}

impl std::fmt::Display for SpecProblem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.field, self.message)
    }
}

/// Every problem found, in spec order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpecErrors {
    pub name: String,
    pub problems: Vec<SpecProblem>,
}

impl std::fmt::Display for SpecErrors {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} problem(s) in schema '{}': ",
            self.problems.len(),
            self.name
        )?;
        for (i, p) in self.problems.iter().enumerate() {
            if i > 0 {
                f.write_str("; ")?;
            }
            write!(f, "{p}")?;
        }
        Ok(())
    }
}

impl std::error::Error for SpecErrors {}

/// A value that is not one of a closed set of names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnknownValue {
    /// What kind of value (`metric`, `capability`).
    pub what: &'static str,
    /// The value given.
    pub value: String,
    /// The values known, comma-separated.
    pub known: String,
}

impl std::fmt::Display for UnknownValue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "unknown {} '{}' (known: {})",
            self.what, self.value, self.known
        )
    }
}

impl std::error::Error for UnknownValue {}
