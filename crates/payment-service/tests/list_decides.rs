//! What the list-based decision loses, with its failpoint armed: the counterexample that
//! the charge's own key is there to prevent. A test binary of its own, as a failpoint is
//! armed for the whole process.

mod common;

use std::time::Duration;

use common::on_orders::{apply_until_done, cancelled, created, fixture};
use saga::{Outcome, failpoint};
use serde_json::json;
use uuid::Uuid;

/// The charge commits after its caller gave up, and the provider's list lags: the
/// cancellation that trusts the list reads "nothing charged" and voids the order, and the
/// charge, committed a moment later, stands with no refund and no payment to show it.
#[tokio::test]
async fn a_cancellation_that_trusts_the_list_loses_the_refund_of_a_charge_that_commits_late() {
    failpoint::arm(&format!("{}=return", failpoint::LIST_DECIDES)).unwrap();
    let f = fixture().await;
    let handler = f.handler();
    let admin = &f.provider.admin;
    let order_id = Uuid::new_v4();
    f.charge_committing_late(&handler, order_id).await;
    assert_eq!(
        apply_until_done(&handler, &cancelled(order_id, 2598)).await,
        Outcome::Applied
    );
    admin.disarm().await;
    let charges = saga_testkit::eventually(
        Duration::from_secs(10),
        "the late charge to commit",
        || async { Some(f.charges(order_id).await).filter(|charges| !charges.is_empty()) },
    )
    .await;
    assert_eq!(
        apply_until_done(&handler, &created(order_id, 2598)).await,
        Outcome::Guarded
    );

    assert_eq!(charges.len(), 1);
    assert_eq!(
        charges[0]["refunds"],
        json!([]),
        "the charge stands, never refunded"
    );
    assert_eq!(f.payment(order_id).await.unwrap().0, "voided");
    assert_eq!(f.event_types(order_id).await, ["payment.voided"]);
}
