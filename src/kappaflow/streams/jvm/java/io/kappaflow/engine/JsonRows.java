package io.kappaflow.engine;

import com.fasterxml.jackson.core.JsonFactory;
import com.fasterxml.jackson.core.JsonGenerator;
import com.fasterxml.jackson.core.JsonParser;
import com.fasterxml.jackson.core.JsonToken;
import com.fasterxml.jackson.databind.DeserializationFeature;
import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import java.io.IOException;
import java.io.Serializable;
import java.io.StringWriter;
import java.nio.charset.StandardCharsets;
import java.time.DateTimeException;
import java.time.Instant;
import java.time.LocalDateTime;
import java.time.ZoneOffset;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import org.apache.spark.sql.Column;
import org.apache.spark.sql.Row;
import org.apache.spark.sql.RowFactory;
import org.apache.spark.sql.api.java.UDF1;
import org.apache.spark.sql.functions;
import org.apache.spark.sql.types.DataType;
import org.apache.spark.sql.types.DataTypes;
import org.apache.spark.sql.types.StructField;

/**
 * A record's JSON bytes to the typed row its schema declares, in one pass of a streaming parser,
 * or to the reason it does not fit: the engine's side of {@code streams/ops/parsing.py}.
 *
 * <p>The pass accepts exactly what the SQL path ({@code from_json} with its checks) accepts, with
 * the same values: ints as JSON integers that fit a long, floats as any JSON number, strings as
 * JSON strings, text ({@code str | int}) as a string or a number's text as {@code from_json} writes
 * it, timestamps as ISO-8601 with a zone, the event time also as epoch milliseconds (an integer of
 * up to 15 digits, as a number or a string), nested objects and lists as declared; null or nothing
 * where a field is optional. Of duplicate keys the last counts, but a value that {@code from_json}
 * could not read (a non-integer for an int, a string for a float...) spoils the record wherever it
 * stands, as there. A record that does not fit is read again as a tree, which names its first
 * problem in declared order in the same words as the SQL path's variant verdict.
 */
public final class JsonRows {
  private static final JsonFactory FACTORY = new JsonFactory();
  private static final ObjectMapper TREE =
      new ObjectMapper().enable(DeserializationFeature.FAIL_ON_READING_DUP_TREE_KEY);
  private static final ObjectMapper SPEC = new ObjectMapper();

  static final int INT = 0;
  static final int FLOAT = 1;
  static final int STR = 2;
  static final int TEXT = 3;
  static final int BOOL = 4;
  static final int TIMESTAMP = 5;
  static final int EVENT_TIME = 6;
  static final int ARRAY = 7;
  static final int OBJECT = 8;
  private static final String[] KINDS = {
    "int", "float", "str", "text", "bool", "timestamp", "event_time", "array", "object"
  };
  private static final String[] PROBLEMS = {
    "is not an integer",
    "is not a number",
    "is not a string",
    "is not a string or a number",
    "is not a boolean",
    "is not a timestamp (ISO-8601 with a zone)",
    "is not epoch milliseconds or ISO-8601 with a zone",
    "is not an array",
    "is not an object",
  };

  private static final byte MISSING = 0;
  private static final byte GOOD = 1;
  private static final byte NULL = 2;
  private static final byte WRONG = 3;
  /** A value that does not fit but that a later duplicate key may replace. */
  private static final Object NOT_IT = new Object();

  private JsonRows() {}

  /** A field as the source checks it (parsing.py's {@code _Node}). */
  static final class Node implements Serializable {
    private static final long serialVersionUID = 1L;
    final String name;
    final int kind;
    final boolean required;
    final String role;
    final String rolePath;
    final Node[] children;
    final Map<String, Integer> index = new HashMap<>();
    final Node element;

    Node(JsonNode spec) {
      name = spec.get("name").asText();
      String kindName = spec.get("kind").asText();
      int k = -1;
      for (int i = 0; i < KINDS.length; i++) {
        if (KINDS[i].equals(kindName)) {
          k = i;
        }
      }
      if (k < 0) {
        throw new IllegalArgumentException("unknown kind " + kindName);
      }
      kind = k;
      required = spec.get("required").asBoolean();
      role = spec.hasNonNull("role") ? spec.get("role").asText() : null;
      rolePath = spec.get("role_path").asText();
      children = nodes(spec.get("children"));
      for (int i = 0; i < children.length; i++) {
        index.put(children[i].name, i);
      }
      element = spec.hasNonNull("element") ? new Node(spec.get("element")) : null;
    }

    DataType type() {
      switch (kind) {
        case INT:
          return DataTypes.LongType;
        case FLOAT:
          return DataTypes.DoubleType;
        case BOOL:
          return DataTypes.BooleanType;
        case TIMESTAMP:
        case EVENT_TIME:
          return DataTypes.TimestampType;
        case ARRAY:
          return DataTypes.createArrayType(element.type(), true);
        case OBJECT:
          return struct(children, false);
        default:
          return DataTypes.StringType;
      }
    }
  }

  /** The record does not fit: stop reading it. */
  private static final class Unfit extends Exception {
    private static final long serialVersionUID = 1L;
    static final Unfit IT = new Unfit();

    private Unfit() {
      super(null, null, false, false);
    }
  }

  private static Node[] nodes(JsonNode specs) {
    Node[] out = new Node[specs == null ? 0 : specs.size()];
    for (int i = 0; i < out.length; i++) {
      out[i] = new Node(specs.get(i));
    }
    return out;
  }

  private static org.apache.spark.sql.types.StructType struct(Node[] nodes, boolean top) {
    List<StructField> fields = new ArrayList<>();
    for (int i = 0; i < nodes.length; i++) {
      fields.add(DataTypes.createStructField(top ? "_kf_f" + i : nodes[i].name, nodes[i].type(), true));
    }
    if (top) {
      fields.add(DataTypes.createStructField("_kf_reason", DataTypes.StringType, true));
    }
    return DataTypes.createStructType(fields);
  }

  /**
   * The record {@code value} (JSON bytes) parsed by the fields {@code nodesJson} (a JSON array of
   * nodes: name, kind, required, role, role_path, children, element), as a struct of {@code
   * _kf_f0}, {@code _kf_f1}... (the fields' typed values, null for a record that does not fit)
   * and {@code _kf_reason} (null for a record that fits).
   */
  public static Column parse(Column value, String nodesJson) throws IOException {
    Node[] nodes = nodes(SPEC.readTree(nodesJson));
    Map<String, Integer> index = new HashMap<>();
    for (int i = 0; i < nodes.length; i++) {
      index.put(nodes[i].name, i);
    }
    UDF1<byte[], Row> parse = bytes -> row(bytes, nodes, index);
    return functions.udf(parse, struct(nodes, true)).withName("kf_json_rows").apply(value);
  }

  static Row row(byte[] bytes, Node[] nodes, Map<String, Integer> index) {
    Object[] out = new Object[nodes.length + 1];
    if (bytes != null && bytes.length > 0) {
      try (JsonParser parser = FACTORY.createParser(bytes)) {
        return fill(parser, nodes, index, out);
      } catch (Unfit | RuntimeException e) {
        // Does not fit: judged below.
      } catch (IOException e) {
        // Not valid JSON, or only not valid UTF-8, which Spark's cast of the bytes to a string
        // replaces: read it again as that string.
        try (JsonParser parser =
            FACTORY.createParser(new String(bytes, StandardCharsets.UTF_8))) {
          return fill(parser, nodes, index, out);
        } catch (IOException | Unfit | RuntimeException again) {
          // Judged below.
        }
      }
    }
    out[nodes.length] = reason(bytes, nodes);
    return RowFactory.create(out);
  }

  private static Row fill(JsonParser parser, Node[] nodes, Map<String, Integer> index, Object[] out)
      throws IOException, Unfit {
    if (parser.nextToken() != JsonToken.START_OBJECT) {
      throw Unfit.IT;
    }
    Object[] values = object(parser, nodes, index);
    System.arraycopy(values, 0, out, 0, values.length);
    return RowFactory.create(out);
  }

  /** An object's fields (the parser at its START_OBJECT), by the nodes' order. */
  private static Object[] object(JsonParser parser, Node[] nodes, Map<String, Integer> index)
      throws IOException, Unfit {
    Object[] values = new Object[nodes.length];
    byte[] states = new byte[nodes.length];
    JsonToken token;
    while ((token = parser.nextToken()) == JsonToken.FIELD_NAME) {
      Integer at = index.get(parser.currentName());
      JsonToken first = parser.nextToken();
      if (at == null) {
        parser.skipChildren();
        continue;
      }
      if (first == JsonToken.VALUE_NULL) {
        values[at] = null;
        states[at] = NULL;
        continue;
      }
      Object v = value(parser, first, nodes[at]);
      values[at] = v == NOT_IT ? null : v;
      states[at] = v == NOT_IT ? WRONG : GOOD;
    }
    if (token != JsonToken.END_OBJECT) {
      throw Unfit.IT;
    }
    for (int i = 0; i < nodes.length; i++) {
      if (states[i] == WRONG || (nodes[i].required && states[i] != GOOD)) {
        throw Unfit.IT;
      }
    }
    return values;
  }

  /**
   * One value (the parser at its first token, not null) as {@code node} declares it; {@code
   * NOT_IT} for a value {@code from_json} reads as text that is not of the kind, Unfit for one it
   * cannot read.
   */
  private static Object value(JsonParser parser, JsonToken token, Node node)
      throws IOException, Unfit {
    switch (node.kind) {
      case INT:
        if (token == JsonToken.VALUE_NUMBER_INT
            && parser.getNumberType() != JsonParser.NumberType.BIG_INTEGER) {
          return parser.getLongValue();
        }
        throw Unfit.IT;
      case FLOAT:
        if (token == JsonToken.VALUE_NUMBER_INT || token == JsonToken.VALUE_NUMBER_FLOAT) {
          return parser.getDoubleValue();
        }
        throw Unfit.IT;
      case BOOL:
        if (token == JsonToken.VALUE_TRUE || token == JsonToken.VALUE_FALSE) {
          return token == JsonToken.VALUE_TRUE;
        }
        throw Unfit.IT;
      case STR:
        if (token == JsonToken.VALUE_STRING) {
          return parser.getText();
        }
        parser.skipChildren();
        return NOT_IT;
      case TEXT:
        if (token == JsonToken.VALUE_STRING) {
          return parser.getText();
        }
        if (token == JsonToken.VALUE_NUMBER_INT || token == JsonToken.VALUE_NUMBER_FLOAT) {
          return numberText(parser, token);
        }
        parser.skipChildren();
        return NOT_IT;
      case TIMESTAMP:
        if (token == JsonToken.VALUE_STRING) {
          Instant at = iso(parser.getText());
          return at == null ? NOT_IT : at;
        }
        parser.skipChildren();
        return NOT_IT;
      case EVENT_TIME:
        if (token == JsonToken.VALUE_STRING) {
          Instant at = eventTime(parser.getText());
          return at == null ? NOT_IT : at;
        }
        if (token == JsonToken.VALUE_NUMBER_INT
            && parser.getNumberType() != JsonParser.NumberType.BIG_INTEGER) {
          long ms = parser.getLongValue();
          return epochMs(ms) ? Instant.ofEpochMilli(ms) : NOT_IT;
        }
        parser.skipChildren();
        return NOT_IT;
      case ARRAY:
        if (token != JsonToken.START_ARRAY) {
          throw Unfit.IT;
        }
        List<Object> items = new ArrayList<>();
        JsonToken item;
        while ((item = parser.nextToken()) != JsonToken.END_ARRAY) {
          if (item == null) {
            throw Unfit.IT;
          }
          if (item == JsonToken.VALUE_NULL) {
            if (node.element.required) {
              throw Unfit.IT;
            }
            items.add(null);
            continue;
          }
          Object v = value(parser, item, node.element);
          if (v == NOT_IT) {
            throw Unfit.IT;
          }
          items.add(v);
        }
        return items;
      default: // OBJECT
        if (token != JsonToken.START_OBJECT) {
          throw Unfit.IT;
        }
        return RowFactory.create(object(parser, node.children, node.index));
    }
  }

  /** A number's text as {@code from_json} writes it into a string field (1e3: 1000.0). */
  private static String numberText(JsonParser parser, JsonToken token) throws IOException {
    if (token == JsonToken.VALUE_NUMBER_INT
        && parser.getNumberType() != JsonParser.NumberType.BIG_INTEGER) {
      return Long.toString(parser.getLongValue());
    }
    StringWriter out = new StringWriter();
    try (JsonGenerator generator = FACTORY.createGenerator(out)) {
      generator.copyCurrentStructure(parser);
    }
    return out.toString();
  }

  /** Whether an integer has at most 15 digits (epoch milliseconds). */
  private static boolean epochMs(long ms) {
    return ms > -1_000_000_000_000_000L && ms < 1_000_000_000_000_000L;
  }

  /** Epoch milliseconds (up to 15 digits, signed) or ISO-8601 with a zone; null otherwise. */
  static Instant eventTime(String text) {
    int n = text.length();
    int start = n > 0 && text.charAt(0) == '-' ? 1 : 0;
    if (n - start >= 1 && n - start <= 15 && digits(text, start, n)) {
      return Instant.ofEpochMilli(Long.parseLong(text));
    }
    return iso(text);
  }

  /**
   * {@code yyyy-MM-dd[T ]HH:mm:ss[.f{1,9}](Z|+HH|+HHmm|+HH:mm)} as an instant (microseconds kept,
   * as Spark's timestamps); null for other text or an impossible date, time or offset.
   */
  static Instant iso(String s) {
    int n = s.length();
    if (n < 20
        || !digits(s, 0, 4)
        || s.charAt(4) != '-'
        || !digits(s, 5, 7)
        || s.charAt(7) != '-'
        || !digits(s, 8, 10)
        || (s.charAt(10) != 'T' && s.charAt(10) != ' ')
        || !digits(s, 11, 13)
        || s.charAt(13) != ':'
        || !digits(s, 14, 16)
        || s.charAt(16) != ':'
        || !digits(s, 17, 19)) {
      return null;
    }
    int i = 19;
    int nanos = 0;
    if (s.charAt(i) == '.') {
      int from = ++i;
      while (i < n && i - from < 10 && isDigit(s.charAt(i))) {
        i++;
      }
      int count = i - from;
      if (count < 1 || count > 9) {
        return null;
      }
      nanos = Integer.parseInt(s.substring(from, i));
      for (int k = count; k < 9; k++) {
        nanos *= 10;
      }
      nanos -= nanos % 1000;
    }
    if (i >= n) {
      return null;
    }
    ZoneOffset offset;
    try {
      char sign = s.charAt(i);
      if (sign == 'Z' && i == n - 1) {
        offset = ZoneOffset.UTC;
      } else if (sign == '+' || sign == '-') {
        int rest = n - i - 1;
        int hours;
        int minutes = 0;
        if (rest == 2 && digits(s, i + 1, n)) {
          hours = Integer.parseInt(s.substring(i + 1, n));
        } else if (rest == 4 && digits(s, i + 1, n)) {
          hours = Integer.parseInt(s.substring(i + 1, i + 3));
          minutes = Integer.parseInt(s.substring(i + 3, n));
        } else if (rest == 5 && s.charAt(i + 3) == ':' && digits(s, i + 1, i + 3)
            && digits(s, i + 4, n)) {
          hours = Integer.parseInt(s.substring(i + 1, i + 3));
          minutes = Integer.parseInt(s.substring(i + 4, n));
        } else {
          return null;
        }
        offset =
            sign == '+'
                ? ZoneOffset.ofHoursMinutes(hours, minutes)
                : ZoneOffset.ofHoursMinutes(-hours, -minutes);
      } else {
        return null;
      }
      LocalDateTime local =
          LocalDateTime.of(
              Integer.parseInt(s.substring(0, 4)),
              Integer.parseInt(s.substring(5, 7)),
              Integer.parseInt(s.substring(8, 10)),
              Integer.parseInt(s.substring(11, 13)),
              Integer.parseInt(s.substring(14, 16)),
              Integer.parseInt(s.substring(17, 19)),
              nanos);
      return local.toInstant(offset);
    } catch (DateTimeException e) {
      return null;
    }
  }

  private static boolean isDigit(char c) {
    return c >= '0' && c <= '9';
  }

  private static boolean digits(String s, int from, int to) {
    for (int i = from; i < to; i++) {
      if (!isDigit(s.charAt(i))) {
        return false;
      }
    }
    return true;
  }

  // The reason of a record that does not fit, as the SQL path's variant verdict words it.

  static String reason(byte[] bytes, Node[] nodes) {
    if (bytes == null || bytes.length == 0) {
      return "empty record";
    }
    JsonNode tree;
    try {
      // Malformed UTF-8 is replaced, as Spark's cast of the bytes to a string does.
      tree = TREE.readTree(new String(bytes, StandardCharsets.UTF_8));
    } catch (IOException e) {
      return "not valid JSON";
    }
    if (tree == null || tree.isMissingNode()) {
      return "not valid JSON";
    }
    if (!tree.isObject()) {
      return "not a JSON object";
    }
    for (Node node : nodes) {
      String problem = judge(node, tree.get(node.name), node.name);
      if (problem != null) {
        return problem;
      }
    }
    // The record's values do not fit though each field does (the SQL path says the same).
    return "record does not fit the schema";
  }

  private static String judge(Node node, JsonNode v, String path) {
    if (v == null || v.isNull()) {
      if (node.role != null) {
        return "missing " + node.role + " field '" + node.rolePath + "'";
      }
      if (!node.required) {
        return null;
      }
      return v == null ? "missing field '" + path + "'" : "field '" + path + "' is null";
    }
    if (!fits(node.kind, v)) {
      String label = node.role != null ? node.role + " field" : "field";
      return label + " '" + path + "' " + PROBLEMS[node.kind];
    }
    if (node.kind == OBJECT) {
      for (Node child : node.children) {
        String problem = judge(child, v.get(child.name), path + "." + child.name);
        if (problem != null) {
          return problem;
        }
      }
    } else if (node.kind == ARRAY) {
      for (int i = 0; i < v.size(); i++) {
        String problem = judge(node.element, v.get(i), path + "[" + i + "]");
        if (problem != null) {
          return problem;
        }
      }
    }
    return null;
  }

  /** Whether a JSON value is of the kind, as the variant's type says it. */
  private static boolean fits(int kind, JsonNode v) {
    boolean integer = v.isIntegralNumber() && v.canConvertToLong();
    switch (kind) {
      case INT:
        return integer;
      case FLOAT:
        return v.isNumber();
      case STR:
        return v.isTextual();
      case TEXT:
        return v.isTextual() || v.isNumber();
      case BOOL:
        return v.isBoolean();
      case TIMESTAMP:
        return v.isTextual() && iso(v.asText()) != null;
      case EVENT_TIME:
        return (v.isTextual() && eventTime(v.asText()) != null)
            || (integer && epochMs(v.asLong()));
      case ARRAY:
        return v.isArray();
      default:
        return v.isObject();
    }
  }
}
