//! Classifies EC2 failures into [`CloudError`]s.
//!
//! EC2 names every error with a stable `Code` in its XML answer; the
//! classification keys on that code, never on message text, and falls back
//! to the HTTP status for codes it does not know.

use std::error::Error as StdError;
use std::time::Duration;

use aws_credential_types::provider::error::CredentialsError;
use aws_sdk_ec2::config::http::HttpResponse;
use aws_sdk_ec2::error::{DisplayErrorContext, ProvideErrorMetadata, SdkError};
use route_cloud::{CloudError, ErrorKind};

/// The class of an EC2 error code, or `None` when the code alone does not say.
pub fn kind_of_code(code: &str) -> Option<ErrorKind> {
    Some(match code {
        "RequestLimitExceeded"
        | "Throttling"
        | "ThrottlingException"
        | "RequestThrottled"
        | "RequestThrottledException"
        | "TooManyRequestsException"
        | "EC2ThrottledException"
        | "SlowDown"
        | "PriorRequestNotComplete"
        | "BandwidthLimitExceeded" => ErrorKind::Throttled,
        "RouteAlreadyExists" => ErrorKind::AlreadyExists,
        // A route table deleted while the controller runs: its view of the
        // tables is stale, the list that follows rediscovers them.
        "InvalidRoute.NotFound" | "InvalidRouteTableID.NotFound" => ErrorKind::NotFound,
        "RouteLimitExceeded" | "RouteTableLimitExceeded" => ErrorKind::QuotaExceeded,
        // Credentials and permissions: an operator has to act.
        "AuthFailure"
        | "UnauthorizedOperation"
        | "InvalidClientTokenId"
        | "SignatureDoesNotMatch"
        | "OptInRequired"
        | "Blocked"
        | "PendingVerification"
        | "AccessDenied"
        | "AccessDeniedException"
        | "InvalidAccessKeyId"
        | "MissingAuthenticationToken" => ErrorKind::Permanent,
        // Temporary credentials roll over and clocks get fixed; the SDK
        // refreshes credentials on the next call.
        "ExpiredToken" | "RequestExpired" => ErrorKind::Transient,
        // A just-launched instance can be unknown for a moment (EC2 is
        // eventually consistent).
        "InvalidInstanceID.NotFound" => ErrorKind::Transient,
        // A stopped or terminated instance refuses routes (CreateRoute,
        // ReplaceRoute) until it runs again, if it ever does.
        "IncorrectInstanceState" | "IncorrectState" => ErrorKind::TargetUnavailable,
        "InternalError"
        | "InternalFailure"
        | "ServiceUnavailable"
        | "Unavailable"
        | "InsufficientInstanceCapacity" => ErrorKind::Transient,
        code if code.starts_with("InvalidParameter")
            || code.starts_with("MissingParameter")
            || code.starts_with("UnknownParameter")
            || code.ends_with(".Malformed")
            || code.starts_with("InvalidRouteTableID")
            || code.starts_with("InvalidNetworkInterfaceID")
            || code.starts_with("InvalidGatewayID")
            || code == "InvalidAction"
            || code == "InvalidQueryParameter"
            || code == "ValidationError"
            || code == "UnsupportedOperation"
            || code == "Unsupported"
            || code == "OperationNotPermitted"
            || code == "DryRunOperation" =>
        {
            ErrorKind::InvalidRequest
        }
        _ => return None,
    })
}

/// The class of an HTTP status with an unknown or missing error code.
fn kind_of_status(status: u16) -> ErrorKind {
    match status {
        401 | 403 => ErrorKind::Permanent,
        408 => ErrorKind::Timeout,
        429 => ErrorKind::Throttled,
        500..=599 => ErrorKind::Transient,
        _ => ErrorKind::InvalidRequest,
    }
}

/// A server-sent `Retry-After` in seconds (EC2 itself does not send one;
/// proxies and some endpoints do).
fn retry_after(resp: &HttpResponse) -> Option<Duration> {
    let v = resp.headers().get("retry-after")?;
    provider_kit::retry_after(v, std::time::SystemTime::now())
        .map(|d| d.min(Duration::from_secs(3600)))
}

/// The credential chain's failure behind an error, if that is what it was.
fn credentials_error<'a>(err: &'a (dyn StdError + 'static)) -> Option<&'a CredentialsError> {
    let mut cur: Option<&(dyn StdError + 'static)> = Some(err);
    while let Some(e) = cur {
        if let Some(c) = e.downcast_ref::<CredentialsError>() {
            return Some(c);
        }
        cur = e.source();
    }
    None
}

/// Classifies one failed SDK call of `operation`.
pub fn classify<E>(operation: &str, err: &SdkError<E, HttpResponse>) -> CloudError
where
    E: ProvideErrorMetadata + StdError + Send + Sync + 'static,
{
    match err {
        SdkError::ServiceError(se) => {
            let e = se.err();
            let status = se.raw().status().as_u16();
            let code = e.code().unwrap_or("");
            let kind = kind_of_code(code).unwrap_or_else(|| kind_of_status(status));
            let message = format!(
                "{operation}: {} (HTTP {status}): {}",
                if code.is_empty() {
                    "no error code"
                } else {
                    code
                },
                e.message().unwrap_or("no message")
            );
            let mut ce = CloudError::new(kind, message);
            if kind == ErrorKind::Throttled {
                ce.retry_after = retry_after(se.raw());
            }
            ce
        }
        SdkError::TimeoutError(_) => CloudError::new(
            ErrorKind::Timeout,
            format!("{operation}: no answer in time"),
        ),
        SdkError::DispatchFailure(d) => {
            let kind = if d.is_timeout() {
                ErrorKind::Timeout
            } else if let Some(c) = credentials_error(err) {
                match c {
                    // Nothing in the chain has credentials, or it is
                    // misconfigured: an operator has to act.
                    CredentialsError::CredentialsNotLoaded(_)
                    | CredentialsError::InvalidConfiguration(_) => ErrorKind::Permanent,
                    // Metadata service or STS hiccups.
                    _ => ErrorKind::Transient,
                }
            } else if d.is_user() {
                // A bad endpoint URL and the like.
                ErrorKind::Permanent
            } else {
                ErrorKind::Transient
            };
            CloudError::new(
                kind,
                format!("{operation}: sending failed: {}", DisplayErrorContext(err)),
            )
        }
        SdkError::ResponseError(r) => {
            let status = r.raw().status().as_u16();
            let kind = if status >= 500 || status == 0 {
                ErrorKind::Transient
            } else {
                kind_of_status(status)
            };
            CloudError::new(
                kind,
                format!(
                    "{operation}: unreadable answer (HTTP {status}): {}",
                    DisplayErrorContext(err)
                ),
            )
        }
        SdkError::ConstructionFailure(_) => CloudError::new(
            ErrorKind::Permanent,
            format!(
                "{operation}: request could not be built: {}",
                DisplayErrorContext(err)
            ),
        ),
        _ => CloudError::new(
            ErrorKind::Transient,
            format!("{operation}: {}", DisplayErrorContext(err)),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_map_to_the_documented_classes() {
        for (code, kind) in [
            ("RequestLimitExceeded", ErrorKind::Throttled),
            ("RouteAlreadyExists", ErrorKind::AlreadyExists),
            ("InvalidRoute.NotFound", ErrorKind::NotFound),
            ("RouteLimitExceeded", ErrorKind::QuotaExceeded),
            ("InvalidParameterValue", ErrorKind::InvalidRequest),
            ("InvalidParameterCombination", ErrorKind::InvalidRequest),
            ("InvalidRouteTableID.NotFound", ErrorKind::NotFound),
            ("InvalidInstanceID.Malformed", ErrorKind::InvalidRequest),
            ("UnauthorizedOperation", ErrorKind::Permanent),
            ("AuthFailure", ErrorKind::Permanent),
            ("InvalidInstanceID.NotFound", ErrorKind::Transient),
            ("InternalError", ErrorKind::Transient),
        ] {
            assert_eq!(kind_of_code(code), Some(kind), "{code}");
        }
        assert_eq!(kind_of_code("SomethingNew"), None);
    }

    #[test]
    fn unknown_codes_fall_back_to_the_status() {
        assert_eq!(kind_of_status(503), ErrorKind::Transient);
        assert_eq!(kind_of_status(500), ErrorKind::Transient);
        assert_eq!(kind_of_status(403), ErrorKind::Permanent);
        assert_eq!(kind_of_status(429), ErrorKind::Throttled);
        assert_eq!(kind_of_status(400), ErrorKind::InvalidRequest);
    }
}
