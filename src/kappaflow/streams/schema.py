"""Record types users declare in Python, compiled to a Spark schema.

A source's records are declared as a dataclass or a pydantic model::

    @dataclass
    class Order:
        id: str
        at: kf.EventTime
        amount: float
        items: list[Item]
        note: str | None = None
        store: str | int  # a string, or a number read as its text

``compile_schema(Order)`` turns it into a ``RecordSchema``: the Spark ``StructType`` of
the parsed record and a tree of ``Field`` nodes (kind, required or optional) that
``kappaflow.streams.ops.parsing`` checks every record against.
"""

from __future__ import annotations

import dataclasses
import sys
import types
import typing
from dataclasses import dataclass
from datetime import datetime
from typing import Annotated, Any, Literal, Union, cast

from pydantic import BaseModel
from pyspark.sql.types import (
    ArrayType,
    BooleanType,
    DataType,
    DoubleType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from kappaflow.errors import (
    EventTimeFieldError,
    InvalidJobError,
    NoSuchFieldError,
    NotARecordModelError,
    UnresolvedFieldTypeError,
    UnsupportedFieldTypeError,
)


class _EventTimeMarker:
    """Marks the field that carries a record's event time (see ``EventTime``)."""

    def __repr__(self) -> str:
        return "EventTime"


_EVENT_TIME = _EventTimeMarker()

#: The event-time field: a datetime to type checkers; in a record, epoch milliseconds (a
#: JSON integer or a string of digits) or an ISO-8601 timestamp with a zone.
EventTime = Annotated[datetime, _EVENT_TIME]

Kind = Literal["int", "float", "str", "text", "bool", "timestamp", "event_time", "array", "object"]

_SCALARS: dict[type, Kind] = {int: "int", float: "float", str: "str", bool: "bool"}
_SUPPORTED = (
    "int, float, str, str | int (a string or a number, as text), bool, datetime, EventTime, "
    "list[T], a dataclass or pydantic model"
)
#: The unions that read a string or a number as text: ``str | int``, ``str | float``...
_TEXT_UNIONS = ({str, int}, {str, float}, {str, int, float})


@dataclass(frozen=True)
class Field:
    """One field of a record type: its name, kind and whether it may be missing or null.

    An ``array`` has its ``element`` (named ``""``; optional when declared
    ``list[T | None]``); an ``object`` has its ``fields`` in declared order.
    """

    name: str
    kind: Kind
    optional: bool
    element: Field | None = None
    fields: tuple[Field, ...] = ()

    @property
    def data_type(self) -> DataType:
        """The Spark type of this field's parsed value."""
        if self.kind == "array":
            assert self.element is not None
            return ArrayType(self.element.data_type, containsNull=True)
        if self.kind == "object":
            return _struct(self.fields)
        return _SPARK_TYPES[self.kind]


_SPARK_TYPES: dict[str, DataType] = {
    "int": LongType(),
    "float": DoubleType(),
    "str": StringType(),
    "text": StringType(),
    "bool": BooleanType(),
    "timestamp": TimestampType(),
    "event_time": TimestampType(),
}


def _struct(fields: tuple[Field, ...]) -> StructType:
    # Every field is nullable in Spark's eyes: a dead-lettered record's fields are null.
    return StructType([StructField(f.name, f.data_type, nullable=True) for f in fields])


@dataclass(frozen=True)
class RecordSchema:
    """A compiled record type: ``struct`` is the parsed record's Spark schema, field order
    as declared; ``event_time`` names its top-level ``EventTime`` field, if any."""

    name: str
    fields: tuple[Field, ...]
    event_time: str | None

    @property
    def struct(self) -> StructType:
        return _struct(self.fields)

    def field(self, path: str) -> Field:
        """The field at a dotted ``path`` (``customer.address.zip``); KF705 if none."""
        fields, parent, node = self.fields, self.name, None
        for part in path.split("."):
            node = next((f for f in fields if f.name == part), None)
            if node is None:
                names = ", ".join(f.name for f in fields) or "none"
                raise NoSuchFieldError(
                    f"{parent} has no field {part!r} (in {path!r}; fields: {names})"
                )
            fields, parent = node.fields, f"{parent}.{part}"
        assert node is not None
        return node


def compile_schema(model: type) -> RecordSchema:
    """The ``RecordSchema`` of a dataclass or pydantic model class (KF701-KF704)."""
    fields = _fields_of(model, stack=(model,), top=True)
    times = [f.name for f in fields if f.kind == "event_time"]
    if len(times) > 1:
        raise EventTimeFieldError(
            f"{model.__name__} has {len(times)} EventTime fields ({', '.join(times)}); "
            "a record has one event time"
        )
    return RecordSchema(model.__name__, fields, times[0] if times else None)


#: The columns a change stream (``job.change_stream``) gives each change of a row.
CHANGE_COLUMNS = ("op", "ts_ms", "lsn")


def change_model(model: type, keys: typing.Sequence[str]) -> type:
    """The record type of a change stream of ``model``'s rows: ``op`` (c, u, d or r),
    ``ts_ms`` (the event time), ``lsn`` (null if none), then the row's fields, those other
    than ``keys`` optional (a delete's row may hold its key only)."""
    if not _is_model(model):
        raise NotARecordModelError(
            f"{model!r} is not a dataclass or pydantic model class; declare the table's rows as one"
        )
    hints = _hints(model)
    clash = [c for c in CHANGE_COLUMNS if c in hints]
    if clash:
        raise InvalidJobError(
            f"{model.__name__} has a column named {clash[0]!r}, which a change stream "
            f"adds to each change ({', '.join(CHANGE_COLUMNS)}): read it with job.changes"
        )
    fields: list[tuple[str, Any]] = [("op", str), ("ts_ms", EventTime), ("lsn", int | None)]
    for name, annotation in hints.items():
        fields.append((name, annotation if name in keys else annotation | None))
    return dataclasses.make_dataclass(f"{model.__name__}Change", fields)


def _is_model(tp: object) -> bool:
    if not isinstance(tp, type):
        return False
    return dataclasses.is_dataclass(tp) or issubclass(tp, BaseModel)


def _fields_of(model: type, stack: tuple[type, ...], top: bool) -> tuple[Field, ...]:
    if not _is_model(model):
        raise NotARecordModelError(
            f"{model!r} is not a dataclass or pydantic model class; declare the source's "
            "records as one"
        )
    hints = _hints(model)
    defaults = _none_defaults(model)
    out = []
    for name, annotation in hints.items():
        where = f"{model.__name__}.{name}"
        node = _field(name, annotation, where, stack, top)
        if name in defaults and not node.optional:
            node = dataclasses.replace(node, optional=True)
        out.append(node)
    return tuple(out)


def _hints(model: type) -> dict[str, Any]:
    """The model's field annotations, resolved; forward refs that do not resolve: KF704."""
    names = (
        list(model.model_fields)
        if issubclass(model, BaseModel)
        else [f.name for f in dataclasses.fields(cast(Any, model))]
    )
    try:
        hints = typing.get_type_hints(model, include_extras=True)
    except NameError:
        # Find the field whose annotation names something unknown, to say which.
        namespace = vars(sys.modules[model.__module__])
        for klass in reversed(model.__mro__):
            for name, annotation in vars(klass).get("__annotations__", {}).items():
                if not isinstance(annotation, str) or name not in names:
                    continue
                try:
                    eval(annotation, namespace, dict(vars(model)))
                except NameError as exc:
                    raise UnresolvedFieldTypeError(
                        f"{model.__name__}.{name}: annotation {annotation!r} does not "
                        f"resolve ({exc}); define it at module level before compiling"
                    ) from None
        raise
    return {name: hints[name] for name in names}


def _none_defaults(model: type) -> set[str]:
    if issubclass(model, BaseModel):
        return {n for n, info in model.model_fields.items() if info.default is None}
    return {f.name for f in dataclasses.fields(cast(Any, model)) if f.default is None}


def _field(name: str, tp: Any, where: str, stack: tuple[type, ...], top: bool) -> Field:
    optional = False
    origin = typing.get_origin(tp)
    if origin in (Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if set(args) in _TEXT_UNIONS:
            return Field(name, "text", len(args) < len(typing.get_args(tp)))
        if len(args) != 1:
            raise _unsupported(where, tp, "a union other than T | None")
        optional, tp, origin = True, args[0], typing.get_origin(args[0])
    if origin is Annotated:
        base, *metadata = typing.get_args(tp)
        if any(m is _EVENT_TIME for m in metadata):
            if not top:
                raise EventTimeFieldError(
                    f"{where}: EventTime is for a top-level field of the source's record "
                    "type; use datetime here"
                )
            return Field(name, "event_time", optional)
        return dataclasses.replace(_field(name, base, where, stack, top), optional=optional)
    if tp in _SCALARS:
        return Field(name, _SCALARS[tp], optional)
    if tp is datetime:
        return Field(name, "timestamp", optional)
    if origin is list or tp is list:
        (element_type,) = typing.get_args(tp) or (None,)
        if element_type is None:
            raise _unsupported(where, tp, "a list without its element type")
        element = _field("", element_type, f"{where}[]", stack, top=False)
        return Field(name, "array", optional, element=element)
    if _is_model(tp):
        if tp in stack:
            raise _unsupported(where, tp, "a recursive record type")
        return Field(name, "object", optional, fields=_fields_of(tp, (*stack, tp), top=False))
    raise _unsupported(where, tp, None)


def _unsupported(where: str, tp: Any, what: str | None) -> UnsupportedFieldTypeError:
    shown = tp.__name__ if isinstance(tp, type) else repr(tp).replace("typing.", "")
    because = f" ({what})" if what else ""
    return UnsupportedFieldTypeError(
        f"{where}: type {shown}{because} is not supported; use {_SUPPORTED}, or T | None"
    )
