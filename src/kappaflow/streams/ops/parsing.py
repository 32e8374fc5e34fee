"""Parsing Kafka records into typed rows, in the JVM (no Python UDFs).

Every record either becomes a row of the source's ``RecordSchema`` or carries the reason
it does not fit (``_kf_reason``), naming the field path and the problem, so it can go to
the dead-letter topic with its original bytes, topic, partition and offset.

A source whose schema the engine's parser covers (every kind of field today) is parsed by
it (``JsonRows.java``): one pass of Jackson's streaming parser over each record's bytes
fills the typed row, and a record that does not fit is read again as a tree that names
its first problem in declared order. It accepts what the SQL path below accepts, with the
same values and the same reasons (tests/test_jvm_parser.py holds the two to each other);
the counting benchmark measured it at about four times the SQL path's rate on its events
(benchmarks/counting.md). The SQL path is the fallback, for a kind the engine's parser does
not read, and the reference.

The SQL path's fast path parses each record once with ``from_json`` against a *checking* schema:
the record type with ints as BIGINT, floats as DOUBLE, booleans as BOOLEAN, strings as
VARIANT, timestamps and ``str | int`` text as STRING, plus a corrupt-record column. In
Spark 4.3 a value of the wrong type does not fail the record: ``from_json`` returns the
other fields (partial results) and a null for the bad one, which would be a silent null.
But it also fills the corrupt column with the whole record, so one null check settles
every int, float, boolean, array and object mismatch, at any depth (a fraction or an int
too large for a long, "123" for an int, "NaN" for a float, 5 for an object). What it does
not reject:

* any JSON value for a STRING field (a number becomes its text): so the record's top-level
  strings are read as text and settled by one pass of the engine's streaming JSON parser
  over the record's bytes (``JsonChecks.java``: each is a JSON string, or null or missing
  if optional), and strings nested in objects or arrays are read as variants, settled when
  ``schema_of_variant`` says STRING. A variant and its type's name per string cost more
  than that pass (YSB's six strings: half the parse's time, benchmarks/ysb.md); sending
  numeric-looking text ("02139") to the slow path instead measured four times slower
  when a field holds digit strings;
* any JSON value for a text field (``str | int``), read as text: a number becomes its
  text, as wanted, but an object, an array or a boolean does too, so text that is
  ``true`` or ``false`` or starts with ``{`` or ``[`` goes to the verdict (where a string
  that looks like one is good, and keeps that text);
* nulls and missing fields: required fields (and the key and time fields) must be
  non-null, elements of ``list[T]`` too (``forall``); a JSON null in a variant leaf is
  VOID, not SQL null;
* timestamps, read as text: settled when an ISO-8601-with-zone regex matches and
  ``try_to_timestamp`` parses it (a number's text never matches), or, for ``EventTime``,
  when the text is an integer of up to 15 digits (epoch ms, as a number or a string).

Records the fast path does not settle are judged from their variant form
(``try_parse_json``, ``schema_of_variant``, ``variant_get``), field by field in declared
order, which names the first problem. The variant is a column computed only for those
records (a CASE WHEN), once per record, and the verdict sits in another CASE WHEN, so
Spark evaluates neither for settled records. Both paths apply the same type rules; a
record the verdict finds good keeps its fast-path values, exact then, and one that
``from_json`` marked corrupt never passes. Known differences: ``from_json`` keeps the
last of duplicate keys where the variant refuses the record, and both ignore what
follows the first JSON value. Measured (one core, 100,000 records of a nested 8-field
type): about 4 s, against about 1 s for a bare ``from_json`` to the typed struct; most of
the difference is the verdict's generated code, present though not run (2 s without it).
"""

from __future__ import annotations

import functools
import json
import operator
from collections.abc import Sequence
from dataclasses import dataclass

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.classic.column import Column as ClassicColumn
from pyspark.sql.types import (
    ArrayType,
    BooleanType,
    DataType,
    DoubleType,
    LongType,
    StringType,
    StructField,
    StructType,
    VariantType,
)

from kappaflow.errors import TimeFieldTypeError
from kappaflow.streams.jvm import jvm_engine
from kappaflow.streams.model import REPLAY_COLUMN
from kappaflow.streams.schema import Field, Kind, RecordSchema

_ISO = r"^\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}:\d{2}(\.\d{1,9})?(Z|[+-]\d{2}(:?\d{2})?)$"
_EPOCH_MS = r"^-?\d{1,15}$"
_INTEGER = r"^(BIGINT|INT|SMALLINT|TINYINT)$"
_NUMBER = r"^(BIGINT|INT|SMALLINT|TINYINT|DOUBLE|FLOAT|DECIMAL)"
_CORRUPT = "_kf_corrupt"
_JSON_OPTIONS = {
    "mode": "PERMISSIVE",
    "columnNameOfCorruptRecord": _CORRUPT,
    # Strict JSON, as the variant parser reads it: NaN, 'single quotes' are not JSON.
    "allowNonNumericNumbers": "false",
    "allowSingleQuotes": "false",
}
_PROBLEMS: dict[Kind, str] = {
    "int": "is not an integer",
    "float": "is not a number",
    "str": "is not a string",
    "text": "is not a string or a number",
    "bool": "is not a boolean",
    "array": "is not an array",
    "object": "is not an object",
    "timestamp": "is not a timestamp (ISO-8601 with a zone)",
    "event_time": "is not epoch milliseconds or ISO-8601 with a zone",
}


@dataclass(frozen=True)
class _Node:
    """A field as this record source checks it: required unless optional and not a key
    or time field (``role``, ``role_path``: the key or time field it leads to)."""

    field: Field
    path: str
    required: bool
    role: str | None
    role_path: str
    children: tuple[_Node, ...] = ()
    element: _Node | None = None


def parse_records(
    raw: DataFrame,
    schema: RecordSchema,
    *,
    time: str | None,
    keys: Sequence[str] = (),
    id: str | None = None,
    replays_of: str | None = None,
) -> DataFrame:
    """Kafka source rows → the record's top-level fields, typed, then ``_kf_time`` (epoch
    ms; null without ``time``, as for a reference table's records), ``_kf_reason`` (null
    when the record is good), ``_kf_value`` (original bytes),
    ``_kf_topic``, ``_kf_partition``, ``_kf_offset`` and ``_kf_logged`` (the record's
    Kafka timestamp). Bad records have null fields.

    ``replays_of``: a job's name; then ``_kf_replay`` follows: where in that job's
    dead-letter topic a replayed dead letter came from (``PARTITION:OFFSET``, from its
    headers; null for any other record), and the dead letters of other jobs replayed into
    the same topic are left out: they are those jobs' to count, not this one's."""
    if replays_of is not None:
        raw = _replays(raw, replays_of)
    nodes = _nodes(schema, time=time, keys=keys, id=id)
    judged = _in_jvm(raw, nodes) if JVM_PARSER and _jvm_covers(nodes) else _in_sql(raw, nodes)
    if "_kf_pre_reason" in raw.columns:
        # A reason found before parsing (an Avro record that does not decode) comes first.
        judged = judged.withColumn(
            "_kf_reason", F.coalesce(F.col("_kf_pre_reason"), F.col("_kf_reason"))
        )
    original = F.col("_kf_original") if "_kf_original" in raw.columns else F.col("value")
    good = F.col("_kf_reason").isNull()
    time_value = F.lit(None).cast("timestamp")
    if time is not None:
        top, *rest = time.split(".")
        time_value = F.col(f"_kf_f{[n.field.name for n in nodes].index(top)}")
        for part in rest:
            time_value = time_value.getField(part)
    return judged.select(
        *[
            F.when(good, F.col(f"_kf_f{i}")).cast(n.field.data_type).alias(n.field.name)
            for i, n in enumerate(nodes)
        ],
        F.when(good, F.unix_millis(time_value)).alias("_kf_time"),
        "_kf_reason",
        original.alias("_kf_value"),
        F.col("topic").alias("_kf_topic"),
        F.col("partition").alias("_kf_partition"),
        F.col("offset").alias("_kf_offset"),
        F.col("timestamp").alias("_kf_logged"),
        *([F.col(REPLAY_COLUMN)] if replays_of is not None else []),
    )


#: Whether sources parse in the engine jar (JsonRows.java) where it covers their schema; the
#: SQL path below is the fallback, and the reference the engine's parser is tested against.
JVM_PARSER = True
#: The kinds the engine's parser reads (every kind a record schema has today).
_JVM_KINDS = frozenset(
    ("int", "float", "str", "text", "bool", "timestamp", "event_time", "array", "object")
)


def _jvm_covers(nodes: Sequence[_Node]) -> bool:
    return all(
        n.field.kind in _JVM_KINDS
        and _jvm_covers(n.children)
        and (n.element is None or _jvm_covers([n.element]))
        for n in nodes
    )


def _in_jvm(raw: DataFrame, nodes: tuple[_Node, ...]) -> DataFrame:
    """``raw`` with the typed fields ``_kf_f0``… and ``_kf_reason``, from one pass of the
    engine's streaming parser over each record's bytes (JsonRows.java): the same values and
    the same reasons as the SQL path, without ``from_json``, regular expressions or the
    variant verdict in the plan."""
    spec = json.dumps([_spec(n) for n in nodes])
    parsed = ClassicColumn(jvm_engine(raw.sparkSession).JsonRows.parse(F.col("value")._jc, spec))
    p = F.col("_kf_p")
    return raw.select("*", parsed.alias("_kf_p")).select(
        *raw.columns,
        *[p.getField(f"_kf_f{i}").alias(f"_kf_f{i}") for i in range(len(nodes))],
        p.getField("_kf_reason").alias("_kf_reason"),
    )


def _spec(node: _Node) -> dict[str, object]:
    return {
        "name": node.field.name,
        "kind": node.field.kind,
        "required": node.required,
        "role": node.role,
        "role_path": node.role_path,
        "children": [_spec(c) for c in node.children],
        "element": None if node.element is None else _spec(node.element),
    }


def _in_sql(raw: DataFrame, nodes: tuple[_Node, ...]) -> DataFrame:
    """``raw`` with the typed fields ``_kf_f0``… and ``_kf_reason``, in Spark SQL: the fast
    path, then the variant verdict for the records it does not settle."""
    settled = _fast_path(raw, nodes)
    j = F.col("_kf_j")
    variant = F.try_parse_json(F.col("value").cast("string"))
    return settled.select("*", F.when(~F.col("_kf_settled"), variant).alias("_kf_v")).select(
        "*",
        F.when(F.col("_kf_settled"), F.lit(None).cast("string"))
        .otherwise(
            F.coalesce(
                _verdict(nodes, F.col("_kf_v")),
                # A record from_json could not fit must not pass with partial values.
                F.when(j.getField(_CORRUPT).isNotNull(), F.lit("record does not fit the schema")),
            )
        )
        .alias("_kf_reason"),
    )


#: The headers of a replayed dead letter (jobs/dead_letters.py writes them): the job
#: whose dead letter it is, and the dead letter's ``PARTITION:OFFSET`` in ``JOB.dlq``.
REPLAY_JOB_HEADER = "kf-replay-job"
REPLAY_OF_HEADER = "kf-replay-of"


def _header(name: str) -> Column:
    """The text of the record's header ``name`` (null without one)."""
    found = F.filter(F.col("headers"), lambda h: h.getField("key") == name)
    return F.try_element_at(found, F.lit(1)).getField("value").cast("string")


def _replays(raw: DataFrame, job: str) -> DataFrame:
    """``raw`` with ``_kf_replay``, without the replayed dead letters of other jobs (a
    source without headers, as the test harness's, has no replays)."""
    if "headers" not in raw.columns:
        return raw.withColumn(REPLAY_COLUMN, F.lit(None).cast("string"))
    owner = _header(REPLAY_JOB_HEADER)
    mine = owner == F.lit(job)
    return raw.where(owner.isNull() | mine).withColumn(
        REPLAY_COLUMN, F.when(mine, _header(REPLAY_OF_HEADER))
    )


def _nodes(
    schema: RecordSchema, *, time: str | None, keys: Sequence[str], id: str | None
) -> tuple[_Node, ...]:
    """The schema's fields as this source checks them; KF705/KF706 for bad arguments."""
    if time is not None:
        time_field = schema.field(time)
        if time_field.kind not in ("timestamp", "event_time"):
            raise TimeFieldTypeError(
                f"time field {time!r} of {schema.name} is {time_field.kind}, "
                "not datetime or EventTime"
            )
    if id is not None:
        schema.field(id)
    roles = {**({time: "time"} if time is not None else {}), **dict.fromkeys(keys, "key")}
    for path in roles:
        schema.field(path)
    return tuple(_node(f, f.name, roles) for f in schema.fields)


def _fast_path(raw: DataFrame, nodes: tuple[_Node, ...]) -> DataFrame:
    """``raw`` with the checking parse ``_kf_j``, the typed fields ``_kf_f0``… and
    ``_kf_settled``: whether the fast path settles the record as good."""
    # Top-level strings are read as text, and one pass of the engine's streaming parser over
    # the record checks that each is a JSON string (JsonChecks.java): a variant per string
    # and its type's name cost more than the rest of the parse.
    strings = [n for n in nodes if n.field.kind == "str"]
    fast = StructType(
        [
            StructField(n.field.name, StringType() if n in strings else _fast_type(n.field))
            for n in nodes
        ]
        + [StructField(_CORRUPT, StringType())]
    )
    j = F.col("_kf_j")
    parsed = raw.select(
        "*", F.from_json(F.col("value").cast("string"), fast, _JSON_OPTIONS).alias("_kf_j")
    )
    typed = parsed.select(
        "*",
        *[
            (
                j.getField(n.field.name)
                if n in strings
                else _typed(n.field, j.getField(n.field.name))
            ).alias(f"_kf_f{i}")
            for i, n in enumerate(nodes)
        ],
    )
    checks = [j.isNotNull(), j.getField(_CORRUPT).isNull()]
    if strings:
        checks.append(_strings_settled(raw, strings))
    for i, n in enumerate(nodes):
        if n in strings:
            continue
        check = _settled(n, j.getField(n.field.name), F.col(f"_kf_f{i}"))
        if check is not None:
            checks.append(check)
    # Never null: a null here would send a good record to the verdict as "not valid JSON".
    all_checks = F.coalesce(functools.reduce(operator.and_, checks), F.lit(False))
    return typed.select("*", all_checks.alias("_kf_settled"))


def _strings_settled(raw: DataFrame, strings: list[_Node]) -> Column:
    """Whether each of the top-level string fields ``strings`` holds a JSON string (or, if
    optional, null or nothing) in the record's bytes."""
    fields = json.dumps({n.field.name: n.required for n in strings})
    return ClassicColumn(
        jvm_engine(raw.sparkSession).JsonChecks.strings(F.col("value")._jc, fields)
    )


def _node(field: Field, path: str, roles: dict[str, str]) -> _Node:
    role = next(((r, p) for p, r in roles.items() if p == path or p.startswith(path + ".")), None)
    children = tuple(_node(f, f"{path}.{f.name}", roles) for f in field.fields)
    element = None
    if field.element is not None:
        # Elements are not addressable by key=, id= or time=, so roles stop here.
        element = _node(field.element, path, {})
    return _Node(
        field,
        path,
        required=role is not None or not field.optional,
        role=role[0] if role else None,
        role_path=role[1] if role else path,
        children=children,
        element=element,
    )


def _fast_type(field: Field) -> DataType:
    """The checking schema: strings and timestamps as text, the rest as declared."""
    if field.kind == "array":
        assert field.element is not None
        return ArrayType(_fast_type(field.element))
    if field.kind == "object":
        return StructType([StructField(f.name, _fast_type(f)) for f in field.fields])
    scalars: dict[str, DataType] = {
        "int": LongType(),
        "float": DoubleType(),
        "bool": BooleanType(),
        "str": VariantType(),
    }
    return scalars.get(field.kind, StringType())


def _converts(field: Field) -> bool:
    """Whether the field's value differs from its fast-path parse (it holds a timestamp)."""
    if field.kind in ("timestamp", "event_time", "str"):
        return True
    return any(_converts(f) for f in (*field.fields, *filter(None, [field.element])))


def _typed(field: Field, raw: Column) -> Column:
    """The field's typed value from its fast-path parse (null when it does not convert)."""
    if field.kind == "timestamp":
        return F.when(raw.rlike(_ISO), F.try_to_timestamp(raw))
    if field.kind == "event_time":
        return F.when(raw.rlike(_EPOCH_MS), F.timestamp_millis(raw.cast("bigint"))).when(
            raw.rlike(_ISO), F.try_to_timestamp(raw)
        )
    if field.kind == "str":
        return F.try_variant_get(raw, "$", "string")
    if not _converts(field):
        return raw
    if field.kind == "array":
        element = field.element
        assert element is not None
        return F.transform(raw, lambda e: _typed(element, e))
    parts = [_typed(f, raw.getField(f.name)).alias(f.name) for f in field.fields]
    return F.when(raw.isNotNull(), F.struct(*parts))


def _settled(node: _Node, raw: Column, typed: Column | None) -> Column | None:
    """Whether the fast path settles this field (None: always); see the module docstring."""
    if node.field.kind == "str":
        # A variant: JSON null is the variant null (VOID), not SQL null.
        t = F.schema_of_variant(raw)
        return t == "STRING" if node.required else raw.isNull() | t.isin("STRING", "VOID")
    if node.field.kind == "text":
        # Read as text, a string is itself and a number its text (42, 4.5, 1000.0 for
        # 1e3); an object, an array or a boolean is text too, so text that may be one goes
        # to the verdict (a string that looks like one is good there, and keeps this text).
        doubt = raw.isin("true", "false") | raw.startswith("{") | raw.startswith("[")
        fits = raw.isNotNull() & ~doubt
        return fits if node.required else raw.isNull() | fits
    ok = _ok(node, raw, typed)
    if node.required:
        return raw.isNotNull() if ok is None else raw.isNotNull() & ok
    return None if ok is None else raw.isNull() | ok


def _ok(node: _Node, raw: Column, typed: Column | None) -> Column | None:
    kind = node.field.kind
    if kind in ("timestamp", "event_time"):
        return (typed if typed is not None else _typed(node.field, raw)).isNotNull()
    if kind == "array":
        element = node.element
        assert element is not None
        if _settled(element, F.lit(None), None) is None:
            return None
        return F.forall(raw, lambda e: _settled(element, e, None))  # type: ignore[arg-type,return-value]
    checks = [
        _settled(
            child,
            raw.getField(child.field.name),
            None if typed is None else typed.getField(child.field.name),
        )
        for child in node.children
    ]
    present = [c for c in checks if c is not None]
    return functools.reduce(operator.and_, present) if present else None


# The slow path: the variant verdict.


def _verdict(nodes: tuple[_Node, ...], v: Column) -> Column:
    """The first problem of a record not settled by the fast path, from its variant."""
    value = F.col("value")
    return (
        F.when(value.isNull() | (F.length(value) == 0), F.lit("empty record"))
        .when(v.isNull(), F.lit("not valid JSON"))
        .when(~F.schema_of_variant(v).startswith("OBJECT"), F.lit("not a JSON object"))
        .otherwise(_first([_judge(n, _member(v, n.field.name), n.path) for n in nodes]))
    )


def _member(v: Column, name: str) -> Column:
    return F.variant_get(v, f'$["{name}"]', "variant")


def _first(reasons: list[Column]) -> Column:
    return F.coalesce(*reasons) if len(reasons) > 1 else reasons[0] if reasons else F.lit(None)


def _text(path: str | Column, problem: str, prefix: str = "field") -> Column:
    if isinstance(path, str):
        return F.lit(f"{prefix} '{path}' {problem}")
    return F.concat(F.lit(f"{prefix} '"), path, F.lit(f"' {problem}"))


def _judge(node: _Node, v: Column, path: str | Column) -> Column:
    """The first problem of one field's variant ``v`` (SQL null when missing), or null."""
    t = F.schema_of_variant(v)
    field, label = node.field, f"{node.role} field" if node.role else "field"
    if node.role:
        missing = null = F.lit(f"missing {node.role} field '{node.role_path}'")
    elif node.required:
        missing, null = _missing(path), _text(path, "is null")
    else:
        missing = null = F.lit(None).cast("string")
    verdict = F.when(t.isNull(), missing).when(t == "VOID", null)
    verdict = verdict.when(~_kind_ok(field, v, t), _text(path, _PROBLEMS[field.kind], label))
    if field.kind == "object":
        children = [
            _judge(c, _member(v, c.field.name), _join(path, "." + c.field.name))
            for c in node.children
        ]
        return verdict.otherwise(_first(children)) if children else verdict
    if field.kind == "array":
        element = node.element
        assert element is not None
        items = F.try_variant_get(v, "$", "array<variant>")
        reasons = F.transform(
            items,
            lambda e, i: _judge(
                element, e, _join(path, F.concat(F.lit("["), i.cast("string"), F.lit("]")))
            ),
        )
        first = F.try_element_at(F.filter(reasons, lambda r: r.isNotNull()), F.lit(1))
        return verdict.otherwise(first)
    return verdict


def _missing(path: str | Column) -> Column:
    if isinstance(path, str):
        return F.lit(f"missing field '{path}'")
    return F.concat(F.lit("missing field '"), path, F.lit("'"))


def _join(path: str | Column, suffix: str | Column) -> str | Column:
    if isinstance(path, str) and isinstance(suffix, str):
        return path + suffix
    return F.concat(
        F.lit(path) if isinstance(path, str) else path,
        F.lit(suffix) if isinstance(suffix, str) else suffix,
    )


def _kind_ok(field: Field, v: Column, t: Column) -> Column:
    kind = field.kind
    if kind in ("timestamp", "event_time"):
        text = F.try_variant_get(v, "$", "string")
        types = (t == "STRING") | (t.rlike(_INTEGER) if kind == "event_time" else F.lit(False))
        return types & _typed(field, text).isNotNull()
    checks: dict[str, Column] = {
        "int": t.rlike(_INTEGER),
        "float": t.rlike(_NUMBER),
        "str": t == "STRING",
        "text": (t == "STRING") | t.rlike(_NUMBER),
        "bool": t == "BOOLEAN",
        "array": t.startswith("ARRAY"),
        "object": t.startswith("OBJECT"),
    }
    return checks[kind]
