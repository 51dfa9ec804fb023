//! A native config translated into a provider's own keys, and its join with
//! the operator's YAML.

use std::collections::BTreeMap;

use serde_json::{Map, Value};

/// A cloud-controller-manager's config translated into the keys of a
/// provider's own YAML schema.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct NativeConfig {
    /// What it was read from, for messages (e.g. `cloud-provider-aws INI`).
    pub format: String,
    /// The translated keys, as the provider's YAML would hold them.
    pub values: Map<String, Value>,
    /// Which native key each translated key came from, by dotted path.
    pub origins: BTreeMap<String, String>,
    /// Native keys read but without effect here, each with why; logged
    /// once at start.
    pub ignored: Vec<String>,
}

impl NativeConfig {
    /// An empty translation from `format`.
    pub fn new(format: impl Into<String>) -> Self {
        Self {
            format: format.into(),
            ..Self::default()
        }
    }

    /// Sets the key at the dotted `path` (`rate_limit.read`) to `value`,
    /// remembering that it came from the native key `origin`.
    pub fn set(&mut self, path: &str, value: impl Into<Value>, origin: impl Into<String>) {
        let mut map = &mut self.values;
        let mut parts = path.split('.').peekable();
        while let Some(part) = parts.next() {
            if parts.peek().is_none() {
                map.insert(part.to_string(), value.into());
                break;
            }
            let next = map
                .entry(part.to_string())
                .or_insert_with(|| Value::Object(Map::new()));
            if !next.is_object() {
                *next = Value::Object(Map::new());
            }
            let Value::Object(m) = next else { break };
            map = m;
        }
        self.origins.insert(path.to_string(), origin.into());
    }

    /// Notes a native key that has no effect here, and why.
    pub fn ignore(&mut self, key: impl Into<String>, why: &str) {
        self.ignored.push(format!("{}: {why}", key.into()));
    }

    /// Whether nothing was translated.
    pub fn is_empty(&self) -> bool {
        self.values.is_empty()
    }
}

/// A key set both in the native config and in the operator's YAML.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum JoinError {
    /// Two files set the same key.
    #[error(
        "`{path}` is set both by {origin} ({format}) and in the YAML file; set it in one of them"
    )]
    SetTwice {
        /// The key, dotted.
        path: String,
        /// The native key it came from.
        origin: String,
        /// The native format.
        format: String,
    },
    /// The YAML is not a mapping.
    #[error("the YAML config must be a mapping of keys, not {0}")]
    NotAMapping(String),
}

/// Lays `ours` (the operator's YAML) over `native`. Nested mappings are
/// joined key by key; a key both set is an error, not an override, since
/// a file that silently loses is a setting the operator believes in and
/// the controller does not use.
pub fn join(
    native: Option<&NativeConfig>,
    ours: Option<Value>,
) -> Result<Option<Value>, JoinError> {
    let ours = match ours {
        None | Some(Value::Null) => None,
        Some(Value::Object(m)) => Some(m),
        Some(other) => return Err(JoinError::NotAMapping(kind(&other).to_string())),
    };
    match (native, ours) {
        (None, None) => Ok(None),
        (None, Some(o)) => Ok(Some(Value::Object(o))),
        (Some(n), None) => Ok(Some(Value::Object(n.values.clone()))),
        (Some(n), Some(o)) => {
            let mut out = n.values.clone();
            merge(&mut out, o, "", n)?;
            Ok(Some(Value::Object(out)))
        }
    }
}

fn merge(
    into: &mut Map<String, Value>,
    from: Map<String, Value>,
    prefix: &str,
    native: &NativeConfig,
) -> Result<(), JoinError> {
    for (k, v) in from {
        let path = if prefix.is_empty() {
            k.clone()
        } else {
            format!("{prefix}.{k}")
        };
        match (into.get_mut(&k), v) {
            (None, v) => {
                into.insert(k, v);
            }
            (Some(Value::Object(a)), Value::Object(b)) => merge(a, b, &path, native)?,
            (Some(_), _) => {
                return Err(JoinError::SetTwice {
                    origin: native
                        .origins
                        .get(&path)
                        .cloned()
                        .unwrap_or_else(|| path.clone()),
                    path,
                    format: native.format.clone(),
                });
            }
        }
    }
    Ok(())
}

fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "a mapping",
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn native() -> NativeConfig {
        let mut n = NativeConfig::new("cloud-provider-aws INI");
        n.set("region", "eu-west-1", "[Global] Region");
        n.set("rate_limit.read.burst", 5, "[Global] X");
        n
    }

    #[test]
    fn dotted_paths_build_nested_mappings() {
        assert_eq!(
            Value::Object(native().values),
            json!({"region": "eu-west-1", "rate_limit": {"read": {"burst": 5}}})
        );
    }

    #[test]
    fn yaml_keys_the_native_file_lacks_are_added_at_any_depth() {
        let joined = join(
            Some(&native()),
            Some(json!({"max_routes": 100, "rate_limit": {"read": {"per_second": 2.0}}})),
        )
        .unwrap()
        .unwrap();
        assert_eq!(
            joined,
            json!({"region": "eu-west-1", "max_routes": 100,
                   "rate_limit": {"read": {"burst": 5, "per_second": 2.0}}})
        );
    }

    #[test]
    fn a_key_set_in_both_files_is_an_error_naming_both() {
        let e = join(Some(&native()), Some(json!({"region": "us-east-1"}))).unwrap_err();
        assert_eq!(
            e.to_string(),
            "`region` is set both by [Global] Region (cloud-provider-aws INI) and in the YAML file; set it in one of them"
        );
        let e = join(
            Some(&native()),
            Some(json!({"rate_limit": {"read": {"burst": 1}}})),
        )
        .unwrap_err();
        assert!(
            matches!(e, JoinError::SetTwice { ref path, .. } if path == "rate_limit.read.burst"),
            "{e}"
        );
    }

    #[test]
    fn either_side_alone_is_itself() {
        assert_eq!(join(None, None).unwrap(), None);
        assert_eq!(
            join(None, Some(json!({"a": 1}))).unwrap(),
            Some(json!({"a": 1}))
        );
        assert_eq!(
            join(Some(&native()), Some(Value::Null)).unwrap(),
            Some(Value::Object(native().values))
        );
        assert!(matches!(
            join(None, Some(json!([1]))),
            Err(JoinError::NotAMapping(_))
        ));
    }
}
