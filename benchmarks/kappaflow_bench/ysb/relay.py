"""Window counts from a Kafka topic into YSB's Redis layout, as they arrive.

Real-time mode keeps its output in the JVM for speed: its sinks are Kafka or a foreach
writer, and a Python foreach writer receives rows through Spark's auto-batching pickler
(``SerDeUtil.AutoBatchedPickler``), whose batches grow to hundreds of kilobytes and held
rows back for seconds in our runs. So the real-time job writes each updated window to a
topic, and this relay, a thread of the job's driver, moves every record it polls to
Redis in one pipelined round trip. It reads the topic from its start: counts are
absolute, so going over old records again after a restart only rewrites what is there.
"""

from __future__ import annotations

import json
import threading
import time

from confluent_kafka import OFFSET_BEGINNING, TopicPartition

from kappaflow.kafka.clients import consumer
from kappaflow.kafka.topics import topic_partitions
from kappaflow.settings import KafkaSettings
from kappaflow_bench.ysb.store import WindowWriter, connect

#: How long the broker may hold a fetch for more data: the relay's added latency.
FETCH_WAIT_MS = 5


class WindowRelay:
    def __init__(self, kafka: KafkaSettings, topic: str, redis_url: str) -> None:
        self.kafka = kafka
        self.topic = topic
        self.redis_url = redis_url
        self.written = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"relay {topic}", daemon=True)

    def start(self) -> WindowRelay:
        self._thread.start()
        return self

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        self._thread.join(timeout)

    def _run(self) -> None:
        try:
            self._relay()
        except Exception as exc:
            # A thread's death is silent: say it in the driver's log, where the job's
            # other failures go, and leave the windows where they were.
            print(f"relay {self.topic} -> Redis stopped: {type(exc).__name__}: {exc}", flush=True)
            raise

    def _relay(self) -> None:
        reader = consumer(
            self.kafka,
            **{
                "fetch.wait.max.ms": FETCH_WAIT_MS,
                "fetch.min.bytes": 1,
                "enable.partition.eof": False,
            },
        )
        writer = WindowWriter(connect(self.redis_url))
        try:
            parts = topic_partitions(self.kafka, self.topic)
            reader.assign([TopicPartition(self.topic, p, OFFSET_BEGINNING) for p in parts])
            while not self._stop.is_set():
                latest: dict[tuple[str, int], int] = {}
                for message in reader.consume(10_000, timeout=0.1):
                    # A tombstone (no value) says nothing about a count.
                    if message.error() is not None or message.value() is None:
                        continue
                    record = json.loads(message.value() or b"{}")
                    window = (str(record["campaign_id"]), int(record["window_start"]))
                    latest[window] = int(record["seen_count"])
                if latest:
                    now_ms = time.time_ns() // 1_000_000
                    self.written += writer.write(
                        ((c, w, n) for (c, w), n in latest.items()), now_ms
                    )
        finally:
            reader.close()
