"""The schema registry's server: the Confluent Schema Registry REST API (the part that
producers' serializers, Spark jobs and the CLI use) over a log of schemas in Kafka.

Every registered version and every compatibility setting is a record of the compacted
topic ``registry.topic`` (``_schemas``), keyed by what it sets, as Confluent's registry
and Karapace keep theirs: the registry's state is that topic, read from its start when
the server starts, so a registry restarted here or elsewhere serves the same ids. A write
is answered only once Kafka acknowledged it (``acks=all``).

Run as ``python -m kappaflow.registry.server HOME`` with the settings in the environment
(``KF_REGISTRY_SETTINGS``); ``EmbeddedRegistry`` (service.py) starts and stops it.
"""

from __future__ import annotations

import json
import os
import re
import sys
import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

from confluent_kafka import KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import NewTopic

from kappaflow.kafka.clients import admin, consumer, producer
from kappaflow.registry import protobuf
from kappaflow.registry.compat import LEVELS, SchemaParseError, check, parse
from kappaflow.settings import Settings
from kappaflow.waiting import wait_for

SETTINGS_ENV = "KF_REGISTRY_SETTINGS"
CONTENT_TYPE = "application/vnd.schemaregistry.v1+json"
TYPES = ("AVRO", "PROTOBUF", "JSON")


@dataclass(frozen=True)
class Version:
    subject: str
    version: int
    id: int
    schema_type: str
    schema: str

    def as_dict(self) -> dict[str, Any]:
        body: dict[str, Any] = {
            "subject": self.subject,
            "version": self.version,
            "id": self.id,
            "schema": self.schema,
        }
        if self.schema_type != "AVRO":  # Confluent leaves out the default type
            body["schemaType"] = self.schema_type
        return body


class RegistryAnswerError(Exception):
    """An answer other than 200: Confluent's ``error_code`` and message."""

    def __init__(self, status: int, code: int, message: str) -> None:
        super().__init__(message)
        self.status, self.code, self.message = status, code, message


class Registry:
    """The registry's state, rebuilt from the topic and extended through it."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.topic = settings.registry.topic
        self.lock = threading.Lock()
        self.versions: dict[str, list[Version]] = {}
        self.by_id: dict[int, Version] = {}
        self.levels: dict[str, str] = {}
        self.default_level = settings.registry.compatibility
        self._producer = producer(settings.kafka, acks="all", **{"enable.idempotence": True})

    # -- the log

    def load(self) -> int:
        """Create the topic if missing and apply every record in it; how many."""
        client = admin(self.settings.kafka)
        if self.topic not in client.list_topics(timeout=30).topics:
            futures = client.create_topics(
                [NewTopic(self.topic, 1, -1, config={"cleanup.policy": "compact"})]
            )
            try:
                futures[self.topic].result(timeout=30)
            except KafkaException as exc:
                if "TOPIC_ALREADY_EXISTS" not in str(exc):
                    raise
        reader = consumer(
            self.settings.kafka,
            **{"group.id": "kappaflow-registry-load", "enable.auto.commit": False},
        )
        try:
            low, high = wait_for(
                lambda: _watermarks(reader, self.topic),
                timeout=60,
                interval=0.2,
                what=f"a leader of {self.topic}",
            )
            reader.assign([TopicPartition(self.topic, 0, low)])
            applied = 0
            position = low
            while position < high:
                message = reader.poll(5.0)
                if message is None:
                    continue
                fault = message.error()
                if fault is not None:
                    # The end (its last offsets may be compacted away or markers).
                    if fault.code() == KafkaError._PARTITION_EOF:
                        break
                    continue
                position = (message.offset() or 0) + 1
                self._apply(message.key(), message.value())
                applied += 1
            return applied
        finally:
            reader.close()

    def _apply(self, key: bytes | None, value: bytes | None) -> None:
        if key is None:
            return
        what = json.loads(key)
        if value is None:
            return
        body = json.loads(value)
        if what.get("keytype") == "CONFIG":
            self.levels[what.get("subject") or ""] = body["compatibilityLevel"]
        elif what.get("keytype") == "SCHEMA":
            found = Version(
                body["subject"], body["version"], body["id"], body["schemaType"], body["schema"]
            )
            versions = self.versions.setdefault(found.subject, [])
            versions[:] = [v for v in versions if v.version != found.version] + [found]
            versions.sort(key=lambda v: v.version)
            self.by_id[found.id] = found

    def _append(self, key: dict[str, Any], value: dict[str, Any]) -> None:
        raw_key, raw_value = json.dumps(key).encode(), json.dumps(value).encode()
        failed: list[str] = []

        def delivered(err: Any, _msg: Any) -> None:
            if err is not None:
                failed.append(str(err))

        self._producer.produce(self.topic, raw_value, raw_key, on_delivery=delivered)
        self._producer.flush(30)
        if failed:
            raise RegistryAnswerError(500, 50001, f"Kafka refused the write: {failed[0]}")
        self._apply(raw_key, raw_value)

    # -- what the API does

    def level(self, subject: str) -> str:
        return self.levels.get(subject) or self.levels.get("") or self.default_level

    def set_level(self, subject: str, level: str) -> None:
        if level not in LEVELS:
            raise RegistryAnswerError(422, 42203, f"Invalid compatibility level {level!r}")
        with self.lock:
            self._append(
                {"keytype": "CONFIG", "subject": subject or None}, {"compatibilityLevel": level}
            )

    def subject_versions(self, subject: str) -> list[Version]:
        found = self.versions.get(subject)
        if not found:
            raise RegistryAnswerError(404, 40401, f"Subject '{subject}' not found.")
        return found

    def version(self, subject: str, version: str) -> Version:
        versions = self.subject_versions(subject)
        if version in ("latest", "-1"):
            return versions[-1]
        for found in versions:
            if str(found.version) == version:
                return found
        raise RegistryAnswerError(404, 40402, f"Version {version} not found.")

    def lookup(self, subject: str, schema: str, schema_type: str) -> Version | None:
        canonical = _canonical(schema, schema_type)
        for found in self.versions.get(subject, []):
            if (
                found.schema_type == schema_type
                and _canonical(found.schema, schema_type) == canonical
            ):
                return found
        return None

    def problems(
        self, subject: str, schema: str, schema_type: str, against: list[Version]
    ) -> list[str]:
        if schema_type == "PROTOBUF":
            try:
                return protobuf.check(
                    self.level(subject),
                    schema,
                    [v.schema for v in against if v.schema_type == "PROTOBUF"],
                )
            except protobuf.ProtoCompileError as exc:
                raise RegistryAnswerError(422, 42201, f"Invalid schema: {exc}") from None
        if schema_type != "AVRO":
            # JSON Schema is stored and served; its compatibility is not checked here
            # (docs/registry.md).
            return []
        try:
            return check(
                self.level(subject), schema, [v.schema for v in against if v.schema_type == "AVRO"]
            )
        except SchemaParseError as exc:
            raise RegistryAnswerError(422, 42201, f"Invalid schema: {exc}") from None

    def register(self, subject: str, schema: str, schema_type: str) -> Version:
        if schema_type not in TYPES:
            raise RegistryAnswerError(422, 42201, f"Invalid schema type {schema_type!r}")
        if schema_type == "AVRO":
            try:
                parse(schema)
            except SchemaParseError as exc:
                raise RegistryAnswerError(422, 42201, f"Invalid schema: {exc}") from None
        if schema_type == "PROTOBUF":
            try:
                protobuf.parse(schema)
            except protobuf.ProtoCompileError as exc:
                raise RegistryAnswerError(422, 42201, f"Invalid schema: {exc}") from None
        with self.lock:
            existing = self.lookup(subject, schema, schema_type)
            if existing is not None:
                return existing
            earlier = self.versions.get(subject, [])
            problems = self.problems(subject, schema, schema_type, earlier)
            if problems:
                raise RegistryAnswerError(
                    409,
                    409,
                    f"Schema being registered is incompatible with an earlier schema for "
                    f'subject "{subject}" ({self.level(subject)}): ' + "; ".join(problems),
                )
            same = next(
                (
                    v.id
                    for v in self.by_id.values()
                    if v.schema_type == schema_type
                    and _canonical(v.schema, schema_type) == _canonical(schema, schema_type)
                ),
                None,
            )
            ident = same if same is not None else max(self.by_id, default=0) + 1
            version = (earlier[-1].version if earlier else 0) + 1
            body = {
                "subject": subject,
                "version": version,
                "id": ident,
                "schemaType": schema_type,
                "schema": schema,
            }
            self._append({"keytype": "SCHEMA", "subject": subject, "version": version}, body)
            return self.by_id[ident] if same is None else self.version(subject, str(version))


def _watermarks(reader: Any, topic: str) -> tuple[int, int] | None:
    """The topic's first and next offsets; None while its partition has no leader (just
    created)."""
    try:
        low, high = reader.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)
    except KafkaException:
        return None
    return int(low), int(high)


def _formatted(version: Version, query: dict[str, list[str]]) -> str:
    """A version's schema text in the form ``?format=`` asks for: ``serialized``, a
    Protobuf schema as a base64 FileDescriptorProto (confluent-kafka's Python clients ask
    for that); otherwise as registered."""
    if version.schema_type == "PROTOBUF" and query.get("format") == ["serialized"]:
        try:
            return protobuf.serialized(version.schema)
        except protobuf.ProtoCompileError as exc:
            raise RegistryAnswerError(422, 42201, f"Invalid schema: {exc}") from None
    return version.schema


def _canonical(schema: str, schema_type: str) -> str:
    if schema_type in ("AVRO", "JSON"):
        try:
            return json.dumps(json.loads(schema), sort_keys=True, separators=(",", ":"))
        except ValueError:
            return schema.strip()
    return re.sub(r"\s+", " ", schema).strip()


_ROUTES: list[tuple[str, re.Pattern[str], str]] = [
    (m, re.compile(p), h)
    for m, p, h in (
        ("GET", r"/", "root"),
        ("GET", r"/subjects", "subjects"),
        ("GET", r"/schemas/types", "types"),
        ("GET", r"/schemas/ids/(?P<id>\d+)", "schema_by_id"),
        ("GET", r"/schemas/ids/(?P<id>\d+)/schema", "raw_by_id"),
        ("GET", r"/subjects/(?P<subject>[^/]+)/versions", "versions"),
        ("POST", r"/subjects/(?P<subject>[^/]+)/versions", "register"),
        ("POST", r"/subjects/(?P<subject>[^/]+)", "lookup"),
        ("GET", r"/subjects/(?P<subject>[^/]+)/versions/(?P<version>[^/]+)", "version"),
        ("GET", r"/subjects/(?P<subject>[^/]+)/versions/(?P<version>[^/]+)/schema", "raw"),
        (
            "POST",
            r"/compatibility/subjects/(?P<subject>[^/]+)/versions/(?P<version>[^/]+)",
            "compatibility",
        ),
        ("GET", r"/config", "get_config"),
        ("PUT", r"/config", "put_config"),
        ("GET", r"/config/(?P<subject>[^/]+)", "get_config"),
        ("PUT", r"/config/(?P<subject>[^/]+)", "put_config"),
    )
]


class Handler(BaseHTTPRequestHandler):
    registry: Registry
    server_version = "kappaflow-registry"

    def log_message(self, format: str, *args: Any) -> None:
        sys.stderr.write(f"{self.address_string()} {format % args}\n")

    def do_GET(self) -> None:
        self._route("GET")

    def do_POST(self) -> None:
        self._route("POST")

    def do_PUT(self) -> None:
        self._route("PUT")

    def _route(self, method: str) -> None:
        parts = urlsplit(self.path)
        query = parse_qs(parts.query)
        path = parts.path.rstrip("/") or "/"
        try:
            length = int(self.headers.get("Content-Length") or 0)
            body = json.loads(self.rfile.read(length)) if length else {}
            for verb, pattern, name in _ROUTES:
                match = pattern.fullmatch(path)
                if verb == method and match:
                    args = {k: unquote(v) for k, v in match.groupdict().items()}
                    answer = getattr(self, f"_{name}")(body, query, **args)
                    self._send(200, answer)
                    return
            raise RegistryAnswerError(404, 404, f"HTTP 404 Not Found: {method} {path}")
        except RegistryAnswerError as fault:
            self._send(fault.status, {"error_code": fault.code, "message": fault.message})
        except ValueError as exc:
            self._send(422, {"error_code": 42201, "message": f"Invalid request: {exc}"})

    def _send(self, status: int, body: Any) -> None:
        raw = (body if isinstance(body, str) else json.dumps(body)).encode()
        self.send_response(status)
        self.send_header(
            "Content-Type", CONTENT_TYPE if not isinstance(body, str) else "text/plain"
        )
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)

    def _root(self, body: Any, query: Any) -> Any:
        return {}

    def _subjects(self, body: Any, query: Any) -> Any:
        return sorted(s for s, v in self.registry.versions.items() if v)

    def _types(self, body: Any, query: Any) -> Any:
        return list(TYPES)

    def _schema_by_id(self, body: Any, query: Any, id: str) -> Any:
        found = self.registry.by_id.get(int(id))
        if found is None:
            raise RegistryAnswerError(404, 40403, f"Schema {id} not found")
        answer: dict[str, Any] = {"schema": _formatted(found, query)}
        if found.schema_type != "AVRO":
            answer["schemaType"] = found.schema_type
        return answer

    def _raw_by_id(self, body: Any, query: Any, id: str) -> Any:
        return self._schema_by_id(body, query, id)["schema"]

    def _versions(self, body: Any, query: Any, subject: str) -> Any:
        return [v.version for v in self.registry.subject_versions(subject)]

    def _version(self, body: Any, query: Any, subject: str, version: str) -> Any:
        stored = self.registry.version(subject, version)
        found = stored.as_dict()
        found["schema"] = _formatted(stored, query)
        found.setdefault("schemaType", "AVRO")
        return found

    def _raw(self, body: Any, query: Any, subject: str, version: str) -> Any:
        return self.registry.version(subject, version).schema

    def _register(self, body: Any, query: Any, subject: str) -> Any:
        schema, schema_type = _schema_of(body)
        return {"id": self.registry.register(subject, schema, schema_type).id}

    def _lookup(self, body: Any, query: Any, subject: str) -> Any:
        schema, schema_type = _schema_of(body)
        self.registry.subject_versions(subject)
        found = self.registry.lookup(subject, schema, schema_type)
        if found is None:
            raise RegistryAnswerError(404, 40403, "Schema not found")
        return found.as_dict()

    def _compatibility(self, body: Any, query: Any, subject: str, version: str) -> Any:
        schema, schema_type = _schema_of(body)
        if version in ("latest", "-1"):
            against = self.registry.versions.get(subject, [])
        else:
            found = self.registry.version(subject, version)
            against = [
                v for v in self.registry.subject_versions(subject) if v.version <= found.version
            ]
        problems = self.registry.problems(subject, schema, schema_type, against)
        answer: dict[str, Any] = {"is_compatible": not problems}
        if query.get("verbose", ["false"])[0] == "true":
            answer["messages"] = problems
        return answer

    def _get_config(self, body: Any, query: Any, subject: str = "") -> Any:
        return {"compatibilityLevel": self.registry.level(subject)}

    def _put_config(self, body: Any, query: Any, subject: str = "") -> Any:
        level = str(body.get("compatibility") or body.get("compatibilityLevel") or "")
        self.registry.set_level(subject, level)
        return {"compatibility": level}


def _schema_of(body: Any) -> tuple[str, str]:
    if not isinstance(body, dict) or not isinstance(body.get("schema"), str):
        raise RegistryAnswerError(422, 42201, "Invalid schema: the request has no schema text")
    return body["schema"], str(body.get("schemaType") or "AVRO")


def serve(settings: Settings) -> None:
    """Load the registry from its topic and answer until stopped."""
    registry = Registry(settings)
    loaded = registry.load()
    handler = type("BoundHandler", (Handler,), {"registry": registry})
    server = ThreadingHTTPServer((settings.registry.host, settings.registry.port), handler)
    server.daemon_threads = True
    sys.stderr.write(
        f"schema registry on {settings.registry.url}: {loaded} records read from {registry.topic}\n"
    )
    sys.stderr.flush()
    server.serve_forever()


if __name__ == "__main__":
    serve(Settings.model_validate_json(os.environ[SETTINGS_ENV]))
