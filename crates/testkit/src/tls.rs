//! A certificate authority of a test's own, and the certificates it signs for
//! `127.0.0.1` and `localhost`, written to files as a service is given them.

use std::path::{Path, PathBuf};

use openssl::asn1::Asn1Time;
use openssl::bn::{BigNum, MsbOption};
use openssl::ec::{EcGroup, EcKey};
use openssl::hash::MessageDigest;
use openssl::nid::Nid;
use openssl::pkey::{PKey, Private};
use openssl::x509::extension::{BasicConstraints, KeyUsage, SubjectAlternativeName};
use openssl::x509::{X509, X509Name, X509NameBuilder};

pub struct TestCa {
    dir: PathBuf,
    key: PKey<Private>,
    cert: X509,
}

fn key() -> PKey<Private> {
    let group = EcGroup::from_curve_name(Nid::X9_62_PRIME256V1).expect("P-256");
    PKey::from_ec_key(EcKey::generate(&group).expect("a key")).expect("a key")
}

fn name(common_name: &str) -> X509Name {
    let mut name = X509NameBuilder::new().unwrap();
    name.append_entry_by_nid(Nid::COMMONNAME, common_name)
        .unwrap();
    name.build()
}

fn builder(common_name: &str, key: &PKey<Private>) -> openssl::x509::X509Builder {
    let mut serial = BigNum::new().unwrap();
    serial.rand(64, MsbOption::MAYBE_ZERO, false).unwrap();
    let mut cert = X509::builder().unwrap();
    cert.set_version(2).unwrap();
    cert.set_serial_number(&serial.to_asn1_integer().unwrap())
        .unwrap();
    cert.set_subject_name(&name(common_name)).unwrap();
    cert.set_pubkey(key).unwrap();
    cert.set_not_before(&Asn1Time::days_from_now(0).unwrap())
        .unwrap();
    cert.set_not_after(&Asn1Time::days_from_now(1).unwrap())
        .unwrap();
    cert
}

impl TestCa {
    /// A new CA, its files in a fresh directory under the system's temporary one.
    pub fn new(common_name: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("saga-test-ca-{}", uuid::Uuid::new_v4()));
        std::fs::create_dir_all(&dir).expect("a temporary directory");
        let key = key();
        let mut cert = builder(common_name, &key);
        cert.set_issuer_name(&name(common_name)).unwrap();
        cert.append_extension(BasicConstraints::new().critical().ca().build().unwrap())
            .unwrap();
        cert.append_extension(
            KeyUsage::new()
                .critical()
                .key_cert_sign()
                .crl_sign()
                .build()
                .unwrap(),
        )
        .unwrap();
        cert.sign(&key, MessageDigest::sha256()).unwrap();
        let ca = Self {
            dir,
            key,
            cert: cert.build(),
        };
        std::fs::write(ca.ca_file(), ca.cert.to_pem().unwrap()).unwrap();
        ca
    }

    /// The CA's certificate, as a client is told to trust it.
    pub fn ca_file(&self) -> PathBuf {
        self.dir.join("ca.pem")
    }

    /// A server certificate for `127.0.0.1` and `localhost`, signed by this CA: its
    /// certificate file and its key file.
    pub fn server(&self) -> (PathBuf, PathBuf) {
        let key = key();
        let mut cert = builder("127.0.0.1", &key);
        cert.set_issuer_name(self.cert.subject_name()).unwrap();
        let names = SubjectAlternativeName::new()
            .ip("127.0.0.1")
            .dns("localhost")
            .build(&cert.x509v3_context(Some(&self.cert), None))
            .unwrap();
        cert.append_extension(names).unwrap();
        cert.sign(&self.key, MessageDigest::sha256()).unwrap();
        let (cert_file, key_file) = (self.dir.join("server.pem"), self.dir.join("server.key"));
        std::fs::write(&cert_file, cert.build().to_pem().unwrap()).unwrap();
        std::fs::write(&key_file, key.private_key_to_pem_pkcs8().unwrap()).unwrap();
        (cert_file, key_file)
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }
}

impl Drop for TestCa {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
