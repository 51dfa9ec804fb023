//! What a provider crate gives the binary's registry: one [`Provider`]
//! value, naming the provider, saying how its `--cloud-config` is read, and
//! building it. The binary lists these values and calls [`Provider::build`];
//! it holds no configuration logic of any cloud, so adding a provider adds
//! one line to that list.

use std::future::Future;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;

use ccm_config::{BoxError, Joined, LoadError, Sources};
use route_cloud::{CloudRoutes, Fence};

/// A provider being built.
pub type Building = Pin<Box<dyn Future<Output = Result<Arc<dyn CloudRoutes>, BuildError>> + Send>>;

/// One `--cloud-provider`.
#[derive(Debug, Clone, Copy)]
pub struct Provider {
    /// Its `--cloud-provider` name.
    pub name: &'static str,
    /// How its `--cloud-config` is read, and what builds it from that.
    pub reads: Reads,
}

/// How a provider's `--cloud-config` is read; each way gives its build
/// function what it read, so a provider cannot be handed the other shape.
#[derive(Debug, Clone, Copy)]
pub enum Reads {
    /// At most one file, which the provider reads itself (Azure's
    /// `azure.json` is both the cloud provider's format and ours; the memory
    /// cloud's YAML or TOML).
    OneFile(fn(Option<PathBuf>, Start) -> Building),
    /// At most one of our YAML files joined with what its
    /// cloud-controller-manager's file or environment says
    /// ([`ccm_config::load`]).
    Joined {
        /// Where its cloud-controller-manager keeps its configuration.
        sources: Sources,
        /// Builds the provider from the joined document.
        build: fn(Joined, Start) -> Building,
    },
}

/// What a provider is built with besides its configuration.
#[derive(Clone)]
pub struct Start {
    /// Who this process is (its leader-election identity, or the
    /// subcommand): recorded by clouds that log their callers.
    pub identity: String,
    /// Whether this process may change the cloud now; providers that wait
    /// inside a call (token buckets, throttling pauses) check it again
    /// after each wait.
    pub fence: Fence,
}

/// Why a provider could not be built. Each layer names what was being done,
/// as the operator sees it in the one line the binary prints.
#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    /// `--cloud-config` (and the environment) could not be read or joined.
    #[error(transparent)]
    Load(#[from] LoadError),
    /// Nothing configures the provider, and it cannot start without.
    #[error("--cloud-provider {provider} needs --cloud-config {what}")]
    NeedsConfig {
        /// The provider.
        provider: &'static str,
        /// What to give, in parentheses, and any other way to give it.
        what: &'static str,
    },
    /// The configuration read is not usable.
    #[error("{what}")]
    Config {
        /// Which configuration (`--cloud-config <file>`, `the openstack
        /// configuration`).
        what: String,
        /// Why.
        source: BoxError,
    },
    /// The provider could not start with a usable configuration (a client,
    /// credentials, a first request).
    #[error("configuring the {provider} provider")]
    Configure {
        /// The provider.
        provider: &'static str,
        /// Why.
        source: BoxError,
    },
}

impl BuildError {
    /// A configuration that is not usable: `what` names it.
    pub fn config(what: impl Into<String>, source: impl Into<BoxError>) -> Self {
        Self::Config {
            what: what.into(),
            source: source.into(),
        }
    }

    /// A provider that could not start.
    pub fn configure(provider: &'static str, source: impl Into<BoxError>) -> Self {
        Self::Configure {
            provider,
            source: source.into(),
        }
    }
}

impl Provider {
    /// Whether its cloud-controller-manager has a configuration of its own
    /// that `--cloud-config` (or the environment) gives beside ours.
    pub fn has_native(&self) -> bool {
        matches!(self.reads, Reads::Joined { .. })
    }

    /// Reads `files` (the `--cloud-config`s, in order) and the environment
    /// as [`Reads`] says, and builds the provider.
    pub async fn build(
        &self,
        files: &[PathBuf],
        start: Start,
    ) -> Result<Arc<dyn CloudRoutes>, BuildError> {
        match self.reads {
            Reads::OneFile(build) => {
                let file = ccm_config::one_file(self.name, files)?;
                build(file.map(Path::to_path_buf), start).await
            }
            Reads::Joined { sources, build } => {
                let joined =
                    ccm_config::load(self.name, files, &sources, &|k| std::env::var(k).ok())?;
                build(joined, start).await
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refuse_one(file: Option<PathBuf>, _: Start) -> Building {
        Box::pin(async move {
            Err(BuildError::config(
                format!("--cloud-config {}", file.unwrap_or_default().display()),
                "no cloud here",
            ))
        })
    }

    fn refuse_joined(joined: Joined, _: Start) -> Building {
        Box::pin(async move {
            match joined.into_value() {
                None => Err(BuildError::NeedsConfig {
                    provider: "j",
                    what: "(anything)",
                }),
                Some(_) => Err(BuildError::configure("j", "no cloud here")),
            }
        })
    }

    fn start() -> Start {
        Start {
            identity: "test".into(),
            fence: Fence::new(false),
        }
    }

    fn chain(e: &dyn std::error::Error) -> String {
        let mut s = e.to_string();
        let mut next = e.source();
        while let Some(c) = next {
            s += &format!(": {c}");
            next = c.source();
        }
        s
    }

    #[tokio::test]
    async fn each_way_of_reading_hands_its_build_what_it_read() {
        let one = Provider {
            name: "o",
            reads: Reads::OneFile(refuse_one),
        };
        assert!(!one.has_native());
        let e = one
            .build(&[PathBuf::from("a.yaml")], start())
            .await
            .err()
            .unwrap();
        assert_eq!(chain(&e), "--cloud-config a.yaml: no cloud here");
        let e = one
            .build(&[PathBuf::from("a"), PathBuf::from("b")], start())
            .await
            .err()
            .unwrap();
        assert_eq!(
            chain(&e),
            "--cloud-provider o takes one --cloud-config, not 2"
        );

        let joined = Provider {
            name: "j",
            reads: Reads::Joined {
                sources: Sources::default(),
                build: refuse_joined,
            },
        };
        assert!(joined.has_native());
        let e = joined.build(&[], start()).await.err().unwrap();
        assert_eq!(
            chain(&e),
            "--cloud-provider j needs --cloud-config (anything)"
        );
        let e = joined
            .build(&[PathBuf::from("/nonexistent/j.yaml")], start())
            .await
            .err()
            .unwrap();
        assert!(
            chain(&e).starts_with("reading --cloud-config /nonexistent/j.yaml: "),
            "{}",
            chain(&e)
        );
    }
}
