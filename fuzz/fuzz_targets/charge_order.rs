//! payment-service's decode of any record that parses: a command only for an
//! `order.created` about the order its envelope names, an error or nothing otherwise,
//! never a panic.
#![no_main]

use std::sync::LazyLock;
use std::time::Duration;

use libfuzzer_sys::fuzz_target;
use payment_service::{ChargeOrder, Provider, ProviderConfig};
use saga::{Envelope, Handler, Topics, events};

static HANDLER: LazyLock<ChargeOrder> = LazyLock::new(|| {
    // Decode never calls it.
    let provider = Provider::new(&ProviderConfig {
        provider_url: "http://127.0.0.1:9".into(),
        provider_connect_timeout: Duration::from_secs(1),
        provider_timeout: Duration::from_secs(1),
        provider_key_ttl: Duration::from_secs(24 * 3600),
        provider_ca_file: None,
    })
    .unwrap();
    ChargeOrder::new(Topics::new(""), provider)
});

fuzz_target!(|data: &[u8]| {
    let Ok(event) = Envelope::from_slice(data) else {
        return;
    };
    if let Ok(Some(order)) = HANDLER.decode(&event) {
        assert_eq!(event.event_type, events::ORDER_CREATED);
        assert_eq!(event.aggregate_id.parse(), Ok(order.order_id));
    }
});
