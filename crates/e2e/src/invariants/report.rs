//! The scenario's report: what was injected, checked and absorbed, printed and kept as a
//! table row; and the verdict, every violation listed.

use super::Findings;

impl Findings {
    /// Prints the scenario's report: what was injected, what was checked, what was
    /// absorbed. With `SAGA_FAULT_REPORT` set, also appends a row to that Markdown file.
    pub fn report(&self, scenario: &str, injected: &str) {
        let mut out = String::new();
        out.push_str(&format!("\n=== {scenario}\n"));
        out.push_str(&format!("injected   {injected}\n"));
        out.push_str(&format!(
            "checked    {} orders ({} confirmed, {} cancelled, {} pending) for: each offered order \
             placed once; settled, the way its amount and its cancellation want; exactly the \
             events of its story, once each; charged at most once, each charge refunded at most \
             once and only if it succeeded, charged minus refunded the amount if confirmed and 0 if \
             cancelled, nothing charged after a tombstone left unrefunded; every cancellation \
             answered; notifications one per kind, matching the story; every outbox row \
             published; inboxes agree with the logs; no record skipped; dead letters exactly \
             the poison\n",
            self.orders, self.confirmed, self.cancelled, self.pending
        ));
        out.push_str(&format!(
            "money      {} charges, {} refunds; {} orders cancelled by the customer or the deadline: {} refunded, {} refund failed (visibly), {} voided (nothing charged, or declined)\n",
            self.charges, self.refunds, self.cancellations, self.refunded, self.refund_failed, self.voided
        ));
        for g in &self.groups {
            out.push_str(&format!(
                "records    {} <- {}: {} records, {} handled ({} redelivered), {} dead-lettered, \
                 {} skipped; applied {}, duplicate {}, guarded {}, ignored {}\n",
                g.service,
                g.topic,
                g.records,
                g.handled,
                g.deliveries - g.handled,
                g.dead_lettered,
                g.skipped.len(),
                g.outcome("applied"),
                g.outcome("duplicate"),
                g.outcome("guarded"),
                g.outcome("ignored"),
            ));
        }
        out.push_str(&format!(
            "absorbed   {} duplicates (guard 1), {} guarded (guard 2); {} dead letters, each of a poison record\n",
            self.duplicates(),
            self.guarded(),
            self.poison_dead_lettered
        ));
        out.push_str(&self.provider_lines());
        out.push_str(&format!(
            "violations {}\nlost: {}, applied twice: {}, charged twice: {}, refunded twice: {}\n",
            self.violations.len(),
            self.lost,
            self.applied_twice,
            self.charged_twice,
            self.refunded_twice
        ));
        println!("{out}");
        if let Ok(path) = std::env::var("SAGA_FAULT_REPORT") {
            use std::io::Write as _;
            let row = format!(
                "| {scenario} | {} ({} cancelled on request, {} refunded) | {injected} | {} ({} duplicate, {} guarded) | {} | {} | {} |\n",
                self.orders,
                self.cancellations,
                self.refunded,
                self.duplicates() + self.guarded(),
                self.duplicates(),
                self.guarded(),
                self.lost,
                self.applied_twice,
                self.charged_twice
            );
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(&path)
                .and_then(|mut f| f.write_all(row.as_bytes()))
                .unwrap_or_else(|e| panic!("{path}: {e}"));
        }
    }

    /// What the provider counted, charges and refunds, a line each.
    fn provider_lines(&self) -> String {
        let mut out = String::new();
        let stat = |name: &str| self.provider[name].as_u64().unwrap_or(0);
        let refund_stat = |name: &str| self.provider["refunds"][name].as_u64().unwrap_or(0);
        out.push_str(&format!(
            "provider   {} charge calls: {} charged, {} declined, {} replayed to a retry; {} answers lost on purpose, {} calls refused while unavailable\n",
            stat("calls"),
            stat("charged"),
            stat("declined"),
            stat("replayed"),
            stat("lost_responses"),
            stat("unavailable"),
        ));
        out.push_str(&format!(
            "           {} refund calls: {} refunded, {} replayed to a retry, {} refused (the charge had its refund); {} answers lost on purpose\n",
            refund_stat("calls"),
            refund_stat("refunded"),
            refund_stat("replayed"),
            self.refunds_refused(),
            refund_stat("lost_responses"),
        ));
        out
    }

    /// Refund calls the provider refused because the charge had its refund already
    /// (`400 charge_already_refunded`): what it neither made, replayed, nor refused as
    /// unavailable.
    pub fn refunds_refused(&self) -> u64 {
        let refunds = &self.provider["refunds"];
        let stat = |name: &str| refunds[name].as_u64().unwrap_or(0);
        stat("calls").saturating_sub(stat("refunded") + stat("replayed") + stat("unavailable"))
    }

    /// Fails the test listing every violation.
    pub fn assert_holds(&self) {
        assert!(
            self.violations.is_empty()
                && self.lost == 0
                && self.applied_twice == 0
                && self.charged_twice == 0
                && self.refunded_twice == 0,
            "{} violations (lost: {}, applied twice: {}, charged twice: {}, refunded twice: {}):\n{}",
            self.violations.len(),
            self.lost,
            self.applied_twice,
            self.charged_twice,
            self.refunded_twice,
            self.violations
                .iter()
                .take(40)
                .cloned()
                .collect::<Vec<_>>()
                .join("\n")
        );
    }
}
