"""Parse alone: parse_records over cached Kafka-like rows, the SQL path against the engine's
parser (JsonRows.java), alternating, in one Spark session (local[1]), written to noop.

Records: the count benchmark's event (text key, epoch-ms event time, an id, 200 bytes of
padding), YSB's AdEvent (seven strings, epoch ms as digits) and Nexmark's Bid (from its
generator). Usage: parsebench.py [ROWS] [ROUNDS] (state dir from KAPPAFLOW_STATE_DIR).
"""

import json
import os
import random
import sys
import time

from kappaflow_bench.count import event
from kappaflow_bench.nexmark.generator import Generator
from kappaflow_bench.nexmark.queries import Bid
from kappaflow_bench.ysb.job import AdEvent
from pyspark.sql import functions as F

from kappaflow.counting.job import event_type
from kappaflow.counting.spec import CountSpec
from kappaflow.settings import Settings
from kappaflow.spark.session import build_session
from kappaflow.streams.ops import parsing
from kappaflow.streams.schema import compile_schema

N = int(sys.argv[1]) if len(sys.argv) > 1 else 400_000
ROUNDS = int(sys.argv[2]) if len(sys.argv) > 2 else 5
spark = build_session(Settings(), "parsebench")
rng = random.Random(1)
ids = [f"{rng.getrandbits(128):032x}" for _ in range(1000)]


def ysb(i: int) -> bytes:
    return json.dumps(
        {"user_id": ids[i % 1000], "page_id": ids[(i * 7) % 1000], "ad_id": ids[(i * 13) % 1000],
         "ad_type": "banner", "event_type": ["view", "click", "purchase"][i % 3],
         "event_time": str(1700000000000 + i), "ip_address": "1.2.3.4"}
    ).encode()


gen = Generator(seed=1, base_time_ms=1700000000000)
count_spec = CountSpec(
    source="t", key_field="key", time_field="ts", id_field="id", window_ms=60_000
)
workloads = {
    "count": (
        compile_schema(event_type(count_spec)),
        [event(rng, i, 10_000, 1700000000000 + i) for i in range(20_000)],
        dict(time="ts", keys=["key"], id="id"),
    ),
    "ysb": (compile_schema(AdEvent), [ysb(i) for i in range(20_000)], dict(time="event_time")),
    "nexmark-bid": (
        compile_schema(Bid),
        [json.dumps(gen.bid(i)).encode() for i in range(20_000)],
        dict(time="dateTime"),
    ),
}

for name, (schema, records, args) in workloads.items():
    rows = [(r, "t", 0, i) for i, r in enumerate(records)]
    base = spark.createDataFrame(rows, "value binary, topic string, partition int, offset long")
    base = base.select("*", F.current_timestamp().alias("timestamp"))
    base = base.crossJoin(spark.range(N // len(records)).hint("broadcast")).drop("id")
    base = base.repartition(1).cache()
    base.count()
    laps: dict[str, list[float]] = {"sql": [], "jvm": []}
    for _ in range(ROUNDS):
        for side in laps:
            parsing.JVM_PARSER = side == "jvm"
            out = parsing.parse_records(base, schema, **args)
            bad = out.where(F.col("_kf_reason").isNotNull()).count()
            assert bad == 0, (name, side, bad)
            t = time.perf_counter()
            out.write.format("noop").mode("overwrite").save()
            laps[side].append(time.perf_counter() - t)
            print(name, side, round(laps[side][-1], 2), flush=True)
    for side, xs in laps.items():
        xs = sorted(xs[1:])
        print(f"{name:12s} {side}: median {xs[len(xs) // 2]:.2f} s, min {xs[0]:.2f} s, "
              f"{N / xs[len(xs) // 2]:,.0f} records/s ({N} records)", flush=True)
    base.unpersist()
print("uptime", os.popen("uptime").read().strip())
