"""Rows of a window operator's output schema (the contract: streams/kinds.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from kappaflow.streams.kinds import DEAD

if TYPE_CHECKING:  # the serving store and the CLI read this module without pandas
    import pandas as pd


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
