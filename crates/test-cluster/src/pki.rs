//! Throw-away PKI for one local control plane: a CA, the apiserver's serving
//! certificate, an admin client certificate in `system:masters` and the
//! service-account signing key. Everything lives only as long as the data
//! directory of the control plane it was made for.

use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};

use crate::Error;

/// Paths of the PEM files handed to kube-apiserver, plus the PEM text the
/// kubeconfig embeds.
#[derive(Debug, Clone)]
pub(crate) struct Pki {
    pub ca_cert: PathBuf,
    pub serving_cert: PathBuf,
    pub serving_key: PathBuf,
    /// Private key (PKCS#8) for signing service-account tokens.
    pub sa_key: PathBuf,
    /// Its public half: the verification flag accepts only public keys.
    pub sa_pub: PathBuf,
    pub ca_pem: String,
    pub admin_cert_pem: String,
    pub admin_key_pem: String,
}

fn rcgen_err(what: &'static str) -> impl FnOnce(rcgen::Error) -> Error {
    move |source| Error::Pki { what, source }
}

fn write(dir: &Path, name: &str, pem: &str) -> Result<PathBuf, Error> {
    let path = dir.join(name);
    std::fs::write(&path, pem)
        .map_err(|source| Error::io(format!("write {}", path.display()), source))?;
    Ok(path)
}

/// Generates the PKI into `dir` (created if missing).
pub(crate) fn generate(dir: &Path) -> Result<Pki, Error> {
    std::fs::create_dir_all(dir)
        .map_err(|source| Error::io(format!("create {}", dir.display()), source))?;

    let ca_key = KeyPair::generate().map_err(rcgen_err("CA key"))?;
    let mut ca_params =
        CertificateParams::new(Vec::<String>::new()).map_err(rcgen_err("CA params"))?;
    ca_params
        .distinguished_name
        .push(DnType::CommonName, "cloud-route-controller test CA");
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    let ca_cert = ca_params
        .self_signed(&ca_key)
        .map_err(rcgen_err("CA certificate"))?;
    let issuer = Issuer::new(ca_params, ca_key);

    // rustls checks IP SANs, so the loopback address must be in the cert.
    let serving_key = KeyPair::generate().map_err(rcgen_err("serving key"))?;
    let mut serving =
        CertificateParams::new(vec!["127.0.0.1".to_string(), "localhost".to_string()])
            .map_err(rcgen_err("serving params"))?;
    serving
        .distinguished_name
        .push(DnType::CommonName, "kube-apiserver");
    serving.key_usages = vec![
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::KeyEncipherment,
    ];
    serving.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    let serving_cert = serving
        .signed_by(&serving_key, &issuer)
        .map_err(rcgen_err("serving certificate"))?;

    let admin_key = KeyPair::generate().map_err(rcgen_err("admin key"))?;
    let mut admin =
        CertificateParams::new(Vec::<String>::new()).map_err(rcgen_err("admin params"))?;
    admin
        .distinguished_name
        .push(DnType::CommonName, "crc-admin");
    // The organisation becomes the group: system:masters bypasses RBAC and APF.
    admin
        .distinguished_name
        .push(DnType::OrganizationName, "system:masters");
    admin.key_usages = vec![
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::KeyEncipherment,
    ];
    admin.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
    let admin_cert = admin
        .signed_by(&admin_key, &issuer)
        .map_err(rcgen_err("admin certificate"))?;

    let sa_key = KeyPair::generate().map_err(rcgen_err("service-account key"))?;

    let ca_pem = ca_cert.pem();
    Ok(Pki {
        ca_cert: write(dir, "ca.crt", &ca_pem)?,
        serving_cert: write(dir, "apiserver.crt", &serving_cert.pem())?,
        serving_key: write(dir, "apiserver.key", &serving_key.serialize_pem())?,
        sa_key: write(dir, "sa.key", &sa_key.serialize_pem())?,
        sa_pub: write(dir, "sa.pub", &sa_key.public_key_pem())?,
        ca_pem,
        admin_cert_pem: admin_cert.pem(),
        admin_key_pem: admin_key.serialize_pem(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_all_files_as_pem() {
        let dir = std::env::temp_dir().join(format!("crc-pki-test-{}", std::process::id()));
        let pki = generate(&dir).expect("pki");
        for path in [&pki.ca_cert, &pki.serving_cert] {
            let text = std::fs::read_to_string(path).expect("read");
            assert!(
                text.starts_with("-----BEGIN CERTIFICATE-----"),
                "{}",
                path.display()
            );
        }
        for path in [&pki.serving_key, &pki.sa_key] {
            let text = std::fs::read_to_string(path).expect("read");
            assert!(
                text.starts_with("-----BEGIN PRIVATE KEY-----"),
                "{}",
                path.display()
            );
        }
        let public = std::fs::read_to_string(&pki.sa_pub).expect("read");
        assert!(public.starts_with("-----BEGIN PUBLIC KEY-----"));
        assert_ne!(pki.ca_pem, pki.admin_cert_pem);
        std::fs::remove_dir_all(&dir).expect("cleanup");
    }
}
