// Creates the project's Kafka topics if they are missing, in one JVM.
//
// Usage (compiled, or as a Java 11+ single-file launch), with the Kafka jars
// on the classpath:
//   java -cp "libs/*" EnsureTopics.java BOOTSTRAP TIMEOUT_MS PARTITIONS TOPIC...
//
// One JVM with the AdminClient instead of one kafka-topics call per topic:
// each CLI JVM costs 1-3 s on a small machine. Listing topics first also makes
// this the readiness check of scripts/infra-up: it succeeds only once the
// broker answers metadata requests.

import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import java.util.Map;
import java.util.Optional;
import java.util.Properties;
import java.util.Set;
import java.util.concurrent.ExecutionException;

import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.AdminClientConfig;
import org.apache.kafka.clients.admin.NewTopic;
import org.apache.kafka.clients.admin.TopicDescription;
import org.apache.kafka.common.errors.TopicExistsException;

public class EnsureTopics {
    public static void main(String[] args) throws Exception {
        if (args.length < 4) {
            System.err.println("usage: EnsureTopics BOOTSTRAP TIMEOUT_MS PARTITIONS TOPIC...");
            System.exit(2);
        }
        String bootstrap = args[0];
        String timeoutMs = args[1];
        int partitions = Integer.parseInt(args[2]);
        List<String> wanted = Arrays.asList(args).subList(3, args.length);

        Properties props = new Properties();
        props.put(AdminClientConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        props.put(AdminClientConfig.CLIENT_ID_CONFIG, "order-saga-ensure-topics");
        // Bounded, so that a broker that never becomes ready fails the script
        // instead of hanging it. Until then the client retries by itself: the
        // port opens before the broker serves requests (after an unclean stop,
        // for as long as its previous registration takes to expire).
        props.put(AdminClientConfig.DEFAULT_API_TIMEOUT_MS_CONFIG, timeoutMs);
        props.put(AdminClientConfig.REQUEST_TIMEOUT_MS_CONFIG, "10000");

        try (Admin admin = Admin.create(props)) {
            Set<String> existing = admin.listTopics().names().get();

            List<NewTopic> missing = new ArrayList<>();
            for (String topic : wanted) {
                if (!existing.contains(topic)) {
                    missing.add(new NewTopic(topic, Optional.of(partitions), Optional.empty()));
                }
            }
            List<String> created = new ArrayList<>();
            for (Map.Entry<String, ? extends org.apache.kafka.common.KafkaFuture<Void>> result :
                    admin.createTopics(missing).values().entrySet()) {
                try {
                    result.getValue().get();
                    created.add(result.getKey());
                } catch (ExecutionException e) {
                    // Another process created it between our list and create.
                    if (!(e.getCause() instanceof TopicExistsException)) {
                        throw e;
                    }
                }
            }

            // A topic left over with another partition count changes how keys
            // map to partitions; say so rather than silently accept it.
            List<String> mismatched = new ArrayList<>();
            for (TopicDescription d : admin.describeTopics(wanted).allTopicNames().get().values()) {
                if (d.partitions().size() != partitions) {
                    mismatched.add(d.name() + " has " + d.partitions().size() + " partitions");
                }
            }

            System.out.println("topics created: " + (created.isEmpty() ? "none" : String.join(", ", created))
                    + "; already present: " + (wanted.size() - created.size()));
            if (!mismatched.isEmpty()) {
                System.err.println("warning: expected " + partitions + " partitions, but "
                        + String.join("; ", mismatched));
            }
        }
    }
}
