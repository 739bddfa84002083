//! What is wrong with a configuration, and `bail!`, which says so naming the field.

/// What is wrong with a configuration. Messages name the field (`services[0].mode: ...`) and
/// say what would be accepted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// The file could not be read.
    #[error("{path}: {message}")]
    Read { path: String, message: String },
    /// An error in the file named.
    #[error("{path}: {source}")]
    InFile { path: String, source: Box<Error> },
    /// Not TOML, or a key the format does not have (the message gives line and column).
    #[error("{0}")]
    Syntax(String),
    /// A field holds a value that does not apply.
    #[error("{field}: {problem}")]
    Invalid { field: String, problem: String },
    /// The service model refused the whole (families, routes, tables).
    #[error("{0}")]
    Model(#[from] vectorlb_lb::ConfigError),
}

impl Error {
    /// An [`Error::Invalid`] from a "field: problem" message.
    pub(crate) fn invalid(msg: String) -> Error {
        match msg.split_once(": ") {
            Some((field, problem)) => Error::Invalid { field: field.to_string(), problem: problem.to_string() },
            None => Error::Invalid { field: String::new(), problem: msg },
        }
    }
}

/// Returns an [`Error::Invalid`] from a "field: problem" message.
macro_rules! bail {
    ($($t:tt)*) => { return Err($crate::Error::invalid(format!($($t)*))) };
}
pub(crate) use bail;

/// A TOML error about a number, in the field's terms (`an integer in 0..=65535`, not `u16`).
pub(crate) fn number_terms(msg: &str) -> String {
    msg.replace("expected u8", "expected an integer in 0..=255")
        .replace("expected u16", "expected an integer in 0..=65535")
        .replace("expected u32", "expected an integer in 0..=4294967295")
        .replace("expected usize", "expected a non-negative integer")
}
