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
// EnsureTopics, PLAIN ones are in the listener's JAAS configuration.

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
        List<AclBinding> acls = acls(new File(args[3]), args[2], without);

        Properties props = new Properties();
        props.put(AdminClientConfig.BOOTSTRAP_SERVERS_CONFIG, args[0]);
        props.put(AdminClientConfig.CLIENT_ID_CONFIG, "order-saga-kafka-users");
        props.put(AdminClientConfig.DEFAULT_API_TIMEOUT_MS_CONFIG, "30000");
        try (Admin admin = Admin.create(props)) {
            if (args[1].equals("grant")) {
                admin.createAcls(acls).all().get();
            } else {
                admin.deleteAcls(acls.stream().map(AclBinding::toFilter).toList()).all().get();
            }
        } catch (ExecutionException e) {
            // A broker without an authorizer (one started elsewhere) lets everyone do
            // everything: there is nothing to grant.
            if (e.getCause() instanceof SecurityDisabledException) {
                System.out.println("no ACLs " + args[1] + "ed: the broker has no authorizer");
                return;
            }
            throw e;
        }
        Set<String> users = new TreeSet<>();
        acls.forEach(acl -> users.add(acl.entry().principal()));
        System.out.println((args[1].equals("grant") ? "granted " : "revoked ") + acls.size()
                + " ACLs of " + String.join(", ", users)
                + (args[2].isEmpty() ? "" : " in namespace " + args[2])
                + (without.isEmpty() ? "" : ", without " + String.join(", ", without)));
    }

    static List<AclBinding> acls(File file, String namespace, Set<String> without) throws Exception {
        List<AclBinding> acls = new ArrayList<>();
        Set<String> unused = new TreeSet<>(without);
        try (MappingIterator<JsonNode> documents = new YAMLMapper().readerFor(JsonNode.class).readValues(file)) {
            while (documents.hasNext()) {
                JsonNode document = documents.next();
                if (!"KafkaUser".equals(document.path("kind").asText())) {
                    continue;
                }
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
