"""Arrow IPC streams as bytes: the operator's packed output and its state values.

A micro-batch emits about one change per key. ``PackedProcessor`` hands Spark all the
rows a group emits in one call as one binary row holding an Arrow IPC stream, so Spark
moves a few binary rows per group instead of converting and shuffling thousands of
narrow rows one by one; the batch writer restores them with ``unpack``. The processors
keep their state values (tables of counts or sessions) as the same kind of bytes.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pandas as pd
import pyarrow as pa
from pyspark.sql.streaming.stateful_processor import (
    ExpiredTimerInfo,
    StatefulProcessor,
    StatefulProcessorHandle,
    TimerValues,
)

#: What the operator hands Spark: each group's output rows packed into one Arrow stream.
PACKED_SCHEMA = "rows BINARY"


class PackedProcessor(StatefulProcessor):
    """``processor`` with its output packed: one row per group and call, holding all the
    rows it emitted (Arrow tables of its output schema) as Arrow IPC bytes."""

    def __init__(self, processor: StatefulProcessor) -> None:
        self.processor = processor

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.processor.init(handle)

    def handleInputRows(  # type: ignore[override]
        self, key: Any, rows: Iterator[pd.DataFrame], timerValues: TimerValues
    ) -> Iterator[pd.DataFrame]:
        yield from _packed(self.processor.handleInputRows(key, rows, timerValues))

    def handleExpiredTimer(
        self, key: Any, timerValues: TimerValues, expiredTimerInfo: ExpiredTimerInfo
    ) -> Iterator[pd.DataFrame]:
        yield from _packed(self.processor.handleExpiredTimer(key, timerValues, expiredTimerInfo))

    def close(self) -> None:
        self.processor.close()


def _packed(parts: Iterator[pa.Table]) -> Iterator[pd.DataFrame]:
    """Output parts as one packed row."""
    tables = [part for part in parts if part.num_rows]
    if tables:
        yield pd.DataFrame({"rows": [table_to_ipc(pa.concat_tables(tables))]})


def unpack(blobs: pa.ChunkedArray | pa.Array, schema: pa.Schema) -> pa.Table:
    """The rows packed by ``PackedProcessor`` (``blobs``, one per group and call) as one
    table of the operator's output ``schema``."""
    tables = [table_from_ipc(blob) for blob in blobs.to_pylist() if blob]
    if not tables:
        return schema.empty_table()
    return pa.concat_tables(tables, promote_options="permissive").cast(schema)


def table_to_ipc(table: pa.Table) -> bytes:
    """``table`` as the bytes of an Arrow IPC stream."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return bytes(sink.getvalue().to_pybytes())


def table_from_ipc(blob: bytes) -> pa.Table:
    """The table an Arrow IPC stream's bytes hold."""
    return pa.ipc.open_stream(pa.py_buffer(blob)).read_all()


def frame_to_ipc(frame: pd.DataFrame) -> bytes:
    """A DataFrame (without its index) as Arrow IPC stream bytes, for a state value."""
    return table_to_ipc(pa.Table.from_pandas(frame, preserve_index=False))


def frame_from_ipc(blob: bytes) -> pd.DataFrame:
    """The DataFrame ``frame_to_ipc`` wrote."""
    frame: pd.DataFrame = table_from_ipc(blob).to_pandas()
    return frame
