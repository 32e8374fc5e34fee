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
 */
public final class Aggregates implements Serializable {
  private static final long serialVersionUID = 1L;
  /** HLL's accuracy: 2**12 buckets (streams/aggregates.py HLL_LG_K). */
  static final int HLL_LG_K = 12;
  /** KLL's accuracy (streams/aggregates.py KLL_K). */
  static final int KLL_K = 200;

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
    return new Accumulators(this, bytes);
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

    Accumulators(Aggregates of) {
      this.of = of;
      int n = of.specs.length;
      counts = new long[n];
      longs = new long[n];
      doubles = new double[n];
      present = new boolean[n];
      hlls = new HllSketch[n];
      klls = new KllDoublesSketch[n];
    }

    Accumulators(Aggregates of, byte[] bytes) {
      this(of);
      try (DataInputStream in = new DataInputStream(new ByteArrayInputStream(bytes))) {
        version = in.readLong();
        for (int i = 0; i < of.specs.length; i++) {
          counts[i] = in.readLong();
          longs[i] = in.readLong();
          doubles[i] = in.readDouble();
          present[i] = in.readBoolean();
          int size = in.readInt();
          if (size > 0) {
            byte[] sketch = new byte[size];
            in.readFully(sketch);
            if ("approx_distinct".equals(of.specs[i].kind)) {
              hlls[i] = HllSketch.heapify(sketch);
            } else {
              klls[i] = KllDoublesSketch.heapify(Memory.wrap(sketch));
            }
          }
        }
      } catch (IOException e) {
        throw new UncheckedIOException(e);
      }
    }

    byte[] bytes() {
      ByteArrayOutputStream buffer = new ByteArrayOutputStream(64);
      try (DataOutputStream out = new DataOutputStream(buffer)) {
        out.writeLong(version);
        for (int i = 0; i < of.specs.length; i++) {
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
