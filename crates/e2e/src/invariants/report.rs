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
             placed once; one terminal status each, the right one; one payment, one outcome event, one notification each, matching; \
             every outbox row published; inboxes agree with the logs; no record skipped; dead \
             letters exactly the poison\n",
            self.orders, self.confirmed, self.cancelled, self.pending
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
        let stat = |name: &str| self.provider[name].as_u64().unwrap_or(0);
        out.push_str(&format!(
            "provider   {} calls: {} charged, {} declined, {} replayed to a retry; {} answers lost on purpose, {} calls refused while unavailable\n",
            stat("calls"),
            stat("charged"),
            stat("declined"),
            stat("replayed"),
            stat("lost_responses"),
            stat("unavailable"),
        ));
        out.push_str(&format!(
            "violations {}\nlost: {}, applied twice: {}, charged twice: {}\n",
            self.violations.len(),
            self.lost,
            self.applied_twice,
            self.charged_twice
        ));
        println!("{out}");
        if let Ok(path) = std::env::var("SAGA_FAULT_REPORT") {
            use std::io::Write as _;
            let row = format!(
                "| {scenario} | {} | {injected} | {} ({} duplicate, {} guarded) | {} | {} | {} |\n",
                self.orders,
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

    /// Fails the test listing every violation.
    pub fn assert_holds(&self) {
        assert!(
            self.violations.is_empty()
                && self.lost == 0
                && self.applied_twice == 0
                && self.charged_twice == 0,
            "{} violations (lost: {}, applied twice: {}, charged twice: {}):\n{}",
            self.violations.len(),
            self.lost,
            self.applied_twice,
            self.charged_twice,
            self.violations
                .iter()
                .take(40)
                .cloned()
                .collect::<Vec<_>>()
                .join("\n")
        );
    }
}
