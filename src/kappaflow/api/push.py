"""Push: an output's changes, streamed to subscribers as they are committed to Kafka.

An output that writes a Kafka topic (``.to(kf.topic())``) has its changes there, each
batch's in one transaction: a windowed aggregate's changelog (every provisional value,
final value and correction of a window, with the values before it), or a stream's rows.
The service reads that topic once, ``read_committed``, in one reader per topic (a hub,
hub.py), however many subscribe; the hub folds the records into the latest record of
each Kafka key (the snapshot a new subscriber starts from) and keeps the most recent
records, so that a subscriber that comes back resumes from its last event id.

A subscriber gets, in order:

1. without a last event id, ``snapshot``: the latest record of every key, at a position
   in the topic; with one, nothing: it resumes there;
2. ``change``: every record after that position, in the topic's order (a key's records
   are in one partition, so in the order the job wrote them).

Every event's id is the subscriber's position after it: the next offset of each
partition (``0:120,1:97``). A subscriber whose position is older than the records the
hub keeps is caught up from Kafka by a reader of its own, then joins the hub's stream:
no record is lost or repeated either way. A subscriber more than ``api.push_backlog``
records behind is dropped (KF872) without slowing anyone else: the hub never waits for
a subscriber; it resumes with its last event id.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Annotated, Any

from fastapi import FastAPI, Header, Query, Request, WebSocket, WebSocketDisconnect
from fastapi.responses import StreamingResponse

from kappaflow.api.hub import PushHubs
from kappaflow.api.sse import ERROR, Event, event_stream
from kappaflow.errors import (
    KappaflowError,
    http_status,
)
from kappaflow.settings import Settings

_POSITION = (
    "the subscriber's position after this event, the next offset of each partition "
    "(`0:120,1:97`): send it back as `Last-Event-ID` (or `?last_event_id=`) to resume"
)
#: A record of the output's topic: a windowed aggregate's change, or a stream's row.
_RECORD: dict[str, Any] = {
    "type": "object",
    "description": (
        "A record of the output's topic as the job wrote it: for a windowed aggregate, a "
        "change of a window (its key columns, `window_start`, `window_end`, `values`, "
        "`previous`, `kind`, `version`, `watermark`, `batch`); for a stream, its row."
    ),
    "properties": {
        "window_start": {"type": "string", "format": "date-time"},
        "window_end": {"type": "string", "format": "date-time"},
        "values": {"type": ["object", "null"]},
        "previous": {"type": ["object", "null"]},
        "kind": {"type": "string", "enum": ["provisional", "final", "correction"]},
        "version": {"type": "integer"},
        "watermark": {"type": ["string", "null"], "format": "date-time"},
        "batch": {"type": "integer"},
    },
    "additionalProperties": True,
}
#: The changes route's answer in the OpenAPI description.
CHANGES_STREAM = event_stream(
    "Server-Sent Events: a `snapshot` (none when resuming), then every `change`, until "
    "the client leaves or an `error` ends the stream.",
    [
        Event(
            "snapshot",
            "the latest record of every key of the output, at a position in its topic",
            {
                "type": "object",
                "properties": {"items": {"type": "array", "items": _RECORD}},
                "required": ["items"],
            },
            id=_POSITION,
        ),
        Event("change", "the next record of the output's topic, in order", _RECORD, id=_POSITION),
        ERROR,
    ],
    'retry: 1000\n\nid: 0:14,1:9\nevent: change\ndata: {"page": "/home", '
    '"window_start": "2026-11-27T10:00:10.000Z", "window_end": "2026-11-27T10:00:20.000Z", '
    '"values": {"views": 1}, "previous": null, "kind": "provisional", "version": 1, '
    '"watermark": null, "batch": 5}\n\n',
)


def _sse(event: str, event_id: str, data: str) -> str:
    if "\n" in data:  # a record's JSON is one line; a value with line breaks keeps them
        data = data.replace("\n", "\ndata: ")
    return f"id: {event_id}\nevent: {event}\ndata: {data}\n\n"


def _error_data(exc: KappaflowError) -> dict[str, str]:
    return {"code": exc.code, "error": str(exc)}


def add_push_routes(app: FastAPI, settings: Settings) -> None:
    """``/v1/jobs/{job}/outputs/{output}/changes``: Server-Sent Events, and ``.../ws``."""
    hubs = PushHubs(settings)
    app.state.push = hubs
    backlog = settings.api.push_backlog
    previous = app.router.lifespan_context

    @asynccontextmanager
    async def lifespan(running: Any) -> AsyncIterator[Any]:
        async with previous(running) as state:
            yield state
        hubs.close()

    app.router.lifespan_context = lifespan

    def gauge(request_app: Any, job: str, output: str, transport: str, step: int) -> None:
        metrics = getattr(request_app.state, "metrics", None)
        if metrics is not None:
            metrics.subscribers.labels(job=job, output=output, transport=transport).inc(step)

    @app.get(
        "/v1/jobs/{job}/outputs/{output}/changes",
        summary="The output's changes as Server-Sent Events: a snapshot, then each change.",
        response_class=StreamingResponse,
        responses=CHANGES_STREAM,
    )
    async def changes(
        request: Request,
        job: str,
        output: str,
        last_event_id: Annotated[
            str | None, Header(alias="Last-Event-ID", description="resume after this event")
        ] = None,
        resume: Annotated[
            str | None, Query(alias="last_event_id", description="as the Last-Event-ID header")
        ] = None,
    ) -> StreamingResponse:
        hub = hubs.hub(hubs.topic(job, output))
        subscriber = await hub.subscribe(last_event_id or resume, backlog)
        gauge(request.app, job, output, "sse", 1)

        async def body() -> AsyncIterator[str]:
            try:
                yield "retry: 1000\n\n"
                async for events in subscriber.events():
                    # A batch's events in one write.
                    yield "".join(_sse(*e) for e in events) if events else ": keep-alive\n\n"
            except KappaflowError as exc:
                yield f"event: error\ndata: {json.dumps(_error_data(exc))}\n\n"
            finally:
                subscriber.close()
                gauge(request.app, job, output, "sse", -1)

        return StreamingResponse(
            body(),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )

    @app.websocket("/v1/jobs/{job}/outputs/{output}/changes/ws")
    async def changes_ws(
        websocket: WebSocket,
        job: str,
        output: str,
        last_event_id: Annotated[str | None, Query(description="resume after this event")] = None,
    ) -> None:
        await websocket.accept()
        try:
            hub = hubs.hub(hubs.topic(job, output))
            subscriber = await hub.subscribe(last_event_id, backlog)
        except KappaflowError as exc:
            await _close(websocket, exc)
            return
        gauge(websocket.app, job, output, "websocket", 1)
        watcher = asyncio.create_task(_until_closed(websocket))
        try:
            async for events in subscriber.events():
                if watcher.done():
                    return
                for name, event_id, data in events:
                    await websocket.send_text(
                        f'{{"event": "{name}", "id": "{event_id}", "data": {data}}}'
                    )
        except KappaflowError as exc:
            await _close(websocket, exc)
        except WebSocketDisconnect:
            return
        finally:
            watcher.cancel()
            subscriber.close()
            gauge(websocket.app, job, output, "websocket", -1)


async def _until_closed(websocket: WebSocket) -> None:
    """Reads (and ignores) what the client sends, until it closes."""
    while (await websocket.receive())["type"] != "websocket.disconnect":
        pass


async def _close(websocket: WebSocket, exc: KappaflowError) -> None:
    """An error's last message, then a close whose code is 4000 + its HTTP status."""
    with contextlib.suppress(WebSocketDisconnect, RuntimeError):
        await websocket.send_text(json.dumps({"event": "error", "data": _error_data(exc)}))
        await websocket.close(code=4000 + http_status(exc), reason=f"{exc.code}: {exc}"[:120])
