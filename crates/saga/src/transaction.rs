//! A handler's transaction, pipelined: statements whose answer nobody reads travel with
//! the next statement that is waited for, or with `COMMIT`.
//!
//! A handler's transaction is a handful of short statements, and each one run on its own
//! costs a round trip to the server, with two hand-offs between tasks on the client: for
//! a consumer the round trips, not the statements, are most of an event's time. Two kinds
//! of statement need no answer before the next is sent:
//! - `BEGIN`, which [`Transaction::begin`] only queues: it goes out with the first
//!   statement (the inbox claim, in every handler);
//! - a write whose result the handler does not read: the state change, the outbox row.
//!   [`Transaction::pipeline`] queues it; it goes out ahead of the next statement, or
//!   with `COMMIT` if it is the last.
//!
//! The server still runs every statement in the order the handler wrote them, one after
//! the other, in the one transaction (tokio-postgres executes requests in the order they
//! are first polled, and this type polls them in the order they were queued), so a later
//! statement sees what an earlier one did and nothing about the transaction changes but
//! the waiting. What changes is where a queued write's error appears: at the next
//! statement waited for, or at the commit, in place of that statement's own result (after
//! a failed statement the server refuses the rest of the transaction, and answers
//! `COMMIT` with a rollback).
//!
//! Dropped without [`Transaction::commit`], the transaction is rolled back, like
//! tokio-postgres's own: a `ROLLBACK` is sent behind whatever is in flight, before the
//! connection goes back to the pool, and queued writes that were never sent are dropped.

use std::future::Future;
use std::pin::{Pin, pin};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};

use deadpool_postgres::Client;
use futures::future::{MaybeDone, maybe_done};
use tokio_postgres::types::ToSql;
use tokio_postgres::{Error, Row, Statement, ToStatement};

use crate::local_relay::LocalRelay;

/// A request sent (or about to be) whose answer is only checked for an error.
type Queued<'c> = Pin<Box<dyn Future<Output = Result<(), Error>> + Send + 'c>>;

/// A parameter a queued write owns: the write outlives the call that queued it.
pub type Param = Box<dyn ToSql + Sync + Send>;

/// A transaction on a pooled connection, opened by [`Transaction::begin`].
pub struct Transaction<'c> {
    client: &'c Client,
    /// Requests not yet waited for, in the order the server is to run them.
    queued: Mutex<Vec<Queued<'c>>>,
    /// Whether `BEGIN` went out, so that a drop knows whether there is anything to roll
    /// back.
    begun: AtomicBool,
    done: bool,
    /// The relay beside which this transaction runs, if any ([`Transaction::waking`]).
    relay: Option<LocalRelay>,
    /// Whether an outbox row was written without a NOTIFY, so the commit must wake the
    /// relay itself. Set by the first such row, whose `set_config` turned the NOTIFY off
    /// for the rest of the transaction, so later rows need not send it again.
    wake_relay: AtomicBool,
}

impl<'c> Transaction<'c> {
    /// Queues `BEGIN`; nothing is sent until the first statement.
    pub fn begin(client: &'c Client) -> Self {
        Self {
            client,
            queued: Mutex::new(vec![Box::pin(client.batch_execute("BEGIN"))]),
            begun: AtomicBool::new(false),
            done: false,
            relay: None,
            wake_relay: AtomicBool::new(false),
        }
    }

    /// Runs the transaction beside `relay`, this process's outbox relay: while that relay
    /// is the active one, the outbox rows this transaction writes reach it in memory, not
    /// by NOTIFY ([`LocalRelay`]). `None` leaves the NOTIFY to the outbox's trigger.
    pub fn waking(mut self, relay: Option<&LocalRelay>) -> Self {
        self.relay = relay.cloned();
        self
    }

    /// Called by [`crate::outbox::enqueue`] for each row: true for the transaction's first
    /// row written beside the active relay, which tells the trigger to skip the NOTIFY
    /// for the rest of the transaction; the commit then wakes the relay itself.
    pub(crate) fn first_row_without_notify(&self) -> bool {
        self.relay.as_ref().is_some_and(LocalRelay::is_active)
            && !self.wake_relay.swap(true, Ordering::Relaxed)
    }

    /// The statement prepared once per pooled connection (deadpool's statement cache): a
    /// statement parsed on every call costs a round trip more than it does to run.
    pub async fn prepare_cached(&self, sql: &str) -> Result<Statement, Error> {
        self.client.prepare_cached(sql).await
    }

    /// Queues a write whose result the caller does not need; it is sent with the next
    /// statement waited for, or with the commit. Its error, if any, is returned there.
    pub fn pipeline(&self, statement: Statement, params: Vec<Param>) {
        let client = self.client;
        self.lock_queue().push(Box::pin(async move {
            let params = params
                .iter()
                .map(|param| param.as_ref() as &(dyn ToSql + Sync));
            client.execute_raw(&statement, params).await.map(drop)
        }));
    }

    /// Runs a statement and returns the number of rows it changed.
    pub async fn execute<T: ?Sized + ToStatement + Sync>(
        &self,
        statement: &T,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<u64, Error> {
        self.behind_queued(self.client.execute(statement, params))
            .await
    }

    /// Runs a query expected to return exactly one row.
    pub async fn query_one<T: ?Sized + ToStatement + Sync>(
        &self,
        statement: &T,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Row, Error> {
        self.behind_queued(self.client.query_one(statement, params))
            .await
    }

    /// Runs a query expected to return at most one row.
    pub async fn query_opt<T: ?Sized + ToStatement + Sync>(
        &self,
        statement: &T,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Option<Row>, Error> {
        self.behind_queued(self.client.query_opt(statement, params))
            .await
    }

    /// Runs a query and returns its rows.
    pub async fn query<T: ?Sized + ToStatement + Sync>(
        &self,
        statement: &T,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Vec<Row>, Error> {
        self.behind_queued(self.client.query(statement, params))
            .await
    }

    /// Sends whatever is queued, then `COMMIT`, and waits for all of it: the first error
    /// is the transaction's (a commit after a failed statement is a rollback).
    pub async fn commit(mut self) -> Result<(), Error> {
        self.done = true;
        if !self.begun.load(Ordering::Relaxed) && self.lock_queue().len() == 1 {
            // Nothing but the BEGIN: no statement ran, there is nothing to commit.
            return Ok(());
        }
        self.behind_queued(self.client.batch_execute("COMMIT"))
            .await?;
        if self.wake_relay.load(Ordering::Relaxed)
            && let Some(relay) = &self.relay
        {
            relay.wake();
        }
        Ok(())
    }

    /// Sends the queued requests, in order, then `request`, and waits for all of them.
    async fn behind_queued<T>(
        &self,
        request: impl Future<Output = Result<T, Error>>,
    ) -> Result<T, Error> {
        let queued = std::mem::take(&mut *self.lock_queue());
        if queued.is_empty() {
            return request.await;
        }
        self.begun.store(true, Ordering::Relaxed);
        let mut queued: Vec<MaybeDone<Queued<'c>>> = queued.into_iter().map(maybe_done).collect();
        let mut request = pin!(maybe_done(request));
        std::future::poll_fn(|cx: &mut Context<'_>| {
            // Every poll goes through them in order, so each is first polled, and so
            // sent, after the ones before it.
            let mut ready = true;
            for queued in &mut queued {
                ready &= Pin::new(queued).poll(cx).is_ready();
            }
            ready &= request.as_mut().poll(cx).is_ready();
            if ready {
                Poll::Ready(())
            } else {
                Poll::Pending
            }
        })
        .await;
        let mut first_error = None;
        for queued in &mut queued {
            if let Some(Err(error)) = Pin::new(queued).take_output() {
                first_error.get_or_insert(error);
            }
        }
        let result = request
            .as_mut()
            .take_output()
            .expect("polled to completion above");
        match first_error {
            Some(error) => Err(error),
            None => result,
        }
    }

    fn lock_queue(&self) -> std::sync::MutexGuard<'_, Vec<Queued<'c>>> {
        // Never held across an await, and nothing in it panics.
        self.queued
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

impl Drop for Transaction<'_> {
    fn drop(&mut self) {
        if self.done || !self.begun.load(Ordering::Relaxed) {
            return;
        }
        // Polled once to send it: tokio-postgres sends a request on its first poll, and
        // the connection runs it behind everything sent before, whatever becomes of the
        // future. The answer is not waited for, as in tokio-postgres's own transaction.
        let rollback = pin!(self.client.batch_execute("ROLLBACK"));
        let _ = rollback.poll(&mut Context::from_waker(std::task::Waker::noop()));
    }
}
