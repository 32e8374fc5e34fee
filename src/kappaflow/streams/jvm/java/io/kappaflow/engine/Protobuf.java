package io.kappaflow.engine;

import com.fasterxml.jackson.core.JsonFactory;
import com.fasterxml.jackson.core.JsonGenerator;
import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import com.google.protobuf.ByteString;
import com.google.protobuf.CodedInputStream;
import com.google.protobuf.DescriptorProtos.FileDescriptorProto;
import com.google.protobuf.DescriptorProtos.FileDescriptorSet;
import com.google.protobuf.Descriptors.Descriptor;
import com.google.protobuf.Descriptors.EnumValueDescriptor;
import com.google.protobuf.Descriptors.FieldDescriptor;
import com.google.protobuf.Descriptors.FileDescriptor;
import com.google.protobuf.DynamicMessage;
import java.io.ByteArrayOutputStream;
import java.io.StringWriter;
import java.math.BigInteger;
import java.nio.ByteBuffer;
import java.time.Instant;
import java.time.OffsetDateTime;
import java.time.format.DateTimeFormatter;
import java.util.ArrayList;
import java.util.Base64;
import java.util.HashMap;
import java.util.Iterator;
import java.util.List;
import java.util.Map;
import java.util.concurrent.ConcurrentHashMap;
import org.apache.spark.sql.Column;
import org.apache.spark.sql.Row;
import org.apache.spark.sql.RowFactory;
import org.apache.spark.sql.api.java.UDF1;
import org.apache.spark.sql.functions;
import org.apache.spark.sql.types.DataTypes;
import org.apache.spark.sql.types.StructType;

/**
 * Protobuf records in the schema registry's wire format (a zero byte, the 4-byte schema id,
 * the message indexes as a zigzag-varint array, the message), decoded to JSON text for the
 * source's checks and encoded from a row's JSON text for a sink, with protobuf-java's
 * DynamicMessage and the descriptors Python compiled from the registered .proto text
 * (serialized FileDescriptorSets, base64, the subject's file last).
 *
 * <p>A message becomes a JSON object by field name: every field of the writer's message,
 * proto3 defaults included, except fields with presence that are not set (a message, a
 * proto3 {@code optional} scalar, a oneof member), which are left out (null); enums as their
 * names, bytes as base64, 64-bit unsigned integers exactly, maps as arrays of {@code {"key",
 * "value"}} objects, {@code google.protobuf.Timestamp} as ISO-8601 text in UTC and the
 * wrappers ({@code google.protobuf.StringValue}...) as their value.
 */
public final class Protobuf {
  private static final ObjectMapper JSON = new ObjectMapper();
  private static final JsonFactory FACTORY = new JsonFactory();
  private static final String TIMESTAMP = "google.protobuf.Timestamp";
  private static final StructType DECODED =
      new StructType().add("json", DataTypes.StringType).add("reason", DataTypes.StringType);
  /** Descriptors built once per JVM per spec: a message's file of each schema id. */
  private static final Map<String, Map<Integer, FileDescriptor>> FILES =
      new ConcurrentHashMap<>();

  private Protobuf() {}

  /**
   * Each record of {@code value} decoded: a struct of its JSON text ({@code json}) and, when it
   * does not decode, why ({@code reason}). {@code specJson} is a JSON object of schema id to
   * base64 FileDescriptorSet (the subject's versions: a record's id must be one, and its
   * message indexes must name {@code message} there); {@code reader} the FileDescriptorSet whose
   * {@code message} (its full name) reads every record, as Protobuf reads by field number: a
   * field the writer's version lacks has its default, one the reader lacks is skipped. {@code
   * subject} is for the reasons.
   */
  public static Column decode(
      Column value, String specJson, String reader, String message, String subject) {
    UDF1<byte[], Row> decoded = bytes -> decodeOne(bytes, specJson, reader, message, subject);
    return functions.udf(decoded, DECODED).apply(value);
  }

  /**
   * Each JSON object of {@code rows} as a message {@code message} of the FileDescriptorSet
   * {@code set} (base64), in the wire format with schema id {@code schemaId} and message
   * index 0 (the file's first message).
   */
  public static Column encode(Column rows, String set, String message, int schemaId) {
    UDF1<String, byte[]> encoded = text -> encodeOne(text, set, message, schemaId);
    return functions.udf(encoded, DataTypes.BinaryType).apply(rows);
  }

  static Row decodeOne(
      byte[] value, String specJson, String reader, String message, String subject)
      throws Exception {
    if (value == null || value.length < 5 || value[0] != 0) {
      return RowFactory.create(
          null, "not in the schema registry's wire format (a zero byte, a 4-byte schema id)");
    }
    int id = ByteBuffer.wrap(value, 1, 4).getInt();
    FileDescriptor file = files(specJson).get(id);
    if (file == null) {
      return RowFactory.create(
          null,
          "schema id "
              + Integer.toUnsignedString(id)
              + " is not a version of subject '"
              + subject
              + "' the job knows (it reads the versions registered when it started)");
    }
    String undecodable =
        "does not decode as Protobuf with schema id " + id + " of subject '" + subject + "'";
    CodedInputStream in = CodedInputStream.newInstance(value, 5, value.length - 5);
    List<Integer> indexes = new ArrayList<>();
    Descriptor descriptor;
    DynamicMessage parsed;
    try {
      int count = in.readSInt32();
      if (count < 0 || count > 64) {
        return RowFactory.create(null, undecodable + ": bad message indexes");
      }
      for (int i = 0; i < count; i++) {
        indexes.add(in.readSInt32());
      }
      if (indexes.isEmpty()) {
        indexes.add(0);
      }
      descriptor = message(file, indexes);
      if (descriptor == null) {
        return RowFactory.create(
            null, undecodable + ": message indexes " + indexes + " name no message");
      }
      if (!descriptor.getFullName().equals(message)) {
        return RowFactory.create(
            null,
            "a "
                + descriptor.getFullName()
                + " message (schema id "
                + id
                + "), not the "
                + message
                + " the job reads");
      }
      parsed = DynamicMessage.parseFrom(find(build(reader), message), in);
    } catch (java.io.IOException | RuntimeException e) {
      return RowFactory.create(null, undecodable + ": " + e.getMessage());
    }
    StringWriter out = new StringWriter();
    try (JsonGenerator gen = FACTORY.createGenerator(out)) {
      writeMessage(gen, parsed);
    }
    return RowFactory.create(out.toString(), null);
  }

  static byte[] encodeOne(String text, String set, String message, int schemaId)
      throws Exception {
    if (text == null) {
      return null;
    }
    Descriptor descriptor = find(build(set), message);
    DynamicMessage built = fromJson(descriptor, JSON.readTree(text));
    ByteArrayOutputStream out = new ByteArrayOutputStream();
    out.write(0);
    out.write(ByteBuffer.allocate(4).putInt(schemaId).array());
    out.write(0); // the message indexes: a single 0, the file's first message
    built.writeTo(out);
    return out.toByteArray();
  }

  // -- descriptors

  private static Map<Integer, FileDescriptor> files(String specJson) throws Exception {
    Map<Integer, FileDescriptor> found = FILES.get(specJson);
    if (found != null) {
      return found;
    }
    Map<Integer, FileDescriptor> built = new HashMap<>();
    Iterator<Map.Entry<String, JsonNode>> entries = JSON.readTree(specJson).fields();
    while (entries.hasNext()) {
      Map.Entry<String, JsonNode> entry = entries.next();
      built.put(Integer.parseInt(entry.getKey()), build(entry.getValue().asText()));
    }
    FILES.put(specJson, built);
    return built;
  }

  private static final Map<String, FileDescriptor> BUILT = new ConcurrentHashMap<>();

  /** The last file of a base64 FileDescriptorSet, its imports built before it. */
  private static FileDescriptor build(String set) throws Exception {
    FileDescriptor cached = BUILT.get(set);
    if (cached != null) {
      return cached;
    }
    FileDescriptorSet files = FileDescriptorSet.parseFrom(Base64.getDecoder().decode(set));
    Map<String, FileDescriptor> byName = new HashMap<>();
    FileDescriptor last = null;
    for (FileDescriptorProto proto : files.getFileList()) {
      List<FileDescriptor> deps = new ArrayList<>();
      for (String dep : proto.getDependencyList()) {
        deps.add(byName.get(dep));
      }
      last = FileDescriptor.buildFrom(proto, deps.toArray(new FileDescriptor[0]));
      byName.put(proto.getName(), last);
    }
    if (last == null) {
      throw new IllegalArgumentException("an empty FileDescriptorSet");
    }
    BUILT.put(set, last);
    return last;
  }

  private static Descriptor message(FileDescriptor file, List<Integer> indexes) {
    int first = indexes.get(0);
    if (first < 0 || first >= file.getMessageTypes().size()) {
      return null;
    }
    Descriptor found = file.getMessageTypes().get(first);
    for (int i = 1; i < indexes.size(); i++) {
      int at = indexes.get(i);
      if (at < 0 || at >= found.getNestedTypes().size()) {
        return null;
      }
      found = found.getNestedTypes().get(at);
    }
    return found;
  }

  private static Descriptor find(FileDescriptor file, String fullName) {
    String prefix = file.getPackage().isEmpty() ? "" : file.getPackage() + ".";
    String[] names = fullName.substring(prefix.length()).split("\\.");
    Descriptor found = file.findMessageTypeByName(names[0]);
    for (int i = 1; i < names.length && found != null; i++) {
      found = found.findNestedTypeByName(names[i]);
    }
    if (found == null) {
      throw new IllegalArgumentException("no message " + fullName + " in " + file.getName());
    }
    return found;
  }

  // -- a message as JSON

  private static void writeMessage(JsonGenerator gen, DynamicMessage msg) throws Exception {
    gen.writeStartObject();
    for (FieldDescriptor field : msg.getDescriptorForType().getFields()) {
      if (field.isRepeated()) {
        gen.writeFieldName(field.getName());
        gen.writeStartArray();
        int n = msg.getRepeatedFieldCount(field);
        for (int i = 0; i < n; i++) {
          writeValue(gen, field, msg.getRepeatedField(field, i));
        }
        gen.writeEndArray();
      } else if (!field.hasPresence() || msg.hasField(field)) {
        gen.writeFieldName(field.getName());
        writeValue(gen, field, msg.getField(field));
      }
    }
    gen.writeEndObject();
  }

  private static void writeValue(JsonGenerator gen, FieldDescriptor field, Object value)
      throws Exception {
    switch (field.getType()) {
      case UINT32:
      case FIXED32:
        gen.writeNumber(Integer.toUnsignedLong((Integer) value));
        break;
      case UINT64:
      case FIXED64:
        gen.writeNumber(new BigInteger(Long.toUnsignedString((Long) value)));
        break;
      case INT32:
      case SINT32:
      case SFIXED32:
        gen.writeNumber((Integer) value);
        break;
      case INT64:
      case SINT64:
      case SFIXED64:
        gen.writeNumber((Long) value);
        break;
      case FLOAT:
        gen.writeNumber((Float) value);
        break;
      case DOUBLE:
        gen.writeNumber((Double) value);
        break;
      case BOOL:
        gen.writeBoolean((Boolean) value);
        break;
      case STRING:
        gen.writeString((String) value);
        break;
      case BYTES:
        gen.writeBinary(((ByteString) value).toByteArray());
        break;
      case ENUM:
        gen.writeString(((EnumValueDescriptor) value).getName());
        break;
      default:
        DynamicMessage inner = (DynamicMessage) value;
        String name = field.getMessageType().getFullName();
        if (name.equals(TIMESTAMP)) {
          FieldDescriptor seconds = field.getMessageType().findFieldByName("seconds");
          FieldDescriptor nanos = field.getMessageType().findFieldByName("nanos");
          Instant at =
              Instant.ofEpochSecond(
                  (Long) inner.getField(seconds), (Integer) inner.getField(nanos));
          gen.writeString(at.toString());
        } else if (isWrapper(name)) {
          FieldDescriptor wrapped = field.getMessageType().findFieldByName("value");
          writeValue(gen, wrapped, inner.getField(wrapped));
        } else {
          writeMessage(gen, inner);
        }
    }
  }

  private static boolean isWrapper(String name) {
    return name.startsWith("google.protobuf.") && name.endsWith("Value") && !name.equals(
        "google.protobuf.Value");
  }

  // -- JSON as a message

  private static DynamicMessage fromJson(Descriptor descriptor, JsonNode node) {
    DynamicMessage.Builder builder = DynamicMessage.newBuilder(descriptor);
    for (FieldDescriptor field : descriptor.getFields()) {
      JsonNode value = node.get(field.getName());
      if (value == null || value.isNull()) {
        continue;
      }
      if (field.isRepeated()) {
        for (JsonNode item : value) {
          if (!item.isNull()) {
            builder.addRepeatedField(field, fromJsonValue(field, item));
          }
        }
      } else {
        builder.setField(field, fromJsonValue(field, value));
      }
    }
    return builder.build();
  }

  private static Object fromJsonValue(FieldDescriptor field, JsonNode value) {
    switch (field.getType()) {
      case INT32:
      case SINT32:
      case SFIXED32:
      case UINT32:
      case FIXED32:
        return (int) value.asLong();
      case INT64:
      case SINT64:
      case SFIXED64:
      case UINT64:
      case FIXED64:
        return value.asLong();
      case FLOAT:
        return (float) value.asDouble();
      case DOUBLE:
        return value.asDouble();
      case BOOL:
        return value.asBoolean();
      case STRING:
        return value.isTextual() ? value.asText() : value.toString();
      case BYTES:
        return ByteString.copyFrom(Base64.getDecoder().decode(value.asText()));
      case ENUM:
        EnumValueDescriptor named = field.getEnumType().findValueByName(value.asText());
        return named != null ? named : field.getEnumType().findValueByNumber(0);
      default:
        Descriptor type = field.getMessageType();
        if (type.getFullName().equals(TIMESTAMP)) {
          Instant at =
              value.isNumber()
                  ? Instant.ofEpochMilli(value.asLong())
                  : OffsetDateTime.parse(value.asText(), DateTimeFormatter.ISO_OFFSET_DATE_TIME)
                      .toInstant();
          return DynamicMessage.newBuilder(type)
              .setField(type.findFieldByName("seconds"), at.getEpochSecond())
              .setField(type.findFieldByName("nanos"), at.getNano())
              .build();
        }
        if (isWrapper(type.getFullName())) {
          FieldDescriptor wrapped = type.findFieldByName("value");
          return DynamicMessage.newBuilder(type)
              .setField(wrapped, fromJsonValue(wrapped, value))
              .build();
        }
        return fromJson(type, value);
    }
  }
}
