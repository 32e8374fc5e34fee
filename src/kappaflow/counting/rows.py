"""The window operators' contract: the groups they are keyed by and their rows' kinds.

A window operator (streams/windowing.py, streams/session_windows.py) runs once per group:
(``window_start``, ``shard``) for fixed windows, ``shard`` for sessions. Every row it
emits has its output schema; its ``kind`` says what the row is, and the batch writer
(streams/writer.py) routes it by that kind: changes to the store and the changelog, late
events and dead letters to their topics, ``stats`` and ``closed`` to the output's
bookkeeping.

``window_start`` is an epoch millisecond, except for two sentinels, defined here and
nowhere else:

- ``DEAD_WINDOW`` is the group of the records that did not parse: they travel through
  the operator in a group of their own and come out as dead letters;
- ``SESSIONS_WINDOW`` is the ``window_start`` of a session operator's ``stats`` and
  ``closed`` rows: sessions have no window shared by keys, so the store counts the
  sessions held under this one entry.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

if TYPE_CHECKING:  # the serving store and the CLI read this module without pandas
    import pandas as pd

#: Keys are spread over this many groups (state values, and parallel tasks) by hash.
SHARDS = 16
#: The group of the records that did not parse: they pass as dead letters.
DEAD_WINDOW = -1
#: The ``window_start`` under which a session job counts the sessions it holds.
SESSIONS_WINDOW = -2

PROVISIONAL, FINAL, CORRECTION = "provisional", "final", "correction"
LATE, DEAD, STATS, CLOSED = "late", "dlq", "stats", "closed"


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


def dead_letter_rows(
    records: pd.DataFrame | pa.Table, offset_column: str, schema: pa.Schema
) -> pa.Table:
    """A ``dlq`` row (of ``schema``) for each record that did not parse, with its reason,
    its original bytes and where it came from (``offset_column`` holds its offset)."""
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
