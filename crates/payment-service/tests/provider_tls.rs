//! payment-service's client of a card provider over HTTPS: a certificate a CA of the
//! test's own signed is trusted once that CA is given (`PROVIDER_CA_FILE`), and one it
//! does not trust is refused at the first call, with what OpenSSL said.

mod common;

use std::time::Duration;

use payment_service::provider::{Answer, ChargeRequest};
use payment_service::{Provider, ProviderConfig};
use saga_testkit::TestDatabase;
use saga_testkit::tls::TestCa;
use tokio_util::sync::CancellationToken;

/// A provider serving HTTPS with a certificate `ca` signed; its URL, and what stops it.
async fn https_provider(db: &TestDatabase, ca: &TestCa) -> (String, CancellationToken) {
    let (cert, key) = ca.server();
    payment_provider::start_local(&db.url, |config| {
        config.tls_cert_file = Some(cert);
        config.tls_key_file = Some(key);
    })
    .await
    .unwrap()
}

fn client(url: &str, ca_file: Option<std::path::PathBuf>) -> Provider {
    Provider::new(&ProviderConfig {
        provider_url: url.to_owned(),
        provider_connect_timeout: Duration::from_secs(1),
        provider_timeout: Duration::from_secs(5),
        provider_key_ttl: Duration::from_secs(24 * 3600),
        provider_ca_file: ca_file,
    })
    .unwrap()
}

fn charge() -> ChargeRequest<'static> {
    ChargeRequest {
        amount_cents: 1299,
        currency: "eur",
        reference: uuid::Uuid::new_v4().to_string(),
    }
}

#[tokio::test]
async fn a_charge_goes_over_https_to_a_provider_whose_certificate_the_given_ca_signed() {
    let db = TestDatabase::empty().await;
    let ca = TestCa::new("order-saga provider test CA");
    let (url, stop) = https_provider(&db, &ca).await;
    assert!(url.starts_with("https://"), "{url}");

    let provider = client(&url, Some(ca.ca_file()));
    provider
        .check_tls()
        .await
        .expect("the provider's certificate is trusted");
    let answer = provider.charge("tls-1:charge", &charge()).await.unwrap();
    assert!(
        matches!(
            answer,
            Answer::Charged {
                replayed: false,
                ..
            }
        ),
        "{answer:?}"
    );
    stop.cancel();
}

#[tokio::test]
async fn a_provider_certificate_from_a_ca_not_given_is_refused_at_the_first_call_naming_why() {
    let db = TestDatabase::empty().await;
    let ca = TestCa::new("order-saga provider test CA");
    let (url, stop) = https_provider(&db, &ca).await;
    let another = TestCa::new("another CA");

    for ca_file in [Some(another.ca_file()), None] {
        let refused = client(&url, ca_file.clone())
            .check_tls()
            .await
            .expect_err("an untrusted certificate is refused");
        let message = format!("{refused:#}");
        assert!(
            message.contains(&format!("the card provider at {url} refused TLS")),
            "{message}"
        );
        assert!(message.contains("certificate verify failed"), "{message}");
        assert!(message.contains("PROVIDER_CA_FILE"), "{message}");
    }
    stop.cancel();
}

#[tokio::test]
async fn a_provider_not_answering_or_plain_http_is_not_a_tls_refusal() {
    // Nothing listens on port 1: the calls will wait for it, the start does not.
    client("https://127.0.0.1:1", None)
        .check_tls()
        .await
        .unwrap();
    client("http://127.0.0.1:1", None)
        .check_tls()
        .await
        .unwrap();
}

#[test]
fn a_ca_file_that_holds_no_certificate_is_refused_naming_the_setting() {
    let ca = TestCa::new("order-saga provider test CA");
    let empty = ca.dir().join("empty.pem");
    std::fs::write(&empty, "").unwrap();
    let error = Provider::new(&ProviderConfig {
        provider_url: "https://127.0.0.1:1".to_owned(),
        provider_connect_timeout: Duration::from_secs(1),
        provider_timeout: Duration::from_secs(5),
        provider_key_ttl: Duration::from_secs(24 * 3600),
        provider_ca_file: Some(empty.clone()),
    })
    .err()
    .expect("refused");
    let message = format!("{error:#}");
    assert!(message.starts_with("PROVIDER_CA_FILE"), "{message}");
    assert!(message.contains(&empty.display().to_string()), "{message}");
}
