//! TLS and service-account key material for one test control plane, generated at run time.
//!
//! A throw-away CA signs the apiserver's serving certificate (clients trust the CA, as they
//! would in a cluster); the service-account key signs the tokens the apiserver issues.

use anyhow::{Context, Result};
use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose,
};

/// PEM-encoded material, ready to be written to the files the servers read.
pub struct Pki {
    pub ca_cert_pem: String,
    pub serving_cert_pem: String,
    pub serving_key_pem: String,
    pub service_account_key_pem: String,
    pub service_account_public_key_pem: String,
}

impl Pki {
    /// A CA and a serving certificate valid for `localhost` and `127.0.0.1`.
    pub fn generate() -> Result<Self> {
        let mut ca_params = CertificateParams::new(Vec::<String>::new())?;
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca_params
            .distinguished_name
            .push(DnType::CommonName, "kubevirt-rs integration CA");
        ca_params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let ca = CertifiedIssuer::self_signed(ca_params, KeyPair::generate()?)
            .context("self-signing the test CA")?;

        let serving_key = KeyPair::generate()?;
        let mut serving_params =
            CertificateParams::new(vec!["localhost".to_owned(), "127.0.0.1".to_owned()])?;
        serving_params
            .distinguished_name
            .push(DnType::CommonName, "kube-apiserver");
        serving_params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        serving_params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        let serving_cert = serving_params
            .signed_by(&serving_key, &ca)
            .context("signing the apiserver serving certificate")?;

        let service_account_key = KeyPair::generate()?;
        Ok(Self {
            ca_cert_pem: ca.pem(),
            serving_cert_pem: serving_cert.pem(),
            serving_key_pem: serving_key.serialize_pem(),
            service_account_key_pem: service_account_key.serialize_pem(),
            service_account_public_key_pem: service_account_key.public_key_pem(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generates_distinct_pem_blocks() {
        let pki = Pki::generate().unwrap();
        assert!(pki.ca_cert_pem.starts_with("-----BEGIN CERTIFICATE-----"));
        assert!(
            pki.serving_cert_pem
                .starts_with("-----BEGIN CERTIFICATE-----")
        );
        assert!(
            pki.serving_key_pem
                .starts_with("-----BEGIN PRIVATE KEY-----")
        );
        assert!(
            pki.service_account_public_key_pem
                .starts_with("-----BEGIN PUBLIC KEY-----")
        );
        assert_ne!(pki.ca_cert_pem, pki.serving_cert_pem);
        assert_ne!(pki.serving_key_pem, pki.service_account_key_pem);
    }
}
