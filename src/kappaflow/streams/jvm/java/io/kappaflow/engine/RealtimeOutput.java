package io.kappaflow.engine;

import java.net.URI;
import java.util.HashMap;
import java.util.Map;
import java.util.Properties;
import java.util.concurrent.TimeoutException;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.serialization.ByteArraySerializer;
import org.apache.spark.sql.Dataset;
import org.apache.spark.sql.ForeachWriter;
import org.apache.spark.sql.Row;
import org.apache.spark.sql.catalyst.expressions.Expression;
import org.apache.spark.sql.catalyst.plans.logical.LogicalPlan;
import org.apache.spark.sql.streaming.StreamingQuery;
import org.apache.spark.sql.streaming.Trigger;
import redis.clients.jedis.Jedis;
import scala.jdk.javaapi.CollectionConverters;

/**
 * The outputs of a query in Spark's real-time mode, written by its tasks record by record: no
 * Kafka transaction could span a real-time batch (minutes, while readers wait), so the records
 * are keyed and versioned instead, and written at least once.
 *
 * <p>The rows have the columns {@code topic}, {@code key}, {@code value} (a Kafka record; topic
 * null for none) and {@code target}, {@code skey}, {@code field}, {@code svalue}, {@code
 * version} (a serving-store write; target null for none). A batch run again after a failure
 * sends its records again: each carries the same key and version as before (a window's key is
 * its key and start, its version counts its changes), so a consumer keeps the highest version
 * per key. The serving store takes a window's value only if its version is above the one it
 * holds, so a replay never moves it back.
 */
public final class RealtimeOutput {
  private RealtimeOutput() {}

  /**
   * A window's value, set only over a lower version. KEYS: the window hash, the keys set.
   * ARGV: the window's start, the value (empty: a retraction), its version, the key.
   */
  static final String SET_WINDOW =
      "local held = redis.call('HGET', KEYS[1], ARGV[1])\n"
          + "if held then\n"
          + "  local v = tonumber(string.match(held, '\"version\":(%d+)'))\n"
          + "  if v and v >= tonumber(ARGV[3]) then return 0 end\n"
          + "end\n"
          + "if ARGV[2] == '' then redis.call('HDEL', KEYS[1], ARGV[1]) return 1 end\n"
          + "redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])\n"
          + "redis.call('SADD', KEYS[2], ARGV[4])\n"
          + "return 1\n";

  /**
   * Starts {@code rows}' query in real-time mode ({@code interval}: how long a batch runs
   * before its offsets and state are checkpointed). {@code kafkaJson}: the Kafka client's
   * properties; {@code prefix}, {@code redisUrl} (empty: no store), {@code username}, {@code
   * password}: the serving store's.
   */
  public static StreamingQuery start(
      Dataset<Row> rows,
      String name,
      String checkpoint,
      String interval,
      String kafkaJson,
      String prefix,
      String redisUrl,
      String username,
      String password)
      throws Exception {
    Writer writer =
        new Writer(KafkaOutput.readMap(kafkaJson), prefix, redisUrl, username, password);
    try {
      return rows.select("topic", "key", "value", "target", "skey", "field", "svalue", "version")
          .writeStream()
          .queryName(name)
          .outputMode("update")
          .option("checkpointLocation", checkpoint)
          .foreach(writer)
          .trigger(Trigger.RealTime(interval))
          .start();
    } catch (TimeoutException e) {
      throw new IllegalStateException("the real-time query " + name + " did not start", e);
    }
  }

  /**
   * The first operator of {@code frame}'s analyzed plan that runs Python code: a Python UDF's
   * call as the plan writes it (with expression ids), else a Python operator's node name;
   * null if there is none.
   */
  public static String pythonOperator(Dataset<Row> frame) {
    return pythonIn(frame.queryExecution().analyzed());
  }

  private static String pythonIn(LogicalPlan plan) {
    for (Expression e : CollectionConverters.asJava(plan.expressions())) {
      String found = pythonIn(e);
      if (found != null) {
        return found;
      }
    }
    for (LogicalPlan child : CollectionConverters.asJava(plan.children())) {
      String found = pythonIn(child);
      if (found != null) {
        return found;
      }
    }
    String node = plan.getClass().getSimpleName();
    if (node.contains("Python") || node.contains("Pandas") || node.contains("InArrow")) {
      return node;
    }
    return null;
  }

  private static String pythonIn(Expression e) {
    String name = e.getClass().getSimpleName();
    if (name.startsWith("PythonUD")) {
      return "the Python UDF " + e.toString();
    }
    for (Expression child : CollectionConverters.asJava(e.children())) {
      String found = pythonIn(child);
      if (found != null) {
        return found;
      }
    }
    return null;
  }

  static final class Writer extends ForeachWriter<Row> {
    private static final long serialVersionUID = 1L;
    private final HashMap<String, String> kafka;
    private final String prefix;
    private final String redisUrl;
    private final String username;
    private final String password;
    private transient KafkaProducer<byte[], byte[]> producer;
    private transient Jedis jedis;
    private transient String script;

    Writer(
        Map<String, String> kafka,
        String prefix,
        String redisUrl,
        String username,
        String password) {
      this.kafka = new HashMap<>(kafka);
      this.prefix = prefix;
      this.redisUrl = redisUrl;
      this.username = username;
      this.password = password;
    }

    @Override
    public boolean open(long partitionId, long epochId) {
      return true;
    }

    private KafkaProducer<byte[], byte[]> producer() {
      if (producer == null) {
        Properties props = new Properties();
        props.putAll(kafka);
        // Idempotent: a retried send is not written twice; a replayed batch is, with the
        // same keys and versions.
        props.put(ProducerConfig.ENABLE_IDEMPOTENCE_CONFIG, "true");
        props.put(ProducerConfig.ACKS_CONFIG, "all");
        // Each record goes out as it comes: latency is what real-time mode is for.
        props.putIfAbsent(ProducerConfig.LINGER_MS_CONFIG, "0");
        producer = new KafkaProducer<>(props, new ByteArraySerializer(), new ByteArraySerializer());
      }
      return producer;
    }

    private Jedis jedis() {
      if (jedis == null) {
        jedis = new Jedis(URI.create(redisUrl), 30_000);
        if (password != null && !password.isEmpty()) {
          if (username != null && !username.isEmpty()) {
            jedis.auth(username, password);
          } else {
            jedis.auth(password);
          }
        }
        script = jedis.scriptLoad(SET_WINDOW);
      }
      return jedis;
    }

    @Override
    public void process(Row row) {
      if (!row.isNullAt(0)) {
        byte[] key = row.isNullAt(1) ? null : (byte[]) row.get(1);
        producer().send(new ProducerRecord<>(row.getString(0), key, (byte[]) row.get(2)));
      }
      if (!row.isNullAt(3) && !redisUrl.isEmpty()) {
        String target = row.getString(3);
        String value = row.isNullAt(6) ? "" : row.getString(6);
        if ("w".equals(target)) {
          String key = row.getString(4);
          jedis()
              .evalsha(
                  script,
                  java.util.Arrays.asList(prefix + "w:" + key, prefix + "keys"),
                  java.util.Arrays.asList(
                      row.getString(5), value, String.valueOf(row.getLong(7)), key));
        } else {
          jedis().hset(prefix + "latest", row.getString(5), value);
        }
      }
    }

    @Override
    public void close(Throwable error) {
      try {
        if (producer != null) {
          // Every record sent is acknowledged before the batch's offsets are checkpointed.
          producer.flush();
          producer.close();
        }
      } finally {
        producer = null;
        if (jedis != null) {
          jedis.close();
          jedis = null;
        }
      }
    }
  }
}
