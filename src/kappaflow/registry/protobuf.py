"""Protobuf schemas as the registry holds them (``.proto`` text, Confluent's PROTOBUF
type), compiled with ``protoc`` (the one grpcio-tools embeds) into descriptors, and their
compatibility as Confluent's registry judges Protobuf's: what changes the wire.

A subject's text is one ``.proto`` file; it may import the well-known types
(``google/protobuf/timestamp.proto`` and the others protoc ships), not other subjects
(schema references are not supported here).
"""

from __future__ import annotations

import base64
import functools
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from google.protobuf import (
    any_pb2,
    descriptor_pb2,
    descriptor_pool,
    duration_pb2,
    empty_pb2,
    field_mask_pb2,
    struct_pb2,
    timestamp_pb2,
    wrappers_pb2,
)
from google.protobuf.descriptor_pb2 import FieldDescriptorProto as FieldProto
from google.protobuf.message import DecodeError

_FILE = "schema.proto"
#: The well-known types a schema may import (their modules fill protobuf's default pool).
_KNOWN = {
    module.DESCRIPTOR.name
    for module in (
        any_pb2,
        duration_pb2,
        empty_pb2,
        field_mask_pb2,
        struct_pb2,
        timestamp_pb2,
        wrappers_pb2,
    )
}


class ProtoCompileError(ValueError):
    """``.proto`` text that protoc does not compile; the message is protoc's."""


@dataclass(frozen=True)
class ProtoSchema:
    """A compiled ``.proto`` file: its FileDescriptorSet (imports first, the file last)."""

    files: descriptor_pb2.FileDescriptorSet

    @property
    def file(self) -> descriptor_pb2.FileDescriptorProto:
        return self.files.file[-1]

    def serialized(self) -> str:
        """The FileDescriptorSet, base64 (what the engine's Protobuf.java builds from)."""
        return base64.b64encode(self.files.SerializeToString()).decode()

    def messages(self, *, imported: bool = False) -> dict[str, descriptor_pb2.DescriptorProto]:
        """The file's messages, nested ones included, by full name with a leading dot (as
        fields' ``type_name`` gives them); ``imported``: the imports' too."""
        found: dict[str, descriptor_pb2.DescriptorProto] = {}
        for item in self.files.file if imported else [self.file]:
            prefix = f".{item.package}" if item.package else ""
            for message in item.message_type:
                found.update(_nested(message, prefix))
        return found

    def first(self) -> str:
        """The full name of the file's first message (message index 0)."""
        if not self.file.message_type:
            raise ProtoCompileError("the schema defines no message")
        package = self.file.package
        name = self.file.message_type[0].name
        return f"{package}.{name}" if package else name


def _nested(
    message: descriptor_pb2.DescriptorProto, prefix: str
) -> Iterator[tuple[str, descriptor_pb2.DescriptorProto]]:
    name = f"{prefix}.{message.name}"
    yield name, message
    for inner in message.nested_type:
        yield from _nested(inner, name)


def parse(text: str) -> ProtoSchema:
    """``text`` compiled; ProtoCompileError with protoc's message when it does not. The
    text may also be a base64 FileDescriptorProto, the form confluent-kafka's Python
    serializer registers (its imports: the well-known types)."""
    described = _described(text)
    return described if described is not None else _compile(text)


def serialized(text: str) -> str:
    """A schema's file as a base64 FileDescriptorProto (a registry's ``format=serialized``
    form, what confluent-kafka's Python deserializer asks for)."""
    return base64.b64encode(parse(text).file.SerializeToString()).decode()


def _described(text: str) -> ProtoSchema | None:
    stripped = text.strip()
    if not stripped or any(c.isspace() or c in ";{" for c in stripped):
        return None
    try:
        proto = descriptor_pb2.FileDescriptorProto.FromString(
            base64.b64decode(stripped, validate=True)
        )
    except (ValueError, DecodeError):
        return None
    if not proto.name:
        return None
    files = descriptor_pb2.FileDescriptorSet()
    for name in proto.dependency:
        if name not in _KNOWN:
            raise ProtoCompileError(f"import {name!r}: only the well-known types are imported")
        known = descriptor_pb2.FileDescriptorProto()
        descriptor_pool.Default().FindFileByName(name).CopyToProto(known)
        files.file.append(known)
    files.file.append(proto)
    return ProtoSchema(files)


@functools.lru_cache(maxsize=256)
def _compile(text: str) -> ProtoSchema:
    include = Path(str(resources.files("grpc_tools").joinpath("_proto")))
    with tempfile.TemporaryDirectory() as scratch:
        work = Path(scratch)
        (work / _FILE).write_text(text)
        out = work / "set.pb"
        result = subprocess.run(
            [
                sys.executable,
                "-m",
                "grpc_tools.protoc",
                f"-I{work}",
                f"-I{include}",
                f"--descriptor_set_out={out}",
                "--include_imports",
                _FILE,
            ],
            capture_output=True,
            text=True,
            check=False,
            cwd=work,
        )
        if result.returncode != 0 or not out.is_file():
            said = result.stderr.strip().replace(f"{work}/", "").replace(f"{_FILE}:", "line ")
            raise ProtoCompileError(said or "protoc failed")
        files = descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes())
    return ProtoSchema(files)


# -- compatibility

#: Field types that read each other's bytes (Confluent's Protobuf compatibility rules).
_WIRE_GROUPS = (
    {FieldProto.TYPE_INT32, FieldProto.TYPE_UINT32, FieldProto.TYPE_INT64},
    {FieldProto.TYPE_UINT64, FieldProto.TYPE_BOOL},
    {FieldProto.TYPE_SINT32, FieldProto.TYPE_SINT64},
    {FieldProto.TYPE_STRING, FieldProto.TYPE_BYTES},
    {FieldProto.TYPE_FIXED32, FieldProto.TYPE_SFIXED32},
    {FieldProto.TYPE_FIXED64, FieldProto.TYPE_SFIXED64},
)
_VARINTS = {
    FieldProto.TYPE_INT32,
    FieldProto.TYPE_UINT32,
    FieldProto.TYPE_INT64,
    FieldProto.TYPE_UINT64,
    FieldProto.TYPE_BOOL,
    FieldProto.TYPE_ENUM,
}


def type_name(field: descriptor_pb2.FieldDescriptorProto) -> str:
    """A field's type as .proto spells it (a message or enum by its full name)."""
    if field.type in (FieldProto.TYPE_MESSAGE, FieldProto.TYPE_ENUM, FieldProto.TYPE_GROUP):
        return field.type_name.lstrip(".")
    return FieldProto.Type.Name(field.type).removeprefix("TYPE_").lower()


def _wire_compatible(old: FieldProto, new: FieldProto) -> bool:
    if old.type == new.type:
        if old.type in (FieldProto.TYPE_MESSAGE, FieldProto.TYPE_ENUM):
            return old.type_name.rpartition(".")[2] == new.type_name.rpartition(".")[2]
        return True
    if old.type in _VARINTS and new.type in _VARINTS:
        return True
    return any(old.type in group and new.type in group for group in _WIRE_GROUPS)


def _repeated(field: FieldProto) -> bool:
    return field.label == FieldProto.LABEL_REPEATED


def problems(new: ProtoSchema, old: ProtoSchema) -> list[str]:
    """What makes data written with one of ``old`` and ``new`` unreadable with the other:
    a message of ``old`` that ``new`` lacks, a field number whose type changed to one
    that does not read the same bytes (a removed field's number reused so, too), a field
    that became repeated or stopped being. Adding fields and removing them are compatible,
    as in Confluent's registry."""
    found: list[str] = []
    new_messages = new.messages()
    for name, message in old.messages().items():
        shown = name.lstrip(".")
        if _is_map_entry(message):
            continue
        counterpart = new_messages.get(name)
        if counterpart is None:
            found.append(f"message {shown} was removed")
            continue
        numbered = {f.number: f for f in counterpart.field}
        for field in message.field:
            changed = numbered.get(field.number)
            if changed is None:
                continue
            where = f"field {field.name!r} (number {field.number}) of message {shown}"
            if changed.name != field.name:
                where += f", now {changed.name!r},"
            if not _wire_compatible(field, changed):
                found.append(f"{where} was {type_name(field)}, is {type_name(changed)}")
            elif _repeated(field) != _repeated(changed):
                was, now = ("repeated", "single") if _repeated(field) else ("single", "repeated")
                found.append(f"{where} was {was}, is {now}")
    return found


def _is_map_entry(message: descriptor_pb2.DescriptorProto) -> bool:
    return bool(message.options.map_entry)


def check(level: str, new: str, earlier: list[str]) -> list[str]:
    """What makes ``new`` incompatible at ``level`` with ``earlier`` (oldest first), as
    ``compat.check`` for Avro: the rules are symmetric, so BACKWARD, FORWARD and FULL
    judge alike; ``_TRANSITIVE`` against every earlier version."""
    if level == "NONE" or not earlier:
        return []
    against = earlier if level.endswith("_TRANSITIVE") else earlier[-1:]
    candidate = parse(new)
    for old_text in reversed(against):
        found = problems(candidate, parse(old_text))
        if found:
            return found
    return []
