//! notification-service's decode of any record that parses: a notice only for an
//! outcome or a refund about the order its envelope names, an error or nothing
//! otherwise, never a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use notification_service::NotifyCustomer;
use saga::{Envelope, Handler, Topics, events};

fuzz_target!(|data: &[u8]| {
    let Ok(event) = Envelope::from_slice(data) else {
        return;
    };
    let handler = NotifyCustomer::new(Topics::new(""));
    if let Ok(Some(notice)) = handler.decode(&event) {
        assert!(
            [events::ORDER_CONFIRMED, events::ORDER_CANCELLED, events::ORDER_REFUNDED]
                .contains(&event.event_type.as_str())
        );
        assert_eq!(event.aggregate_id.parse(), Ok(notice.order_id));
    }
});
