//! docker-compose.yml against the code and the native scripts (scripts/lib.sh): both
//! setups must run the same binaries with settings the binaries understand, on the same
//! ports, with the same topics and databases; and docker-compose.cluster.yml against the
//! native three-node cluster (scripts/infra-up --brokers 3), and docker-compose.sasl.yml
//! against the native broker's SASL_SSL listener. Nothing here needs Docker or the
//! infrastructure: the files are parsed, and each binary's `--help` says what it reads.
//!
//! The binaries must be built first (`cargo build --bins`; `scripts/test` does it).

use std::path::Path;

// What the compose files are held to, one file each under compose/ (a test target's root
// takes its modules from tests/ itself, hence the paths); then how the files, scripts/lib.sh
// and the binaries are read.
#[path = "compose/cluster.rs"]
mod cluster;
#[path = "compose/kafka.rs"]
mod kafka;
#[path = "compose/monitoring.rs"]
mod monitoring;
#[path = "compose/ports.rs"]
mod ports;
#[path = "compose/postgres.rs"]
mod postgres;
#[path = "compose/sasl.rs"]
mod sasl;
#[path = "compose/services.rs"]
mod services;
#[path = "compose/tracing.rs"]
mod tracing;

#[path = "compose/binaries.rs"]
mod binaries;
#[path = "compose/lib_sh.rs"]
mod lib_sh;
#[path = "compose/yaml.rs"]
mod yaml;

const DOCKERFILE: &str = "deploy/Dockerfile";

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}
