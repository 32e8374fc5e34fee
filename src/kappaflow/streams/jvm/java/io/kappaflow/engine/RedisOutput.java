package io.kappaflow.engine;

import java.net.URI;
import java.util.Collections;
import java.util.Iterator;
import java.util.List;
import org.apache.spark.api.java.function.MapPartitionsFunction;
import org.apache.spark.sql.Dataset;
import org.apache.spark.sql.Encoders;
import org.apache.spark.sql.Row;
import redis.clients.jedis.Jedis;
import redis.clients.jedis.Transaction;

/**
 * A batch's serving-store writes, made by the tasks that hold them: each task writes its
 * partition of the batch in one MULTI/EXEC (a reader sees all of a partition's writes or none).
 *
 * <p>The rows have the columns {@code target}, {@code key}, {@code field} and {@code value}:
 * {@code target} "w" is a window of key {@code key} ({@code PREFIX w:KEY}, field the window's
 * start; an empty value removes the window, another adds the key to {@code PREFIX keys}),
 * "latest" a keyed stream's record ({@code PREFIX latest}, field the key). Writes are
 * idempotent: a batch run again writes the same values, in the same order within a partition.
 */
public final class RedisOutput {
  private RedisOutput() {}

  /** Writes {@code rows} under {@code prefix}; the number of rows written. */
  public static long write(
      Dataset<Row> rows, String prefix, String url, String username, String password)
      throws Exception {
    Task task = new Task(prefix, url, username, password);
    Dataset<Row> ordered = rows.select("target", "key", "field", "value");
    List<Long> counts = ordered.mapPartitions(task, Encoders.LONG()).collectAsList();
    long total = 0;
    for (long count : counts) {
      total += count;
    }
    return total;
  }

  static final class Task implements MapPartitionsFunction<Row, Long> {
    private static final long serialVersionUID = 1L;
    private final String prefix;
    private final String url;
    private final String username;
    private final String password;

    Task(String prefix, String url, String username, String password) {
      this.prefix = prefix;
      this.url = url;
      this.username = username;
      this.password = password;
    }

    @Override
    public Iterator<Long> call(Iterator<Row> rows) {
      if (!rows.hasNext()) {
        return Collections.singletonList(0L).iterator();
      }
      long n = 0;
      try (Jedis jedis = new Jedis(URI.create(url), 30_000)) {
        if (password != null && !password.isEmpty()) {
          if (username != null && !username.isEmpty()) {
            jedis.auth(username, password);
          } else {
            jedis.auth(password);
          }
        }
        Transaction tx = jedis.multi();
        while (rows.hasNext()) {
          Row row = rows.next();
          String value = row.getString(3);
          if ("w".equals(row.getString(0))) {
            String key = row.getString(1);
            String hash = prefix + "w:" + key;
            if (value == null || value.isEmpty()) {
              tx.hdel(hash, row.getString(2));
            } else {
              tx.hset(hash, row.getString(2), value);
              tx.sadd(prefix + "keys", key);
            }
          } else {
            tx.hset(prefix + "latest", row.getString(2), value);
          }
          n++;
        }
        tx.exec();
      }
      return Collections.singletonList(n).iterator();
    }
  }
}
