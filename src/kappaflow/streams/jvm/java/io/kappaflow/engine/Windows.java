package io.kappaflow.engine;

import java.time.Instant;
import java.util.ArrayList;
import java.util.Collections;
import java.util.HashSet;
import java.util.Iterator;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Set;
import org.apache.spark.api.java.function.MapFunction;
import org.apache.spark.sql.Dataset;
import org.apache.spark.sql.Encoders;
import org.apache.spark.sql.Row;
import org.apache.spark.sql.RowFactory;
import org.apache.spark.sql.streaming.ExpiredTimerInfo;
import org.apache.spark.sql.streaming.MapState;
import org.apache.spark.sql.streaming.OutputMode;
import org.apache.spark.sql.streaming.StatefulProcessor;
import org.apache.spark.sql.streaming.TTLConfig;
import org.apache.spark.sql.streaming.TimeMode;
import org.apache.spark.sql.streaming.TimerValues;
import org.apache.spark.sql.streaming.ValueState;
import org.apache.spark.sql.types.DataTypes;
import org.apache.spark.sql.types.StructType;
import scala.Tuple2;
import scala.jdk.javaapi.CollectionConverters;

/**
 * Windowed aggregates by event time (tumbling and sliding windows), per key: the state machine
 * of streams/ops/windowing.py, run by Spark in its JVM as a {@code transformWithState}
 * processor.
 *
 * <p>Its input is one row per event and window (an event of a sliding window is in several),
 * grouped by (window_start, shard): the window, and a shard of the keys by hash. Per group the
 * state holds each key's accumulators and version (a map), the id hashes the window has counted
 * (with dedup), and whether the watermark has passed the window's end. Per micro-batch a key
 * whose values change gets one change: {@code provisional} before the watermark passes the
 * window's end, {@code correction} after. A timer at the end emits {@code final} for every key,
 * one at end + lateness forgets the window ({@code closed}); events for a forgotten window come
 * out as {@code late} rows, one per event. Every group also emits a {@code stats} row per batch.
 * Records that did not parse come in the group of window {@code DEAD_WINDOW} and go out as
 * {@code dlq} rows. A replayed dead letter that parsed comes in that group once more, with no
 * reason, and goes out as a {@code replay} row; in that group the key column holds which dead
 * letter a record replays (null: none).
 */
public final class Windows {
  /** The group of the records that did not parse (streams/kinds.py DEAD_WINDOW). */
  static final long DEAD_WINDOW = -1L;

  /** The output row's columns (windowing.py OUTPUT_ARROW_SCHEMA), in order. */
  static final StructType OUTPUT =
      new StructType()
          .add("kind", DataTypes.StringType)
          .add("key", DataTypes.StringType)
          .add("window_start", DataTypes.LongType)
          .add("window_end", DataTypes.LongType)
          .add("values", DataTypes.StringType)
          .add("previous", DataTypes.StringType)
          .add("version", DataTypes.LongType)
          .add("watermark", DataTypes.LongType)
          .add("events", DataTypes.LongType)
          .add("duplicates", DataTypes.LongType)
          .add("held", DataTypes.LongType)
          .add("reason", DataTypes.StringType)
          .add("value", DataTypes.BinaryType)
          .add("src_partition", DataTypes.IntegerType)
          .add("src_offset", DataTypes.LongType)
          .add("src_offset_end", DataTypes.LongType)
          .add("offsets", DataTypes.createArrayType(DataTypes.LongType));

  private Windows() {}

  /**
   * The output rows of {@code events}: columns window_start (long), shard (int), key (string:
   * the key's JSON array), primary (boolean: the event's newest window, where it is counted in
   * the statistics), src_partition (int), id_hash (long, null without an id), src_offset (long),
   * reason and value (a dead letter's), then the aggregates' inputs at the indexes {@code
   * aggregates} gives.
   */
  public static Dataset<Row> aggregate(
      Dataset<Row> events, String aggregates, long sizeMs, long latenessMs, boolean dedup) {
    Aggregates parsed = Aggregates.parse(aggregates);
    return events
        .groupByKey(
            (MapFunction<Row, Tuple2<Long, Integer>>)
                r -> new Tuple2<>(r.getLong(0), r.getInt(1)),
            Encoders.tuple(Encoders.LONG(), Encoders.INT()))
        .transformWithState(
            new Processor(parsed, sizeMs, latenessMs, dedup, events.isStreaming(), -1L),
            // A batch query has no watermark, so no event time: its windows stay open.
            events.isStreaming() ? TimeMode.EventTime() : TimeMode.None(),
            OutputMode.Update(),
            Encoders.row(OUTPUT));
  }

  /**
   * {@link #aggregate} for a query in real-time mode, where the event-time watermark moves only
   * between batches of minutes: the operator keeps a watermark of its own on the executor's
   * clock, {@code now - delayMs}, and its timers are processing-time ones, so that a window
   * becomes {@code final} once the clock is {@code delayMs} past its end and is forgotten
   * {@code latenessMs} after that, while the batch runs. {@code events} carry no watermark.
   * Events are taken as live: one whose window the clock has closed is {@code late}. No
   * {@code stats} rows (there would be one per event).
   */
  public static Dataset<Row> aggregateRealTime(
      Dataset<Row> events,
      String aggregates,
      long sizeMs,
      long latenessMs,
      long delayMs,
      boolean dedup) {
    if (delayMs < 0) {
      throw new IllegalArgumentException("the delay must not be negative: " + delayMs);
    }
    Aggregates parsed = Aggregates.parse(aggregates);
    return events
        .groupByKey(
            (MapFunction<Row, Tuple2<Long, Integer>>)
                r -> new Tuple2<>(r.getLong(0), r.getInt(1)),
            Encoders.tuple(Encoders.LONG(), Encoders.INT()))
        .transformWithState(
            new Processor(parsed, sizeMs, latenessMs, dedup, true, delayMs),
            TimeMode.ProcessingTime(),
            OutputMode.Update(),
            Encoders.row(OUTPUT));
  }

  static final int KEY = 2;
  static final int PRIMARY = 3;
  static final int PARTITION = 4;
  static final int ID = 5;
  static final int OFFSET = 6;
  static final int REASON = 7;
  static final int VALUE = 8;

  static Row row(
      String kind,
      String key,
      long start,
      long end,
      String values,
      String previous,
      long version,
      long watermark) {
    return RowFactory.create(
        kind, key, start, end, values, previous, version, watermark, 0L, 0L, 0L, null, null, -1,
        0L, 0L, null);
  }

  static Row stats(long start, long end, long watermark, long events, long duplicates, long held) {
    return RowFactory.create(
        "stats", null, start, end, null, null, 0L, watermark, events, duplicates, held, null,
        null, -1, 0L, 0L, null);
  }

  static final class Processor extends StatefulProcessor<Tuple2<Long, Integer>, Row, Row> {
    private final Aggregates aggregates;
    private final long sizeMs;
    private final long latenessMs;
    private final boolean dedup;
    /** Whether the query has event time (a stream's): a batch query's registers no timer. */
    private final boolean eventTime;
    /**
     * In real-time mode, how far the operator's watermark trails the executor's clock (its
     * timers are then processing-time ones, at a window's end plus this); -1 in micro-batches.
     */
    private final long clockDelayMs;
    /** The highest clock watermark this task has used: it never goes back. */
    private transient long clockWatermark = Long.MIN_VALUE;
    private transient MapState<String, byte[]> keys;
    private transient MapState<Long, Boolean> ids;
    /** How many keys the window holds; there is a state for the window when it is set. */
    private transient ValueState<Long> held;
    private transient ValueState<Boolean> finalized;

    Processor(
        Aggregates aggregates,
        long sizeMs,
        long latenessMs,
        boolean dedup,
        boolean eventTime,
        long clockDelayMs) {
      this.aggregates = aggregates;
      this.sizeMs = sizeMs;
      this.latenessMs = latenessMs;
      this.dedup = dedup;
      this.eventTime = eventTime;
      this.clockDelayMs = clockDelayMs;
    }

    private boolean realTime() {
      return clockDelayMs >= 0;
    }

    /**
     * The watermark the operator works with: Spark's (event time), or in real-time mode the
     * executor's clock less the delay, which moves with every row and timer check.
     */
    private long watermark(TimerValues timers) {
      if (!realTime()) {
        return timers.getCurrentWatermarkInMs();
      }
      clockWatermark =
          Math.max(clockWatermark, timers.getCurrentProcessingTimeInMs() - clockDelayMs);
      return clockWatermark;
    }

    /** A timer for when the watermark reaches {@code at}: on the clock in real-time mode. */
    private void timerAt(long at) {
      getHandle().registerTimer(realTime() ? at + clockDelayMs : at);
    }

    @Override
    public void init(OutputMode outputMode, TimeMode timeMode) {
      keys = getHandle().getMapState("keys", Encoders.STRING(), Encoders.BINARY(), TTLConfig.NONE());
      ids = getHandle().getMapState("ids", Encoders.LONG(), Encoders.BOOLEAN(), TTLConfig.NONE());
      held = getHandle().getValueState("held", Encoders.LONG(), TTLConfig.NONE());
      finalized = getHandle().getValueState("final", Encoders.BOOLEAN(), TTLConfig.NONE());
    }

    @Override
    public scala.collection.Iterator<Row> handleInputRows(
        Tuple2<Long, Integer> group, scala.collection.Iterator<Row> rows, TimerValues timers) {
      long watermark = watermark(timers);
      long start = group._1();
      List<Row> out = new ArrayList<>();
      if (start == DEAD_WINDOW) {
        while (rows.hasNext()) {
          Row r = rows.next();
          long offset = r.getLong(OFFSET);
          out.add(
              RowFactory.create(
                  r.isNullAt(REASON) ? "replay" : "dlq", r.getString(KEY), 0L, 0L, null, null,
                  0L, 0L, 0L, 0L, 0L, r.getString(REASON), r.get(VALUE), r.getInt(PARTITION),
                  offset, offset, null));
        }
        return iterator(out);
      }
      long end = start + sizeMs;
      if (end + latenessMs <= watermark) {
        String reason =
            "too late: window "
                + iso(start)
                + "/"
                + iso(end)
                + " stopped taking corrections "
                + latenessMs
                + " ms after the watermark passed its end (watermark "
                + iso(watermark)
                + ")";
        while (rows.hasNext()) {
          Row r = rows.next();
          if (!r.getBoolean(PRIMARY)) {
            continue;
          }
          long offset = r.getLong(OFFSET);
          out.add(
              RowFactory.create(
                  "late", r.getString(KEY), start, end, null, null, 0L, watermark, 1L, 0L, 0L,
                  reason, null, r.getInt(PARTITION), offset, offset,
                  CollectionConverters.asScala(Collections.singletonList(offset)).toSeq()));
        }
        return iterator(out);
      }
      boolean stored = held.exists();
      long keysBefore = stored ? held.get() : 0L;
      boolean wasFinal = stored && finalized.exists() && finalized.get();
      if (!stored && eventTime) {
        // A new window: its timers, once.
        if (end > watermark) {
          timerAt(end);
        }
        if (latenessMs > 0 || end <= watermark) {
          timerAt(end + latenessMs);
        }
      }
      boolean dirty = !stored;
      if (stored && !wasFinal && end <= watermark) {
        // The watermark passed the end but the timer has not fired yet (Spark runs the
        // timers after the input): the window becomes final first, and this batch's events
        // correct it.
        finalizeKeys(start, end, watermark, out);
        dirty = true;
      }
      boolean isFinal = wasFinal || end <= watermark;
      // The batch's counted events per key, in the order keys first come.
      Map<String, Aggregates.Accumulators> batch = new LinkedHashMap<>();
      Set<Long> seenNow = dedup ? new HashSet<>() : null;
      long counted = 0;
      long duplicates = 0;
      while (rows.hasNext()) {
        Row r = rows.next();
        boolean primary = r.getBoolean(PRIMARY);
        if (dedup && !r.isNullAt(ID)) {
          long id = r.getLong(ID);
          if (seenNow.contains(id) || ids.containsKey(id)) {
            if (primary) {
              duplicates++;
            }
            continue;
          }
          seenNow.add(id);
        }
        if (primary) {
          counted++;
        }
        batch.computeIfAbsent(r.getString(KEY), k -> aggregates.empty()).add(r);
      }
      if (dedup) {
        for (Long id : seenNow) {
          ids.updateValue(id, Boolean.TRUE);
        }
      }
      long keysNow = keysBefore;
      String kind = isFinal ? "correction" : "provisional";
      for (Map.Entry<String, Aggregates.Accumulators> entry : batch.entrySet()) {
        String key = entry.getKey();
        byte[] before = keys.getValue(key);
        Aggregates.Accumulators now;
        String previous = null;
        if (before == null) {
          now = aggregates.empty();
          keysNow++;
        } else {
          now = aggregates.read(before, watermark);
          previous = now.json();
        }
        now.merge(entry.getValue());
        String values = now.json();
        if (previous == null || !previous.equals(values)) {
          now.version += 1;
          out.add(row(kind, key, start, end, values, previous, now.version, watermark));
        }
        keys.updateValue(key, now.bytes());
        dirty = true;
      }
      if (dirty) {
        held.update(keysNow);
        finalized.update(isFinal);
      }
      if (!realTime()) {
        out.add(0, stats(start, end, watermark, counted, duplicates, keysNow - keysBefore));
      }
      return iterator(out);
    }

    /** Every key one version on, and its {@code final} row (values = previous = now). */
    private void finalizeKeys(long start, long end, long watermark, List<Row> out) {
      List<Tuple2<String, byte[]>> entries = new ArrayList<>();
      Iterator<Tuple2<String, byte[]>> all = CollectionConverters.asJava(keys.iterator());
      while (all.hasNext()) {
        entries.add(all.next());
      }
      for (Tuple2<String, byte[]> entry : entries) {
        Aggregates.Accumulators now = aggregates.read(entry._2(), watermark);
        now.version += 1;
        String values = now.json();
        out.add(row("final", entry._1(), start, end, values, values, now.version, watermark));
        keys.updateValue(entry._1(), now.bytes());
      }
      finalized.update(true);
    }

    @Override
    public scala.collection.Iterator<Row> handleExpiredTimer(
        Tuple2<Long, Integer> group, TimerValues timers, ExpiredTimerInfo expired) {
      long start = group._1();
      long end = start + sizeMs;
      // The watermark the timer was set for (a real-time timer is on the clock, later by the
      // delay).
      long expiry = expired.getExpiryTimeInMs() - (realTime() ? clockDelayMs : 0L);
      long watermark = Math.max(watermark(timers), realTime() ? expiry : Long.MIN_VALUE);
      List<Row> out = new ArrayList<>();
      if (!held.exists()) {
        return iterator(out);
      }
      boolean isFinal = finalized.exists() && finalized.get();
      if (expiry == end && !isFinal) {
        finalizeKeys(start, end, watermark, out);
      }
      if (expiry == end + latenessMs) {
        // No correction can come any more: forget the window and its ids.
        long n = held.get();
        keys.clear();
        ids.clear();
        held.clear();
        finalized.clear();
        out.add(
            RowFactory.create(
                "closed", null, start, end, null, null, 0L, watermark, 0L, 0L, -n, null, null, -1,
                0L, 0L, null));
      }
      return iterator(out);
    }
  }

  static scala.collection.Iterator<Row> iterator(List<Row> rows) {
    return CollectionConverters.asScala(rows.iterator());
  }

  /** An epoch millisecond as timeutil.iso writes it: UTC, milliseconds, a Z. */
  static String iso(long ms) {
    String text = Instant.ofEpochMilli(ms).toString();
    // Instant drops a zero fraction and shows more digits only when there are some.
    if (text.length() == 20) {
      return text.substring(0, 19) + ".000Z";
    }
    return text;
  }
}
