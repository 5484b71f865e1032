"""What scripts/check-chart holds the chart and the examples to, beyond the Kubernetes
schemas: the properties the chart promises, and the operators' resources, which have no
schema here, by kind, apiVersion and the figures the services depend on.

    check_objects.py rendered OWN... -- OTHER...  what `helm template` rendered: OWN with
                                                  values that set no extraEnv, so every
                                                  variable is one the chart names; OTHER
                                                  with extraEnv too
    check_objects.py examples DIR TOPICS PARTITIONS DATABASES

TOPICS and DATABASES are comma-separated, from scripts/lib.sh. Prints one line per
failure and exits 1 if there is any.
"""

import re
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]

# The operators' kinds the examples may hold: no schema of theirs is bundled here, so
# only the kind and apiVersion are checked against this list, and the figures below.
OPERATOR_KINDS = {
    ("kafka.strimzi.io/v1", "KafkaTopic"),
    ("kafka.strimzi.io/v1", "KafkaUser"),
    ("postgresql.cnpg.io/v1", "Cluster"),
}
# The longest topic retention every consumer accepts with its default INBOX_RETENTION.
DEFAULT_INBOX_RETENTION_MS = 14 * 86_400_000
# A request's longest time when HTTP_REQUEST_TIMEOUT is not set.
DEFAULT_REQUEST_TIMEOUT_S = 30
# The librdkafka properties the chart sets as KAFKA_CLIENT_<PROPERTY>[_FILE], by their
# names in librdkafka's CONFIGURATION.md (not available offline: a misspelt one here and
# in the chart alike would pass).
KAFKA_CLIENT_PROPERTIES = {
    "security.protocol", "ssl.ca.location", "sasl.mechanism", "sasl.username", "sasl.password",
}
# Variables whose value is a file the service reads: each must be a file the pod mounts.
FILE_VARIABLES = re.compile(r".*(_FILE|_LOCATION|_CERTIFICATE)$")
# Variables that hold a secret: never given a literal value.
SECRET_VARIABLES = re.compile(r".*(PASSWORD|SECRET|TOKEN|HEADERS)$")
# A URL with a password in it.
URL_WITH_PASSWORD = re.compile(r"://[^/@:\s]+:[^/@\s]+@")

failures = []


def fail(where, message):
    failures.append(f"{where}: {message}")


def load(path):
    with open(path, encoding="utf-8") as f:
        return [doc for doc in yaml.safe_load_all(f) if doc]


def seconds(duration):
    """`30s`, `2m`, `1500ms` (what HTTP_REQUEST_TIMEOUT and SHUTDOWN_DELAY take) in seconds."""
    match = re.fullmatch(r"(\d+)(ms|s|m)", duration)
    if not match:
        return None
    value, unit = int(match[1]), match[2]
    return {"ms": value / 1000, "s": value, "m": value * 60}[unit]


def variables_read_by(binary):
    """The variables `binary` may read, from the source: every clap `env = "NAME"` of the
    saga library and of the binary's crate, what the logging setup reads itself, the
    OpenTelemetry variables its `--help` lists (telemetry.rs), and the Kafka client
    properties the chart sets, in the `KAFKA_CLIENT_` form client.rs reads, plain or
    `_FILE`. A union over the library's settings, so it catches a misspelt name, not a
    setting given to a binary whose settings lack it."""
    names = {"RUST_LOG"}
    for crate in ("saga", binary):
        for source in (ROOT / "crates" / crate / "src").rglob("*.rs"):
            text = source.read_text(encoding="utf-8")
            names.update(re.findall(r'env = "([A-Z][A-Z0-9_]*)"', text))
            names.update(re.findall(r'env::var\("([A-Z][A-Z0-9_]*)"\)', text))
    telemetry = (ROOT / "crates/saga/src/telemetry.rs").read_text(encoding="utf-8")
    help_text = telemetry[telemetry.index("OTEL_HELP"):]
    names.update(re.findall(r"\b(OTEL_[A-Z_]*[A-Z])\b", help_text[:help_text.index('";')]))
    client = (ROOT / "crates/saga/src/kafka/client.rs").read_text(encoding="utf-8")
    prefix = re.search(r'pub const PREFIX: &str = "([A-Z_]+)";', client)[1]
    if 'strip_suffix("_FILE")' in client:
        for property in KAFKA_CLIENT_PROPERTIES:
            variable = prefix + property.upper().replace(".", "_")
            names.update({variable, variable + "_FILE"})
    return names


def mounted_files(pod, container):
    """Every file the container sees from a volume: path -> (volume, the item's key)."""
    volumes = {v["name"]: v for v in pod.get("volumes", [])}
    files = {}
    for mount in container.get("volumeMounts", []):
        volume = volumes.get(mount["name"], {})
        source = volume.get("secret") or volume.get("configMap") or {}
        for item in source.get("items", []):
            files[f"{mount['mountPath'].rstrip('/')}/{item['path']}"] = (volume, item["key"])
    return files


def check_files(where, pod, container, env):
    """Secrets and CAs as files: mounted read-only, mode 0440 at most (no write, no one
    but the owner and the pods' group), readable by the pods' group, and every variable
    naming a file names one mounted."""
    volumes = {v["name"]: v for v in pod.get("volumes", [])}
    for mount in container.get("volumeMounts", []):
        volume = volumes.get(mount["name"], {})
        if ("secret" in volume or "configMap" in volume) and mount.get("readOnly") is not True:
            fail(where, f"volume {mount['name']} mounted writable")
    for volume in volumes.values():
        source = volume.get("secret") or volume.get("configMap")
        if source is None:
            continue
        modes = [source.get("defaultMode", 0o644)]
        modes += [item["mode"] for item in source.get("items", []) if "mode" in item]
        if any(mode & ~0o440 for mode in modes):
            fail(where, f"volume {volume['name']}'s files have mode {max(modes):04o}, "
                        "more than 0440")
        if not source.get("items"):
            fail(where, f"volume {volume['name']} mounts every key of its source, "
                        "not only the one named")
        if "fsGroup" not in pod.get("securityContext", {}):
            fail(where, f"volume {volume['name']}'s files are root's, and no fsGroup "
                        "lets the service's user read them")
    files = mounted_files(pod, container)
    for name, variable in env.items():
        if FILE_VARIABLES.match(name) and variable.get("value") not in files:
            fail(where, f"{name}={variable.get('value')} is no file the pod mounts")
    url_file = env.get("DATABASE_URL_FILE", {}).get("value")
    from_secret = "secretKeyRef" in env.get("DATABASE_URL", {}).get("valueFrom", {})
    if url_file:
        if from_secret or "DATABASE_URL" in env:
            fail(where, "both DATABASE_URL and DATABASE_URL_FILE set")
        if url_file in files and "secret" not in files[url_file][0]:
            fail(where, "DATABASE_URL_FILE not mounted from a Secret")
    elif not from_secret:
        fail(where, "DATABASE_URL neither read from a Secret nor a file mounted from one")
    if env.get("KAFKA_CLIENT_SASL_MECHANISM") and "KAFKA_CLIENT_SASL_PASSWORD_FILE" not in env:
        fail(where, "a Kafka login without KAFKA_CLIENT_SASL_PASSWORD_FILE")


def check_no_secret_in_env(where, env):
    for name, variable in env.items():
        value = variable.get("value")
        if value is None:
            continue
        if SECRET_VARIABLES.match(name):
            fail(where, f"{name} given as a literal value, not from a Secret")
        if URL_WITH_PASSWORD.search(value):
            fail(where, f"{name}'s value holds a URL with a password")


def check_container(where, pod, container, own_settings_only):
    grace = pod.get("terminationGracePeriodSeconds", 30)
    security = container.get("securityContext", {})
    if security.get("readOnlyRootFilesystem") is not True:
        fail(where, "root filesystem not read-only")
    if security.get("allowPrivilegeEscalation") is not False:
        fail(where, "privilege escalation not refused")
    if security.get("capabilities", {}).get("drop") != ["ALL"]:
        fail(where, "capabilities not all dropped")
    probes = {
        "livenessProbe": "/livez",
        "readinessProbe": "/readyz",
        "startupProbe": "/livez",
    }
    for probe, path in probes.items():
        got = container.get(probe, {}).get("httpGet", {}).get("path")
        if got != path:
            fail(where, f"{probe} on {got}, not {path}")
    resources = container.get("resources", {})
    if "memory" not in resources.get("requests", {}) or "memory" not in resources.get("limits", {}):
        fail(where, "memory request or limit missing")
    env = {e["name"]: e for e in container.get("env", [])}
    # With the default values, no extraEnv: every variable is one the chart names.
    if own_settings_only:
        binary = container["command"][0].rsplit("/", 1)[-1]
        unread = sorted(set(env) - variables_read_by(binary))
        if unread:
            fail(where, f"sets {unread}, which {binary} does not read")
    check_files(where, pod, container, env)
    check_no_secret_in_env(where, env)
    timeout = env.get("HTTP_REQUEST_TIMEOUT", {}).get("value", f"{DEFAULT_REQUEST_TIMEOUT_S}s")
    delay = env.get("SHUTDOWN_DELAY", {}).get("value", "0s")
    stop = [seconds(timeout), seconds(delay)]
    if None in stop or grace <= sum(stop):
        fail(where, f"terminationGracePeriodSeconds {grace} is not past SHUTDOWN_DELAY "
                    f"{delay} and a request's {timeout}")


def check_rendered(own, other):
    for path in own + other:
        objects = load(path)
        name = Path(path).stem
        failed_before = len(failures)
        deployments = [o for o in objects if o["kind"] == "Deployment"]
        if not deployments:
            fail(name, "no Deployment rendered")
        pod_labels = []
        for deployment in deployments:
            where = f"{name}: Deployment {deployment['metadata']['name']}"
            pod = deployment["spec"]["template"]["spec"]
            if pod.get("securityContext", {}).get("runAsNonRoot") is not True:
                fail(where, "may run as root")
            for container in pod["containers"]:
                check_container(where, pod, container, own_settings_only=path in own)
            pod_labels.append(deployment["spec"]["template"]["metadata"]["labels"])
        for service in (o for o in objects if o["kind"] == "Service"):
            selector = service["spec"]["selector"].items()
            if not any(selector <= labels.items() for labels in pod_labels):
                fail(f"{name}: Service {service['metadata']['name']}", "selects no pod")
        check_service_accounts(name, objects, deployments)
        policies = [o for o in objects if o["kind"] == "NetworkPolicy"]
        if policies:
            check_network_policies(name, policies, deployments)
        if len(failures) == failed_before:
            print(f"{name} values: {len(objects)} objects, {len(deployments)} Deployments, "
                  f"{len(policies)} NetworkPolicies: the chart's properties hold")


def check_service_accounts(name, objects, deployments):
    """No token anywhere: the services never call the Kubernetes API."""
    accounts = {o["metadata"]["name"]: o for o in objects if o["kind"] == "ServiceAccount"}
    for account in accounts.values():
        if account.get("automountServiceAccountToken") is not False:
            fail(f"{name}: ServiceAccount {account['metadata']['name']}", "mounts its token")
    for deployment in deployments:
        where = f"{name}: Deployment {deployment['metadata']['name']}"
        pod = deployment["spec"]["template"]["spec"]
        if pod.get("automountServiceAccountToken") is not False:
            fail(where, "the service account's token is mounted")
        if not pod.get("serviceAccountName"):
            fail(where, "no serviceAccountName: the namespace's default")
        elif accounts and pod["serviceAccountName"] not in accounts:
            fail(where, f"ServiceAccount {pod['serviceAccountName']} is not the one rendered")


def allows(rules, port, protocol="TCP"):
    """Whether one of the NetworkPolicy rules lets `port` through (to any peer)."""
    for rule in rules:
        ports = rule.get("ports")
        if not ports:
            return True
        for allowed in ports:
            if allowed.get("protocol", "TCP") != protocol:
                continue
            low = allowed.get("port")
            if low is None or low == port or (
                    isinstance(low, int) and low <= port <= allowed.get("endPort", low)):
                return True
    return False


def url_port(url):
    match = re.match(r"(https?)://[^/:]+(?::(\d+))?", url)
    if not match:
        return None
    return int(match[2]) if match[2] else {"http": 80, "https": 443}[match[1]]


def check_network_policies(name, policies, deployments):
    """Each service's pods under a policy of both directions, taking connections on their
    HTTP port alone, and let out to DNS and to every port their settings name: the
    brokers', the provider's, the collector's."""
    for deployment in deployments:
        where = f"{name}: Deployment {deployment['metadata']['name']}"
        labels = deployment["spec"]["template"]["metadata"]["labels"].items()
        selecting = [p for p in policies
                     if p["spec"]["podSelector"].get("matchLabels", {}).items() <= labels]
        if len(selecting) != 1:
            fail(where, f"selected by {len(selecting)} NetworkPolicies, not one")
            continue
        spec = selecting[0]["spec"]
        if sorted(spec.get("policyTypes", [])) != ["Egress", "Ingress"]:
            fail(where, f"its NetworkPolicy holds {spec.get('policyTypes')}, not both ways")
        container = deployment["spec"]["template"]["spec"]["containers"][0]
        port = container["ports"][0]["containerPort"]
        for rule in spec.get("ingress", []):
            opened = {p.get("port") for p in rule.get("ports", [{}])}
            if opened - {port, "http"}:
                fail(where, f"its NetworkPolicy opens {sorted(map(str, opened))}, "
                            f"not its HTTP port {port} alone")
        egress = spec.get("egress", [])
        env = {e["name"]: e.get("value", "") for e in container.get("env", [])}
        wanted = {"DNS": [(53, "UDP")]}
        brokers = env.get("KAFKA_BROKERS")
        if brokers:
            wanted["KAFKA_BROKERS"] = [(int(b.rsplit(":", 1)[1]) if ":" in b else 9092, "TCP")
                                       for b in brokers.split(",")]
        for variable in ("PROVIDER_URL", "OTEL_EXPORTER_OTLP_ENDPOINT"):
            if env.get(variable):
                wanted[variable] = [(url_port(env[variable]), "TCP")]
        for what, ports in wanted.items():
            for port, protocol in ports:
                if port is None or not allows(egress, port, protocol):
                    fail(where, f"its NetworkPolicy lets no connection out to {what}'s "
                                f"port {port}/{protocol}")


def check_examples(directory, topics, partitions, databases):
    kinds = {}
    for path in sorted(Path(directory).glob("*.yaml")):
        if path.name == "values.yaml":
            continue
        for obj in load(path):
            key = (obj.get("apiVersion"), obj.get("kind"))
            name = obj.get("metadata", {}).get("name")
            if key not in OPERATOR_KINDS:
                fail(f"{path}: {name}", f"{key[1]} {key[0]} is none of the kinds listed")
                continue
            kinds.setdefault(key[1], []).append(obj)
    check_topics(kinds.get("KafkaTopic", []), topics, partitions)
    check_users(kinds.get("KafkaUser", []), topics)
    check_clusters(kinds.get("Cluster", []), databases)
    counts = ", ".join(f"{len(v)} {k}" for k, v in sorted(kinds.items()))
    if failures:
        return
    print(f"{directory}: {counts}: kind and apiVersion checked against the script's list, "
          "and the figures the services depend on; NOT validated against the operators' "
          "schemas (none is available offline)")


def check_topics(found, topics, partitions):
    names = sorted(t["metadata"]["name"] for t in found)
    if names != sorted(topics):
        fail("KafkaTopic", f"topics {names}, not scripts/lib.sh's {sorted(topics)}")
    for topic in found:
        where = f"KafkaTopic {topic['metadata']['name']}"
        spec = topic["spec"]
        config = spec.get("config", {})
        if spec.get("partitions") != partitions:
            fail(where, f"{spec.get('partitions')} partitions, not {partitions}")
        if spec.get("replicas") != 3 or config.get("min.insync.replicas") != 2:
            fail(where, "not 3 replicas with min.insync.replicas 2")
        retention = config.get("retention.ms")
        if not isinstance(retention, int) or not 0 < retention <= DEFAULT_INBOX_RETENTION_MS:
            fail(where, f"retention.ms {retention} is past the default INBOX_RETENTION (14 days)")


def check_users(found, topics):
    for user in found:
        service = user["metadata"]["name"]
        acls = user["spec"]["authorization"]["acls"]
        named = {acl["resource"].get("name") for acl in acls}
        if service not in named:
            fail(f"KafkaUser {service}", "no ACL for its consumer group")
        dead_letters = [t for t in topics if t.endswith(f".{service}.dlq")]
        if len(dead_letters) != 1 or dead_letters[0] not in named:
            fail(f"KafkaUser {service}", f"no ACL for its dead-letter topic {dead_letters}")
        relay = f"{service}.outbox-relay"
        if not any(acl["resource"]["type"] == "transactionalId"
                   and acl["resource"].get("name") == relay and "Write" in acl["operations"]
                   for acl in acls):
            fail(f"KafkaUser {service}", f"no Write on its relay's transactional id {relay}")
        # Least privilege: the services' idempotent producers need only Write on their
        # topics (Kafka 3.0 and later), and nothing else of the cluster.
        if any(acl["resource"]["type"] == "cluster" for acl in acls):
            fail(f"KafkaUser {service}", "an ACL on the cluster, which no service needs")


def check_clusters(found, databases):
    names = sorted(c["spec"]["bootstrap"]["initdb"]["database"] for c in found)
    if names != sorted(databases):
        fail("Cluster", f"databases {names}, not scripts/lib.sh's {sorted(databases)}")


def main(argv):
    if argv[:1] == ["rendered"] and "--" in argv:
        split = argv.index("--")
        check_rendered(argv[1:split], argv[split + 1:])
    elif argv[:1] == ["examples"] and len(argv) == 5:
        check_examples(argv[1], argv[2].split(","), int(argv[3]), argv[4].split(","))
    else:
        sys.exit(__doc__)
    for failure in failures:
        print(f"FAIL {failure}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
