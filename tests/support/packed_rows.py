"""The rows a packed stateful operator emitted in one call, for tests under TwsTester."""

from __future__ import annotations

from typing import Any

import pandas as pd
import pyarrow as pa

from kappaflow.counting.arrow_ipc import unpack
from kappaflow.streams.windowing import OUTPUT_ARROW_SCHEMA


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
