//! A service principal's client certificate (`aadClientCertPath`), read as
//! the Azure cloud-controller-manager reads it (`azidentity.ParseCertificates`
//! in `pkg/azclient/auth.go`): a PEM file with the certificate (first) and
//! its unencrypted private key (`PRIVATE KEY` or `RSA PRIVATE KEY`). Each
//! token request carries a client assertion signed with the key, as
//! `azidentity.ClientCertificateCredential` sends it: an RS256 JWT whose
//! header names the certificate by its SHA-1 and SHA-256 thumbprints
//! (`x5t`, `x5t#S256`), for the token endpoint as audience, the application
//! as issuer and subject, valid for ten minutes.
//!
//! A PKCS#12 (`.pfx`) file, and a PEM key that is encrypted, are refused at
//! start with the command that converts them: reading them would take a
//! PKCS#12 and PBES2 stack this controller does not carry.

use std::fmt;
use std::path::Path;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use aws_lc_rs::digest::{SHA1_FOR_LEGACY_USE_ONLY, SHA256, digest};
use aws_lc_rs::rand::{SecureRandom, SystemRandom};
use aws_lc_rs::signature::{RSA_PKCS1_SHA256, RsaKeyPair};
use base64::Engine;
use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};

/// How long an assertion is valid (azidentity's, through MSAL: 10 minutes).
const ASSERTION_LIFETIME_SECS: u64 = 600;

/// The certificate and its key.
#[derive(Clone)]
pub struct ClientCertificate {
    cert_der: Vec<u8>,
    key: Arc<RsaKeyPair>,
}

impl PartialEq for ClientCertificate {
    fn eq(&self, other: &Self) -> bool {
        // One certificate has one key.
        self.cert_der == other.cert_der
    }
}

impl Eq for ClientCertificate {}

impl fmt::Debug for ClientCertificate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClientCertificate")
            .field("x5t", &self.thumbprint_sha1())
            .finish_non_exhaustive()
    }
}

/// One PEM block: its label and its decoded body.
fn pem_blocks(text: &str) -> Result<Vec<(String, Vec<u8>)>, String> {
    let mut blocks = Vec::new();
    let mut lines = text.lines();
    while let Some(line) = lines.next() {
        let Some(label) = line
            .trim()
            .strip_prefix("-----BEGIN ")
            .and_then(|l| l.strip_suffix("-----"))
        else {
            continue;
        };
        let end = format!("-----END {label}-----");
        let mut body = String::new();
        let mut ended = false;
        for line in lines.by_ref() {
            let line = line.trim();
            if line == end {
                ended = true;
                break;
            }
            if line.contains(':') {
                // RFC 1421 headers (`Proc-Type: 4,ENCRYPTED`): an encrypted key.
                return Err(format!(
                    "the {label} block is encrypted; PEM keys must be unencrypted, as the cloud-controller-manager reads them"
                ));
            }
            body.push_str(line);
        }
        if !ended {
            return Err(format!("the {label} block has no end line"));
        }
        let der = STANDARD
            .decode(body.as_bytes())
            .map_err(|e| format!("the {label} block is not base64: {e}"))?;
        blocks.push((label.to_string(), der));
    }
    Ok(blocks)
}

impl ClientCertificate {
    /// Reads `path` as the cloud-controller-manager would with `password`.
    /// Errors name the file and the reason, never key material.
    pub fn load(path: &Path, password: &str) -> Result<Self, String> {
        let shown = path.display();
        let convert = format!(
            "convert it to PEM (openssl pkcs12 -in {shown} -out client.pem -nodes) and leave aadClientCertPassword empty"
        );
        let bytes = std::fs::read(path).map_err(|e| format!("reading {shown}: {e}"))?;
        let text = match std::str::from_utf8(&bytes) {
            Ok(t) if t.contains("-----BEGIN ") => t,
            _ => {
                return Err(format!(
                    "{shown} is not PEM (a PKCS#12 .pfx file?): PKCS#12 is not read here; {convert}"
                ));
            }
        };
        if !password.is_empty() {
            // azidentity reads PEM only without a password; with one it
            // reads PKCS#12, which this file is not.
            return Err(format!(
                "{shown} is PEM, which the cloud-controller-manager reads only without aadClientCertPassword; leave it empty"
            ));
        }
        let blocks = pem_blocks(text).map_err(|e| format!("{shown}: {e}"))?;
        let cert_der = blocks
            .iter()
            .find(|(l, _)| l == "CERTIFICATE")
            .map(|(_, d)| d.clone())
            .ok_or_else(|| format!("{shown} has no CERTIFICATE block"))?;
        let mut keys = blocks.iter().filter(|(l, _)| l.ends_with("PRIVATE KEY"));
        let (label, der) = keys
            .next()
            .ok_or_else(|| format!("{shown} has no PRIVATE KEY block"))?;
        if keys.next().is_some() {
            return Err(format!("{shown} holds more than one private key"));
        }
        let key = match label.as_str() {
            "PRIVATE KEY" => RsaKeyPair::from_pkcs8(der),
            "RSA PRIVATE KEY" => RsaKeyPair::from_der(der),
            "ENCRYPTED PRIVATE KEY" => {
                return Err(format!("{shown}: the private key is encrypted; {convert}"));
            }
            other => {
                return Err(format!(
                    "{shown}: a {other} is not an RSA key; Entra ID certificate credentials here are RSA"
                ));
            }
        }
        .map_err(|_| format!("{shown}: the private key is not an RSA key this controller can use"))?;
        Ok(Self {
            cert_der,
            key: Arc::new(key),
        })
    }

    /// `x5t`: the certificate's SHA-1 thumbprint, base64url.
    pub fn thumbprint_sha1(&self) -> String {
        URL_SAFE_NO_PAD.encode(digest(&SHA1_FOR_LEGACY_USE_ONLY, &self.cert_der))
    }

    /// `x5t#S256`: the certificate's SHA-256 thumbprint, base64url.
    pub fn thumbprint_sha256(&self) -> String {
        URL_SAFE_NO_PAD.encode(digest(&SHA256, &self.cert_der))
    }

    /// The certificate, DER.
    pub fn der(&self) -> &[u8] {
        &self.cert_der
    }

    /// A client assertion for `client_id` at the token endpoint `audience`.
    pub fn assertion(&self, client_id: &str, audience: &str) -> Result<String, String> {
        let rng = SystemRandom::new();
        let mut nonce = [0u8; 16];
        rng.fill(&mut nonce)
            .map_err(|_| "no randomness for the assertion's id".to_string())?;
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_err(|e| e.to_string())?
            .as_secs();
        let header = serde_json::json!({
            "alg": "RS256",
            "typ": "JWT",
            "x5t": self.thumbprint_sha1(),
            "x5t#S256": self.thumbprint_sha256(),
        });
        let claims = serde_json::json!({
            "aud": audience,
            "iss": client_id,
            "sub": client_id,
            "jti": URL_SAFE_NO_PAD.encode(nonce),
            "iat": now,
            "nbf": now,
            "exp": now + ASSERTION_LIFETIME_SECS,
        });
        let signed = format!(
            "{}.{}",
            URL_SAFE_NO_PAD.encode(header.to_string()),
            URL_SAFE_NO_PAD.encode(claims.to_string())
        );
        let mut sig = vec![0u8; self.key.public_modulus_len()];
        self.key
            .sign(&RSA_PKCS1_SHA256, &rng, signed.as_bytes(), &mut sig)
            .map_err(|_| "signing the client assertion failed".to_string())?;
        Ok(format!("{signed}.{}", URL_SAFE_NO_PAD.encode(sig)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pem_blocks_are_read_and_encrypted_ones_refused() {
        let text = "junk\n-----BEGIN CERTIFICATE-----\nAAEC\nAw==\n-----END CERTIFICATE-----\n";
        assert_eq!(
            pem_blocks(text).unwrap(),
            vec![("CERTIFICATE".to_string(), vec![0, 1, 2, 3])]
        );
        let encrypted = "-----BEGIN RSA PRIVATE KEY-----\nProc-Type: 4,ENCRYPTED\nDEK-Info: AES-128-CBC,00\n\nAAEC\n-----END RSA PRIVATE KEY-----\n";
        assert!(pem_blocks(encrypted).unwrap_err().contains("encrypted"));
        assert!(
            pem_blocks("-----BEGIN CERTIFICATE-----\nAAEC\n")
                .unwrap_err()
                .contains("no end line")
        );
    }
}
