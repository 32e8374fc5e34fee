"""Kafka output per batch: the tasks' writer before (a producer and two marker consumers per
task and batch) and after (producers kept between batches), alternating, one session."""
import json, sys, time, uuid, os
from pyspark.sql import functions as F
from kappaflow.settings import Settings
from kappaflow.spark.session import build_session
from kappaflow.kafka.topics import create_topic
from kappaflow.streams.jvm import jvm_engine
from kappaflow.streams.output.backends import KafkaPublisher, commits_topic

BATCHES = int(sys.argv[1]) if len(sys.argv) > 1 else 15
ROWS = int(sys.argv[2]) if len(sys.argv) > 2 else 20000
settings = Settings(state_dir="/tmp/kf-perf/state")
settings = settings.model_copy(update={"spark": settings.spark.model_copy(update={"conf": {"spark.jars": "/tmp/kf-perf/old/before.jar"}, "master": "local[2]"})})
spark = build_session(settings, "outbench")
engine = jvm_engine(spark)
config = json.dumps(KafkaPublisher.java_config(settings))
results = {}
for name, cls in (("before", engine.KafkaOutputBefore), ("after", engine.KafkaOutput)):
    job = f"ob{uuid.uuid4().hex[:6]}"
    out = f"{job}.out"
    create_topic(settings.kafka, out, partitions=2)
    create_topic(settings.kafka, commits_topic(job), partitions=1, configs={"cleanup.policy": "compact"})
    cls.fence(job, "o", 10, config)
    results[name] = (cls, job, out, [])
for b in range(BATCHES):
    for name, (cls, job, out, laps) in results.items():
        frame = spark.range(0, ROWS, numPartitions=2).select(
            F.lit(out).alias("topic"), F.col("id").cast("string").cast("binary").alias("key"),
            F.format_string(f"b{b}-%d-" + "x" * 200, "id").cast("binary").alias("value"))
        t = time.perf_counter()
        done = json.loads(cls.write(frame._jdf, job, "o", b, b - 1, commits_topic(job), "{}", config))
        laps.append(time.perf_counter() - t)
        assert done["written"] == ROWS, done
for name, (_, _, _, laps) in results.items():
    steady = sorted(laps[1:])
    print(name, "first %.3f s" % laps[0], "median %.3f s" % steady[len(steady)//2], "mean %.3f s" % (sum(steady)/len(steady)), "laps", " ".join("%.2f" % x for x in laps), flush=True)
print("uptime", os.popen("uptime").read().strip())
