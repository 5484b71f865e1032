//! What the story tests and the page test share.

use saga_e2e::{NOTIFICATION_SERVICE, ORDER_SERVICE, PAYMENT_PROVIDER, PAYMENT_SERVICE, Stack};
use sagactl::Sources;

/// Where `stack` keeps what sagactl reads.
pub fn sources(stack: &Stack) -> Sources {
    Sources {
        orders_database_url: stack.reader_url(ORDER_SERVICE),
        payments_database_url: stack.reader_url(PAYMENT_SERVICE),
        notifications_database_url: stack.reader_url(NOTIFICATION_SERVICE),
        provider_database_url: stack.reader_url(PAYMENT_PROVIDER),
        kafka_brokers: stack.kafka.brokers.clone(),
        topics: stack.kafka.topics.clone(),
    }
}
