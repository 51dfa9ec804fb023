use std::fmt;
use std::time::Duration;

/// The class of a cloud failure; decides how the controller reacts.
///
/// Serialises as its [`ErrorKind::as_str`] label so configuration files (the
/// `memory` provider's fault injection) can name a kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorKind {
    /// Rate limited; wait `retry_after` (or back off) and try again.
    Throttled,
    /// A concurrent change or a lock on the resource (Hetzner `locked`,
    /// OpenStack 412); retry with backoff.
    Conflict,
    /// The route already exists; the controller's view of the cloud is stale.
    AlreadyExists,
    /// The route or its parent is gone; the controller's view is stale.
    NotFound,
    /// A quota or hard limit (routes per table) is reached; retrying will not help
    /// until something is deleted.
    QuotaExceeded,
    /// The cloud rejects the request as such (bad destination, IPv6 unsupported).
    InvalidRequest,
    /// A server-side or network failure; the request did not take effect.
    Transient,
    /// No answer in time; the request may or may not have taken effect.
    Timeout,
    /// Credentials, permissions or configuration; needs an operator.
    Permanent,
    /// The route's target cannot take a route in its current state (an
    /// instance stopped or terminated: EC2 `IncorrectInstanceState`).
    /// Retrying soon changes nothing: it is retried like a blackhole repair
    /// that came back (60 s doubling to the backoff maximum), warned once.
    TargetUnavailable,
    /// Not sent: this replica may not change the cloud now (leadership lost,
    /// renew deadline passed, shutting down). Never an answer of the cloud.
    Fenced,
}

impl ErrorKind {
    /// A stable lowercase label for metrics and logs.
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorKind::Throttled => "throttled",
            ErrorKind::Conflict => "conflict",
            ErrorKind::AlreadyExists => "already_exists",
            ErrorKind::NotFound => "not_found",
            ErrorKind::QuotaExceeded => "quota_exceeded",
            ErrorKind::InvalidRequest => "invalid_request",
            ErrorKind::Transient => "transient",
            ErrorKind::Timeout => "timeout",
            ErrorKind::Permanent => "permanent",
            ErrorKind::TargetUnavailable => "target_unavailable",
            ErrorKind::Fenced => "fenced",
        }
    }
}

impl fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A classified cloud failure.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{kind}: {message}")]
pub struct CloudError {
    /// The class.
    pub kind: ErrorKind,
    /// What the cloud said (never containing secrets).
    pub message: String,
    /// How long the cloud asked us to wait, if it said.
    pub retry_after: Option<Duration>,
}

impl CloudError {
    /// A new error of `kind`.
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        Self {
            kind,
            message: message.into(),
            retry_after: None,
        }
    }

    /// A throttling answer with an optional wait.
    pub fn throttled(message: impl Into<String>, retry_after: Option<Duration>) -> Self {
        Self {
            kind: ErrorKind::Throttled,
            message: message.into(),
            retry_after,
        }
    }

    /// Asking again later can succeed without anyone intervening: what a
    /// provider's own loop (polling an operation) needs to know. The
    /// engine's retry rule for each class is `route_controller::policy`'s,
    /// whose table test holds the two together.
    pub fn is_retryable(&self) -> bool {
        !matches!(self.kind, ErrorKind::InvalidRequest | ErrorKind::Permanent)
    }
}
