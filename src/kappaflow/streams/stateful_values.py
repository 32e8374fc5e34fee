"""Typed Python values to JSON and back, for stateful functions' events, state and output.

Events reach a stateful function as JSON of the stream's columns (Spark's ``to_json``), so
no pandas or Row conversion touches the user's values (nullable ints stay ints,
timestamps keep their zone); they are rebuilt as the record type by its type hints.
State is stored the same way: JSON of the state dataclass, rebuilt by field name, so a
field added with a default, or removed, needs no migration (pickle would break on a
renamed class or module, and cannot be read outside Python).
"""

from __future__ import annotations

import dataclasses
import json
import types
import typing
from datetime import UTC, datetime
from typing import Annotated, Any, Union

from pydantic import BaseModel

from kappaflow.timeutil import from_epoch_ms

#: Each record type's resolved field types. Resolved where the types are defined: a
#: type shipped to Spark's Python workers by value has no module there to resolve
#: its (string) annotations in.
Hints = dict[type, dict[str, Any]]


def is_record_type(tp: object) -> bool:
    """Whether ``tp`` is a dataclass or pydantic model class."""
    return isinstance(tp, type) and (dataclasses.is_dataclass(tp) or issubclass(tp, BaseModel))


def resolve_hints(*roots: Any) -> Hints:
    """The resolved field types of every record type in ``roots``, nested ones too."""
    found: Hints = {}
    pending = list(roots)
    while pending:
        tp = pending.pop()
        if is_record_type(tp) and tp not in found:
            found[tp] = typing.get_type_hints(tp, include_extras=True)
            pending.extend(found[tp].values())
        else:
            pending.extend(typing.get_args(tp))
    return found


def field_names(tp: type) -> list[str]:
    """The fields of a dataclass or pydantic model class, in declared order."""
    if issubclass(tp, BaseModel):
        return list(tp.model_fields)
    return [f.name for f in dataclasses.fields(typing.cast(Any, tp))]


def to_plain(value: Any, where: str, *, state: bool = False) -> Any:
    """``value`` as JSON-able data: records as objects, datetimes as ISO-8601 in UTC.

    A datetime without a zone raises ``TypeError``: its instant is unknown. State keeps
    microseconds; output rows keep milliseconds, as every record kappaflow writes."""
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, datetime):
        if value.tzinfo is None:
            raise TypeError(f"{where} is a datetime without a zone ({value.isoformat()})")
        spec = "microseconds" if state else "milliseconds"
        return value.astimezone(UTC).isoformat(timespec=spec).replace("+00:00", "Z")
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {
            f.name: to_plain(getattr(value, f.name), f"{where}.{f.name}", state=state)
            for f in dataclasses.fields(value)
        }
    if isinstance(value, BaseModel):
        return {
            name: to_plain(getattr(value, name), f"{where}.{name}", state=state)
            for name in type(value).model_fields
        }
    if isinstance(value, dict):
        return {str(k): to_plain(v, f"{where}[{k!r}]", state=state) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [to_plain(v, f"{where}[]", state=state) for v in value]
    raise TypeError(f"{where} is a {type(value).__name__}, which has no JSON form")


def dumps(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), allow_nan=False)


def from_plain(tp: Any, value: Any, where: str, hints: Hints | None = None) -> Any:
    """JSON data back as the type ``tp`` (a record type, list, dict, datetime, scalar, ``X |
    None``). A record's missing fields take their default, or None; unknown ones are
    dropped. Raises ``TypeError`` naming ``where`` when ``value`` does not fit."""
    origin = typing.get_origin(tp)
    if origin is Annotated:
        return from_plain(typing.get_args(tp)[0], value, where, hints)
    if tp is Any or tp is object:
        return value
    if origin in (Union, types.UnionType):
        if value is None:
            return None
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(args) == 1:
            return from_plain(args[0], value, where, hints)
        return value
    if value is None:
        return None
    if is_record_type(tp):
        return _record(tp, value, where, hints)
    if tp is datetime:
        if isinstance(value, int):
            return from_epoch_ms(value)
        return datetime.fromisoformat(str(value).replace("Z", "+00:00")).astimezone(UTC)
    if tp is float and isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    if tp in (int, str, bool):
        if not isinstance(value, tp) or (tp is int and isinstance(value, bool)):
            raise TypeError(f"{where} is {value!r}, not {tp.__name__}")
        return value
    if origin in (list, set, frozenset, tuple) or tp in (list, set, tuple):
        element = next(iter(typing.get_args(tp)), Any)
        items = [from_plain(element, v, f"{where}[]", hints) for v in _list(value, where)]
        return (origin or tp)(items)  # list, tuple, set or frozenset
    if origin is dict or tp is dict:
        pair = typing.get_args(tp)
        inner = pair[1] if len(pair) == 2 else Any
        if not isinstance(value, dict):
            raise TypeError(f"{where} is {value!r}, not an object")
        return {k: from_plain(inner, v, f"{where}[{k!r}]", hints) for k, v in value.items()}
    return value


def _list(value: Any, where: str) -> list[Any]:
    if not isinstance(value, list):
        raise TypeError(f"{where} is {value!r}, not a list")
    return value


def _record(tp: type, value: Any, where: str, known: Hints | None) -> Any:
    if not isinstance(value, dict):
        raise TypeError(f"{where} is {value!r}, not an object")
    hints = (known or {}).get(tp) or typing.get_type_hints(tp, include_extras=True)
    if issubclass(tp, BaseModel):
        data = {
            name: from_plain(hints.get(name, Any), value.get(name), f"{where}.{name}", known)
            for name, info in tp.model_fields.items()
            if name in value or info.is_required()
        }
        return tp.model_validate(data)
    kwargs = {}
    for f in dataclasses.fields(typing.cast(Any, tp)):
        if not f.init:
            continue
        if f.name in value:
            kwargs[f.name] = from_plain(
                hints.get(f.name, Any), value[f.name], f"{where}.{f.name}", known
            )
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            # Spark's to_json leaves out null fields: a missing field is a null one.
            kwargs[f.name] = None
    return tp(**kwargs)


def type_text(tp: Any) -> str:
    """A type as text, for comparing a state dataclass's fields across versions of a job:
    ``int``, ``float | None``, ``list[float]``."""
    if isinstance(tp, type) and not typing.get_args(tp):
        return tp.__name__
    return str(tp).replace("typing.", "").replace("NoneType", "None")


def state_fields(state: type) -> dict[str, str]:
    """A state dataclass's fields and their types as text (jobs/evolution.py compares
    them on a restart)."""
    hints = typing.get_type_hints(state)
    return {f.name: type_text(hints.get(f.name, Any)) for f in dataclasses.fields(state)}
