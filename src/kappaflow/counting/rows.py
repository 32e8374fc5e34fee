"""The counting operator's contract: the groups it is keyed by and the rows it emits.

The stateful operator runs once per group (``window_start``, ``shard``). Every row it
emits, whatever the processor (fixed windows in windows.py, sessions in sessions.py),
has ``OUTPUT_SCHEMA``; its ``kind`` says what the row is, and the batch writer (sink.py)
routes it by that kind: changes to Redis and the changelog, late events and dead letters
to their topics, ``stats`` and ``closed`` to the job's bookkeeping.

``window_start`` is an epoch millisecond, except for two sentinels, defined here and
nowhere else:

- ``DEAD_WINDOW`` is the group of the records that cannot be counted: they travel
  through the operator in a group of their own and come out as dead letters;
- ``SESSIONS_WINDOW`` is the ``window_start`` of a session job's ``stats`` and
  ``closed`` rows: sessions have no window shared by keys, so the store counts the
  sessions held under this one entry (store.py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

if TYPE_CHECKING:  # the serving store and the CLI read this module without pandas
    import pandas as pd

#: Keys are spread over this many groups (state values, and parallel tasks) by hash.
SHARDS = 16
#: The group of the records that cannot be counted: they pass as dead letters.
DEAD_WINDOW = -1
#: The ``window_start`` under which a session job counts the sessions it holds.
SESSIONS_WINDOW = -2

#: One schema for everything the operator emits, and for dead letters unioned after it.
OUTPUT_SCHEMA = (
    "kind STRING, key STRING, window_start BIGINT, window_end BIGINT, count BIGINT, "
    "previous BIGINT, version BIGINT, watermark BIGINT, counted BIGINT, duplicates BIGINT, "
    "reason STRING, value BINARY, src_partition INT, src_offset BIGINT, src_offset_end BIGINT"
)
#: OUTPUT_SCHEMA in Arrow's terms.
OUTPUT_ARROW_SCHEMA = pa.schema(
    [
        pa.field(
            name,
            {"STRING": pa.string(), "BIGINT": pa.int64(), "INT": pa.int32()}.get(sql, pa.binary()),
        )
        for name, sql in (field.split() for field in OUTPUT_SCHEMA.split(", "))
    ]
)

PROVISIONAL, FINAL, CORRECTION = "provisional", "final", "correction"
LATE, DEAD, STATS, CLOSED = "late", "dlq", "stats", "closed"
CHANGE_KINDS = (PROVISIONAL, FINAL, CORRECTION)


def output_table(n: int, **columns: Any) -> pa.Table:
    """``n`` output rows as Arrow (OUTPUT_SCHEMA); see ``schema_rows``."""
    return schema_rows(OUTPUT_ARROW_SCHEMA, n, **columns)


def schema_rows(schema: pa.Schema, n: int, **columns: Any) -> pa.Table:
    """``n`` rows of an operator's output ``schema``; columns not given are 0 (numbers),
    -1 (partition) or null. Values may be lists, numpy arrays, pandas or Arrow arrays."""
    arrays: list[pa.Array | pa.ChunkedArray] = []
    for field in schema:
        values = columns.get(field.name)
        if isinstance(values, pa.ChunkedArray | pa.Array):
            arrays.append(values.cast(field.type))
        elif values is not None:
            arrays.append(pa.array(values, type=field.type))
        elif field.name == "src_partition":
            arrays.append(pa.array(np.full(n, -1, dtype="int32")))
        elif field.type == pa.int64():
            arrays.append(pa.array(np.zeros(n, dtype="int64")))
        else:
            arrays.append(pa.nulls(n, field.type))
    return pa.Table.from_arrays(arrays, schema=schema)


def output_rows(n: int, **columns: Any) -> pd.DataFrame:
    """``output_table`` as a DataFrame, for the processors that work in pandas."""
    frame: pd.DataFrame = output_table(n, **columns).to_pandas()
    return frame


def dead_letter_rows(
    records: pd.DataFrame | pa.Table, offset_column: str, schema: pa.Schema = OUTPUT_ARROW_SCHEMA
) -> pa.Table:
    """A ``dlq`` row (of ``schema``) for each record that cannot be counted or did not
    parse, with its reason, its original bytes and where it came from (``offset_column``
    holds its source offset)."""
    n = len(records)
    offsets = records[offset_column]
    return schema_rows(
        schema,
        n,
        kind=[DEAD] * n,
        reason=records["reason"],
        value=records["value"],
        src_partition=records["src_partition"],
        src_offset=offsets,
        src_offset_end=offsets,
    )


def late_rows(
    late: pd.DataFrame,
    *,
    window_start: Any,
    window_end: Any,
    watermark: int,
    reason: str,
    count: Any,
    offset_columns: tuple[str, str],
) -> pa.Table:
    """A ``late`` row for each row of ``late`` (its ``key`` and ``src_partition``): in
    the window given, with how many events it stands for (``count``) and the range of
    source offsets they span (``offset_columns``: first, last), from which the batch
    writer reads the events back to report each one."""
    n = len(late)
    first, last = offset_columns
    return output_table(
        n,
        kind=[LATE] * n,
        key=late["key"].tolist(),
        window_start=_per_row(window_start, n),
        window_end=_per_row(window_end, n),
        watermark=np.full(n, watermark),
        count=_per_row(count, n),
        reason=[reason] * n,
        src_partition=late["src_partition"].to_numpy(dtype="int32"),
        src_offset=late[first].to_numpy(dtype="int64"),
        src_offset_end=late[last].to_numpy(dtype="int64"),
    )


def _per_row(values: Any, n: int) -> np.ndarray:
    """One int64 per row: ``values`` as they are, or one value repeated."""
    if np.ndim(values) == 0:
        return np.full(n, values, dtype="int64")
    return np.asarray(values, dtype="int64")
