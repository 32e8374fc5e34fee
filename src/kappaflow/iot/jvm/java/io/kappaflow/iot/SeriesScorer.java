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
 * JVM twin of {@code kappaflow.iot.models.scoring.Scorer}, for the families {@code forecast},
 * {@code robust} and {@code likelihood} (with its guards: probation, new extremes, flat
 * lines, one alarm per incident). Its memory ({@link #state()}) is the Python scorer's JSON,
 * so either restores the other's.
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
  // The likelihood family's window and the guards' constants (models/likelihood.py and
  // models/scoring.py).
  static final int WINDOW = 64;
  static final int LEAST = 8;
  static final double FLOOR = 0.01;
  static final double USUAL = 0.5;
  static final double MAD_TO_SD = 1.4826;
  static final double WINDOW_TINY = 1e-12;
  static final int PROBATION = 100;
  static final int MUTE = 100;
  static final double RANGE_TOLERANCE = 0.05;
  static final int FLAT_LEAST = 10;
  static final double MUTED = 0.49;
  static final double RANGE_SURPRISE = 5.0;
  static final double RANGE_FAR = 0.25;
  // The seasonal term's constants (models/season.py).
  static final int SLACK = 3;
  static final int CALM = 0;
  static final double RARER = 10.0;
  static final double LEVEL_RATE = 1.0 / 16.0;
  static final double SMOOTH_RATE = 0.25;
  static final double SEASON_FLOOR = 0.1;

  private final Family family;
  private final int smooth;
  private final ArrayDeque<Double> history = new ArrayDeque<>();
  private final ArrayDeque<Double> raw = new ArrayDeque<>();
  private int run;
  private Double last;
  private int clipped;
  private long seen;
  private int quiet;
  private double low = Double.POSITIVE_INFINITY;
  private double high = Double.NEGATIVE_INFINITY;
  private int longest;
  private double surprise;
  private final Season season = new Season();
  // The explanation of the reading scored last: the range the model expected it in and its
  // likelihood (null: none; Scorer.explain in Python).
  private Double expectedLow;
  private Double expectedHigh;
  private Double likelihood;

  /** The families this scorer knows, by name; null for another. */
  public static Family family(String name) {
    if ("forecast".equals(name)) {
      return Family.FORECAST;
    }
    if ("robust".equals(name)) {
      return Family.ROBUST;
    }
    if ("likelihood".equals(name)) {
      return Family.LIKELIHOOD;
    }
    return null;
  }

  public SeriesScorer(Family family, int smooth) {
    this.family = family;
    this.smooth = Math.max(Math.max(smooth, family.smooth), 1);
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
    JsonNode guard = memory.path("guard");
    if (guard.isObject()) {
      scorer.seen = guard.path("seen").asLong(0);
      scorer.quiet = guard.path("quiet").asInt(0);
      if (guard.path("low").isNumber()) {
        scorer.low = guard.path("low").asDouble();
        scorer.high = guard.path("high").asDouble();
      }
      scorer.longest = guard.path("longest").asInt(0);
    }
    JsonNode cycle = memory.path("season");
    if (cycle.isArray() && cycle.size() == 4) {
      scorer.season.buckets = cycle.get(0).asInt();
      scorer.season.level = cycle.get(1).asDouble();
      scorer.season.smooth = cycle.get(2).asDouble();
      scorer.season.calm = cycle.get(3).asInt();
    }
    return scorer;
  }

  public Family family() {
    return family;
  }

  /** The low end of the range the model expected the reading scored last in, or null. */
  public Double expectedLow() {
    return expectedLow;
  }

  /** The high end of the range the model expected the reading scored last in, or null. */
  public Double expectedHigh() {
    return expectedHigh;
  }

  /** One minus the tail probability of the last reading's surprise, or null. */
  public Double likelihood() {
    return likelihood;
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
    if (family.guards) {
      ObjectNode guard = memory.putObject("guard");
      guard.put("seen", seen);
      guard.put("quiet", quiet);
      if (high >= low) {
        guard.put("low", low);
        guard.put("high", high);
      } else {
        guard.putNull("low");
        guard.putNull("high");
      }
      guard.put("longest", longest);
    }
    if (family == Family.LIKELIHOOD) {
      // The seasonal term's memory (null: none yet), as Scorer.state() keeps it.
      if (season.level == null) {
        memory.putNull("season");
      } else {
        ArrayNode cycle = memory.putArray("season");
        cycle.add((double) season.buckets);
        cycle.add(season.level.doubleValue());
        cycle.add(season.smooth);
        cycle.add((double) season.calm);
      }
    }
    return JSON.writeValueAsString(memory);
  }

  /** The anomaly score of {@code value} in [0, 1], then remember it as the latest reading. */
  public double score(double value, Params params) {
    if (!Double.isFinite(value)) {
      return 1.0;
    }
    boolean repeated = last != null && value == last;
    if (!repeated && run > 1) {
      // A run of repeats ended: the guards remember the longest.
      longest = Math.max(longest, run - 1);
    }
    run = repeated ? run + 1 : 1;
    last = value;
    double score = tailScore(value, params);
    return family.guards ? guard(value, score) : score;
  }

  private double tailScore(double value, Params params) {
    double remembered = value;
    surprise = 0.0;
    expectedLow = null;
    expectedHigh = null;
    likelihood = null;
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
      // The raw surprise is the distance from the family's centre in its unit: found once,
      // for the explanation too.
      double[] centre = family.expected(params, history);
      surprise = centre == null ? 0.0 : Math.abs(value - centre[0]) / centre[1];
      push(raw, surprise, smooth);
      double sum = 0.0;
      for (double r : raw) {
        sum += r;
      }
      double tail = tailProbability(params, sum / raw.size());
      if (family == Family.LIKELIHOOD) {
        tail = Math.min(tail, Family.spikeTail(params, history, value));
        tail = Math.min(tail, seasonTail(params, value));
      }
      tail = Math.max(tail, MIN_TAIL);
      likelihood = 1.0 - tail;
      if (centre != null) {
        double most = alertSurprise(params) * raw.size() - (sum - surprise);
        double reach = Math.max(most, 0.0) * centre[1];
        expectedLow = centre[0] - reach;
        expectedHigh = centre[0] + reach;
      }
      double score = Math.min(1.0, Math.max(0.0, -Math.log10(tail) / LOG_CAP));
      if (!family.guards && run >= STUCK_RUN && params.repeats < RARE_REPEATS) {
        score = Math.max(score, ALERT_SCORE);
      }
      return score;
    } finally {
      push(history, remembered, family.history);
    }
  }

  /**
   * How often the trainer saw a seasonal surprise as large as {@code value}'s, made RARER
   * times more common; 1 where the parameters have no cycle (models/likelihood.py).
   */
  private double seasonTail(Params p, double value) {
    double span = Math.max(p.high - p.low, 0.0);
    double unit = Math.max(Math.max(p.season[2], SEASON_FLOOR * span), WINDOW_TINY);
    double found = season.surprise(p.season[0], p.season[1], p.profile, unit, seen, value);
    if (p.profile.length == 0) {
      return 1.0;
    }
    double[] t = p.seasonTail;
    double alert = alertSurprise(t[2], t[3], t[4]);
    return Math.min(1.0, RARER * tailProbability(t[0], t[1], t[2], t[3], t[4], season.hold(found, alert)));
  }

  /** {@code score} with the guards applied, which learn {@code value}. */
  private double guard(double value, double score) {
    seen += 1;
    double span = high - low;
    if (seen > PROBATION && span > 0) {
      double margin = RANGE_TOLERANCE * span;
      double far = RANGE_FAR * span;
      boolean beyond = value > high + margin || value < low - margin;
      if (beyond && (surprise >= RANGE_SURPRISE || value > high + far || value < low - far)) {
        score = 1.0;
      }
    }
    if (seen > PROBATION && run - 1 == Math.max(longest, FLAT_LEAST) + 1) {
      score = 1.0;
    }
    low = Math.min(low, value);
    high = Math.max(high, value);
    if (seen <= PROBATION) {
      return 0.0;
    }
    if (quiet > 0) {
      quiet -= 1;
      return Math.min(score, MUTED);
    }
    if (score >= ALERT_SCORE) {
      quiet = MUTE;
    }
    return score;
  }

  /**
   * How often the trainer saw a raw surprise as large as {@code surprise}: above where its
   * tail begins, the tail's share times an exponential fall with the tail's scale; below, a
   * normal tail on the surprise's mean and spread, but no rarer than the tail's share.
   */
  static double tailProbability(Params params, double surprise) {
    return tailProbability(
        params.surpriseMean,
        params.surpriseSpread,
        params.tailStart,
        params.tailShare,
        params.tailScale,
        surprise);
  }

  /**
   * The least smoothed raw surprise whose tail probability scores ALERT_SCORE: where the
   * learnt tail's exponential fall reaches 10^-(ALERT_SCORE * LOG_CAP), or its start where the
   * tail's share is already that rare.
   */
  static double alertSurprise(Params params) {
    return alertSurprise(params.tailStart, params.tailShare, params.tailScale);
  }

  static double alertSurprise(double start, double share, double scale) {
    double rare = Math.pow(10.0, -(ALERT_SCORE * LOG_CAP));
    if (share <= rare) {
      return start;
    }
    return start + Math.max(scale, TINY) * Math.log(share / rare);
  }

  static double tailProbability(
      double mean, double spread, double start, double share, double scale, double surprise) {
    if (surprise > start) {
      return share * Math.exp(-(surprise - start) / Math.max(scale, TINY));
    }
    double z = (surprise - mean) / Math.max(spread, TINY);
    return Math.max(0.5 * Erf.erfc(z / Math.sqrt(2.0)), share);
  }

  private void push(ArrayDeque<Double> values, double value, int most) {
    values.addLast(value);
    while (values.size() > Math.max(most, 1)) {
      values.removeFirst();
    }
  }

  /**
   * The running level and averaged surprise of a series' readings against a seasonal
   * profile, and the readings since that surprise last reached the alert: the twin of
   * {@code kappaflow.iot.models.season.Season}.
   */
  static final class Season {
    int buckets;
    Double level;
    double smooth;
    int calm = CALM;

    double surprise(
        double period, double anchor, double[] profile, double unit, long index, double value) {
      if (profile.length != buckets) {
        buckets = profile.length;
        level = null;
        smooth = 0.0;
        calm = CALM;
      }
      if (profile.length == 0) {
        return 0.0;
      }
      if (level == null) {
        level = value - profile[phase(period, anchor, profile.length, index)];
        return 0.0;
      }
      double r = outside(profile, period, anchor, index, value, level);
      level = level + LEVEL_RATE * r;
      smooth += SMOOTH_RATE * (Math.abs(r) / Math.max(unit, WINDOW_TINY) - smooth);
      return smooth;
    }

    double hold(double surprise, double alert) {
      if (surprise < alert) {
        calm += 1;
        return surprise;
      }
      boolean armed = calm >= Math.max(buckets, CALM);
      calm = 0;
      return armed ? surprise : 0.0;
    }

    static int phase(double period, double anchor, int buckets, long index) {
      double at = (index - anchor) % period;
      if (at < 0) {
        at += period;
      }
      return Math.min(buckets - 1, (int) (at / period * buckets));
    }

    static double outside(
        double[] profile, double period, double anchor, long index, double value, double level) {
      int buckets = profile.length;
      int phase = phase(period, anchor, buckets, index);
      double low = profile[phase];
      double high = low;
      int most = Math.min(SLACK, buckets / 2);
      for (int step = 1; step <= most; step++) {
        double up = profile[Math.floorMod(phase + step, buckets)];
        double down = profile[Math.floorMod(phase - step, buckets)];
        low = Math.min(low, Math.min(up, down));
        high = Math.max(high, Math.max(up, down));
      }
      double x = value - level;
      if (x > high) {
        return x - high;
      }
      if (x < low) {
        return x - low;
      }
      return 0.0;
    }
  }

  /**
   * A model family: how many readings it keeps, where it expects a reading (its raw surprise
   * is the distance from there in its unit), what it remembers.
   */
  public enum Family {
    ROBUST(0, 1, false) {
      @Override
      double[] expected(Params p, ArrayDeque<Double> history) {
        return new double[] {p.level, Math.max(p.spread, TINY)};
      }

      @Override
      double remember(Params p, ArrayDeque<Double> history, double value) {
        return value;
      }
    },
    FORECAST(LAGS, 1, false) {
      @Override
      double[] expected(Params p, ArrayDeque<Double> history) {
        return new double[] {forecast(p, history), Math.max(p.errorSpread, TINY)};
      }

      @Override
      double remember(Params p, ArrayDeque<Double> history, double value) {
        double forecast = forecast(p, history);
        double bound = CLIP * p.errorSpread;
        return forecast + Math.max(-bound, Math.min(bound, value - forecast));
      }
    },
    LIKELIHOOD(WINDOW, 2, true) {
      @Override
      double[] expected(Params p, ArrayDeque<Double> history) {
        return windowCentre(history, Math.max(p.high - p.low, 0.0), p.usual);
      }

      @Override
      double remember(Params p, ArrayDeque<Double> history, double value) {
        return value;
      }
    };

    final int history;
    final int smooth;
    final boolean guards;

    Family(int history, int smooth, boolean guards) {
      this.history = history;
      this.smooth = smooth;
      this.guards = guards;
    }

    /** How often the trainer saw a spike as large as the one {@code value} ends, if any. */
    static double spikeTail(Params p, ArrayDeque<Double> history, double value) {
      double[] s = p.spike;
      double surprise = spikeSurprise(history, value, Math.max(p.high - p.low, 0.0), p.usual);
      return tailProbability(s[0], s[1], s[2], s[3], s[4], surprise);
    }

    /**
     * How far the last one or two readings of {@code window} stood out from both the reading
     * before them and {@code value}, in the window's scaled median absolute change.
     */
    static double spikeSurprise(
        ArrayDeque<Double> window, double value, double span, double usual) {
      int size = window.size();
      if (size < LEAST) {
        return 0.0;
      }
      double[] recent = new double[size];
      int i = 0;
      for (double v : window) {
        recent[i++] = v;
      }
      double[] changes = new double[size - 1];
      for (i = 1; i < size; i++) {
        changes[i - 1] = Math.abs(recent[i] - recent[i - 1]);
      }
      java.util.Arrays.sort(changes);
      double scale =
          Math.max(
              Math.max(changes[changes.length / 2] * MAD_TO_SD, FLOOR * span),
              Math.max(USUAL * usual, WINDOW_TINY));
      double most = 0.0;
      for (int width = 1; width <= 2; width++) {
        double topLow = Double.POSITIVE_INFINITY;
        double topHigh = Double.NEGATIVE_INFINITY;
        for (int k = size - width; k < size; k++) {
          topLow = Math.min(topLow, recent[k]);
          topHigh = Math.max(topHigh, recent[k]);
        }
        double before = recent[size - width - 1];
        most = Math.max(most, topLow - Math.max(before, value));
        most = Math.max(most, Math.min(before, value) - topHigh);
      }
      return most / scale;
    }

    /**
     * The median of {@code window} and its scaled median absolute deviation, taken to be no
     * less than FLOOR of {@code span} nor USUAL of the {@code usual} deviation; null while the
     * window holds fewer than LEAST readings.
     */
    static double[] windowCentre(ArrayDeque<Double> window, double span, double usual) {
      int size = window.size();
      if (size < LEAST) {
        return null;
      }
      double[] ordered = new double[size];
      int i = 0;
      for (double v : window) {
        ordered[i++] = v;
      }
      double[] deviations = new double[size];
      java.util.Arrays.sort(ordered);
      double middle = ordered[size / 2];
      i = 0;
      for (double v : window) {
        deviations[i++] = Math.abs(v - middle);
      }
      java.util.Arrays.sort(deviations);
      double spread = deviations[size / 2] * MAD_TO_SD;
      return new double[] {
        middle, Math.max(Math.max(spread, FLOOR * span), Math.max(USUAL * usual, WINDOW_TINY))
      };
    }

    /** {centre, unit} such that raw is the distance from centre in units; null for none. */
    abstract double[] expected(Params p, ArrayDeque<Double> history);

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
