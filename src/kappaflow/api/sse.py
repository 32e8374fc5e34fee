"""Server-Sent Events in the service's OpenAPI description.

A route that answers ``text/event-stream`` declares it with :func:`event_stream`, so
that ``/openapi.json`` shows the stream and a client generator sees it. Before OpenAPI
3.2's ``itemSchema``, the convention is a ``schema`` of one event: here one of the
route's events, each an object of its ``event`` name, its ``id`` where it has one, and
its ``data``, the JSON text of the ``data:`` line, described as the value it parses to.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

MEDIA_TYPE = "text/event-stream"


@dataclass(frozen=True)
class Event:
    """One kind of event of a stream: its name, what it means, the schema of its data
    and, if the event carries an id, what the id is."""

    name: str
    description: str
    data: dict[str, Any]
    id: str | None = None

    def schema(self) -> dict[str, Any]:
        properties: dict[str, Any] = {"event": {"type": "string", "const": self.name}}
        required = ["event", "data"]
        if self.id is not None:
            properties["id"] = {"type": "string", "description": self.id}
            required.insert(1, "id")
        properties["data"] = self.data
        return {
            "title": self.name,
            "description": self.description,
            "type": "object",
            "properties": properties,
            "required": required,
        }


def event_stream(
    description: str, events: list[Event], example: str
) -> dict[int | str, dict[str, Any]]:
    """``responses=`` for a route whose answer is Server-Sent Events: a 200 of
    ``text/event-stream`` whose schema is one of ``events``, with a sample of the wire
    format."""
    names = ", ".join(f"`{e.name}`" for e in events)
    return {
        200: {
            "description": description,
            "content": {
                MEDIA_TYPE: {
                    "schema": {
                        "description": (
                            f"One event of the stream: {names}. Each event's `data` is one "
                            "line of JSON; lines starting with `:` are keep-alive comments."
                        ),
                        "oneOf": [e.schema() for e in events],
                    },
                    "example": example,
                }
            },
        }
    }


#: An error that ends a stream: the code and message a JSON error answer would carry.
ERROR = Event(
    "error",
    "the last event of a stream the service ends: why (an error code of docs/errors.md)",
    {
        "type": "object",
        "properties": {"code": {"type": "string"}, "error": {"type": "string"}},
        "required": ["code", "error"],
    },
)
