// Grants or revokes the ACLs of Strimzi KafkaUser documents on a broker that
// runs an authorizer, so that the users a cluster's operator would make are the
// ones this machine's broker and the tests log in as.
//
// Usage, with the Kafka jars on the classpath (scripts/kafka-tool users ...):
//   KafkaUsers BOOTSTRAP grant|revoke NAMESPACE FILE [WITHOUT...]
//
// FILE holds KafkaUser documents (deploy/helm/examples/kafka-users.yaml): each
// user is the document's metadata.name, and gets each operation of each of its
// spec.authorization.acls, allowed from any host. Every resource name but the
// cluster's is prefixed with NAMESPACE, as KAFKA_NAMESPACE prefixes the saga's
// topics, groups and transactional ids ("" for none). Each WITHOUT,
// USER:TYPE:NAME:OPERATION with NAME as the file has it (e.g.
// order-service:topic:payments:Read), is an ACL left out: a user one right
// short. Granting what exists already, or revoking what does not, changes
// nothing. The users' logins are not made here: SCRAM credentials are made by
// EnsureTopics (which, given -Dkafka.users.file, also grants the file's ACLs
// with no namespace, in its own JVM), PLAIN ones are in the listener's JAAS
// configuration.

import java.io.File;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import java.util.Locale;
import java.util.Properties;
import java.util.Set;
import java.util.TreeSet;
import java.util.concurrent.ExecutionException;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.MappingIterator;
import com.fasterxml.jackson.dataformat.yaml.YAMLMapper;
import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.AdminClientConfig;
import org.apache.kafka.common.acl.AccessControlEntry;
import org.apache.kafka.common.acl.AclBinding;
import org.apache.kafka.common.acl.AclOperation;
import org.apache.kafka.common.acl.AclPermissionType;
import org.apache.kafka.common.errors.SecurityDisabledException;
import org.apache.kafka.common.resource.PatternType;
import org.apache.kafka.common.resource.ResourcePattern;
import org.apache.kafka.common.resource.ResourceType;

public class KafkaUsers {
    public static void main(String[] args) throws Exception {
        if (args.length < 4 || !Set.of("grant", "revoke").contains(args[1])) {
            System.err.println("usage: KafkaUsers BOOTSTRAP grant|revoke NAMESPACE FILE [USER:TYPE:NAME:OPERATION...]");
            System.exit(2);
        }
        Set<String> without = Set.of(Arrays.copyOfRange(args, 4, args.length));
        Properties props = new Properties();
        props.put(AdminClientConfig.BOOTSTRAP_SERVERS_CONFIG, args[0]);
        props.put(AdminClientConfig.CLIENT_ID_CONFIG, "order-saga-kafka-users");
        props.put(AdminClientConfig.DEFAULT_API_TIMEOUT_MS_CONFIG, "30000");
        try (Admin admin = Admin.create(props)) {
            System.out.println(apply(admin, args[1].equals("grant"), new File(args[3]), args[2], without));
        }
    }

    // Grants (or revokes) the ACLs of FILE's users on NAMESPACE, less WITHOUT, and says
    // what it did. EnsureTopics calls this too, in its own JVM.
    static String apply(Admin admin, boolean grant, File file, String namespace, Set<String> without)
            throws Exception {
        List<AclBinding> acls = acls(file, namespace, without);
        String done = grant ? "granted" : "revoked";
        try {
            if (grant) {
                admin.createAcls(acls).all().get();
            } else {
                admin.deleteAcls(acls.stream().map(AclBinding::toFilter).toList()).all().get();
            }
        } catch (ExecutionException e) {
            // A broker without an authorizer (one started elsewhere) lets everyone do
            // everything: there is nothing to grant.
            if (e.getCause() instanceof SecurityDisabledException) {
                return "no ACLs " + done + ": the broker has no authorizer";
            }
            throw e;
        }
        Set<String> principals = new TreeSet<>();
        acls.forEach(acl -> principals.add(acl.entry().principal()));
        return done + " " + acls.size() + " ACLs of " + String.join(", ", principals)
                + (namespace.isEmpty() ? "" : " in namespace " + namespace)
                + (without.isEmpty() ? "" : ", without " + String.join(", ", without));
    }

    // The users FILE names: each KafkaUser's metadata.name.
    static List<String> users(File file) throws Exception {
        List<String> users = new ArrayList<>();
        for (JsonNode document : kafkaUsers(file)) {
            users.add(document.path("metadata").path("name").asText());
        }
        return users;
    }

    static List<JsonNode> kafkaUsers(File file) throws Exception {
        List<JsonNode> users = new ArrayList<>();
        try (MappingIterator<JsonNode> documents = new YAMLMapper().readerFor(JsonNode.class).readValues(file)) {
            while (documents.hasNext()) {
                JsonNode document = documents.next();
                if ("KafkaUser".equals(document.path("kind").asText())) {
                    users.add(document);
                }
            }
        }
        return users;
    }

    static List<AclBinding> acls(File file, String namespace, Set<String> without) throws Exception {
        List<AclBinding> acls = new ArrayList<>();
        Set<String> unused = new TreeSet<>(without);
        for (JsonNode document : kafkaUsers(file)) {
            String user = document.path("metadata").path("name").asText();
            for (JsonNode acl : document.path("spec").path("authorization").path("acls")) {
                JsonNode resource = acl.path("resource");
                String type = resource.path("type").asText();
                String name = resource.path("name").asText("");
                ResourcePattern pattern = pattern(type, namespace + name,
                        resource.path("patternType").asText("literal"));
                for (JsonNode operation : acl.path("operations")) {
                    if (unused.remove(user + ":" + type + ":" + name + ":" + operation.asText())) {
                        continue;
                    }
                    acls.add(new AclBinding(pattern, new AccessControlEntry("User:" + user,
                            acl.path("host").asText("*"), operation(operation.asText()), AclPermissionType.ALLOW)));
                }
            }
        }
        // A typo here would grant everything and prove nothing.
        if (!unused.isEmpty()) {
            throw new IllegalArgumentException("no such ACL in " + file + ": " + String.join(", ", unused));
        }
        return acls;
    }

    // Strimzi's names: topic, group, transactionalId, cluster; literal or prefix.
    static ResourcePattern pattern(String type, String name, String patternType) {
        ResourceType resourceType = switch (type) {
            case "topic" -> ResourceType.TOPIC;
            case "group" -> ResourceType.GROUP;
            case "transactionalId" -> ResourceType.TRANSACTIONAL_ID;
            case "cluster" -> ResourceType.CLUSTER;
            default -> throw new IllegalArgumentException("unknown resource type " + type);
        };
        if (resourceType == ResourceType.CLUSTER) {
            return new ResourcePattern(resourceType, "kafka-cluster", PatternType.LITERAL);
        }
        PatternType pattern = switch (patternType) {
            case "literal" -> PatternType.LITERAL;
            case "prefix" -> PatternType.PREFIXED;
            default -> throw new IllegalArgumentException("unknown pattern type " + patternType);
        };
        return new ResourcePattern(resourceType, name, pattern);
    }

    // Strimzi writes DescribeConfigs, Kafka DESCRIBE_CONFIGS.
    static AclOperation operation(String name) {
        AclOperation operation = AclOperation.fromString(
                name.replaceAll("([a-z])([A-Z])", "$1_$2").toUpperCase(Locale.ROOT));
        if (operation == AclOperation.UNKNOWN) {
            throw new IllegalArgumentException("unknown operation " + name);
        }
        return operation;
    }
}
