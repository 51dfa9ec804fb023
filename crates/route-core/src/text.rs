//! [`Text`]: the string type of route fields.
//!
//! A full pass copies every route the cloud lists (the provider builds them,
//! the controller keeps a table of them), so a route's text fields are shared
//! rather than owned: copying a [`Text`] is a reference-count increment, not
//! an allocation. It reads like a `&str` and compares with `str` and `String`.

use std::borrow::Borrow;
use std::fmt;
use std::ops::Deref;
use std::sync::Arc;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// Immutable, shared text. See the module docs.
#[derive(Clone, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Text(Arc<str>);

impl Text {
    /// The empty text (serde's `skip_serializing_if` wants a path).
    pub fn is_empty(&self) -> bool {
        self.as_str().is_empty()
    }

    /// The text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl Deref for Text {
    type Target = str;

    fn deref(&self) -> &str {
        &self.0
    }
}

impl AsRef<str> for Text {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

impl Borrow<str> for Text {
    fn borrow(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for Text {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // `pad`, not `write_str`: tables format names with a width.
        f.pad(&self.0)
    }
}

impl fmt::Debug for Text {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.0, f)
    }
}

impl From<&str> for Text {
    fn from(s: &str) -> Self {
        Text(Arc::from(s))
    }
}

impl From<&String> for Text {
    fn from(s: &String) -> Self {
        Text(Arc::from(s.as_str()))
    }
}

impl From<String> for Text {
    fn from(s: String) -> Self {
        Text(Arc::from(s))
    }
}

impl From<&Text> for Text {
    fn from(s: &Text) -> Self {
        s.clone()
    }
}

impl From<Text> for String {
    fn from(t: Text) -> Self {
        t.0.to_string()
    }
}

impl PartialEq<str> for Text {
    fn eq(&self, other: &str) -> bool {
        *self.0 == *other
    }
}

impl PartialEq<&str> for Text {
    fn eq(&self, other: &&str) -> bool {
        *self.0 == **other
    }
}

impl PartialEq<String> for Text {
    fn eq(&self, other: &String) -> bool {
        *self.0 == **other
    }
}

impl PartialEq<Text> for str {
    fn eq(&self, other: &Text) -> bool {
        *self == *other.0
    }
}

impl PartialEq<Text> for &str {
    fn eq(&self, other: &Text) -> bool {
        **self == *other.0
    }
}

impl PartialEq<Text> for String {
    fn eq(&self, other: &Text) -> bool {
        **self == *other.0
    }
}

impl Serialize for Text {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.0)
    }
}

impl<'de> Deserialize<'de> for Text {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        String::deserialize(d).map(Text::from)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plan_table_columns_pad_names_and_target_nodes() {
        // Regression: `plan`'s table printed NAME and TARGET NODE unpadded.
        assert_eq!(format!("[{:<6}]", Text::from("ab")), "[ab    ]");
        assert_eq!(format!("[{:>4}]", Text::from("ab")), "[  ab]");
    }

    #[test]
    fn copies_share_and_compare_as_text() {
        let a = Text::from("node-1");
        let b = a.clone();
        assert!(Arc::ptr_eq(&a.0, &b.0), "a copy shares the text");
        assert_eq!(a, "node-1");
        assert_eq!(a, String::from("node-1"));
        assert_eq!("node-1", a);
        assert_eq!(a.as_str(), "node-1");
        assert_eq!(format!("{a} {a:?}"), "node-1 \"node-1\"");
        assert!(Text::default().is_empty());
        let json = serde_json::to_string(&a).unwrap();
        assert_eq!(json, "\"node-1\"");
        assert_eq!(serde_json::from_str::<Text>(&json).unwrap(), a);
    }
}
