//! The cloud-controller-managers' own configuration, read as they read it.
//!
//! An operator switching from a cloud-controller-manager's route controller
//! already has a config file (AWS, OpenStack and GCE write it in the
//! `gcfg` INI dialect) or an environment block (Hetzner). Each provider crate
//! translates that into the keys of its own YAML schema as a
//! [`NativeConfig`]; [`join`] then lays the operator's YAML (for what the
//! native format cannot say: rate limits, extra tables) over it, refusing a
//! key set in both rather than letting one silently win.
//!
//! This crate owns parsing and joining only: no I/O, no provider knowledge.

mod gcfg;
mod join;

pub use gcfg::{Entry, Ini, IniError, Reader};
pub use join::{JoinError, NativeConfig, join};

/// Whether `text` looks like an INI file rather than YAML or JSON: its
/// first line that is neither blank nor a comment opens a section.
pub fn looks_like_ini(text: &str) -> bool {
    text.lines()
        .map(str::trim)
        .find(|l| !l.is_empty() && !l.starts_with('#') && !l.starts_with(';'))
        .is_some_and(|l| l.starts_with('['))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ini_is_told_from_yaml_and_json() {
        assert!(looks_like_ini("# comment\n\n[Global]\nZone = a\n"));
        assert!(looks_like_ini("; c\n[global]"));
        assert!(!looks_like_ini("region: eu-west-1\n"));
        assert!(!looks_like_ini("{\"region\": \"x\"}"));
        assert!(!looks_like_ini(""));
    }
}
