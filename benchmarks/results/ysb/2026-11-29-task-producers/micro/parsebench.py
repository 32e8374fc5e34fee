"""Parse cost of parse_records on YSB-like records, in one Spark session (local[1])."""
import sys, time, json, uuid, random, os
from pyspark.sql import functions as F
from kappaflow.settings import Settings
from kappaflow.spark.session import build_session
from kappaflow.streams.schema import compile_schema
from kappaflow.streams.ops.parsing import parse_records
import parsing_before
from kappaflow_bench.ysb.job import AdEvent

N = int(sys.argv[1]) if len(sys.argv) > 1 else 300_000
ROUNDS = int(sys.argv[2]) if len(sys.argv) > 2 else 5
settings = Settings(state_dir="/tmp/kf-perf/state")
spark = build_session(settings, "parsebench")
rnd = random.Random(1)
ids = [str(uuid.UUID(int=rnd.getrandbits(128))) for _ in range(1000)]
rows = []
for i in range(20000):
    ev = {"user_id": ids[i % 1000], "page_id": ids[(i * 7) % 1000], "ad_id": ids[(i * 13) % 1000],
          "ad_type": "banner", "event_type": ["view", "click", "purchase"][i % 3],
          "event_time": str(1700000000000 + i), "ip_address": "1.2.3.4"}
    rows.append((json.dumps(ev).encode(), "t", 0, i))
base = spark.createDataFrame(rows, "value binary, topic string, partition int, offset long").select(
    "*", F.current_timestamp().alias("timestamp"))
base = base.crossJoin(spark.range(N // 20000).hint("broadcast")).drop("id").repartition(1).cache()
base.count()
schema = compile_schema(AdEvent)

def bare(df):
    return df.select(F.from_json(F.col("value").cast("string"), schema.struct).alias("j")).select("j.*")

def after(df):
    return parse_records(df, schema, time="event_time")

def before(df):
    return parsing_before.parse_records(df, schema, time="event_time")

variants = {"bare": bare, "before": before, "after": after}
laps = {k: [] for k in variants}
for rnd_ in range(ROUNDS):
    for name, fn in variants.items():
        t = time.perf_counter()
        fn(base).write.format("noop").mode("overwrite").save()
        laps[name].append(time.perf_counter() - t)
        print(name, round(laps[name][-1], 2), flush=True)
for name, xs in laps.items():
    xs = sorted(xs[1:])
    print("%-7s median %.2f s  min %.2f s  (%d rows)" % (name, xs[len(xs) // 2], xs[0], N))
print("uptime", os.popen("uptime").read().strip())
