//! The story, the stuck orders and the dead letters as text for a terminal.

use std::fmt::Write as _;

use time::OffsetDateTime;
use time::macros::format_description;

use crate::story::{Kind, Story, money};
use crate::{DeadLetters, Listed, clock};

/// `+12 ms`, `+3.4 s`, `+5 min`: how long after the order was placed.
pub fn since(from: OffsetDateTime, at: OffsetDateTime) -> String {
    let ms = (at - from).whole_milliseconds();
    match ms {
        ..0 => format!("{ms} ms"),
        0..1_000 => format!("+{ms} ms"),
        1_000..60_000 => format!("+{:.1} s", ms as f64 / 1_000.0),
        _ => format!("+{:.1} min", ms as f64 / 60_000.0),
    }
}

/// One line per step, in time order: when, how long after the order was placed, who,
/// what. A delivery stopped by a guard is marked so it stands out. Records a service
/// ignores (not its event type) are counted at the end unless `all`.
pub fn story(story: &Story, all: bool) -> String {
    let order = &story.order;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "order {} · {} · {} · {} · placed {} UTC",
        order.id,
        order.status,
        money(order.amount_cents),
        order.customer_id,
        order
            .created_at
            .format(format_description!("[year]-[month]-[day]"))
            .unwrap_or_default()
            + " "
            + &clock(order.created_at),
    );
    if let Some(reason) = &order.cancel_reason {
        let _ = write!(out, "cancelled: {reason}");
        if let Some(refund) = order.refund {
            let _ = write!(out, " · refund: {refund}");
        }
        if let Some(refund_id) = &order.refund_id {
            let _ = write!(out, " ({refund_id})");
        }
        out.push('\n');
    }
    out.push('\n');
    let mut ignored = 0;
    for step in &story.steps {
        if step.kind == Kind::Ignored && !all {
            ignored += 1;
            continue;
        }
        let mark = match step.kind {
            Kind::Guard1 | Kind::Guard2 => "»",
            Kind::DeadLettered | Kind::RefundFailed => "!",
            Kind::Cancelled | Kind::Refunded | Kind::Tombstone => "×",
            Kind::Waiting | Kind::Unknown => "…",
            _ => " ",
        };
        let _ = writeln!(
            out,
            "{} {:>10}  {mark} {:<20} {:<12} {}",
            clock(step.at),
            since(order.created_at, step.at),
            step.actor,
            step.kind.label(),
            step.text,
        );
        if let Some(detail) = &step.detail {
            let _ = writeln!(out, "{:49}{detail}", "");
        }
    }
    if ignored > 0 {
        let _ = writeln!(
            out,
            "\n({ignored} record(s) ignored by a service they are not for: --all shows them)"
        );
    }
    if story.open {
        let _ = writeln!(out, "\n(not finished: run again to see what happens next)");
    }
    out
}

pub fn orders(orders: &[Listed]) -> String {
    if orders.is_empty() {
        return "no such orders\n".into();
    }
    let now = OffsetDateTime::now_utc();
    let mut out = String::new();
    for order in orders {
        let status = if order.settled || order.status == "pending" {
            order.status.clone()
        } else {
            format!("{} (refund pending)", order.status)
        };
        let _ = writeln!(
            out,
            "{}  {:<9}  {:>10}  placed {} ago",
            order.id,
            status,
            money(order.amount_cents),
            humantime::format_duration(std::time::Duration::from_secs(
                (now - order.created_at).whole_seconds().max(0) as u64
            )),
        );
    }
    out
}

pub fn dead_letters(topics: &[DeadLetters]) -> String {
    let mut out = String::new();
    for topic in topics {
        let _ = write!(out, "{}: {} record(s)", topic.topic, topic.count);
        if let Some(newest) = topic.newest {
            let _ = write!(out, ", newest at {} UTC", clock(newest));
        }
        out.push('\n');
        for (reason, count) in &topic.reasons {
            let _ = writeln!(out, "  {count:>5}  {reason}");
        }
    }
    out
}
