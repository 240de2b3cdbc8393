//! Certificates for tests of the mutual TLS (`testing` feature only): a CA of the install,
//! and leaves it signs with a given common name, names and usage, as KubeVirt's
//! certificate managers issue them.

pub use rcgen;

/// A certificate and its key, PEM.
pub struct Pair {
    pub cert: String,
    pub key: String,
}

/// A new CA: its pair, and the issuer that signs leaves.
pub fn ca() -> (Pair, rcgen::Issuer<'static, rcgen::KeyPair>) {
    let key = rcgen::KeyPair::generate().expect("a key");
    let mut params = rcgen::CertificateParams::default();
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "kubevirt.io");
    params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    params.key_usages = vec![
        rcgen::KeyUsagePurpose::KeyCertSign,
        rcgen::KeyUsagePurpose::DigitalSignature,
    ];
    let cert = params.self_signed(&key).expect("a CA certificate");
    let pair = Pair {
        cert: cert.pem(),
        key: key.serialize_pem(),
    };
    (pair, rcgen::Issuer::new(params, key))
}

/// A leaf of `issuer` with `common_name`, DNS `names` and one extended `usage`.
pub fn leaf(
    issuer: &rcgen::Issuer<'static, rcgen::KeyPair>,
    common_name: &str,
    names: &[&str],
    usage: rcgen::ExtendedKeyUsagePurpose,
) -> Pair {
    let key = rcgen::KeyPair::generate().expect("a key");
    let mut params =
        rcgen::CertificateParams::new(names.iter().map(|n| n.to_string()).collect::<Vec<_>>())
            .expect("valid names");
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, common_name);
    params.extended_key_usages = vec![usage];
    let cert = params
        .signed_by(&key, issuer)
        .expect("a signed certificate");
    Pair {
        cert: cert.pem(),
        key: key.serialize_pem(),
    }
}
