package io.kappaflow.iot;

import com.fasterxml.jackson.core.JsonProcessingException;
import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.node.ObjectNode;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Iterator;
import java.util.List;
import org.apache.spark.api.java.function.MapFunction;
import org.apache.spark.sql.Dataset;
import org.apache.spark.sql.Encoders;
import org.apache.spark.sql.Row;
import org.apache.spark.sql.streaming.ListState;
import org.apache.spark.sql.streaming.MapState;
import org.apache.spark.sql.streaming.OutputMode;
import org.apache.spark.sql.streaming.StatefulProcessor;
import org.apache.spark.sql.streaming.TTLConfig;
import org.apache.spark.sql.streaming.TimeMode;
import org.apache.spark.sql.streaming.TimerValues;
import org.apache.spark.sql.streaming.ValueState;
import scala.Tuple3;
import scala.jdk.javaapi.CollectionConverters;

/**
 * The IoT scorer as a stateful processor on the JVM, which Spark runs in real-time mode.
 *
 * <p>Its input is one stream of readings and {@code models} records, keyed by the JSON array
 * {@code [device, metric]} (column {@code key}); {@code kind} says which a row is ({@code
 * reading}, {@code model}, {@code bad} for a record that did not parse, with its {@code reason},
 * or anything else for a row to pass over, such as a tombstone or a raw reading the cleaning job
 * refuses). With {@code dedupMs} above 0 (raw readings), a reading whose id the key scored in the
 * last {@code dedupMs} is passed over. With {@code registry}, rows of kind {@code registered} and
 * {@code unregistered} (from the device registry) say whether the key's device is registered;
 * the readings of a key whose device is not are held for {@link #HELD_MS} of processing time
 * ({@link #HELD_MOST} at most), scored in order if the registration comes within it, and
 * passed over otherwise. Per key it keeps the newest parameters it was given and the scorer's
 * memory; each reading's score goes out as it comes, as a {@code (topic, key, value)} row for
 * Kafka; a {@code models} record it cannot score with goes to the dead-letter topic with the
 * reason and its bytes, and the key keeps its last parameters.
 */
public final class RealtimeScoring {
  /** How long a reading of a device not registered waits for the device's registration. */
  static final long HELD_MS = 60_000L;
  /** How many readings a key holds at most; the rest are passed over. */
  static final int HELD_MOST = 1_000;
  /**
   * When Spark forgets held readings: a state's TTL counts from its batch's start, and a
   * real-time batch lasts up to the checkpoint interval (5 minutes), so HELD_MS itself is
   * checked against each reading's own time of arrival when it is released.
   */
  static final long HELD_TTL_MS = HELD_MS + 10 * 60_000L;

  private RealtimeScoring() {}

  /** The scored stream of {@code input}: rows {@code (_1 topic, _2 key, _3 value)}. */
  public static Dataset<Tuple3<String, String, String>> apply(
      Dataset<Row> input,
      String scoresTopic,
      String deadLetterTopic,
      String job,
      String defaultFamily,
      long ttlMs,
      long dedupMs,
      boolean registry) {
    if (SeriesScorer.family(defaultFamily) == null) {
      throw new IllegalArgumentException(
          "the real-time scorer scores the forecast, likelihood and robust families, not "
              + defaultFamily);
    }
    return input
        .groupByKey((MapFunction<Row, String>) r -> r.getAs("key"), Encoders.STRING())
        .transformWithState(
            new Processor(
                scoresTopic, deadLetterTopic, job, defaultFamily, ttlMs, dedupMs, registry),
            // State that expires is timed by processing time: Spark's TTL needs that mode.
            ttlMs > 0 || dedupMs > 0 || registry ? TimeMode.ProcessingTime() : TimeMode.None(),
            OutputMode.Update(),
            Encoders.tuple(Encoders.STRING(), Encoders.STRING(), Encoders.STRING()));
  }

  static final class Processor
      extends StatefulProcessor<String, Row, Tuple3<String, String, String>> {
    private final String scoresTopic;
    private final String deadLetterTopic;
    private final String job;
    private final String defaultFamily;
    private final long ttlMs;
    private final long dedupMs;
    private final boolean registry;
    private transient ValueState<String> memory;
    private transient ValueState<String> params;
    private transient ValueState<Long> version;
    private transient ValueState<String> run;
    private transient ValueState<Long> seq;
    private transient MapState<String, Boolean> sent;
    private transient ValueState<Boolean> registered;
    private transient ListState<String> held;
    private transient ValueState<Integer> heldCount;

    Processor(
        String scoresTopic,
        String deadLetterTopic,
        String job,
        String defaultFamily,
        long ttlMs,
        long dedupMs,
        boolean registry) {
      this.scoresTopic = scoresTopic;
      this.deadLetterTopic = deadLetterTopic;
      this.job = job;
      this.defaultFamily = defaultFamily;
      this.ttlMs = ttlMs;
      this.dedupMs = dedupMs;
      this.registry = registry;
    }

    @Override
    public void init(OutputMode outputMode, TimeMode timeMode) {
      TTLConfig ttl = ttlMs > 0 ? TTLConfig.apply(Duration.ofMillis(ttlMs)) : TTLConfig.NONE();
      memory = getHandle().getValueState("memory", Encoders.STRING(), ttl);
      params = getHandle().getValueState("params", Encoders.STRING(), ttl);
      version = getHandle().getValueState("version", Encoders.LONG(), ttl);
      run = getHandle().getValueState("run", Encoders.STRING(), ttl);
      seq = getHandle().getValueState("seq", Encoders.LONG(), ttl);
      if (dedupMs > 0) {
        // The ids of the key's readings scored in the last dedupMs (of processing time).
        TTLConfig recent = TTLConfig.apply(Duration.ofMillis(dedupMs));
        sent = getHandle().getMapState("sent", Encoders.STRING(), Encoders.BOOLEAN(), recent);
      }
      if (registry) {
        // Not forgotten with the rest: the registry is read once, not again for a quiet key.
        registered =
            getHandle().getValueState("registered", Encoders.BOOLEAN(), TTLConfig.NONE());
        // The readings of a device not (yet) registered, each for HELD_MS, and how many.
        TTLConfig forget = TTLConfig.apply(Duration.ofMillis(HELD_TTL_MS));
        held = getHandle().getListState("held", Encoders.STRING(), forget);
        heldCount = getHandle().getValueState("heldCount", Encoders.INT(), forget);
      }
    }

    @Override
    public scala.collection.Iterator<Tuple3<String, String, String>> handleInputRows(
        String key, scala.collection.Iterator<Row> rows, TimerValues timers) {
      List<Tuple3<String, String, String>> out = new ArrayList<>();
      try {
        KeyRun k = new KeyRun(key, out);
        // The call's rows need not come in their topics' order: of the registry's, the
        // newest (by offset) is the device's standing, taken before the call's readings,
        // as the cleaning job takes the registry as it is at each micro-batch.
        List<Row> rest = new ArrayList<>();
        Row standing = null;
        while (rows.hasNext()) {
          Row r = rows.next();
          String kind = r.getAs("kind");
          boolean entry = "registered".equals(kind) || "unregistered".equals(kind);
          if (entry && registered != null) {
            long offset = r.<Long>getAs("src_offset");
            if (standing == null || offset > standing.<Long>getAs("src_offset")) {
              standing = r;
            }
          } else {
            rest.add(r);
          }
        }
        if (standing != null && "registered".equals(standing.getAs("kind"))) {
          registered.update(true);
          // The readings that came before the registration, in the order they came.
          if (held.exists()) {
            long now = System.currentTimeMillis();
            Iterator<String> waiting = CollectionConverters.asJava(held.get());
            while (waiting.hasNext()) {
              JsonNode entry = SeriesScorer.JSON.readTree(waiting.next());
              if (now - entry.path("held_at").asLong(0L) <= HELD_MS) {
                k.read(Reading.parse(entry));
              }
            }
          }
          forgetHeld();
        } else if (standing != null) {
          registered.clear();
          forgetHeld();
        }
        for (Row r : rest) {
          String kind = r.getAs("kind");
          if ("bad".equals(kind)) {
            out.add(deadLetter(r, r.getAs("reason")));
          } else if ("model".equals(kind)) {
            // A record that cannot be scored with is a dead letter whatever its version.
            String problem = problem(r);
            if (problem != null) {
              out.add(deadLetter(r, problem));
              continue;
            }
            k.model(r.<Long>getAs("version"), r.getAs("params"));
          } else if ("reading".equals(kind)) {
            Reading reading = Reading.of(r);
            if (registered != null && !registered.exists()) {
              // Held for a while: the registry and the readings are read side by side, so
              // a device's registration may come after its first readings.
              int count = heldCount.exists() ? heldCount.get() : 0;
              if (count < HELD_MOST) {
                held.appendValue(reading.json(System.currentTimeMillis()));
                heldCount.update(count + 1);
              }
              continue;
            }
            k.read(reading);
          }
        }
        k.save();
      } catch (JsonProcessingException e) {
        throw new IllegalStateException("the scorer's memory is not JSON: " + e.getMessage(), e);
      }
      return CollectionConverters.asScala(out.iterator());
    }

    /** One call for one key: its state as loaded, what it scores, and what is stored. */
    private final class KeyRun {
      private final String key;
      private final List<Tuple3<String, String, String>> out;
      private long known;
      private String text;
      private Params current;
      private String remembered;
      // The key's run (its first reading's id) and readings scored in it, as the
      // micro-batch scorer numbers them: a reading scored again has the same pair.
      private String runId;
      private long scored;
      private SeriesScorer scorer;

      KeyRun(String key, List<Tuple3<String, String, String>> out) {
        this.key = key;
        this.out = out;
        known = version.exists() ? version.get() : 0L;
        text = params.exists() ? params.get() : null;
        current = stored(text);
        remembered = memory.exists() ? memory.get() : "";
        runId = run.exists() ? run.get() : null;
        scored = seq.exists() ? seq.get() : 0L;
      }

      /**
       * The key's stored parameters; null for none, or for those of an earlier version that
       * this one cannot score with (no {@code tail}): the key scores 0 until the next version.
       */
      private Params stored(String stored) {
        if (stored == null) {
          return null;
        }
        try {
          return Params.parse(stored);
        } catch (IllegalArgumentException e) {
          return null;
        }
      }

      void model(long given, String newer) {
        if (given > known) {
          text = newer;
          current = Params.parse(newer);
          known = given;
        }
      }

      void read(Reading reading) throws JsonProcessingException {
        if (sent != null) {
          // A reading sent twice (raw readings: the cleaning job's dedup) is scored once.
          if (sent.containsKey(reading.id())) {
            return;
          }
          sent.updateValue(reading.id(), true);
        }
        SeriesScorer.Family family =
            SeriesScorer.family(current != null ? current.model : defaultFamily);
        if (scorer == null || scorer.family() != family) {
          remembered = scorer != null ? scorer.state() : remembered;
          scorer = SeriesScorer.restore(family.name().toLowerCase(), remembered);
        }
        double score = scorer.score(reading.value(), current);
        runId = runId != null ? runId : reading.id();
        scored += 1;
        out.add(new Tuple3<>(scoresTopic, key, scoreJson(reading, score)));
      }

      void save() throws JsonProcessingException {
        if (scorer != null) {
          memory.update(scorer.state());
          run.update(runId);
          seq.update(scored);
        }
        if (text != null) {
          params.update(text);
          version.update(known);
        }
      }

      private String scoreJson(Reading r, double score) {
        ObjectNode s = SeriesScorer.JSON.createObjectNode();
        s.put("device", r.device());
        s.put("metric", r.metric());
        s.put("value", r.value());
        s.put("time", r.time());
        s.put("id", r.id());
        s.put("score", score);
        if (current == null) {
          s.putNull("model");
          s.putNull("model_version");
        } else {
          s.put("model", current.model);
          s.put("model_version", known);
        }
        s.put("run", runId);
        s.put("seq", scored);
        // The explanation, as the micro-batch scorer writes it (null where it has none).
        putOrNull(s, "expected_low", scorer.expectedLow());
        putOrNull(s, "expected_high", scorer.expectedHigh());
        putOrNull(s, "likelihood", scorer.likelihood());
        return s.toString();
      }
    }

    private static void putOrNull(ObjectNode node, String field, Double value) {
      if (value == null) {
        node.putNull(field);
      } else {
        node.put(field, value.doubleValue());
      }
    }

    private void forgetHeld() {
      held.clear();
      heldCount.clear();
    }

    /** Why a {@code models} record's parameters cannot be scored with, or null. */
    private static String problem(Row r) {
      String text = r.getAs("params");
      if (text == null) {
        return "params are not JSON text";
      }
      try {
        Params p = Params.parse(text);
        if (!p.model.equals(r.getAs("model"))) {
          return "params are of another model family than the record";
        }
        return null;
      } catch (IllegalArgumentException e) {
        return e.getMessage();
      }
    }

    private Tuple3<String, String, String> deadLetter(Row r, String reason) {
      ObjectNode d = SeriesScorer.JSON.createObjectNode();
      d.put("error", reason);
      d.put("schema", r.<String>getAs("schema"));
      d.put("job", job);
      d.put("source_topic", r.<String>getAs("src_topic"));
      d.put("source_partition", r.<Integer>getAs("src_partition"));
      d.put("source_offset", r.<Long>getAs("src_offset"));
      d.put("value_base64", r.<String>getAs("value_base64"));
      return new Tuple3<>(deadLetterTopic, null, d.toString());
    }
  }

  /** A reading as the scorer takes it: from an input row, or held as JSON for a while. */
  record Reading(String device, String metric, double value, String time, String id) {
    static Reading of(Row r) {
      return new Reading(
          r.getAs("device"), r.getAs("metric"), r.<Double>getAs("value"), r.getAs("time"),
          r.getAs("id"));
    }

    static Reading parse(JsonNode n) {
      return new Reading(
          n.get("device").asText(),
          n.get("metric").asText(),
          n.get("value").asDouble(),
          n.path("time").isNull() ? null : n.get("time").asText(),
          n.get("id").asText());
    }

    /** The reading as JSON, with when it was held ({@code held_at}, epoch ms). */
    String json(long heldAt) {
      ObjectNode n = SeriesScorer.JSON.createObjectNode();
      n.put("device", device);
      n.put("metric", metric);
      n.put("value", value);
      n.put("time", time);
      n.put("id", id);
      n.put("held_at", heldAt);
      return n.toString();
    }
  }
}
