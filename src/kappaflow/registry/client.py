"""A client of a Confluent-compatible schema registry's REST API: the embedded one
(``kappaflow registry start``) or any other at a URL (``registry.external_url``)."""

from __future__ import annotations

import json
import urllib.parse
from dataclasses import dataclass
from typing import Any

from kappaflow import rest
from kappaflow.errors import RegistryRequestError

CONTENT_TYPE = "application/vnd.schemaregistry.v1+json"


@dataclass(frozen=True)
class Registered:
    """One version of a subject."""

    subject: str
    version: int
    id: int
    schema: str
    schema_type: str = "AVRO"


class RegistryClient:
    def __init__(self, url: str) -> None:
        self.url = url.rstrip("/")

    def answers(self) -> bool:
        try:
            self.request("GET", "/subjects")
        except RegistryRequestError:
            return False
        return True

    def subjects(self) -> list[str]:
        return list(self.request("GET", "/subjects"))

    def versions(self, subject: str) -> list[Registered]:
        """Every version of ``subject``, oldest first."""
        numbers = self.request("GET", f"/subjects/{_q(subject)}/versions")
        return [self.version(subject, str(n)) for n in numbers]

    def version(self, subject: str, version: str = "latest") -> Registered:
        body = self.request("GET", f"/subjects/{_q(subject)}/versions/{version}")
        return Registered(
            body["subject"],
            int(body["version"]),
            int(body["id"]),
            body["schema"],
            body.get("schemaType") or "AVRO",
        )

    def register(self, subject: str, schema: str, schema_type: str = "AVRO") -> int:
        """Register ``schema`` under ``subject`` (the registry checks its compatibility);
        its id."""
        body: dict[str, Any] = {"schema": schema}
        if schema_type != "AVRO":
            body["schemaType"] = schema_type
        return int(self.request("POST", f"/subjects/{_q(subject)}/versions", body)["id"])

    def compatible(self, subject: str, schema: str, schema_type: str = "AVRO") -> list[str]:
        """What makes ``schema`` incompatible with ``subject``'s versions (empty: nothing)."""
        body: dict[str, Any] = {"schema": schema}
        if schema_type != "AVRO":
            body["schemaType"] = schema_type
        answer = self.request(
            "POST", f"/compatibility/subjects/{_q(subject)}/versions/latest?verbose=true", body
        )
        if answer.get("is_compatible"):
            return []
        return list(answer.get("messages") or ["incompatible"])

    def set_compatibility(self, level: str, subject: str | None = None) -> None:
        path = "/config" + (f"/{_q(subject)}" if subject else "")
        self.request("PUT", path, {"compatibility": level})

    def request(self, method: str, path: str, body: object = None) -> Any:
        """One call; its JSON answer. RegistryRequestError (KF431) with the registry's
        message when it refuses, or when it does not answer."""
        try:
            raw = rest.call(self.url + path, method, body, content_type=CONTENT_TYPE)
        except rest.RefusedError as exc:
            raise RegistryRequestError(
                f"the schema registry refused {method} {path}: {exc}"
            ) from None
        except OSError as exc:
            raise RegistryRequestError(
                f"the schema registry at {self.url} does not answer ({exc}): "
                "`kappaflow registry start`"
            ) from None
        try:
            return json.loads(raw) if raw else None
        except ValueError:
            return raw.decode()


def _q(subject: str) -> str:
    return urllib.parse.quote(subject, safe="")
