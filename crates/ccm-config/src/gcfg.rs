//! The `gcfg` INI dialect (go-gcfg/gcfg), which cloud-provider-aws,
//! cloud-provider-openstack and cloud-provider-gcp read their `--cloud-config`
//! with. Its rules, as those controllers see them:
//!
//! - `[Section]` and `[Section "sub"]` headers; section and key names match
//!   case-insensitively, subsection names exactly; `[s ""]` is refused.
//! - Names are letters, digits and `-`; an underscore is a syntax error.
//! - `key = value`, or a bare `key` (a boolean's `true`); for a single value
//!   the last line wins; a list takes one line per element and a bare key
//!   empties it.
//! - Values are trimmed; `;` and `#` start a comment outside double quotes;
//!   quotes are removed; escapes are `\\`, `\"`, `\n` and `\t`, and a `\`
//!   ending a line continues the value on the next.
//!
//! The controllers drop gcfg's warnings (unknown sections and keys), so a
//! typo is silently ignored there. [`Reader::unused`] names every line no
//! translation read, so the caller can say so once instead.

use std::cell::RefCell;
use std::collections::BTreeSet;

/// A syntax error, with the 1-based line it is on.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("line {line}: {message}")]
pub struct IniError {
    /// Where.
    pub line: usize,
    /// What is wrong.
    pub message: String,
}

/// One `key = value` line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// The section's name, lower-cased.
    pub section: String,
    /// The subsection's name as written (`[ServiceOverride "1"]` gives `1`).
    pub subsection: Option<String>,
    /// The key, lower-cased.
    pub key: String,
    /// The key as written, for messages.
    pub written: String,
    /// The value; `None` for a bare key.
    pub value: Option<String>,
    /// The 1-based line of the key.
    pub line: usize,
}

/// A parsed file: its entries in file order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Ini {
    /// Every key line, in order.
    pub entries: Vec<Entry>,
    /// Every section header as (lower-cased name, subsection), in order,
    /// including empty sections.
    pub sections: Vec<(String, Option<String>)>,
}

fn err(line: usize, message: impl Into<String>) -> IniError {
    IniError {
        line,
        message: message.into(),
    }
}

fn is_name(s: &str) -> bool {
    let mut chars = s.chars();
    chars.next().is_some_and(|c| c.is_ascii_alphabetic())
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '-')
}

impl Ini {
    /// Parses `text`.
    pub fn parse(text: &str) -> Result<Self, IniError> {
        let mut ini = Ini::default();
        let mut current: Option<(String, Option<String>)> = None;
        let lines: Vec<&str> = text.lines().collect();
        let mut i = 0;
        while i < lines.len() {
            let no = i + 1;
            let line = lines[i].trim_start_matches('\u{feff}').trim();
            i += 1;
            if line.is_empty() || line.starts_with(';') || line.starts_with('#') {
                continue;
            }
            if let Some(rest) = line.strip_prefix('[') {
                let header = parse_header(rest, no)?;
                ini.sections.push(header.clone());
                current = Some(header);
                continue;
            }
            let Some((section, subsection)) = current.clone() else {
                return Err(err(no, format!("{line:?} is outside any [section]")));
            };
            let name_end = line
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '-' || c == '_'))
                .unwrap_or(line.len());
            let written = &line[..name_end];
            if written.contains('_') {
                return Err(err(
                    no,
                    format!("{written:?}: names hold letters, digits and '-', not '_'"),
                ));
            }
            if !is_name(written) {
                return Err(err(no, format!("{line:?} is not `name = value`")));
            }
            let rest = line[name_end..].trim_start();
            let value = if rest.is_empty() || rest.starts_with(';') || rest.starts_with('#') {
                None
            } else if let Some(v) = rest.strip_prefix('=') {
                // A trailing `\` joins the next line to this value.
                let mut raw = v.to_string();
                while raw.ends_with('\\') && !raw.ends_with("\\\\") && i < lines.len() {
                    raw.pop();
                    raw.push_str(lines[i]);
                    i += 1;
                }
                Some(parse_value(&raw, no)?)
            } else {
                return Err(err(no, format!("expected '=' after {written:?}")));
            };
            ini.entries.push(Entry {
                section,
                subsection,
                key: written.to_ascii_lowercase(),
                written: written.to_string(),
                value,
                line: no,
            });
        }
        Ok(ini)
    }
}

fn parse_header(rest: &str, no: usize) -> Result<(String, Option<String>), IniError> {
    let close = rest
        .rfind(']')
        .ok_or_else(|| err(no, "a section header needs a closing ']'"))?;
    let after = rest[close + 1..].trim();
    if !(after.is_empty() || after.starts_with(';') || after.starts_with('#')) {
        return Err(err(
            no,
            format!("unexpected {after:?} after the section header"),
        ));
    }
    let inner = rest[..close].trim();
    let (name, sub) = match inner.find(|c: char| c.is_whitespace() || c == '"') {
        None => (inner, None),
        Some(at) => {
            let quoted = inner[at..].trim_start();
            let body = quoted
                .strip_prefix('"')
                .and_then(|q| q.strip_suffix('"'))
                .ok_or_else(|| err(no, "a subsection name is written in double quotes"))?;
            let sub = unescape(body, no)?;
            if sub.is_empty() {
                return Err(err(no, "an empty subsection name is not allowed"));
            }
            (&inner[..at], Some(sub))
        }
    };
    if !(is_name(name) || name.split('.').all(is_name)) {
        return Err(err(no, format!("{name:?} is not a section name")));
    }
    Ok((name.to_ascii_lowercase(), sub))
}

fn unescape(s: &str, no: usize) -> Result<String, IniError> {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        if c == '\\' {
            match chars.next() {
                Some('\\') => out.push('\\'),
                Some('"') => out.push('"'),
                other => {
                    return Err(err(
                        no,
                        format!(
                            "unknown escape \\{}",
                            other.map(String::from).unwrap_or_default()
                        ),
                    ));
                }
            }
        } else {
            out.push(c);
        }
    }
    Ok(out)
}

fn parse_value(raw: &str, no: usize) -> Result<String, IniError> {
    let mut out = String::new();
    // Blanks outside quotes at the end are dropped; those inside kept.
    let mut keep = 0;
    let mut quoted = false;
    let mut chars = raw.trim_start().chars();
    while let Some(c) = chars.next() {
        match c {
            '"' => {
                quoted = !quoted;
                keep = out.len();
            }
            '\\' => {
                let e = match chars.next() {
                    Some('\\') => '\\',
                    Some('"') => '"',
                    Some('n') => '\n',
                    Some('t') => '\t',
                    other => {
                        return Err(err(
                            no,
                            format!(
                                "unknown escape \\{} (quote a value holding '\\')",
                                other.map(String::from).unwrap_or_default()
                            ),
                        ));
                    }
                };
                out.push(e);
                keep = out.len();
            }
            ';' | '#' if !quoted => break,
            c => {
                out.push(c);
                if quoted || !c.is_whitespace() {
                    keep = out.len();
                }
            }
        }
    }
    if quoted {
        return Err(err(no, "a quoted value is not closed"));
    }
    out.truncate(keep);
    Ok(out)
}

/// Reads keys out of an [`Ini`], remembering which lines were read.
#[derive(Debug)]
pub struct Reader<'a> {
    ini: &'a Ini,
    used: RefCell<BTreeSet<usize>>,
}

impl<'a> Reader<'a> {
    /// Starts reading `ini`.
    pub fn new(ini: &'a Ini) -> Self {
        Self {
            ini,
            used: RefCell::new(BTreeSet::new()),
        }
    }

    fn matching(
        &self,
        section: &str,
        subsection: Option<&str>,
        key: &str,
    ) -> impl Iterator<Item = (usize, &'a Entry)> {
        let (section, key) = (section.to_ascii_lowercase(), key.to_ascii_lowercase());
        let subsection = subsection.map(str::to_string);
        self.ini.entries.iter().enumerate().filter(move |(_, e)| {
            e.section == section && e.subsection == subsection && e.key == key
        })
    }

    /// The last value of `key` in `[section]` (a bare key reads `"true"`),
    /// marking every line of it read.
    pub fn get(&self, section: &str, key: &str) -> Option<String> {
        self.get_in(section, None, key)
    }

    /// [`Reader::get`] in a subsection.
    pub fn get_in(&self, section: &str, subsection: Option<&str>, key: &str) -> Option<String> {
        let mut last = None;
        for (i, e) in self.matching(section, subsection, key) {
            self.used.borrow_mut().insert(i);
            last = Some(e.value.clone().unwrap_or_else(|| "true".to_string()));
        }
        last
    }

    /// [`Reader::get`], with an empty value read as unset.
    pub fn get_set(&self, section: &str, key: &str) -> Option<String> {
        self.get(section, key).filter(|v| !v.is_empty())
    }

    /// Every value of a list key in order; a bare key empties the list.
    pub fn get_all(&self, section: &str, key: &str) -> Vec<String> {
        let mut all = Vec::new();
        for (i, e) in self.matching(section, None, key) {
            self.used.borrow_mut().insert(i);
            match &e.value {
                None => all.clear(),
                Some(v) => all.push(v.clone()),
            }
        }
        all
    }

    /// A boolean as gcfg reads one (`true/yes/on/1`, `false/no/off/0`, any
    /// case; a bare key is true).
    pub fn get_bool(&self, section: &str, key: &str) -> Result<Option<bool>, IniError> {
        let line = self
            .matching(section, None, key)
            .last()
            .map(|(_, e)| e.line);
        let Some(v) = self.get(section, key) else {
            return Ok(None);
        };
        match v.to_ascii_lowercase().as_str() {
            "true" | "yes" | "on" | "1" => Ok(Some(true)),
            "false" | "no" | "off" | "0" => Ok(Some(false)),
            _ => Err(err(
                line.unwrap_or(0),
                format!("{key}: {v:?} is not a boolean (true/false, yes/no, on/off, 1/0)"),
            )),
        }
    }

    /// The subsection names of `section`, in first-seen order.
    pub fn subsections(&self, section: &str) -> Vec<String> {
        let section = section.to_ascii_lowercase();
        let mut out: Vec<String> = Vec::new();
        for (name, sub) in &self.ini.sections {
            if *name == section
                && let Some(s) = sub
                && !out.contains(s)
            {
                out.push(s.clone());
            }
        }
        out
    }

    /// Marks every key of `[section]` read (a section the controller knows
    /// but has no use for, such as load-balancer settings).
    pub fn skip_section(&self, section: &str) {
        let section = section.to_ascii_lowercase();
        for (i, e) in self.ini.entries.iter().enumerate() {
            if e.section == section {
                self.used.borrow_mut().insert(i);
            }
        }
    }

    /// Marks `key` of `[section]` read without using it.
    pub fn skip(&self, section: &str, key: &str) {
        let _ = self.get(section, key);
    }

    /// Every line nobody read, as `[Section] Key (line N)`.
    pub fn unused(&self) -> Vec<String> {
        let used = self.used.borrow();
        self.ini
            .entries
            .iter()
            .enumerate()
            .filter(|(i, _)| !used.contains(i))
            .map(|(_, e)| match &e.subsection {
                Some(s) => format!("[{} {s:?}] {} (line {})", e.section, e.written, e.line),
                None => format!("[{}] {} (line {})", e.section, e.written, e.line),
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn one(text: &str) -> Option<String> {
        let ini = Ini::parse(text).unwrap();
        Reader::new(&ini).get("global", "key")
    }

    #[test]
    fn values_are_trimmed_unquoted_and_lose_comments() {
        assert_eq!(one("[Global]\nkey = a b  \n").as_deref(), Some("a b"));
        assert_eq!(one("[Global]\nkey = a ; c\n").as_deref(), Some("a"));
        assert_eq!(one("[Global]\nkey = a # c\n").as_deref(), Some("a"));
        assert_eq!(
            one("[Global]\nkey = \"a;b#c \"\n").as_deref(),
            Some("a;b#c ")
        );
        assert_eq!(
            one("[Global]\nkey = \"x\\\\y\\\"z\"\n").as_deref(),
            Some("x\\y\"z")
        );
        assert_eq!(one("[Global]\nkey = a\\tb\n").as_deref(), Some("a\tb"));
        assert_eq!(one("[Global]\nkey =\n").as_deref(), Some(""));
        assert_eq!(one("[Global]\nkey\n").as_deref(), Some("true"));
        assert_eq!(
            one("[Global]\nkey = first \\\n second\n").as_deref(),
            Some("first  second")
        );
    }

    #[test]
    fn names_match_in_any_case_and_the_last_value_wins() {
        assert_eq!(
            one("[GLOBAL]\nKEY = 1\n[global]\nKey = 2\n").as_deref(),
            Some("2")
        );
        assert_eq!(one("[Other]\nkey = 1\n"), None);
    }

    #[test]
    fn lists_take_a_line_per_value_and_a_bare_key_empties_them() {
        let ini = Ini::parse("[g]\nk = a\nk = b\n[g]\nk = c\n").unwrap();
        assert_eq!(Reader::new(&ini).get_all("g", "k"), ["a", "b", "c"]);
        let ini = Ini::parse("[g]\nk = a\nk\nk = c\n").unwrap();
        assert_eq!(Reader::new(&ini).get_all("g", "k"), ["c"]);
    }

    #[test]
    fn subsections_keep_their_case() {
        let ini = Ini::parse(
            "[ServiceOverride \"A\"]\nService = ec2\n[serviceoverride \"a\"]\nService = s3\n",
        )
        .unwrap();
        let r = Reader::new(&ini);
        assert_eq!(r.subsections("ServiceOverride"), ["A", "a"]);
        assert_eq!(
            r.get_in("serviceoverride", Some("A"), "service").as_deref(),
            Some("ec2")
        );
        assert_eq!(
            r.get_in("serviceoverride", Some("a"), "service").as_deref(),
            Some("s3")
        );
    }

    #[test]
    fn booleans_read_as_gcfg_reads_them() {
        let ini = Ini::parse("[g]\na = Yes\nb = off\nc\nd = maybe\n").unwrap();
        let r = Reader::new(&ini);
        assert_eq!(r.get_bool("g", "a").unwrap(), Some(true));
        assert_eq!(r.get_bool("g", "b").unwrap(), Some(false));
        assert_eq!(r.get_bool("g", "c").unwrap(), Some(true));
        assert_eq!(r.get_bool("g", "missing").unwrap(), None);
        let e = r.get_bool("g", "d").unwrap_err();
        assert_eq!(e.line, 5);
        assert!(e.message.contains("not a boolean"), "{e}");
    }

    #[test]
    fn syntax_errors_name_their_line() {
        for (text, line, says) in [
            ("key = 1\n", 1, "outside any [section]"),
            ("[g]\nroute_table = x\n", 2, "not '_'"),
            ("[g\n", 1, "closing"),
            ("[g \"\"]\n", 1, "empty subsection"),
            ("[g]\n\nk = \"open\n", 3, "not closed"),
            ("[g]\nk : v\n", 2, "expected '='"),
            ("[g]\nk = a\\qb\n", 2, "unknown escape"),
            ("[g] x\n", 1, "after the section header"),
        ] {
            let e = Ini::parse(text).unwrap_err();
            assert_eq!(e.line, line, "{text:?}: {e}");
            assert!(e.message.contains(says), "{text:?}: {e}");
        }
    }

    #[test]
    fn unused_names_every_line_nobody_read() {
        let ini =
            Ini::parse("[Global]\nZone = a\nTypo = b\n[LoadBalancer]\nx = 1\n[S \"1\"]\ny = 2\n")
                .unwrap();
        let r = Reader::new(&ini);
        r.get("global", "zone");
        r.skip_section("loadbalancer");
        assert_eq!(
            r.unused(),
            ["[global] Typo (line 3)", "[s \"1\"] y (line 7)"]
        );
    }
}
