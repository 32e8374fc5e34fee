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
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.clients.producer.ProducerRecord;
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
 */
public final class KafkaOutput {
  private static final ObjectMapper JSON = new ObjectMapper();

  private KafkaOutput() {}

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
      try (KafkaProducer<byte[], byte[]> producer =
          producer(config, transactionalId(job, output, partition))) {
        // Fences off an earlier attempt at this partition and aborts what it left open.
        producer.initTransactions();
        if (committedBatch(partition, timeoutMs) >= batchId) {
          long n = 0;
          for (; rows.hasNext(); rows.next()) {
            n++;
          }
          return Collections.singletonList(new long[] {n, 0, 1}).iterator();
        }
        producer.beginTransaction();
        long n = 0;
        try {
          while (rows.hasNext()) {
            Row row = rows.next();
            byte[] key = row.isNullAt(1) ? null : (byte[]) row.get(1);
            producer.send(new ProducerRecord<>(row.getString(0), key, (byte[]) row.get(2)));
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
          byte[] key = markerKey(output, partition).getBytes(StandardCharsets.UTF_8);
          producer.send(new ProducerRecord<>(markerTopic, key, JSON.writeValueAsBytes(marker)));
          producer.commitTransaction();
        } catch (RuntimeException e) {
          try {
            producer.abortTransaction();
          } catch (RuntimeException ignored) {
            // fenced or broken: the next attempt's initTransactions aborts it
          }
          throw e;
        }
        return Collections.singletonList(new long[] {n, n, 0}).iterator();
      }
    }

    /**
     * The last batch committed for {@code partition} (-1 for none), from the markers at or
     * after {@code markersFrom}. Reads up to the log's end as it is now: a transaction still
     * open there (another task's, committing) is waited for, at most {@code timeoutMs}.
     */
    private long committedBatch(int partition, long timeoutMs) throws Exception {
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
