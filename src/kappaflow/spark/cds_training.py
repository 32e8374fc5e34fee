"""The driver whose classes become the class-data archive (cds.py); run by setup as
``python -m kappaflow.spark.cds_training`` with the settings as JSON on stdin.

It runs what kappaflow's jobs run, briefly: a micro-batch query with an event-time
watermark, a Python ``transformWithState`` on the RocksDB state store and a
``foreachBatch`` writer, for a few batches. The JVM writes the archive when it exits.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from typing import Any

import pandas as pd
from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql.streaming.stateful_processor import (
    StatefulProcessor,
    StatefulProcessorHandle,
    TimerValues,
)

from kappaflow.settings import Settings
from kappaflow.spark.session import build_session
from kappaflow.waiting import wait_for

BATCHES = 3


class _Counter(StatefulProcessor):
    def init(self, handle: StatefulProcessorHandle) -> None:
        self.count = handle.getValueState("count", "n LONG")

    def handleInputRows(  # type: ignore[override]
        self, key: Any, rows: Iterator[pd.DataFrame], timerValues: TimerValues
    ) -> Iterator[pd.DataFrame]:
        seen = sum(len(frame) for frame in rows)
        total = (self.count.get() or (0,))[0] + seen
        self.count.update((total,))
        yield pd.DataFrame({"key": [int(key[0])], "n": [total]})

    def close(self) -> None:
        pass


def _collect(frame: DataFrame, _batch: int) -> None:
    frame.collect()


def main() -> None:
    settings = Settings.model_validate_json(sys.stdin.read())
    spark = build_session(settings, app_name="kappaflow:class-data")
    events = (
        spark.readStream.format("rate")
        .option("rowsPerSecond", 50)
        .load()
        .withWatermark("timestamp", "1 second")
        .select((F.col("value") % 4).alias("key"), "timestamp")
    )
    counts = events.groupBy("key").transformWithStateInPandas(
        statefulProcessor=_Counter(),
        outputStructType="key LONG, n LONG",
        outputMode="Update",
        timeMode="None",
    )
    query = (
        counts.writeStream.foreachBatch(_collect)
        .option("checkpointLocation", str(settings.checkpoint_root / "class-data"))
        .trigger(processingTime="0 seconds")
        .start()
    )

    def done() -> bool | None:
        progress = query.lastProgress
        batch = int(progress["batchId"]) if progress is not None else -1
        return True if batch >= BATCHES or query.exception() is not None else None

    try:
        wait_for(
            done,
            timeout=300,
            interval=0.2,
            what="the class-data driver's first batches",
        )
        if query.exception() is not None:
            raise SystemExit(f"the query failed: {query.exception()}")
    finally:
        query.stop()
        spark.stop()


if __name__ == "__main__":
    main()
