"""Does Spark real-time mode run a Python transformWithState query?

A Kafka source, grouped by key, a row-based StatefulProcessor counting per key, a Kafka
sink; the session built as kappaflow builds every session (RocksDB, checkpoint format v2,
REAL_TIME_CONF). Run with the embedded broker up on port 19192:

    python realtime_tws.py STATE_DIR SECONDS rtm   # trigger(realTime="5 seconds")
    python realtime_tws.py STATE_DIR SECONDS mb    # trigger(processingTime="0 seconds")

Prints what it sent and received, with the latency from send to receipt (ms), or FAILED
and the query's error.
"""
import sys, time, json, uuid
from datetime import datetime, timezone
from pyspark.sql import Row
from pyspark.sql import functions as F
from pyspark.sql.streaming.stateful_processor import StatefulProcessor, StatefulProcessorHandle
from pyspark.sql.types import StructType, StructField, StringType, LongType
from confluent_kafka import Producer, Consumer

from kappaflow.settings import load_settings
from kappaflow.spark.session import REAL_TIME_CONF, build_session

OUT = StructType([StructField("key", StringType()), StructField("n", LongType()), StructField("sent", LongType())])

class Counter(StatefulProcessor):
    def init(self, handle: StatefulProcessorHandle) -> None:
        self.count = handle.getValueState("count", StructType([StructField("n", LongType())]))
    def handleInputRows(self, key, rows, timerValues):
        n = self.count.get()[0] if self.count.exists() else 0
        last = 0
        for r in rows:
            n += 1
            last = r.sent
        self.count.update((n,))
        yield Row(key=key[0], n=n, sent=last)
    def close(self) -> None:
        pass

settings = load_settings(state_dir=sys.argv[1], jars_dir="/work/main/.kappaflow/jars",
    kafka={"port": 19192, "controller_port": 19193}, redis={"port": 16479}, mqtt={"port": 11984},
    spark={"master": "local[4]", "shuffle_partitions": 2, "conf": dict(REAL_TIME_CONF)})
spark = build_session(settings, "rtm-tws")
boot = f"127.0.0.1:{settings.kafka.port}"
run = uuid.uuid4().hex[:6]
src, dst = f"rtm.in.{run}", f"rtm.out.{run}"
from confluent_kafka.admin import AdminClient, NewTopic
a = AdminClient({"bootstrap.servers": boot})
for f in a.create_topics([NewTopic(src, 2, 1), NewTopic(dst, 2, 1)]).values():
    f.result()
spark.conf.set("spark.sql.shuffle.partitions", "2")
df = (spark.readStream.format("kafka").option("kafka.bootstrap.servers", boot)
      .option("subscribe", src).option("startingOffsets", "earliest").load())
ev = df.select(F.col("key").cast("string").alias("k"), F.get_json_object(F.col("value").cast("string"), "$.sent").cast("long").alias("sent"))
out = ev.groupBy("k").transformWithState(Counter(), OUT, "Update", "None")
q = (out.select(F.col("key").alias("key"), F.to_json(F.struct("key", "n", "sent")).alias("value"))
     .writeStream.format("kafka").option("kafka.bootstrap.servers", boot).option("topic", dst)
     .option("checkpointLocation", f"/tmp/rtm-ckpt-{run}").outputMode("update")
     .trigger(**({"realTime": "5 seconds"} if sys.argv[3] == "rtm" else {"processingTime": "0 seconds"})).start())
print("started", flush=True)
p = Producer({"bootstrap.servers": boot})
c = Consumer({"bootstrap.servers": boot, "group.id": run, "auto.offset.reset": "earliest"})
c.subscribe([dst])
lat = []
deadline = time.time() + float(sys.argv[2] if len(sys.argv) > 2 else 60)
i = 0
while time.time() < deadline:
    if q.exception() is not None:
        print("FAILED", str(q.exception())[:3000]); break
    now = int(time.time() * 1000)
    p.produce(src, key=f"k{i % 10}", value=json.dumps({"sent": now}))
    p.poll(0); i += 1
    m = c.poll(0.05)
    while m is not None:
        if not m.error():
            v = json.loads(m.value())
            lat.append(int(time.time() * 1000) - v["sent"])
        m = c.poll(0)
p.flush()
print("sent", i, "received", len(lat))
if lat:
    lat.sort(); print("p50", lat[len(lat)//2], "p99", lat[int(len(lat)*0.99)], "last", lat[-20:])
print(q.status, q.lastProgress and json.dumps(q.lastProgress)[:800])
q.stop(); spark.stop()
