//! The Kafka rights a service needs, asked of the broker at start-up, so that a right
//! missing stops the service at once, named, rather than at its first dead letter or
//! its first publish, which may come days later and then stall a partition.
//!
//! Kafka tells a client which operations it may perform on a topic or a group
//! (KIP-430, `include_authorized_operations` of DescribeTopics and
//! DescribeConsumerGroups). rust-rdkafka wraps neither call, so both go through
//! librdkafka's C API here. The relay's transactional id has no such call: its
//! `init_transactions` is the check (`crate::outbox`).

use std::ffi::{CStr, CString, c_char, c_int};
use std::fmt;
use std::time::Duration;

use rdkafka::bindings as rd;
use rdkafka::client::{Client, ClientContext};

/// One of the ACL operations the services need.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Operation {
    Read,
    Write,
    DescribeConfigs,
}

impl Operation {
    fn code(self) -> c_int {
        (match self {
            Self::Read => rd::rd_kafka_AclOperation_t::RD_KAFKA_ACL_OPERATION_READ,
            Self::Write => rd::rd_kafka_AclOperation_t::RD_KAFKA_ACL_OPERATION_WRITE,
            Self::DescribeConfigs => {
                rd::rd_kafka_AclOperation_t::RD_KAFKA_ACL_OPERATION_DESCRIBE_CONFIGS
            }
        }) as c_int
    }
}

/// A resource as Kafka's ACLs name it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Resource {
    Topic(String),
    Group(String),
    TransactionalId(String),
}

impl Resource {
    fn name(&self) -> &str {
        match self {
            Self::Topic(name) | Self::Group(name) | Self::TransactionalId(name) => name,
        }
    }

    fn kind(&self) -> &'static str {
        match self {
            Self::Topic(_) => "topic",
            Self::Group(_) => "group",
            Self::TransactionalId(_) => "transactionalId",
        }
    }
}

/// What a service needs, resource by resource.
#[derive(Clone, Debug, Default)]
pub struct Rights(Vec<(Resource, Vec<Operation>)>);

/// A right the broker does not give this client.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Missing {
    pub operation: Operation,
    pub resource: Resource,
}

impl fmt::Display for Missing {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{:?} on {} {}",
            self.operation,
            self.resource.kind(),
            self.resource.name()
        )
    }
}

/// How long each question may take; the broker answered a metadata request just before.
const TIMEOUT: Duration = Duration::from_secs(10);

impl Rights {
    pub fn topic(mut self, topic: &str, operations: &[Operation]) -> Self {
        self.0
            .push((Resource::Topic(topic.to_owned()), operations.to_vec()));
        self
    }

    pub fn group(mut self, group: &str, operations: &[Operation]) -> Self {
        self.0
            .push((Resource::Group(group.to_owned()), operations.to_vec()));
        self
    }

    pub fn topics(&self) -> Vec<String> {
        self.names(Kind::Topics)
            .into_iter()
            .map(str::to_owned)
            .collect()
    }

    /// The rights `client` lacks, in the order they were listed. A resource the broker
    /// does not describe to it at all lacks every right asked for. A broker without an
    /// authorizer names every operation; one that names none (too old to say) lacks
    /// none, and so does a transactional id, which Kafka has no such question for.
    /// Blocks.
    pub fn missing<C: ClientContext>(&self, client: &Client<C>) -> anyhow::Result<Vec<Missing>> {
        let topics = describe(client, Kind::Topics, &self.names(Kind::Topics))?;
        let groups = describe(client, Kind::Groups, &self.names(Kind::Groups))?;
        let mut missing = Vec::new();
        for (resource, operations) in &self.0 {
            let answers = match Kind::of(resource) {
                Some(Kind::Topics) => &topics,
                Some(Kind::Groups) => &groups,
                None => continue,
            };
            let name = resource.name();
            let answer = answers
                .get(name)
                .ok_or_else(|| anyhow::anyhow!("Kafka did not describe {name}"))?;
            let Some(allowed) = answer else { continue };
            missing.extend(
                operations
                    .iter()
                    .filter(|operation| !allowed.contains(&operation.code()))
                    .map(|&operation| Missing {
                        operation,
                        resource: resource.clone(),
                    }),
            );
        }
        Ok(missing)
    }

    /// The names of the resources of `kind`, each once: both of Kafka's calls refuse a
    /// name given twice.
    fn names(&self, kind: Kind) -> Vec<&str> {
        let names: std::collections::BTreeSet<&str> = self
            .0
            .iter()
            .filter(|(resource, _)| Kind::of(resource) == Some(kind))
            .map(|(resource, _)| resource.name())
            .collect();
        names.into_iter().collect()
    }
}

/// The resources Kafka answers a question of rights for.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Topics,
    Groups,
}

impl Kind {
    fn of(resource: &Resource) -> Option<Self> {
        match resource {
            Resource::Topic(_) => Some(Self::Topics),
            Resource::Group(_) => Some(Self::Groups),
            Resource::TransactionalId(_) => None,
        }
    }
}

/// What the broker said of each resource it described: the operations it allows, empty
/// for one it will not describe to this client, `None` if it named none.
type Answers = std::collections::HashMap<String, Option<Vec<c_int>>>;

/// What the broker says of each of `names` (each given once).
fn describe<C: ClientContext>(
    client: &Client<C>,
    kind: Kind,
    names: &[&str],
) -> anyhow::Result<Answers> {
    if names.is_empty() {
        return Ok(Answers::new());
    }
    let owned: Vec<CString> = names
        .iter()
        .map(|name| CString::new(*name))
        .collect::<Result<_, _>>()?;
    let mut pointers: Vec<*const c_char> = owned.iter().map(|name| name.as_ptr()).collect();
    let call = Call::new(client, kind)?;
    // SAFETY: `pointers` point into `owned`, which outlives the call; librdkafka copies
    // the names before it returns. The collection is destroyed after the request was
    // made, which has copied it too.
    unsafe {
        match kind {
            Kind::Topics => {
                let collection = rd::rd_kafka_TopicCollection_of_topic_names(
                    pointers.as_mut_ptr(),
                    pointers.len(),
                );
                rd::rd_kafka_DescribeTopics(
                    client.native_ptr(),
                    collection,
                    call.options,
                    call.queue,
                );
                rd::rd_kafka_TopicCollection_destroy(collection);
            }
            Kind::Groups => rd::rd_kafka_DescribeConsumerGroups(
                client.native_ptr(),
                pointers.as_mut_ptr(),
                pointers.len(),
                call.options,
                call.queue,
            ),
        }
    }
    Ok(call.result()?.answers(kind).into_iter().collect())
}

/// One admin request's options and the queue its result arrives on.
struct Call {
    options: *mut rd::rd_kafka_AdminOptions_t,
    queue: *mut rd::rd_kafka_queue_t,
}

impl Call {
    fn new<C: ClientContext>(client: &Client<C>, kind: Kind) -> anyhow::Result<Self> {
        let operation = match kind {
            Kind::Topics => rd::rd_kafka_admin_op_t::RD_KAFKA_ADMIN_OP_DESCRIBETOPICS,
            Kind::Groups => rd::rd_kafka_admin_op_t::RD_KAFKA_ADMIN_OP_DESCRIBECONSUMERGROUPS,
        };
        // SAFETY: the client's handle is valid for as long as `client`; both objects are
        // freed in `drop`.
        unsafe {
            let call = Self {
                options: rd::rd_kafka_AdminOptions_new(client.native_ptr(), operation),
                queue: rd::rd_kafka_queue_new(client.native_ptr()),
            };
            let error =
                rd::rd_kafka_AdminOptions_set_include_authorized_operations(call.options, 1);
            if !error.is_null() {
                let message = CStr::from_ptr(rd::rd_kafka_error_string(error))
                    .to_string_lossy()
                    .into_owned();
                rd::rd_kafka_error_destroy(error);
                anyhow::bail!("asking Kafka for this client's rights: {message}");
            }
            let mut reason = [0 as c_char; 256];
            rd::rd_kafka_AdminOptions_set_request_timeout(
                call.options,
                TIMEOUT.as_millis() as c_int,
                reason.as_mut_ptr(),
                reason.len(),
            );
            Ok(call)
        }
    }

    /// Waits for the request's result.
    fn result(&self) -> anyhow::Result<Event> {
        // SAFETY: the queue is valid until `drop`; the event is owned by `Event`.
        let event = unsafe {
            rd::rd_kafka_queue_poll(
                self.queue,
                (TIMEOUT + Duration::from_secs(1)).as_millis() as c_int,
            )
        };
        if event.is_null() {
            anyhow::bail!("Kafka did not say this client's rights within {TIMEOUT:?}");
        }
        let event = Event(event);
        // SAFETY: a valid event.
        unsafe {
            if event_error(event.0) != 0 {
                let message = CStr::from_ptr(rd::rd_kafka_event_error_string(event.0));
                anyhow::bail!(
                    "asking Kafka for this client's rights: {}",
                    message.to_string_lossy()
                );
            }
        }
        Ok(event)
    }
}

impl Drop for Call {
    fn drop(&mut self) {
        // SAFETY: made in `new`, freed once.
        unsafe {
            rd::rd_kafka_AdminOptions_destroy(self.options);
            rd::rd_kafka_queue_destroy(self.queue);
        }
    }
}

/// An admin result, freed on drop.
struct Event(*mut rd::rd_kafka_event_t);

impl Drop for Event {
    fn drop(&mut self) {
        // SAFETY: polled from a queue, freed once.
        unsafe { rd::rd_kafka_event_destroy(self.0) }
    }
}

impl Event {
    /// Each described name and what it may do: empty if not authorized to describe it,
    /// `None` if the broker named no operations. A resource left out of the answer is
    /// left out here too.
    fn answers(&self, kind: Kind) -> Vec<(String, Option<Vec<c_int>>)> {
        let mut count = 0;
        // SAFETY: the arrays and strings belong to the event, which outlives this call;
        // each is copied out before it returns, and each pointer is checked for null
        // first (librdkafka leaves a topic the broker did not answer null in its slot).
        unsafe {
            match kind {
                Kind::Topics => {
                    let result = rd::rd_kafka_event_DescribeTopics_result(self.0);
                    if result.is_null() {
                        return Vec::new();
                    }
                    let topics = rd::rd_kafka_DescribeTopics_result_topics(result, &mut count);
                    (0..count)
                        .map(|i| *topics.add(i))
                        .filter(|topic| !topic.is_null())
                        .filter_map(|topic| {
                            let mut n = 0;
                            let ops =
                                rd::rd_kafka_TopicDescription_authorized_operations(topic, &mut n);
                            answer(
                                rd::rd_kafka_TopicDescription_name(topic),
                                rd::rd_kafka_TopicDescription_error(topic),
                                ops.cast(),
                                n,
                            )
                        })
                        .collect()
                }
                Kind::Groups => {
                    let result = rd::rd_kafka_event_DescribeConsumerGroups_result(self.0);
                    if result.is_null() {
                        return Vec::new();
                    }
                    let groups =
                        rd::rd_kafka_DescribeConsumerGroups_result_groups(result, &mut count);
                    (0..count)
                        .map(|i| *groups.add(i))
                        .filter(|group| !group.is_null())
                        .filter_map(|group| {
                            let mut n = 0;
                            let ops = rd::rd_kafka_ConsumerGroupDescription_authorized_operations(
                                group, &mut n,
                            );
                            answer(
                                rd::rd_kafka_ConsumerGroupDescription_group_id(group),
                                rd::rd_kafka_ConsumerGroupDescription_error(group),
                                ops.cast(),
                                n,
                            )
                        })
                        .collect()
                }
            }
        }
    }
}

// Kafka's error codes, read as plain integers: the bindings' enum has gaps, and a code
// from a newer broker in one would be an invalid value.
unsafe extern "C" {
    #[link_name = "rd_kafka_error_code"]
    fn error_code(error: *const rd::rd_kafka_error_t) -> c_int;
    #[link_name = "rd_kafka_event_error"]
    fn event_error(event: *mut rd::rd_kafka_event_t) -> c_int;
}

const TOPIC_AUTHORIZATION_FAILED: c_int =
    rd::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_TOPIC_AUTHORIZATION_FAILED as c_int;
const GROUP_AUTHORIZATION_FAILED: c_int =
    rd::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_GROUP_AUTHORIZATION_FAILED as c_int;

/// One described resource: its name, and what it may do (`None` if the broker did not
/// say); `None` for a resource without a name.
///
/// # Safety
/// Pointers from a live result: a name or null, an error or null, and `n` operations or
/// null.
unsafe fn answer(
    name: *const c_char,
    error: *const rd::rd_kafka_error_t,
    operations: *const c_int,
    n: usize,
) -> Option<(String, Option<Vec<c_int>>)> {
    if name.is_null() {
        return None;
    }
    // SAFETY: as the caller promises.
    unsafe {
        let name = CStr::from_ptr(name).to_string_lossy().into_owned();
        if !error.is_null() {
            let allowed = match error_code(error) {
                TOPIC_AUTHORIZATION_FAILED | GROUP_AUTHORIZATION_FAILED => Some(Vec::new()),
                // Any other error says nothing of the rights: the service finds it by
                // itself.
                _ => None,
            };
            return Some((name, allowed));
        }
        // Null: not said. Not null with none: asked, and nothing allowed.
        if operations.is_null() {
            return Some((name, None));
        }
        Some((
            name,
            Some(std::slice::from_raw_parts(operations, n).to_vec()),
        ))
    }
}
