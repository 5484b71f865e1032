//! The benchmark behind `scripts/bench`: how close the saga gets to what PostgreSQL
//! itself can commit on the same machine, in the same run.
//!
//! - [`load`]: the load generator, closed-loop (fixed concurrency) and open-loop (fixed
//!   rate), over the order API.
//! - [`measure`]: what the saga did with those orders, from the services' databases:
//!   rates, latencies, and that every order took effect exactly once.
//! - [`sql`]: the handlers' SQL read out of their source files, and the card provider's,
//!   and the pgbench scripts made from it, so the ceiling runs the very statements the
//!   services run.
//! - [`pgbench`]: runs those scripts at the services' connection counts.
//! - [`procs`]: the services (and the provider) as processes: start, stop, CPU time and
//!   peak memory.
//! - [`db`]: the benchmark's own databases, fresh each run.
//! - [`run`]: the phases of a run; [`report`]: its JSON, markdown table and chart.
//!
//! Nothing here runs under `cargo test` but quick unit checks: timings are never
//! asserted, and the benchmark itself runs only from `scripts/bench`.

pub mod db;
pub mod load;
pub mod measure;
pub mod pgbench;
pub mod procs;
pub mod report;
pub mod run;
pub mod sql;
