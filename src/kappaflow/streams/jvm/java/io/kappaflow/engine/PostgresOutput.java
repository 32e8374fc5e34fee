package io.kappaflow.engine;

import com.fasterxml.jackson.core.type.TypeReference;
import com.fasterxml.jackson.databind.ObjectMapper;
import java.sql.Connection;
import java.sql.PreparedStatement;
import java.sql.SQLException;
import java.sql.Timestamp;
import java.time.Instant;
import java.time.ZoneOffset;
import java.util.ArrayList;
import java.util.Collections;
import java.util.Iterator;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import org.apache.spark.TaskContext;
import org.apache.spark.api.java.function.MapPartitionsFunction;
import org.apache.spark.sql.Dataset;
import org.apache.spark.sql.Encoders;
import org.apache.spark.sql.Row;

/**
 * A batch's rows for a PostgreSQL table, written by the tasks that hold them: each task writes
 * its partition of the batch in one database transaction, with a marker row of that (job,
 * output, batch, partition) in {@code kappaflow_markers}, exactly once.
 *
 * <p>The marker is inserted first ({@code ON CONFLICT DO NOTHING}): a partition whose marker
 * is committed inserts nothing and is skipped, and an attempt running beside another (a
 * retried or speculative task, a zombie of a driver that died) waits on the marker's unique
 * index until the other ends, then skips or writes. Then the rows, in the partition's order:
 * an upsert ({@code INSERT ... ON CONFLICT (key) DO UPDATE}) or a delete by the key, and the
 * commit. Spark re-runs a batch with the same input and state, so a partition's rows are the
 * same on a re-run. The markers of the partition's batches before the one before are removed
 * in the same transaction: Spark never runs them again.
 *
 * <p>The rows have the column {@code _op} ("u" upsert, "d" delete) and then the table's
 * columns in the order the spec names them.
 */
public final class PostgresOutput {
  private static final ObjectMapper JSON = new ObjectMapper();
  /** How many statements go to the server in one round trip. */
  private static final int BATCH = 1000;

  private PostgresOutput() {}

  /**
   * Writes {@code rows} for batch {@code batchId} of {@code output}; returns JSON with the
   * batch's {@code rows}, those {@code written} now and the partitions {@code skipped}
   * (committed before). {@code specJson}: {@code url} (JDBC), {@code properties} (user,
   * password, ...), {@code table} (quoted), {@code columns} (quoted names), {@code placeholders}
   * (one per column: "?" or a cast of it) and {@code key} (the key columns' indexes).
   */
  public static String write(
      Dataset<Row> rows, String job, String output, long batchId, String specJson)
      throws Exception {
    Map<String, Object> spec = JSON.readValue(specJson, new TypeReference<Map<String, Object>>() {});
    Task task = new Task(job, output, batchId, spec);
    List<long[]> counts =
        rows.mapPartitions(task, Encoders.javaSerialization(long[].class)).collectAsList();
    long total = 0;
    long written = 0;
    long skipped = 0;
    for (long[] c : counts) {
      total += c[0];
      written += c[1];
      skipped += c[2];
    }
    return String.format(
        "{\"rows\": %d, \"written\": %d, \"skipped\": %d}", total, written, skipped);
  }

  /** Connects to the database of {@code spec} (without DriverManager: the driver's jar is
   * Spark's, which DriverManager's class loader may not see). */
  static Connection connect(Map<String, Object> spec) throws SQLException {
    Properties props = new Properties();
    @SuppressWarnings("unchecked")
    Map<String, Object> given = (Map<String, Object>) spec.get("properties");
    for (Map.Entry<String, Object> e : given.entrySet()) {
      props.setProperty(e.getKey(), String.valueOf(e.getValue()));
    }
    Connection conn = new org.postgresql.Driver().connect((String) spec.get("url"), props);
    if (conn == null) {
      throw new SQLException("not a PostgreSQL JDBC URL: " + spec.get("url"));
    }
    return conn;
  }

  static final class Task implements MapPartitionsFunction<Row, long[]> {
    private static final long serialVersionUID = 1L;
    private final String job;
    private final String output;
    private final long batchId;
    private final String specJson;

    Task(String job, String output, long batchId, Map<String, Object> spec) throws Exception {
      this.job = job;
      this.output = output;
      this.batchId = batchId;
      this.specJson = JSON.writeValueAsString(spec);
    }

    @Override
    public Iterator<long[]> call(Iterator<Row> rows) throws Exception {
      if (!rows.hasNext()) {
        return Collections.singletonList(new long[] {0, 0, 0}).iterator();
      }
      Map<String, Object> spec =
          JSON.readValue(specJson, new TypeReference<Map<String, Object>>() {});
      int partition = TaskContext.getPartitionId();
      @SuppressWarnings("unchecked")
      List<String> columns = (List<String>) spec.get("columns");
      @SuppressWarnings("unchecked")
      List<String> placeholders = (List<String>) spec.get("placeholders");
      @SuppressWarnings("unchecked")
      List<Integer> key = (List<Integer>) spec.get("key");
      String table = (String) spec.get("table");
      try (Connection conn = connect(spec)) {
        conn.setAutoCommit(false);
        try {
          if (!claim(conn, partition)) {
            conn.rollback();
            long n = 0;
            while (rows.hasNext()) {
              rows.next();
              n++;
            }
            return Collections.singletonList(new long[] {n, 0, 1}).iterator();
          }
          long n = 0;
          try (PreparedStatement upsert = conn.prepareStatement(upsertSql(table, columns, placeholders, key));
              PreparedStatement delete = conn.prepareStatement(deleteSql(table, columns, placeholders, key))) {
            PreparedStatement pending = null;
            int queued = 0;
            while (rows.hasNext()) {
              Row row = rows.next();
              boolean deleting = "d".equals(row.getString(0));
              PreparedStatement statement = deleting ? delete : upsert;
              if (pending != null && pending != statement) {
                // The partition's order holds: what is queued goes before a change of kind.
                pending.executeBatch();
                queued = 0;
              }
              if (deleting) {
                for (int i = 0; i < key.size(); i++) {
                  delete.setObject(i + 1, value(row, key.get(i) + 1));
                }
              } else {
                for (int i = 0; i < columns.size(); i++) {
                  upsert.setObject(i + 1, value(row, i + 1));
                }
              }
              statement.addBatch();
              pending = statement;
              if (++queued >= BATCH) {
                statement.executeBatch();
                queued = 0;
              }
              n++;
            }
            if (pending != null && queued > 0) {
              pending.executeBatch();
            }
          }
          try (PreparedStatement done =
              conn.prepareStatement(
                  "UPDATE kappaflow_markers SET rows = ? WHERE job = ? AND output = ? AND batch = ?"
                      + " AND partition = ?")) {
            done.setLong(1, n);
            bindMarker(done, 2, batchId, partition);
            done.executeUpdate();
          }
          conn.commit();
          return Collections.singletonList(new long[] {n, n, 0}).iterator();
        } catch (SQLException e) {
          conn.rollback();
          SQLException next = e.getNextException();
          throw next != null ? new SQLException(e.getMessage() + ": " + next.getMessage(), e) : e;
        }
      }
    }

    /** Inserts this partition's marker; false if a committed one holds it already. */
    private boolean claim(Connection conn, int partition) throws SQLException {
      try (PreparedStatement mark =
          conn.prepareStatement(
              "INSERT INTO kappaflow_markers (job, output, batch, partition, rows, written_at)"
                  + " VALUES (?, ?, ?, ?, 0, now()) ON CONFLICT DO NOTHING")) {
        bindMarker(mark, 1, batchId, partition);
        if (mark.executeUpdate() == 0) {
          return false;
        }
      }
      try (PreparedStatement prune =
          conn.prepareStatement(
              "DELETE FROM kappaflow_markers WHERE job = ? AND output = ? AND batch < ?"
                  + " AND partition = ?")) {
        bindMarker(prune, 1, batchId - 1, partition);
        prune.executeUpdate();
      }
      return true;
    }

    /** Binds (job, output, batch, partition) to four parameters from {@code first}. */
    private void bindMarker(PreparedStatement statement, int first, long batch, int partition)
        throws SQLException {
      statement.setString(first, job);
      statement.setString(first + 1, output);
      statement.setLong(first + 2, batch);
      statement.setInt(first + 3, partition);
    }
  }

  static String upsertSql(
      String table, List<String> columns, List<String> placeholders, List<Integer> key) {
    List<String> keys = new ArrayList<>();
    for (int i : key) {
      keys.add(columns.get(i));
    }
    List<String> updates = new ArrayList<>();
    for (int i = 0; i < columns.size(); i++) {
      if (!key.contains(i)) {
        updates.add(columns.get(i) + " = EXCLUDED." + columns.get(i));
      }
    }
    String action = updates.isEmpty() ? "NOTHING" : "UPDATE SET " + String.join(", ", updates);
    return "INSERT INTO " + table + " (" + String.join(", ", columns) + ") VALUES ("
        + String.join(", ", placeholders) + ") ON CONFLICT (" + String.join(", ", keys)
        + ") DO " + action;
  }

  static String deleteSql(
      String table, List<String> columns, List<String> placeholders, List<Integer> key) {
    List<String> where = new ArrayList<>();
    for (int i : key) {
      where.add(columns.get(i) + " = " + placeholders.get(i));
    }
    return "DELETE FROM " + table + " WHERE " + String.join(" AND ", where);
  }

  /** A row's value as JDBC takes it: a Spark timestamp as a time with its UTC offset (so the
   * session's time zone plays no part), the rest as Spark holds it. */
  static Object value(Row row, int i) {
    Object v = row.get(i);
    if (v instanceof Timestamp ts) {
      return ts.toInstant().atOffset(ZoneOffset.UTC);
    }
    if (v instanceof Instant at) {
      return at.atOffset(ZoneOffset.UTC);
    }
    return v;
  }
}
