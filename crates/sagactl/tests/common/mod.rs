//! What the story tests and the page test share.

#![allow(dead_code)] // Each test crate uses its own part of this.

use saga_e2e::{NOTIFICATION_SERVICE, ORDER_SERVICE, PAYMENT_PROVIDER, PAYMENT_SERVICE, Stack};
use sagactl::Sources;
use sagactl::story::{self, Databases, Kind, Step, Story};
use uuid::Uuid;

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

/// The story of `order_id` as sagactl tells it now.
pub async fn tell(stack: &Stack, order_id: Uuid) -> Story {
    let sources = sources(stack);
    let databases = Databases::connect(&sources).await.unwrap();
    story::tell(&sources, &databases, order_id)
        .await
        .unwrap()
        .expect("the order exists")
}

/// The steps of `story` that `actor` took, of `kind`.
pub fn steps<'a>(story: &'a Story, actor: &str, kind: Kind) -> Vec<&'a Step> {
    story
        .steps
        .iter()
        .filter(|s| s.actor == actor && s.kind == kind)
        .collect()
}
