//! A credential that never prints.

use std::fmt;

use serde::{Deserialize, Serialize};

/// A credential (an API token, a password, a client secret, a token a
/// server issued): deserialises and serialises like a string, and its
/// `Debug` prints a placeholder. It has no `Display`, so it cannot end up in
/// an error text or a log line through `{}`; [`Secret::expose`] is the one
/// way to the value, for the place that sends it.
#[derive(Clone, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(transparent)]
pub struct Secret(String);

impl Secret {
    /// Wraps a secret value.
    pub fn new(value: impl Into<String>) -> Self {
        Self(value.into())
    }

    /// The value, for building the request that sends it. Never log it.
    pub fn expose(&self) -> &str {
        &self.0
    }

    /// Nothing set.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Nothing set, or only white space (a value a file left as `" "`).
    pub fn is_blank(&self) -> bool {
        self.0.trim().is_empty()
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // An empty value says so: "not set" is what a reader of a config
        // dump needs to see, and it gives nothing away.
        f.write_str(if self.0.is_empty() {
            "\"\""
        } else {
            "<redacted>"
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_value_never_prints_and_reads_as_a_string() {
        let s: Secret = serde_json::from_str("\"hunter2\"").unwrap();
        assert_eq!(s.expose(), "hunter2");
        assert_eq!(format!("{s:?}"), "<redacted>");
        assert_eq!(format!("{:?}", Secret::default()), "\"\"");
        assert_eq!(serde_json::to_string(&s).unwrap(), "\"hunter2\"");
        assert!(Secret::new(" \n").is_blank());
        assert!(!Secret::new(" \n").is_empty());
        assert!(Secret::default().is_empty());
    }
}
