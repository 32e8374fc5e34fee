"""A Spark driver's start with and without setup's class-data archive, side by side.

Each run is a fresh driver (PySpark starts a JVM) with the session kappaflow builds
(local[2], C1 only as the tests run it, the jars of JARS_DIR): build the session, then
run a stateful query (rate source, windowed count) to its third batch. Runs alternate
between no archive and setup's archive, ROUNDS times; one JSON line per run. Usage:

    python driver_start.py JARS_DIR ROUNDS > runs.jsonl
"""

import json
import subprocess
import sys
import tempfile
import time

DRIVER = """
import sys, time
from pyspark.sql import functions as F
import kappaflow.spark.session as session
from kappaflow.settings import load_settings
if sys.argv[1] == "none":
    session.archive_options = lambda settings: None
settings = load_settings(state_dir=sys.argv[2] + "/state", jars_dir=sys.argv[3], spark={
    "master": "local[2]", "shuffle_partitions": 2,
    "conf": {"spark.driver.extraJavaOptions": "-XX:TieredStopAtLevel=1"}})
t0 = time.monotonic()
spark = session.build_session(settings, "driver-start")
t1 = time.monotonic()
rows = spark.readStream.format("rate").option("rowsPerSecond", 100).load()
query = (rows.groupBy(F.window("timestamp", "1 second")).count().writeStream
         .outputMode("update").format("noop").option("checkpointLocation", sys.argv[2] + "/ck")
         .trigger(processingTime="0 seconds").start())
while query.lastProgress is None or query.lastProgress["batchId"] < 2:
    time.sleep(0.1)
t2 = time.monotonic()
query.stop(); spark.stop()
print(f"{t1 - t0:.2f} {t2 - t1:.2f}")
"""


def run(label: str, jars: str) -> tuple[float, float]:
    with tempfile.TemporaryDirectory() as scratch:
        out = subprocess.run(
            [sys.executable, "-c", DRIVER, label, scratch, jars],
            capture_output=True, text=True, check=True,
        ).stdout.split()
    return float(out[-2]), float(out[-1])


def main() -> None:
    jars, rounds = sys.argv[1], int(sys.argv[2])
    for n in range(rounds):
        for label in ("none", "archive"):
            began = time.monotonic()
            session, batches = run(label, jars)
            print(json.dumps({"round": n, "archive": label, "session_s": session,
                              "three_batches_s": batches,
                              "process_s": round(time.monotonic() - began, 2)}), flush=True)


if __name__ == "__main__":
    main()
