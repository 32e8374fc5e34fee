"""The engine's JSON parser (JsonRows.java): the typed row or the reason, as the SQL path.

Every record here is parsed twice, by the engine's parser and by the SQL path it replaces
(``from_json``, its checks and the variant verdict), in one DataFrame each; the two must
agree on every value and every reason. Then the edge cases are asserted one by one.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import pytest
from pyspark.sql import Row, SparkSession

from kappaflow.streams.ops import parsing
from kappaflow.streams.ops.parsing import parse_records
from kappaflow.streams.schema import EventTime, RecordSchema, compile_schema

RAW = "key BINARY, value BINARY, topic STRING, partition INT, offset BIGINT, timestamp TIMESTAMP"


@dataclass
class Geo:
    lat: float
    city: str
    zip: str | int | None = None


@dataclass
class Line:
    sku: str
    qty: int
    tags: list[str | None] | None = None


@dataclass
class Event:
    at: EventTime
    user: Geo
    n: int
    score: float
    ok: bool
    code: str | int
    when: datetime | None
    lines: list[Line]
    note: str | None = None


GOOD = (
    '{"at": 1700000000123, "user": {"lat": 1.5, "city": "Z\\u00fcrich"}, "n": 3, '
    '"score": 2, "ok": true, "code": "a", "when": null, "lines": []}'
)


def _with(**changes: str) -> str:
    """GOOD with top-level fields replaced by the given JSON texts ('-': removed)."""
    record = json.loads(GOOD)
    text = {k: json.dumps(v) for k, v in record.items()}
    for name, value in changes.items():
        if value == "-":
            text.pop(name, None)
        else:
            text[name] = value
    return "{" + ", ".join(f'"{k}": {v}' for k, v in text.items()) + "}"


CASES: list[bytes | None] = [
    GOOD.encode(),
    None,
    b"",
    b"   ",
    b"{",
    b"[1, 2]",
    b"null",
    b'"text"',
    b'{"at": 1} trailing',
    b'{"at": 1700000000123, "at": 1700000000124, "user": {"lat": 1, "city": "c"}, "n": 1, '
    b'"score": 1, "ok": false, "code": 1, "when": null, "lines": []}',
    b'{"n": 1, "n": "x"}',
    GOOD.replace('"a"', '"caf\xc3"').encode("latin-1"),
    # ints
    _with(n="9223372036854775807").encode(),
    _with(n="9223372036854775808").encode(),
    _with(n="-9223372036854775809").encode(),
    _with(n="1.0").encode(),
    _with(n="1e3").encode(),
    _with(n='"3"').encode(),
    _with(n="null").encode(),
    _with(n="-").encode(),
    _with(n="true").encode(),
    # floats
    _with(score="1e400").encode(),
    _with(score="-0.0").encode(),
    _with(score="12345678901234567890").encode(),
    _with(score='"NaN"').encode(),
    _with(score="NaN").encode(),
    _with(score="[]").encode(),
    # booleans
    _with(ok='"true"').encode(),
    _with(ok="1").encode(),
    # text
    _with(code="1e3").encode(),
    _with(code="1.10").encode(),
    _with(code="-0").encode(),
    _with(code="12345678901234567890").encode(),
    _with(code="1e400").encode(),
    _with(code='"true"').encode(),
    _with(code='"{x"').encode(),
    _with(code="true").encode(),
    _with(code="{}").encode(),
    _with(code="[1]").encode(),
    _with(code="null").encode(),
    # strings
    _with(note='"\\ud83d\\ude00 \\u00e9\\n"').encode(),
    _with(note="5").encode(),
    _with(note="null").encode(),
    _with(note="{}").encode(),
    # timestamps
    _with(when='"2026-01-01T10:00:00.123456789+05:30"').encode(),
    _with(when='"2026-01-01 10:00:00+0530"').encode(),
    _with(when='"2026-01-01T10:00:00-05"').encode(),
    _with(when='"2026-01-01T10:00:00.5-00:30"').encode(),
    _with(when='"2026-01-01T10:00:00"').encode(),
    _with(when='"2026-02-30T00:00:00Z"').encode(),
    _with(when='"2026-01-01T24:00:00Z"').encode(),
    _with(when='"2026-01-01T10:00:00+19:00"').encode(),
    _with(when='"2026-01-01T10:00:00+05:61"').encode(),
    _with(when='"2026-01-01T10:00:00.Z"').encode(),
    _with(when='"2026-01-01T10:00:00.1234567890Z"').encode(),
    _with(when="1700000000123").encode(),
    # the event time
    _with(at='"1700000000123"').encode(),
    _with(at='"-5"').encode(),
    _with(at="253402300799999").encode(),
    _with(at="1000000000000000").encode(),
    _with(at='"1000000000000000"').encode(),
    _with(at="1.7e12").encode(),
    _with(at='"2026-01-01T00:00:00Z"').encode(),
    _with(at='"yesterday"').encode(),
    _with(at="null").encode(),
    _with(at="-").encode(),
    # nested objects and lists
    _with(user="5").encode(),
    _with(user="null").encode(),
    _with(user='{"lat": 1}').encode(),
    _with(user='{"lat": 1, "city": null}').encode(),
    _with(user='{"lat": 1, "city": 7}').encode(),
    _with(user='{"lat": "x", "city": "c"}').encode(),
    _with(user='{"lat": 1, "city": "c", "zip": "02139"}').encode(),
    _with(user='{"lat": 1, "city": "c", "zip": 2139}').encode(),
    _with(user='{"lat": 1, "city": "c", "zip": false}').encode(),
    _with(user='{"lat": 1, "city": "c", "extra": {"deep": [1, {"x": null}]}}').encode(),
    _with(lines='[{"sku": "a", "qty": 1, "tags": ["x", null]}, {"sku": "b", "qty": 2}]').encode(),
    _with(lines='[{"sku": "a", "qty": 1}, null]').encode(),
    _with(lines='[{"sku": "a", "qty": 1}, {"sku": 3, "qty": 1}]').encode(),
    _with(lines='[{"sku": "a", "qty": 1}, {"sku": "b"}]').encode(),
    _with(lines='[{"sku": "a", "qty": 1, "tags": [1]}]').encode(),
    _with(lines='[{"sku": "a", "qty": 1.5}]').encode(),
    _with(lines='{"sku": "a"}').encode(),
    _with(lines="null").encode(),
]


def _parse(spark: SparkSession, schema: RecordSchema, jvm: bool) -> list[Row]:
    rows = [(b"k", v, "t", 0, n, datetime(2024, 1, 1, tzinfo=UTC)) for n, v in enumerate(CASES)]
    raw = spark.createDataFrame(rows, RAW)
    before = parsing.JVM_PARSER
    parsing.JVM_PARSER = jvm
    try:
        out = parse_records(raw, schema, time="at", keys=["user.city"], id="n")
    finally:
        parsing.JVM_PARSER = before
    # One parse per record: the optimizer must not copy the parser into each field's column.
    plan = out._jdf.queryExecution().optimizedPlan().toString()
    assert plan.count("kf_json_rows(") == (1 if jvm else 0), plan
    return sorted(out.collect(), key=lambda r: r["_kf_offset"])


@pytest.fixture(scope="module")
def both(spark: SparkSession) -> tuple[list[Row], list[Row]]:
    schema = compile_schema(Event)
    return _parse(spark, schema, jvm=True), _parse(spark, schema, jvm=False)


def test_the_engine_parser_agrees_with_the_sql_path_on_every_record(
    both: tuple[list[Row], list[Row]],
) -> None:
    jvm, sql = both
    assert len(jvm) == len(sql) == len(CASES)
    differences = [
        (CASES[i], a.asDict(recursive=True), b.asDict(recursive=True))
        for i, (a, b) in enumerate(zip(jvm, sql, strict=True))
        if a != b
    ]
    assert differences == []


def _row(both: tuple[list[Row], list[Row]], value: bytes | None) -> Row:
    return both[0][CASES.index(value)]


def _reason(both: tuple[list[Row], list[Row]], **changes: str) -> str | None:
    reason: str | None = _row(both, _with(**changes).encode())["_kf_reason"]
    return reason


def test_good_values_and_unicode_escapes(both: tuple[list[Row], list[Row]]) -> None:
    good = _row(both, GOOD.encode())
    assert good["_kf_reason"] is None
    assert good["user"]["city"] == "Zürich"
    assert good["score"] == 2.0 and good["n"] == 3 and good["ok"] is True
    assert good["_kf_time"] == 1700000000123
    assert _row(both, _with(note='"\\ud83d\\ude00 \\u00e9\\n"').encode())["note"] == "😀 é\n"
    # Malformed UTF-8 is replaced, as Spark's cast of the bytes to a string does.
    assert _row(both, CASES[11])["code"] == "caf\ufffd"


def test_number_overflow_and_wrong_types(both: tuple[list[Row], list[Row]]) -> None:
    assert _row(both, _with(n="9223372036854775807").encode())["n"] == 2**63 - 1
    assert _reason(both, n="9223372036854775808") == "field 'n' is not an integer"
    assert _reason(both, n="1.0") == "field 'n' is not an integer"
    assert _reason(both, n='"3"') == "field 'n' is not an integer"
    assert _row(both, _with(score="1e400").encode())["score"] == float("inf")
    assert _reason(both, score='"NaN"') == "field 'score' is not a number"
    assert _reason(both, score="NaN") == "not valid JSON"
    assert _reason(both, ok="1") == "field 'ok' is not a boolean"
    assert _reason(both, note="5") == "field 'note' is not a string"
    assert _reason(both, code="true") == "field 'code' is not a string or a number"
    assert _row(both, _with(code="1e3").encode())["code"] == "1000.0"
    assert _row(both, _with(code='"true"').encode())["code"] == "true"


def test_missing_required_null_and_records_that_are_not_objects(
    both: tuple[list[Row], list[Row]],
) -> None:
    assert _reason(both, n="-") == "missing field 'n'"
    assert _reason(both, n="null") == "field 'n' is null"
    assert _reason(both, at="-") == "missing time field 'at'"
    assert _reason(both, user="null") == "missing key field 'user.city'"
    assert _reason(both, user='{"lat": 1, "city": 7}') == "key field 'user.city' is not a string"
    assert _row(both, _with(note="null").encode())["_kf_reason"] is None
    assert [_row(both, v)["_kf_reason"] for v in CASES[1:8]] == [
        "empty record",
        "empty record",
        "not valid JSON",
        "not valid JSON",
        "not a JSON object",
        "not a JSON object",
        "not a JSON object",
    ]


def test_timestamps_with_offsets_and_epoch_milliseconds(
    both: tuple[list[Row], list[Row]],
) -> None:
    when = _row(both, _with(when='"2026-01-01T10:00:00.123456789+05:30"').encode())["when"]
    assert when.astimezone(UTC) == datetime(2026, 1, 1, 4, 30, 0, 123456, tzinfo=UTC)
    minus = _row(both, _with(when='"2026-01-01T10:00:00.5-00:30"').encode())["when"]
    assert minus.astimezone(UTC) == datetime(2026, 1, 1, 10, 30, 0, 500000, tzinfo=UTC)
    assert _reason(both, when='"2026-01-01T10:00:00"') == (
        "field 'when' is not a timestamp (ISO-8601 with a zone)"
    )
    assert _reason(both, when='"2026-01-01T10:00:00+19:00"') is not None
    assert _reason(both, when='"2026-02-30T00:00:00Z"') is not None
    assert _row(both, _with(at='"1700000000123"').encode())["_kf_time"] == 1700000000123
    assert _row(both, _with(at="253402300799999").encode())["_kf_time"] == 253402300799999
    assert _reason(both, at="1000000000000000") == (
        "time field 'at' is not epoch milliseconds or ISO-8601 with a zone"
    )
    iso = _row(both, _with(at='"2026-01-01T00:00:00Z"').encode())
    epoch = datetime(1970, 1, 1, tzinfo=UTC) + timedelta(milliseconds=iso["_kf_time"])
    assert epoch == datetime(2026, 1, 1, tzinfo=UTC)


def test_nested_objects_and_lists(both: tuple[list[Row], list[Row]]) -> None:
    lines = '[{"sku": "a", "qty": 1, "tags": ["x", null]}, {"sku": "b", "qty": 2}]'
    row = _row(both, _with(lines=lines).encode())
    assert [line.asDict() for line in row["lines"]] == [
        {"sku": "a", "qty": 1, "tags": ["x", None]},
        {"sku": "b", "qty": 2, "tags": None},
    ]
    assert (
        _row(both, _with(user='{"lat": 1, "city": "c", "zip": 2139}').encode())["user"]["zip"]
        == "2139"
    )
    assert _reason(both, lines='[{"sku": "a", "qty": 1}, null]') == "field 'lines[1]' is null"
    assert _reason(both, lines='[{"sku": "a", "qty": 1}, {"sku": 3, "qty": 1}]') == (
        "field 'lines[1].sku' is not a string"
    )
    assert _reason(both, lines='[{"sku": "a", "qty": 1}, {"sku": "b"}]') == (
        "missing field 'lines[1].qty'"
    )
    assert _reason(both, lines='[{"sku": "a", "qty": 1, "tags": [1]}]') == (
        "field 'lines[0].tags[0]' is not a string"
    )
    assert _reason(both, user='{"lat": 1, "city": "c", "zip": false}') == (
        "field 'user.zip' is not a string or a number"
    )
    extra = '{"lat": 1, "city": "c", "extra": {"deep": [1, {"x": null}]}}'
    assert _row(both, _with(user=extra).encode())["_kf_reason"] is None
