"""The engines' results of a Nexmark query, read back and compared.

Each engine writes a query's rows to a topic of its own as JSON objects: Flink's Kafka
sink one object per row, kappaflow's a stream's rows, or a windowed aggregate's
changelog (q8: one record per change of a window, keyed by the key and the window's
start). Rows are brought to one shape per query (times as epoch ms, q1's euros rounded
to the cent's tenth) and compared as multisets: Nexmark's outputs are unordered.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Callable, Hashable
from datetime import datetime
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, TopicPartition

from kappaflow.errors import KafkaClusterError
from kappaflow.kafka.clients import consumer
from kappaflow.kafka.topics import topic_partitions
from kappaflow.settings import KafkaSettings

#: How many differing rows a comparison keeps, per side.
EXAMPLES = 5


def read_rows(kafka: KafkaSettings, topic: str, *, timeout_s: float = 600) -> list[dict[str, Any]]:
    """Every record of ``topic`` up to its end now, committed ones only, as JSON objects.

    Done when the consumer's position reaches each partition's end: a transaction's
    commit marker takes an offset no record has, so the last record's offset does not
    tell (kappaflow publishes each micro-batch in a transaction)."""
    reader = consumer(kafka, **{"fetch.max.bytes": 52_428_800, "enable.partition.eof": False})
    rows: list[dict[str, Any]] = []
    try:
        parts = [TopicPartition(topic, p) for p in topic_partitions(kafka, topic)]
        ends = {}
        for part in parts:
            low, high = reader.get_watermark_offsets(part, timeout=kafka.timeout_s)
            if high > low:
                ends[part.partition] = high
        reader.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in ends])
        deadline = time.monotonic() + timeout_s
        while ends:
            if time.monotonic() > deadline:
                raise KafkaClusterError(f"reading {topic!r} took more than {timeout_s:.0f}s")
            for message in reader.consume(10_000, timeout=1.0):
                if message.error() is None and message.value():
                    rows.append(json.loads(message.value() or b"{}"))
            for at in reader.position([TopicPartition(topic, p) for p in ends]):
                if at.offset >= ends[at.partition]:
                    del ends[at.partition]
    finally:
        reader.close()
    return rows


def epoch_ms(value: Any) -> int:
    """A time as either engine writes it: epoch ms, or ISO-8601 with a zone."""
    if isinstance(value, int | float):
        return int(value)
    return int(datetime.fromisoformat(str(value)).timestamp() * 1000)


def _bid(row: dict[str, Any]) -> tuple[Hashable, ...]:
    return (row["auction"], row["bidder"], row["price"], epoch_ms(row["dateTime"]), row["extra"])


def _euros(row: dict[str, Any]) -> tuple[Hashable, ...]:
    price = round(float(row["price"]), 3)
    return (row["auction"], row["bidder"], price, epoch_ms(row["dateTime"]), row["extra"])


def _q8(row: dict[str, Any]) -> tuple[Hashable, ...]:
    start = row["window_start"] if "window_start" in row else row["starttime"]
    return (row["id"], row["name"], epoch_ms(start))


#: Per query: the row's shape to compare, and whether rows are a set (a windowed
#: changelog repeats a window at each change) rather than a multiset.
SHAPES: dict[str, tuple[Callable[[dict[str, Any]], tuple[Hashable, ...]], bool]] = {
    "q0": (_bid, False),
    "q1": (_euros, False),
    "q2": (lambda r: (r["auction"], r["price"]), False),
    "q3": (lambda r: (r["name"], r["city"], r["state"], r["id"]), False),
    "q8": (_q8, True),
}


def compare(
    query: str, kappaflow: list[dict[str, Any]], flink: list[dict[str, Any]]
) -> dict[str, Any]:
    """Whether the two engines' rows of ``query`` are the same, with counts and examples."""
    shape, as_set = SHAPES[query]
    if as_set:
        # A window that a later change retracts (values null) is not a result.
        kappaflow = [r for r in kappaflow if r.get("values", {}) is not None]
    mine = Counter(shape(r) for r in kappaflow)
    theirs = Counter(shape(r) for r in flink)
    if as_set:
        mine, theirs = Counter(set(mine)), Counter(set(theirs))
    only_kf, only_flink = mine - theirs, theirs - mine
    return {
        "agree": not only_kf and not only_flink,
        "rows": {"kappaflow": sum(mine.values()), "flink": sum(theirs.values())},
        "only_kappaflow": sum(only_kf.values()),
        "only_flink": sum(only_flink.values()),
        "examples_only_kappaflow": [list(r) for r in list(only_kf)[:EXAMPLES]],
        "examples_only_flink": [list(r) for r in list(only_flink)[:EXAMPLES]],
    }
