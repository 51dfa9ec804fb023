//! The role every EC2 request is signed as when the config names one
//! (`role_arn`, cloud-provider-aws's `[Global] RoleARN`): STS `AssumeRole`
//! with the standard chain's credentials, sent the way cloud-provider-aws
//! sends it (`pkg/services/aws_sts.go`), so a trust policy written for the
//! CCM's role admits this controller too:
//! - `x-amz-source-account` always, the account of the role's ARN;
//! - `x-amz-source-arn` when `source_arn` (`[Global] SourceARN`) is set.
//!
//! Both headers are added before the request is signed, so they are among
//! its signed headers, as STS requires of `x-amz-*` headers.
//!
//! The credentials this provider answers carry their expiry; the SDK's
//! identity cache (in every client built on the returned config) keeps them
//! until shortly before it and asks again then.

use aws_config::SdkConfig;
use aws_credential_types::Credentials;
use aws_credential_types::provider::error::CredentialsError;
use aws_credential_types::provider::{self, ProvideCredentials, future};
use aws_sdk_sts::error::DisplayErrorContext;

/// The session name STS records (CloudTrail shows it as the caller).
const SESSION_NAME: &str = "cloud-route-controller";

/// The header naming the account the request is made for.
pub const SOURCE_ACCOUNT_HEADER: &str = "x-amz-source-account";
/// The header naming the resource the request is made for.
pub const SOURCE_ARN_HEADER: &str = "x-amz-source-arn";

/// The account id of an ARN (`arn:aws:iam::123456789012:role/x` →
/// `123456789012`), if it has one.
pub fn account_of(arn: &str) -> Option<&str> {
    let mut parts = arn.splitn(6, ':');
    let (Some("arn"), Some(_partition), Some(_service), Some(_region), Some(account)) = (
        parts.next(),
        parts.next(),
        parts.next(),
        parts.next(),
        parts.next(),
    ) else {
        return None;
    };
    (!account.is_empty()).then_some(account)
}

/// A credentials provider assuming one role.
#[derive(Debug)]
pub struct AssumedRole {
    client: aws_sdk_sts::Client,
    role_arn: String,
    headers: Vec<(&'static str, String)>,
}

impl AssumedRole {
    /// Assumes `role_arn` with the credentials of `base` (its endpoint, if
    /// set, is the STS endpoint). `role_arn` is a validated role ARN.
    pub fn new(base: &SdkConfig, role_arn: &str, source_arn: Option<&str>) -> Self {
        let mut headers = Vec::new();
        if let Some(account) = account_of(role_arn) {
            headers.push((SOURCE_ACCOUNT_HEADER, account.to_string()));
        }
        if let Some(arn) = source_arn {
            headers.push((SOURCE_ARN_HEADER, arn.to_string()));
        }
        Self {
            client: aws_sdk_sts::Client::new(base),
            role_arn: role_arn.to_string(),
            headers,
        }
    }

    async fn assume(&self) -> provider::Result {
        let headers = self.headers.clone();
        let out = self
            .client
            .assume_role()
            .role_arn(&self.role_arn)
            .role_session_name(SESSION_NAME)
            .customize()
            .mutate_request(move |req| {
                for (k, v) in &headers {
                    req.headers_mut().insert(*k, v.clone());
                }
            })
            .send()
            .await
            .map_err(|e| {
                CredentialsError::provider_error(format!(
                    "STS AssumeRole of {}: {}",
                    self.role_arn,
                    DisplayErrorContext(&e)
                ))
            })?;
        let c = out.credentials().ok_or_else(|| {
            CredentialsError::provider_error(format!(
                "STS AssumeRole of {} answered no credentials",
                self.role_arn
            ))
        })?;
        let expiry = std::time::SystemTime::try_from(*c.expiration()).map_err(|e| {
            CredentialsError::provider_error(format!(
                "STS AssumeRole of {} answered an expiry out of range: {e}",
                self.role_arn
            ))
        })?;
        Ok(Credentials::new(
            c.access_key_id(),
            c.secret_access_key(),
            Some(c.session_token().to_string()),
            Some(expiry),
            "AssumeRole",
        ))
    }
}

impl ProvideCredentials for AssumedRole {
    fn provide_credentials<'a>(&'a self) -> future::ProvideCredentials<'a>
    where
        Self: 'a,
    {
        future::ProvideCredentials::new(self.assume())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_source_account_is_the_roles_account() {
        assert_eq!(
            account_of("arn:aws:iam::123456789012:role/route-controller"),
            Some("123456789012")
        );
        assert_eq!(
            account_of("arn:aws-us-gov:iam::111122223333:role/a/b"),
            Some("111122223333")
        );
        assert_eq!(account_of("arn:aws:iam:::role/x"), None);
        assert_eq!(account_of("not-an-arn"), None);
    }
}
