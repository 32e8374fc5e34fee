"""Writing each micro-batch's results exactly once: Redis, then one Kafka transaction.

Spark re-runs a batch after a crash with the same input and the same state, so it
produces the same rows. Redis writes are idempotent (versions, batch ids; see store.py).
Kafka output (changelog, late events, dead letters) goes out in one transaction per batch,
together with a marker in ``NAME.commits``; a batch whose marker is committed is not
published again, and the fixed transactional id fences off the producer of a driver that
died mid-transaction. Readers with ``isolation.level=read_committed`` see every change
once.
"""

from __future__ import annotations

import base64
import json
import os
import time
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, KafkaException, Producer, TopicPartition
from pyspark.sql import DataFrame, Row

from kappaflow.counting.processor import CHANGE_KINDS, CLOSED, DEAD, LATE, STATS
from kappaflow.counting.store import CountStore
from kappaflow.errors import KafkaError
from kappaflow.kafka.clients import consumer
from kappaflow.settings import Settings
from kappaflow.timeutil import from_epoch_ms, iso

#: Test hook: "before-redis:N", "after-redis:N" or "after-kafka:N" SIGKILLs the driver at that
#: point of batch N (computed, half written, written but not committed by Spark),
#: so the suite can show that a crash anywhere changes nothing in the results.
CRASH_ENV = "KAPPAFLOW_TEST_CRASH_AT"


def topics_of(job: str) -> dict[str, str]:
    return {
        "counts": f"{job}.counts",
        "late": f"{job}.late",
        "dlq": f"{job}.dlq",
        "commits": f"{job}.commits",
    }


class BatchWriter:
    """The ``foreachBatch`` function of a counting job."""

    def __init__(self, settings: Settings, job: str, store: CountStore) -> None:
        self.settings = settings
        self.job = job
        self.store = store
        self.topics = topics_of(job)
        self.producer = Producer(
            {
                **settings.kafka.client_config(),
                "log_level": "0",
                "transactional.id": f"kappaflow.count.{job}",
                "linger.ms": 20,
            }
        )
        # Aborts whatever a previous incarnation of this job left open, and fences it.
        self.producer.init_transactions(60)
        self.last_committed = self._last_committed_batch()

    def __call__(self, frame: DataFrame, batch_id: int) -> None:
        began = time.perf_counter()
        rows = frame.collect()
        collected = time.perf_counter()
        changes = sorted(
            (r for r in rows if r.kind in CHANGE_KINDS),
            key=lambda r: (r.key, r.window_start, r.version),
        )
        late = [r for r in rows if r.kind == LATE]
        dead = [r for r in rows if r.kind == DEAD]
        stats = {
            "counted": sum(r.counted for r in rows if r.kind == STATS),
            "duplicates": sum(r.duplicates for r in rows if r.kind == STATS),
            "late": len(late),
            "dlq": len(dead),
            "watermark": max((r.watermark for r in rows), default=0),
        }
        _maybe_crash("before-redis", batch_id)
        self.store.apply(
            batch_id,
            [
                (
                    r.key,
                    r.window_start,
                    r.window_end,
                    r["count"],
                    r.version,
                    r.kind != "provisional",
                )
                for r in changes
            ],
            [(r.key, r.window_start) for r in rows if r.kind == CLOSED],
            stats,
        )
        _maybe_crash("after-redis", batch_id)
        stored = time.perf_counter()
        if batch_id > self.last_committed and (changes or late or dead):
            self._publish(batch_id, changes, late, dead, stats)
            self.last_committed = batch_id
        _maybe_crash("after-kafka", batch_id)
        # Where a batch's time goes, for tuning (the job's driver.log).
        print(
            f"batch {batch_id}: {len(rows)} rows; compute+collect "
            f"{collected - began:.2f}s, redis {stored - collected:.2f}s, "
            f"kafka {time.perf_counter() - stored:.2f}s",
            flush=True,
        )

    def _publish(
        self,
        batch_id: int,
        changes: list[Row],
        late: list[Row],
        dead: list[Row],
        stats: dict[str, int],
    ) -> None:
        self.producer.begin_transaction()
        try:
            for r in changes:
                self._send(
                    self.topics["counts"], json.dumps([r.key, r.window_start]), _change(r, batch_id)
                )
            originals = self._originals(late)
            for r in late:
                self._send(
                    self.topics["late"],
                    r.key,
                    _late(r, originals.get((r.src_topic, r.src_partition, r.src_offset))),
                )
            for r in dead:
                self._send(self.topics["dlq"], None, _dead(r))
            self._send(self.topics["commits"], "batch", {"batch_id": batch_id, **stats})
            self.producer.commit_transaction(120)
        except KafkaException as exc:
            self.producer.abort_transaction(60)
            raise KafkaError(f"publishing batch {batch_id} failed: {exc}") from None

    def _send(self, topic: str, key: str | None, value: dict[str, Any]) -> None:
        while True:
            try:
                self.producer.produce(
                    topic,
                    key=key.encode() if key is not None else None,
                    value=json.dumps(value).encode(),
                )
                return
            except BufferError:
                self.producer.poll(0.2)

    def _originals(self, rows: list[Row]) -> dict[tuple[str, int, int], bytes]:
        """The original bytes of (rare) late events, read back from the source topic."""
        wanted = {(r.src_topic, r.src_partition, r.src_offset) for r in rows}
        found: dict[tuple[str, int, int], bytes] = {}
        if not wanted:
            return found
        reader = consumer(self.settings.kafka, **{"enable.partition.eof": False})
        try:
            for topic, partition, offset in sorted(wanted):
                reader.assign([TopicPartition(topic, partition, offset)])
                message = reader.poll(self.settings.kafka.timeout_s)
                if message is not None and message.error() is None:
                    found[(topic, partition, offset)] = message.value() or b""
        finally:
            reader.close()
        return found

    def _last_committed_batch(self) -> int:
        """The highest batch id whose transaction committed (-1 if none)."""
        reader = consumer(self.settings.kafka)
        try:
            tp = TopicPartition(self.topics["commits"], 0, OFFSET_BEGINNING)
            _, high = reader.get_watermark_offsets(tp, timeout=self.settings.kafka.timeout_s)
            if high == 0:
                return -1
            reader.assign([tp])
            last = -1
            while True:
                message = reader.poll(5.0)
                if message is None:
                    return last
                error = message.error()
                if error is not None:
                    if error.code() == error._PARTITION_EOF:
                        return last
                    raise KafkaError(f"reading {self.topics['commits']} failed: {error.str()}")
                last = max(last, int(json.loads(message.value() or b"{}")["batch_id"]))
        finally:
            reader.close()


def _change(r: Row, batch_id: int) -> dict[str, Any]:
    return {
        "key": r.key,
        "window_start": iso(from_epoch_ms(r.window_start)),
        "window_end": iso(from_epoch_ms(r.window_end)),
        "count": r["count"],  # Row.count is tuple.count: index by name
        "previous": r.previous,
        "kind": r.kind,
        "version": r.version,
        "watermark": iso(from_epoch_ms(r.watermark)) if r.watermark > 0 else None,
        "batch": batch_id,
    }


def _late(r: Row, original: bytes | None) -> dict[str, Any]:
    return {
        "reason": r.reason,
        "watermark": iso(from_epoch_ms(r.watermark)),
        "key": r.key,
        "window_start": iso(from_epoch_ms(r.window_start)),
        "window_end": iso(from_epoch_ms(r.window_end)),
        "event": original.decode("utf-8", errors="replace") if original is not None else None,
        "source_topic": r.src_topic,
        "source_partition": r.src_partition,
        "source_offset": r.src_offset,
    }


def _dead(r: Row) -> dict[str, Any]:
    return {
        "error": r.reason,
        "source_topic": r.src_topic,
        "source_partition": r.src_partition,
        "source_offset": r.src_offset,
        "value_base64": base64.b64encode(bytes(r.value)).decode() if r.value else None,
    }


def _maybe_crash(point: str, batch_id: int) -> None:
    wanted = os.environ.get(CRASH_ENV, "")
    if wanted == f"{point}:{batch_id}":
        os.kill(os.getpid(), 9)
