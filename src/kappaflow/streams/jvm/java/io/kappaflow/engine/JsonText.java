package io.kappaflow.engine;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import java.math.BigDecimal;
import java.util.Iterator;
import java.util.Map;
import org.apache.spark.sql.Column;
import org.apache.spark.sql.api.java.UDF1;
import org.apache.spark.sql.functions;
import org.apache.spark.sql.types.DataTypes;

/**
 * JSON text as Python's {@code json.dumps} writes it (ASCII only, {@code ", "} and {@code ": "}
 * separators, floats as Python's {@code repr}), so that records the tasks format are the bytes
 * the Python writer made of the same values.
 */
public final class JsonText {
  private static final ObjectMapper JSON = new ObjectMapper();

  private JsonText() {}

  /** Each item of a JSON array's text, as {@code json.dumps} writes it (null for null input). */
  public static Column items(Column arrays) {
    UDF1<String, String[]> split =
        text -> {
          if (text == null) {
            return null;
          }
          JsonNode node = JSON.readTree(text);
          String[] out = new String[node.size()];
          for (int i = 0; i < out.length; i++) {
            out[i] = dumps(node.get(i));
          }
          return out;
        };
    return functions.udf(split, DataTypes.createArrayType(DataTypes.StringType)).apply(arrays);
  }

  /** Each string as a JSON string literal, {@code json.dumps}'s way ({@code null}: null). */
  public static Column quote(Column strings) {
    UDF1<String, String> quoted =
        text -> {
          if (text == null) {
            return "null";
          }
          StringBuilder out = new StringBuilder();
          quote(text, out);
          return out.toString();
        };
    return functions.udf(quoted, DataTypes.StringType).apply(strings);
  }

  /** Bytes decoded as UTF-8 (malformed input replaced), as a JSON string literal. */
  public static Column quoteBytes(Column bytes) {
    UDF1<byte[], String> quoted =
        raw -> {
          if (raw == null) {
            return "null";
          }
          StringBuilder out = new StringBuilder();
          quote(new String(raw, java.nio.charset.StandardCharsets.UTF_8), out);
          return out.toString();
        };
    return functions.udf(quoted, DataTypes.StringType).apply(bytes);
  }

  /** JSON text written again, {@code json.dumps(json.loads(text))}'s way (null: null). */
  public static Column dumps(Column texts) {
    UDF1<String, String> again = text -> text == null ? null : dumps(JSON.readTree(text));
    return functions.udf(again, DataTypes.StringType).apply(texts);
  }

  /**
   * Of each JSON object, the fields {@code namesJson} (a JSON array of names) names as a JSON
   * array, {@code json.dumps([row.get(k) for k in names])}'s way.
   */
  public static Column pick(Column objects, String namesJson) throws Exception {
    String[] names = JSON.readValue(namesJson, String[].class);
    UDF1<String, String> picked =
        text -> {
          if (text == null) {
            return null;
          }
          JsonNode row = JSON.readTree(text);
          StringBuilder out = new StringBuilder("[");
          for (int i = 0; i < names.length; i++) {
            if (i > 0) {
              out.append(", ");
            }
            write(row.get(names[i]), out);
          }
          return out.append(']').toString();
        };
    return functions.udf(picked, DataTypes.StringType).apply(objects);
  }

  /**
   * Each JSON array's items named by {@code namesJson} (a JSON array of names), as a JSON
   * object: {@code json.dumps(dict(zip(names, json.loads(text))))}'s way.
   */
  public static Column named(Column arrays, String namesJson) throws Exception {
    String[] names = JSON.readValue(namesJson, String[].class);
    UDF1<String, String> object =
        text -> {
          if (text == null) {
            return null;
          }
          JsonNode items = JSON.readTree(text);
          StringBuilder out = new StringBuilder("{");
          for (int i = 0; i < names.length && i < items.size(); i++) {
            if (i > 0) {
              out.append(", ");
            }
            quote(names[i], out);
            out.append(": ");
            write(items.get(i), out);
          }
          return out.append('}').toString();
        };
    return functions.udf(object, DataTypes.StringType).apply(arrays);
  }

  /** {@code node} as Python's {@code json.dumps(json.loads(text))} writes it. */
  public static String dumps(JsonNode node) {
    StringBuilder out = new StringBuilder();
    write(node, out);
    return out.toString();
  }

  private static void write(JsonNode node, StringBuilder out) {
    if (node == null || node.isNull()) {
      out.append("null");
    } else if (node.isBoolean()) {
      out.append(node.booleanValue() ? "true" : "false");
    } else if (node.isIntegralNumber()) {
      out.append(node.bigIntegerValue().toString());
    } else if (node.isNumber()) {
      out.append(repr(node.doubleValue()));
    } else if (node.isTextual()) {
      quote(node.textValue(), out);
    } else if (node.isArray()) {
      out.append('[');
      for (int i = 0; i < node.size(); i++) {
        if (i > 0) {
          out.append(", ");
        }
        write(node.get(i), out);
      }
      out.append(']');
    } else {
      out.append('{');
      boolean first = true;
      for (Iterator<Map.Entry<String, JsonNode>> it = node.fields(); it.hasNext(); ) {
        Map.Entry<String, JsonNode> field = it.next();
        if (!first) {
          out.append(", ");
        }
        first = false;
        quote(field.getKey(), out);
        out.append(": ");
        write(field.getValue(), out);
      }
      out.append('}');
    }
  }

  /** A string literal with {@code ensure_ascii}: every character outside space..~ escaped. */
  static void quote(String text, StringBuilder out) {
    out.append('"');
    for (int i = 0; i < text.length(); i++) {
      char c = text.charAt(i);
      switch (c) {
        case '"' -> out.append("\\\"");
        case '\\' -> out.append("\\\\");
        case '\n' -> out.append("\\n");
        case '\r' -> out.append("\\r");
        case '\t' -> out.append("\\t");
        case '\b' -> out.append("\\b");
        case '\f' -> out.append("\\f");
        default -> {
          if (c < 0x20 || c > 0x7e) {
            out.append(String.format("\\u%04x", (int) c));
          } else {
            out.append(c);
          }
        }
      }
    }
    out.append('"');
  }

  /** A double as Python's {@code repr}: positional from 1e-4 to below 1e16, else 1e+16. */
  static String repr(double value) {
    if (Double.isNaN(value)) {
      return "NaN";
    }
    if (Double.isInfinite(value)) {
      return value > 0 ? "Infinity" : "-Infinity";
    }
    if (value == 0) {
      return 1 / value < 0 ? "-0.0" : "0.0";
    }
    BigDecimal exact = new BigDecimal(Double.toString(value)).stripTrailingZeros();
    String digits = exact.unscaledValue().abs().toString();
    int exponent = digits.length() - 1 - exact.scale();
    String sign = value < 0 ? "-" : "";
    if (exponent >= -4 && exponent < 16) {
      if (exponent < 0) {
        return sign + "0." + "0".repeat(-exponent - 1) + digits;
      }
      if (digits.length() <= exponent + 1) {
        return sign + digits + "0".repeat(exponent + 1 - digits.length()) + ".0";
      }
      return sign + digits.substring(0, exponent + 1) + "." + digits.substring(exponent + 1);
    }
    String mantissa = digits.length() > 1 ? digits.charAt(0) + "." + digits.substring(1) : digits;
    String power = String.format("%02d", Math.abs(exponent));
    return sign + mantissa + "e" + (exponent < 0 ? "-" : "+") + power;
  }
}
