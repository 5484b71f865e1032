//! The handlers' SQL, and the pgbench scripts that run it.
//!
//! The ceiling the benchmark compares against must be the *same* transactions the services
//! commit, not a retyped copy that drifts. So each handler names its statements as
//! constants beside it (`order_service::apply_payment_result::LOCK_ORDER`,
//! `saga::inbox::CLAIM_EVENT`, …), and each script here binds values to those constants.
//! What the constants cannot say is which of them a handler runs, and in what order: so
//! the source files are compiled in (`include_str!`) and parsed with `syn`, and every
//! constant (or literal) passed to `execute`, `query`, `prepare_cached`, … inside a
//! handler's function is one statement, in source order. A call to `inbox::claim` or
//! `outbox::enqueue` stands for the statements of that function of the library.
//!
//! An order's cost is not only its transactions: ChargeOrder reads ahead before it calls
//! the card provider (autocommitted, outside its transaction), and the provider commits a
//! transaction of its own for every charge, in its own database on the same server. So the
//! `charge` script runs the intent before its `BEGIN`, and the provider's charge is a
//! transaction here like the handlers' (`provider`), part of every order's cost in the
//! end-to-end ceiling and of ChargeOrder's own. `charge without call` is the transaction
//! alone, the whole of ChargeOrder's SQL before the call, measured in the same run so that
//! what the call adds can be told from what the machine does that day.
//!
//! What the code cannot say is which values a statement is run with; each transaction
//! gives one binding per statement: the constant, and an SQL expression per `$n`. A
//! statement added to a handler, removed or swapped for another makes
//! [`Transaction::pgbench_script`] fail, and the tests with it.
//!
//! Under `sql/`: `extract` reads the statements out of the sources, `transactions` gives
//! each transaction its values, `render` writes its script, `batched` the script of a
//! consumer's batch, and `tests` is the drift check.

mod batched;
mod extract;
mod render;
mod transactions;

#[cfg(test)]
mod tests;

pub use batched::batched;
pub use extract::{
    APPLY_PAYMENT_RESULT, CHARGE_ORDER, Extracted, INBOX, NOT_BENCHMARKED, NOTIFY_CUSTOMER, ORDERS,
    OUTBOX, PROVIDER_CHARGES, SOURCES, Source, extract, functions_with_sql, one_line, relay_lock,
    relay_plan_cache_mode, relay_synchronous_commit,
};
pub use transactions::{Ahead, Binding, Database, PENDING_ORDERS, RELAY_BATCH, Transaction};
