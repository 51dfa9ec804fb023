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
//! [`load`] is the one reader of `--cloud-config` for every provider with a
//! native format ([`one_file`] and [`read_file`] for those without): it
//! reads the files, tells a native file from ours, asks the provider's
//! translation and environment for the native side, joins, and gives the
//! errors an operator sees. It lives here rather than in
//! provider-kit because it is the last step of the same job as the parsing
//! and the join (what the operator wrote, as our schema's document) and
//! needs no cloud, HTTP or route code: a provider passes in its
//! translations ([`Sources`]), and this crate knows no provider by name.
//! provider-kit builds on it for the contract between a provider crate and
//! the binary's registry.

mod gcfg;
mod join;
mod load;

pub use gcfg::{Entry, Ini, IniError, Reader};
pub use join::{JoinError, NativeConfig, join};
pub use load::{
    BoxError, FromEnv, Joined, LoadError, Sources, Translate, load, one_file, read_file,
};

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
