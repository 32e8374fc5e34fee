"""Protobuf sources and sinks: records in the schema registry's wire format (a zero byte,
the 4-byte schema id, the message indexes, the message), decoded in the JVM by the
engine's Protobuf.java with the descriptors of each version of the subject the registry
holds when the job starts, compiled here from their ``.proto`` text.

A decoded message goes on as JSON text (by field name) to the same checks as a JSON
source's records, as an Avro source's do (avro.py). Every record is read with the latest
version's message, as Protobuf reads by field number: a field an older writer lacks has
its default (proto3's zero; null for a message or an ``optional`` field), a field the
latest version lacks is skipped. Its bytes stay for the dead-letter topic, whose reason
says what failed: not the wire format, a schema id that is not a version of the subject,
another message than the job reads, or bytes that do not decode.

Protobuf's types in a record type: the integers as ``int``, ``float`` and ``double`` as
``float``, ``string``, ``bytes`` (base64) and enums (their names) as ``str``, ``bool``,
``google.protobuf.Timestamp`` as a timestamp (or the event time), the wrappers
(``google.protobuf.Int64Value``...) as their optional value, a message as a nested record,
``repeated`` as a list, a ``map<K, V>`` as a list of records with ``key`` and ``value``.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from google.protobuf import descriptor_pb2
from google.protobuf.descriptor_pb2 import FieldDescriptorProto as FieldProto
from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql.classic.column import Column as ClassicColumn
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
from kappaflow.registry.protobuf import ProtoCompileError, ProtoSchema, parse, type_name
from kappaflow.streams.jvm import jvm_engine
from kappaflow.streams.ops.avro import ORIGINAL, PRE_REASON
from kappaflow.streams.schema import Field, Kind, RecordSchema

_TIMESTAMP = ".google.protobuf.Timestamp"
_INTS = {
    FieldProto.TYPE_INT32,
    FieldProto.TYPE_INT64,
    FieldProto.TYPE_UINT32,
    FieldProto.TYPE_UINT64,
    FieldProto.TYPE_SINT32,
    FieldProto.TYPE_SINT64,
    FieldProto.TYPE_FIXED32,
    FieldProto.TYPE_FIXED64,
    FieldProto.TYPE_SFIXED32,
    FieldProto.TYPE_SFIXED64,
}
_FLOATS = {FieldProto.TYPE_FLOAT, FieldProto.TYPE_DOUBLE}
_STRS = {FieldProto.TYPE_STRING, FieldProto.TYPE_BYTES, FieldProto.TYPE_ENUM}
#: The field kinds of a record type that read each Protobuf type (beside messages).
_READS: dict[Kind, set[Any]] = {
    "int": _INTS,
    "float": _INTS | _FLOATS,
    "str": _STRS,
    "text": _STRS | _INTS | _FLOATS,
    "bool": {FieldProto.TYPE_BOOL},
    "event_time": _INTS,  # epoch milliseconds
}


class _Message:
    """A subject version's message, and the messages it can reach, for the checks."""

    def __init__(self, schema: ProtoSchema, subject: str, name: str | None) -> None:
        self.schema = schema
        self.subject = subject
        self.all = schema.messages(imported=True)
        self.name = name or schema.first()
        found = self.all.get(f".{self.name}")
        if found is None:
            raise SchemaFormatError(f"subject {subject!r} has no message {self.name!r}")
        self.top = found


def _schema(writer: Registered) -> ProtoSchema:
    if writer.schema_type != "PROTOBUF":
        raise SchemaFormatError(
            f"subject {writer.subject!r} holds a {writer.schema_type} schema, not Protobuf"
        )
    try:
        return parse(writer.schema)
    except ProtoCompileError as exc:
        raise SchemaFormatError(
            f"subject {writer.subject!r} (version {writer.version}): its .proto does not "
            f"compile: {exc}"
        ) from None


def record_of(writer: Registered, time: str | None, message: str | None) -> RecordSchema:
    """The record type a subject's message declares (for a source given no record type
    of its own); ``time`` is the event time when a Timestamp or an integer."""
    found = _Message(_schema(writer), writer.subject, message)
    fields = tuple(_field(f, found, "", set()) for f in found.top.field)
    if time is not None:
        fields = tuple(
            Field(f.name, "event_time", f.optional)
            if f.name == time and f.kind in ("int", "timestamp")
            else f
            for f in fields
        )
    return RecordSchema(found.top.name, fields, time)


def _field(proto: FieldProto, found: _Message, parent: str, seen: set[str]) -> Field:
    path = f"{parent}.{proto.name}" if parent else proto.name
    element = _element(proto, found, path, seen)
    if proto.label == FieldProto.LABEL_REPEATED:
        return Field(proto.name, "array", False, element=element)
    return Field(proto.name, element.kind, element.optional, element.element, element.fields)


def _element(proto: FieldProto, found: _Message, path: str, seen: set[str]) -> Field:
    """A field's type as an unnamed Field (a repeated field's element)."""
    optional = proto.proto3_optional or (
        proto.label == FieldProto.LABEL_OPTIONAL and (found.schema.file.syntax == "proto2")
    )
    if proto.type in _INTS:
        return Field("", "int", optional)
    if proto.type in _FLOATS:
        return Field("", "float", optional)
    if proto.type in _STRS:
        return Field("", "str", optional)
    if proto.type == FieldProto.TYPE_BOOL:
        return Field("", "bool", optional)
    if proto.type == FieldProto.TYPE_MESSAGE:
        if proto.type_name == _TIMESTAMP:
            return Field("", "timestamp", True)
        inner = found.all[proto.type_name]
        if _is_wrapper(proto.type_name):
            return Field("", _element(inner.field[0], found, path, seen).kind, True)
        if proto.type_name in seen:
            raise SchemaFormatError(
                f"subject {found.subject!r}, field {path!r}: a recursive message has no "
                "Spark counterpart here"
            )
        fields = tuple(_field(f, found, path, seen | {proto.type_name}) for f in inner.field)
        return Field("", "object", True, fields=fields)
    raise SchemaFormatError(
        f"subject {found.subject!r}, field {path!r}: Protobuf type {type_name(proto)} is not "
        "supported"
    )


def _is_wrapper(name: str) -> bool:
    return (
        name.startswith(".google.protobuf.")
        and name.endswith("Value")
        and (name != ".google.protobuf.Value")
    )


def check_readable(record: RecordSchema, writer: Registered, message: str | None) -> str:
    """The full name of the message ``record`` reads, once it is known to read
    ``writer``'s; KF755 naming each field that cannot."""
    found = _Message(_schema(writer), writer.subject, message)
    problems = _readable(record.fields, found.top, found, "")
    if problems:
        raise SchemaIncompatibleError(
            f"{record.name} cannot read subject {writer.subject!r} (version {writer.version}, "
            f"schema id {writer.id}, message {found.name}): " + "; ".join(problems)
        )
    return found.name


def after_message(writer: Registered, message: str | None) -> tuple[str, str]:
    """The full names of a change event's message (Debezium's envelope) and of the
    message of its ``after`` field, the row; KF756 when it has no such field."""
    found = _Message(_schema(writer), writer.subject, message)
    after = next((f for f in found.top.field if f.name == "after"), None)
    if after is None or after.type != FieldProto.TYPE_MESSAGE:
        raise SchemaFormatError(
            f"subject {writer.subject!r}: message {found.name} is not a change event (no "
            "message field 'after')"
        )
    return found.name, after.type_name.lstrip(".")


def _readable(
    fields: Sequence[Field], message: descriptor_pb2.DescriptorProto, found: _Message, path: str
) -> list[str]:
    written = {f.name: f for f in message.field}
    problems: list[str] = []
    for field in fields:
        inner = f"{path}.{field.name}" if path else field.name
        proto = written.get(field.name)
        if proto is None:
            if not field.optional:
                problems.append(
                    f"field {inner!r} is not in message {message.name} and is not optional"
                )
            continue
        if field.kind == "array":
            if proto.label != FieldProto.LABEL_REPEATED:
                problems.append(f"field {inner!r} is a list, but {type_name(proto)} is single")
                continue
            assert field.element is not None
            problems += _reads(field.element, proto, found, f"{inner}[]")
        elif proto.label == FieldProto.LABEL_REPEATED:
            problems.append(f"field {inner!r} is repeated {type_name(proto)}, not a list")
        else:
            problems += _reads(field, proto, found, inner)
    return problems


def _reads(field: Field, proto: FieldProto, found: _Message, path: str) -> list[str]:
    said = f"field {path!r} is {type_name(proto)}, which a {field.kind} cannot read"
    if proto.type == FieldProto.TYPE_MESSAGE:
        if proto.type_name == _TIMESTAMP:
            return [] if field.kind in ("timestamp", "event_time", "text") else [said]
        inner = found.all[proto.type_name]
        if _is_wrapper(proto.type_name):
            return _reads(field, inner.field[0], found, path)
        if field.kind != "object":
            return [said]
        return _readable(field.fields, inner, found, path)
    if field.kind == "array" and proto.type != FieldProto.TYPE_MESSAGE:
        return [said]
    return [] if proto.type in _READS.get(field.kind, set()) else [said]


def decode(raw: DataFrame, writers: Sequence[Registered], message: str) -> DataFrame:
    """Kafka source rows with ``value`` the decoded message as JSON text (null when it
    does not decode), ``_kf_pre_reason`` why not, and ``_kf_original`` its bytes."""
    if not writers:
        raise SchemaFormatError("a Protobuf source needs a subject with at least one version")
    spec = json.dumps({str(w.id): _schema(w).serialized() for w in writers})
    engine = jvm_engine(raw.sparkSession).Protobuf
    reader = _schema(writers[-1]).serialized()
    decoded = ClassicColumn(
        engine.decode(F.col("value")._jc, spec, reader, message, writers[0].subject)
    )
    framed = raw.select("*", decoded.alias("_kf_protobuf"))
    return framed.select(
        *[c for c in raw.columns if c != "value"],
        F.col("_kf_protobuf.json").cast("binary").alias("value"),
        F.col("_kf_protobuf.reason").alias(PRE_REASON),
        F.col("value").alias(ORIGINAL),
    )


# -- sinks


def proto_of(struct: StructType, name: str) -> str:
    """The ``.proto`` text of a stream's row type: one message named after the output,
    every scalar ``optional`` (a null stays null), timestamps as
    ``google.protobuf.Timestamp``, lists as ``repeated`` (null items left out), nested
    rows as nested messages."""
    lines = ['syntax = "proto3";', "package kappaflow;", ""]
    if any(_has_timestamp(f.dataType) for f in struct.fields):
        lines += ['import "google/protobuf/timestamp.proto";', ""]
    lines += _message(struct, _proto_name(name), "")
    return "\n".join(lines) + "\n"


def _has_timestamp(kind: DataType) -> bool:
    if isinstance(kind, TimestampType):
        return True
    if isinstance(kind, ArrayType):
        return _has_timestamp(kind.elementType)
    if isinstance(kind, StructType):
        return any(_has_timestamp(f.dataType) for f in kind.fields)
    return False


def _message(struct: StructType, name: str, indent: str) -> list[str]:
    lines = [f"{indent}message {name} {{"]
    nested: list[str] = []
    for number, item in enumerate(struct.fields, start=1):
        kind = item.dataType
        label = "optional "
        if isinstance(kind, ArrayType):
            label, kind = "repeated ", kind.elementType
        if isinstance(kind, StructType):
            inner = _proto_name(item.name).title().replace("_", "") or f"F{number}"
            nested += _message(kind, inner, indent + "  ")
            spelled = inner
            label = "repeated " if label == "repeated " else ""
        else:
            spelled = _scalar(kind, f"{name}.{item.name}")
            if spelled == "google.protobuf.Timestamp" and label == "optional ":
                label = ""
        lines.append(f"{indent}  {label}{spelled} {_proto_name(item.name)} = {number};")
    return [*lines[:1], *nested, *lines[1:], f"{indent}}}"]


def _scalar(kind: DataType, where: str) -> str:
    simple: dict[type, str] = {
        LongType: "int64",
        IntegerType: "int32",
        DoubleType: "double",
        FloatType: "float",
        StringType: "string",
        BooleanType: "bool",
        TimestampType: "google.protobuf.Timestamp",
    }
    if type(kind) in simple:
        return simple[type(kind)]
    raise SchemaFormatError(f"{where}: Spark type {kind.simpleString()} has no Protobuf form here")


def _proto_name(name: str) -> str:
    cleaned = "".join(c if c.isalnum() or c == "_" else "_" for c in name)
    return cleaned if cleaned[:1].isalpha() else f"_{cleaned}"


def register_output(url: str, subject: str, struct: StructType, name: str) -> tuple[int, str, str]:
    """Register the ``.proto`` of ``struct`` under ``subject``: its id, its
    FileDescriptorSet (base64) and its message's full name. KF755 with the registry's
    reason (naming the field) when the subject refuses it."""
    text = proto_of(struct, name)
    try:
        ident = RegistryClient(url).register(subject, text, "PROTOBUF")
    except RegistryRequestError as exc:
        if ": 409 " not in str(exc):
            raise
        raise SchemaIncompatibleError(
            f"output {name}'s rows are a breaking change for subject {subject!r}: "
            + str(exc).split(": 409 ", 1)[1]
        ) from None
    schema = parse(text)
    return ident, schema.serialized(), schema.first()
