package io.kappaflow.iot;

import com.fasterxml.jackson.core.JsonProcessingException;
import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.node.ArrayNode;
import com.fasterxml.jackson.databind.node.ObjectNode;
import java.util.ArrayDeque;
import java.util.Iterator;
import org.apache.commons.math3.special.Erf;

/**
 * Scores one series' readings, in order, each with the model parameters last given: the
 * JVM twin of {@code kappaflow.iot.models.scoring.Scorer}, for the families {@code forecast}
 * and {@code robust}. Its memory ({@link #state()}) is the Python scorer's JSON, so either
 * restores the other's.
 */
public final class SeriesScorer {
  public static final double ALERT_SCORE = 0.5;
  static final int WARMUP = 30;
  static final int MAX_CLIPPED = 3;
  static final int STUCK_RUN = 10;
  static final int LAGS = 8;
  static final double LOG_CAP = 10.0;
  static final double MIN_TAIL = 1e-300;
  static final double RARE_REPEATS = 0.02;
  static final double TINY = 1e-9;
  static final double CLIP = 3.0;
  static final double INPUT_BOUND = 20.0;
  static final ObjectMapper JSON = new ObjectMapper();

  private final Family family;
  private final int smooth;
  private final ArrayDeque<Double> history = new ArrayDeque<>();
  private final ArrayDeque<Double> raw = new ArrayDeque<>();
  private int run;
  private Double last;
  private int clipped;

  /** The families this scorer knows, by name; null for another. */
  public static Family family(String name) {
    if ("forecast".equals(name)) {
      return Family.FORECAST;
    }
    if ("robust".equals(name)) {
      return Family.ROBUST;
    }
    return null;
  }

  public SeriesScorer(Family family, int smooth) {
    this.family = family;
    this.smooth = Math.max(smooth, 1);
  }

  /** A scorer of {@code family} remembering {@code state} (JSON text of state(); empty: none). */
  public static SeriesScorer restore(String family, String state) throws JsonProcessingException {
    Family found = family(family);
    if (found == null) {
      throw new IllegalArgumentException("no real-time scorer for model family " + family);
    }
    SeriesScorer scorer = new SeriesScorer(found, 1);
    if (state == null || state.isEmpty()) {
      return scorer;
    }
    JsonNode memory = JSON.readTree(state);
    for (JsonNode value : memory.path("history")) {
      scorer.push(scorer.history, value.asDouble(), scorer.family.history);
    }
    for (JsonNode value : memory.path("raw")) {
      scorer.push(scorer.raw, value.asDouble(), scorer.smooth);
    }
    scorer.run = memory.path("run").asInt(0);
    JsonNode last = memory.path("last");
    scorer.last = last.isNumber() ? last.asDouble() : null;
    scorer.clipped = memory.path("clipped").asInt(0);
    return scorer;
  }

  public Family family() {
    return family;
  }

  /** What the scorer remembers, as the Python scorer's JSON. */
  public String state() throws JsonProcessingException {
    ObjectNode memory = JSON.createObjectNode();
    ArrayNode values = memory.putArray("history");
    history.forEach(values::add);
    ArrayNode raws = memory.putArray("raw");
    raw.forEach(raws::add);
    memory.put("run", run);
    if (last == null) {
      memory.putNull("last");
    } else {
      memory.put("last", last);
    }
    memory.put("clipped", clipped);
    return JSON.writeValueAsString(memory);
  }

  /** The anomaly score of {@code value} in [0, 1], then remember it as the latest reading. */
  public double score(double value, Params params) {
    if (!Double.isFinite(value)) {
      return 1.0;
    }
    run = last != null && value == last ? run + 1 : 1;
    last = value;
    double remembered = value;
    try {
      if (params == null || params.n < WARMUP) {
        return 0.0;
      }
      if (clipped >= MAX_CLIPPED) {
        // So many outliers in a row are a change, not a spike: remembered as they are.
        clipped = 0;
      } else {
        remembered = family.remember(params, history, value);
        clipped = remembered != value ? clipped + 1 : 0;
      }
      push(raw, family.raw(params, history, value), smooth);
      double sum = 0.0;
      for (double r : raw) {
        sum += r;
      }
      double tail = Math.max(tailProbability(params, sum / raw.size()), MIN_TAIL);
      double score = Math.min(1.0, Math.max(0.0, -Math.log10(tail) / LOG_CAP));
      if (run >= STUCK_RUN && params.repeats < RARE_REPEATS) {
        score = Math.max(score, ALERT_SCORE);
      }
      return score;
    } finally {
      push(history, remembered, family.history);
    }
  }

  /**
   * How often the trainer saw a raw surprise as large as {@code surprise}: above where its
   * tail begins, the tail's share times an exponential fall with the tail's scale; below, a
   * normal tail on the surprise's mean and spread, but no rarer than the tail's share.
   */
  static double tailProbability(Params params, double surprise) {
    if (surprise > params.tailStart) {
      return params.tailShare
          * Math.exp(-(surprise - params.tailStart) / Math.max(params.tailScale, TINY));
    }
    double z = (surprise - params.surpriseMean) / Math.max(params.surpriseSpread, TINY);
    return Math.max(0.5 * Erf.erfc(z / Math.sqrt(2.0)), params.tailShare);
  }

  private void push(ArrayDeque<Double> values, double value, int most) {
    values.addLast(value);
    while (values.size() > Math.max(most, 1)) {
      values.removeFirst();
    }
  }

  /** A model family: how many readings it keeps, its raw surprise, what it remembers. */
  public enum Family {
    ROBUST(0) {
      @Override
      double raw(Params p, ArrayDeque<Double> history, double value) {
        return Math.abs(value - p.level) / Math.max(p.spread, TINY);
      }

      @Override
      double remember(Params p, ArrayDeque<Double> history, double value) {
        return value;
      }
    },
    FORECAST(LAGS) {
      @Override
      double raw(Params p, ArrayDeque<Double> history, double value) {
        return Math.abs(value - forecast(p, history)) / Math.max(p.errorSpread, TINY);
      }

      @Override
      double remember(Params p, ArrayDeque<Double> history, double value) {
        double forecast = forecast(p, history);
        double bound = CLIP * p.errorSpread;
        return forecast + Math.max(-bound, Math.min(bound, value - forecast));
      }
    };

    final int history;

    Family(int history) {
      this.history = history;
    }

    abstract double raw(Params p, ArrayDeque<Double> history, double value);

    abstract double remember(Params p, ArrayDeque<Double> history, double value);

    /** The forecast from the last LAGS readings, newest first, centred and scaled. */
    static double forecast(Params p, ArrayDeque<Double> history) {
      double scale = Math.max(p.scale, TINY);
      double dot = 0.0;
      Iterator<Double> newest = history.descendingIterator();
      for (int i = 0; i < LAGS; i++) {
        double value = newest.hasNext() ? newest.next() : p.centre;
        double x = Math.max(-INPUT_BOUND, Math.min(INPUT_BOUND, (value - p.centre) / scale));
        dot += p.coef[i] * x;
      }
      return p.centre + scale * dot;
    }
  }
}
