//! Reading the simulated cloud's [`MemoryConfig`] from a file: TOML when the
//! name ends in `.toml`, YAML (and so JSON) otherwise. The same format the
//! controller's `--cloud-config` takes for `--cloud-provider memory`.

use std::path::{Path, PathBuf};

use provider_memory::{MemoryConfig, MemoryConfigError};

/// Why a configuration file is unusable.
#[derive(Debug, thiserror::Error)]
pub enum ConfigFileError {
    /// The file cannot be read.
    #[error("cannot read {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The file is not valid YAML/TOML for a [`MemoryConfig`].
    #[error("{path}: {message}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// The parser's explanation.
        message: String,
    },
    /// The values are out of range.
    #[error("{path}: {source}")]
    Invalid {
        /// The file.
        path: PathBuf,
        /// Which value.
        source: MemoryConfigError,
    },
}

/// Parses `text` as TOML (`toml` true) or YAML, without validating.
fn decode(text: &str, toml: bool) -> Result<MemoryConfig, String> {
    if toml {
        toml::from_str(text).map_err(|e| e.to_string())
    } else if text.trim().is_empty() {
        // An empty YAML document is "no settings", not an error.
        Ok(MemoryConfig::default())
    } else {
        serde_yaml_ng::from_str(text).map_err(|e| e.to_string())
    }
}

/// Parses `text` as TOML (`toml` true) or YAML and validates it.
pub fn parse(text: &str, toml: bool) -> Result<MemoryConfig, String> {
    let cfg = decode(text, toml)?;
    cfg.validate().map_err(|e| e.to_string())?;
    Ok(cfg)
}

/// Reads and validates the file at `path`.
pub fn load(path: &Path) -> Result<MemoryConfig, ConfigFileError> {
    let text = std::fs::read_to_string(path).map_err(|source| ConfigFileError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    let is_toml = path.extension().is_some_and(|e| e == "toml");
    let cfg = decode(&text, is_toml).map_err(|message| ConfigFileError::Parse {
        path: path.to_path_buf(),
        message,
    })?;
    cfg.validate().map_err(|source| ConfigFileError::Invalid {
        path: path.to_path_buf(),
        source,
    })?;
    Ok(cfg)
}

#[cfg(test)]
mod tests {
    use super::*;
    use route_cloud::ErrorKind;

    fn write(name: &str, text: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("cloud-sim-config-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join(name);
        std::fs::write(&p, text).unwrap();
        p
    }

    #[test]
    fn yaml_toml_and_empty_files_load() {
        let y = load(&write(
            "a.yaml",
            "latency:\n  create_ms: 20\nmax_routes: 5\nsupports_batch: true\nerror_rates:\n  list: {probability: 0.25, kind: transient}\n",
        ))
        .unwrap();
        assert_eq!(y.latency.create_ms, 20);
        assert_eq!(y.max_routes, Some(5));
        assert!(y.supports_batch);
        assert_eq!(y.error_rates.list.unwrap().kind, ErrorKind::Transient);

        let t = load(&write(
            "b.toml",
            "max_routes = 5\nsupports_batch = true\n[latency]\ncreate_ms = 20\n[error_rates.list]\nprobability = 0.25\nkind = \"transient\"\n",
        ))
        .unwrap();
        assert_eq!(t, y, "the same settings in either format");

        assert_eq!(
            load(&write("c.yaml", "\n")).unwrap(),
            MemoryConfig::default()
        );
        assert_eq!(load(&write("d.json", r#"{"seed": 9}"#)).unwrap().seed, 9);
    }

    #[test]
    fn bad_files_say_which_and_why() {
        let e = load(&write("e.yaml", "max_route: 3\n")).unwrap_err();
        assert!(matches!(e, ConfigFileError::Parse { .. }));
        assert!(e.to_string().contains("e.yaml"), "{e}");
        let e = load(&write("f.toml", "max_concurrent_operations = 0\n")).unwrap_err();
        assert!(matches!(e, ConfigFileError::Invalid { .. }), "{e}");
        let e = load(Path::new("/nonexistent/cloud-sim.yaml")).unwrap_err();
        assert!(matches!(e, ConfigFileError::Read { .. }));
        assert!(parse("latency: [", false).is_err());
        assert_eq!(parse("seed = 3", true).unwrap().seed, 3);
    }
}
