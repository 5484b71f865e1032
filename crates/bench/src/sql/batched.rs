//! Batched scripts: a consumer's transaction applying many events at once, made from
//! its one-event script.

use std::fmt::Write as _;

use anyhow::{Context as _, bail};

/// The statement by which a transaction's first outbox row turns the NOTIFY off for the
/// rest of it.
const NOTIFY_OFF: &str = saga::outbox::SKIP_NOTIFY;

/// A transaction's `script` as a consumer applies it in batches: `events` events in one
/// transaction, each event's statements in turn with values of its own (each variable
/// `\set` once per event, `r` becoming `r_1` … `r_16`), between one `BEGIN` and one
/// `COMMIT`. What runs before the transaction (ChargeOrder's intent) runs once per
/// event, as the consumer prepares each; the statement that turns the outbox's NOTIFY
/// off runs once, as it does for the first row of a transaction.
pub fn batched(script: &str, events: u32) -> anyhow::Result<String> {
    let mut header = String::new();
    let mut variables: Vec<(&str, &str)> = Vec::new();
    let (mut ahead, mut body) = (Vec::new(), Vec::new());
    let mut begun = false;
    let mut statement = String::new();
    for line in script.lines() {
        if statement.is_empty() && line.starts_with("--") {
            writeln!(header, "{line} ({events} events a transaction)")?;
            continue;
        }
        if statement.is_empty()
            && let Some(set) = line.strip_prefix(r"\set ")
        {
            let (name, expression) = set.split_once(' ').context("a `\\set` without a value")?;
            variables.push((name, expression));
            continue;
        }
        statement.push_str(line);
        statement.push('\n');
        if !line.ends_with(';') {
            continue;
        }
        match std::mem::take(&mut statement).trim_end() {
            "BEGIN;" => begun = true,
            "COMMIT;" => {}
            done if begun => body.push(done.to_owned()),
            done => ahead.push(done.to_owned()),
        }
    }
    if !begun {
        bail!("only a transaction's script can be batched:\n{script}");
    }
    if !body
        .iter()
        .any(|statement| statement.starts_with(NOTIFY_OFF))
    {
        bail!(
            "no `{NOTIFY_OFF}` in the transaction, to run once a batch: update crates/bench/src/sql/transactions.rs\n{script}"
        );
    }
    let event = |statement: &str, k: u32| {
        variables
            .iter()
            .fold(statement.to_owned(), |text, (name, _)| {
                rename_variable(&text, name, &format!("{name}_{k}"))
            })
    };
    let mut out = header;
    for k in 1..=events {
        for (name, expression) in &variables {
            writeln!(out, r"\set {name}_{k} {expression}")?;
        }
    }
    for k in 1..=events {
        for statement in &ahead {
            writeln!(out, "{}", event(statement, k))?;
        }
    }
    out.push_str("BEGIN;\n");
    for k in 1..=events {
        for statement in &body {
            if k > 1 && statement.starts_with(NOTIFY_OFF) {
                continue;
            }
            writeln!(out, "{}", event(statement, k))?;
        }
    }
    out.push_str("COMMIT;\n");
    Ok(out)
}

/// `text` with pgbench's variable `:from` read as `:to`; casts (`::uuid`) and longer
/// names that begin the same way are left alone.
fn rename_variable(text: &str, from: &str, to: &str) -> String {
    let pattern = format!(":{from}");
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find(&pattern) {
        let after = &rest[at + pattern.len()..];
        let cast = rest[..at].ends_with(':');
        let longer = after
            .chars()
            .next()
            .is_some_and(|c| c.is_ascii_alphanumeric() || c == '_');
        out.push_str(&rest[..at]);
        out.push(':');
        out.push_str(if cast || longer { from } else { to });
        rest = after;
    }
    out.push_str(rest);
    out
}
