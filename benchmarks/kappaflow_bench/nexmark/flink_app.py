"""Nexmark's queries on Apache Flink SQL, driven from PyFlink, as the peer.

Run by ``kappaflow-bench nexmark`` in the Flink virtual environment the YSB benchmark
makes (``<state_dir>/engines/flink/venv``), its run's description as JSON on stdin. The
queries are nexmark/nexmark's Flink SQL (10-second windows), over the generator's three
topics read from their start to the end they have when the query starts (bounded: the
job ends when it has read them, and the end of input closes every window). Each query
writes its rows as JSON to its own topic, and runs alone; the app prints one JSON line
per query: its name and the job's net runtime.
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any

from kappaflow_bench.ysb.flink_app import kafka_options, with_options

#: The suite's watermark: 4 s behind the largest event time.
WATERMARK_DELAY_S = 4

COLUMNS = {
    "person": "id BIGINT, name STRING, emailAddress STRING, creditCard STRING, city STRING, "
    "state STRING, `dateTime` BIGINT, extra STRING",
    "auction": "id BIGINT, itemName STRING, description STRING, initialBid BIGINT, "
    "reserve BIGINT, `dateTime` BIGINT, expires BIGINT, seller BIGINT, category BIGINT, "
    "extra STRING",
    "bid": "auction BIGINT, bidder BIGINT, price BIGINT, channel STRING, url STRING, "
    "`dateTime` BIGINT, extra STRING",
}

#: Each query's output columns and its SELECT (nexmark/nexmark's, but that times are
#: epoch ms, as the input's, and q5 names its window).
SINKS = {
    "q0": "auction BIGINT, bidder BIGINT, price BIGINT, `dateTime` BIGINT, extra STRING",
    "q1": "auction BIGINT, bidder BIGINT, price DECIMAL(23, 3), `dateTime` BIGINT, extra STRING",
    "q2": "auction BIGINT, price BIGINT",
    "q3": "name STRING, city STRING, state STRING, id BIGINT",
    "q5": "auction BIGINT, num BIGINT, starttime BIGINT",
    "q7": "auction BIGINT, bidder BIGINT, price BIGINT, `dateTime` BIGINT, extra STRING",
    "q8": "id BIGINT, name STRING, starttime BIGINT",
}


def _ms(column: str) -> str:
    """A TIMESTAMP(3) column as epoch ms (the session's time zone is UTC)."""
    return f"(1000 * UNIX_TIMESTAMP(CAST({column} AS STRING)))"


def _tumble(table: str) -> str:
    return f"TABLE(TUMBLE(TABLE {table}, DESCRIPTOR(ts), INTERVAL '10' SECOND))"


def _hop(table: str) -> str:
    return f"TABLE(HOP(TABLE {table}, DESCRIPTOR(ts), INTERVAL '2' SECOND, INTERVAL '10' SECOND))"


QUERIES = {
    "q0": "SELECT auction, bidder, price, `dateTime`, extra FROM bid",
    "q1": "SELECT auction, bidder, 0.908 * price, `dateTime`, extra FROM bid",
    "q2": "SELECT auction, price FROM bid WHERE MOD(auction, 123) = 0",
    "q3": """SELECT P.name, P.city, P.state, A.id
FROM auction AS A INNER JOIN person AS P ON A.seller = P.id
WHERE A.category = 10 AND (P.state = 'OR' OR P.state = 'ID' OR P.state = 'CA')""",
    "q5": f"""SELECT AuctionBids.auction, AuctionBids.num, {_ms("AuctionBids.starttime")}
FROM (
  SELECT auction, count(*) AS num, window_start AS starttime, window_end AS endtime
  FROM {_hop("bid")}
  GROUP BY auction, window_start, window_end
) AS AuctionBids
JOIN (
  SELECT max(CountBids.num) AS maxn, CountBids.starttime, CountBids.endtime
  FROM (
    SELECT count(*) AS num, window_start AS starttime, window_end AS endtime
    FROM {_hop("bid")}
    GROUP BY auction, window_start, window_end
  ) AS CountBids
  GROUP BY CountBids.starttime, CountBids.endtime
) AS MaxBids
ON AuctionBids.starttime = MaxBids.starttime AND AuctionBids.endtime = MaxBids.endtime
   AND AuctionBids.num >= MaxBids.maxn""",
    # The window's end in epoch ms, as the bids' dateTime: Flink compares no TIMESTAMP
    # (a window's end) with a TIMESTAMP_LTZ (the bids' event time).
    "q7": f"""SELECT B.auction, B.bidder, B.price, B.`dateTime`, B.extra
FROM bid B
JOIN (
  SELECT MAX(price) AS maxprice, {_ms("window_end")} AS wend
  FROM {_tumble("bid")}
  GROUP BY window_start, window_end
) B1
ON B.price = B1.maxprice
WHERE B.`dateTime` BETWEEN B1.wend - 10000 AND B1.wend""",
    "q8": f"""SELECT P.id, P.name, {_ms("P.starttime")}
FROM (
  SELECT id, name, window_start AS starttime, window_end AS endtime
  FROM {_tumble("person")}
  GROUP BY id, name, window_start, window_end
) P
JOIN (
  SELECT seller, window_start AS starttime, window_end AS endtime
  FROM {_tumble("auction")}
  GROUP BY seller, window_start, window_end
) A
ON P.id = A.seller AND P.starttime = A.starttime AND P.endtime = A.endtime""",
}


def source_ddl(spec: dict[str, Any], kind: str, group: str) -> str:
    options = {
        "connector": "kafka",
        **kafka_options(spec, spec["topics"][kind]),
        "properties.group.id": group,
        "scan.startup.mode": "earliest-offset",
        "scan.bounded.mode": "latest-offset",
        "format": "json",
    }
    return f"""
CREATE TEMPORARY TABLE {kind} (
  {COLUMNS[kind]},
  ts AS TO_TIMESTAMP_LTZ(`dateTime`, 3),
  WATERMARK FOR ts AS ts - INTERVAL '{WATERMARK_DELAY_S}' SECOND
) WITH (
  {with_options(options)}
)"""


def sink_ddl(spec: dict[str, Any], query: str) -> str:
    options = {"connector": "kafka", **kafka_options(spec, spec["dests"][query]), "format": "json"}
    return f"""
CREATE TEMPORARY TABLE {query}_out (
  {SINKS[query]}
) WITH (
  {with_options(options)}
)"""


def main() -> int:
    from pyflink.common import Configuration
    from pyflink.table import EnvironmentSettings, TableEnvironment

    spec: dict[str, Any] = json.loads(sys.stdin.read())
    print("flink app running", flush=True)
    for query in spec["queries"]:
        config = Configuration()
        for key, value in {
            "pipeline.name": f"{spec['group']}-{query}",
            "pipeline.jars": ";".join(spec["jars"]),
            "parallelism.default": str(spec["parallelism"]),
            "io.tmp.dirs": spec["tmp_dir"],
            "table.local-time-zone": "UTC",
            # A source subtask without a partition must not hold the watermark back.
            "table.exec.source.idle-timeout": "5 s",
        }.items():
            config.set_string(key, value)
        env = TableEnvironment.create(
            EnvironmentSettings.new_instance()
            .in_streaming_mode()
            .with_configuration(config)
            .build()
        )
        for kind in ("person", "auction", "bid"):
            env.execute_sql(source_ddl(spec, kind, f"{spec['group']}-{query}"))
        env.execute_sql(sink_ddl(spec, query))
        began = time.monotonic()
        result = env.execute_sql(f"INSERT INTO {query}_out {QUERIES[query]}")
        client = result.get_job_client()
        if client is None:
            print(json.dumps({"query": query, "error": "no job"}), flush=True)
            return 1
        done = client.get_job_execution_result().result()
        print(
            json.dumps(
                {
                    "query": query,
                    "net_runtime_ms": done.get_net_runtime(),
                    "wall_s": round(time.monotonic() - began, 3),
                }
            ),
            flush=True,
        )
    print("flink app done", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
