//! The services' logs, read: each `event handled` line, with the record it names and the
//! outcome it logged.

use std::collections::HashMap;

use crate::{SERVICES, Stack};

/// One `event handled` line of a service's log.
pub(super) struct Handled {
    pub(super) topic: String,
    pub(super) partition: i32,
    pub(super) offset: i64,
    pub(super) event_id: Option<String>,
    pub(super) outcome: String,
}

/// Every `event handled` line of every instance of every service.
pub(super) struct HandledLog {
    pub(super) by_service: HashMap<&'static str, Vec<Handled>>,
}

impl HandledLog {
    pub(super) fn read(stack: &Stack) -> Self {
        let mut by_service = HashMap::new();
        for service in SERVICES {
            let lines: Vec<Handled> = stack
                .logs_of(service)
                .iter()
                .flat_map(|log| log.lines().filter_map(parse_handled).collect::<Vec<_>>())
                .collect();
            by_service.insert(service, lines);
        }
        Self { by_service }
    }
}

/// The outcomes `service` logged for each event id, in the order it logged them.
pub fn outcomes_by_event(stack: &Stack, service: &str) -> HashMap<String, Vec<String>> {
    let mut outcomes: HashMap<String, Vec<String>> = HashMap::new();
    for log in stack.logs_of(service) {
        for line in log.lines().filter_map(parse_handled) {
            if let Some(id) = line.event_id {
                outcomes.entry(id).or_default().push(line.outcome);
            }
        }
    }
    outcomes
}

/// How many lines of `service`'s logs (every instance) contain `needle`.
pub fn count_in_logs(stack: &Stack, service: &str, needle: &str) -> usize {
    stack
        .logs_of(service)
        .iter()
        .map(|log| log.matches(needle).count())
        .sum()
}

/// Parses a line such as
/// `… INFO record{topic="t1.orders" partition=0 offset=5 event_id="…"}: saga::consumer:
/// event handled event_type=order.created outcome="applied"`.
fn parse_handled(line: &str) -> Option<Handled> {
    let marker = "}: saga::consumer: event handled ";
    let end = line.find(marker)?;
    let start = line[..end].rfind("record{")? + "record{".len();
    let fields = &line[start..end];
    let (topic, rest) = quoted_field(fields, "topic=")?;
    let (partition, rest) = plain_field(rest, "partition=")?;
    let (offset, rest) = plain_field(rest, "offset=")?;
    let event_id = quoted_field(rest, "event_id=").map(|(id, _)| id);
    let (outcome, _) = quoted_field(&line[end + marker.len()..], "outcome=")?;
    Some(Handled {
        topic,
        partition: partition.parse().ok()?,
        offset: offset.parse().ok()?,
        event_id,
        outcome,
    })
}

/// `key="value"` (with `\"` and `\\` escapes, as the log writes `&str` fields); returns
/// the value and the text after it.
fn quoted_field<'a>(text: &'a str, key: &str) -> Option<(String, &'a str)> {
    let at = text.find(key)? + key.len();
    let mut chars = text[at..].char_indices();
    if chars.next()?.1 != '"' {
        return None;
    }
    let mut value = String::new();
    while let Some((i, c)) = chars.next() {
        match c {
            '\\' => value.push(chars.next()?.1),
            '"' => return Some((value, &text[at + i + 1..])),
            c => value.push(c),
        }
    }
    None
}

/// `key=value` up to the next space; returns the value and the text after it.
fn plain_field<'a>(text: &'a str, key: &str) -> Option<(&'a str, &'a str)> {
    let at = text.find(key)? + key.len();
    let len = text[at..].find([' ', '}']).unwrap_or(text.len() - at);
    Some((&text[at..at + len], &text[at + len..]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_record_span_and_outcome_of_an_event_handled_line() {
        let line = r#"2026-11-30T08:55:10.971781Z  INFO record{topic="t1.payments" partition=2 offset=17 event_id="cb1c:pay\"x"}: saga::consumer: event handled event_type=payment.succeeded outcome="duplicate""#;
        let handled = parse_handled(line).unwrap();
        assert_eq!(handled.topic, "t1.payments");
        assert_eq!(handled.partition, 2);
        assert_eq!(handled.offset, 17);
        assert_eq!(handled.event_id.as_deref(), Some("cb1c:pay\"x"));
        assert_eq!(handled.outcome, "duplicate");
    }

    #[test]
    fn ignores_every_other_line() {
        assert!(
            parse_handled("2026-11-30T08:55:10Z  INFO saga::service: service started").is_none()
        );
        assert!(
            parse_handled(r#"… WARN record{topic="t1.orders" partition=0 offset=3}: saga::consumer: record dead-lettered reason="x""#)
                .is_none()
        );
    }
}
