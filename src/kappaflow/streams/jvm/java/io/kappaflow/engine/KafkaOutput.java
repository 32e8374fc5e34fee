package io.kappaflow.engine;

import com.fasterxml.jackson.core.type.TypeReference;
import com.fasterxml.jackson.databind.ObjectMapper;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Collections;
import java.util.HashMap;
import java.util.Iterator;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.Future;
import java.util.concurrent.atomic.AtomicLong;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.clients.producer.RecordMetadata;
import org.apache.kafka.common.PartitionInfo;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;
import org.apache.kafka.common.serialization.ByteArraySerializer;
import org.apache.spark.TaskContext;
import org.apache.spark.api.java.function.MapPartitionsFunction;
import org.apache.spark.sql.Dataset;
import org.apache.spark.sql.Encoders;
import org.apache.spark.sql.Row;

/**
 * A batch's Kafka records, written by the tasks that hold them: each task publishes its
 * partition of the batch in one transaction of its own, exactly once.
 *
 * <p>A task's producer has a transactional id of its own, stable across batches and runs
 * ({@code kappaflow.job.JOB.OUTPUT.pN}), so {@code initTransactions()} fences off and aborts
 * whatever an earlier attempt at that partition left open. The task then reads the partition's
 * marker in the job's marker topic ({@code JOB.commits}, key {@code OUTPUT#pN}) with a {@code
 * read_committed} consumer: a batch committed there already is skipped. Otherwise it sends the
 * partition's records and the marker in one transaction and commits. Spark re-runs a batch with
 * the same input and state, so a partition's records are the same on a re-run.
 *
 * <p>The producer then stays in its JVM for the partition's next batch (TaskProducers), with the
 * batch it committed: the next batch needs neither {@code initTransactions()} nor a read of the
 * markers. Its first record, acknowledged before the rest are sent, shows that no other attempt
 * took the transactional id since (that would have fenced it); if one did, the task starts over
 * with a fresh producer and reads the markers, as a fresh JVM does.
 */
public final class KafkaOutput {
  private static final ObjectMapper JSON = new ObjectMapper();

  /** How many times this JVM's tasks read the marker topic. */
  private static final AtomicLong MARKER_READS = new AtomicLong();

  private KafkaOutput() {}

  /** How many times this JVM's tasks read the marker topic (a task's producer new to it). */
  public static long markerReads() {
    return MARKER_READS.get();
  }

  /** How many of the tasks' producers are idle in this JVM, kept for their next batch. */
  public static int idleProducers() {
    return TaskProducers.idle();
  }

  /**
   * Writes {@code records} (columns {@code topic} string, {@code key} binary, {@code value}
   * binary; others are ignored) for batch {@code batchId} of {@code output}; returns JSON with
   * the batch's {@code records}, those {@code written} now, and the partitions {@code skipped}
   * (committed before). {@code committed} is the output's last batch whose marker the driver
   * committed (-1 for none). {@code markersFrom} is JSON: marker topic partition to the offset from
   * which this batch's markers may be (earlier ones are of batches committed before). {@code
   * configJson}: the Kafka client's properties (bootstrap, security).
   */
  public static String write(
      Dataset<Row> records,
      String job,
      String output,
      long batchId,
      long committed,
      String markerTopic,
      String markersFrom,
      String configJson)
      throws Exception {
    Task task =
        new Task(
            job,
            output,
            batchId,
            committed,
            markerTopic,
            readMap(markersFrom),
            readMap(configJson));
    Dataset<Row> rows = records.select("topic", "key", "value");
    List<long[]> counts = rows.mapPartitions(task, Encoders.javaSerialization(long[].class))
        .collectAsList();
    long total = 0;
    long written = 0;
    long skipped = 0;
    for (long[] count : counts) {
      total += count[0];
      written += count[1];
      skipped += count[2];
    }
    return JSON.writeValueAsString(
        Map.of("records", total, "written", written, "skipped", skipped));
  }

  /**
   * Fences off every producer of {@code output}'s partitions below {@code partitions}: what a
   * task of a driver that died left open is aborted now, so that no task waits for it.
   */
  public static void fence(String job, String output, int partitions, String configJson)
      throws Exception {
    Map<String, String> config = readMap(configJson);
    // One at a time, the initTransactions' round trips (coordinator, the transaction log's
    // write, the abort of what was open) add up for a first batch on a busy machine; the ids
    // are independent, so they are fenced side by side.
    ExecutorService pool = Executors.newFixedThreadPool(Math.max(1, Math.min(partitions, 16)));
    try {
      List<Future<?>> fenced = new ArrayList<>();
      for (int partition = 0; partition < partitions; partition++) {
        String id = transactionalId(job, output, partition);
        // This JVM's own producers of the id would be fenced: closed first (the tasks'
        // producers are this JVM's in local mode).
        TaskProducers.drop(id);
        fenced.add(
            pool.submit(
                () -> {
                  try (KafkaProducer<byte[], byte[]> producer = producer(config, id)) {
                    producer.initTransactions();
                  }
                  return null;
                }));
      }
      for (Future<?> each : fenced) {
        try {
          each.get();
        } catch (ExecutionException e) {
          Throwable cause = e.getCause();
          throw cause instanceof Exception ? (Exception) cause : e;
        }
      }
    } finally {
      pool.shutdownNow();
    }
  }

  /** The transactional id of the task writing {@code partition} of {@code output}. */
  public static String transactionalId(String job, String output, int partition) {
    return "kappaflow.job." + job + "." + output + ".p" + partition;
  }

  /** The key of {@code partition}'s marker in the job's marker topic. */
  public static String markerKey(String output, int partition) {
    return output + "#p" + partition;
  }

  static Map<String, String> readMap(String json) throws Exception {
    Map<String, Object> read = JSON.readValue(json, new TypeReference<Map<String, Object>>() {});
    Map<String, String> out = new HashMap<>();
    for (Map.Entry<String, Object> entry : read.entrySet()) {
      out.put(entry.getKey(), String.valueOf(entry.getValue()));
    }
    return out;
  }

  static KafkaProducer<byte[], byte[]> producer(Map<String, String> config, String id) {
    Properties props = new Properties();
    props.putAll(config);
    props.put(ProducerConfig.TRANSACTIONAL_ID_CONFIG, id);
    props.put(ProducerConfig.ENABLE_IDEMPOTENCE_CONFIG, "true");
    props.putIfAbsent(ProducerConfig.LINGER_MS_CONFIG, "20");
    props.putIfAbsent(ProducerConfig.COMPRESSION_TYPE_CONFIG, "lz4");
    return new KafkaProducer<>(props, new ByteArraySerializer(), new ByteArraySerializer());
  }

  /** One task's partition: counts of records, written and skipped partitions. */
  static final class Task implements MapPartitionsFunction<Row, long[]> {
    private static final long serialVersionUID = 1L;
    private final String job;
    private final String output;
    private final long batchId;
    private final long committed;
    private final String markerTopic;
    private final HashMap<String, String> markersFrom;
    private final HashMap<String, String> config;

    Task(
        String job,
        String output,
        long batchId,
        long committed,
        String markerTopic,
        Map<String, String> markersFrom,
        Map<String, String> config) {
      this.job = job;
      this.output = output;
      this.batchId = batchId;
      this.committed = committed;
      this.markerTopic = markerTopic;
      this.markersFrom = new HashMap<>(markersFrom);
      this.config = new HashMap<>(config);
    }

    @Override
    public Iterator<long[]> call(Iterator<Row> rows) throws Exception {
      if (!rows.hasNext()) {
        return Collections.singletonList(new long[] {0, 0, 0}).iterator();
      }
      int partition = TaskContext.getPartitionId();
      long timeoutMs = Long.parseLong(config.getOrDefault("transaction.timeout.ms", "60000"));
      String id = transactionalId(job, output, partition);
      String key = TaskProducers.key(id, config);
      TaskProducers.Held held = TaskProducers.take(key);
      try {
        if (held == null) {
          held = open(id);
        }
        if (held.committed == TaskProducers.UNKNOWN || batchId < held.committed) {
          // A batch below the one known committed: the job's log was reset; the markers say.
          held.committed = committedBatch(partition, timeoutMs);
        }
        if (held.committed >= batchId) {
          TaskProducers.give(key, held);
          return Collections.singletonList(new long[] {count(rows), 0, 1}).iterator();
        }
        ProducerRecord<byte[], byte[]> first = record(rows.next());
        held.producer.beginTransaction();
        if (held.reused) {
          // The producer's first record of the batch tells whether it is still the
          // partition's writer: if another attempt fenced it since its last batch, what this
          // JVM knows of the markers is stale too, so a fresh producer reads them again.
          try {
            Future<RecordMetadata> sent = held.producer.send(first);
            held.producer.flush();
            sent.get();
          } catch (ExecutionException | RuntimeException e) {
            TaskProducers.close(held);
            held = open(id);
            held.committed = committedBatch(partition, timeoutMs);
            if (held.committed >= batchId) {
              TaskProducers.give(key, held);
              return Collections.singletonList(new long[] {1 + count(rows), 0, 1}).iterator();
            }
            held.producer.beginTransaction();
            held.producer.send(first);
          }
        } else {
          held.producer.send(first);
        }
        long n = 1;
        while (rows.hasNext()) {
          held.producer.send(record(rows.next()));
          n++;
        }
        // The batch written is "written_batch"; "batch_id" and "totals" name the output's
        // batch committed before it, so that a reader taking the marker of the highest
        // "batch_id" in the topic finds the output's own marker of that batch, which is
        // earlier in the log.
        Map<String, Object> marker = new HashMap<>();
        marker.put("output", output);
        marker.put("partition", partition);
        marker.put("written_batch", batchId);
        marker.put("batch_id", committed);
        marker.put("totals", Map.of());
        marker.put("records", n);
        byte[] markerKey = markerKey(output, partition).getBytes(StandardCharsets.UTF_8);
        held.producer.send(
            new ProducerRecord<>(markerTopic, markerKey, JSON.writeValueAsBytes(marker)));
        held.producer.commitTransaction();
        held.committed = batchId;
        TaskProducers.give(key, held);
        return Collections.singletonList(new long[] {n, n, 0}).iterator();
      } catch (Exception | Error e) {
        if (held != null) {
          try {
            held.producer.abortTransaction();
          } catch (RuntimeException ignored) {
            // fenced, broken or with nothing open: the next attempt's initTransactions aborts it
          }
          TaskProducers.close(held);
        }
        throw e;
      }
    }

    /** A fresh producer of {@code id}: it fences off an earlier one and aborts what it left open. */
    private TaskProducers.Held open(String id) {
      KafkaProducer<byte[], byte[]> producer = producer(config, id);
      try {
        producer.initTransactions();
      } catch (RuntimeException e) {
        producer.close(Duration.ZERO);
        throw e;
      }
      return new TaskProducers.Held(id, producer);
    }

    private static ProducerRecord<byte[], byte[]> record(Row row) {
      byte[] key = row.isNullAt(1) ? null : (byte[]) row.get(1);
      return new ProducerRecord<>(row.getString(0), key, (byte[]) row.get(2));
    }

    private static long count(Iterator<Row> rows) {
      long n = 0;
      for (; rows.hasNext(); rows.next()) {
        n++;
      }
      return n;
    }

    /**
     * The last batch committed for {@code partition} (-1 for none), from the markers at or
     * after {@code markersFrom}. Reads up to the log's end as it is now: a transaction still
     * open there (another task's, committing) is waited for, at most {@code timeoutMs}.
     */
    private long committedBatch(int partition, long timeoutMs) throws Exception {
      MARKER_READS.incrementAndGet();
      String wanted = markerKey(output, partition);
      Map<String, Object> props = new HashMap<>(config);
      props.put(ConsumerConfig.ENABLE_AUTO_COMMIT_CONFIG, "false");
      props.put(ConsumerConfig.AUTO_OFFSET_RESET_CONFIG, "earliest");
      props.remove(ConsumerConfig.GROUP_ID_CONFIG);
      long found = -1;
      Map<TopicPartition, Long> ends;
      props.put(ConsumerConfig.ISOLATION_LEVEL_CONFIG, "read_uncommitted");
      List<TopicPartition> parts = new ArrayList<>();
      try (KafkaConsumer<byte[], byte[]> peek =
          new KafkaConsumer<>(props, new ByteArrayDeserializer(), new ByteArrayDeserializer())) {
        for (PartitionInfo info : peek.partitionsFor(markerTopic)) {
          parts.add(new TopicPartition(markerTopic, info.partition()));
        }
        ends = peek.endOffsets(parts);
      }
      props.put(ConsumerConfig.ISOLATION_LEVEL_CONFIG, "read_committed");
      try (KafkaConsumer<byte[], byte[]> reader =
          new KafkaConsumer<>(props, new ByteArrayDeserializer(), new ByteArrayDeserializer())) {
        reader.assign(parts);
        Map<TopicPartition, Long> starts = reader.beginningOffsets(parts);
        for (TopicPartition tp : parts) {
          long from = Long.parseLong(markersFrom.getOrDefault(String.valueOf(tp.partition()), "0"));
          reader.seek(tp, Math.min(Math.max(from, starts.get(tp)), ends.get(tp)));
        }
        long deadline = System.currentTimeMillis() + timeoutMs + 30_000;
        while (true) {
          boolean done = true;
          for (TopicPartition tp : parts) {
            if (reader.position(tp) < ends.get(tp)) {
              done = false;
            }
          }
          if (done) {
            return found;
          }
          if (System.currentTimeMillis() > deadline) {
            throw new IllegalStateException(
                "reading the markers of " + output + " in " + markerTopic + " took too long");
          }
          for (ConsumerRecord<byte[], byte[]> record : reader.poll(Duration.ofMillis(200))) {
            if (record.key() == null || record.value() == null) {
              continue;
            }
            if (!wanted.equals(new String(record.key(), StandardCharsets.UTF_8))) {
              continue;
            }
            Map<String, Object> marker =
                JSON.readValue(record.value(), new TypeReference<Map<String, Object>>() {});
            Object written = marker.get("written_batch");
            if (written instanceof Number) {
              found = Math.max(found, ((Number) written).longValue());
            }
          }
        }
      }
    }
  }
}
