package io.kappaflow.engine;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.node.ArrayNode;
import com.fasterxml.jackson.databind.node.ObjectNode;
import io.delta.kernel.Operation;
import io.delta.kernel.Scan;
import io.delta.kernel.Snapshot;
import io.delta.kernel.Table;
import io.delta.kernel.Transaction;
import io.delta.kernel.TransactionBuilder;
import io.delta.kernel.TransactionCommitResult;
import io.delta.kernel.data.FilteredColumnarBatch;
import io.delta.kernel.data.Row;
import io.delta.kernel.defaults.engine.DefaultEngine;
import io.delta.kernel.engine.Engine;
import io.delta.kernel.exceptions.ConcurrentTransactionException;
import io.delta.kernel.exceptions.TableNotFoundException;
import io.delta.kernel.hook.PostCommitHook;
import io.delta.kernel.internal.InternalScanFileUtils;
import io.delta.kernel.internal.actions.AddFile;
import io.delta.kernel.internal.actions.SingleAction;
import io.delta.kernel.internal.types.DataTypeJsonSerDe;
import io.delta.kernel.internal.util.Utils;
import io.delta.kernel.internal.util.VectorUtils;
import io.delta.kernel.statistics.DataFileStatistics;
import io.delta.kernel.types.StructType;
import io.delta.kernel.utils.CloseableIterable;
import io.delta.kernel.utils.CloseableIterator;
import java.io.IOException;
import java.util.ArrayList;
import java.util.Collections;
import java.util.HashSet;
import java.util.Iterator;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Optional;
import java.util.Set;
import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.fs.Path;

/**
 * The lake's Delta Lake tables, through Delta Kernel: the driver's metadata work only.
 *
 * <p>Spark's Parquet writer writes a batch's files in the tasks; the driver then commits them
 * here as one Delta transaction whose {@code txn} action records (application id, batch id), so
 * that a re-run of a committed batch is refused by the format itself and every reader (Spark,
 * delta-rs, DuckDB over Arrow) sees a batch whole or not at all. Files are given as paths
 * relative to the table's root with their partition values as Delta writes them (strings, null
 * for a null value), their size, modification time and row count.
 */
public final class DeltaLake {
  private static final ObjectMapper JSON = new ObjectMapper();
  private static final String ENGINE_INFO = "kappaflow";

  private DeltaLake() {}

  private static Engine engine(Configuration conf) {
    return DefaultEngine.create(conf);
  }

  private static Optional<Snapshot> latest(Engine engine, String path) {
    try {
      return Optional.of(Table.forPath(engine, path).getLatestSnapshot(engine));
    } catch (TableNotFoundException e) {
      return Optional.empty();
    }
  }

  /**
   * The table's version, schema (Delta's JSON, Spark's format) and partition columns as JSON,
   * or null where there is no Delta table.
   */
  public static String describe(Configuration conf, String path) throws IOException {
    Engine engine = engine(conf);
    Optional<Snapshot> found = latest(engine, path);
    if (found.isEmpty()) {
      return null;
    }
    Snapshot snapshot = found.get();
    ObjectNode out = JSON.createObjectNode();
    out.put("version", snapshot.getVersion());
    out.set("schema", JSON.readTree(DataTypeJsonSerDe.serializeStructType(snapshot.getSchema())));
    ArrayNode columns = out.putArray("partition_by");
    snapshot.getPartitionColumnNames().forEach(columns::add);
    return JSON.writeValueAsString(out);
  }

  /** The last batch id application {@code appId} committed to the table, or -1. */
  public static long committedBatch(Configuration conf, String path, String appId) {
    Engine engine = engine(conf);
    return latest(engine, path)
        .flatMap(snapshot -> snapshot.getLatestTransactionVersion(engine, appId))
        .orElse(-1L);
  }

  /**
   * Commit one batch's files (a JSON list of {path, size, modified, rows, partition_values}) as
   * one transaction marked (appId, batchId); the table is created with {@code schemaJson} and
   * {@code partitionJson} (a JSON list) if it does not exist. The new version, or -1 when the
   * application has already committed this batch (or a later one): nothing is written then.
   */
  public static long commitBatch(
      Configuration conf,
      String path,
      String appId,
      long batchId,
      String schemaJson,
      String partitionJson,
      String filesJson)
      throws IOException {
    Engine engine = engine(conf);
    Table table = Table.forPath(engine, path);
    boolean exists = latest(engine, path).isPresent();
    TransactionBuilder builder =
        table.createTransactionBuilder(
            engine, ENGINE_INFO, exists ? Operation.STREAMING_UPDATE : Operation.CREATE_TABLE);
    if (!exists) {
      List<String> partitions = new ArrayList<>();
      JSON.readTree(partitionJson).forEach(node -> partitions.add(node.asText()));
      builder =
          builder
              .withSchema(engine, DataTypeJsonSerDe.deserializeStructType(schemaJson))
              .withPartitionColumns(engine, partitions);
    }
    Transaction txn;
    try {
      txn = builder.withTransactionId(engine, appId, batchId).build(engine);
    } catch (ConcurrentTransactionException e) {
      return -1L;
    }
    StructType schema = txn.getSchema(engine);
    List<Row> actions = new ArrayList<>();
    for (JsonNode file : JSON.readTree(filesJson)) {
      actions.add(SingleAction.createAddFileSingleAction(addFile(schema, file, true)));
    }
    return commit(engine, txn, actions);
  }

  /**
   * Every live file of the table at {@code version} (-1: the latest) as a JSON object
   * {version, files: [{path (absolute), relative, size, rows, partition_values}]}.
   */
  public static String files(Configuration conf, String path, long version) throws IOException {
    Engine engine = engine(conf);
    Table table = Table.forPath(engine, path);
    Snapshot snapshot =
        version < 0 ? table.getLatestSnapshot(engine) : table.getSnapshotAsOfVersion(engine, version);
    ObjectNode out = JSON.createObjectNode();
    out.put("version", snapshot.getVersion());
    ArrayNode files = out.putArray("files");
    String root = new Path(snapshot.getPath()).toUri().toString().replaceAll("/+$", "");
    for (AddFile add : liveFiles(engine, snapshot)) {
      ObjectNode file = files.addObject();
      String relative = add.getPath();
      String absolute =
          relative.contains(":") ? relative : root + "/" + relative;
      file.put("path", new Path(new Path(absolute).toUri()).toString());
      file.put("relative", relative);
      file.put("size", add.getSize());
      file.put("rows", add.getNumRecords().orElse(-1L));
      ObjectNode values = file.putObject("partition_values");
      Map<String, String> parts = VectorUtils.toJavaMap(add.getPartitionValues());
      for (Map.Entry<String, String> entry : new java.util.TreeMap<>(parts).entrySet()) {
        values.put(entry.getKey(), entry.getValue());
      }
    }
    return JSON.writeValueAsString(out);
  }

  /**
   * Replace files by others holding the same rows (compaction), in one transaction read at
   * {@code readVersion}: {@code removeJson} lists the relative paths (as {@link #files} gives
   * them) to remove, {@code addJson} the new files as {@link #commitBatch} takes them. Neither
   * changes the table's data ({@code dataChange=false}); older versions keep their files until
   * a vacuum. The new version.
   */
  public static long rewrite(
      Configuration conf, String path, long readVersion, String removeJson, String addJson)
      throws IOException {
    Engine engine = engine(conf);
    Table table = Table.forPath(engine, path);
    Snapshot snapshot = table.getLatestSnapshot(engine);
    if (snapshot.getVersion() != readVersion) {
      throw new IllegalStateException(
          "the table moved from version " + readVersion + " to " + snapshot.getVersion());
    }
    Set<String> removed = new HashSet<>();
    JSON.readTree(removeJson).forEach(node -> removed.add(node.asText()));
    Transaction txn =
        table.createTransactionBuilder(engine, ENGINE_INFO, Operation.MANUAL_UPDATE).build(engine);
    StructType schema = txn.getSchema(engine);
    List<Row> actions = new ArrayList<>();
    long now = System.currentTimeMillis();
    for (AddFile add : liveFiles(engine, snapshot)) {
      if (removed.remove(add.getPath())) {
        actions.add(
            SingleAction.createRemoveFileSingleAction(add.toRemoveFileRow(false, Optional.of(now))));
      }
    }
    if (!removed.isEmpty()) {
      throw new IllegalArgumentException("not live files of the table: " + removed);
    }
    for (JsonNode file : JSON.readTree(addJson)) {
      actions.add(SingleAction.createAddFileSingleAction(addFile(schema, file, false)));
    }
    return commit(engine, txn, actions);
  }

  private static List<AddFile> liveFiles(Engine engine, Snapshot snapshot) throws IOException {
    List<AddFile> adds = new ArrayList<>();
    Scan scan = snapshot.getScanBuilder().build();
    try (CloseableIterator<FilteredColumnarBatch> batches = scan.getScanFiles(engine, true)) {
      while (batches.hasNext()) {
        try (CloseableIterator<Row> rows = batches.next().getRows()) {
          while (rows.hasNext()) {
            Row row = rows.next();
            adds.add(new AddFile(row.getStruct(InternalScanFileUtils.ADD_FILE_ORDINAL)));
          }
        }
      }
    }
    return adds;
  }

  private static Row addFile(StructType schema, JsonNode file, boolean dataChange) {
    Map<String, String> values = new LinkedHashMap<>();
    Iterator<Map.Entry<String, JsonNode>> fields = file.get("partition_values").fields();
    while (fields.hasNext()) {
      Map.Entry<String, JsonNode> entry = fields.next();
      values.put(entry.getKey(), entry.getValue().isNull() ? null : entry.getValue().asText());
    }
    // Delta's paths are URI-encoded relative paths, as Hadoop's Path gives them.
    String encoded = new Path(file.get("path").asText()).toUri().toString();
    DataFileStatistics stats =
        new DataFileStatistics(
            file.get("rows").asLong(),
            Collections.emptyMap(),
            Collections.emptyMap(),
            Collections.emptyMap(),
            Optional.empty());
    return AddFile.createAddFileRow(
        schema,
        encoded,
        VectorUtils.stringStringMapValue(values),
        file.get("size").asLong(),
        file.get("modified").asLong(),
        dataChange,
        Optional.empty(),
        Optional.empty(),
        Optional.empty(),
        Optional.empty(),
        Optional.of(stats));
  }

  private static long commit(Engine engine, Transaction txn, List<Row> actions)
      throws IOException {
    CloseableIterable<Row> data =
        CloseableIterable.inMemoryIterable(Utils.toCloseableIterator(actions.iterator()));
    TransactionCommitResult result = txn.commit(engine, data);
    for (PostCommitHook hook : result.getPostCommitHooks()) {
      hook.threadSafeInvoke(engine); // checkpoints, checksums: the commit itself is done
    }
    return result.getVersion();
  }
}
