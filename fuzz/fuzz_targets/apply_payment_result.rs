//! order-service's decode of any record that parses: a command only for a payment
//! result about the order its envelope names, an error otherwise, never a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use order_service::ApplyPaymentResult;
use saga::{Envelope, Handler, Topics, events};

fuzz_target!(|data: &[u8]| {
    let Ok(event) = Envelope::from_slice(data) else {
        return;
    };
    let handler = ApplyPaymentResult::new(Topics::new(""));
    if let Ok(Some((payment, _))) = handler.decode(&event) {
        assert!(
            [events::PAYMENT_SUCCEEDED, events::PAYMENT_FAILED]
                .contains(&event.event_type.as_str())
        );
        assert_eq!(event.aggregate_id.parse(), Ok(payment.order_id));
    }
});
