//! The report's arithmetic: what an order costs at the ceiling, and the provider call
//! against the recorded run.

use super::cpu::ceiling_cpu_ms;
use super::*;

#[test]
fn an_order_costs_each_of_its_transactions_times_its_events_of_that_kind() {
    let ceiling = |name: &'static str, events: f64, postgres: f64| Ceiling {
        name,
        what: "",
        database: crate::sql::Database::Orders,
        connections: 1,
        tps: f64::NAN,
        events_per_second: f64::NAN,
        events,
        cpu: CpuSplit {
            machine: 2.0 * postgres,
            postgres,
            load_generator: 0.1 * postgres,
            ..CpuSplit::default()
        },
        average_latency_ms: f64::NAN,
        script: Default::default(),
        load_average: [0.0; 3],
    };
    let ceilings = [
        ceiling("create", 1000.0, 0.4),
        ceiling("provider", 2000.0, 0.6),
        ceiling("charge", 1000.0, 0.5),
        ceiling("relay", 100_000.0, 2.0),
    ];
    // 0.4 + 0.3 + 4 × 0.02 ms: the relay's pgbench run stands for rows, four an order.
    let unmerged = ceiling_cpu_ms(&ceilings, &UNMERGED_TRANSACTIONS);
    assert!((unmerged.postgres - 0.78).abs() < 1e-9, "{unmerged:?}");
    assert!((unmerged.machine - 1.56).abs() < 1e-9, "{unmerged:?}");
    assert!(
        (unmerged.load_generator - 0.078).abs() < 1e-9,
        "{unmerged:?}"
    );
    // A transaction with no pgbench run leaves the sum unknown, not short.
    assert!(
        ceiling_cpu_ms(&ceilings, &ORDER_TRANSACTIONS)
            .postgres
            .is_nan()
    );
}

#[test]
fn the_call_is_compared_with_the_recorded_run_without_it() {
    let drain = |per_second| Drain {
        rows: 1500,
        per_second,
        ..Drain::default()
    };
    let capacity = Capacity {
        charge: drain(482.0),
        provider_alone: drain(1844.0),
        apply: drain(712.0),
        notify: drain(1014.0),
        ..Capacity::default()
    };
    let rate = |name: &str| match name {
        "charge" => 1709.0,
        "provider" => 2003.0,
        "charge without call" => 2227.0,
        _ => f64::NAN,
    };
    let call = ProviderCall::new(&capacity, 3, 1, rate);
    assert!((call.ceiling_with_call - 922.0).abs() < 1.0);
    let md = call.markdown();
    println!("{md}");
    assert!(md.contains("482/s vs 744/s, 65%"), "{md}");
    assert!(md.contains("ran at 102% (ApplyPaymentResult) and 101% (NotifyCustomer)"));
    let unrecorded = ProviderCall::new(&capacity, 3, 4, rate).markdown();
    assert!(
        unrecorded.contains("No run without the call"),
        "{unrecorded}"
    );
}
