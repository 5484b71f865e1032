//! Ports: each service, PostgreSQL and Kafka listening and published where the native
//! scripts put them (the scalable consumers on the compose network only), and reached
//! there.

use crate::binaries::help_default;
use crate::lib_sh::LibSh;
use crate::yaml::{
    Compose, Node, env_var, environment, listener_addresses, published_ports, strings,
};

/// The services `docker compose up --scale` may run copies of: the consumers, which no
/// client on the host calls, so they need no host port. order-service's API and the
/// provider's stay on the host's ports, one copy each.
pub(crate) const SCALABLE: [&str; 2] = ["payment-service", "notification-service"];

#[test]
fn each_service_listens_is_published_and_is_health_checked_on_its_native_port() {
    let compose = Compose::load();
    let lib = LibSh::load();
    for (name, service) in compose.built_services() {
        let port = lib.case("service_port", name);

        let http_addr = env_var(&environment(service), name, "HTTP_ADDR");
        assert_eq!(
            http_addr,
            format!("0.0.0.0:{port}"),
            "{name}: HTTP_ADDR must listen on all interfaces (to be reachable through the \
             published port) on service_port from scripts/lib.sh"
        );

        if SCALABLE.contains(&name) {
            assert!(
                service.get(&["ports"]).is_none(),
                "{name}: a host port would stop `docker compose up --scale {name}=3`"
            );
            assert_eq!(
                strings(service.at(&["expose"])),
                vec![port.clone()],
                "{name}"
            );
        } else {
            assert_eq!(
                published_ports(service),
                vec![(port.clone(), port.clone())],
                "{name}: published ports (host, container) vs service_port in scripts/lib.sh"
            );
        }

        let check = strings(service.at(&["healthcheck", "test"])).join(" ");
        assert!(
            check.contains(&format!("http://127.0.0.1:{port}/health")),
            "{name}: the healthcheck does not ask /health on port {port}: {check}"
        );

        let default = help_default(compose.binary(name), "HTTP_ADDR");
        assert!(
            default.ends_with(&format!(":{port}")),
            "{name}: the binary's own default HTTP_ADDR {default} is not on service_port {port}"
        );
    }
}

#[test]
fn postgres_and_kafka_are_published_on_the_native_ports() {
    let compose = Compose::load();
    let lib = LibSh::load();
    for (service, variable) in [("postgres", "PG_PORT"), ("kafka", "KAFKA_PORT")] {
        let port = lib.scalar(variable);
        assert_eq!(
            published_ports(compose.service(service)),
            vec![(port.clone(), port.clone())],
            "{service}: published ports (host, container) vs {variable} in scripts/lib.sh"
        );
    }
    let kafka = environment(compose.service("kafka"));
    let host_address = format!("{}:{}", lib.scalar("KAFKA_HOST"), lib.scalar("KAFKA_PORT"));
    let advertised = env_var(&kafka, "kafka", "KAFKA_ADVERTISED_LISTENERS");
    assert!(
        listener_addresses(&advertised)
            .iter()
            .any(|(_, address)| *address == host_address),
        "kafka does not advertise {host_address}, where the host's clients (scripts/lib.sh \
         KAFKA_BOOTSTRAP) reach it: {advertised}"
    );
}

#[test]
fn payment_service_calls_the_provider_container_on_its_native_port() {
    let compose = Compose::load();
    let lib = LibSh::load();
    let url = env_var(
        &environment(compose.service("payment-service")),
        "payment-service",
        "PROVIDER_URL",
    );
    let port = lib.case("service_port", "payment-provider");
    assert_eq!(url, format!("http://payment-provider:{port}"));
    assert_eq!(
        help_default("payment-service", "PROVIDER_URL"),
        format!("http://127.0.0.1:{port}"),
        "payment-service's own default PROVIDER_URL is not the native provider"
    );
}
