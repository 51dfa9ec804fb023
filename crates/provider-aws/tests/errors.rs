//! How failures below EC2's error codes are classified: no credentials, no
//! server, no answer. None of these need moto.

use std::time::Duration;

use aws_config::{BehaviorVersion, Region, SdkConfig};
use aws_credential_types::provider::error::CredentialsError;
use aws_credential_types::provider::future::ProvideCredentials as ProvideCredentialsFuture;
use aws_credential_types::provider::{ProvideCredentials, SharedCredentialsProvider};
use provider_aws::{AwsConfig, Ec2Routes, testing};
use route_cloud::{CloudRoutes, ErrorKind};
use tokio::net::TcpListener;

fn config(endpoint: &str) -> AwsConfig {
    AwsConfig {
        route_table_id: Some("rtb-0123".into()),
        endpoint: Some(endpoint.into()),
        request_timeout_seconds: 1,
        ..AwsConfig::default()
    }
}

#[tokio::test]
async fn no_server_is_transient() {
    // Bind then drop: the port is free and refuses connections.
    let port = TcpListener::bind("127.0.0.1:0")
        .await
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let url = format!("http://127.0.0.1:{port}");
    let p = testing::provider(&url, config(&url)).await.unwrap();
    let e = p.list_routes("c").await.unwrap_err();
    assert_eq!(e.kind, ErrorKind::Transient, "{e}");
    assert_eq!(p.stats().total("DescribeRouteTables"), 1);
}

#[tokio::test]
async fn a_silent_server_is_a_timeout() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    // Accept and hold connections without ever answering.
    let holder = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((c, _)) = listener.accept().await {
            held.push(c);
        }
    });
    let p = testing::provider(&url, config(&url)).await.unwrap();
    let started = std::time::Instant::now();
    let e = p.list_routes("c").await.unwrap_err();
    assert_eq!(e.kind, ErrorKind::Timeout, "{e}");
    assert!(started.elapsed() < Duration::from_secs(10));
    holder.abort();
}

/// A credential chain that finds nothing, or whose source fails.
#[derive(Debug)]
struct NoCredentials {
    transient: bool,
}

impl ProvideCredentials for NoCredentials {
    fn provide_credentials<'a>(&'a self) -> ProvideCredentialsFuture<'a>
    where
        Self: 'a,
    {
        ProvideCredentialsFuture::ready(Err(if self.transient {
            CredentialsError::provider_timed_out(Duration::from_secs(1))
        } else {
            CredentialsError::not_loaded("no credentials in the chain")
        }))
    }
}

#[tokio::test]
async fn missing_credentials_are_permanent_a_failing_source_is_not() {
    for (transient, kind) in [(false, ErrorKind::Permanent), (true, ErrorKind::Transient)] {
        let sdk = SdkConfig::builder()
            .behavior_version(BehaviorVersion::latest())
            .region(Region::new("us-east-1"))
            .credentials_provider(SharedCredentialsProvider::new(NoCredentials { transient }))
            .build();
        let p = Ec2Routes::from_sdk_config(config("http://127.0.0.1:9"), &sdk).unwrap();
        let e = p.list_routes("c").await.unwrap_err();
        assert_eq!(e.kind, kind, "{e}");
    }
}

#[tokio::test]
async fn a_region_is_required() {
    let sdk = SdkConfig::builder()
        .behavior_version(BehaviorVersion::latest())
        .build();
    let e = Ec2Routes::from_sdk_config(AwsConfig::default(), &sdk).unwrap_err();
    assert!(e.to_string().contains("region"), "{e}");
    let with_region = AwsConfig {
        region: Some("eu-west-1".into()),
        ..AwsConfig::default()
    };
    assert!(Ec2Routes::from_sdk_config(with_region, &sdk).is_ok());
}
