"""The engine's window operator in Java (io.kappaflow.engine.Windows) against the Python
one it replaces: the same streams through both, batch by batch, give the same rows.

Each stream is a folder of Parquet files read one file per micro-batch, so both queries
see the same batches and watermarks. Rows are compared as the batch writer reads them:
the Python operator's unpacked, the late rows one per event (the Python operator reports
a folded row's events in one row, with their offsets; the writer reads them by offset),
each batch's rows in one order.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyspark.sql import DataFrame, SparkSession

import kappaflow.streams.aggregates as kf
from kappaflow.errors import WindowSpecError
from kappaflow.streams.aggregates import Aggregate
from kappaflow.streams.ops.arrow_ipc import unpack
from kappaflow.streams.ops.session_windows import aggregate_sessions
from kappaflow.streams.ops.windowing import OUTPUT_ARROW_SCHEMA, aggregate_windows

EVENTS = pa.schema(
    [
        ("shop", pa.string()),
        ("amount", pa.int64()),
        ("price", pa.float64()),
        ("user", pa.string()),
        ("id", pa.string()),
        ("_kf_time", pa.int64()),
        ("_kf_partition", pa.int32()),
        ("_kf_offset", pa.int64()),
        ("_kf_reason", pa.string()),
        ("_kf_value", pa.binary()),
    ]
)
_SQL = {
    pa.string(): "STRING",
    pa.int64(): "BIGINT",
    pa.int32(): "INT",
    pa.float64(): "DOUBLE",
    pa.binary(): "BINARY",
}
ALL: dict[str, Aggregate] = {
    "n": kf.count(),
    "total": kf.sum("amount"),
    "cost": kf.sum("price"),
    "low": kf.min("price"),
    "high": kf.max("amount"),
    "avg": kf.mean("price"),
    "users": kf.approx_distinct("user"),
    "spread": kf.approx_quantiles("price", [0.25, 0.5, 0.9]),
}


def _event(
    shop: str | None,
    t: int,
    offset: int,
    *,
    amount: int | None = 1,
    price: float | None = 1.5,
    user: str | None = "u",
    id: str | None = None,
    partition: int = 0,
) -> dict[str, Any]:
    return {
        "shop": shop,
        "amount": amount,
        "price": price,
        "user": user,
        "id": id,
        "_kf_time": t,
        "_kf_partition": partition,
        "_kf_offset": offset,
        "_kf_reason": None,
        "_kf_value": None,
    }


def _dead(offset: int, reason: str, value: bytes) -> dict[str, Any]:
    row = _event(None, 0, offset, amount=None, price=None, user=None)
    return {**row, "_kf_time": None, "_kf_reason": reason, "_kf_value": value}


def _stream(
    spark: SparkSession, folder: Path, batches: Sequence[Sequence[dict[str, Any]]]
) -> DataFrame:
    folder.mkdir()
    for i, rows in enumerate(batches):
        path = folder / f"part-{i:03d}.parquet"
        pq.write_table(pa.Table.from_pylist(list(rows), schema=EVENTS), path)
        os.utime(path, (1_700_000_000 + i, 1_700_000_000 + i))
    ddl = ", ".join(f"{f.name} {_SQL[f.type]}" for f in EVENTS)
    return spark.readStream.schema(ddl).option("maxFilesPerTrigger", 1).parquet(str(folder))


def _rows(frame: DataFrame) -> list[dict[str, Any]]:
    table = frame.toArrow()
    if "rows" in table.column_names:
        table = unpack(table["rows"], OUTPUT_ARROW_SCHEMA)
    out: list[dict[str, Any]] = []
    for row in table.select(OUTPUT_ARROW_SCHEMA.names).to_pylist():
        if row["kind"] == "late":
            for offset in row["offsets"]:
                out.append(
                    {
                        **row,
                        "events": 1,
                        "src_offset": offset,
                        "src_offset_end": offset,
                        "offsets": [offset],
                    }
                )
        else:
            out.append(row)
    return sorted(out, key=lambda r: tuple(str(v) for v in r.values()))


def _run(
    spark: SparkSession,
    tmp_path: Path,
    batches: Sequence[Sequence[dict[str, Any]]],
    engine: str,
    **options: Any,
) -> list[list[dict[str, Any]]]:
    events = _stream(spark, tmp_path / f"events-{engine}", batches)
    if "gap_ms" in options:
        out = aggregate_sessions(events, engine=engine, **options)
    else:
        out = aggregate_windows(events, engine=engine, **options)
    seen: list[list[dict[str, Any]]] = []

    def collect(frame: DataFrame, batch_id: int) -> None:
        seen.append(_rows(frame))

    query = (
        out.writeStream.outputMode("update")
        .option("checkpointLocation", str(tmp_path / f"checkpoint-{engine}"))
        .foreachBatch(collect)
        .trigger(availableNow=True)
        .start()
    )
    try:
        assert query.awaitTermination(180), "the query did not finish in 180 s"
    finally:
        query.stop()
    return seen


def _both(
    spark: SparkSession, tmp_path: Path, batches: Sequence[Sequence[dict[str, Any]]], **options: Any
) -> list[list[dict[str, Any]]]:
    python = _run(spark, tmp_path, batches, "python", **options)
    jvm = _run(spark, tmp_path, batches, "jvm", **options)
    assert len(jvm) == len(python)
    for b, (ours, theirs) in enumerate(zip(jvm, python, strict=True)):
        differ = [(o, t) for o, t in zip(ours, theirs, strict=False) if o != t]
        assert ours == theirs, f"batch {b} differs: first (jvm, python) {differ[:1]}"
    return jvm


def test_tumbling_windows_change_finalise_correct_close_and_refuse_late_events_alike(
    spark: SparkSession, tmp_path: Path
) -> None:
    batches = [
        [_event("a", 1_000, 0, amount=10), _event("b", 2_000, 1), _event("a", 61_000, 2)],
        [_event("b", 121_000, 3, price=2.25)],
        [_event("a", 62_000, 4, amount=5), _event("a", 3_000, 5, amount=4)],
        [_event("b", 185_000, 6), _event("a", 64_000, 7, price=None, amount=None)],
        [_event("c", 400_000, 8)],
    ]
    seen = _both(
        spark,
        tmp_path,
        batches,
        keys=["shop"],
        aggregates=ALL,
        size_ms=60_000,
        slide_ms=None,
        watermark_ms=0,
        lateness_ms=30_000,
        id_column=None,
    )
    kinds = {r["kind"] for rows in seen for r in rows}
    # The streams exercise every kind of row the writer routes.
    assert kinds == {"stats", "provisional", "final", "correction", "late", "closed"}, kinds


def test_sliding_windows_with_ids_count_each_id_once_per_window_alike(
    spark: SparkSession, tmp_path: Path
) -> None:
    batches = [
        [
            _event("a", 1_000, 0, id="x", user="p"),
            _event("a", 2_000, 1, id="x", user="q"),
            _event("a", 3_000, 2, id=None, user="r"),
            _event("b", 25_000, 3, id="y", price=-0.0),
        ],
        [
            _event("a", 21_000, 4, id="x"),
            _event("a", 41_000, 5, id="z", price=1e-7),
            # x again, in the window where it was first counted: a batch later.
            _event("a", 2_500, 9, id="x"),
        ],
        [_event("b", 95_000, 6, id="y", price=1e17), _event("b", 26_000, 7, id="w")],
        [_event("a", 200_000, 8, id="v")],
    ]
    seen = _both(
        spark,
        tmp_path,
        batches,
        keys=["shop"],
        aggregates=ALL,
        size_ms=60_000,
        slide_ms=20_000,
        watermark_ms=5_000,
        lateness_ms=20_000,
        id_column="id",
    )
    stats = [r for rows in seen for r in rows if r["kind"] == "stats"]
    # x twice in its first window: once within batch 0, once from the state in batch 1.
    assert sum(r["duplicates"] for r in stats) == 2


def test_dead_letters_and_keys_of_several_columns_alike(
    spark: SparkSession, tmp_path: Path
) -> None:
    batches = [
        [_event("a", 1_000, 0), _dead(1, "not JSON", b"{oops"), _event(None, 2_000, 2)],
        [_dead(3, "missing field", b'{"x": 1}'), _event('a\u00e9"q', 3_000, 4, user=None)],
        [_event("a", 130_000, 5)],
    ]
    seen = _both(
        spark,
        tmp_path,
        batches,
        keys=["shop", "user"],
        aggregates={"n": kf.count(), "users": kf.approx_distinct("amount")},
        size_ms=60_000,
        slide_ms=None,
        watermark_ms=0,
        lateness_ms=0,
        id_column=None,
        dead_letters=True,
    )
    dead = [r for rows in seen for r in rows if r["kind"] == "dlq"]
    assert [(r["src_offset"], r["value"]) for r in dead] == [(1, b"{oops"), (3, b'{"x": 1}')]


def test_sessions_grow_bridge_finalise_close_and_refuse_late_events_alike(
    spark: SparkSession, tmp_path: Path
) -> None:
    batches = [
        [_event("a", 1_000, 0, id="x"), _event("a", 5_000, 1, id="y"), _event("b", 2_000, 2)],
        # Starts a second session of a, then bridges it to the first; x again.
        [_event("a", 30_000, 3), _event("a", 1_500, 4, id="x"), _event("a", 14_000, 5)],
        # An earlier start for a's session (a correction retracting the old start).
        [_event("a", 500, 6, price=3.0), _event("b", 60_000, 7), _dead(8, "bad", b"\x00")],
        [_event("c", 200_000, 9)],
        # Far behind the watermark, touching nothing held: late; b's session is gone.
        [_event("b", 3_000, 10), _event("c", 205_000, 11, amount=None)],
        [_event("d", 400_000, 12)],
    ]
    seen = _both(
        spark,
        tmp_path,
        batches,
        keys=["shop"],
        aggregates=ALL,
        gap_ms=10_000,
        watermark_ms=2_000,
        lateness_ms=20_000,
        id_column="id",
        dead_letters=True,
    )
    kinds = {r["kind"] for rows in seen for r in rows}
    assert kinds == {"stats", "provisional", "final", "correction", "late", "closed", "dlq"}, kinds
    retracted = [r for rows in seen for r in rows if r["kind"] == "correction" and not r["values"]]
    assert retracted, "no session was merged away or moved"


def test_an_unknown_engine_is_refused(spark: SparkSession, tmp_path: Path) -> None:
    events = _stream(spark, tmp_path / "events", [[_event("a", 1_000, 0)]])
    spark.conf.set("spark.kappaflow.windows.engine", "gpu")
    try:
        with pytest.raises(WindowSpecError, match="one of python, jvm"):
            aggregate_windows(
                events,
                keys=["shop"],
                aggregates={"n": kf.count()},
                size_ms=60_000,
                slide_ms=None,
                watermark_ms=0,
                lateness_ms=0,
                id_column=None,
            )
    finally:
        spark.conf.unset("spark.kappaflow.windows.engine")


def _python_workers(pid: int) -> list[str]:
    """The command lines of the Python workers Spark started under a job's driver."""
    import psutil

    found = []
    for proc in psutil.Process(pid).children(recursive=True):
        try:
            line = " ".join(proc.cmdline())
        except psutil.NoSuchProcess:
            continue
        if "pyspark.daemon" in line or "pyspark.worker" in line:
            found.append(line)
    return found


@pytest.mark.parametrize("engine", ["jvm", "python"])
def test_a_declarative_windowed_job_on_the_jvm_engine_starts_no_python_worker(
    cli: Any, serving: Any, new_topic: Any, engine: str
) -> None:
    """A job of windows and built-in aggregates only (examples/revenue.py), on the JVM
    engine, counts its orders with no Python worker under its driver; on the Python
    engine, the same job has them (what the assertion tells apart)."""
    import json
    import uuid

    from live_jobs import send_json, stop_if_running, topic_values, wait_job

    from kappaflow.jobs.manager import JobManager
    from test_app_jobs import PATH, order, status

    topic = new_topic()
    job = f"revenue-{engine}-{uuid.uuid4().hex[:6]}"
    orders = [
        order("o1", "ada", "DE", 10.0, "2026-11-23T10:00:05Z"),
        order("o2", "bob", "DE", 5.0, "2026-11-23T10:00:15Z"),
        order("o1", "ada", "DE", 10.0, "2026-11-23T10:00:05Z"),
        order("o3", "cy", "FR", 2.5, "2026-11-23T10:00:20Z"),
    ]
    send_json(serving, topic, [*orders, b"{not json"], key="buyer")
    conf = json.dumps({"spark.kappaflow.windows.engine": engine})
    env = {"PYTHONPATH": PATH, "KAPPAFLOW_SPARK__CONF": conf}
    started = cli("jobs", "start", job, "--app", "revenue:build", "-P", f"topic={topic}", env=env)
    assert started.code == 0, started.err
    try:

        def accounted() -> dict[str, Any] | None:
            revenue = status(cli, job)["outputs"].get("revenue", {})
            done = revenue.get("events", 0) >= 3 and revenue.get("dead_letters", 0) >= 1
            return revenue if done else None

        totals = wait_job(serving, job, accounted, what=f"{job} to count its orders")
        assert (totals["events"], totals["duplicates"], totals["dead_letters"]) == (3, 1, 1)
        changes = topic_values(serving, f"{job}.revenue", at_least=2)
        latest = {c["country"]: c["values"] for c in changes}
        assert latest["DE"]["total"] == 15.0 and latest["DE"]["orders"] == 2
        assert latest["FR"] == {"total": 2.5, "mean": 2.5, "buyers": 1, "orders": 1}
        pid = JobManager(serving).get(job).pid
        assert pid is not None
        workers = _python_workers(pid)
        if engine == "jvm":
            assert workers == []
        else:
            assert workers, "the Python engine's job shows no Python worker: the check sees none"
    finally:
        stop_if_running(serving, job)


@pytest.mark.parametrize("sessions", [False, True], ids=["windows", "sessions"])
def test_the_state_reader_reads_either_operators_state_alike(
    spark: SparkSession, tmp_path: Path, sessions: bool
) -> None:
    """`kappaflow counts --from-state` reads a count's state from its checkpoint: the
    Java operator's layout (streams/ops/jvm_state.py) gives what the Python one's does,
    keys of any text included."""
    from kappaflow.counting.state import read_counts
    from kappaflow.streams.window_engine import checkpoint_engine

    odd = 'a\u00e9"q\U0001f600\u0000'
    batches = [
        [_event("a", 1_000, 0, id="x"), _event(odd, 2_000, 1), _event("a", 61_000, 2, id="y")],
        [_event("b", 121_000, 3), _event("a", 1_500, 4, id="x"), _event(odd, 2_500, 5)],
        [_event("b", 125_000, 6)],
    ]
    window: dict[str, Any] = (
        {"gap_ms": 10_000} if sessions else {"size_ms": 60_000, "slide_ms": None}
    )
    held = {}
    for engine in ("python", "jvm"):
        _run(
            spark,
            tmp_path,
            batches,
            engine,
            keys=["shop"],
            aggregates={"count": kf.count()},
            watermark_ms=1_000,
            lateness_ms=300_000,
            id_column="id",
            **window,
        )
        checkpoint = str(tmp_path / f"checkpoint-{engine}")
        assert checkpoint_engine(spark, checkpoint) == engine
        held[engine] = read_counts(spark, checkpoint, window_ms=None if sessions else 60_000)
    assert held["jvm"] == held["python"]
    counts = {(w.key, w.window_start): (w.count, w.final) for w in held["jvm"]}
    if sessions:
        assert counts[("a", 1_000)] == (1, True) and counts[(odd, 2_000)] == (2, True)
        assert counts[("b", 121_000)] == (2, False)
    else:
        assert counts[("a", 0)] == (1, True) and counts[(odd, 0)] == (2, True)
        assert counts[("b", 120_000)] == (2, False)
    assert max(w.version for w in held["jvm"]) >= 2
