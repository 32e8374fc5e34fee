"""The service's test job (served.py), run once per test worker, and the service's
application in this process: what every test of the service starts from."""

from __future__ import annotations

import os
import threading
import uuid
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import uvicorn
from conftest import run_kappaflow
from fastapi import FastAPI
from live_jobs import send_json, stop_if_running

from kappaflow.api.app import create_app
from kappaflow.kafka.topics import create_topic
from kappaflow.procs import free_port
from kappaflow.settings import Settings
from kappaflow.timeutil import from_epoch_ms, iso, parse_time, to_epoch_ms
from kappaflow.waiting import wait_for

SUPPORT = Path(__file__).resolve().parent
# A minute boundary: the 10 s windows line up with the views.
BASE = 1_795_300_000_000 - 1_795_300_000_000 % 60_000
VIEWS = [
    {
        "user": f"u{i % 3}",
        "page": f"/p{i % 4}",
        "at": iso(from_epoch_ms(BASE + i * 1500)),
        "id": f"v{i}",
    }
    for i in range(24)
]
#: A fourth user with one early view: a latest record that is not ``regular``.
VIEWS.append({"user": "u3", "page": "/p0", "at": iso(from_epoch_ms(BASE + 1000)), "id": "w-0"})
WINDOW_MS = 10_000
#: The latest view is at BASE + 34.5 s and the watermark 5 s behind it: windows ending
#: by BASE + 29.5 s are final.
WATERMARK = BASE + 23 * 1500 - 5000


def at(ms: int) -> str:
    return iso(from_epoch_ms(ms))


def expected_windows() -> dict[tuple[str, int], int]:
    """Views per (page, window start), computed without the engine."""
    counts: Counter[tuple[str, int]] = Counter()
    for view in VIEWS:
        ts = to_epoch_ms(parse_time(view["at"]))
        counts[(view["page"], ts - ts % WINDOW_MS)] += 1
    return dict(counts)


@dataclass(frozen=True)
class Served:
    settings: Settings
    job: str
    #: The topic of the views tests add while the job runs (the output ``clicks``).
    live: str


@contextmanager
def run_served(serving: Settings) -> Iterator[Served]:
    """The job, run until every view is in both outputs."""
    suffix = uuid.uuid4().hex[:8]
    topic, live, job = f"views-{suffix}", f"live-{suffix}", f"served-{suffix}"
    create_topic(serving.kafka, topic, partitions=2)
    create_topic(serving.kafka, live, partitions=2)
    send_json(serving, topic, VIEWS, key="user")
    env = {"PYTHONPATH": os.pathsep.join([str(SUPPORT), os.environ.get("PYTHONPATH", "")])}
    started = run_kappaflow(
        serving,
        "jobs",
        "start",
        job,
        "--app",
        "served:build",
        "-P",
        f"topic={topic}",
        "-P",
        f"live={live}",
        env=env,
    )
    assert started.code == 0, started.err
    try:
        with serve(serving) as client:

            def complete() -> bool | None:
                outputs = client.get(f"/v1/jobs/{job}/outputs").json()["items"]
                events = {o["output"]: o["stats"].get("events", 0) for o in outputs}
                done = events.get("pages") == 25 and events.get("last_view") == 25
                # The watermark the views made reaches the windows a batch later.
                final = f"/v1/jobs/{job}/outputs/pages/windows?key=/p0&final=true"
                return True if done and client.get(final).json()["items"] else None

            wait_for(complete, timeout=240, interval=1, what=f"{job} to serve all 25 views")
        yield Served(serving, job, live)
    finally:
        stop_if_running(serving, job)


_APPS: dict[str, FastAPI] = {}


def served_app(client: httpx.Client) -> FastAPI:
    """The application ``client`` (from ``serve``) talks to."""
    return _APPS[str(client.base_url)]


@contextmanager
def serve(settings: Settings) -> Iterator[httpx.Client]:
    """The service's application on a free port, in this process; a client of it."""
    port = free_port()
    app = create_app(settings)
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    wait_for(lambda: server.started or None, timeout=60, what="the service to listen")
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30) as client:
            _APPS[str(client.base_url)] = app
            yield client
    finally:
        server.should_exit = True
        thread.join(timeout=30)
