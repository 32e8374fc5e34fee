"""Does Spark real-time mode run a transformWithState query whose processor runs on the JVM?

The same query as realtime_tws.py (Kafka in, a per-key count, Kafka out, the session
kappaflow builds), with the StatefulProcessor written in Java (RtmCount.java) instead of
Python, applied through py4j. Compile it against PySpark's jars, then run with the
embedded broker up on port 19192:

    javac -d out -cp "$PYSPARK/jars/*" RtmCount.java && (cd out && jar cf ../rtmcount.jar kfexp)
    python realtime_jvm.py STATE_DIR SECONDS rtm   # trigger(realTime="5 seconds")

Prints what it sent and received, the latency from send to receipt (ms) over the run,
then per 5 s of sending.
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
    spark={"master": "local[4]", "shuffle_partitions": 2, "conf": {**REAL_TIME_CONF, "spark.driver.extraClassPath": str(__import__("pathlib").Path(__file__).with_name("rtmcount.jar"))}})
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
ev = df.select(F.col("key").cast("string").alias("key"), F.get_json_object(F.col("value").cast("string"), "$.sent").cast("long").alias("sent"))
from pyspark.sql import DataFrame
jdf = spark._jvm.kfexp.RtmCount.apply(ev._jdf)
out = DataFrame(jdf, spark)
q = (out.select(F.col("value"))
     .writeStream.format("kafka").option("kafka.bootstrap.servers", boot).option("topic", dst)
     .option("checkpointLocation", f"/tmp/rtm-ckpt-{run}").outputMode("update")
     .trigger(**({"realTime": "5 seconds"} if sys.argv[3] == "rtm" else {"processingTime": "0 seconds"})).start())
print("started", flush=True)
p = Producer({"bootstrap.servers": boot})
c = Consumer({"bootstrap.servers": boot, "group.id": run, "auto.offset.reset": "earliest"})
c.subscribe([dst])
lat = []
byt = {}
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
            lat.append(int(time.time() * 1000) - v["sent"]); byt.setdefault((v["sent"]//5000), []).append(lat[-1])
        m = c.poll(0)
p.flush()
print("sent", i, "received", len(lat))
if lat:
    lat.sort(); print("p50", lat[len(lat)//2], "p99", lat[int(len(lat)*0.99)], "last", lat[-20:])
print(q.status)
t0=min(byt)
for b in sorted(byt):
    l=sorted(byt[b]); print("t+%3ds n=%4d p50=%5d p99=%5d max=%5d" % ((b-t0)*5, len(l), l[len(l)//2], l[int(len(l)*0.99)], l[-1]))
q.stop(); spark.stop()
