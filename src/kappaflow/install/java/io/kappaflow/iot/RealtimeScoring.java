package io.kappaflow.iot;

import com.fasterxml.jackson.core.JsonProcessingException;
import com.fasterxml.jackson.databind.node.ObjectNode;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import org.apache.spark.api.java.function.MapFunction;
import org.apache.spark.sql.Dataset;
import org.apache.spark.sql.Encoders;
import org.apache.spark.sql.Row;
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
 * last {@code dedupMs} is passed over. Per key it keeps the newest parameters it was given and
 * the scorer's memory;
 * each reading's score goes out as it comes, as a {@code (topic, key, value)} row for Kafka; a
 * {@code models} record it cannot score with goes to the dead-letter topic with the reason and
 * its bytes, and the key keeps its last parameters.
 */
public final class RealtimeScoring {
  private RealtimeScoring() {}

  /** The scored stream of {@code input}: rows {@code (_1 topic, _2 key, _3 value)}. */
  public static Dataset<Tuple3<String, String, String>> apply(
      Dataset<Row> input,
      String scoresTopic,
      String deadLetterTopic,
      String job,
      String defaultFamily,
      long ttlMs,
      long dedupMs) {
    if (SeriesScorer.family(defaultFamily) == null) {
      throw new IllegalArgumentException(
          "the real-time scorer scores the forecast and robust families, not " + defaultFamily);
    }
    return input
        .groupByKey((MapFunction<Row, String>) r -> r.getAs("key"), Encoders.STRING())
        .transformWithState(
            new Processor(scoresTopic, deadLetterTopic, job, defaultFamily, ttlMs, dedupMs),
            // State that expires is timed by processing time: Spark's TTL needs that mode.
            ttlMs > 0 || dedupMs > 0 ? TimeMode.ProcessingTime() : TimeMode.None(),
            OutputMode.Update(),
            Encoders.tuple(Encoders.STRING(), Encoders.STRING(), Encoders.STRING()));
  }

  static final class Processor extends StatefulProcessor<String, Row, Tuple3<String, String, String>> {
    private final String scoresTopic;
    private final String deadLetterTopic;
    private final String job;
    private final String defaultFamily;
    private final long ttlMs;
    private final long dedupMs;
    private transient ValueState<String> memory;
    private transient ValueState<String> params;
    private transient ValueState<Long> version;
    private transient ValueState<String> run;
    private transient ValueState<Long> seq;
    private transient MapState<String, Boolean> sent;

    Processor(
        String scoresTopic,
        String deadLetterTopic,
        String job,
        String defaultFamily,
        long ttlMs,
        long dedupMs) {
      this.scoresTopic = scoresTopic;
      this.deadLetterTopic = deadLetterTopic;
      this.job = job;
      this.defaultFamily = defaultFamily;
      this.ttlMs = ttlMs;
      this.dedupMs = dedupMs;
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
    }

    @Override
    public scala.collection.Iterator<Tuple3<String, String, String>> handleInputRows(
        String key, scala.collection.Iterator<Row> rows, TimerValues timers) {
      List<Tuple3<String, String, String>> out = new ArrayList<>();
      try {
        long known = version.exists() ? version.get() : 0L;
        String text = params.exists() ? params.get() : null;
        Params current = text != null ? Params.parse(text) : null;
        String remembered = memory.exists() ? memory.get() : "";
        // The key's run (its first reading's id) and readings scored in it, as the
        // micro-batch scorer numbers them: a reading scored again has the same pair.
        String runId = run.exists() ? run.get() : null;
        long scored = seq.exists() ? seq.get() : 0L;
        SeriesScorer scorer = null;
        while (rows.hasNext()) {
          Row r = rows.next();
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
            long given = r.<Long>getAs("version");
            if (given <= known) {
              continue;
            }
            text = r.getAs("params");
            current = Params.parse(text);
            known = given;
          } else if ("reading".equals(kind)) {
            if (sent != null) {
              // A reading sent twice (raw readings: the cleaning job's dedup) is scored once.
              String id = r.getAs("id");
              if (sent.containsKey(id)) {
                continue;
              }
              sent.updateValue(id, true);
            }
            SeriesScorer.Family family =
                SeriesScorer.family(current != null ? current.model : defaultFamily);
            if (scorer == null || scorer.family() != family) {
              remembered = scorer != null ? scorer.state() : remembered;
              scorer = SeriesScorer.restore(family.name().toLowerCase(), remembered);
            }
            double score = scorer.score(r.<Double>getAs("value"), current);
            runId = runId != null ? runId : r.<String>getAs("id");
            scored += 1;
            out.add(
                new Tuple3<>(scoresTopic, key, scoreJson(r, score, current, known, runId, scored)));
          }
        }
        if (scorer != null) {
          memory.update(scorer.state());
          run.update(runId);
          seq.update(scored);
        }
        if (text != null) {
          params.update(text);
          version.update(known);
        }
      } catch (JsonProcessingException e) {
        throw new IllegalStateException("the scorer's memory is not JSON: " + e.getMessage(), e);
      }
      return CollectionConverters.asScala(out.iterator());
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

    private String scoreJson(
        Row r, double score, Params current, long known, String runId, long scored) {
      ObjectNode s = SeriesScorer.JSON.createObjectNode();
      s.put("device", r.<String>getAs("device"));
      s.put("metric", r.<String>getAs("metric"));
      s.put("value", r.<Double>getAs("value"));
      s.put("time", r.<String>getAs("time"));
      s.put("id", r.<String>getAs("id"));
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
      return s.toString();
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
}
