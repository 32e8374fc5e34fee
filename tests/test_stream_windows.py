"""Windowed aggregates: the state machine under TwsTester, and one streaming query.

TwsTester keeps state and event-time timers in memory and fires the timers as the
watermark is set. As in test_window_counter.py, every row reports an event time no
watermark reaches (the operator sees late rows in the real query too, see windowing.py),
and the tester's grouping key is the window start alone. Input is built from events by
the real fold step (folding.Folder), so the tests cover it too.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from packed_rows import changes, packed_rows, packed_tester
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.streaming import TwsTester

import kappaflow.streams.aggregates as kf
from kappaflow.errors import KappaflowError
from kappaflow.streams.aggregates import Aggregate
from kappaflow.streams.ops.arrow_ipc import unpack
from kappaflow.streams.ops.folding import Folder, input_name, packed
from kappaflow.streams.ops.windowing import (
    OUTPUT_ARROW_SCHEMA,
    WindowAggregator,
    WindowState,
    aggregate_windows,
    key_json,
)

SIZE = 60_000
START = 600_000
END = START + SIZE

ALL = {
    "n": kf.count(),
    "total": kf.sum("amount"),
    "avg": kf.mean("amount"),
    "low": kf.min("amount"),
    "high": kf.max("amount"),
    "users": kf.approx_distinct("user"),
}
TYPES = {"amount": pa.int64(), "user": pa.string()}


def bound(aggregates: dict[str, Aggregate]) -> list[Aggregate]:
    return [a.bind(TYPES[a.column] if a.column else None) for a in aggregates.values()]


def aggregator(
    aggregates: dict[str, Aggregate], lateness_ms: int, dedup: bool = False
) -> TwsTester:
    processor = WindowAggregator(
        list(aggregates), bound(aggregates), SIZE, lateness_ms, dedup=dedup
    )
    return packed_tester(processor)


def folded(
    aggregates: dict[str, Aggregate],
    events: list[dict[str, Any]],
    partition: int = 0,
    primary: bool = True,
) -> pd.DataFrame:
    """Events (key: a list of key values, amount, user, id, offset) through the fold,
    packed as the fold step hands them over."""
    aggs = bound(aggregates)
    n = len(events)
    table = pa.table(
        {
            "window_start": pa.array([START] * n, pa.int64()),
            "shard": pa.array([0] * n, pa.int32()),
            "key": [json.dumps(e["key"], separators=(",", ":")) for e in events],
            "primary": [primary] * n,
            "src_partition": pa.array([partition] * n, pa.int32()),
            "id_hash": pa.array([e.get("id") for e in events], pa.int64()),
            "src_offset": pa.array([e["offset"] for e in events], pa.int64()),
            **{
                input_name(i): pa.array([e.get(a.column) for e in events], TYPES[a.column])
                for i, a in enumerate(aggs)
                if a.column
            },
        }
    )
    frame: pd.DataFrame = packed(Folder(aggs).fold(table)).to_pandas()
    return frame


def ev(key: list[Any], offset: int, amount: int | None = None, **more: Any) -> dict[str, Any]:
    return {"key": key, "offset": offset, "amount": amount, **more}


def rows_of(packed: object) -> list[dict[str, Any]]:
    rows = packed_rows(packed, OUTPUT_ARROW_SCHEMA)
    return sorted(rows, key=lambda r: (r["kind"], r["key"] or ""))


def feed(t: TwsTester, frame: pd.DataFrame) -> list[dict[str, Any]]:
    return rows_of(t.testInPandas(START, frame))


def advance(t: TwsTester, watermark: int) -> list[dict[str, Any]]:
    return rows_of(t.setWatermark(watermark))


def stats(rows: list[dict[str, Any]]) -> tuple[int, int]:
    (row,) = [r for r in rows if r["kind"] == "stats"]
    return row["events"], row["duplicates"]


def values(n: int, total: Any, avg: Any, low: Any, high: Any, users: int) -> dict[str, Any]:
    return {"n": n, "total": total, "avg": avg, "low": low, "high": high, "users": users}


def test_values_grow_then_become_final_then_take_corrections_then_close() -> None:
    t = aggregator(ALL, lateness_ms=30_000)
    de, fr = ["DE"], ["FR"]
    # DE from two source partitions merges into one change; a null amount counts only in n.
    out = feed(
        t,
        pd.concat(
            [
                folded(ALL, [ev(de, 0, 10, user="u1"), ev(fr, 1, None, user="u9")]),
                folded(ALL, [ev(de, 5, 20, user="u2")], partition=1),
            ]
        ),
    )
    first_de, first_fr = values(2, 30, 15.0, 10, 20, 2), values(1, None, None, None, None, 1)
    assert changes(out) == [
        ("provisional", '["DE"]', first_de, None, 1),
        ("provisional", '["FR"]', first_fr, None, 1),
    ]
    assert stats(out) == (3, 0)
    t.handle.setGroupingKey(START)
    assert list(t.handle.listTimers()) == [END, END + 30_000]

    out = feed(t, folded(ALL, [ev(de, 1, 3, user="u1")]))
    second_de = values(3, 33, 11.0, 3, 20, 2)
    assert changes(out) == [("provisional", '["DE"]', second_de, first_de, 2)]

    # The watermark passes the end: every key, final, one version on.
    assert changes(advance(t, END)) == [
        ("final", '["DE"]', second_de, second_de, 3),
        ("final", '["FR"]', first_fr, first_fr, 2),
    ]
    # Within the allowed lateness: a correction; an event that changes nothing, none.
    assert advance(t, END + 5_000) == []
    out = feed(t, folded(ALL, [ev(fr, 7, -4, user="u8")]))
    assert changes(out) == [("correction", '["FR"]', values(2, -4, -4.0, -4, -4, 2), first_fr, 3)]
    stored = t.peekValueState("window", START)
    assert stored is not None and WindowState(*stored).final is True

    # The lateness runs out: forgotten. Later events are late, with counts and offsets,
    # reported through their newest window only.
    assert [r["kind"] for r in advance(t, END + 30_000)] == ["closed"]
    assert t.peekValueState("window", START) is None
    late = pd.concat(
        [
            folded(ALL, [ev(de, 40, 1, user="u1"), ev(de, 42, 2, user="u1")], partition=3),
            folded(ALL, [ev(fr, 50, 1, user="u1")], primary=False),
        ]
    )
    out = feed(t, late)
    assert [
        (r["kind"], r["key"], r["events"], r["src_partition"], r["src_offset"], r["src_offset_end"])
        for r in out
    ] == [("late", '["DE"]', 2, 3, 40, 42)]
    assert list(out[0]["offsets"]) == [40, 42]
    assert out[0]["reason"].startswith("too late: window 1970-01-01T00:10:00")
    assert t.peekValueState("window", START) is None


def test_input_before_the_end_timer_fires_makes_the_window_final_first() -> None:
    """In a batch whose watermark passed a window's end, Spark hands the processor the
    input before it fires the timers. TwsTester's setWatermark fires them at once, so
    the watermark is moved here without firing them (its private field)."""
    aggs = {"n": kf.count()}
    t = aggregator(aggs, lateness_ms=30_000)
    feed(t, folded(aggs, [ev(["a"], 0)]))
    t._currentWatermarkMs = END + 1_000
    out = feed(t, folded(aggs, [ev(["a"], 1), ev(["b"], 2)]))
    assert changes(out) == [
        ("correction", '["a"]', {"n": 2}, {"n": 1}, 3),
        ("correction", '["b"]', {"n": 1}, None, 1),
        ("final", '["a"]', {"n": 1}, {"n": 1}, 2),
    ]
    assert changes(advance(t, END + 2_000)) == []  # the timer finds the window final


def test_an_unchanged_result_is_no_change() -> None:
    highs = {"high": kf.max("amount"), "q": kf.approx_quantiles("amount", (0.5,))}
    t = aggregator(highs, lateness_ms=0)
    assert [c[2] for c in changes(feed(t, folded(highs, [ev([], 0, 5), ev([], 1, 5)])))] == [
        {"high": 5, "q": {"0.5": 5.0}}
    ]
    out = feed(t, folded(highs, [ev([], 2, 5)]))
    assert changes(out) == [] and stats(out) == (1, 0)


def test_an_id_counts_once_per_window() -> None:
    aggs = {"n": kf.count(), "total": kf.sum("amount"), "users": kf.approx_distinct("user")}
    t = aggregator(aggs, lateness_ms=0, dedup=True)
    a = ["a", 1]  # a key of two columns, one a number
    # id 11 twice in a batch: its second event (amount 100) does not count.
    batch = [ev(a, 0, 1, id=11, user="x"), ev(a, 1, 2, id=12), ev(a, 2, 100, id=11, user="y")]
    out = feed(t, folded(aggs, [*batch, ev(a, 3, 4, user="z")]))
    assert changes(out) == [("provisional", '["a",1]', {"n": 3, "total": 7, "users": 2}, None, 1)]
    assert stats(out) == (3, 1)
    # A later batch: id 12 was counted already, id 14 is new.
    out = feed(t, folded(aggs, [ev(a, 4, 50, id=12), ev(a, 5, 6, id=14)], partition=1))
    assert changes(out) == [
        (
            "provisional",
            '["a",1]',
            {"n": 4, "total": 13, "users": 2},
            {"n": 3, "total": 7, "users": 2},
            2,
        )
    ]
    assert stats(out) == (1, 1)


def test_an_id_counts_once_beside_events_without_one() -> None:
    """An id hash is 64 bits: a repeat in a later batch is known beside an event without
    an id. (The fold's rows reach the state packed: in pandas columns, an int64 column
    with a null is float64, and the hash came out rounded, not the one the window kept.)"""
    aggs = {"n": kf.count(), "total": kf.sum("amount")}
    t = aggregator(aggs, lateness_ms=0, dedup=True)
    a, big = ["a"], 2**62 + 1  # not a float64
    out = feed(t, folded(aggs, [ev(a, 0, 1, id=big)]))
    assert stats(out) == (1, 0)
    # The repeat, in the group of an event without an id (and so a null id hash).
    out = feed(t, folded(aggs, [ev(a, 1, 100, id=big), ev(a, 2, 2**53 + 1)]))
    assert changes(out) == [
        ("provisional", '["a"]', {"n": 2, "total": 2**53 + 2}, {"n": 1, "total": 1}, 2)
    ]
    assert stats(out) == (1, 1)


@pytest.mark.parametrize(
    ("change", "code", "says"),
    [
        ({"size_ms": 0}, "KF715", "window size must be positive, got 0 ms"),
        ({"slide_ms": 7_000}, "KF715", "divide the size 60000 ms, got 7000 ms"),
        ({"lateness_ms": -1}, "KF715", "lateness must not be negative"),
        ({"aggregates": {}}, "KF716", "no aggregates"),
        ({"aggregates": {"": kf.count()}}, "KF716", "non-empty string"),
        ({"aggregates": {"x": "sum"}}, "KF716", "'x' is 'sum', not an aggregate"),
        ({"keys": ["shop"]}, "KF716", "events have no column 'shop'"),
        ({"id_column": "uuid"}, "KF716", "events have no column 'uuid'"),
        ({"aggregates": {"x": kf.sum("price")}}, "KF712", "aggregate 'x': events have no"),
        ({"aggregates": {"x": kf.mean("country")}}, "KF713", "column 'country' is string"),
    ],
)
def test_bad_windows_are_refused(
    spark: SparkSession, change: dict[str, Any], code: str, says: str
) -> None:
    events = spark.createDataFrame(
        [], "country STRING, amount BIGINT, _kf_time BIGINT, _kf_partition INT, _kf_offset BIGINT"
    )
    arguments: dict[str, Any] = {
        "keys": ["country"],
        "aggregates": {"n": kf.count()},
        "size_ms": SIZE,
        "slide_ms": None,
        "watermark_ms": 0,
        "lateness_ms": 0,
        "id_column": None,
        **change,
    }
    with pytest.raises(KappaflowError) as raised:
        aggregate_windows(events, **arguments)
    assert raised.value.code == code
    assert says in str(raised.value)


EVENTS = pa.schema(
    [
        ("country", pa.string()),
        ("channel", pa.string()),
        ("amount", pa.int64()),
        ("_kf_time", pa.int64()),
        ("_kf_partition", pa.int32()),
        ("_kf_offset", pa.int64()),
    ]
)


def _unpacked(frame: DataFrame) -> list[dict[str, Any]]:
    """An operator's rows: the Python one's packed, the Java one's as they are."""
    table = frame.toArrow()
    if "rows" in table.column_names:
        table = unpack(table["rows"], OUTPUT_ARROW_SCHEMA)
    rows: list[dict[str, Any]] = table.select(OUTPUT_ARROW_SCHEMA.names).to_pylist()
    return rows


@pytest.mark.parametrize("engine", ["python", "jvm"])
def test_a_streaming_query_emits_provisional_final_correction_and_late(
    spark: SparkSession, tmp_path: Path, engine: str
) -> None:
    """Three files, one per micro-batch, windows of a minute, lateness 30 s, watermark 0.

    The watermark a batch runs with comes from the batches before it, so: batch 1 opens
    windows 0, 60 s and 120 s; by batch 2 (watermark 121 s) windows 0 and 60 s are
    final and window 0 is forgotten; batch 3 corrects window 60 s and is too late for 0.
    """
    source = tmp_path / "events"
    source.mkdir()
    de, fr = ("DE", "web"), ("FR", "app")
    files = [
        [(*de, 10, 1_000, 0), (*fr, 3, 2_000, 1), (*de, 7, 61_000, 2), (*fr, 1, 121_000, 3)],
        [(*fr, 2, 122_000, 4)],
        [(*de, 5, 62_000, 5), (*de, 4, 3_000, 6)],
    ]
    for i, rows in enumerate(files):
        table = pa.Table.from_pylist(
            [dict(zip(EVENTS.names, (*row[:4], 0, row[4]), strict=True)) for row in rows],
            schema=EVENTS,
        )
        path = source / f"part-{i}.parquet"
        pq.write_table(table, path)
        os.utime(path, (1_700_000_000 + i, 1_700_000_000 + i))
    events = spark.readStream.schema(_ddl()).option("maxFilesPerTrigger", 1).parquet(str(source))
    out = aggregate_windows(
        events,
        keys=["country", "channel"],
        aggregates={"n": kf.count(), "total": kf.sum("amount")},
        size_ms=SIZE,
        slide_ms=None,
        watermark_ms=0,
        lateness_ms=30_000,
        id_column=None,
        engine=engine,
    )
    batches: list[list[dict[str, Any]]] = []

    def collect(frame: DataFrame, batch_id: int) -> None:
        batches.append(_unpacked(frame))

    query = (
        out.writeStream.outputMode("update")
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .foreachBatch(collect)
        .trigger(availableNow=True)
        .start()
    )
    try:
        assert query.awaitTermination(120), "the query did not finish in 120 s"
    finally:
        query.stop()
    seen = [
        (b, r["kind"], r["key"], r["window_start"], r["values"], r["version"])
        for b, rows in enumerate(batches)
        for r in rows
        if r["kind"] != "stats"
    ]
    de_key = '["DE","web"]'

    def first(kind: str, start: int) -> tuple[int, str | None, int]:
        found = [(b, v, n) for b, k, key, s, v, n in seen if (k, key, s) == (kind, de_key, start)]
        assert found, (kind, start, seen)
        return found[0]

    assert first("provisional", 60_000) == (0, '{"n":1,"total":7}', 1)
    final = first("final", 60_000)
    assert final[1:] == ('{"n":1,"total":7}', 2)
    correction = first("correction", 60_000)
    assert correction[1:] == ('{"n":2,"total":12}', 3) and correction[0] > final[0]
    assert first("final", 0)[1] == '{"n":1,"total":10}'
    (late,) = [r for rows in batches for r in rows if r["kind"] == "late"]
    assert (late["key"], late["window_start"], late["events"]) == (de_key, 0, 1)
    assert (late["src_partition"], late["src_offset"], late["src_offset_end"]) == (0, 6, 6)
    assert any(r["kind"] == "closed" and r["window_start"] == 0 for rows in batches for r in rows)


def _ddl() -> str:
    sql = {pa.string(): "STRING", pa.int64(): "BIGINT", pa.int32(): "INT"}
    return ", ".join(f"{f.name} {sql[f.type]}" for f in EVENTS)


@pytest.mark.parametrize("engine", ["python", "jvm"])
def test_sliding_windows_and_key_json_in_a_batch_query(spark: SparkSession, engine: str) -> None:
    """A batch query runs the same plan (no watermark, so no timers): each event lands in
    size/slide windows, and keys keep their JSON types."""
    events = spark.createDataFrame(
        [("DE", 7, 5, 61_000, 0, 1), ("DE", 7, 1, 89_000, 0, 2), (None, 1, 2, 1_000, 1, 3)],
        "country STRING, channel INT, amount BIGINT, "
        "_kf_time BIGINT, _kf_partition INT, _kf_offset BIGINT",
    )
    out = aggregate_windows(
        events,
        keys=["country", "channel"],
        aggregates={"total": kf.sum("amount")},
        size_ms=SIZE,
        slide_ms=30_000,
        watermark_ms=0,
        lateness_ms=0,
        id_column=None,
        engine=engine,
    )
    rows = _unpacked(out)
    found = sorted(
        (r["key"], r["window_start"], r["window_end"], r["values"])
        for r in rows
        if r["kind"] == "provisional"
    )
    assert found == [
        ('["DE",7]', 30_000, 90_000, '{"total":6}'),
        ('["DE",7]', 60_000, 120_000, '{"total":6}'),
        ("[null,1]", -30_000, 30_000, '{"total":2}'),
        ("[null,1]", 0, 60_000, '{"total":2}'),
    ]
    counted = [r["events"] for r in rows if r["kind"] == "stats"]
    assert sum(counted) == 3  # each event counted once, through its newest window


def test_key_json_of_one_key_is_the_array_of_its_value(spark: SparkSession) -> None:
    rows = spark.createDataFrame(
        [("DE", 7, 1.5, True), (None, None, None, None), ('a"b', -1, 2.0, False)],
        "country STRING, channel INT, price DOUBLE, open BOOLEAN",
    )
    texts = rows.select(
        *[key_json([c]).alias(c) for c in rows.columns], key_json(["country", "open"]).alias("two")
    ).collect()
    assert [tuple(r) for r in texts] == [
        ('["DE"]', "[7]", "[1.5]", "[true]", '["DE",true]'),
        ("[null]", "[null]", "[null]", "[null]", "[null,null]"),
        ('["a\\"b"]', "[-1]", "[2.0]", "[false]", '["a\\"b",false]'),
    ]
