//! Compute Engine answers sorted into the controller's error classes.
//!
//! Two places carry an error: the HTTP answer to a request (status code plus
//! `error.errors[].reason`, e.g. 403 `rateLimitExceeded`, 403
//! `quotaExceeded`, 404 `notFound`, 409 `alreadyExists`; see
//! cloud.google.com/compute/docs/api/handling-errors), and the `error` of an
//! operation that finished `DONE` (codes such as `QUOTA_EXCEEDED`,
//! `RESOURCE_NOT_FOUND`, `RESOURCE_ALREADY_EXISTS`).

use google_cloud_gax::error::Error as GaxError;
use google_cloud_gax::error::rpc::StatusDetails;
use route_cloud::{CloudError, ErrorKind};

/// The `reason`s of a JSON error answer (`error.errors[].reason`, which the
/// client keeps as `ErrorInfo` details).
pub fn reasons(e: &GaxError) -> Vec<String> {
    e.status()
        .map(|s| {
            s.details
                .iter()
                .filter_map(|d| match d {
                    StatusDetails::ErrorInfo(info) if !info.reason.is_empty() => {
                        Some(info.reason.clone())
                    }
                    _ => None,
                })
                .collect()
        })
        .unwrap_or_default()
}

/// The class of an HTTP answer with `status` and `reasons`.
pub fn kind_of_answer(status: u16, reasons: &[String]) -> ErrorKind {
    let has = |r: &str| reasons.iter().any(|x| x == r);
    if has("rateLimitExceeded") || has("userRateLimitExceeded") || status == 429 {
        return ErrorKind::Throttled;
    }
    if has("quotaExceeded") || has("QUOTA_EXCEEDED") {
        return ErrorKind::QuotaExceeded;
    }
    if has("resourceNotReady") || has("resourceInUseByAnotherResource") || status == 412 {
        return ErrorKind::Conflict;
    }
    match status {
        404 => ErrorKind::NotFound,
        409 if has("alreadyExists") || reasons.is_empty() => ErrorKind::AlreadyExists,
        409 => ErrorKind::Conflict,
        400 | 413 | 422 => ErrorKind::InvalidRequest,
        401 | 403 => ErrorKind::Permanent,
        408 => ErrorKind::Timeout,
        500..=599 => ErrorKind::Transient,
        _ => ErrorKind::Permanent,
    }
}

/// Classifies a failed request. `sent` says whether the failure can have
/// come after the server acted (an answer lost on the way back).
pub fn classify(operation: &str, e: &GaxError) -> CloudError {
    let kind = if let Some(status) = e.http_status_code() {
        kind_of_answer(status, &reasons(e))
    } else if e.is_timeout() {
        ErrorKind::Timeout
    } else if e.is_authentication() {
        // A token that could not be fetched now (the metadata server was
        // slow) may work later; a missing or broken key will not.
        let transient = std::error::Error::source(e)
            .and_then(|s| s.downcast_ref::<google_cloud_gax::error::CredentialsError>())
            .is_some_and(|c| c.is_transient());
        if transient {
            ErrorKind::Transient
        } else {
            ErrorKind::Permanent
        }
    } else if e.is_connect() || e.is_transient_and_before_rpc() {
        ErrorKind::Transient
    } else if e.is_io() || e.is_transport() {
        // The request may have reached the server: the outcome is unknown.
        ErrorKind::Timeout
    } else if e.is_binding() || e.is_serialization() {
        ErrorKind::InvalidRequest
    } else {
        ErrorKind::Transient
    };
    let message = match e.status() {
        Some(s) => format!(
            "gce: {operation}: HTTP {} {}{}",
            e.http_status_code().unwrap_or_default(),
            s.message,
            match reasons(e).as_slice() {
                [] => String::new(),
                r => format!(" ({})", r.join(", ")),
            }
        ),
        None => format!("gce: {operation}: {}", with_causes(e)),
    };
    CloudError::new(kind, message)
}

/// `e` and each of its causes, so that a credentials failure names why
/// (the metadata server refusing the connection, say), not only that the
/// token could not be fetched.
fn with_causes(e: &GaxError) -> String {
    let mut text = e.to_string();
    let mut cause = std::error::Error::source(e);
    while let Some(c) = cause {
        let more = c.to_string();
        if !text.contains(&more) {
            text.push_str(": ");
            text.push_str(&more);
        }
        cause = c.source();
    }
    text
}

/// The class of an operation that finished with error `code` (the first of
/// `Operation.error.errors[]`), for an insert (`creating`) or a delete.
pub fn kind_of_operation_error(code: &str, creating: bool) -> ErrorKind {
    match code {
        "QUOTA_EXCEEDED" => ErrorKind::QuotaExceeded,
        "RATE_LIMIT_EXCEEDED" => ErrorKind::Throttled,
        "RESOURCE_ALREADY_EXISTS" | "ALREADY_EXISTS" => ErrorKind::AlreadyExists,
        // Deleting a route that is gone has reached its goal; an insert
        // whose next-hop instance is not there (yet) may work later.
        "RESOURCE_NOT_FOUND" | "NOT_FOUND" if !creating => ErrorKind::NotFound,
        "RESOURCE_NOT_FOUND" | "NOT_FOUND" => ErrorKind::Transient,
        "RESOURCE_NOT_READY" | "RESOURCE_IN_USE_BY_ANOTHER_RESOURCE" => ErrorKind::Conflict,
        "INVALID_USAGE" | "INVALID_FIELD_VALUE" | "BAD_REQUEST" | "CONDITION_NOT_MET" => {
            ErrorKind::InvalidRequest
        }
        "PERMISSION_DENIED" | "FORBIDDEN" => ErrorKind::Permanent,
        _ => ErrorKind::Transient,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn documented_answers_map_to_their_classes() {
        assert_eq!(
            kind_of_answer(403, &r(&["rateLimitExceeded"])),
            ErrorKind::Throttled
        );
        assert_eq!(kind_of_answer(429, &[]), ErrorKind::Throttled);
        assert_eq!(
            kind_of_answer(403, &r(&["quotaExceeded"])),
            ErrorKind::QuotaExceeded
        );
        assert_eq!(
            kind_of_answer(403, &r(&["forbidden"])),
            ErrorKind::Permanent
        );
        assert_eq!(kind_of_answer(404, &r(&["notFound"])), ErrorKind::NotFound);
        assert_eq!(
            kind_of_answer(409, &r(&["alreadyExists"])),
            ErrorKind::AlreadyExists
        );
        assert_eq!(
            kind_of_answer(400, &r(&["resourceNotReady"])),
            ErrorKind::Conflict
        );
        assert_eq!(
            kind_of_answer(400, &r(&["invalid"])),
            ErrorKind::InvalidRequest
        );
        assert_eq!(kind_of_answer(503, &[]), ErrorKind::Transient);
    }

    #[test]
    fn operation_errors_depend_on_the_operation() {
        assert_eq!(
            kind_of_operation_error("QUOTA_EXCEEDED", true),
            ErrorKind::QuotaExceeded
        );
        assert_eq!(
            kind_of_operation_error("RESOURCE_NOT_FOUND", false),
            ErrorKind::NotFound
        );
        assert_eq!(
            kind_of_operation_error("RESOURCE_NOT_FOUND", true),
            ErrorKind::Transient
        );
        assert_eq!(
            kind_of_operation_error("SOMETHING_NEW", true),
            ErrorKind::Transient
        );
    }
}
