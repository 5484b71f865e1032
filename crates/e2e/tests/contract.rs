//! The order API against its own contract: schemathesis (installed by `scripts/test`
//! into `.cache/schemathesis`) reads `/openapi.json` from the running order-service and
//! sends what it generates from it, valid and not, with the saga running behind.
//!
//! `SAGA_CONTRACT_EXAMPLES` (100) sets the test cases per operation and phase;
//! `scripts/contract --long` runs it with many more. Each run's figures go to
//! `target/contract-report.md`.

use std::path::Path;
use std::process::Output;

use saga_e2e::{
    NOTIFICATION_SERVICE, ORDER_SERVICE, PAYMENT_SERVICE, SETTLE, Stack, workspace_root,
};
use saga_testkit::eventually;
use serde_json::Value;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_generated_request_gets_a_documented_status_and_body_never_a_5xx_nor_a_hang() {
    let st = workspace_root().join(".cache/schemathesis/bin/st");
    assert!(
        st.exists(),
        "{} is missing: scripts/test installs schemathesis",
        st.display()
    );
    let examples = std::env::var("SAGA_CONTRACT_EXAMPLES").unwrap_or_else(|_| "100".into());
    // Ours, so that a failure can be replayed with `st run --seed`.
    let seed = uuid::Uuid::new_v4().as_u128() >> 64;
    let stack = Stack::start().await;
    let reports = std::env::temp_dir().join(format!("{}-contract", stack.kafka.namespace));

    std::fs::create_dir_all(&reports).unwrap();
    let output = run_schemathesis(&st, &stack, &examples, seed, &reports).await;
    let stdout = String::from_utf8_lossy(&output.stdout);
    let report = read_report(&reports, &stdout);
    let generated = report["test_cases"]["generated"].as_u64().unwrap();
    let failures = report["test_cases"]["unique_failures"].as_u64().unwrap();
    let errors = report["errors"].as_array().map_or(0, Vec::len);
    let line = format!(
        "schemathesis {}: {generated} test cases over {} operations in {:.1} s, {failures} \
         failures, {errors} errors (--max-examples {examples}, --seed {seed})",
        report["schemathesis_version"].as_str().unwrap_or("?"),
        report["operations"]["tested"],
        report["running_time"].as_f64().unwrap_or_default(),
    );
    println!("{line}");
    let _ = std::fs::write(
        workspace_root().join("target/contract-report.md"),
        format!("{line}\n"),
    );
    assert!(
        output.status.success() && failures == 0 && errors == 0,
        "{line}\n{stdout}"
    );
    assert!(generated > 0, "{stdout}");

    assert_every_order_placed_settled(&stack).await;
    assert_nothing_dead_lettered_and_every_service_healthy(&stack).await;
    let _ = std::fs::remove_dir_all(&reports);
}

/// Runs schemathesis against the stack's order API, its report in `reports`.
async fn run_schemathesis(
    st: &Path,
    stack: &Stack,
    examples: &str,
    seed: u128,
    reports: &Path,
) -> Output {
    tokio::process::Command::new(st)
        // It keeps a cache in its working folder.
        .current_dir(reports)
        .arg("run")
        .arg(stack.api_url("/openapi.json"))
        // Every check but one: a request valid by the schema may still name a product
        // the catalog does not hold, and that is a 422, not a 2xx. The catalog is data;
        // the contract cannot list it.
        .args([
            "--checks",
            "all",
            "--exclude-checks",
            "positive_data_acceptance",
        ])
        .args(["--max-examples", examples])
        // A hang is a failure: no answer may take longer.
        .args(["--max-response-time", "5", "--request-timeout", "10"])
        .args(["--generation-database", "none", "--no-color", "--seed"])
        .arg(seed.to_string())
        .args(["--report", "json", "--report-dir"])
        .arg(reports)
        .output()
        .await
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", st.display()))
}

/// The JSON report schemathesis wrote in `reports`.
fn read_report(reports: &Path, stdout: &str) -> Value {
    let report = std::fs::read_dir(reports)
        .ok()
        .and_then(|entries| {
            entries
                .filter_map(Result::ok)
                .find(|entry| entry.file_name().to_string_lossy().ends_with(".json"))
        })
        .and_then(|entry| std::fs::read_to_string(entry.path()).ok())
        .unwrap_or_else(|| panic!("schemathesis wrote no report:\n{stdout}"));
    serde_json::from_str(&report).unwrap()
}

/// Whatever the contract let through, the saga settled: no order left pending.
async fn assert_every_order_placed_settled(stack: &Stack) {
    let orders = stack.orders_db.client().await;
    eventually(SETTLE, "every accepted order to settle", || async {
        let pending: i64 = orders
            .query_one("SELECT count(*) FROM orders WHERE status = 'pending'", &[])
            .await
            .unwrap()
            .get(0);
        (pending == 0).then_some(())
    })
    .await;
    let placed: i64 = orders
        .query_one("SELECT count(*) FROM orders", &[])
        .await
        .unwrap()
        .get(0);
    println!("{placed} orders placed by the generated requests, all settled");
    assert!(
        placed > 0,
        "no generated request placed an order: the check above proves nothing"
    );
}

/// No event dead-lettered downstream, and every service still healthy.
async fn assert_nothing_dead_lettered_and_every_service_healthy(stack: &Stack) {
    for service in [ORDER_SERVICE, PAYMENT_SERVICE, NOTIFICATION_SERVICE] {
        let (_, _, dead_letters) = stack.subscription(service);
        let dead = stack.kafka.read_all(&dead_letters).await;
        assert!(
            dead.is_empty(),
            "{service} dead-lettered {} records",
            dead.len()
        );
        assert!(
            stack.healthy(service).await,
            "{service} is unhealthy after the run"
        );
    }
}
