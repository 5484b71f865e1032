//! Scale-out: a consumer group grown to two instances and shrunk back while the load
//! runs, each change a rebalance.

use std::time::Duration;

use saga_e2e::chaos;
use saga_e2e::invariants;
use saga_e2e::load::Load;
use saga_e2e::{PAYMENT_SERVICE, SETTLE, Stack};
use saga_testkit::eventually;

use crate::{assert_under_load, at, conclude, cycles, drain_and_check, orders, rate_spanning};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "fault suite: scripts/faults runs it on its own"]
async fn a_consumer_group_scaled_from_one_instance_to_two_and_back_mid_run_loses_nothing() {
    let mut stack = Stack::start().await;
    // A scale-out takes a start and a rebalance: a few seconds.
    let load = Load::start(&stack, orders(), rate_spanning(Duration::from_secs(15)));
    let second = format!("{PAYMENT_SERVICE}-2");
    let mut handled_by_second = 0;

    for cycle in 1..=cycles() {
        load.reached(at(2 * cycle - 1, 2 * cycles())).await;
        let handled_before = stack.log(&second).matches("event handled").count();
        assert_under_load(&load, "the group was scaled out");
        let exited = stack.start_instance(PAYMENT_SERVICE, &second, None).await;
        assert!(exited.is_none(), "{second} exited: {exited:?}");
        // The group rebalances: the new instance takes partitions and handles records.
        eventually(
            SETTLE,
            &format!("{second} to take partitions and handle records"),
            || async {
                let handled = stack.log(&second).matches("event handled").count();
                (handled > handled_before).then_some(())
            },
        )
        .await;
        load.reached(at(2 * cycle, 2 * cycles())).await;
        assert_under_load(&load, "the group was scaled in");
        let status = stack.terminate_instance(&second).await;
        assert!(status.success(), "{second} stopped cleanly: {status}");
        handled_by_second += stack.log(&second).matches("event handled").count() - handled_before;
        chaos::tend(&mut stack, None).await;
    }

    let (findings, _) = drain_and_check(&mut stack, load, None, Vec::new()).await;
    let rebalances = invariants::count_in_logs(&stack, PAYMENT_SERVICE, "partitions assigned");
    let injected = format!(
        "{PAYMENT_SERVICE} scaled 1→2→1 {} time(s) (SIGTERM to scale in); {rebalances} assignments \
         logged; {handled_by_second} records handled by the second instance",
        cycles()
    );
    conclude("consumer group scaled 1→2→1 mid-run", &injected, &findings);
}
