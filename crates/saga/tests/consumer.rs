//! The consumer loop against the real broker, with handlers that record what they see
//! and misbehave on cue.

#[path = "consumer/batches.rs"]
mod batches;
#[path = "consumer/failures.rs"]
mod failures;
#[path = "consumer/liveness.rs"]
mod liveness;
#[path = "consumer/order.rs"]
mod order;
#[path = "consumer/rebalance.rs"]
mod rebalance;
#[path = "consumer/recorder.rs"]
mod recorder;
#[path = "consumer/run.rs"]
mod run;
