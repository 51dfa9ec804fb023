//! Reading `--cloud-config`: the files and the environment, told apart and
//! joined the same way for every provider.
//!
//! A provider with a cloud-controller-manager format of its own
//! ([`Sources`]) takes at most one native file (a gcfg INI file, told from
//! our YAML by its first line) and at most one of ours, plus what its CCM's
//! environment says; [`load`] joins them into our YAML schema's document
//! ([`Joined`]). A provider without one takes a single file
//! ([`one_file`]), read by the provider itself or with [`read_file`].

use std::path::{Path, PathBuf};

use serde::de::DeserializeOwned;
use serde_json::Value;
use tracing::{info, warn};

use crate::{JoinError, NativeConfig};

/// An error from a provider's own code (its translation or environment),
/// kept with its chain of causes.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Translates the text of a cloud-controller-manager's file into the
/// provider's keys.
pub type Translate = fn(&str) -> Result<NativeConfig, BoxError>;

/// Translates a cloud-controller-manager's environment, given as a lookup
/// (`std::env::var(..).ok()` outside tests); `None` when it says nothing.
pub type FromEnv = fn(&dyn Fn(&str) -> Option<String>) -> Result<Option<NativeConfig>, BoxError>;

/// Where a provider's cloud-controller-manager keeps its configuration,
/// beside this controller's YAML.
#[derive(Debug, Clone, Copy, Default)]
pub struct Sources {
    /// Its file, in gcfg INI (cloud-provider-aws, -openstack, -gcp), and how
    /// to translate it. Every cloud-controller-manager with a file of its
    /// own writes it in gcfg INI, so a file is told native by
    /// [`looks_like_ini`](crate::looks_like_ini) alone.
    pub ini: Option<Translate>,
    /// Its environment (hcloud-cloud-controller-manager has no file).
    pub env: Option<FromEnv>,
}

/// Why the `--cloud-config` files (and the environment) cannot be used.
/// The messages name the flag and the file, since that is what the operator
/// wrote.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// A file could not be read.
    #[error("reading --cloud-config {}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// A file of ours is not YAML (or TOML, by its name).
    #[error("--cloud-config {} is not a valid configuration", path.display())]
    Parse {
        /// The file.
        path: PathBuf,
        /// The parser's message.
        source: BoxError,
    },
    /// More than one file for a provider that reads one.
    #[error("--cloud-provider {provider} takes one --cloud-config, not {count}")]
    OneFile {
        /// The provider.
        provider: String,
        /// How many were given.
        count: usize,
    },
    /// Two native files.
    #[error(
        "--cloud-config {} and {} are both {provider} cloud-controller-manager files; give one",
        first.display(),
        second.display()
    )]
    TwoNative {
        /// The provider.
        provider: String,
        /// The first file.
        first: PathBuf,
        /// The second.
        second: PathBuf,
    },
    /// Two of our files.
    #[error(
        "--cloud-config {} and {} are both YAML configs; give one (and at most one cloud-controller-manager file)",
        first.display(),
        second.display()
    )]
    TwoOurs {
        /// The first file.
        first: PathBuf,
        /// The second.
        second: PathBuf,
    },
    /// A native file the provider's translation refused.
    #[error("--cloud-config {}", path.display())]
    Translate {
        /// The file.
        path: PathBuf,
        /// The translation's error.
        source: BoxError,
    },
    /// The environment refused by the provider's translation; its message
    /// names the variables.
    #[error(transparent)]
    Env(BoxError),
    /// A native file and the environment both configure the provider.
    #[error("--cloud-config {} and the {format} both configure {provider}; use one", path.display())]
    FileAndEnv {
        /// The provider.
        provider: String,
        /// The native file.
        path: PathBuf,
        /// The environment's format.
        format: String,
    },
    /// Our YAML and the native side set the same key, or ours is no mapping.
    #[error("joining the {provider} configuration with --cloud-config {}", path.display())]
    Join {
        /// The provider.
        provider: String,
        /// Our file.
        path: PathBuf,
        /// Which key.
        source: JoinError,
    },
    /// The native side alone could not be laid out.
    #[error("the {provider} configuration")]
    Native {
        /// The provider.
        provider: String,
        /// Why.
        source: JoinError,
    },
    /// The joined document does not fit the provider's schema.
    #[error("the {provider} configuration is not valid")]
    Schema {
        /// The provider.
        provider: String,
        /// The deserializer's message.
        source: BoxError,
    },
}

/// Parses a provider's config file: TOML when the name ends in `.toml`,
/// YAML (and so JSON) otherwise.
pub fn read_file<T: DeserializeOwned>(path: &Path) -> Result<T, LoadError> {
    parse_file(path, &read(path)?)
}

fn read(path: &Path) -> Result<String, LoadError> {
    std::fs::read_to_string(path).map_err(|source| LoadError::Read {
        path: path.to_path_buf(),
        source,
    })
}

fn parse_file<T: DeserializeOwned>(path: &Path, text: &str) -> Result<T, LoadError> {
    // Only the parser's message is kept, not its error value: that is what
    // the operator needs, and the chain printed stays one line per layer.
    let parsed = if path.extension().is_some_and(|e| e == "toml") {
        toml::from_str(text).map_err(|e| e.to_string())
    } else {
        serde_yaml_ng::from_str(text).map_err(|e| e.to_string())
    };
    parsed.map_err(|message| LoadError::Parse {
        path: path.to_path_buf(),
        source: message.into(),
    })
}

/// The one `--cloud-config` of a provider without a native format of its
/// own to join (the memory cloud; Azure, whose `azure.json` is both).
pub fn one_file<'a>(provider: &str, files: &'a [PathBuf]) -> Result<Option<&'a Path>, LoadError> {
    match files {
        [] => Ok(None),
        [one] => Ok(Some(one.as_path())),
        _ => Err(LoadError::OneFile {
            provider: provider.to_string(),
            count: files.len(),
        }),
    }
}

/// A provider's configuration in our YAML schema: its YAML joined with what
/// its cloud-controller-manager's file or environment says.
#[derive(Debug, Clone, PartialEq)]
pub struct Joined {
    provider: String,
    doc: Option<Value>,
}

impl Joined {
    /// The document, `None` when nothing configured the provider.
    pub fn into_value(self) -> Option<Value> {
        self.doc
    }

    /// The document as the provider's config type.
    pub fn parse<T: DeserializeOwned>(self) -> Result<Option<T>, LoadError> {
        let provider = self.provider;
        self.doc
            .map(|v| {
                serde_json::from_value(v).map_err(|e| LoadError::Schema {
                    provider: provider.clone(),
                    source: e.to_string().into(),
                })
            })
            .transpose()
    }
}

/// Reads the `--cloud-config` `files` of `provider`, whose
/// cloud-controller-manager keeps its configuration in `sources`: at most
/// one native file (translated by `sources.ini`) and at most one of ours,
/// plus what the environment (`env`, a lookup) says natively, never both a
/// native file and the environment. Logs once what the native side set and
/// which of its keys have no effect here.
pub fn load(
    provider: &str,
    files: &[PathBuf],
    sources: &Sources,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Joined, LoadError> {
    let from_env = match sources.env {
        Some(read) => read(env).map_err(LoadError::Env)?,
        None => None,
    };
    let mut native: Option<(PathBuf, NativeConfig)> = None;
    let mut ours: Option<(PathBuf, Value)> = None;
    for path in files {
        let text = read(path)?;
        match sources.ini {
            Some(translate) if crate::looks_like_ini(&text) => {
                if let Some((first, _)) = &native {
                    return Err(LoadError::TwoNative {
                        provider: provider.to_string(),
                        first: first.clone(),
                        second: path.clone(),
                    });
                }
                let n = translate(&text).map_err(|source| LoadError::Translate {
                    path: path.clone(),
                    source,
                })?;
                native = Some((path.clone(), n));
            }
            _ => {
                if let Some((first, _)) = &ours {
                    return Err(LoadError::TwoOurs {
                        first: first.clone(),
                        second: path.clone(),
                    });
                }
                ours = Some((path.clone(), parse_file(path, &text)?));
            }
        }
    }
    let native = match (native, from_env) {
        (Some((path, _)), Some(e)) => {
            return Err(LoadError::FileAndEnv {
                provider: provider.to_string(),
                path,
                format: e.format,
            });
        }
        (Some((path, n)), None) => Some((path.display().to_string(), n)),
        (None, Some(e)) => Some((e.format.clone(), e)),
        (None, None) => None,
    };
    if let Some((from, n)) = &native {
        info!(source = %from, format = %n.format, keys = ?n.origins.values().collect::<Vec<_>>(), "reading the cloud-controller-manager's configuration");
        for note in &n.ignored {
            warn!(source = %from, "{note}");
        }
    }
    let (ours_path, ours) = ours.unzip();
    let doc = crate::join(native.as_ref().map(|(_, n)| n), ours).map_err(|source| {
        let provider = provider.to_string();
        match ours_path {
            Some(path) => LoadError::Join {
                provider,
                path,
                source,
            },
            None => LoadError::Native { provider, source },
        }
    })?;
    Ok(Joined {
        provider: provider.to_string(),
        doc,
    })
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use serde_json::json;

    use super::*;

    struct Dir(PathBuf);

    impl Dir {
        fn new(name: &str) -> Self {
            let p = std::env::temp_dir().join(format!("ccm-config-{name}-{}", std::process::id()));
            std::fs::create_dir_all(&p).unwrap();
            Self(p)
        }

        fn file(&self, name: &str, text: &str) -> PathBuf {
            let p = self.0.join(name);
            std::fs::write(&p, text).unwrap();
            p
        }
    }

    impl Drop for Dir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    fn ini(text: &str) -> Result<NativeConfig, BoxError> {
        let parsed = crate::Ini::parse(text)?;
        let r = crate::Reader::new(&parsed);
        let mut n = NativeConfig::new("test INI");
        if let Some(region) = r.get_set("global", "Region") {
            n.set("region", region, "[Global] Region");
        }
        Ok(n)
    }

    fn env(lookup: &dyn Fn(&str) -> Option<String>) -> Result<Option<NativeConfig>, BoxError> {
        Ok(lookup("REGION").map(|r| {
            let mut n = NativeConfig::new("test environment");
            n.set("region", r, "REGION");
            n
        }))
    }

    const BOTH: Sources = Sources {
        ini: Some(ini),
        env: Some(env),
    };

    fn no_env(_: &str) -> Option<String> {
        None
    }

    fn message(e: &dyn std::error::Error) -> String {
        let mut s = e.to_string();
        let mut next = e.source();
        while let Some(cause) = next {
            s += &format!(": {cause}");
            next = cause.source();
        }
        s
    }

    #[test]
    fn a_native_file_and_ours_are_joined_in_any_order() {
        let d = Dir::new("join");
        let native = d.file("cloud.conf", "[Global]\nRegion = r1\n");
        let ours = d.file("ours.yaml", "max_routes: 5\n");
        for files in [[&native, &ours], [&ours, &native]] {
            let files: Vec<PathBuf> = files.into_iter().cloned().collect();
            let doc = load("x", &files, &BOTH, &no_env).unwrap().into_value();
            assert_eq!(doc, Some(json!({"region": "r1", "max_routes": 5})));
        }
        let none = load("x", &[], &BOTH, &no_env).unwrap();
        assert_eq!(none.clone().into_value(), None);
        assert_eq!(none.parse::<Value>().unwrap(), None);
    }

    #[test]
    fn without_a_native_file_format_every_file_is_ours() {
        let d = Dir::new("ours");
        let ini_text = d.file("looks.conf", "[Global]\nRegion = r1\n");
        let e = load("x", &[ini_text], &Sources::default(), &no_env).unwrap_err();
        assert!(
            matches!(e, LoadError::Parse { .. }),
            "not YAML, so refused as ours: {e}"
        );
    }

    #[test]
    fn the_environment_is_the_native_side_and_excludes_a_native_file() {
        let d = Dir::new("env");
        let vars = BTreeMap::from([("REGION", "r2")]);
        let lookup = |k: &str| vars.get(k).map(|v| v.to_string());
        let ours = d.file("ours.yaml", "max_routes: 5\n");
        let doc = load("x", std::slice::from_ref(&ours), &BOTH, &lookup).unwrap();
        assert_eq!(
            doc.into_value(),
            Some(json!({"region": "r2", "max_routes": 5}))
        );
        let native = d.file("cloud.conf", "[Global]\nRegion = r1\n");
        let e = load("x", std::slice::from_ref(&native), &BOTH, &lookup).unwrap_err();
        assert_eq!(
            e.to_string(),
            format!(
                "--cloud-config {} and the test environment both configure x; use one",
                native.display()
            )
        );
    }

    #[test]
    fn two_files_of_a_kind_and_keys_set_twice_are_refused_naming_them() {
        let d = Dir::new("twice");
        let a = d.file("a.conf", "[Global]\nRegion = r1\n");
        let b = d.file("b.conf", "[Global]\nRegion = r2\n");
        let y = d.file("y.yaml", "region: r3\n");
        let z = d.file("z.yaml", "{}\n");
        let e = load("x", &[a.clone(), b.clone()], &BOTH, &no_env).unwrap_err();
        assert_eq!(
            e.to_string(),
            format!(
                "--cloud-config {} and {} are both x cloud-controller-manager files; give one",
                a.display(),
                b.display()
            )
        );
        let e = load("x", &[y.clone(), z.clone()], &BOTH, &no_env).unwrap_err();
        assert!(e.to_string().contains("are both YAML configs"), "{e}");
        let e = load("x", &[a, y.clone()], &BOTH, &no_env).unwrap_err();
        assert_eq!(
            message(&e),
            format!(
                "joining the x configuration with --cloud-config {}: `region` is set both by [Global] Region (test INI) and in the YAML file; set it in one of them",
                y.display()
            )
        );
    }

    #[test]
    fn unreadable_and_invalid_files_name_the_flag_and_the_file() {
        let d = Dir::new("bad");
        let missing = d.0.join("missing.yaml");
        let e = load("x", std::slice::from_ref(&missing), &BOTH, &no_env).unwrap_err();
        assert!(
            message(&e).starts_with(&format!("reading --cloud-config {}: ", missing.display())),
            "{e}"
        );
        let bad = d.file("bad.conf", "[Global]\nRe_gion = r1\n");
        let e = load("x", std::slice::from_ref(&bad), &BOTH, &no_env).unwrap_err();
        assert!(
            message(&e).starts_with(&format!("--cloud-config {}: line 2", bad.display())),
            "{}",
            message(&e)
        );
        let toml = d.file("c.toml", "endpoint = \"http://x\"\n");
        let v: Value = read_file(&toml).unwrap();
        assert_eq!(v, json!({"endpoint": "http://x"}));
        let e = read_file::<Value>(&d.file("c2.toml", "endpoint: x\n")).unwrap_err();
        assert!(
            e.to_string()
                .ends_with("c2.toml is not a valid configuration"),
            "{e}"
        );
        let doc = load(
            "x",
            &[d.file("n.yaml", "max_routes: many\n")],
            &BOTH,
            &no_env,
        )
        .unwrap();
        #[derive(Debug, serde::Deserialize)]
        #[expect(dead_code, reason = "only its parse error is looked at")]
        struct Schema {
            max_routes: u32,
        }
        let e = doc.parse::<Schema>().unwrap_err();
        assert!(
            message(&e).starts_with("the x configuration is not valid: "),
            "{}",
            message(&e)
        );
    }

    #[test]
    fn one_file_takes_one() {
        assert_eq!(one_file("m", &[]).unwrap(), None);
        let one = [PathBuf::from("a")];
        assert_eq!(one_file("m", &one).unwrap(), Some(Path::new("a")));
        let e = one_file("m", &[PathBuf::from("a"), PathBuf::from("b")]).unwrap_err();
        assert_eq!(
            e.to_string(),
            "--cloud-provider m takes one --cloud-config, not 2"
        );
    }
}
