package kfexp;

import java.util.ArrayList;
import java.util.List;
import org.apache.spark.api.java.function.MapFunction;
import org.apache.spark.sql.Dataset;
import org.apache.spark.sql.Encoders;
import org.apache.spark.sql.Row;
import org.apache.spark.sql.streaming.OutputMode;
import org.apache.spark.sql.streaming.StatefulProcessor;
import org.apache.spark.sql.streaming.TTLConfig;
import org.apache.spark.sql.streaming.TimeMode;
import org.apache.spark.sql.streaming.TimerValues;
import org.apache.spark.sql.streaming.ValueState;
import scala.jdk.javaapi.CollectionConverters;

public final class RtmCount {
  public static final class Counter extends StatefulProcessor<String, Row, String> {
    private transient ValueState<Long> count;

    @Override
    public void init(OutputMode outputMode, TimeMode timeMode) {
      count = getHandle().getValueState("count", Encoders.LONG(), TTLConfig.NONE());
    }

    @Override
    public scala.collection.Iterator<String> handleInputRows(
        String key, scala.collection.Iterator<Row> rows, TimerValues timers) {
      long n = count.exists() ? count.get() : 0L;
      List<String> out = new ArrayList<>();
      while (rows.hasNext()) {
        Row r = rows.next();
        n += 1;
        out.add("{\"key\":\"" + key + "\",\"n\":" + n + ",\"sent\":" + r.getLong(r.fieldIndex("sent")) + "}");
      }
      count.update(n);
      return CollectionConverters.asScala(out.iterator());
    }
  }

  public static Dataset<String> apply(Dataset<Row> df) {
    return df.groupByKey((MapFunction<Row, String>) r -> r.getString(r.fieldIndex("key")), Encoders.STRING())
        .transformWithState(new Counter(), TimeMode.None(), OutputMode.Update(), Encoders.STRING());
  }
}
