"""A packed window operator under TwsTester, and the rows it emitted in one call."""

from __future__ import annotations

import json
from typing import Any

import pandas as pd
import pyarrow as pa
from pyspark.sql.streaming import TwsTester
from pyspark.sql.streaming.stateful_processor import StatefulProcessor

from kappaflow.streams.ops.arrow_ipc import PackedProcessor, unpack
from kappaflow.streams.ops.windowing import OUTPUT_ARROW_SCHEMA


def packed_rows(packed: object, schema: pa.Schema = OUTPUT_ARROW_SCHEMA) -> list[dict[str, Any]]:
    """The rows of one call's output, unpacked to ``schema``; at most one packed row per
    group and call."""
    assert isinstance(packed, pd.DataFrame)
    if packed.empty:
        return []
    assert len(packed) == 1, "one packed row per call"
    table = unpack(pa.Table.from_pandas(packed, preserve_index=False)["rows"], schema)
    assert table.schema == schema
    rows: list[dict[str, Any]] = table.to_pylist()
    return rows


#: The event time every row reports to TwsTester: one no watermark reaches. The real
#: query hands the operator late rows too (its watermark is declared on a column dropped
#: before it), and the operator decides what is late itself.
NEVER_LATE = 2**62


def packed_tester(processor: StatefulProcessor) -> TwsTester:
    """``processor`` packed as a job runs it, under TwsTester in event-time mode."""
    return TwsTester(
        PackedProcessor(processor),
        timeMode="EventTime",
        eventTimeExtractor=lambda _row: NEVER_LATE,
    )


def changes(rows: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    """(kind, key, values, previous, version) of each change, values JSON decoded."""
    return [
        (
            r["kind"],
            r["key"],
            json.loads(r["values"]),
            json.loads(r["previous"]) if r["previous"] else None,
            r["version"],
        )
        for r in rows
        if r["kind"] in ("provisional", "final", "correction")
    ]


def dead_letters(rows: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    """(kind, reason, value, partition, first offset, last offset) of each row."""
    return [
        (
            r["kind"],
            r["reason"],
            r["value"],
            r["src_partition"],
            r["src_offset"],
            r["src_offset_end"],
        )
        for r in rows
    ]
