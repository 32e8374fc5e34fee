package io.kappaflow.iot;

import com.fasterxml.jackson.databind.JsonNode;

/**
 * A model's published parameters (a {@code models} record's {@code params}), read for
 * scoring: what every family has, and the {@code forecast}, {@code robust} and {@code
 * likelihood} families' own.
 */
public final class Params {
  public final String model;
  public final long n;
  public final double surpriseMean;
  public final double surpriseSpread;
  public final double tailStart;
  public final double tailShare;
  public final double tailScale;
  public final double repeats;
  final double level;
  final double spread;
  final double centre;
  final double scale;
  final double errorSpread;
  final double[] coef;
  final double low;
  final double high;
  final double usual;
  final double[] spike;
  // The likelihood family's seasonal term (models/season.py): period, anchor and unit, the
  // profile (empty: none) and the tail of its surprise; absent from older parameters.
  final double[] season;
  final double[] profile;
  final double[] seasonTail;

  private Params(JsonNode p, String model) {
    this.model = model;
    this.n = whole(p, "n");
    whole(p, "version");
    JsonNode surprise = numbers(p, "surprise");
    if (surprise.size() != 2) {
      throw new IllegalArgumentException("params: $.surprise does not hold 2 values");
    }
    this.surpriseMean = surprise.get(0).asDouble();
    this.surpriseSpread = surprise.get(1).asDouble();
    JsonNode tail = numbers(p, "tail");
    if (tail.size() != 3) {
      throw new IllegalArgumentException("params: $.tail does not hold 3 values");
    }
    this.tailStart = tail.get(0).asDouble();
    this.tailShare = tail.get(1).asDouble();
    this.tailScale = tail.get(2).asDouble();
    this.repeats = number(p, "repeats").doubleValue();
    boolean robust = "robust".equals(model);
    boolean forecast = "forecast".equals(model);
    boolean likelihood = "likelihood".equals(model);
    this.level = robust ? number(p, "level").doubleValue() : 0.0;
    this.spread = robust ? number(p, "spread").doubleValue() : 0.0;
    this.centre = forecast ? number(p, "centre").doubleValue() : 0.0;
    this.scale = forecast ? number(p, "scale").doubleValue() : 0.0;
    this.errorSpread = forecast ? number(p, "error_spread").doubleValue() : 0.0;
    this.low = likelihood ? number(p, "low").doubleValue() : 0.0;
    this.high = likelihood ? number(p, "high").doubleValue() : 0.0;
    this.usual = likelihood ? number(p, "usual").doubleValue() : 0.0;
    this.spike = new double[5];
    if (likelihood) {
      JsonNode given = numbers(p, "spike");
      if (given.size() != 5) {
        throw new IllegalArgumentException("params: $.spike does not hold 5 values");
      }
      for (int i = 0; i < 5; i++) {
        spike[i] = given.get(i).asDouble();
      }
    }
    this.season = new double[3];
    this.seasonTail = new double[5];
    double[] cycle = new double[0];
    if (likelihood && p.has("profile")) {
      JsonNode given = numbers(p, "profile");
      cycle = new double[given.size()];
      for (int i = 0; i < cycle.length; i++) {
        cycle[i] = given.get(i).asDouble();
      }
      fill(numbers(p, "season"), season, "season");
      fill(numbers(p, "season_tail"), seasonTail, "season_tail");
    }
    this.profile = cycle;
    this.coef = new double[SeriesScorer.LAGS];
    if (forecast) {
      JsonNode given = numbers(p, "coef");
      if (given.size() != SeriesScorer.LAGS) {
        throw new IllegalArgumentException(
            "params: $.coef does not hold " + SeriesScorer.LAGS + " values");
      }
      for (int i = 0; i < SeriesScorer.LAGS; i++) {
        coef[i] = given.get(i).asDouble();
      }
    }
  }

  /** The parameters in {@code json}, or an IllegalArgumentException saying what is wrong. */
  public static Params parse(String json) {
    JsonNode p;
    try {
      p = SeriesScorer.JSON.readTree(json);
    } catch (Exception e) {
      throw new IllegalArgumentException("params are not JSON text");
    }
    if (p == null || !p.isObject()) {
      throw new IllegalArgumentException("params are not JSON text");
    }
    String model = p.path("model").asText("");
    if (SeriesScorer.family(model) == null) {
      throw new IllegalArgumentException("params name no model family known here");
    }
    return new Params(p, model);
  }

  private static void fill(JsonNode given, double[] into, String field) {
    if (given.size() != into.length) {
      throw new IllegalArgumentException(
          "params: $." + field + " does not hold " + into.length + " values");
    }
    for (int i = 0; i < into.length; i++) {
      into[i] = given.get(i).asDouble();
    }
  }

  private static long whole(JsonNode p, String field) {
    JsonNode value = p.path(field);
    if (!value.isIntegralNumber() || !value.canConvertToLong()) {
      throw new IllegalArgumentException("params: $." + field + " is not bigint");
    }
    return value.longValue();
  }

  private static JsonNode numbers(JsonNode p, String field) {
    JsonNode values = p.path(field);
    boolean all = values.isArray();
    for (JsonNode value : values) {
      all = all && value.isNumber();
    }
    if (!all) {
      throw new IllegalArgumentException("params: $." + field + " is not array<double>");
    }
    return values;
  }

  private static Number number(JsonNode p, String field) {
    JsonNode value = p.path(field);
    if (!value.isNumber()) {
      throw new IllegalArgumentException("params: $." + field + " is not a number");
    }
    return value.numberValue();
  }
}
