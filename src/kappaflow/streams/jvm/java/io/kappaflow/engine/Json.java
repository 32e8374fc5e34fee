package io.kappaflow.engine;

import java.math.BigDecimal;
import java.math.MathContext;
import java.math.RoundingMode;

/**
 * JSON text as Python's {@code json.dumps} writes it: strings with {@code ensure_ascii}, floats
 * as Python's {@code repr} (the shortest text that reads back as the same double), JSON having
 * no NaN nor infinities ({@code null} for them, as the aggregates report).
 */
final class Json {
  private static final char[] HEX = "0123456789abcdef".toCharArray();

  private Json() {}

  /** {@code text} as a JSON string literal, non-ASCII escaped. */
  static String quote(String text) {
    StringBuilder out = new StringBuilder(text.length() + 2);
    quote(out, text);
    return out.toString();
  }

  static void quote(StringBuilder out, String text) {
    out.append('"');
    for (int i = 0; i < text.length(); i++) {
      char c = text.charAt(i);
      switch (c) {
        case '"':
          out.append("\\\"");
          break;
        case '\\':
          out.append("\\\\");
          break;
        case '\n':
          out.append("\\n");
          break;
        case '\r':
          out.append("\\r");
          break;
        case '\t':
          out.append("\\t");
          break;
        case '\b':
          out.append("\\b");
          break;
        case '\f':
          out.append("\\f");
          break;
        default:
          if (c < 0x20 || c > 0x7e) {
            out.append("\\u")
                .append(HEX[(c >> 12) & 0xf])
                .append(HEX[(c >> 8) & 0xf])
                .append(HEX[(c >> 4) & 0xf])
                .append(HEX[c & 0xf]);
          } else {
            out.append(c);
          }
      }
    }
    out.append('"');
  }

  /** A double as a JSON number ({@code null} when it is not finite). */
  static void number(StringBuilder out, double value) {
    if (Double.isNaN(value) || Double.isInfinite(value)) {
      out.append("null");
    } else {
      out.append(pyFloat(value));
    }
  }

  /** Python's {@code repr} of a finite double. */
  static String pyFloat(double value) {
    if (value == 0.0) {
      return (1.0 / value) < 0 ? "-0.0" : "0.0";
    }
    BigDecimal exact = new BigDecimal(value);
    BigDecimal shortest = exact;
    for (int digits = 1; digits <= 17; digits++) {
      BigDecimal rounded = exact.round(new MathContext(digits, RoundingMode.HALF_EVEN));
      if (rounded.doubleValue() == value) {
        shortest = rounded;
        break;
      }
    }
    BigDecimal stripped = shortest.stripTrailingZeros();
    String digits = stripped.unscaledValue().abs().toString();
    // The decimal exponent of the first digit: value = 0.d1d2... * 10^(point).
    int point = digits.length() - stripped.scale();
    StringBuilder out = new StringBuilder(24);
    if (stripped.signum() < 0) {
      out.append('-');
    }
    int exponent = point - 1;
    if (exponent < -4 || exponent >= 16) {
      out.append(digits.charAt(0));
      if (digits.length() > 1) {
        out.append('.').append(digits, 1, digits.length());
      }
      out.append('e').append(exponent < 0 ? '-' : '+');
      int magnitude = Math.abs(exponent);
      if (magnitude < 10) {
        out.append('0');
      }
      out.append(magnitude);
    } else if (point <= 0) {
      out.append("0.");
      for (int i = 0; i < -point; i++) {
        out.append('0');
      }
      out.append(digits);
    } else if (point >= digits.length()) {
      out.append(digits);
      for (int i = digits.length(); i < point; i++) {
        out.append('0');
      }
      out.append(".0");
    } else {
      out.append(digits, 0, point).append('.').append(digits, point, digits.length());
    }
    return out.toString();
  }
}
