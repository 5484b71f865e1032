// Creates the project's Kafka topics if they are missing, in one JVM.
//
// Usage (compiled, or as a Java 11+ single-file launch), with the Kafka jars
// on the classpath:
//   java -cp "libs/*" EnsureTopics.java BOOTSTRAP TIMEOUT_MS NODE_IDS PARTITIONS TOPIC...
//
// One JVM with the AdminClient instead of one kafka-topics call per topic:
// each CLI JVM costs 1-3 s on a small machine. It is also the readiness check
// of scripts/infra-up: it first waits until every node in NODE_IDS (comma
// separated) is among the brokers the cluster serves with, then lists the
// topics, which succeeds only once a broker answers metadata requests. The
// replication factor is the brokers' default.replication.factor, which the
// mode's properties file sets. With -Dscram.users and -Dkafka.users.file it also
// adds the SASL users (ensureScramUsers) and grants the file's ACLs (KafkaUsers).

import java.util.ArrayList;
import java.util.Arrays;
import java.util.Collection;
import java.util.List;
import java.util.Map;
import java.util.Optional;
import java.util.Properties;
import java.util.Set;
import java.util.stream.Collectors;
import java.util.concurrent.ExecutionException;

import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.AdminClientConfig;
import org.apache.kafka.clients.admin.NewTopic;
import org.apache.kafka.clients.admin.ScramCredentialInfo;
import org.apache.kafka.clients.admin.ScramMechanism;
import org.apache.kafka.clients.admin.UserScramCredentialAlteration;
import org.apache.kafka.clients.admin.UserScramCredentialUpsertion;
import org.apache.kafka.clients.admin.UserScramCredentialsDescription;
import org.apache.kafka.clients.admin.TopicDescription;
import org.apache.kafka.common.Node;
import org.apache.kafka.common.errors.InvalidReplicationFactorException;
import org.apache.kafka.common.errors.RetriableException;
import org.apache.kafka.common.errors.TopicExistsException;
import org.apache.kafka.common.errors.UnknownTopicOrPartitionException;

public class EnsureTopics {
    public static void main(String[] args) throws Exception {
        if (args.length < 5) {
            System.err.println("usage: EnsureTopics BOOTSTRAP TIMEOUT_MS NODE_IDS PARTITIONS TOPIC...");
            System.exit(2);
        }
        String bootstrap = args[0];
        String timeoutMs = args[1];
        Set<Integer> nodes = Arrays.stream(args[2].split(","))
                .map(Integer::valueOf).collect(Collectors.toSet());
        int partitions = Integer.parseInt(args[3]);
        List<String> wanted = Arrays.asList(args).subList(4, args.length);
        long deadline = System.currentTimeMillis() + Long.parseLong(timeoutMs);

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
            // A node restarted after a crash opens its port long before it has
            // caught up with the cluster's metadata and is let serve again.
            Set<Integer> serving = Set.of();
            while (true) {
                serving = admin.describeCluster().nodes().get().stream()
                        .map(Node::id).collect(Collectors.toSet());
                if (serving.containsAll(nodes)) {
                    break;
                }
                if (System.currentTimeMillis() > deadline) {
                    System.err.println("brokers serving: " + serving + "; waited for " + nodes);
                    System.exit(1);
                }
                Thread.sleep(200);
            }

            // A broker counted as serving may not be let host replicas for a
            // moment yet (a new topic then cannot have its replicas): retried.
            List<String> created = new ArrayList<>();
            List<NewTopic> missing;
            while (true) {
                Set<String> existing = admin.listTopics().names().get();
                missing = new ArrayList<>();
                for (String topic : wanted) {
                    if (!existing.contains(topic)) {
                        missing.add(new NewTopic(topic, Optional.of(partitions), Optional.empty()));
                    }
                }
                boolean retry = false;
                for (Map.Entry<String, ? extends org.apache.kafka.common.KafkaFuture<Void>> result :
                        admin.createTopics(missing).values().entrySet()) {
                    try {
                        result.getValue().get();
                        created.add(result.getKey());
                    } catch (ExecutionException e) {
                        Throwable cause = e.getCause();
                        if (cause instanceof TopicExistsException) {
                            // Another process created it between our list and create.
                        } else if ((cause instanceof InvalidReplicationFactorException
                                || cause instanceof RetriableException)
                                && System.currentTimeMillis() < deadline) {
                            retry = true;
                        } else {
                            throw e;
                        }
                    }
                }
                if (!retry) {
                    break;
                }
                Thread.sleep(200);
            }

            // A topic left over with another partition count changes how keys
            // map to partitions; say so rather than silently accept it.
            List<String> mismatched = new ArrayList<>();
            Set<Integer> replicas = new java.util.TreeSet<>();
            for (TopicDescription d : describe(admin, wanted, deadline)) {
                if (d.partitions().size() != partitions) {
                    mismatched.add(d.name() + " has " + d.partitions().size() + " partitions");
                }
                d.partitions().forEach(p -> replicas.add(p.replicas().size()));
            }

            // The SASL users: those of -Dscram.users, and each KafkaUser of
            // -Dkafka.users.file, whose ACLs are then granted on the saga's own topics.
            List<String> users = new ArrayList<>();
            String listed = System.getProperty("scram.users", "");
            if (!listed.isEmpty()) {
                users.addAll(Arrays.asList(listed.split(",")));
            }
            String usersFile = System.getProperty("kafka.users.file", "");
            if (!usersFile.isEmpty()) {
                users.addAll(KafkaUsers.users(new java.io.File(usersFile)));
            }
            if (!users.isEmpty()) {
                ensureScramUsers(admin, users.toArray(String[]::new), System.getProperty("scram.password"));
            }
            if (!usersFile.isEmpty()) {
                System.out.println(KafkaUsers.apply(admin, true, new java.io.File(usersFile), "", Set.of()));
            }

            System.out.println("topics created: " + (created.isEmpty() ? "none" : String.join(", ", created))
                    + "; already present: " + (wanted.size() - created.size())
                    + "; replicas per partition: " + replicas + "; brokers serving: " + serving);
            if (!mismatched.isEmpty()) {
                System.err.println("warning: expected " + partitions + " partitions, but "
                        + String.join("; ", mismatched));
            }
        }
    }

    // The SASL users (-Dscram.users, comma separated, all with -Dscram.password),
    // each with a SCRAM-SHA-256 and a SCRAM-SHA-512 credential. Only missing ones
    // are added: the users live in the cluster's metadata, so a data folder
    // formatted before they existed gets them here, and a second run changes
    // nothing (a credential written again would get a new salt).
    static void ensureScramUsers(Admin admin, String[] users, String password) throws Exception {
        Map<String, UserScramCredentialsDescription> existing =
                admin.describeUserScramCredentials().all().get();
        List<String> added = new ArrayList<>();
        // One request per mechanism: a request may alter each user once.
        for (ScramMechanism mechanism : List.of(ScramMechanism.SCRAM_SHA_256, ScramMechanism.SCRAM_SHA_512)) {
            List<UserScramCredentialAlteration> missing = new ArrayList<>();
            for (String user : users) {
                UserScramCredentialsDescription has = existing.get(user);
                if (has == null || has.credentialInfos().stream().noneMatch(i -> i.mechanism() == mechanism)) {
                    missing.add(new UserScramCredentialUpsertion(user, new ScramCredentialInfo(mechanism, 8192), password));
                    added.add(user + " (" + mechanism.mechanismName() + ")");
                }
            }
            if (!missing.isEmpty()) {
                admin.alterUserScramCredentials(missing).all().get();
            }
        }
        System.out.println("SASL users added: " + (added.isEmpty() ? "none" : String.join(", ", added)));
    }

    // The controller acknowledges a new topic once it is in the metadata log;
    // each broker applies that log on its own, so the broker asked right after
    // may not know the topic yet (on three nodes, about one describe in ten).
    // The admin client does not retry that answer: it is retried here.
    static Collection<TopicDescription> describe(Admin admin, List<String> topics, long deadline)
            throws Exception {
        while (true) {
            try {
                return admin.describeTopics(topics).allTopicNames().get().values();
            } catch (ExecutionException e) {
                if (!(e.getCause() instanceof UnknownTopicOrPartitionException)
                        || System.currentTimeMillis() > deadline) {
                    throw e;
                }
            }
            Thread.sleep(200);
        }
    }
}
