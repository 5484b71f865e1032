//! Logging: structured `tracing` events to stderr, filtered by `RUST_LOG`
//! (default `info`). `LOG_FORMAT=json` switches to one JSON object per line for machines.

use std::io::IsTerminal;

use tracing_subscriber::EnvFilter;

pub fn init() {
    let filter = EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| EnvFilter::new("info,rdkafka=warn,tokio_postgres=warn"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        // Colours only for a person at a terminal: a log file must stay greppable.
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr);
    // A second init (tests start several services in one process) keeps the first.
    let _ = if std::env::var("LOG_FORMAT").as_deref() == Ok("json") {
        builder.json().try_init()
    } else {
        builder.try_init()
    };
}
