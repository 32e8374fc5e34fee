package io.kappaflow.engine;

import java.io.ByteArrayInputStream;
import java.io.ByteArrayOutputStream;
import java.io.DataInputStream;
import java.io.DataOutputStream;
import java.io.IOException;
import java.io.UncheckedIOException;
import java.util.ArrayList;
import java.util.Collections;
import java.util.Comparator;
import java.util.HashMap;
import java.util.HashSet;
import java.util.List;
import java.util.Map;
import java.util.Set;
import org.apache.spark.api.java.function.MapFunction;
import org.apache.spark.sql.Dataset;
import org.apache.spark.sql.Encoders;
import org.apache.spark.sql.Row;
import org.apache.spark.sql.RowFactory;
import org.apache.spark.sql.streaming.ExpiredTimerInfo;
import org.apache.spark.sql.streaming.OutputMode;
import org.apache.spark.sql.streaming.StatefulProcessor;
import org.apache.spark.sql.streaming.TTLConfig;
import org.apache.spark.sql.streaming.TimeMode;
import org.apache.spark.sql.streaming.TimerValues;
import org.apache.spark.sql.streaming.ValueState;
import scala.jdk.javaapi.CollectionConverters;

/**
 * Session windows per key, the state machine of streams/ops/session_windows.py, run by Spark in
 * its JVM as a {@code transformWithState} processor keyed by a shard of keys.
 *
 * <p>A session is [first event, last event + gap): each event is the interval [t, t + gap), and
 * a key's sessions are the unions of overlapping intervals, so an event grows a session, starts
 * one, or bridges two into one. A session that grows gets a {@code provisional} change
 * ({@code correction} once behind the watermark) under its start; a session whose start moves
 * earlier, or that is merged into another, gets a {@code correction} with null values (the
 * retraction) under its old start; the watermark passing a session's end makes it {@code
 * final}, and the allowed lateness later it is forgotten. An event more than the lateness
 * behind the watermark that touches no session still held is {@code late}.
 */
public final class Sessions {
  /**
   * The shard of the records that did not parse (session_windows.py DEAD_SHARD), and of a
   * replayed dead letter's second row, as in {@link Windows}.
   */
  static final int DEAD_SHARD = -1;
  /** The window_start of a session operator's stats and closed rows (kinds.py). */
  static final long SESSIONS_WINDOW = -2L;

  static final int SHARD = 0;
  static final int KEY = 1;
  static final int TS = 2;
  static final int HAS_ID = 3;
  static final int ID = 4;
  static final int PARTITION = 5;
  static final int OFFSET = 6;
  static final int REASON = 7;
  static final int VALUE = 8;

  private Sessions() {}

  /**
   * The output rows (Windows.OUTPUT) of {@code events}: columns shard (int), key (string),
   * ts (long), has_id (boolean), id_hash (long), src_partition (int), src_offset (long), reason
   * and value (a dead letter's), then the aggregates' inputs at the indexes {@code aggregates}
   * gives.
   */
  public static Dataset<Row> aggregate(
      Dataset<Row> events, String aggregates, long gapMs, long latenessMs, boolean dedup) {
    Aggregates parsed = Aggregates.parse(aggregates);
    return events
        .groupByKey((MapFunction<Row, Integer>) r -> r.getInt(SHARD), Encoders.INT())
        .transformWithState(
            new Processor(parsed, gapMs, latenessMs, dedup, events.isStreaming()),
            // A batch query has no watermark, so no event time: its windows stay open.
            events.isStreaming() ? TimeMode.EventTime() : TimeMode.None(),
            OutputMode.Update(),
            Encoders.row(Windows.OUTPUT));
  }

  /** A held session. */
  static final class Session {
    final String key;
    long start;
    long end;
    long version;
    boolean fin;
    Aggregates.Accumulators acc;

    Session(String key, long start, long end, long version, boolean fin, Aggregates.Accumulators acc) {
      this.key = key;
      this.start = start;
      this.end = end;
      this.version = version;
      this.fin = fin;
      this.acc = acc;
    }
  }

  /** An interval of the merge: a held session, or a new event's [t, t + gap). */
  private static final class Interval {
    final String key;
    final long start;
    final long end;
    final Session old;
    final Row event;

    Interval(String key, long start, long end, Session old, Row event) {
      this.key = key;
      this.start = start;
      this.end = end;
      this.old = old;
      this.event = event;
    }
  }

  static final class Processor extends StatefulProcessor<Integer, Row, Row> {
    private final Aggregates aggregates;
    private final long gapMs;
    private final long latenessMs;
    private final boolean dedup;
    /** Whether the query has event time (a stream's): a batch query's registers no timer. */
    private final boolean eventTime;
    private transient ValueState<byte[]> state;

    Processor(
        Aggregates aggregates, long gapMs, long latenessMs, boolean dedup, boolean eventTime) {
      this.aggregates = aggregates;
      this.gapMs = gapMs;
      this.latenessMs = latenessMs;
      this.dedup = dedup;
      this.eventTime = eventTime;
    }

    @Override
    public void init(OutputMode outputMode, TimeMode timeMode) {
      state = getHandle().getValueState("sessions", Encoders.BINARY(), TTLConfig.NONE());
    }

    @Override
    public scala.collection.Iterator<Row> handleInputRows(
        Integer shard, scala.collection.Iterator<Row> rows, TimerValues timers) {
      long watermark = timers.getCurrentWatermarkInMs();
      List<Row> out = new ArrayList<>();
      if (shard == DEAD_SHARD) {
        while (rows.hasNext()) {
          Row r = rows.next();
          long offset = r.getLong(OFFSET);
          out.add(
              RowFactory.create(
                  r.isNullAt(REASON) ? "replay" : "dlq", r.getString(KEY), 0L, 0L, null, null,
                  0L, 0L, 0L, 0L, 0L, r.getString(REASON), r.get(VALUE), r.getInt(PARTITION),
                  offset, offset, null));
        }
        return Windows.iterator(out);
      }
      List<Session> sessions = new ArrayList<>();
      List<long[]> ids = new ArrayList<>();
      read(sessions, ids, watermark);
      List<Row> expired = new ArrayList<>();
      sessions = expire(sessions, watermark, expired);
      List<Row> events = new ArrayList<>();
      while (rows.hasNext()) {
        events.add(rows.next());
      }
      int n = events.size();
      boolean[] fresh = new boolean[n];
      Set<Long> known = new HashSet<>();
      for (long[] id : ids) {
        known.add(id[0]);
      }
      Set<Long> batch = new HashSet<>();
      for (int i = 0; i < n; i++) {
        Row e = events.get(i);
        fresh[i] = true;
        if (dedup && e.getBoolean(HAS_ID)) {
          long hash = e.getLong(ID);
          if (batch.contains(hash) || known.contains(hash)) {
            fresh[i] = false;
          }
          batch.add(hash);
        }
      }
      if (dedup) {
        for (int i = 0; i < n; i++) {
          Row e = events.get(i);
          if (fresh[i] && e.getBoolean(HAS_ID)) {
            ids.add(new long[] {e.getLong(ID), e.getLong(TS)});
          }
        }
      }
      Map<String, List<Session>> byKey = new HashMap<>();
      for (Session s : sessions) {
        byKey.computeIfAbsent(s.key, k -> new ArrayList<>()).add(s);
      }
      List<Row> late = new ArrayList<>();
      List<Row> counted = new ArrayList<>();
      long duplicates = 0;
      String reason = null;
      for (int i = 0; i < n; i++) {
        Row e = events.get(i);
        if (!fresh[i]) {
          duplicates++;
          continue;
        }
        long t = e.getLong(TS);
        boolean touching = false;
        for (Session s : byKey.getOrDefault(e.getString(KEY), Collections.emptyList())) {
          if (t < s.end && s.start < t + gapMs) {
            touching = true;
            break;
          }
        }
        if (t < watermark - latenessMs && !touching) {
          if (reason == null) {
            reason =
                "too late: more than "
                    + latenessMs
                    + " ms behind the watermark ("
                    + Windows.iso(watermark)
                    + ") and touching no session still held";
          }
          long offset = e.getLong(OFFSET);
          late.add(
              RowFactory.create(
                  "late", e.getString(KEY), t, t + gapMs, null, null, 0L, watermark, 1L, 0L, 0L,
                  reason, null, e.getInt(PARTITION), offset, offset,
                  CollectionConverters.asScala(Collections.singletonList(offset)).toSeq()));
        } else {
          counted.add(e);
        }
      }
      int heldBefore = sessions.size();
      List<Row> changes = new ArrayList<>();
      if (!counted.isEmpty()) {
        sessions = merge(sessions, counted, watermark, changes);
      }
      out.add(
          RowFactory.create(
              "stats", null, SESSIONS_WINDOW, 0L, null, null, 0L, watermark,
              (long) counted.size(), duplicates, (long) (sessions.size() - heldBefore), null,
              null, -1, 0L, 0L, null));
      out.addAll(expired);
      out.addAll(late);
      out.addAll(changes);
      save(sessions, ids, watermark);
      return Windows.iterator(out);
    }

    /** The sessions with {@code events} folded in; the changes that makes go to {@code out}. */
    private List<Session> merge(
        List<Session> sessions, List<Row> events, long watermark, List<Row> out) {
      List<Interval> intervals = new ArrayList<>();
      for (Session s : sessions) {
        intervals.add(new Interval(s.key, s.start, s.end, s, null));
      }
      for (Row e : events) {
        long t = e.getLong(TS);
        intervals.add(new Interval(e.getString(KEY), t, t + gapMs, null, e));
      }
      // Stable: held sessions before new events of the same key and start.
      intervals.sort(
          Comparator.<Interval, String>comparing(i -> i.key).thenComparingLong(i -> i.start));
      List<Session> kept = new ArrayList<>();
      List<Session> merged = new ArrayList<>();
      int i = 0;
      while (i < intervals.size()) {
        int j = i + 1;
        long reach = intervals.get(i).end;
        while (j < intervals.size()
            && intervals.get(j).key.equals(intervals.get(i).key)
            && intervals.get(j).start < reach) {
          reach = Math.max(reach, intervals.get(j).end);
          j++;
        }
        List<Interval> group = intervals.subList(i, j);
        boolean touched = false;
        for (Interval in : group) {
          touched |= in.old == null;
        }
        if (!touched) {
          for (Interval in : group) {
            kept.add(in.old);
          }
        } else {
          mergeGroup(group, watermark, merged, out);
        }
        i = j;
      }
      kept.addAll(merged);
      return kept;
    }

    private void mergeGroup(List<Interval> group, long watermark, List<Session> merged, List<Row> out) {
      String key = group.get(0).key;
      long start = Long.MAX_VALUE;
      long end = Long.MIN_VALUE;
      long version = 0;
      boolean fin = false;
      Aggregates.Accumulators acc = aggregates.empty();
      Aggregates.Accumulators fresh = aggregates.empty();
      Map<Long, String> was = new HashMap<>();
      List<Session> olds = new ArrayList<>();
      for (Interval in : group) {
        start = Math.min(start, in.start);
        end = Math.max(end, in.end);
        if (in.old != null) {
          version = Math.max(version, in.old.version);
          fin |= in.old.fin;
          acc.merge(in.old.acc);
          was.put(in.old.start, in.old.acc.json());
          olds.add(in.old);
        } else {
          fresh.add(in.event);
        }
      }
      acc.merge(fresh);
      version += 1;
      String values = acc.json();
      boolean behind = fin || end <= watermark;
      out.add(
          Windows.row(
              behind ? "correction" : "provisional", key, start, end, values, was.get(start),
              version, watermark));
      for (Session old : olds) {
        if (old.start != start) {
          out.add(
              Windows.row(
                  "correction", key, old.start, old.end, null, was.get(old.start),
                  old.version + 1, watermark));
        }
      }
      merged.add(new Session(key, start, end, version, fin && end <= watermark, acc));
    }

    @Override
    public scala.collection.Iterator<Row> handleExpiredTimer(
        Integer shard, TimerValues timers, ExpiredTimerInfo expired) {
      long watermark = timers.getCurrentWatermarkInMs();
      List<Row> out = new ArrayList<>();
      if (!state.exists()) {
        return Windows.iterator(out);
      }
      List<Session> sessions = new ArrayList<>();
      List<long[]> ids = new ArrayList<>();
      read(sessions, ids, watermark);
      sessions = expire(sessions, watermark, out);
      save(sessions, ids, watermark);
      return Windows.iterator(out);
    }

    /**
     * The sessions the watermark has passed made final (their {@code final} rows), and those
     * past the allowed lateness forgotten (one {@code closed} row).
     */
    private List<Session> expire(List<Session> sessions, long watermark, List<Row> out) {
      List<Session> kept = new ArrayList<>();
      long gone = 0;
      for (Session s : sessions) {
        if (!s.fin && s.end <= watermark) {
          s.version += 1;
          s.fin = true;
          String values = s.acc.json();
          out.add(Windows.row("final", s.key, s.start, s.end, values, values, s.version, watermark));
        }
        if (s.end + latenessMs <= watermark) {
          gone++;
        } else {
          kept.add(s);
        }
      }
      if (gone > 0) {
        out.add(
            RowFactory.create(
                "closed", null, SESSIONS_WINDOW, 0L, null, null, 0L, 0L, 0L, 0L, -gone, null,
                null, -1, 0L, 0L, null));
      }
      return kept;
    }

    /** Keep what may still change; wake up when the next session is due. */
    private void save(List<Session> sessions, List<long[]> ids, long watermark) {
      if (sessions.isEmpty()) {
        state.clear();
        return;
      }
      // An older id can come back only as a late event, unless it touches a session still
      // held: those keep taking events however far behind the watermark.
      long horizon = watermark - latenessMs - gapMs;
      long due = Long.MAX_VALUE;
      for (Session s : sessions) {
        horizon = Math.min(horizon, s.start - gapMs);
        due = Math.min(due, s.fin ? s.end + latenessMs : s.end);
      }
      ByteArrayOutputStream buffer = new ByteArrayOutputStream();
      try (DataOutputStream data = new DataOutputStream(buffer)) {
        data.writeInt(sessions.size());
        for (Session s : sessions) {
          data.writeUTF(s.key);
          data.writeLong(s.start);
          data.writeLong(s.end);
          data.writeLong(s.version);
          data.writeBoolean(s.fin);
          byte[] acc = s.acc.bytes();
          data.writeInt(acc.length);
          data.write(acc);
        }
        int keep = 0;
        for (long[] id : ids) {
          keep += id[1] >= horizon ? 1 : 0;
        }
        data.writeInt(keep);
        for (long[] id : ids) {
          if (id[1] >= horizon) {
            data.writeLong(id[0]);
            data.writeLong(id[1]);
          }
        }
      } catch (IOException e) {
        throw new UncheckedIOException(e);
      }
      state.update(buffer.toByteArray());
      if (eventTime) {
        getHandle().registerTimer(due);
      }
    }

    private void read(List<Session> sessions, List<long[]> ids, long watermark) {
      if (!state.exists()) {
        return;
      }
      try (DataInputStream data = new DataInputStream(new ByteArrayInputStream(state.get()))) {
        int n = data.readInt();
        for (int i = 0; i < n; i++) {
          String key = data.readUTF();
          long start = data.readLong();
          long end = data.readLong();
          long version = data.readLong();
          boolean fin = data.readBoolean();
          byte[] acc = new byte[data.readInt()];
          data.readFully(acc);
          sessions.add(new Session(key, start, end, version, fin, aggregates.read(acc, watermark)));
        }
        int m = data.readInt();
        for (int i = 0; i < m; i++) {
          ids.add(new long[] {data.readLong(), data.readLong()});
        }
      } catch (IOException e) {
        throw new UncheckedIOException(e);
      }
    }
  }
}
