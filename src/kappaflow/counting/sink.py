"""Writing each micro-batch's results exactly once: Redis, then one Kafka transaction.

Spark re-runs a batch after a crash with the same input and the same state, so it
produces the same rows. Redis writes are idempotent: a re-run batch writes the same
window values again, and the bookkeeping moves only for a batch id above the last one
applied (store.py).
Kafka output (changelog, late events, dead letters) goes out in one transaction per batch,
together with a marker in ``NAME.commits``; a batch whose marker is committed is not
published again, and the fixed transactional id fences off the producer of a driver that
died mid-transaction. Readers with ``isolation.level=read_committed`` see every change
once.
"""

from __future__ import annotations

import base64
import json
import time
from collections.abc import Callable
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from confluent_kafka import KafkaException
from pyspark.sql import DataFrame, Row
from pyspark.sql import functions as F

from kappaflow.counting.arrow_ipc import unpack
from kappaflow.counting.json_columns import (
    Column,
    iso_literals,
    join,
    json_object,
    number_text,
    string_literals,
)
from kappaflow.counting.lifecycle import topics_of
from kappaflow.counting.rows import CHANGE_KINDS, CLOSED, CORRECTION, DEAD, FINAL, LATE, STATS
from kappaflow.counting.spec import CountSpec
from kappaflow.counting.store import CountStore
from kappaflow.errors import PartialBatchError, ProduceError
from kappaflow.kafka.clients import transactional_producer
from kappaflow.kafka.records import StartAt, produce_with_retry, read_records
from kappaflow.settings import Settings
from kappaflow.spark.kafka_io import read_range
from kappaflow.timeutil import from_epoch_ms, iso

#: The points of a batch at which ``BatchWriter`` calls its ``on_step`` function: computed,
#: written to Redis, published to Kafka but not committed, committed in Kafka (and not yet
#: in Spark's checkpoint). A fault-injection pipeline of the test suite kills the driver at
#: each of them to show that a crash anywhere changes nothing in the results.
STEPS = ("before-redis", "after-redis", "in-transaction", "after-kafka")

#: The longest a send waits for deliveries to free room when the producer's queue is
#: full. This producer has every delivery reported, so a poll returns as soon as the
#: broker acknowledges a batch of records: the hot changelog loop rarely waits this long.
_FULL_QUEUE_POLL_S = 0.2

#: Called with a step, the batch id and how many records the batch publishes (changes,
#: late events, dead letters); kappaflow's own pipeline passes none.
StepHook = Callable[[str, int, int], None]


class BatchWriter:
    """The ``foreachBatch`` function of a counting job."""

    def __init__(
        self,
        settings: Settings,
        job: str,
        spec: CountSpec,
        store: CountStore,
        on_step: StepHook | None = None,
    ) -> None:
        self.settings = settings
        self.on_step = on_step
        self.job = job
        self.spec = spec
        self.source = spec.source
        self.store = store
        self.topics = topics_of(job)
        self.producer = transactional_producer(settings.kafka, f"kappaflow.count.{job}")
        self.last_committed = self._last_committed_batch()

    def __call__(self, frame: DataFrame, batch_id: int) -> None:
        began = time.perf_counter()
        table = unpack(frame.toArrow()["rows"])
        collected = time.perf_counter()
        kind = table["kind"]
        changes = table.filter(pc.is_in(kind, pa.array(CHANGE_KINDS))).sort_by(
            [("key", "ascending"), ("window_start", "ascending"), ("version", "ascending")]
        )
        late = self._late_events(frame, table.filter(pc.equal(kind, LATE)).to_pylist())
        dead = table.filter(pc.equal(kind, DEAD)).to_pylist()
        counted = table.filter(pc.equal(kind, STATS))
        closed = table.filter(pc.equal(kind, CLOSED))
        stats = {
            "counted": _sum(counted["counted"]),
            "duplicates": _sum(counted["duplicates"]),
            "late": len(late),
            "dead_letters": len(dead),
            "watermark": int(pc.max(table["watermark"]).as_py() or 0),
        }
        outputs = changes.num_rows + len(late) + len(dead)
        key_deltas: dict[int, int] = {}
        for rows, sign in ((counted, 1), (closed, -1)):
            for start, n in zip(
                rows["window_start"].to_pylist(), rows["count"].to_pylist(), strict=True
            ):
                key_deltas[start] = key_deltas.get(start, 0) + sign * n
        self._step("before-redis", batch_id, outputs)
        self.store.apply(
            batch_id, changes.append_column("final", leaves_final(changes)), key_deltas, stats
        )
        self._step("after-redis", batch_id, outputs)
        stored = time.perf_counter()
        if batch_id > self.last_committed and outputs:
            self._publish(batch_id, changes, late, dead, stats)
            self.last_committed = batch_id
        self._step("after-kafka", batch_id, outputs)
        # Where a batch's time goes, for tuning (the job's driver.log).
        print(
            f"batch {batch_id}: {table.num_rows} rows, {changes.num_rows} changes; "
            f"compute+collect {collected - began:.2f}s, redis {stored - collected:.2f}s, "
            f"kafka {time.perf_counter() - stored:.2f}s",
            flush=True,
        )

    def _publish(
        self,
        batch_id: int,
        changes: pa.Table,
        late: list[dict[str, Any]],
        dead: list[dict[str, Any]],
        stats: dict[str, int],
    ) -> None:
        keys, values = changelog_records(changes, batch_id)
        self.producer.begin_transaction()
        try:
            topic, producer = self.topics["counts"], self.producer
            for key, value in zip(keys, values, strict=True):
                produce_with_retry(producer, topic, value, key, poll_s=_FULL_QUEUE_POLL_S)
            for r in late:
                self._send(self.topics["late"], r["key"], self._late_record(r))
            for r in dead:
                self._send(self.topics["dlq"], None, self._dead_letter_record(r))
            self._send(self.topics["commits"], "batch", {"batch_id": batch_id, **stats})
            self.producer.flush(120)
            self._step("in-transaction", batch_id, len(keys) + len(late) + len(dead))
            self.producer.commit_transaction(120)
        except KafkaException as exc:
            self.producer.abort_transaction(60)
            raise ProduceError(f"publishing batch {batch_id} failed: {exc}") from None

    def _step(self, step: str, batch_id: int, outputs: int) -> None:
        if self.on_step is not None:
            self.on_step(step, batch_id, outputs)

    def _send(self, topic: str, key: str | None, value: dict[str, Any]) -> None:
        produce_with_retry(
            self.producer,
            topic,
            json.dumps(value).encode(),
            key.encode() if key is not None else None,
            poll_s=_FULL_QUEUE_POLL_S,
        )

    def _late_events(self, frame: DataFrame, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Each too-late event, read back from the source with its original bytes.

        The state processor reports too-late events folded: per key, window and source
        partition, how many, and the range of offsets they span in this batch. Every
        event in that range with that key and that window as its newest is one of them
        (the range lies within the batch, and the whole window is too late), so reading
        the range again and parsing it with the same expressions finds exactly those.
        """
        if not rows:
            return []
        from kappaflow.counting.events import parse_events

        ranges: dict[int, tuple[int, int]] = {}
        for r in rows:
            low, high = ranges.get(r["src_partition"], (r["src_offset"], r["src_offset_end"]))
            ranges[r["src_partition"]] = (
                min(low, r["src_offset"]),
                max(high, r["src_offset_end"]),
            )
        raw = read_range(frame.sparkSession, self.settings, self.source, ranges)
        events = (
            parse_events(raw, self.spec)
            .where(F.col("reason").isNull() & F.col("key").isin(sorted({r["key"] for r in rows})))
            .select("key", "ts", "value", "src_partition", "src_offset")
            .collect()
        )
        sessions = self.spec.session_gap_ms is not None
        by_source: dict[tuple[int, str], list[Row]] = {}
        for e in events:
            by_source.setdefault((e["src_partition"], e["key"]), []).append(e)
        found: list[dict[str, Any]] = []
        for r in rows:
            # The times whose newest window this is (for sessions: the event's own interval).
            low = r["window_start"] if sessions else r["window_end"] - self.spec.step_ms
            matches = [
                e
                for e in by_source.get((r["src_partition"], r["key"]), [])
                if r["src_offset"] <= e["src_offset"] <= r["src_offset_end"]
                and low <= e["ts"] < r["window_end"]
            ]
            if len(matches) != r["count"]:
                raise PartialBatchError(
                    f"found {len(matches)} of the {r['count']} too-late events of key "
                    f"{r['key']!r} in partition {r['src_partition']} offsets "
                    f"{r['src_offset']}-{r['src_offset_end']}: not publishing a partial batch"
                )
            found.extend(
                {**r, "src_offset": e["src_offset"], "value": bytes(e["value"])} for e in matches
            )
        return found

    def _last_committed_batch(self) -> int:
        """The highest batch id whose transaction committed (-1 if none): ``NAME.commits``
        up to its end now, read ``read_committed`` so that an aborted batch does not count."""
        start = StartAt(beginning=True)
        markers = read_records(self.settings.kafka, self.topics["commits"], start=start)
        return max((int(json.loads(m.value() or b"{}")["batch_id"]) for m in markers), default=-1)

    def _late_record(self, r: dict[str, Any]) -> dict[str, Any]:
        """A too-late event's record for ``NAME.late``."""
        return {
            "reason": r["reason"],
            "watermark": iso(from_epoch_ms(r["watermark"])),
            "key": r["key"],
            "window_start": iso(from_epoch_ms(r["window_start"])),
            "window_end": iso(from_epoch_ms(r["window_end"])),
            "event": r["value"].decode("utf-8", errors="replace"),
            "source_topic": self.source,
            "source_partition": r["src_partition"],
            "source_offset": r["src_offset"],
        }

    def _dead_letter_record(self, r: dict[str, Any]) -> dict[str, Any]:
        """A dead letter's record for ``NAME.dlq``."""
        value = r["value"]
        return {
            "error": r["reason"],
            "source_topic": self.source,
            "source_partition": r["src_partition"],
            "source_offset": r["src_offset"],
            "value_base64": base64.b64encode(bytes(value)).decode() if value else None,
        }


def changelog_records(changes: pa.Table, batch_id: int) -> tuple[list[bytes], list[bytes]]:
    """The ``NAME.counts`` records of a batch's changes: their keys (``["key", window
    start ms]``, what the real-time path's records have too) and values, as JSON."""
    key = string_literals(changes["key"])
    watermark = changes["watermark"]
    values = json_object(
        {
            "key": key,
            "window_start": iso_literals(changes["window_start"]),
            "window_end": iso_literals(changes["window_end"]),
            "count": number_text(changes["count"]),
            "previous": number_text(changes["previous"]),
            "kind": string_literals(changes["kind"]),
            "version": number_text(changes["version"]),
            "watermark": pc.if_else(pc.greater(watermark, 0), iso_literals(watermark), "null"),
            "mode": '"micro-batch"',
            "batch": str(batch_id),
        }
    )
    keys = join("[", key, ", ", number_text(changes["window_start"]), "]")
    return _bytes(keys), _bytes(values)


def _bytes(texts: Column) -> list[bytes]:
    return list(pc.cast(texts, pa.binary()).to_pylist())


def leaves_final(changes: pa.Table) -> Column:
    """Whether each change leaves its window final: the watermark has passed its end.

    Not every correction is final: a late event can extend a session past the watermark.
    """
    kind = changes["kind"]
    passed = pc.less_equal(changes["window_end"], changes["watermark"])
    return pc.or_(pc.equal(kind, FINAL), pc.and_(pc.equal(kind, CORRECTION), passed))


def _sum(column: pa.ChunkedArray) -> int:
    return int(pc.sum(column).as_py() or 0)
