"""How a source's records are encoded, when not as JSON: ``kf.avro(subject)``, Avro in
the schema registry's wire format (a zero byte, the 4-byte schema id, the Avro binary
body), read with the subject's schemas (docs/registry.md)."""

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


def registry_url(format: AvroFormat, reader: object) -> str:
    """The registry a format's subject is looked up in: its own ``url``, else the job's
    (the reader's settings, under ``kappaflow jobs start``), else the settings loaded
    from the environment and ``kappaflow.toml`` (the test harness)."""
    found = format.url or getattr(reader, "registry_url", None)
    return str(found) if found else load_settings().registry.url
