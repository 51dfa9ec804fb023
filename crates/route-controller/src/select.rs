//! Which Nodes get routes: `--node-selector`, a label selector in
//! kubectl's syntax (`key=value`, `key!=value`, `key in (a,b)`,
//! `key notin (a,b)`, `key`, `!key`, joined by commas).
//!
//! The selector is applied when a Node is converted into its view
//! ([`crate::nodes::node_view`]), so the planner sees
//! [`route_core::NodeView::excluded`] and a label change that moves a Node in
//! or out of the selection is a routing change like any other. Every Node is
//! still watched: a left-out Node's addresses tell whose a route is.

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

use kube::core::{Expression, Selector, SelectorExt};

/// A parsed `--node-selector`. The empty selector selects every Node.
#[derive(Clone, Default)]
pub struct NodeSelector {
    text: String,
    selector: Selector,
}

/// A `--node-selector` that does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("--node-selector {text:?}: {why}")]
pub struct SelectorError {
    text: String,
    why: String,
}

impl NodeSelector {
    /// Whether a Node with these labels gets routes.
    pub fn matches(&self, labels: Option<&BTreeMap<String, String>>) -> bool {
        static EMPTY: BTreeMap<String, String> = BTreeMap::new();
        self.selector.matches(labels.unwrap_or(&EMPTY))
    }

    /// Selects every Node.
    pub fn is_everything(&self) -> bool {
        self.selector.selects_all()
    }
}

impl fmt::Display for NodeSelector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

impl fmt::Debug for NodeSelector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "NodeSelector({:?})", self.text)
    }
}

impl FromStr for NodeSelector {
    type Err = SelectorError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let fail = |why: String| SelectorError {
            text: text.to_owned(),
            why,
        };
        let mut exprs = Vec::new();
        for term in split_terms(text).map_err(&fail)? {
            exprs.push(parse_term(term).map_err(&fail)?);
        }
        let mut selector = Selector::default();
        selector.extend(exprs);
        Ok(Self {
            text: text.trim().to_owned(),
            selector,
        })
    }
}

/// Splits at the commas outside parentheses.
fn split_terms(text: &str) -> Result<Vec<&str>, String> {
    let mut terms = Vec::new();
    let (mut depth, mut start) = (0u32, 0usize);
    for (i, ch) in text.char_indices() {
        match ch {
            '(' => depth += 1,
            ')' => {
                depth = depth
                    .checked_sub(1)
                    .ok_or_else(|| "a ')' without its '('".to_owned())?;
            }
            ',' if depth == 0 => {
                terms.push(&text[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    if depth != 0 {
        return Err("a '(' without its ')'".into());
    }
    terms.push(&text[start..]);
    let terms: Vec<&str> = terms.into_iter().map(str::trim).collect();
    if terms == [""] {
        return Ok(Vec::new());
    }
    if terms.iter().any(|t| t.is_empty()) {
        return Err("an empty requirement between commas".into());
    }
    Ok(terms)
}

fn parse_term(term: &str) -> Result<Expression, String> {
    if let Some(key) = term.strip_prefix('!') {
        return Ok(Expression::DoesNotExist(key_of(key)?));
    }
    for (op, negate) in [(" notin ", true), (" in ", false)] {
        if let Some((key, set)) = term.split_once(op) {
            let set = set.trim();
            let inner = set
                .strip_prefix('(')
                .and_then(|s| s.strip_suffix(')'))
                .ok_or_else(|| format!("{term:?}: the values of {op:?} go in parentheses"))?;
            let values = inner
                .split(',')
                .map(|v| value_of(v.trim()))
                .collect::<Result<_, _>>()?;
            let key = key_of(key)?;
            return Ok(if negate {
                Expression::NotIn(key, values)
            } else {
                Expression::In(key, values)
            });
        }
    }
    if let Some((key, value)) = term.split_once("!=") {
        return Ok(Expression::NotEqual(key_of(key)?, value_of(value.trim())?));
    }
    if let Some((key, value)) = term.split_once("==").or_else(|| term.split_once('=')) {
        return Ok(Expression::Equal(key_of(key)?, value_of(value.trim())?));
    }
    Ok(Expression::Exists(key_of(term)?))
}

/// A label key: an optional DNS-subdomain prefix and `/`, then a name of
/// at most 63 alphanumerics, `-`, `_`, `.`, starting and ending alphanumeric.
fn key_of(key: &str) -> Result<String, String> {
    let key = key.trim();
    let name = match key.rsplit_once('/') {
        Some((prefix, name)) => {
            if prefix.is_empty()
                || prefix.len() > 253
                || !prefix
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '.')
            {
                return Err(format!("{key:?} has an invalid prefix"));
            }
            name
        }
        None => key,
    };
    if !valid_name(name) || name.is_empty() {
        return Err(format!("{key:?} is not a label key"));
    }
    Ok(key.to_owned())
}

fn value_of(value: &str) -> Result<String, String> {
    if valid_name(value) {
        Ok(value.to_owned())
    } else {
        Err(format!("{value:?} is not a label value"))
    }
}

/// A label name or value: empty, or at most 63 characters of alphanumerics,
/// `-`, `_`, `.`, beginning and ending with an alphanumeric.
fn valid_name(s: &str) -> bool {
    if s.is_empty() {
        return true;
    }
    let ends = |c: Option<char>| c.is_some_and(|c| c.is_ascii_alphanumeric());
    s.len() <= 63
        && ends(s.chars().next())
        && ends(s.chars().last())
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    fn sel(s: &str) -> NodeSelector {
        s.parse().unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn kubectls_selector_syntax_selects_as_the_api_server_does() {
        let robot = labels(&[("instance.hetzner.cloud/is-root-server", "true")]);
        let cloud = labels(&[("node.kubernetes.io/instance-type", "cx22")]);
        let s = sel("instance.hetzner.cloud/is-root-server!=true");
        assert!(!s.matches(Some(&robot)));
        assert!(s.matches(Some(&cloud)));
        assert!(s.matches(None), "no labels: not a root server");
        let s = sel("!instance.hetzner.cloud/is-root-server");
        assert!(!s.matches(Some(&robot)) && s.matches(Some(&cloud)));
        let s = sel("node.kubernetes.io/instance-type in (cx22, cx32),zone");
        assert!(!s.matches(Some(&cloud)), "every requirement must hold");
        let both = labels(&[("node.kubernetes.io/instance-type", "cx32"), ("zone", "a")]);
        assert!(s.matches(Some(&both)));
        let s = sel("zone notin (b),tier=edge");
        assert!(!s.matches(Some(&both)));
        assert!(sel("").is_everything() && sel(" ").matches(None));
    }

    #[test]
    fn a_selector_that_does_not_parse_says_why() {
        for (bad, why) in [
            ("zone in a,b", "parentheses"),
            ("zone in (a", "without its ')'"),
            ("a=b,,c", "empty requirement"),
            ("bad key=1", "not a label key"),
            ("zone=-x", "not a label value"),
            ("/zone", "invalid prefix"),
        ] {
            let err = bad
                .parse::<NodeSelector>()
                .err()
                .unwrap_or_else(|| panic!("{bad:?} parsed"));
            assert!(err.to_string().contains(why), "{bad:?}: {err}");
        }
    }
}
