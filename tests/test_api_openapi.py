"""The service's OpenAPI description, as the served application answers it: each route
that pushes Server-Sent Events declares ``text/event-stream`` with its events, so that a
client generator sees the stream, and no other route does."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from service import serve

from kappaflow.settings import Settings

#: The push routes, and the events each one's stream carries.
PUSH_ROUTES = {
    "/v1/jobs/{job}/outputs/{output}/changes": {"snapshot", "change", "error"},
    "/v1/topics/{topic}/follow": {"start", "record", "error"},
}


@pytest.fixture(scope="module")
def description(serving: Settings) -> Iterator[dict[str, Any]]:
    with serve(serving) as client:
        answer = client.get("/openapi.json")
    assert answer.status_code == 200, answer.text
    yield answer.json()


def _events(stream: str) -> list[tuple[str, dict[str, Any]]]:
    """The events of a sample stream, each with its data parsed: the wire format a
    client reads."""
    events = []
    for block in stream.split("\n\n"):
        fields = dict(line.split(": ", 1) for line in block.splitlines() if ": " in line)
        if "event" in fields:
            events.append((fields["event"], json.loads(fields["data"])))
    return events


@pytest.mark.parametrize("path", sorted(PUSH_ROUTES))
def test_each_push_route_declares_its_event_stream(description: dict[str, Any], path: str) -> None:
    answer = description["paths"][path]["get"]["responses"]["200"]
    assert list(answer["content"]) == ["text/event-stream"], f"{path}: {answer}"
    media = answer["content"]["text/event-stream"]
    events = {e["properties"]["event"]["const"]: e for e in media["schema"]["oneOf"]}
    assert set(events) == PUSH_ROUTES[path]
    for name, event in events.items():
        assert event["type"] == "object" and "data" in event["required"], name
        assert event["properties"]["data"].get("type") == "object", name
    sample = _events(media["example"])
    assert sample and {name for name, _ in sample} <= set(events)
    for name, data in sample:
        assert set(events[name]["properties"]["data"].get("required", [])) <= set(data), name


def test_no_other_route_declares_an_event_stream(description: dict[str, Any]) -> None:
    streaming = {
        path
        for path, operations in description["paths"].items()
        for operation in operations.values()
        for answer in operation.get("responses", {}).values()
        if "text/event-stream" in answer.get("content", {})
    }
    assert streaming == set(PUSH_ROUTES)
