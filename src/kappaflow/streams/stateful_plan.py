"""Declaring a stateful function's output: ``Stream.process`` and its query plan.

``process_stream`` checks the declaration and builds the operator's query
(``run_processor``: the events' columns as JSON, grouped by the key, through
stateful_run.KeyedProcessor); the stream it returns reads as the function's typed output
records (``.df``, the lake's schema) and carries the operator's rows, records and late
events alike, for the runtime to write.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from kappaflow.errors import (
    InvalidJobError,
    KappaflowError,
    NotStatefulFunctionError,
    ProcessColumnError,
    StatefulOutputTypeError,
)
from kappaflow.streams import kinds
from kappaflow.streams.joins import stream_joined
from kappaflow.streams.model import BOOKKEEPING, Side, Source
from kappaflow.streams.ops.shipping import ship_by_value
from kappaflow.streams.ops.stateful_run import (
    OFFSET,
    OUTPUT_SCHEMA,
    PARTITION,
    RECORD,
    TIME,
    KeyedProcessor,
)
from kappaflow.streams.ops.windowing import event_time_watermark
from kappaflow.streams.stateful import StatefulFunction
from kappaflow.streams.stateful_values import field_names, is_record_type, state_fields


@dataclass(frozen=True)
class Processed:
    """A stateful function's output as a stream: its typed records with kappaflow's
    columns, their source (keyed by the function's key when the output carries it), and
    the operator's rows (records and late events) as the runtime writes them."""

    frame: DataFrame
    source: Source
    output_rows: DataFrame
    name: str
    #: What the output's state depends on (jobs/plan.py compares it on restarts).
    state_definition: dict[str, Any]


def process_stream(
    stream: Side,
    function: Any,
    *,
    by: str | Sequence[str],
    name: str | None,
    record: type | None,
) -> Processed:
    """``stream.process(function, by=...)``: the function's output records, with the
    operator's rows (record and late) for the runtime to write."""
    from kappaflow.streams.schema import compile_schema

    if not isinstance(function, StatefulFunction):
        shown = getattr(function, "__name__", repr(function))
        raise NotStatefulFunctionError(
            f"process({shown}): decorate it with @kf.stateful(state=..., output=...)"
        )
    if stream.processed:
        raise InvalidJobError(f"process({function.name}): this stream is already processed")
    keys = (by,) if isinstance(by, str) else tuple(by)
    columns = [c for c in stream.df.columns if c not in BOOKKEEPING]
    unknown = [k for k in keys if k not in columns]
    if not keys or unknown:
        raise ProcessColumnError(
            f"process({function.name}, by={list(keys)}): "
            + (f"no column {unknown[0]!r}" if unknown else "name at least one key column")
            + f" (columns: {', '.join(columns)})"
        )
    record = record or getattr(stream.source, "model", None)
    if not is_record_type(record):
        raise ProcessColumnError(
            f"process({function.name}): give record= the dataclass its events are built as"
        )
    assert record is not None
    fields = field_names(record)
    missing = [f for f in fields if f not in columns]
    if missing:
        raise ProcessColumnError(
            f"process({function.name}): the stream has no column {missing[0]!r} for "
            f"{record.__name__}.{missing[0]} (columns: {', '.join(columns)})"
        )
    try:
        output = compile_schema(function.output)
    except KappaflowError as exc:
        raise StatefulOutputTypeError(f"{function.name}: output type: {exc}") from None
    ship_by_value(function.function, function.timer, function.state, function.output, record)
    source = stream.source
    watermark = None if stream_joined(source) else source.watermark_ms
    rows = run_processor(stream.df, function, keys, record, watermark, source.lateness_ms)
    typed = (
        rows.where(F.col("kind") == kinds.RECORD)
        .select(
            F.from_json("row", output.struct).alias("r"),
            F.col("time").alias("_kf_time"),
            F.col("src_partition").alias("_kf_partition"),
            F.col("src_offset").alias("_kf_offset"),
        )
        .select("r.*", *BOOKKEEPING)
    )
    out_fields = field_names(function.output)
    # The writer keys a plain stream's Kafka records by the source's key fields, and
    # reads late rows' keys as JSON of those: key the output by the function's key when
    # the output carries it, and put the late event's key into its reason.
    carried = all(k in out_fields for k in keys)
    # The state is kept as JSON by field name (fields may come and go); what it is
    # keyed by, which function keeps it and Spark's operator that holds it may not change
    # under a checkpoint (state kept by transformWithStateInPandas does not restore into
    # transformWithState).
    return Processed(
        typed,
        dataclasses.replace(source, keys=keys if carried else ()),
        rows.select(
            "kind",
            "key",
            "row",
            "reason",
            "watermark",
            F.col("time").alias("window_start"),
            F.col("time").alias("window_end"),
            "src_partition",
            "src_offset",
            "offsets",
            "events",
        ),
        name or function.name,
        {
            "kind": "stateful function",
            "function": function.name,
            "by": list(keys),
            "operator": "transformWithState",
            # Its fields may come and go, or widen (jobs/evolution.py).
            "state": state_fields(function.state),
        },
    )


def run_processor(
    events: DataFrame,
    function: StatefulFunction[Any],
    keys: Sequence[str],
    record: type,
    watermark_ms: int | None,
    lateness_ms: int,
) -> DataFrame:
    """The operator's rows (OUTPUT_SCHEMA) for ``events`` (with ``_kf_`` columns).

    The watermark is declared on a column dropped before the operator: Spark fires the
    timers by it but hands the operator late rows instead of dropping them."""
    prepared = event_time_watermark(events, watermark_ms).select(
        *keys,
        F.to_json(F.struct(*field_names(record))).alias(RECORD),
        F.col("_kf_time").cast("long").alias(TIME),
        F.col("_kf_partition").cast("int").alias(PARTITION),
        F.col("_kf_offset").cast("long").alias(OFFSET),
    )
    return prepared.groupBy(*keys).transformWithState(
        statefulProcessor=KeyedProcessor(function, record, lateness_ms),
        outputStructType=OUTPUT_SCHEMA,
        outputMode="Update",
        timeMode="EventTime",
    )
