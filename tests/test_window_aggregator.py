"""The window aggregator under PySpark's TwsTester, counting as ``kappaflow count`` does:
the keys each window holds, as its ``stats`` and ``closed`` rows count them, and the
records that cannot be counted passing through as dead letters.

test_stream_windows.py drives the same processor through growth, final, corrections,
close, too late and dedup; these are the cases of the removed window counter's tests it
does not show. As there, every row reports an event time no watermark reaches, the
tester's grouping key is the window start alone, and input is built from events by the
real fold step (folding.Folder), as windowing.aggregate_windows selects them for one
``count`` aggregate (no input column).
"""

from __future__ import annotations

import json
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
from packed_rows import changes, dead_letters, packed_rows, packed_tester
from pyspark.sql.streaming import TwsTester

import kappaflow.streams.aggregates as kf
from kappaflow.streams.kinds import DEAD_WINDOW
from kappaflow.streams.ops.arrow_ipc import table_from_ipc
from kappaflow.streams.ops.folding import Folder, packed, partial_name
from kappaflow.streams.ops.windowing import OUTPUT_ARROW_SCHEMA, WindowAggregator, WindowState

SIZE = 60_000
START = 600_000
END = START + SIZE
LATENESS = 30_000
COUNT = kf.count().bind(None)
#: The state's column of each key's count (the count aggregate's one partial).
COUNTED = partial_name(0, COUNT.partials()[0])


def window_aggregator() -> TwsTester:
    processor = WindowAggregator(["count"], [COUNT], SIZE, LATENESS, dedup=False)
    return packed_tester(processor)


def key(name: str) -> str:
    """A key as the job hands it over: the JSON array of the key field's value."""
    return json.dumps([name])


def records(
    rows: list[tuple[str | None, int]],
    partition: int = 0,
    dead: dict[int, tuple[str, bytes | None]] | None = None,
) -> pa.Table:
    """(key, offset) records of window START, as aggregate_windows selects them; the
    records at the offsets in ``dead`` did not parse (reason, bytes) and go to the
    DEAD_WINDOW group without a key, as there."""
    dead = dead or {}
    n = len(rows)
    return pa.table(
        {
            "window_start": pa.array(
                [DEAD_WINDOW if o in dead else START for _, o in rows], pa.int64()
            ),
            "shard": pa.array([-1 if o in dead else 0 for _, o in rows], pa.int32()),
            "key": pa.array([None if o in dead or k is None else key(k) for k, o in rows]),
            "primary": [True] * n,
            "src_partition": pa.array([partition] * n, pa.int32()),
            "id_hash": pa.nulls(n, pa.int64()),
            "src_offset": pa.array([o for _, o in rows], pa.int64()),
            "reason": pa.array([dead[o][0] if o in dead else None for _, o in rows], pa.string()),
            "value": pa.array([dead[o][1] if o in dead else None for _, o in rows], pa.binary()),
        }
    )


def folded(table: pa.Table, group: int = START) -> pd.DataFrame:
    """The fold step's rows of ``table`` in the group of window start ``group``, packed
    as the fold step hands them over."""
    out = Folder([COUNT]).fold(table)
    frame: pd.DataFrame = packed(out.filter(pc.equal(out["window_start"], group))).to_pandas()
    return frame


def rows_of(packed: object) -> list[dict[str, Any]]:
    rows = packed_rows(packed, OUTPUT_ARROW_SCHEMA)
    return sorted(rows, key=lambda r: (r["kind"], r["key"] or ""))


def feed(t: TwsTester, frame: pd.DataFrame, group: int = START) -> list[dict[str, Any]]:
    return rows_of(t.testInPandas(group, frame))


def advance(t: TwsTester, watermark: int) -> list[dict[str, Any]]:
    return rows_of(t.setWatermark(watermark))


def stats(rows: list[dict[str, Any]]) -> tuple[int, int]:
    """The call's ``stats`` row: (events counted, keys the window's state gained)."""
    (row,) = (r for r in rows if r["kind"] == "stats")
    assert (row["window_start"], row["window_end"]) == (START, END)
    return row["events"], row["held"]


def stored(t: TwsTester, group: int = START) -> dict[str, tuple[int, int]] | None:
    """The window's state: key → (count, version); None once forgotten."""
    value = t.peekValueState("window", group)
    if value is None:
        return None
    table = table_from_ipc(WindowState(*value).partials)
    return {
        r["key"]: (r[COUNTED], r["version"])
        for r in table.select(["key", COUNTED, "version"]).to_pylist()
    }


A, B, C = key("a"), key("b"), key("c")


def test_the_keys_a_window_holds_are_counted_in_then_out_when_it_closes() -> None:
    t = window_aggregator()

    # Two new keys, one of them from two source partitions.
    first = pd.concat(
        [folded(records([("a", 0), ("a", 1), ("b", 2)])), folded(records([("a", 0)], 1))]
    )
    out = feed(t, first)
    assert changes(out) == [
        ("provisional", A, {"count": 3}, None, 1),
        ("provisional", B, {"count": 1}, None, 1),
    ]
    assert stats(out) == (4, 2)

    # One new key, one the window holds: it gains one.
    out = feed(t, folded(records([("a", 3), ("c", 4), ("c", 5)])))
    assert changes(out) == [
        ("provisional", A, {"count": 4}, {"count": 3}, 2),
        ("provisional", C, {"count": 2}, None, 1),
    ]
    assert stats(out) == (3, 1)

    # Final, then a correction of a key it holds: no key gained.
    assert [c[0] for c in changes(advance(t, END))] == ["final"] * 3
    out = feed(t, folded(records([("b", 6), ("b", 7)])))
    assert changes(out) == [("correction", B, {"count": 3}, {"count": 1}, 3)]
    assert stats(out) == (2, 0)
    assert stored(t) == {A: (4, 3), B: (3, 3), C: (2, 2)}

    # The allowed lateness runs out: forgotten, with minus the keys it held.
    out = advance(t, END + LATENESS)
    assert [(r["kind"], r["window_start"], r["window_end"], r["held"]) for r in out] == [
        ("closed", START, END, -3)
    ]
    assert stored(t) is None

    # Too late: reported in the window it missed, no state and no key gained.
    out = feed(t, folded(records([("a", 8)])))
    assert [(r["kind"], r["key"], r["window_start"], r["window_end"]) for r in out] == [
        ("late", A, START, END)
    ]
    assert stored(t) is None


def test_records_that_cannot_be_counted_pass_as_dead_letters() -> None:
    t = window_aggregator()
    dead = {41: ("not valid JSON", b"{oops"), 42: ("empty record", None)}
    batch = records([(None, 41), ("a", 40), (None, 42)], partition=2, dead=dead)

    out = feed(t, folded(batch, DEAD_WINDOW), DEAD_WINDOW)
    assert dead_letters(out) == [
        ("dlq", "not valid JSON", b"{oops", 2, 41, 41),
        ("dlq", "empty record", None, 2, 42, 42),
    ]
    assert stored(t, DEAD_WINDOW) is None

    # The batch's one countable record counts alone in its window.
    out = feed(t, folded(batch))
    assert changes(out) == [("provisional", A, {"count": 1}, None, 1)]
    assert stats(out) == (1, 1)
