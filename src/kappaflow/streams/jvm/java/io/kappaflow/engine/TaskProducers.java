package io.kappaflow.engine;

import java.time.Duration;
import java.util.ArrayList;
import java.util.Comparator;
import java.util.List;
import java.util.Map;
import java.util.TreeMap;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import org.apache.kafka.clients.producer.KafkaProducer;

/**
 * The tasks' transactional producers of this JVM, kept between batches: a task takes the
 * producer of its transactional id, uses it for its batch and gives it back, so a batch costs no
 * {@code initTransactions()} and no read of the marker topic once the JVM has written the
 * partition before.
 *
 * <p>A producer comes with the last batch this JVM knows committed for its partition (the one it
 * committed itself, or read from the markers). That knowledge holds while the producer is not
 * fenced: any other writer of the partition uses the same transactional id, and its {@code
 * initTransactions()} fences this producer first. The task finds out with its first record
 * (KafkaOutput.Task), then starts again with a fresh producer and reads the markers. A producer
 * whose task failed is closed, never given back.
 */
final class TaskProducers {
  /** No batch known: the markers say. */
  static final long UNKNOWN = Long.MIN_VALUE;

  /** Producers idle for longer than this are closed (a job stopped, or its partition moved). */
  private static final long IDLE_MS = 120_000;

  /** At most this many idle producers; the longest idle go first. */
  private static final int MAX_IDLE = 64;

  private static final Map<String, Held> IDLE = new ConcurrentHashMap<>();

  /** Closes producers away from the tasks' threads (a close waits for the network thread). */
  private static final ExecutorService CLOSER =
      Executors.newSingleThreadExecutor(
          runnable -> {
            Thread thread = new Thread(runnable, "kappaflow-producer-closer");
            thread.setDaemon(true);
            return thread;
          });

  private TaskProducers() {}

  /** A producer with what its JVM knows of its partition's markers. */
  static final class Held {
    final String id;
    final KafkaProducer<byte[], byte[]> producer;
    /** Whether it served a batch before (a fresh one's initTransactions just fenced others). */
    boolean reused;
    /** The last batch known committed for its partition, or {@link #UNKNOWN}. */
    long committed = UNKNOWN;

    long idleSince;

    Held(String id, KafkaProducer<byte[], byte[]> producer) {
      this.id = id;
      this.producer = producer;
    }
  }

  /** The pool's key: the transactional id on one cluster (the client's properties). */
  static String key(String id, Map<String, String> config) {
    return id + "\u0000" + new TreeMap<>(config);
  }

  /** The idle producer of {@code key}, now the caller's alone, or null. */
  static Held take(String key) {
    Held held = IDLE.remove(key);
    if (held != null) {
      held.reused = true;
    }
    evictIdle();
    return held;
  }

  /** A producer whose batch is committed (or skipped), for the next batch of its partition. */
  static void give(String key, Held held) {
    held.idleSince = System.currentTimeMillis();
    Held before = IDLE.put(key, held);
    if (before != null && before != held) {
      close(before);
    }
    evictIdle();
  }

  /** Closes the idle producers of transactional id {@code id} (a fence of it is coming). */
  static void drop(String id) {
    for (Map.Entry<String, Held> entry : IDLE.entrySet()) {
      if (entry.getValue().id.equals(id) && IDLE.remove(entry.getKey(), entry.getValue())) {
        close(entry.getValue());
      }
    }
  }

  /** How many producers are idle in this JVM. */
  static int idle() {
    return IDLE.size();
  }

  /** Closes {@code held}'s producer, without waiting and without throwing. */
  static void close(Held held) {
    CLOSER.execute(
        () -> {
          try {
            held.producer.close(Duration.ofSeconds(5));
          } catch (RuntimeException ignored) {
            // closing a fenced or broken producer: nothing to keep
          }
        });
  }

  private static void evictIdle() {
    long now = System.currentTimeMillis();
    List<Map.Entry<String, Held>> entries = new ArrayList<>(IDLE.entrySet());
    entries.sort(Comparator.comparingLong(e -> e.getValue().idleSince));
    int over = entries.size() - MAX_IDLE;
    for (Map.Entry<String, Held> entry : entries) {
      boolean stale = now - entry.getValue().idleSince > IDLE_MS;
      if ((over > 0 || stale) && IDLE.remove(entry.getKey(), entry.getValue())) {
        close(entry.getValue());
        over--;
      }
    }
  }
}
