"""Avro schema compatibility, as Confluent's registry defines its levels, with messages
that name the field.

``can_read(reader, writer)`` follows Avro's schema resolution: the reader's schema reads
data written with the writer's when every reader field is in the writer's record (by name
or alias) with a type it can read, or has a default; when each writer enum symbol is a
reader symbol (or the reader has a default); when primitive types are equal or promoted
(int to long, float or double; long to float or double; float to double; string and
bytes); and a union reads what one of its branches reads. BACKWARD: the new schema reads
the old one's data; FORWARD: the old reads the new's; FULL: both; ``_TRANSITIVE``: against
every earlier version, not only the latest; NONE: no check.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

LEVELS = (
    "NONE",
    "BACKWARD",
    "BACKWARD_TRANSITIVE",
    "FORWARD",
    "FORWARD_TRANSITIVE",
    "FULL",
    "FULL_TRANSITIVE",
)
_PRIMITIVES = {"null", "boolean", "int", "long", "float", "double", "bytes", "string"}
_PROMOTIONS = {
    "int": {"int", "long", "float", "double"},
    "long": {"long", "float", "double"},
    "float": {"float", "double"},
    "string": {"string", "bytes"},
    "bytes": {"bytes", "string"},
}


class SchemaParseError(ValueError):
    """Text that is not an Avro schema."""


def parse(text: str) -> Any:
    """An Avro schema's JSON form, checked enough to resolve it (names defined once)."""
    try:
        schema = json.loads(text)
    except ValueError:
        # A bare primitive name is a schema too ("string").
        if text.strip() in _PRIMITIVES:
            return text.strip()
        raise SchemaParseError("not JSON") from None
    _names(schema, {}, None)
    return schema


def check(level: str, new: str, earlier: list[str]) -> list[str]:
    """What makes ``new`` incompatible at ``level`` with ``earlier`` (oldest first): empty
    when it is compatible."""
    if level == "NONE" or not earlier:
        return []
    against = earlier if level.endswith("_TRANSITIVE") else earlier[-1:]
    candidate = parse(new)
    problems: list[str] = []
    for old_text in reversed(against):
        old = parse(old_text)
        if level.startswith(("BACKWARD", "FULL")):
            problems += [
                f"the new schema cannot read old data: {p}" for p in can_read(candidate, old)
            ]
        if level.startswith(("FORWARD", "FULL")):
            problems += [f"old readers cannot read new data: {p}" for p in can_read(old, candidate)]
        if problems:
            break
    return problems


def can_read(reader: Any, writer: Any) -> list[str]:
    """Why data written with ``writer`` cannot be read with ``reader`` (empty: it can)."""
    return _read(reader, writer, _names(reader, {}, None), _names(writer, {}, None), "", set())


def _names(schema: Any, found: dict[str, Any], space: str | None) -> dict[str, Any]:
    """The named types (records, enums, fixed) defined in ``schema``, by full name."""
    if isinstance(schema, list):
        for branch in schema:
            _names(branch, found, space)
    elif isinstance(schema, dict):
        kind = schema.get("type")
        if kind in ("record", "error", "enum", "fixed"):
            name = _full(schema, space)
            found[name] = schema
            space = name.rpartition(".")[0] or None
            if kind in ("record", "error"):
                fields = schema.get("fields")
                if not isinstance(fields, list):
                    raise SchemaParseError(f"record {name} has no list of fields")
                for item in fields:
                    if not isinstance(item, dict) or "name" not in item or "type" not in item:
                        raise SchemaParseError(f"record {name} has a field without name or type")
                    _names(item["type"], found, space)
        elif kind == "array":
            _names(schema.get("items"), found, space)
        elif kind == "map":
            _names(schema.get("values"), found, space)
        elif isinstance(kind, list | dict):
            _names(kind, found, space)
    elif isinstance(schema, str):
        pass
    else:
        raise SchemaParseError(f"not an Avro type: {schema!r}")
    return found


def _full(schema: Mapping[str, Any], space: str | None) -> str:
    name = str(schema.get("name", ""))
    if "." in name:
        return name
    ns = schema.get("namespace", space)
    return f"{ns}.{name}" if ns else name


def _resolve(schema: Any, names: Mapping[str, Any]) -> Any:
    """A type reference by name → its definition; ``{"type": T}`` → T."""
    while True:
        if isinstance(schema, str) and schema not in _PRIMITIVES:
            if schema in names:
                return names[schema]
            tails = [v for k, v in names.items() if k.rpartition(".")[2] == schema]
            return tails[0] if tails else schema
        if isinstance(schema, dict) and isinstance(schema.get("type"), str | list | dict):
            kind = schema["type"]
            if kind not in ("record", "error", "enum", "fixed", "array", "map"):
                schema = kind
                continue
        return schema


def _kind(schema: Any) -> str:
    if isinstance(schema, list):
        return "union"
    if isinstance(schema, dict):
        return "record" if schema["type"] == "error" else str(schema["type"])
    return str(schema)


def _describe(schema: Any) -> str:
    kind = _kind(schema)
    if kind in ("record", "enum", "fixed"):
        return f"{kind} {schema.get('name')}"
    if kind == "union":
        return "union [" + ", ".join(_describe(b) for b in schema) + "]"
    return kind


def _read(
    reader: Any,
    writer: Any,
    rnames: Mapping[str, Any],
    wnames: Mapping[str, Any],
    path: str,
    seen: set[tuple[int, int]],
) -> list[str]:
    reader, writer = _resolve(reader, rnames), _resolve(writer, wnames)
    pair = (id(reader), id(writer))
    if pair in seen:  # a recursive type already being compared
        return []
    where = f"field {path!r}" if path else "the top-level type"
    rkind, wkind = _kind(reader), _kind(writer)
    if wkind == "union":
        problems: list[str] = []
        for branch in writer:
            problems += _read(reader, branch, rnames, wnames, path, seen)
        return problems
    if rkind == "union":
        tried = [_read(branch, writer, rnames, wnames, path, seen) for branch in reader]
        if any(not problems for problems in tried):
            return []
        # The branch of the writer's kind (and name) says what is wrong inside it.
        for branch, problems in zip(reader, tried, strict=True):
            if _describe(_resolve(branch, rnames)) == _describe(writer):
                return problems
        return [f"{where}: no branch of {_describe(reader)} reads {_describe(writer)}"]
    if rkind in _PRIMITIVES or wkind in _PRIMITIVES:
        if rkind == wkind or rkind in _PROMOTIONS.get(wkind, ()):
            return []
        return [f"{where}: {_describe(reader)} cannot read {_describe(writer)}"]
    if rkind != wkind:
        return [f"{where}: {_describe(reader)} cannot read {_describe(writer)}"]
    if rkind == "array":
        return _read(reader["items"], writer["items"], rnames, wnames, f"{path}[]", seen)
    if rkind == "map":
        return _read(reader["values"], writer["values"], rnames, wnames, f"{path}{{}}", seen)
    rname, wname = str(reader.get("name", "")), str(writer.get("name", ""))
    aliases = {a.rpartition(".")[2] for a in reader.get("aliases", [])}
    if rname.rpartition(".")[2] != wname.rpartition(".")[2] and (
        wname.rpartition(".")[2] not in aliases
    ):
        return [f"{where}: {_describe(reader)} cannot read {_describe(writer)} (names differ)"]
    if rkind == "fixed":
        if reader.get("size") != writer.get("size"):
            return [f"{where}: fixed sizes differ ({reader.get('size')} and {writer.get('size')})"]
        return []
    if rkind == "enum":
        missing = [s for s in writer.get("symbols", []) if s not in reader.get("symbols", [])]
        if missing and "default" not in reader:
            return [f"{where}: enum {rname} lacks the symbols {', '.join(missing)}"]
        return []
    return _record(reader, writer, rnames, wnames, path, seen | {pair})


def _record(
    reader: Mapping[str, Any],
    writer: Mapping[str, Any],
    rnames: Mapping[str, Any],
    wnames: Mapping[str, Any],
    path: str,
    seen: set[tuple[int, int]],
) -> list[str]:
    written = {f["name"]: f for f in writer["fields"]}
    problems: list[str] = []
    for item in reader["fields"]:
        name = item["name"]
        inner = f"{path}.{name}" if path else name
        match = next(
            (written[n] for n in _candidates(name, item.get("aliases", ())) if n in written), None
        )
        if match is None:
            if "default" not in item:
                problems.append(f"field {inner!r} is new and has no default")
            continue
        problems += _read(item["type"], match["type"], rnames, wnames, inner, seen)
    return problems


def _candidates(name: str, aliases: Iterable[str]) -> list[str]:
    return [name, *aliases]
