//! Each model holds its properties with every guard, and each guard taken away either
//! breaks one (the property and the sequence's last step are checked) or is caught by
//! another guard, which the course says where it takes that guard away.

use saga_models::consumer::Transaction;
use saga_models::pivot::Pivot;
use saga_models::{Guarded, Report, check};

fn consumer(without: &[&str]) -> Report {
    let model = without.iter().fold(Transaction::default(), |model, name| {
        model.without_named(name).expect("a guard of the model")
    });
    check(model)
}

fn pivot(without: &[&str]) -> Report {
    let model = without.iter().fold(Pivot::default(), |model, name| {
        model.without_named(name).expect("a guard of the model")
    });
    check(model)
}

/// The property broken, and the last step of the shortest sequence that breaks it.
fn broken(report: &Report) -> (&'static str, &str) {
    let found = report
        .counterexample
        .as_ref()
        .unwrap_or_else(|| panic!("a counterexample, not {report}"));
    (found.property, found.steps.last().expect("a step at least"))
}

fn holds(report: &Report) {
    assert!(report.counterexample.is_none(), "{report}");
    assert!(
        report.states > 100,
        "explored only {} states",
        report.states
    );
}

#[test]
fn the_consumers_transaction_with_every_guard_has_no_counterexample() {
    holds(&consumer(&[]));
}

#[test]
fn without_guard_2_a_late_failure_ends_in_a_dead_letter_not_a_flipped_order() {
    let report = consumer(&["guard-2"]);
    let (property, last) = broken(&report);
    assert_eq!(property, "no record ends in a dead letter");
    assert!(
        last.contains("order.cancelled order:outcome into the outbox: duplicate key"),
        "{report}"
    );
}

#[test]
fn without_guard_2_and_the_outcome_id_the_late_failure_flips_the_confirmed_order() {
    let report = consumer(&["guard-2", "outcome-id"]);
    assert_eq!(
        broken(&report),
        (
            "a terminal order never changes",
            "consumer B commits: the confirmed order flipped to cancelled"
        )
    );
}

#[test]
fn without_for_update_and_the_outcome_id_two_results_read_pending_and_both_apply() {
    let report = consumer(&["for-update", "outcome-id"]);
    assert_eq!(
        broken(&report),
        (
            "a terminal order never changes",
            "consumer B commits: the confirmed order flipped to cancelled"
        )
    );
    let steps = &report.counterexample.as_ref().expect("found").steps;
    let reads_pending = steps
        .iter()
        .filter(|s| s.ends_with("reads (no lock) status pending"));
    assert_eq!(reads_pending.count(), 2, "{report}");
}

#[test]
fn one_guard_alone_away_is_caught_by_another() {
    // Guard 1's copy meets guard 2; FOR UPDATE's race and a second outcome meet the
    // outbox's unique id. The course shows each, then takes the second guard away too.
    for guard in ["guard-1", "for-update", "outcome-id"] {
        holds(&consumer(&[guard]));
    }
}

#[test]
fn without_guards_1_and_2_a_second_result_ends_in_a_dead_letter() {
    let report = consumer(&["guard-1", "guard-2"]);
    assert_eq!(broken(&report).0, "no record ends in a dead letter");
}

#[test]
fn committing_the_offset_at_poll_skips_the_record_a_crash_interrupts() {
    let report = consumer(&["offset-after-commit"]);
    let (property, last) = broken(&report);
    assert_eq!(property, "no record is skipped");
    assert!(last.contains("crashes"), "{report}");
}

#[test]
fn the_payment_pivot_with_every_guard_has_no_counterexample() {
    holds(&pivot(&[]));
}

#[test]
fn without_the_intent_a_charge_is_made_that_no_row_names() {
    let report = pivot(&["intent"]);
    assert_eq!(broken(&report).0, "nothing is charged without its row");
}

#[test]
fn asking_again_under_a_fresh_key_charges_twice() {
    let report = pivot(&["same-key"]);
    assert_eq!(
        broken(&report),
        (
            "the card is charged at most once",
            "the provider commits the charge order:charge:2: the card is charged"
        )
    );
}

#[test]
fn a_cancellation_that_trusts_the_list_leaves_a_cancelled_order_charged() {
    let report = pivot(&["resolve-by-key"]);
    assert_eq!(broken(&report).0, "at rest, the money matches the order");
    let steps = &report.counterexample.as_ref().expect("found").steps;
    assert!(
        steps
            .iter()
            .any(|s| s.contains("finds no charge in the provider's list")),
        "{report}"
    );
}

#[test]
fn asking_again_past_the_key_lifetime_charges_twice() {
    let report = pivot(&["key-lifetime"]);
    let (property, _) = broken(&report);
    assert_eq!(property, "the card is charged at most once");
    let steps = &report.counterexample.as_ref().expect("found").steps;
    assert!(
        steps.iter().any(|s| s.contains("key lifetime passes")),
        "{report}"
    );
}

#[test]
fn a_refusal_retried_into_a_dead_letter_leaves_the_cancellation_unanswered() {
    let report = pivot(&["refusal-answers"]);
    assert_eq!(broken(&report).0, "every cancellation is answered");
}

#[test]
fn every_guard_of_each_model_can_be_taken_away_by_its_name() {
    for (name, _) in Transaction::GUARDS {
        assert!(
            Transaction::default().without_named(name).is_some(),
            "{name}"
        );
    }
    for (name, _) in Pivot::GUARDS {
        assert!(Pivot::default().without_named(name).is_some(), "{name}");
    }
    assert!(Transaction::default().without_named("guard-3").is_none());
}

#[test]
fn a_run_reports_the_same_sequence_every_time() {
    let first = consumer(&["for-update", "outcome-id"]).to_string();
    for _ in 0..5 {
        assert_eq!(consumer(&["for-update", "outcome-id"]).to_string(), first);
    }
}
