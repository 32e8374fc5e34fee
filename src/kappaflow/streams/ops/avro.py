"""Avro sources: records in the schema registry's wire format, decoded in the JVM by
Spark's ``from_avro`` and then checked as every source's records are (parsing.py).

A record is a zero byte, the writer's 4-byte schema id and the Avro binary body. Each
version of the subject the registry holds when the job starts is a writer schema the
source decodes with (one ``from_avro`` per version, chosen by the id in a CASE WHEN), read
as one reader schema: the job's record type's, or the subject's latest. Avro's schema
resolution fills fields the writer lacks from their defaults and skips those the reader
lacks. The decoded struct goes on as JSON text to the same checks as a JSON source, so
required fields, event times and keys are judged alike; the record's original bytes stay
for the dead-letter topic, whose reason says what failed: not the wire format, a schema
id that is not a version of the subject (registered after the job started, or another
subject's), or bytes that do not decode with the writer's schema.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from typing import Any

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.avro.functions import from_avro
from pyspark.sql.types import (
    ArrayType,
    BooleanType,
    DataType,
    DoubleType,
    FloatType,
    IntegerType,
    LongType,
    StringType,
    StructType,
    TimestampType,
)

from kappaflow.errors import RegistryRequestError, SchemaFormatError, SchemaIncompatibleError
from kappaflow.registry.client import Registered, RegistryClient
from kappaflow.registry.compat import can_read
from kappaflow.streams.schema import Field, Kind, RecordSchema

#: Columns parse_records reads beside Kafka's: the verdict before parsing, and the bytes.
PRE_REASON, ORIGINAL = "_kf_pre_reason", "_kf_original"

_KINDS: dict[str, Kind] = {
    "int": "int",
    "long": "int",
    "float": "float",
    "double": "float",
    "string": "str",
    "enum": "str",
    "boolean": "bool",
}
_DECODED = "_kf_decoded"
_TIMESTAMPS = ("timestamp-millis", "timestamp-micros", "local-timestamp-millis")


def record_of(writer: Registered, time: str | None) -> RecordSchema:
    """The record type a subject's schema declares (for a source given no record type of
    its own): Avro's longs and ints as ints, floats and doubles as floats, strings and
    enums as strings, a union with null as optional, timestamps (and the ``time`` field,
    when a long) as event times."""
    schema = _top(writer)
    names = _named(schema)
    fields = tuple(_field(f["name"], f["type"], names, writer.subject) for f in schema["fields"])
    if time is not None:
        fields = tuple(
            Field(f.name, "event_time", f.optional)
            if f.name == time and f.kind in ("int", "timestamp")
            else f
            for f in fields
        )
    return RecordSchema(str(schema["name"]), fields, time)


def reader_of(record: RecordSchema, writer: Registered) -> dict[str, Any]:
    """The Avro reader schema of a job's record type, its record names the writer's (so
    only the fields decide compatibility)."""
    schema = _top(writer)
    return _record(record.fields, str(schema["name"]), schema, _named(schema))


def check_readable(record: RecordSchema, writer: Registered) -> dict[str, Any]:
    """The reader schema of ``record``, once it is known to read ``writer``'s data; KF755
    naming each field that cannot."""
    reader = reader_of(record, writer)
    problems = can_read(reader, json.loads(writer.schema))
    if problems:
        raise SchemaIncompatibleError(
            f"{record.name} cannot read subject {writer.subject!r} (version {writer.version}, "
            f"schema id {writer.id}): " + "; ".join(problems)
        )
    return reader


def after_record(writer: Registered) -> Registered:
    """A change event's subject (Debezium's envelope) as the subject of its rows: the
    record type of its ``after`` field; KF756 when it has no such field."""
    schema = _top(writer)
    names = _named(schema)
    after = next((f for f in schema["fields"] if f["name"] == "after"), None)
    row = _strip(after["type"], names) if after is not None else None
    if not isinstance(row, dict) or row.get("type") != "record":
        raise SchemaFormatError(
            f"subject {writer.subject!r}: record {schema['name']} is not a change event (no "
            "record field 'after')"
        )
    return dataclasses.replace(writer, schema=json.dumps(row))


def decode(
    raw: DataFrame, writers: Sequence[Registered], reader: dict[str, Any] | str
) -> DataFrame:
    """Kafka source rows with ``value`` the decoded record as JSON text (null when it does
    not decode), ``_kf_pre_reason`` why not, and ``_kf_original`` its bytes."""
    value = F.col("value")
    ident = F.conv(F.hex(F.substring(value, 2, 4)), 16, 10).cast("bigint")
    body = F.expr("substring(value, 6)")
    # Spark's PERMISSIVE mode gives a row of nulls for bytes that do not decode; a field
    # no writer has, whose default is true, tells such a row from a record of nulls.
    sentinel = json.loads(reader) if isinstance(reader, str) else dict(reader)
    sentinel["fields"] = [
        *sentinel["fields"],
        {"name": _DECODED, "type": "boolean", "default": True},
    ]
    options = {"mode": "PERMISSIVE", "avroSchema": json.dumps(sentinel)}
    decoded: Column | None = None
    for writer in writers:
        branch = from_avro(body, writer.schema, options)
        decoded = (
            F.when(ident == writer.id, branch)
            if decoded is None
            else decoded.when(ident == writer.id, branch)
        )
    wire = value.isNotNull() & (F.length(value) >= 5) & (F.hex(F.substring(value, 1, 1)) == "00")
    known = ident.isin([w.id for w in writers]) if writers else F.lit(False)
    subject = writers[0].subject if writers else "?"
    if decoded is None:
        raise SchemaFormatError("an Avro source needs a subject with at least one version")
    framed = raw.select("*", F.when(wire & known, decoded).alias("_kf_decoded")).select(
        "*",
        F.when(
            F.col("_kf_decoded").getField(_DECODED), F.col("_kf_decoded").dropFields(_DECODED)
        ).alias("_kf_avro"),
    )
    reason = (
        F.when(
            ~wire | value.isNull(),
            F.lit("not in the schema registry's wire format (a zero byte, a 4-byte schema id)"),
        )
        .when(
            ~known,
            F.concat(
                F.lit("schema id "),
                ident.cast("string"),
                F.lit(
                    f" is not a version of subject {subject!r} the job knows (it reads the "
                    "versions registered when it started)"
                ),
            ),
        )
        .when(
            F.col("_kf_avro").isNull(),
            F.concat(
                F.lit("does not decode as Avro with schema id "),
                ident.cast("string"),
                F.lit(f" of subject {subject!r}"),
            ),
        )
    )
    return framed.select(
        *[c for c in raw.columns if c != "value"],
        F.to_json(F.col("_kf_avro")).cast("binary").alias("value"),
        reason.alias(PRE_REASON),
        value.alias(ORIGINAL),
    )


def _top(writer: Registered) -> dict[str, Any]:
    if writer.schema_type != "AVRO":
        raise SchemaFormatError(
            f"subject {writer.subject!r} holds a {writer.schema_type} schema, not Avro"
        )
    schema = json.loads(writer.schema)
    if not isinstance(schema, dict) or schema.get("type") != "record":
        raise SchemaFormatError(f"subject {writer.subject!r}'s schema is not an Avro record")
    return schema


def _named(schema: Any, found: dict[str, Any] | None = None) -> dict[str, Any]:
    found = {} if found is None else found
    if isinstance(schema, list):
        for branch in schema:
            _named(branch, found)
    elif isinstance(schema, dict):
        if schema.get("type") in ("record", "enum", "fixed") and "name" in schema:
            found[str(schema["name"]).rpartition(".")[2]] = schema
            for item in schema.get("fields", []):
                _named(item["type"], found)
        elif schema.get("type") == "array":
            _named(schema.get("items"), found)
    return found


def _field(name: str, kind: Any, names: dict[str, Any], subject: str, parent: str = "") -> Field:
    """A record type's field from an Avro field; KF756 naming its path if unsupported."""
    path = f"{parent}.{name}" if parent and name else (parent or name)
    optional = False
    if isinstance(kind, list):
        rest = [k for k in kind if k != "null"]
        optional = len(rest) < len(kind)
        if len(rest) != 1:
            raise SchemaFormatError(
                f"subject {subject!r}, field {path!r}: a union of several types has no "
                "Spark counterpart here"
            )
        kind = rest[0]
    if isinstance(kind, str) and kind in names:
        kind = names[kind]
    if isinstance(kind, dict):
        if kind.get("logicalType") in _TIMESTAMPS:
            return Field(name, "timestamp", optional)
        t = kind.get("type")
        if t == "record":
            fields = tuple(
                _field(f["name"], f["type"], names, subject, path) for f in kind["fields"]
            )
            return Field(name, "object", optional, fields=fields)
        if t == "array":
            element = _field("", kind["items"], names, subject, f"{path}[]")
            return Field(name, "array", optional, element=element)
        if t == "enum":
            return Field(name, "str", optional)
        kind = t
    if isinstance(kind, str) and kind in _KINDS:
        return Field(name, _KINDS[kind], optional)
    raise SchemaFormatError(
        f"subject {subject!r}, field {path!r}: Avro type {json.dumps(kind)} is not supported "
        "(maps, bytes and fixed are not)"
    )


def _record(
    fields: Sequence[Field], name: str, writer: dict[str, Any] | None, names: dict[str, Any]
) -> dict[str, Any]:
    written = {f["name"]: f for f in (writer or {}).get("fields", [])}
    return {
        "type": "record",
        "name": name,
        "fields": [_reader_field(f, written.get(f.name), names) for f in fields],
    }


def _reader_field(field: Field, written: Any, names: dict[str, Any]) -> dict[str, Any]:
    kind = _reader_type(field, _strip((written or {}).get("type"), names), names)
    found: dict[str, Any] = {"name": field.name, "type": kind}
    # The subject's default for data written before the field was: its latest schema's.
    if written is not None and "default" in written:
        found["default"] = written["default"]
    if field.optional:
        if found.get("default") is None:
            found.update(type=["null", kind], default=None)
        else:
            found["type"] = [kind, "null"]  # a union's default is of its first branch
    return found


def _strip(written: Any, names: dict[str, Any]) -> Any:
    """A writer's field type without its null branch, named types resolved."""
    if isinstance(written, list):
        rest = [k for k in written if k != "null"]
        written = rest[0] if len(rest) == 1 else None
    if isinstance(written, str) and written in names:
        return names[written]
    return written


def _reader_type(field: Field, written: Any, names: dict[str, Any]) -> Any:
    if field.kind == "object":
        name = (
            written.get("name")
            if isinstance(written, dict) and written.get("type") == "record"
            else field.name.title()
        )
        return _record(
            field.fields, str(name), written if isinstance(written, dict) else None, names
        )
    if field.kind == "array":
        assert field.element is not None
        items = written.get("items") if isinstance(written, dict) else None
        inner = _reader_type(field.element, _strip(items, names), names)
        return {"type": "array", "items": ["null", inner] if field.element.optional else inner}
    stamped = isinstance(written, dict) and written.get("logicalType") in _TIMESTAMPS
    if field.kind in ("timestamp", "event_time") and stamped:
        return written  # the writer's unit (milliseconds or microseconds)
    if field.kind == "timestamp":
        return {"type": "long", "logicalType": "timestamp-millis"}
    if field.kind == "event_time":
        return "long"  # epoch milliseconds, as a JSON source's
    if field.kind == "str" and isinstance(written, dict) and written.get("type") == "enum":
        return written  # Avro reads an enum only as an enum; Spark gives its symbol
    return {"int": "long", "float": "double", "str": "string", "text": "string", "bool": "boolean"}[
        field.kind
    ]


def avro_schema_of(struct: StructType, name: str) -> dict[str, Any]:
    """The Avro record schema of a stream's row type: every field nullable (a union with
    null, default null), timestamps as ``timestamp-micros``."""
    return _avro_record(struct, name)


def register_output(url: str, subject: str, struct: StructType, name: str) -> tuple[int, str]:
    """Register the Avro schema of ``struct`` under ``subject``: its id and text. KF755
    with the registry's reason (naming the field) when the subject refuses it."""
    text = json.dumps(avro_schema_of(struct, name))
    try:
        return RegistryClient(url).register(subject, text), text
    except RegistryRequestError as exc:
        if ": 409 " not in str(exc):
            raise
        raise SchemaIncompatibleError(
            f"output {name}'s rows are a breaking change for subject {subject!r}: "
            + str(exc).split(": 409 ", 1)[1]
        ) from None


def _avro_record(struct: StructType, name: str) -> dict[str, Any]:
    return {
        "type": "record",
        "name": _avro_name(name),
        "namespace": "kappaflow",
        "fields": [
            {
                "name": f.name,
                "type": ["null", _avro_type(f.dataType, f"{name}_{f.name}")],
                "default": None,
            }
            for f in struct.fields
        ],
    }


def _avro_type(kind: DataType, name: str) -> Any:
    simple: dict[type, Any] = {
        LongType: "long",
        IntegerType: "int",
        DoubleType: "double",
        FloatType: "float",
        StringType: "string",
        BooleanType: "boolean",
        TimestampType: {"type": "long", "logicalType": "timestamp-micros"},
    }
    if type(kind) in simple:
        return simple[type(kind)]
    if isinstance(kind, ArrayType):
        inner = _avro_type(kind.elementType, name)
        return {"type": "array", "items": ["null", inner] if kind.containsNull else inner}
    if isinstance(kind, StructType):
        return _avro_record(kind, name)
    raise SchemaFormatError(f"{name}: Spark type {kind.simpleString()} has no Avro form here")


def _avro_name(name: str) -> str:
    cleaned = "".join(c if c.isalnum() or c == "_" else "_" for c in name)
    return cleaned if cleaned[:1].isalpha() or cleaned[:1] == "_" else f"_{cleaned}"
