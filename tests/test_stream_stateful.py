"""Per-key stateful functions: the processor under TwsTester, then a job through the harness.

As in test_stream_windows.py, every row reports to TwsTester an event time no watermark
reaches: the real query hands the operator late rows too (the watermark is declared on a
column dropped before it), and the processor decides what is late itself.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, cast

import pytest
from pydantic import BaseModel
from pyspark.sql import Row, SparkSession
from pyspark.sql.streaming import StreamingQuery, TwsTester

from kappaflow.errors import KappaflowError, StateIncompatibleError
from kappaflow.jobs.plan import record_plan, signature, verify_restart
from kappaflow.streams import runtime
from kappaflow.streams.job import Job, Stream
from kappaflow.streams.ops.stateful_run import OFFSET, PARTITION, RECORD, TIME, KeyedProcessor
from kappaflow.streams.output.lake_fs import HadoopFs
from kappaflow.streams.runtime import declare
from kappaflow.streams.sinks import lake, topic
from kappaflow.streams.stateful import StateContext, StatefulFunction, stateful
from kappaflow.testing import BatchFiles, run

NEVER_LATE = 2**62
T0 = 1_795_000_000_000  # an instant in 2026, in epoch ms
MINUTE = 60_000


@dataclass
class Reading:
    device: str
    temperature: float
    at: datetime
    note: str | None = None


@dataclass
class Seen:
    device: str
    count: int
    times: list[int]
    late: bool
    at: datetime


@dataclass
class Tally:
    count: int = 0
    times: list[int] = field(default_factory=list)
    first: datetime | None = None


def ms(when: datetime) -> int:
    return int(when.timestamp() * 1000)


def at(t: int) -> datetime:
    return datetime.fromtimestamp(t / 1000, UTC)


def keyed(function: StatefulFunction[Any], lateness_ms: int = 0) -> TwsTester:
    return TwsTester(
        KeyedProcessor(function, Reading, lateness_ms),
        timeMode="EventTime",
        eventTimeExtractor=lambda _row: NEVER_LATE,
    )


def readings(*events: tuple[int, float], offset: int = 0, partition: int = 0) -> list[Row]:
    """Rows as the operator gets them: (event time, temperature) each, at offsets from
    ``offset``; the record JSON as Spark's to_json writes it (a null field left out)."""
    return [
        Row(
            **{
                RECORD: json.dumps({"device": "d1", "temperature": v, "at": at(t).isoformat()}),
                TIME: t,
                PARTITION: partition,
                OFFSET: offset + i,
            }
        )
        for i, (t, v) in enumerate(events)
    ]


def all_rows(rows: Any) -> list[dict[str, Any]]:
    assert isinstance(rows, list) and all(isinstance(r, Row) for r in rows)
    return [r.asDict() for r in rows]


def rows_of(rows: Any) -> list[dict[str, Any]]:
    """The rows the writer publishes (records and late events), not the statistics."""
    return [r for r in all_rows(rows) if r["kind"] != "stats"]


def records(rows: Any) -> list[dict[str, Any]]:
    return [json.loads(r["row"]) for r in rows_of(rows) if r["kind"] == "record"]


def feed(t: TwsTester, rows: list[Row]) -> Any:
    return t.test("d1", rows)


def stored(t: TwsTester) -> tuple[dict[str, Any], int | None, list[int]] | None:
    value = t.peekValueState("state", "d1")
    if value is None:
        return None
    text, expires, timers = value
    return json.loads(text), expires, list(timers)


def spark_timers(t: TwsTester) -> list[int]:
    t.handle.setGroupingKey("d1")
    return list(t.handle.listTimers())


@stateful(state=Tally, output=Seen, late="function")
def tally(key: tuple[Any, ...], events: list[Reading], ctx: StateContext[Tally]) -> Iterator[Seen]:
    s = ctx.state
    for e in events:
        assert isinstance(e, Reading) and e.note is None
        s.count += 1
        s.times.append(ms(e.at))
        s.first = s.first or e.at
        yield Seen(key[0], s.count, list(s.times), ctx.is_late(e), e.at)


def test_state_is_kept_across_calls_and_events_come_in_event_time_order() -> None:
    t = keyed(tally)
    out = feed(t, readings((T0 + 2_000, 1.0), (T0 + 1_000, 2.0)))
    assert [(s["count"], s["times"]) for s in records(out)] == [
        (1, [T0 + 1_000]),
        (2, [T0 + 1_000, T0 + 2_000]),
    ]
    first = records(out)[0]
    assert first == {
        "device": "d1",
        "count": 1,
        "times": [T0 + 1_000],
        "late": False,
        "at": "2026-11-18T11:06:41.000Z",
    }
    rows = all_rows(out)
    assert {(r["kind"], r["key"], r["time"]) for r in rows if r["kind"] == "record"} == {
        ("record", '["d1"]', T0 + 2_000)
    }
    # The events that reached the function, for the output's accounting.
    assert [(r["key"], r["events"]) for r in rows if r["kind"] == "stats"] == [('["d1"]', 2)]
    out = feed(t, readings((T0 + 3_000, 3.0), offset=2))
    assert [(s["count"], s["times"][-1]) for s in records(out)] == [(3, T0 + 3_000)]
    state = stored(t)
    assert state is not None
    assert state[0] == {
        "count": 3,
        "times": [T0 + 1_000, T0 + 2_000, T0 + 3_000],
        "first": "2026-11-18T11:06:41.000000Z",
    }
    assert state[1:] == (None, [])


@dataclass
class Silence:
    last: int = 0
    alarmed: bool = False


@stateful(state=Silence, output=Seen)
def watchdog(
    key: tuple[Any, ...], events: list[Reading], ctx: StateContext[Silence]
) -> Iterator[Seen]:
    for e in events:
        if ctx.state.last:
            ctx.timers.cancel(ctx.state.last + 5 * MINUTE)
        ctx.state.last = ms(e.at)
        ctx.timers.at(e.at + timedelta(minutes=5))
    return iter(())


@watchdog.on_timer
def _silent(key: tuple[Any, ...], at_ms: int, ctx: StateContext[Silence]) -> Iterator[Seen]:
    ctx.state.alarmed = True
    yield Seen(key[0], 0, [at_ms, ctx.watermark], False, at(at_ms))


def test_timers_fire_when_the_watermark_passes_them_and_a_cancelled_one_does_not() -> None:
    t = keyed(watchdog)
    assert rows_of(feed(t, readings((T0, 1.0)))) == []
    assert spark_timers(t) == [T0 + 5 * MINUTE]
    feed(t, readings((T0 + MINUTE, 1.0), offset=1))
    assert spark_timers(t) == [T0 + 6 * MINUTE]  # moved, not added
    assert rows_of(t.setWatermark(T0 + 5 * MINUTE)) == []
    out = t.setWatermark(T0 + 7 * MINUTE)
    assert [(s["times"], s["at"]) for s in records(out)] == [
        ([T0 + 6 * MINUTE, T0 + 7 * MINUTE], "2026-11-18T11:12:40.000Z")
    ]
    assert rows_of(out)[0]["time"] == T0 + 6 * MINUTE
    state = stored(t)
    assert state is not None and state[0]["alarmed"] is True and state[2] == []
    assert spark_timers(t) == []


def test_a_timer_at_or_behind_the_watermark_fires_in_the_same_call() -> None:
    t = keyed(watchdog, lateness_ms=10 * MINUTE)
    t.setWatermark(T0 + 8 * MINUTE)
    # Within the allowed lateness: not late, but its timer (T0 + 5 min) is already due.
    out = feed(t, readings((T0, 1.0)))
    assert [s["times"] for s in records(out)] == [[T0 + 5 * MINUTE, T0 + 8 * MINUTE]]
    assert spark_timers(t) == []


@stateful(state=Tally, output=Seen, ttl="10m", late="function")
def forgetful(
    key: tuple[Any, ...], events: list[Reading], ctx: StateContext[Tally]
) -> Iterator[Seen]:
    yield from tally.function(key, events, ctx)
    ctx.timers.at(ms(events[-1].at) + 30 * MINUTE)


def test_ttl_forgets_a_key_ten_minutes_after_its_latest_event() -> None:
    t = keyed(forgetful)
    feed(t, readings((T0, 1.0)))
    feed(t, readings((T0 + 2 * MINUTE, 1.0), offset=1))
    state = stored(t)
    assert state is not None and state[1] == T0 + 12 * MINUTE
    assert spark_timers(t) == [T0 + 12 * MINUTE, T0 + 30 * MINUTE, T0 + 32 * MINUTE]
    t.setWatermark(T0 + 11 * MINUTE)
    assert stored(t) is not None
    assert rows_of(t.setWatermark(T0 + 12 * MINUTE)) == []
    assert stored(t) is None and spark_timers(t) == []  # state and the user's timer
    out = feed(t, readings((T0 + 13 * MINUTE, 1.0), offset=2))
    assert [s["count"] for s in records(out)] == [1]  # a new key's state


def test_late_events_reach_the_function_flagged() -> None:
    t = keyed(tally)
    t.setWatermark(T0 + MINUTE)
    out = feed(t, readings((T0 + MINUTE, 1.0), (T0 + 2 * MINUTE, 2.0)))
    assert [(s["late"], s["times"][-1]) for s in records(out)] == [
        (True, T0 + MINUTE),  # at the watermark: late
        (False, T0 + 2 * MINUTE),
    ]


@stateful(state=Tally, output=Seen, late="topic")
def strict(key: tuple[Any, ...], events: list[Reading], ctx: StateContext[Tally]) -> Iterator[Seen]:
    yield from tally.function(key, events, ctx)


def test_late_events_go_to_the_late_topic_with_their_offset_and_never_reach_the_function() -> None:
    t = TwsTester(
        KeyedProcessor(strict, Reading, 30_000),
        timeMode="EventTime",
        eventTimeExtractor=lambda _row: NEVER_LATE,
    )
    t.setWatermark(T0 + MINUTE)
    frame = readings((T0 + 30_000, 1.0), (T0 + 31_000, 2.0), offset=7, partition=3)
    out = all_rows(feed(t, frame))
    [late, record, stats] = sorted(out, key=lambda r: r["kind"])
    assert stats["events"] == 1  # the late event did not reach the function
    assert (late["kind"], late["src_partition"], late["src_offset"]) == ("late", 3, 7)
    assert list(late["offsets"]) == [7] and late["watermark"] == T0 + MINUTE
    assert late["reason"] == (
        'late: event time 2026-11-18T11:07:10.000Z of key ["d1"] is at or behind the '
        "watermark 2026-11-18T11:07:40.000Z less the allowed lateness 30000 ms (strict)"
    )
    assert json.loads(record["row"])["times"] == [T0 + 31_000]
    # Only late events: the function is not called and the state does not change.
    assert rows_of(feed(t, readings((T0, 1.0), offset=9)))[0]["kind"] == "late"
    state = stored(t)
    assert state is not None and state[0]["count"] == 1


def test_state_without_defaults_or_a_late_mode_or_ttl_that_makes_no_sense_is_refused() -> None:
    @dataclass
    class NoDefault:
        count: int

    cases: list[tuple[dict[str, Any], str, str]] = [
        ({"state": dict}, "KF742", "is not a dataclass"),
        ({"state": NoDefault}, "KF742", "give every field a default"),
        ({"output": str}, "KF743", "is not a dataclass or pydantic model class"),
        ({"late": "drop"}, "KF744", "stateful(late='drop'): use 'function' or 'topic'"),
        ({"ttl": "0s"}, "KF746", "stateful(ttl='0s'): give a positive duration"),
        ({"ttl": "soon"}, "KF746", "give a positive duration"),
    ]
    for change, code, says in cases:
        arguments: dict[str, Any] = {"state": Tally, "output": Seen, **change}
        with pytest.raises(KappaflowError) as raised:
            stateful(**arguments)
        assert raised.value.code == code, change
        assert says in str(raised.value)


def bad_function(body: Any, state: type = Tally) -> StatefulFunction[Any]:
    return stateful(state=state, output=Seen)(body)


def test_a_wrong_output_a_naive_datetime_a_state_that_no_longer_fits_and_a_timer_loop_fail() -> (
    None
):
    def wrong(key: Any, events: list[Reading], ctx: Any) -> Iterator[Any]:
        yield {"device": "d1"}

    def naive(key: Any, events: list[Reading], ctx: Any) -> Iterator[Any]:
        yield Seen("d1", 1, [], False, datetime(2026, 11, 23, 10))  # noqa: DTZ001

    def looping(key: Any, events: list[Reading], ctx: Any) -> Iterator[Any]:
        ctx.timers.at(1)
        return iter(())

    def again(key: Any, at_ms: int, ctx: Any) -> Iterator[Any]:
        ctx.timers.at(at_ms + 1)
        return iter(())

    loop = bad_function(looping)
    loop.on_timer(again)
    for function, code, says in [
        (bad_function(wrong), "KF747", "wrong yielded a dict, not a Seen"),
        (bad_function(naive), "KF747", "Seen.at is a datetime without a zone"),
        (loop, "KF749", "set 1000 timers at or behind the watermark"),
    ]:
        t = keyed(function)
        t.setWatermark(T0)
        with pytest.raises(KappaflowError) as raised:
            feed(t, readings((T0 + 1_000, 1.0)))
        assert (raised.value.code, function.name) == (code, function.name)
        assert says in str(raised.value)

    t = keyed(tally)
    t.updateValueState("state", "d1", ('{"count": "three"}', None, []))
    with pytest.raises(KappaflowError) as raised:
        feed(t, readings((T0, 1.0)))
    assert raised.value.code == "KF748"
    assert 'tally: the stored state of key ["d1"] does not fit Tally: Tally.count is' in str(
        raised.value
    )


def test_state_evolves_by_field_name() -> None:
    """A stored field the type no longer has is dropped; a new one takes its default."""
    t = keyed(tally)
    t.updateValueState("state", "d1", ('{"count": 4, "gone": 1}', None, []))
    out = feed(t, readings((T0, 1.0)))
    assert [(s["count"], s["times"]) for s in records(out)] == [(5, [T0])]


# Through the job API: what Stream.process refuses (the harness declares the job first).


@dataclass
class Bad:
    device: str
    counts: dict[str, int]


def _plain(key: Any, events: list[Reading], ctx: Any) -> Iterator[Seen]:
    return iter(())


@pytest.mark.parametrize(
    ("process", "code", "says"),
    [
        (lambda s: s.process(_plain, by="device"), "KF741", "process(_plain): decorate it"),
        (lambda s: s.process(tally, by="room"), "KF745", "by=['room']): no column 'room'"),
        (lambda s: s.process(tally, by=()), "KF745", "name at least one key column"),
        (
            lambda s: s.select("device", "at").process(tally, by="device"),
            "KF745",
            "no column 'temperature' for Reading.temperature",
        ),
        (
            lambda s: s.process(stateful(state=Tally, output=Bad)(_plain), by="device"),
            "KF743",
            "_plain: output type: Bad.counts: type dict",
        ),
        (
            lambda s: s.process(tally, by="device").where("count > 1"),
            "KF731",
            "a processed stream is written as it is",
        ),
    ],
)
def test_process_refuses_a_plain_function_unknown_columns_and_an_output_that_does_not_compile(
    spark: SparkSession, process: Callable[[Stream], Any], code: str, says: str
) -> None:
    def build(job: Job) -> None:
        process(job.source("readings", Reading, key="device", time="at")).to(topic())

    with pytest.raises(KappaflowError) as raised:
        run(build, {"readings": [[]]}, spark=spark)
    assert raised.value.code == code
    assert says in str(raised.value)


class ModelReading(BaseModel):
    device: str
    temperature: float
    at: datetime
    tags: list[str] = []


class ModelSeen(BaseModel):
    device: str
    hottest: float
    at: datetime


@stateful(state=Tally, output=ModelSeen)
def hottest(
    key: tuple[Any, ...], events: list[ModelReading], ctx: StateContext[Tally]
) -> Iterator[ModelSeen]:
    top = max(events, key=lambda e: e.temperature)
    assert isinstance(top, ModelReading) and top.tags == []
    yield ModelSeen(device=key[0], hottest=top.temperature, at=top.at)


def test_pydantic_records_in_and_out() -> None:
    t = TwsTester(
        KeyedProcessor(hottest, ModelReading, 0),
        timeMode="EventTime",
        eventTimeExtractor=lambda _row: NEVER_LATE,
    )
    out = feed(t, readings((T0, 70.5), (T0 + 1_000, 90.25)))
    assert records(out) == [{"device": "d1", "hottest": 90.25, "at": "2026-11-18T11:06:41.000Z"}]


def test_a_job_hands_late_events_to_the_function_flagged_and_writes_its_output(
    spark: SparkSession,
) -> None:
    """Through Spark: the late event reaches the operator (the watermark is declared on a
    column dropped before it), the output is keyed by the function's key in Kafka and
    typed in the lake."""

    def build(job: Job) -> None:
        readings = job.source("readings", Reading, key="device", time="at", watermark="0s")
        readings.process(tally, by="device").to(topic(), lake("seen"))

    def reading(device: str, t: int) -> dict[str, Any]:
        return {"device": device, "temperature": 1.0, "at": at(t).isoformat()}

    batches = [
        [reading("d1", T0 + 10_000), reading("d2", T0 + 5_000)],
        # The watermark is T0 + 10 s: the first reading is late.
        [reading("d1", T0 + 1_000), reading("d1", T0 + 20_000)],
    ]
    out = run(build, {"readings": batches}, spark=spark)
    published = [(key, json.loads(value)) for key, value in out.publisher.topics["job.tally"]]
    seen = sorted(published, key=lambda kv: (kv[0], kv[1]["count"]))
    assert [(key, s["device"], s["count"], s["late"], s["at"]) for key, s in seen] == [
        (b'["d1"]', "d1", 1, False, "2026-11-18T11:06:50.000Z"),
        (b'["d1"]', "d1", 2, True, "2026-11-18T11:06:41.000Z"),
        (b'["d1"]', "d1", 3, False, "2026-11-18T11:07:00.000Z"),
        (b'["d2"]', "d2", 1, False, "2026-11-18T11:06:45.000Z"),
    ]
    assert out.late == []
    rows = sorted(out.lake("seen"), key=lambda r: (r["device"], r["count"]))
    assert [(r["device"], r["count"], r["at"]) for r in rows][:2] == [
        ("d1", 1, at(T0 + 10_000)),
        ("d1", 2, at(T0 + 1_000)),
    ]


def test_a_jobs_queries_start_one_after_another(
    spark: SparkSession, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each query of a job starts once the one before has run its first batch: a query's
    first batch starts Python processes that must connect back to Spark in time."""
    # However long the first batch takes on a busy machine.
    monkeypatch.setattr(runtime, "FIRST_BATCH_WAIT_S", 300.0)

    def build(job: Job) -> None:
        readings = job.source("readings", Reading, key="device", time="at", watermark="0s")
        readings.process(tally, by="device", name="first").to(topic())
        readings.process(tally, by="device", name="second").to(topic())

    reading = {"device": "d1", "temperature": 1.0, "at": at(T0).isoformat()}
    out = run(build, {"readings": [[reading]]}, spark=spark)

    def instant(text: str) -> datetime:
        return datetime.fromisoformat(text.replace("Z", "+00:00"))

    first, second = out.progress["job.first"][0], out.progress["job.second"][0]
    first_done = instant(first["timestamp"]) + timedelta(
        milliseconds=first["durationMs"]["triggerExecution"]
    )
    assert instant(second["timestamp"]) >= first_done


class _Starting:
    """A query that has not reported its first trigger yet."""

    name = "job.first"
    isActive = True  # noqa: N815 (the name StreamingQuery gives it)
    lastProgress = None  # noqa: N815


def test_a_stop_asked_while_a_query_starts_starts_no_more(monkeypatch: pytest.MonkeyPatch) -> None:
    """A job asked to stop while its queries start one after another stops waiting for
    the one starting and starts no more."""
    monkeypatch.setattr(runtime, "FIRST_BATCH_WAIT_S", 60.0)
    stopping = threading.Event()
    assert runtime._first_batch([], stopping) is True
    threading.Timer(0.3, stopping.set).start()
    began = time.monotonic()
    assert runtime._first_batch([cast(StreamingQuery, _Starting())], stopping) is False
    # Woken by the stop, not by the deadline.
    assert time.monotonic() - began < runtime.FIRST_BATCH_WAIT_S / 2


def test_a_checkpoint_of_the_pandas_operator_is_refused_with_what_changed(
    spark: SparkSession, tmp_path: Path
) -> None:
    """Stateful functions run on Spark's transformWithState; state an earlier kappaflow kept
    with transformWithStateInPandas does not restore into it (Spark fails on the operator's
    name), so the restart is refused first, naming the operator."""

    def build(job: Job) -> None:
        job.source("readings", Reading, key="device", time="at").process(tally, by="device").to(
            topic()
        )

    reader = BatchFiles(tmp_path / "sources")
    reader.write("readings", [[]])
    job = declare(build, "tallies", {}, spark, reader)
    [output] = job.outputs
    fs = HadoopFs(spark, str(tmp_path / "checkpoints"))
    record_plan(job, fs)
    verify_restart(job, fs, str(tmp_path / "checkpoints"))  # the same plan restarts
    (tmp_path / "checkpoints" / output.name / "state").mkdir(parents=True)
    held = {k: v for k, v in signature(output).items() if k != "operator"}
    fs.write_atomically(f"{output.name}.plan.json", json.dumps(held))
    with pytest.raises(StateIncompatibleError, match="operator: None -> 'transformWithState'") as e:
        verify_restart(job, fs, str(tmp_path / "checkpoints"))
    assert e.value.code == "KF735"
