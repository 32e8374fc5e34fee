package io.kappaflow.engine;

import com.fasterxml.jackson.core.JsonFactory;
import com.fasterxml.jackson.core.JsonParser;
import com.fasterxml.jackson.core.JsonToken;
import com.fasterxml.jackson.core.type.TypeReference;
import com.fasterxml.jackson.databind.ObjectMapper;
import java.io.IOException;
import java.util.HashMap;
import java.util.LinkedHashMap;
import java.util.Map;
import org.apache.spark.sql.Column;
import org.apache.spark.sql.api.java.UDF1;
import org.apache.spark.sql.functions;
import org.apache.spark.sql.types.DataTypes;

/**
 * Checks of a record's JSON text that Spark's {@code from_json} does not make, in one pass of a
 * streaming parser (no tree, no values kept).
 */
public final class JsonChecks {
  private static final ObjectMapper JSON = new ObjectMapper();
  private static final JsonFactory FACTORY = new JsonFactory();
  private static final byte MISSING = 0;
  private static final byte STRING = 1;
  private static final byte NULL = 2;
  private static final byte OTHER = 3;

  private JsonChecks() {}

  /**
   * Whether the record {@code value} (JSON bytes) is an object whose top-level fields named in
   * {@code fieldsJson} (a JSON object: name to whether it is required) each hold a JSON string,
   * or, for one not required, a JSON null or nothing. {@code from_json} reads any JSON value into
   * a string field (a number as its text), so a record it reads cleanly may still hold a number
   * there. Of duplicate keys the last counts, as for {@code from_json}. False for what does not
   * parse (and for null).
   */
  public static Column strings(Column value, String fieldsJson) throws IOException {
    Map<String, Boolean> fields =
        JSON.readValue(fieldsJson, new TypeReference<LinkedHashMap<String, Boolean>>() {});
    Map<String, Integer> index = new HashMap<>();
    boolean[] required = new boolean[fields.size()];
    for (Map.Entry<String, Boolean> field : fields.entrySet()) {
      required[index.size()] = field.getValue();
      index.put(field.getKey(), index.size());
    }
    UDF1<byte[], Boolean> check = bytes -> bytes != null && strings(bytes, index, required);
    return functions.udf(check, DataTypes.BooleanType).apply(value);
  }

  static boolean strings(byte[] bytes, Map<String, Integer> index, boolean[] required) {
    byte[] found = new byte[required.length];
    try (JsonParser parser = FACTORY.createParser(bytes)) {
      if (parser.nextToken() != JsonToken.START_OBJECT) {
        return false;
      }
      JsonToken token;
      while ((token = parser.nextToken()) == JsonToken.FIELD_NAME) {
        Integer at = index.get(parser.currentName());
        JsonToken value = parser.nextToken();
        if (at != null) {
          found[at] =
              value == JsonToken.VALUE_STRING ? STRING : value == JsonToken.VALUE_NULL ? NULL : OTHER;
        }
        parser.skipChildren();
      }
      if (token != JsonToken.END_OBJECT) {
        return false;
      }
    } catch (IOException e) {
      return false;
    }
    for (int i = 0; i < found.length; i++) {
      if (found[i] == OTHER || (required[i] && found[i] != STRING)) {
        return false;
      }
    }
    return true;
  }
}
