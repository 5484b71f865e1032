//! What the story tests and the page test share.

use saga_e2e::{NOTIFICATION_SERVICE, ORDER_SERVICE, PAYMENT_PROVIDER, PAYMENT_SERVICE, Stack};
use sagactl::Sources;

/// Where `stack` keeps what sagactl reads.
pub fn sources(stack: &Stack) -> Sources {
    Sources {
        orders_database_url: stack.database(ORDER_SERVICE).url.clone(),
        payments_database_url: stack.database(PAYMENT_SERVICE).url.clone(),
        notifications_database_url: stack.database(NOTIFICATION_SERVICE).url.clone(),
        provider_database_url: stack.database(PAYMENT_PROVIDER).url.clone(),
        kafka_brokers: stack.kafka.brokers.clone(),
        topics: stack.kafka.topics.clone(),
    }
}
