//! Services that die on purpose, and the harness that restarts them, the way a
//! supervisor (systemd, Kubernetes) would.
//!
//! [`Crashes`] arms one failpoint in some services so that each aborts after a number
//! of hits; [`settle`] restarts every instance the failpoint killed (armed again until it
//! has died often enough), and fails the test if anything else died: whatever the world
//! does, a service must not exit on its own.

use std::collections::BTreeMap;
use std::time::Duration;

use saga_testkit::eventually;

use crate::load::Load;
use crate::{Stack, describe_exit, invariants};

/// A failpoint that aborts each armed service every `every + 1` hits, until it has done
/// so `per_service` times.
pub struct Crashes {
    pub failpoint: &'static str,
    /// Hits let through before each abort.
    pub every: usize,
    /// Aborts wanted per service.
    pub per_service: usize,
    services: Vec<&'static str>,
    /// Aborts seen, per service.
    pub kills: BTreeMap<&'static str, usize>,
    pub restarts: usize,
    /// Check [`invariants::half_applied`] while each killed service is still down.
    pub check_while_down: bool,
    /// What those checks found.
    pub violations: Vec<String>,
}

impl Crashes {
    pub fn new(
        failpoint: &'static str,
        every: usize,
        per_service: usize,
        services: &[&'static str],
    ) -> Self {
        Self {
            failpoint,
            every,
            per_service,
            services: services.to_vec(),
            kills: services.iter().map(|s| (*s, 0)).collect(),
            restarts: 0,
            check_while_down: false,
            violations: Vec::new(),
        }
    }

    /// The `FAILPOINTS` value: let `every` hits pass, abort at the next.
    pub fn spec(&self) -> String {
        format!("{}={}*off->return", self.failpoint, self.every)
    }

    /// The services to arm at start, for [`Stack::start_with`].
    pub fn armed(&self) -> Vec<(&'static str, String)> {
        self.services.iter().map(|s| (*s, self.spec())).collect()
    }

    pub fn total(&self) -> usize {
        self.kills.values().sum()
    }

    /// E.g. `6 aborts at consumer.after-handler (order-service 2, …), 6 restarts`.
    pub fn describe(&self) -> String {
        let per: Vec<String> = self.kills.iter().map(|(s, n)| format!("{s} {n}")).collect();
        format!(
            "{} aborts at {} ({}), {} restarts",
            self.total(),
            self.failpoint,
            per.join(", "),
            self.restarts
        )
    }

    /// Fails the test unless every armed service died as often as planned: a scenario
    /// whose fault never fired proves nothing.
    pub fn assert_all_fired(&self) {
        for (service, n) in &self.kills {
            assert_eq!(
                *n, self.per_service,
                "{service} was to abort {} times at {}: raise SAGA_FAULT_ORDERS or lower the kills",
                self.per_service, self.failpoint
            );
        }
    }
}

/// Restarts whatever the armed failpoint killed; fails the test if an instance died any
/// other way.
pub async fn tend(stack: &mut Stack, mut crashes: Option<&mut Crashes>) {
    for instance in stack.running() {
        let Some(status) = stack.exited(&instance) else {
            continue;
        };
        let service = stack.instances()[&instance];
        let mut status = Some(status);
        while let Some(exit) = status {
            let crashes = crashes
                .as_deref_mut()
                .filter(|c| c.kills.contains_key(service));
            let fired = stack
                .log(&instance)
                .matches("failpoint reached: aborting the process")
                .count();
            let Some(crashes) = crashes.filter(|c| fired > c.kills[service]) else {
                let log = stack.log(&instance);
                let tail: Vec<&str> = log.lines().rev().take(30).collect();
                panic!(
                    "{instance} exited on its own ({}); its last log lines, newest first:\n{}",
                    describe_exit(exit),
                    tail.join("\n")
                );
            };
            assert_eq!(
                describe_exit(exit),
                "signal 6 (SIGABRT)",
                "{instance} reached {} but did not abort",
                crashes.failpoint
            );
            *crashes.kills.get_mut(service).unwrap() += 1;
            if crashes.check_while_down {
                crashes
                    .violations
                    .extend(invariants::half_applied(stack).await);
            }
            let arm = (crashes.kills[service] < crashes.per_service).then(|| crashes.spec());
            crashes.restarts += 1;
            status = stack
                .start_instance(service, &instance, arm.as_deref())
                .await;
        }
    }
}

/// Keeps restarting what the failpoint kills until the load is placed and the saga is
/// quiet (see [`invariants::quiet`]), or fails the test after `timeout`.
pub async fn settle(
    stack: &mut Stack,
    load: Option<&Load>,
    crashes: Option<&mut Crashes>,
    timeout: Duration,
) {
    settle_after(
        stack,
        || load.is_some_and(|l| !l.is_finished()),
        crashes,
        timeout,
    )
    .await;
}

/// Keeps restarting what the failpoint kills until `busy` (the scenario's own work, in
/// the background) says it is done and the saga is quiet, or fails the test after
/// `timeout`.
pub async fn settle_after(
    stack: &mut Stack,
    busy: impl Fn() -> bool,
    crashes: Option<&mut Crashes>,
    timeout: Duration,
) {
    let state = tokio::sync::Mutex::new((stack, crashes));
    let busy = &busy;
    eventually(
        timeout,
        "the load to be placed and the saga to go quiet",
        || {
            let state = &state;
            async move {
                let mut state = state.lock().await;
                let (stack, crashes) = &mut *state;
                tend(stack, crashes.as_deref_mut()).await;
                if busy() {
                    return None;
                }
                invariants::quiet(stack).await.then_some(())
            }
        },
    )
    .await;
}
