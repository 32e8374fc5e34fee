"""YSB on Apache Flink, driven from PyFlink, as a peer.

Run by ``kappaflow-bench ysb --engine flink`` in a virtual environment of its own
(``<state_dir>/engines/flink/venv``): PyFlink pins older numpy, pandas and protobuf
than kappaflow. Reads its run's description as JSON on stdin.

The job is Flink SQL, so every event stays in the JVM (a Python function per event
would put PyFlink's Python workers on the hot path):

- the Kafka source parses the JSON (every field a string, as sent) and takes event time
  from ``event_time``, with a watermark 60 s behind it (the bound Spark's job and the
  Quix app use);
- keep views, project, and join ``ad_id`` to its campaign through a map literal of the
  ad table read from Redis at start (the engine's copy of the table, as Spark's
  broadcast join and the original's in-memory cache);
- count per campaign in 10-second tumbling event-time windows (a group window), with
  early firing every EARLY_FIRE: a window's count goes out as it grows, as the
  original's 1-second flusher wrote it, and a firing that changed nothing emits
  nothing;
- every updated count goes to a Kafka topic (``upsert-kafka``: keyed by campaign and
  window, a tombstone before each new count): the run's output topic with the Kafka sink, or a relay
  topic that a thread of this process moves to Redis in the original layout
  (``kappaflow_bench.ysb.relay``, as Spark's real-time job does).

Flink runs as a local mini-cluster in the JVM PyFlink starts, without checkpoints, as
the original Flink job ran.
"""

from __future__ import annotations

import json
import signal
import sys
import threading
from types import FrameType
from typing import Any

from kappaflow.settings import KafkaSettings
from kappaflow_bench.ysb.relay import WindowRelay
from kappaflow_bench.ysb.store import ad_campaigns, connect
from kappaflow_bench.ysb.workload import WINDOW_MS

#: How often a window's growing count is emitted (Flink's early firing).
EARLY_FIRE = "100 ms"
#: How far the watermark trails the largest event time: later events still count.
WATERMARK_DELAY_S = 60


def sql_literal(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def with_options(options: dict[str, str]) -> str:
    return ",\n  ".join(f"{sql_literal(k)} = {sql_literal(v)}" for k, v in options.items())


def kafka_options(spec: dict[str, Any], topic: str) -> dict[str, str]:
    """The connector's Kafka options: the topic and the Java client's properties (given
    as Spark's, ``kafka.``-prefixed)."""
    options = {"topic": topic}
    for key, value in spec["kafka_options"].items():
        options[f"properties.{key.removeprefix('kafka.')}"] = str(value)
    return options


def source_ddl(spec: dict[str, Any]) -> str:
    options = {
        "connector": "kafka",
        **kafka_options(spec, spec["source"]),
        "properties.group.id": spec["group"],
        "scan.startup.mode": "earliest-offset",
        "scan.parallelism": str(spec["source_parallelism"]),
        "format": "json",
        "json.ignore-parse-errors": "true",
    }
    return f"""
CREATE TEMPORARY TABLE ad_events (
  user_id STRING, page_id STRING, ad_id STRING, ad_type STRING,
  event_type STRING, event_time STRING, ip_address STRING,
  ts AS TO_TIMESTAMP_LTZ(CAST(event_time AS BIGINT), 3),
  WATERMARK FOR ts AS ts - INTERVAL '{WATERMARK_DELAY_S}' SECOND
) WITH (
  {with_options(options)}
)"""


def sink_ddl(spec: dict[str, Any], topic: str) -> str:
    """The output table, keyed by the window as the aggregate emits it (``window``, a
    timestamp), so that the planner sees the aggregate's key is the table's and adds no
    materializer (keyed by the epoch-ms start, a computed column, it would).

    The group window still retracts each count before it sends the next, and
    upsert-kafka writes a retraction as a tombstone (the key, no value): every update is
    a tombstone and the new count, and readers skip the tombstones."""
    options = {
        "connector": "upsert-kafka",
        **kafka_options(spec, topic),
        "key.format": "json",
        "value.format": "json",
    }
    return f"""
CREATE TEMPORARY TABLE windows (
  campaign_id STRING, window_start BIGINT, window_end BIGINT, seen_count BIGINT,
  `window` TIMESTAMP_LTZ(3),
  PRIMARY KEY (campaign_id, `window`) NOT ENFORCED
) WITH (
  {with_options(options)}
)"""


def query(table: dict[str, str]) -> str:
    """The job: views, joined to campaigns, counted per 10-second window."""
    pairs = ", ".join(f"{sql_literal(ad)}, {sql_literal(c)}" for ad, c in sorted(table.items()))
    window = f"TUMBLE(ts, INTERVAL '{WINDOW_MS // 1000}' SECOND)"
    start = f"TUMBLE_START(ts, INTERVAL '{WINDOW_MS // 1000}' SECOND)"
    # The window's start as epoch ms: the session's time zone is UTC, both ways.
    start_ms = f"1000 * UNIX_TIMESTAMP(CAST({start} AS STRING))"
    return f"""
INSERT INTO windows
SELECT campaign_id, window_start, window_start + {WINDOW_MS}, seen_count, `window`
FROM (
  SELECT campaign_id, {start_ms} AS window_start, COUNT(*) AS seen_count, {start} AS `window`
  FROM (
    SELECT MAP[{pairs}][ad_id] AS campaign_id, ts
    FROM ad_events
    WHERE event_type = 'view'
  )
  GROUP BY campaign_id, {window}
)"""


def main() -> int:
    from pyflink.common import Configuration
    from pyflink.table import EnvironmentSettings, TableEnvironment

    spec: dict[str, Any] = json.loads(sys.stdin.read())
    table = ad_campaigns(connect(spec["redis_url"]))
    if not table:
        print("Redis holds no YSB ads", flush=True)
        return 1
    dest = spec["dest"] if spec["sink"] == "kafka" else spec["relay_topic"]
    config = Configuration()
    for key, value in {
        "pipeline.name": spec["group"],
        "pipeline.jars": ";".join(spec["jars"]),
        "parallelism.default": str(spec["parallelism"]),
        "io.tmp.dirs": spec["tmp_dir"],
        "table.local-time-zone": "UTC",
        "table.exec.emit.early-fire.enabled": "true",
        "table.exec.emit.early-fire.delay": EARLY_FIRE,
        # A source subtask without a partition must not hold the watermark back.
        "table.exec.source.idle-timeout": "5 s",
        # An ad missing from the table has no campaign: its views are counted under a
        # null campaign and that count is dropped at the sink (the key is NOT NULL).
        # Filtering the null campaigns out before the window instead would look every
        # ad up twice, and a lookup in Flink's map, a scan of its keys, is most of the
        # job's work.
        "table.exec.sink.not-null-enforcer": "DROP",
    }.items():
        config.set_string(key, value)
    env = TableEnvironment.create(
        EnvironmentSettings.new_instance().in_streaming_mode().with_configuration(config).build()
    )
    env.execute_sql(source_ddl(spec))
    env.execute_sql(sink_ddl(spec, dest))
    job = env.execute_sql(query(table)).get_job_client()
    if job is None:
        print("Flink did not return a job", flush=True)
        return 1
    relay: WindowRelay | None = None
    if spec["sink"] == "redis":
        client = dict(spec["client_config"])
        bootstrap = client.pop("bootstrap.servers")
        kafka = KafkaSettings(bootstrap_servers=bootstrap, client_options=client)
        relay = WindowRelay(kafka, spec["relay_topic"], spec["redis_url"]).start()

    stopping = threading.Event()

    def stop(_signum: int, _frame: FrameType | None) -> None:
        stopping.set()

    signal.signal(signal.SIGTERM, stop)
    print(f"flink job {job.get_job_id()} submitted", flush=True)
    print("flink app running", flush=True)
    while not stopping.wait(1.0):
        status = str(job.get_job_status().result())
        if status in ("FAILED", "CANCELED", "FINISHED"):
            print(f"the Flink job ended: {status}", flush=True)
            return 1
    job.cancel().result()
    if relay is not None:
        relay.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
