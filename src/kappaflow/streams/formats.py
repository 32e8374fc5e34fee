"""How a source's records are encoded, when not as JSON: ``kf.avro(subject)``, Avro in
the schema registry's wire format (a zero byte, the 4-byte schema id, the Avro binary
body), read with the subject's schemas; ``kf.protobuf(subject)``, Protobuf in the same
wire format with its message indexes (docs/registry.md)."""

from __future__ import annotations

import re
from dataclasses import dataclass

from kappaflow.errors import SchemaFormatError
from kappaflow.settings import load_settings

_SUBJECT = re.compile(r"^[^\x00-\x1f/]{1,255}$")


@dataclass(frozen=True)
class AvroFormat:
    """Avro records whose schemas a registry holds under ``subject``; ``url`` None means
    the settings' registry (the embedded one unless ``registry.external_url`` is set)."""

    subject: str
    url: str | None = None


def avro(subject: str, *, url: str | None = None) -> AvroFormat:
    """Records written by a registry-aware Avro serializer (Confluent's, Apicurio's in
    its Confluent mode, ``kappaflow.registry``'s) under ``subject``; by the usual naming,
    ``TOPIC-value``."""
    if not _SUBJECT.match(subject):
        raise SchemaFormatError(f"avro: {subject!r} is not a subject name")
    if url is not None and not url.startswith(("http://", "https://")):
        raise SchemaFormatError(f"avro: url= is an http(s) URL, not {url!r}")
    return AvroFormat(subject, url)


@dataclass(frozen=True)
class ProtobufFormat:
    """Protobuf records whose schemas (``.proto`` text) a registry holds under
    ``subject``; ``message`` the full name of the message read or written (default: the
    schema's first message); ``url`` as for ``AvroFormat``."""

    subject: str
    url: str | None = None
    message: str | None = None


def protobuf(subject: str, *, message: str | None = None, url: str | None = None) -> ProtobufFormat:
    """Records written by a registry-aware Protobuf serializer (Confluent's, in any
    language) under ``subject``: a zero byte, the 4-byte schema id, the message indexes,
    the message. ``message`` names the message type (``shop.Order``) when the schema has
    several and the records are not of its first."""
    if not _SUBJECT.match(subject):
        raise SchemaFormatError(f"protobuf: {subject!r} is not a subject name")
    if url is not None and not url.startswith(("http://", "https://")):
        raise SchemaFormatError(f"protobuf: url= is an http(s) URL, not {url!r}")
    if message is not None and not re.fullmatch(r"[A-Za-z_][\w.]*", message):
        raise SchemaFormatError(f"protobuf: message= is a message's full name, not {message!r}")
    return ProtobufFormat(subject, url, message)


#: The formats a source or a topic sink takes.
RegistryFormat = AvroFormat | ProtobufFormat


def registry_url(format: RegistryFormat, reader: object) -> str:
    """The registry a format's subject is looked up in: its own ``url``, else the job's
    (the reader's settings, under ``kappaflow jobs start``), else the settings loaded
    from the environment and ``kappaflow.toml`` (the test harness)."""
    found = format.url or getattr(reader, "registry_url", None)
    return str(found) if found else load_settings().registry.url
