package io.kappaflow.engine;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import java.io.ByteArrayInputStream;
import java.io.ByteArrayOutputStream;
import java.io.DataInputStream;
import java.io.DataOutputStream;
import java.io.IOException;
import java.io.Serializable;
import java.io.UncheckedIOException;
import java.util.ArrayList;
import java.util.List;
import org.apache.datasketches.hll.HllSketch;
import org.apache.datasketches.hll.TgtHllType;
import org.apache.datasketches.hll.Union;
import org.apache.datasketches.kll.KllDoublesSketch;
import org.apache.datasketches.memory.Memory;
import org.apache.datasketches.quantilescommon.QuantileSearchCriteria;
import org.apache.spark.sql.Row;

/**
 * The aggregates users declare (streams/aggregates.py), each a mergeable accumulator: count,
 * sum, min, max, mean, approx_distinct (an HLL sketch) and approx_quantiles (a KLL sketch).
 *
 * <p>One {@link Accumulators} holds a key's accumulators, in declaration order; it takes events
 * ({@link Accumulators#add}), serializes to bytes for the state store, and writes its values as
 * the JSON object Python's {@code json.dumps(..., separators=(",", ":"))} writes for them (the
 * text {@code values_json} in streams/ops/windowing.py defines), so that a value compares equal
 * as text across batches and reads the same to every consumer.
 *
 * <p>The bytes describe themselves ({@link #FORMAT}): each aggregate is kept under its name,
 * kind and number type, so that state written for one list of aggregates reads under another
 * (a job restarted from a savepoint with an aggregate added or removed: jobs/evolution.py). An
 * aggregate the bytes do not hold starts empty when they are read, and remembers the watermark
 * it started at: its values then cover the events after that only, and the values' JSON says so
 * under {@code _partial_since}. An aggregate the bytes hold that is no longer declared is
 * dropped; an integral sum, min or max read as a real one is widened. Bytes written before the
 * format (no marker) are read by position, as they were written.
 */
public final class Aggregates implements Serializable {
  private static final long serialVersionUID = 1L;
  /** HLL's accuracy: 2**12 buckets (streams/aggregates.py HLL_LG_K). */
  static final int HLL_LG_K = 12;
  /** KLL's accuracy (streams/aggregates.py KLL_K). */
  static final int KLL_K = 200;
  /**
   * The first long of self-describing bytes. Older bytes start with the version, which is never
   * negative.
   */
  static final long FORMAT = -0x4B46_0002L;
  /** An aggregate's {@code since} when it has counted every event of its window. */
  static final long WHOLE = -1L;

  /** One declared aggregate. */
  static final class Spec implements Serializable {
    private static final long serialVersionUID = 1L;
    final String name;
    final String kind;
    /** The input column's index in the operator's input row, or -1 (count). */
    final int input;
    /** Whether sum, min and max keep integers (an integral column). */
    final boolean integral;
    /** The input column's Spark type name, for approx_distinct's hashing. */
    final String type;
    final double[] quantiles;
    final String[] quantileNames;

    Spec(JsonNode node) {
      name = node.get("name").asText();
      kind = node.get("kind").asText();
      input = node.get("input").asInt();
      integral = node.path("integral").asBoolean(false);
      type = node.path("type").asText("");
      JsonNode qs = node.path("quantiles");
      quantiles = new double[qs.size()];
      quantileNames = new String[qs.size()];
      for (int i = 0; i < qs.size(); i++) {
        quantiles[i] = qs.get(i).asDouble();
        quantileNames[i] = Json.pyFloat(quantiles[i]);
      }
    }
  }

  final Spec[] specs;
  /** The JSON head of each value: its name and a colon. */
  private final String[] heads;

  private Aggregates(Spec[] specs) {
    this.specs = specs;
    heads = new String[specs.length];
    for (int i = 0; i < specs.length; i++) {
      heads[i] = Json.quote(specs[i].name) + ":";
    }
  }

  /** The aggregates of a JSON list of {name, kind, input, integral, type, quantiles}. */
  public static Aggregates parse(String json) {
    try {
      JsonNode list = new ObjectMapper().readTree(json);
      Spec[] specs = new Spec[list.size()];
      for (int i = 0; i < specs.length; i++) {
        specs[i] = new Spec(list.get(i));
      }
      return new Aggregates(specs);
    } catch (IOException e) {
      throw new IllegalArgumentException("aggregates are not JSON: " + json, e);
    }
  }

  /** Empty accumulators for one key. */
  Accumulators empty() {
    return new Accumulators(this);
  }

  /** Accumulators read back from {@link Accumulators#bytes}. */
  Accumulators read(byte[] bytes) {
    return new Accumulators(this, bytes, 0L);
  }

  /**
   * Accumulators read back from {@link Accumulators#bytes}; an aggregate they do not hold starts
   * at {@code watermark}.
   */
  Accumulators read(byte[] bytes, long watermark) {
    return new Accumulators(this, bytes, watermark);
  }

  private int indexOf(String name) {
    for (int i = 0; i < specs.length; i++) {
      if (specs[i].name.equals(name)) {
        return i;
      }
    }
    return -1;
  }

  /**
   * The values held in a key's state (the bytes of {@link Accumulators#bytes}), as the JSON
   * object the operator writes for them: for reading a job's state back (jobs/state_read.py).
   */
  public String valuesJson(byte[] bytes) {
    return read(bytes).json();
  }

  /** One key's accumulators, in declaration order, and the version of its values. */
  static final class Accumulators {
    private final Aggregates of;
    long version;
    private final long[] counts;
    private final long[] longs;
    private final double[] doubles;
    private final boolean[] present;
    private final HllSketch[] hlls;
    private final KllDoublesSketch[] klls;
    /** Per aggregate, the watermark it started counting at, or {@link #WHOLE}. */
    private final long[] since;

    Accumulators(Aggregates of) {
      this.of = of;
      int n = of.specs.length;
      counts = new long[n];
      longs = new long[n];
      doubles = new double[n];
      present = new boolean[n];
      hlls = new HllSketch[n];
      klls = new KllDoublesSketch[n];
      since = new long[n];
      java.util.Arrays.fill(since, WHOLE);
    }

    Accumulators(Aggregates of, byte[] bytes, long watermark) {
      this(of);
      try (DataInputStream in = new DataInputStream(new ByteArrayInputStream(bytes))) {
        long first = in.readLong();
        if (first != FORMAT) {
          // Bytes from before the format: by position, under the aggregates of their time.
          version = first;
          for (int i = 0; i < of.specs.length; i++) {
            readFields(in, i, of.specs[i].kind, of.specs[i].integral);
          }
          return;
        }
        version = in.readLong();
        int held = in.readInt();
        boolean[] found = new boolean[of.specs.length];
        for (int h = 0; h < held; h++) {
          String name = in.readUTF();
          String kind = in.readUTF();
          boolean integral = in.readBoolean();
          long started = in.readLong();
          int i = of.indexOf(name);
          if (i < 0 || !of.specs[i].kind.equals(kind)) {
            readFields(in, -1, kind, integral); // removed (or changed): dropped
            continue;
          }
          readFields(in, i, kind, integral);
          since[i] = started;
          found[i] = true;
          if (integral && !of.specs[i].integral) {
            doubles[i] = (double) longs[i]; // widened: an integer column now a real one
          } else if (!integral && of.specs[i].integral && !"mean".equals(kind)) {
            longs[i] = Math.round(doubles[i]);
          }
        }
        for (int i = 0; i < found.length; i++) {
          if (!found[i]) {
            since[i] = watermark; // added: it counts the events from now on
          }
        }
      } catch (IOException e) {
        throw new UncheckedIOException(e);
      }
    }

    /** One aggregate's fields into slot {@code i} (-1: read and dropped). */
    private void readFields(DataInputStream in, int i, String kind, boolean integral)
        throws IOException {
      long count = in.readLong();
      long integer = in.readLong();
      double real = in.readDouble();
      boolean seen = in.readBoolean();
      int size = in.readInt();
      byte[] sketch = new byte[Math.max(size, 0)];
      in.readFully(sketch);
      if (i < 0) {
        return;
      }
      counts[i] = count;
      longs[i] = integer;
      doubles[i] = real;
      present[i] = seen;
      if (size > 0) {
        if ("approx_distinct".equals(kind)) {
          hlls[i] = HllSketch.heapify(sketch);
        } else {
          klls[i] = KllDoublesSketch.heapify(Memory.wrap(sketch));
        }
      }
    }

    byte[] bytes() {
      ByteArrayOutputStream buffer = new ByteArrayOutputStream(64);
      try (DataOutputStream out = new DataOutputStream(buffer)) {
        out.writeLong(FORMAT);
        out.writeLong(version);
        out.writeInt(of.specs.length);
        for (int i = 0; i < of.specs.length; i++) {
          Spec spec = of.specs[i];
          out.writeUTF(spec.name);
          out.writeUTF(spec.kind);
          out.writeBoolean(spec.integral);
          out.writeLong(since[i]);
          out.writeLong(counts[i]);
          out.writeLong(longs[i]);
          out.writeDouble(doubles[i]);
          out.writeBoolean(present[i]);
          byte[] sketch =
              hlls[i] != null
                  ? hlls[i].toCompactByteArray()
                  : klls[i] != null ? klls[i].toByteArray() : new byte[0];
          out.writeInt(sketch.length);
          out.write(sketch);
        }
      } catch (IOException e) {
        throw new UncheckedIOException(e);
      }
      return buffer.toByteArray();
    }

    /** One event of {@code row} (its inputs at each spec's index) counted in. */
    void add(Row row) {
      Spec[] specs = of.specs;
      for (int i = 0; i < specs.length; i++) {
        Spec spec = specs[i];
        if (spec.input < 0) {
          counts[i] += 1;
          continue;
        }
        Object value = row.get(spec.input);
        if (value == null) {
          continue;
        }
        switch (spec.kind) {
          case "sum":
            if (spec.integral) {
              longs[i] += ((Number) value).longValue();
            } else {
              doubles[i] += real(value);
            }
            present[i] = true;
            break;
          case "min":
          case "max":
            extreme(i, spec, value);
            break;
          case "mean":
            doubles[i] += real(value);
            counts[i] += 1;
            present[i] = true;
            break;
          case "approx_distinct":
            distinct(i, spec, value);
            break;
          case "approx_quantiles":
            double number = real(value);
            if (!Double.isNaN(number)) {
              if (klls[i] == null) {
                klls[i] = KllDoublesSketch.newHeapInstance(KLL_K);
              }
              klls[i].update(number);
            }
            break;
          default:
            throw new IllegalArgumentException("unknown aggregate " + spec.kind);
        }
      }
    }

    private void extreme(int i, Spec spec, Object value) {
      boolean min = "min".equals(spec.kind);
      if (spec.integral) {
        long v = ((Number) value).longValue();
        if (!present[i] || (min ? v < longs[i] : v > longs[i])) {
          longs[i] = v;
        }
      } else {
        double v = real(value);
        if (Double.isNaN(v)) {
          return;
        }
        if (!present[i] || (min ? v < doubles[i] : v > doubles[i])) {
          doubles[i] = v;
        }
      }
      present[i] = true;
    }

    private void distinct(int i, Spec spec, Object value) {
      if (hlls[i] == null) {
        hlls[i] = new HllSketch(HLL_LG_K, TgtHllType.HLL_4);
      }
      if (value instanceof Long || value instanceof Integer || value instanceof Short
          || value instanceof Byte) {
        hlls[i].update(((Number) value).longValue());
      } else if (value instanceof Double || value instanceof Float) {
        hlls[i].update(((Number) value).doubleValue());
      } else {
        hlls[i].update(value.toString());
      }
    }

    /** {@code other}'s events counted in (its version is not). */
    void merge(Accumulators other) {
      Spec[] specs = of.specs;
      for (int i = 0; i < specs.length; i++) {
        Spec spec = specs[i];
        // Values that started late stay so, merged with any others.
        since[i] = Math.max(since[i], other.since[i]);
        switch (spec.kind) {
          case "count":
            counts[i] += other.counts[i];
            break;
          case "sum":
            if (other.present[i]) {
              longs[i] += other.longs[i];
              doubles[i] += other.doubles[i];
              present[i] = true;
            }
            break;
          case "min":
          case "max":
            if (other.present[i]) {
              boolean min = "min".equals(spec.kind);
              if (!present[i]) {
                longs[i] = other.longs[i];
                doubles[i] = other.doubles[i];
              } else if (spec.integral) {
                longs[i] = min ? Math.min(longs[i], other.longs[i]) : Math.max(longs[i], other.longs[i]);
              } else {
                doubles[i] =
                    min ? Math.min(doubles[i], other.doubles[i]) : Math.max(doubles[i], other.doubles[i]);
              }
              present[i] = true;
            }
            break;
          case "mean":
            doubles[i] += other.doubles[i];
            counts[i] += other.counts[i];
            present[i] |= other.present[i];
            break;
          case "approx_distinct":
            if (other.hlls[i] != null) {
              Union union = new Union(HLL_LG_K);
              if (hlls[i] != null) {
                union.update(hlls[i]);
              }
              union.update(other.hlls[i]);
              hlls[i] = union.getResult(TgtHllType.HLL_4);
            }
            break;
          case "approx_quantiles":
            if (other.klls[i] != null) {
              if (klls[i] == null) {
                klls[i] = KllDoublesSketch.newHeapInstance(KLL_K);
              }
              klls[i].merge(other.klls[i]);
            }
            break;
          default:
            throw new IllegalArgumentException("unknown aggregate " + spec.kind);
        }
      }
    }

    /** The values as a JSON object, name to value, in declaration order. */
    String json() {
      StringBuilder out = new StringBuilder(32);
      out.append('{');
      Spec[] specs = of.specs;
      for (int i = 0; i < specs.length; i++) {
        if (i > 0) {
          out.append(',');
        }
        out.append(of.heads[i]);
        value(out, i, specs[i]);
      }
      boolean partial = false;
      for (int i = 0; i < specs.length; i++) {
        if (since[i] != WHOLE) {
          out.append(partial ? "," : ",\"_partial_since\":{");
          out.append(of.heads[i]).append('"').append(Windows.iso(since[i])).append('"');
          partial = true;
        }
      }
      if (partial) {
        out.append('}');
      }
      return out.append('}').toString();
    }

    private void value(StringBuilder out, int i, Spec spec) {
      switch (spec.kind) {
        case "count":
          out.append(counts[i]);
          return;
        case "sum":
        case "min":
        case "max":
          if (!present[i]) {
            out.append("null");
          } else if (spec.integral) {
            out.append(longs[i]);
          } else {
            Json.number(out, doubles[i]);
          }
          return;
        case "mean":
          if (counts[i] == 0 || !present[i]) {
            out.append("null");
          } else {
            Json.number(out, doubles[i] / counts[i]);
          }
          return;
        case "approx_distinct":
          out.append(hlls[i] == null ? 0L : (long) Math.rint(hlls[i].getEstimate()));
          return;
        case "approx_quantiles":
          if (klls[i] == null || klls[i].isEmpty()) {
            out.append("null");
            return;
          }
          // Exclusive ranks, as the Python binding's default the aggregates were defined with.
          double[] found = klls[i].getQuantiles(spec.quantiles, QuantileSearchCriteria.EXCLUSIVE);
          out.append('{');
          for (int q = 0; q < found.length; q++) {
            if (q > 0) {
              out.append(',');
            }
            out.append('"').append(spec.quantileNames[q]).append("\":");
            Json.number(out, found[q]);
          }
          out.append('}');
          return;
        default:
          throw new IllegalArgumentException("unknown aggregate " + spec.kind);
      }
    }
  }

  private static double real(Object value) {
    if (value instanceof java.math.BigDecimal) {
      return ((java.math.BigDecimal) value).doubleValue();
    }
    return ((Number) value).doubleValue();
  }

  /** The names of the aggregates, for messages. */
  List<String> names() {
    List<String> names = new ArrayList<>();
    for (Spec spec : specs) {
      names.add(spec.name);
    }
    return names;
  }
}
