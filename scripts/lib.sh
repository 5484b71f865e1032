# shellcheck shell=bash
# Shared settings and helpers for the scripts in this folder. Sourced, never run.
#
# Every path is derived from this file's location, so the scripts work from any
# working directory and from any clone (CI uses a fresh one in another folder).
#
# The settings are read by the scripts that source this file, hence:
# shellcheck disable=SC2034

set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

log() {
  printf '[order-saga] %s\n' "$*" >&2
}

die() {
  log "error: $*"
  exit 1
}

# Runtime state (pid files, broker data, logs). Overridable so that several
# checkouts, or a test harness, can keep their state apart.
RUN_DIR="${SAGA_RUN_DIR:-$ROOT/.run}"
# Downloads that survive `infra-down` and can be deleted at any time.
CACHE_DIR="$ROOT/.cache"

# Newest 4.x release that is both on Maven Central and published as the
# apache/kafka:<version> image, so a containerised setup can run the same broker.
# SAGA_KAFKA_VERSION exists only to try another release without editing this file.
KAFKA_VERSION="${SAGA_KAFKA_VERSION:-4.3.1}"
KAFKA_HOME="$CACHE_DIR/kafka-$KAFKA_VERSION"
KAFKA_LIBS="$KAFKA_HOME/libs"
KAFKA_HOST=127.0.0.1
KAFKA_PORT=9092
# The single broker's second client listener: SASL_SSL, for trying the services
# over TLS with a login (SCRAM-SHA-256, SCRAM-SHA-512 or PLAIN). Its CA is
# $KAFKA_TLS_DIR/ca.pem. Each service logs in as the user of its name, one of the
# chart's example users ($KAFKA_USERS_FILE), which may do what the example says
# and nothing more; $KAFKA_SASL_DENIED_USER may log in and do nothing. All have
# the password $KAFKA_SASL_PASSWORD. No user of this listener is a super user.
KAFKA_SASL_PORT=9094
KAFKA_TLS_DIR="$RUN_DIR/kafka-tls"
KAFKA_SASL_DENIED_USER=saga-denied
KAFKA_USERS_FILE="$ROOT/deploy/helm/examples/kafka-users.yaml"
KAFKA_SASL_PASSWORD="${KAFKA_SASL_PASSWORD:-saga-kafka-pw}"
# Kafka runs in one of two modes, chosen with the scripts' --brokers N (or
# SAGA_KAFKA_BROKERS, which --brokers sets for whatever a script starts):
#   1  the default: one broker on $KAFKA_PORT (deploy/kafka/server.properties),
#      every topic with one replica;
#   3  a cluster of three KRaft nodes, each a broker and a controller, on ports
#      of their own (kafka_node_port) so that it can run beside the single
#      broker; every topic with three replicas, two of which must hold a record
#      before it is acknowledged (deploy/kafka/cluster.properties).
KAFKA_CLUSTER_NODES=(1 2 3)

# The client port and the controller port of node N of the cluster.
kafka_node_port() {
  echo $((9092 + 100 * $1))
}
kafka_node_controller_port() {
  echo $((9093 + 100 * $1))
}

# Sets KAFKA_BROKER_COUNT and KAFKA_BOOTSTRAP (what every client is given: the
# single broker, or the list of the cluster's three) for mode N.
kafka_mode() {
  case "$1" in
    1) KAFKA_BOOTSTRAP="$KAFKA_HOST:$KAFKA_PORT" ;;
    3)
      local node addresses=()
      for node in "${KAFKA_CLUSTER_NODES[@]}"; do
        addresses+=("$KAFKA_HOST:$(kafka_node_port "$node")")
      done
      KAFKA_BOOTSTRAP="$(IFS=,; echo "${addresses[*]}")"
      ;;
    *) die "--brokers takes 1 (one broker) or 3 (a three-node cluster), not '$1'" ;;
  esac
  KAFKA_BROKER_COUNT=$1
  export SAGA_KAFKA_BROKERS=$1
}

# Where one Kafka process keeps its state: NODE empty for the single broker, or
# the node's number. Sets KAFKA_PID_FILE, KAFKA_STDOUT, KAFKA_DIR, KAFKA_DATA,
# KAFKA_CONFIG and KAFKA_NODE_PORT.
kafka_paths() {
  local node="${1:-}" name=kafka
  KAFKA_NODE_PORT=$KAFKA_PORT
  if [[ -n "$node" ]]; then
    name="kafka-node-$node"
    KAFKA_NODE_PORT="$(kafka_node_port "$node")"
  fi
  KAFKA_PID_FILE="$RUN_DIR/$name.pid"
  KAFKA_STDOUT="$RUN_DIR/$name.log"
  KAFKA_DIR="$RUN_DIR/$name"
  KAFKA_DATA="$KAFKA_DIR/data"
  KAFKA_CONFIG="$KAFKA_DIR/server.properties"
}

# The mode the environment asks for; a script's --brokers may switch it.
kafka_mode "${SAGA_KAFKA_BROKERS:-1}"

# scripts/up --with-prometheus; the compose stack's Prometheus has the same port.
PROMETHEUS_PORT=9090

PG_HOST="${PG_HOST:-127.0.0.1}"
PG_PORT="${PG_PORT:-5432}"
# The administrator: what these scripts, the walkthrough's psql and the tests log
# in as. It may create databases (each test makes its own) and is a member of every
# service's role, so it can make a database for a service and read and change its
# tables; no service ever logs in as it.
PG_USER=saga
PG_PASSWORD="${PG_PASSWORD:-saga}"
PG_DATABASES=(orders payments notifications provider)

# Every topic the services use, with the dead-letter topic of each consumer
# (named <source topic>.<consuming service>.dlq). The broker refuses to
# auto-create topics, so this list is the single place where they come from.
KAFKA_TOPICS=(
  orders
  payments
  notifications
  orders.payment-service.dlq
  payments.order-service.dlq
  orders.notification-service.dlq
)
# Partitions per topic: a consumer group runs at most this many copies of a
# service in parallel (each partition is read by one member). The tests read it too.
KAFKA_TOPIC_PARTITIONS="${KAFKA_TOPIC_PARTITIONS:-3}"
export KAFKA_TOPIC_PARTITIONS

# wait_until TIMEOUT_SECONDS DESCRIPTION COMMAND...
# Polls COMMAND every 0.5 s until it succeeds; fails naming DESCRIPTION once
# TIMEOUT_SECONDS have passed. Waiting on the real condition rather than a fixed
# sleep keeps the fast path fast and the slow path (a cold 2-core CI box) correct.
wait_until() {
  local timeout="$1" description="$2"
  shift 2
  local deadline=$((SECONDS + timeout))
  until "$@"; do
    if ((SECONDS >= deadline)); then
      log "error: timed out after ${timeout}s waiting for $description"
      return 1
    fi
    sleep 0.5
  done
}

# True when something accepts TCP connections on HOST:PORT. Uses bash's
# /dev/tcp so no extra package (nc, ss) is needed on a fresh machine.
tcp_open() {
  local host="$1" port="$2"
  # shellcheck disable=SC2016 # $1 and $2 expand in the inner bash.
  timeout 2 bash -c 'exec 3<>"/dev/tcp/$1/$2"' _ "$host" "$port" 2>/dev/null
}

require_command() {
  local cmd="$1" hint="$2"
  command -v "$cmd" >/dev/null 2>&1 || die "'$cmd' not found on PATH: $hint"
}

# check_prerequisites up|test: what the command needs and does not install itself,
# checked before anything starts, with one message naming each thing missing and the
# Debian 12 package (or the place) it comes from. `up` builds the Rust binaries (a C
# toolchain, pkg-config and OpenSSL's headers for librdkafka and openssl-sys) and runs
# Kafka and Maven; `test` also installs tools from PyPI and npm, and builds helm and the
# trace viewer's collector with Go unless .cache holds them already.
check_prerequisites() {
  local absent=()
  local have
  have() { command -v "$1" >/dev/null 2>&1; }
  have cargo || absent+=("cargo: Rust, stable, from https://rustup.rs")
  have cc || absent+=("cc: apt-get install -y build-essential")
  have make || absent+=("make: apt-get install -y build-essential")
  have pkg-config || absent+=("pkg-config: apt-get install -y pkg-config")
  if have pkg-config && ! pkg-config --exists openssl; then
    absent+=("OpenSSL's headers: apt-get install -y libssl-dev")
  fi
  have curl || absent+=("curl: apt-get install -y curl")
  have jq || absent+=("jq: apt-get install -y jq")
  have openssl || absent+=("openssl: apt-get install -y openssl")
  have mvn || absent+=("mvn: apt-get install -y maven")
  if ! have java; then
    absent+=("java: Java 17, apt-get install -y openjdk-17-jdk-headless")
  elif (($(java_major) < 17)); then
    absent+=("Java 17 or newer (found $(java_major)): apt-get install -y openjdk-17-jdk-headless")
  fi
  if [[ "$1" == test ]]; then
    have git || absent+=("git: apt-get install -y git")
    have python3 || absent+=("python3: apt-get install -y python3 python3-venv")
    if have python3 && ! python3 -c 'import ensurepip, venv' 2>/dev/null; then
      absent+=("python3's venv: apt-get install -y python3-venv")
    fi
    have node || absent+=("node: Node.js 18 or newer, apt-get install -y nodejs")
    have npm || absent+=("npm: apt-get install -y npm")
    if go_needed; then
      [[ -x /usr/local/go/bin/go ]] && PATH="$PATH:/usr/local/go/bin"
      if ! have go; then
        absent+=("go: Go 1.26 or newer, from https://go.dev/doc/install (Debian 12's golang is 1.19), for helm and the trace viewer's collector")
      elif ! go_at_least 1.26; then
        absent+=("Go 1.26 or newer (found $(go env GOVERSION)): from https://go.dev/doc/install")
      fi
    fi
  fi
  ((${#absent[@]} == 0)) && return 0
  log "scripts/$1 needs, and will not install itself:"
  printf '  - %s\n' "${absent[@]}" >&2
  die "install what is listed above (as root on Debian 12), then run scripts/$1 again"
}

java_major() {
  java -version 2>&1 | sed -nE '1s/.*version "(1\.)?([0-9]+).*/\2/p'
}

# Whether helm or the collector is still to be built (each is built once into .cache).
go_needed() {
  ! marker_holds "$HELM_DIR/.installed" "$HELM_VERSION" || [[ ! -x "$OTELCOL_BIN" ]]
}

go_at_least() {
  local version
  version="$(go env GOVERSION 2>/dev/null)"
  version="${version#go}"
  [[ "$(printf '%s\n%s\n' "$1" "$version" | sort -V | head -1)" == "$1" ]]
}

# Debian's promtool (in its prometheus package), for scripts/check-alerts and
# `scripts/up --with-prometheus`: installed once.
ensure_promtool() {
  command -v promtool >/dev/null 2>&1 && command -v prometheus >/dev/null 2>&1 && return 0
  log "installing Debian's prometheus package (prometheus and promtool)"
  apt-get update -q >&2
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends prometheus >&2
}

# Debian's chromium and its WebDriver, for the test that opens sagactl's page in
# a browser: installed once, never downloaded by the test itself.
ensure_browser() {
  command -v chromium >/dev/null 2>&1 && command -v chromedriver >/dev/null 2>&1 && return 0
  log "installing Debian's chromium and chromium-driver (for the browser test)"
  apt-get update -q >&2
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium chromium-driver >&2
}

# Debian's PgBouncer, for the test that a pooler in transaction mode is refused.
# Its packaged server stays stopped: the test starts one of its own.
ensure_pgbouncer() {
  command -v pgbouncer >/dev/null 2>&1 || [[ -x /usr/sbin/pgbouncer ]] && return 0
  log "installing Debian's pgbouncer (for the connection pooler test)"
  apt-get update -q >&2
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q pgbouncer >&2
  if command -v service >/dev/null 2>&1; then
    service pgbouncer stop >/dev/null 2>&1 || true
  fi
}

# True when MARKER holds VALUE: written last, it says which download completed.
marker_holds() {
  [[ -f "$1" && "$(<"$1")" == "$2" ]]
}

# A tool from PyPI, pinned, in a virtual environment of its own under .cache,
# installed once per version: ensure_pypi_tool PACKAGE VERSION VENV.
ensure_pypi_tool() {
  local package="$1" version="$2" venv="$3"
  local marker="$venv/.installed"
  marker_holds "$marker" "$version" && return 0
  require_command python3 "apt-get install -y python3 python3-venv"
  log "installing $package $version from PyPI into $venv"
  rm -rf "$venv"
  python3 -m venv "$venv" ||
    die "python3 cannot make a virtual environment (apt-get install -y python3-venv)"
  "$venv/bin/pip" install -q "$package==$version" >&2
  printf '%s\n' "$version" >"$marker"
}

# A package from the npm registry, pinned, in a folder of its own under .cache,
# installed once per version: ensure_npm_tool PACKAGE VERSION DIR. Once there,
# nothing is fetched again, so the scripts using it work offline.
ensure_npm_tool() {
  local package="$1" version="$2" dir="$3"
  local marker="$dir/.installed"
  marker_holds "$marker" "$version" && return 0
  require_command npm "apt-get install -y nodejs npm"
  log "installing $package $version from the npm registry into $dir"
  rm -rf "$dir"
  mkdir -p "$dir"
  npm install --prefix "$dir" --no-audit --no-fund --no-save --loglevel=error \
    "$package@$version" >&2
  printf '%s\n' "$version" >"$marker"
}

# schemathesis, for the order API's contract test (crates/e2e/tests/contract.rs).
SCHEMATHESIS_VERSION=4.32.5
SCHEMATHESIS_VENV="$CACHE_DIR/schemathesis"
ensure_schemathesis() {
  ensure_pypi_tool schemathesis "$SCHEMATHESIS_VERSION" "$SCHEMATHESIS_VENV"
}

# True when PID_FILE names a live process whose command line contains PATTERN.
# The pattern guards against a recycled pid after a reboot or a crash.
pid_file_alive() {
  local pid_file="$1" pattern="$2" pid
  [[ -s "$pid_file" ]] || return 1
  pid="$(<"$pid_file")"
  [[ "$pid" =~ ^[0-9]+$ ]] || return 1
  [[ -r "/proc/$pid/cmdline" ]] || return 1
  tr '\0' ' ' <"/proc/$pid/cmdline" | grep -qF -- "$pattern"
}

# stop_process NAME PID: asks PID (NAME, in the log) to stop with SIGTERM, on
# which a service finishes the record in hand and commits its offsets. Kills it
# if it has not exited within 30 s.
stop_process() {
  local name="$1" pid="$2"
  kill -TERM "$pid" 2>/dev/null || return 0
  if ! wait_until 30 "$name to exit" process_exited "$pid"; then
    log "$name ignored SIGTERM; killing it"
    kill -KILL "$pid" 2>/dev/null || true
  fi
}

process_exited() {
  ! kill -0 "$1" 2>/dev/null
}

# Fetches the broker and CLI jars from Maven Central into $KAFKA_LIBS, once.
# The marker records the POM's checksum: it is written only after a complete
# copy (so an interrupted download is redone) and a changed POM refetches.
ensure_kafka_jars() {
  local pom="$ROOT/deploy/kafka/pom.xml"
  local marker="$KAFKA_HOME/.libs-complete"
  local want
  want="$(sha256sum "$pom" | cut -d' ' -f1) $KAFKA_VERSION"
  marker_holds "$marker" "$want" && return 0

  mkdir -p "$KAFKA_HOME"
  # Two scripts started together (infra-up and a kafka-* wrapper) must not
  # both write into libs/; the second one waits and then finds the marker.
  local lock_fd
  exec {lock_fd}>"$KAFKA_HOME/.fetch.lock"
  flock "$lock_fd"
  if marker_holds "$marker" "$want"; then
    exec {lock_fd}>&-
    return 0
  fi

  require_command mvn "install Maven (apt-get install -y maven)"
  require_command java "install Java 17 (apt-get install -y openjdk-17-jdk-headless)"
  log "fetching Apache Kafka $KAFKA_VERSION jars from Maven Central into $KAFKA_LIBS"
  rm -rf "$KAFKA_LIBS" "$marker"
  # Output to a file, shown only on failure: even with -B -q, Debian's Maven
  # 3.8 prints stray terminal colour codes.
  if ! mvn -B -q -f "$pom" \
    -Dkafka.version="$KAFKA_VERSION" \
    dependency:copy-dependencies \
    -DincludeScope=runtime \
    -DoutputDirectory="$KAFKA_LIBS" >"$KAFKA_HOME/fetch.log" 2>&1; then
    cat "$KAFKA_HOME/fetch.log" >&2
    die "could not fetch the Kafka $KAFKA_VERSION jars with Maven (output above)"
  fi
  printf '%s\n' "$want" >"$marker"
  exec {lock_fd}>&-
}

# The Java helpers of deploy/kafka (EnsureTopics, KafkaUsers), compiled once
# into the cache: launching a .java file directly would compile it at every run
# (about 1.5 s).
KAFKA_HELPER_CLASSES="$KAFKA_HOME/classes"

helpers_compiled() {
  local src
  for src in "$ROOT"/deploy/kafka/*.java; do
    [[ "$KAFKA_HELPER_CLASSES/$(basename "$src" .java).class" -nt "$src" ]] || return 1
  done
}

compile_kafka_helpers() {
  helpers_compiled && return 0
  # Tests run kafka-tool from several threads at once: one compiles, the others
  # wait and then find the classes.
  local lock_fd
  mkdir -p "$KAFKA_HOME"
  exec {lock_fd}>"$KAFKA_HOME/.compile.lock"
  flock "$lock_fd"
  if ! helpers_compiled; then
    require_command javac "install a Java 17 JDK (apt-get install -y openjdk-17-jdk-headless)"
    rm -rf "$KAFKA_HELPER_CLASSES.tmp"
    javac -nowarn -d "$KAFKA_HELPER_CLASSES.tmp" -cp "$KAFKA_LIBS/*" "$ROOT"/deploy/kafka/*.java
    rm -rf "$KAFKA_HELPER_CLASSES"
    mv "$KAFKA_HELPER_CLASSES.tmp" "$KAFKA_HELPER_CLASSES"
  fi
  exec {lock_fd}>&-
}

# kafka_java_cmd [EXTRA_CLASSPATH]
# Fills the array KAFKA_JAVA with a java command line that runs classes from
# the cached Kafka jars with the CLI logging setup; append CLASS and ARGS.
# An array rather than a function so that callers can `exec` it: signals such
# as Ctrl-C then reach the JVM directly.
# shellcheck disable=SC2120 # the argument is optional
kafka_java_cmd() {
  # The quoted glob is expanded by the JVM, not by bash.
  local classpath="$KAFKA_LIBS/*"
  if (($#)); then
    classpath="$1:$classpath"
  fi
  # Short-lived tools start markedly faster with the C1 compiler only and the
  # serial collector (about 2.4 s instead of 3.5 s for `kafka-topics --list`
  # on two cores); neither matters for a few seconds of work.
  KAFKA_JAVA=(
    java -Xmx256m
    -XX:+UseSerialGC -XX:TieredStopAtLevel=1
    -Djava.awt.headless=true
    -Dlog4j2.configurationFile="$ROOT/deploy/kafka/tools-log4j2.properties"
    -cp "$classpath"
  )
}

# The services: binary name, database, HTTP port. The same names, ports and
# environment variables as docker-compose.yml. payment-provider is the stand-in
# card processor payment-service calls; it comes first so that it is up when the
# first charge is asked for (payment-service waits it out if it is not).
SERVICES=(payment-provider order-service payment-service notification-service)

service_database() {
  case "$1" in
    order-service) echo orders ;;
    payment-service) echo payments ;;
    notification-service) echo notifications ;;
    payment-provider) echo provider ;;
    *) die "no service $1" ;;
  esac
}

service_port() {
  case "$1" in
    order-service) echo 8080 ;;
    payment-service) echo 8081 ;;
    notification-service) echo 8082 ;;
    payment-provider) echo 8083 ;;
    *) die "no service $1" ;;
  esac
}

# The role SERVICE logs in as: it owns the service's database and nothing else (no
# superuser, no CREATEDB, no CONNECT on any other service's database).
service_role() {
  case "$1" in
    order-service) echo order_service ;;
    payment-service) echo payment_service ;;
    notification-service) echo notification_service ;;
    payment-provider) echo payment_provider ;;
    *) die "no service $1" ;;
  esac
}

# The read-only role of DATABASE (sagactl's): it may connect to that database alone.
reader_role() {
  echo "${1}_reader"
}

# The demo's passwords for the services' roles (service_role) and the databases'
# read-only roles (reader_role): PG_PASSWORD_<ROLE IN CAPITALS> overrides each,
# e.g. PG_PASSWORD_ORDER_SERVICE; the default is the role's name and "-pw".
role_password() {
  local var="PG_PASSWORD_${1^^}"
  printf '%s' "${!var:-$1-pw}"
}

# pg_url DATABASE [ROLE]: the administrator's URL, or ROLE's.
pg_url() {
  local user="${2:-$PG_USER}" password="$PG_PASSWORD"
  [[ -z "${2:-}" ]] || password="$(role_password "$2")"
  printf 'postgres://%s:%s@%s:%s/%s' "$user" "$password" "$PG_HOST" "$PG_PORT" "$1"
}

# What SERVICE is started with: its own role on its own database.
service_url() {
  pg_url "$(service_database "$1")" "$(service_role "$1")"
}

service_healthy() {
  curl -fsS -o /dev/null --max-time 2 "http://127.0.0.1:$(service_port "$1")/health"
}

# drop_database NAME: drops NAME if it exists, ending the sessions on it that
# the administrator may end first (a test or service killed mid-run leaves some).
# Not `WITH (FORCE)`: that refuses to end an autovacuum worker unless run by a
# superuser, and one is often cleaning up after a test's or the benchmark's
# mass delete. A plain DROP ends autovacuum itself and waits up to five
# seconds for the sessions ended here to go.
drop_database() {
  if ! psql -X -q -v ON_ERROR_STOP=1 -v database="$1" "$(pg_url postgres)" >/dev/null <<'SQL'
SELECT pg_terminate_backend(pid) FROM pg_stat_activity
 WHERE datname = :'database' AND pid <> pg_backend_pid() AND pg_has_role(usesysid, 'MEMBER');
DROP DATABASE IF EXISTS :"database";
SQL
  then
    die "cannot drop database $1 (see psql's error above)"
  fi
}

# Drops the databases (saga_test_*) and topics (t<id>.*) that tests leave
# behind. Only while no test runs: they are some test's own.
remove_test_leftovers() {
  log "removing databases and topics left by earlier test runs"
  drop_test_databases
  delete_test_topics
}

drop_test_databases() {
  psql -X -q -At "$(pg_url postgres)" \
    -c "SELECT datname FROM pg_database WHERE datname LIKE 'saga\_test\_%'" |
    while read -r database; do
      drop_database "$database"
    done
}

# Listed first: kafka-topics --delete fails when its pattern matches no topic.
delete_test_topics() {
  if "$ROOT/scripts/kafka-topics" --bootstrap-server "$KAFKA_BOOTSTRAP" --list | grep -qE '^t[0-9a-f]{12}\.'; then
    "$ROOT/scripts/kafka-topics" --bootstrap-server "$KAFKA_BOOTSTRAP" --delete --topic 't[0-9a-f]{12}\..*'
  fi
}

# Helm, for scripts/check-chart: built from its Go module (the Go module proxy is the
# registry this machine and CI reach; no release binary is downloaded) into .cache,
# once per version. The module cache and build cache are Go's own, under $HOME.
HELM_VERSION=v4.3.2
HELM_DIR="$CACHE_DIR/helm-$HELM_VERSION"
HELM="$HELM_DIR/bin/helm"
ensure_helm() {
  local marker="$HELM_DIR/.installed"
  marker_holds "$marker" "$HELM_VERSION" && return 0
  # Go's own installer puts it here; a login shell's PATH may not say so.
  [[ -x /usr/local/go/bin/go ]] && PATH="$PATH:/usr/local/go/bin"
  require_command go "install Go 1.26 or newer: Helm $HELM_VERSION needs it (Debian 12's golang is older)"
  log "building helm $HELM_VERSION from the Go module proxy into $HELM_DIR (a few minutes, once)"
  rm -rf "$HELM_DIR"
  mkdir -p "$HELM_DIR/bin"
  GOBIN="$HELM_DIR/bin" GOFLAGS=-buildvcs=false go install "helm.sh/helm/v4/cmd/helm@$HELM_VERSION" >&2
  printf '%s\n' "$HELM_VERSION" >"$marker"
}

# kubernetes-validate, for scripts/check-chart: the Kubernetes API's JSON schemas,
# bundled for each release from 1.25 to 1.37, checked offline.
KUBERNETES_VALIDATE_VERSION=1.37.0
KUBERNETES_VALIDATE_VENV="$CACHE_DIR/kubernetes-validate"
ensure_kubernetes_validate() {
  ensure_pypi_tool kubernetes-validate "$KUBERNETES_VALIDATE_VERSION" "$KUBERNETES_VALIDATE_VENV"
}

# The trace viewer (scripts/up --with-tracing, and the tests that read traces):
# Zipkin, which stores spans in memory and shows them at /zipkin/, and in front
# of it an OpenTelemetry Collector built from deploy/otelcol, which takes the
# services' OTLP over HTTP and passes it on in Zipkin's format. Zipkin's own
# OTLP module is not published for its current release, hence the collector.
# docs/running.md, "Traces", says more.
OTELCOL_VERSION=0.148.0
OTELCOL_BIN="$CACHE_DIR/otelcol-$OTELCOL_VERSION/otelcol-saga"
OTELCOL_CONFIG="$ROOT/deploy/otelcol/config.yaml"
OTELCOL_PORT=4318
ZIPKIN_VERSION=3.5.1
ZIPKIN_JAR="$CACHE_DIR/zipkin-$ZIPKIN_VERSION/zipkin-server.jar"
ZIPKIN_PORT=9411

# Builds the collector from deploy/otelcol's go.mod and go.sum with the Go
# module proxy, once: the marker holds the sources' checksum and the version,
# so an edit to them rebuilds and an interrupted build is done again.
ensure_otelcol() {
  local src="$ROOT/deploy/otelcol" dir
  dir="$(dirname "$OTELCOL_BIN")"
  local marker="$dir/.installed" want
  want="$(cat "$src/go.mod" "$src/go.sum" "$src/main.go" | sha256sum | cut -d' ' -f1) $OTELCOL_VERSION"
  marker_holds "$marker" "$want" && return 0
  # Go's own installer puts it here; a login shell's PATH may not say so.
  [[ -x /usr/local/go/bin/go ]] && PATH="$PATH:/usr/local/go/bin"
  require_command go "install Go 1.25 or newer (https://go.dev/doc/install)"
  log "building the OpenTelemetry Collector $OTELCOL_VERSION from deploy/otelcol into $dir"
  rm -rf "$dir"
  mkdir -p "$dir"
  (cd "$src" && go build -trimpath -o "$OTELCOL_BIN" .) ||
    die "could not build the collector in deploy/otelcol (go's output above)"
  printf '%s\n' "$want" >"$marker"
}

# Zipkin's server jar (its UI inside) from Maven Central, once per version.
ensure_zipkin() {
  local dir
  dir="$(dirname "$ZIPKIN_JAR")"
  local marker="$dir/.installed"
  marker_holds "$marker" "$ZIPKIN_VERSION" && return 0
  require_command mvn "install Maven (apt-get install -y maven)"
  require_command java "install Java 17 (apt-get install -y openjdk-17-jdk-headless)"
  log "fetching Zipkin $ZIPKIN_VERSION from Maven Central into $dir"
  rm -rf "$dir"
  mkdir -p "$dir"
  # Output to a file, shown only on failure, as for Kafka's jars.
  if ! mvn -B -q dependency:get -Dtransitive=false \
    -Dartifact="io.zipkin:zipkin-server:$ZIPKIN_VERSION:jar:exec" >"$dir/fetch.log" 2>&1; then
    cat "$dir/fetch.log" >&2
    die "could not fetch Zipkin $ZIPKIN_VERSION with Maven (output above)"
  fi
  cp "$HOME/.m2/repository/io/zipkin/zipkin-server/$ZIPKIN_VERSION/zipkin-server-$ZIPKIN_VERSION-exec.jar" \
    "$ZIPKIN_JAR"
  printf '%s\n' "$ZIPKIN_VERSION" >"$marker"
}

ensure_tracing() {
  ensure_otelcol
  ensure_zipkin
}

zipkin_healthy() {
  curl -fsS -o /dev/null --max-time 2 "http://127.0.0.1:$ZIPKIN_PORT/health" 2>/dev/null
}

# Starts Zipkin, then the collector that sends to it, each unless it runs
# already; pids and logs in $RUN_DIR as zipkin.* and otelcol.*.
start_tracing() {
  ensure_tracing
  require_command curl "apt-get install -y curl"
  mkdir -p "$RUN_DIR"
  if pid_file_alive "$RUN_DIR/zipkin.pid" zipkin; then
    log "zipkin already running (pid $(<"$RUN_DIR/zipkin.pid"))"
  else
    log "starting zipkin on 127.0.0.1:$ZIPKIN_PORT"
    # In-memory storage: traces last until Zipkin stops. C1 alone and the serial
    # collector start it in about 6 s rather than 10 on two cores.
    setsid nohup java -Xmx512m -XX:+UseSerialGC -XX:TieredStopAtLevel=1 -jar "$ZIPKIN_JAR" \
      --armeria.ports[0].ip=127.0.0.1 --armeria.ports[0].port="$ZIPKIN_PORT" \
      --armeria.ports[0].protocols=http \
      >>"$RUN_DIR/zipkin.log" 2>&1 </dev/null &
    echo $! >"$RUN_DIR/zipkin.pid"
  fi
  if pid_file_alive "$RUN_DIR/otelcol.pid" otelcol; then
    log "otelcol already running (pid $(<"$RUN_DIR/otelcol.pid"))"
  else
    log "starting the OpenTelemetry Collector on 127.0.0.1:$OTELCOL_PORT"
    OTELCOL_HTTP_ADDR="127.0.0.1:$OTELCOL_PORT" \
      OTELCOL_ZIPKIN_URL="http://127.0.0.1:$ZIPKIN_PORT/api/v2/spans" \
      setsid nohup "$OTELCOL_BIN" --config "$OTELCOL_CONFIG" \
      >>"$RUN_DIR/otelcol.log" 2>&1 </dev/null &
    echo $! >"$RUN_DIR/otelcol.pid"
  fi
  wait_until 90 "zipkin to report healthy" zipkin_healthy ||
    die "zipkin did not come up; its log: $RUN_DIR/zipkin.log"
  wait_until 30 "the collector to listen on 127.0.0.1:$OTELCOL_PORT" \
    tcp_open 127.0.0.1 "$OTELCOL_PORT" ||
    die "the collector did not come up; its log: $RUN_DIR/otelcol.log"
}

# The copy of the test CA's certificate, which signs PostgreSQL's (scripts/infra-up),
# for a client's sslrootcert; the tests read it here unless SAGA_TEST_PG_CA names it.
postgres_ca_file() {
  printf '%s\n' "$RUN_DIR/postgres-ca.crt"
}
