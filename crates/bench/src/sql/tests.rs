//! The drift check: the handlers' statements against the scripts made of them, and
//! the scripts' own rules.

use super::extract::extract_library;
use super::render::{bind, check_variables, parameter_count};
use super::*;

#[test]
fn a_batched_script_applies_each_event_with_values_of_its_own_in_one_transaction() {
    let charge = Transaction::all()
        .into_iter()
        .find(|t| t.name == "charge")
        .unwrap();
    let script = charge.pgbench_script().unwrap();
    let per_event = |text: &str, needle: &str| text.matches(needle).count();
    let batched = batched(&script, 3).unwrap();
    println!("{batched}");
    assert_eq!(per_event(&batched, "BEGIN;"), 1);
    assert_eq!(per_event(&batched, "COMMIT;"), 1);
    // The intent once per event, before the transaction.
    let read_ahead = "SELECT EXISTS";
    assert_eq!(per_event(&batched, read_ahead), 3);
    assert!(batched.rfind(read_ahead).unwrap() < batched.find("BEGIN;").unwrap());
    for k in 1..=3 {
        assert!(
            batched.contains(&format!(r"\set r_{k} random(")),
            "{batched}"
        );
        assert_eq!(
            per_event(&batched, &format!(":r_{k}::")),
            per_event(&script, ":r::"),
            "event {k} uses its own value wherever the script used `:r`"
        );
    }
    assert!(
        !batched.contains(":r:") && !batched.contains(":r)"),
        "{batched}"
    );
    // Every statement of the transaction once per event, but the NOTIFY switched off
    // once.
    assert_eq!(per_event(&batched, "INSERT INTO payments"), 3);
    assert_eq!(per_event(&batched, "INSERT INTO outbox"), 3);
    assert_eq!(per_event(&batched, "saga.outbox_notify"), 1);
    // Casts stay casts.
    assert_eq!(
        per_event(&batched, "::uuid"),
        3 * per_event(&script, "::uuid")
    );
    assert!(
        super::batched("\\set r random(1, 2)\nSELECT :r;\n", 2).is_err(),
        "a script with no transaction"
    );
    assert!(
        super::batched("BEGIN;\nSELECT 1;\nCOMMIT;\n", 2).is_err(),
        "a transaction whose NOTIFY switch the batch cannot find"
    );
    for (of, _) in crate::pgbench::BATCHED {
        let transaction = Transaction::all()
            .into_iter()
            .find(|t| t.name == of)
            .unwrap();
        super::batched(&transaction.pgbench_script().unwrap(), 16)
            .unwrap_or_else(|e| panic!("{of}: {e:#}"));
    }
}

#[test]
fn every_handler_transaction_renders_from_its_source() {
    for transaction in Transaction::all() {
        let script = transaction
            .pgbench_script()
            .unwrap_or_else(|e| panic!("{}: {e:#}", transaction.name));
        assert!(
            !script.contains('$'),
            "{}: unbound parameter",
            transaction.name
        );
    }
}

#[test]
fn the_handlers_statements_are_the_ones_the_scripts_run() {
    // The outbox's statements (the NOTIFY's setting, the insert) are spliced in where
    // the handlers call outbox::enqueue.
    let enqueue = extract_library(&OUTBOX, "enqueue").unwrap().statements;
    assert_eq!(enqueue.len(), 2);
    assert!(enqueue[0].contains("saga.outbox_notify"), "{enqueue:?}");
    let charge = Transaction::charge().extracted().unwrap();
    assert!(charge.transactional);
    assert_eq!(charge.statements.last(), enqueue.last());
    assert!(one_line(&charge.statements[0]).starts_with("INSERT INTO processed_events"));
    let relay = Transaction::relay().extracted().unwrap();
    assert!(!relay.transactional, "the relay's bookkeeping autocommits");
    // Every transaction that writes the outbox spares the trigger its NOTIFY, as the
    // handlers do beside their relay.
    for transaction in Transaction::all() {
        let script = transaction.pgbench_script().unwrap();
        assert_eq!(
            script.contains("INSERT INTO outbox"),
            script.contains("set_config('saga.outbox_notify', 'off', true)"),
            "{}:\n{script}",
            transaction.name
        );
    }
}

#[test]
fn the_charge_reads_ahead_outside_its_transaction() {
    let script = Transaction::charge().pgbench_script().unwrap();
    let read_ahead = script.find("SELECT EXISTS").expect("the read-ahead is run");
    let begin = script.find("BEGIN;").expect("the transaction is run");
    assert!(read_ahead < begin, "{script}");
    let alone = Transaction::charge_without_call().pgbench_script().unwrap();
    assert!(!alone.contains("SELECT EXISTS"), "{alone}");
    assert_eq!(
        script.lines().filter(|l| !l.starts_with("--")).count(),
        alone.lines().filter(|l| !l.starts_with("--")).count() + 1
    );
}

#[test]
fn the_providers_charge_claims_the_key_and_inserts_the_charge_in_one_transaction() {
    let provider = Transaction::provider();
    assert!(provider.extracted().unwrap().transactional);
    let script = provider.pgbench_script().unwrap();
    // A statement may span lines (the stored answer's JSON); each ends with `;`.
    let ends = script.lines().filter(|l| l.ends_with(';')).count();
    assert_eq!(ends, 5, "BEGIN, three statements, COMMIT:\n{script}");
    let at = |text: &str| {
        script
            .find(text)
            .unwrap_or_else(|| panic!("{text}: {script}"))
    };
    assert!(at("BEGIN;") < at("INSERT INTO idempotency_keys"));
    assert!(at("INSERT INTO idempotency_keys") < at("INSERT INTO charges"));
    assert!(at("INSERT INTO charges") < at("COMMIT;"));
    assert!(!script.contains("SELECT fingerprint"), "a replay's read");
}

#[test]
fn every_function_with_sql_in_those_files_is_benchmarked_or_said_not_to_be() {
    let transactions = Transaction::all();
    let mut benchmarked: Vec<String> = transactions
        .iter()
        .flat_map(|t| [Some(t.function), t.ahead.as_ref().map(|a| a.function)])
        .flatten()
        .map(str::to_owned)
        .collect();
    // A helper whose statements a benchmarked function runs where it calls it.
    for t in &transactions {
        benchmarked.extend(extract(t.source, t.function).unwrap().inlined);
    }
    for source in SOURCES {
        for (name, extracted) in functions_with_sql(source).unwrap() {
            let known = benchmarked.contains(&name)
                || ["claim", "enqueue"].contains(&name.as_str())
                || NOT_BENCHMARKED.iter().any(|(n, _)| *n == name);
            assert!(
                known,
                "{} `{name}` runs SQL the benchmark does not know ({:?}): add it to a \
                 Transaction in crates/bench/src/sql/transactions.rs or to NOT_BENCHMARKED in crates/bench/src/sql/extract.rs",
                source.path, extracted.statements
            );
        }
    }
}

#[test]
fn the_relay_lock_is_read_from_the_outbox() {
    relay_lock().unwrap();
    assert_eq!(relay_synchronous_commit().unwrap(), "off");
    assert_eq!(relay_plan_cache_mode().unwrap(), "force_custom_plan");
}

#[test]
fn parameters_bind_longest_number_first() {
    let sql = "VALUES ($1, $10, $2::uuid[])";
    let values: Vec<String> = (1..=10).map(|n| format!("v{n}")).collect();
    assert_eq!(parameter_count(sql), 10);
    assert_eq!(bind(sql, &values), "VALUES (v1, v10, v2::uuid[])");
}

#[test]
fn a_colon_pgbench_would_misread_is_refused() {
    assert!(check_variables("SELECT '{\"a\":1299}'::jsonb;").is_err());
    assert!(check_variables("SELECT md5(:client_id::text || :r::text)::uuid;").is_ok());
}
