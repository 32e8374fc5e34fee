"""Push: an output's changes over Server-Sent Events and WebSocket, from the job's Kafka
changelog, with resume by last event id, and its bad input.

The service's test job (tests/support/served.py) runs once per worker: ``pages`` holds a
fixed set of views; ``clicks`` counts the views each test adds to the live topic, under
pages of its own, with event times from now on (so no test's views are late for another's).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest
from live_jobs import send_json
from service import VIEWS, Served, expected_windows, serve, served_app
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

from kappaflow.api.hub import Change, Hub, encode_position
from kappaflow.errors import SubscriberTooSlowError
from kappaflow.jobs.files import PLAN
from kappaflow.jobs.manager import JobManager, JobRecord, JobState
from kappaflow.settings import KafkaSettings
from kappaflow.timeutil import iso, parse_time, to_epoch_ms

Event = tuple[str, str, dict[str, Any]]


@pytest.fixture(scope="module")
def api(served: Served) -> Iterator[httpx.Client]:
    with serve(served.settings) as client:
        yield client


@contextmanager
def subscribe(
    api: httpx.Client, path: str, last_event_id: str | None = None
) -> Iterator[Iterator[Event]]:
    """The events of an SSE stream: (event, id, data)."""
    headers = {"Last-Event-ID": last_event_id} if last_event_id else {}
    with api.stream("GET", path, headers=headers, timeout=httpx.Timeout(30, read=90)) as answer:
        assert answer.status_code == 200, answer.read()
        assert answer.headers["content-type"].startswith("text/event-stream")
        yield _events(answer.iter_lines())


def _events(lines: Iterator[str]) -> Iterator[Event]:
    fields: dict[str, str] = {}
    for line in lines:
        if line:
            if not line.startswith(":"):
                name, _, value = line.partition(": ")
                fields[name] = value
            continue
        if "data" in fields:
            yield fields.get("event", "message"), fields.get("id", ""), json.loads(fields["data"])
        fields = {}


def until(events: Iterator[Event], done: Any) -> list[Event]:
    """Events read until ``done(all read so far)`` holds (the stream's read timeout bounds
    the wait)."""
    seen: list[Event] = []
    for event in events:
        seen.append(event)
        if done(seen):
            return seen
    raise AssertionError(f"the stream ended after {len(seen)} events")


def add_views(served: Served, pages: list[str], per_page: int) -> None:
    """``per_page`` views of each page, now, into the live topic."""
    now = datetime.now(UTC)
    views = [
        {
            "user": f"u{i}",
            "page": page,
            "at": iso(now + timedelta(milliseconds=i)),
            "id": uuid.uuid4().hex,
        }
        for page in pages
        for i in range(per_page)
    ]
    send_json(served.settings, served.live, views, key="user")


def views_of(events: list[Event], page: str) -> int:
    """The latest count of ``page`` the changes give (its windows summed)."""
    latest: dict[str, int] = {}
    for _, _, data in events:
        if data.get("page") == page:
            latest[data["window_start"]] = data["values"]["views"]
    return sum(latest.values())


def test_a_snapshot_first_then_every_change_in_order(api: httpx.Client, served: Served) -> None:
    with subscribe(api, f"/v1/jobs/{served.job}/outputs/pages/changes") as events:
        name, first_id, snapshot = next(events)
        assert name == "snapshot" and first_id
        windows = {
            (item["page"], to_epoch_ms(parse_time(item["window_start"]))): item
            for item in snapshot["items"]
        }
        assert {k: w["values"]["views"] for k, w in windows.items()} == expected_windows()
        assert sum(w["values"]["views"] for w in windows.values()) == len(VIEWS)
        # The job's watermark passes the first windows: they become final, in the snapshot
        # or (a batch after the counts) as changes.
        if not any(w["kind"] == "final" for w in windows.values()):
            finals = until(events, lambda s: s[-1][2]["kind"] == "final")
            assert (
                finals[-1][2]["values"]
                == windows[
                    (finals[-1][2]["page"], to_epoch_ms(parse_time(finals[-1][2]["window_start"])))
                ]["values"]
            )

    page = f"/push-{uuid.uuid4().hex[:6]}"
    path = f"/v1/jobs/{served.job}/outputs/clicks/changes"
    with subscribe(api, path) as events:
        assert next(events)[0] == "snapshot"
        add_views(served, [page], 3)
        seen = until(events, lambda s: views_of(s, page) == 3)
    mine = [data for _, _, data in seen if data.get("page") == page]
    assert all(name == "change" for name, _, _ in seen)
    # A window's changes come in version order, each with the values before it.
    for before, after in itertools.pairwise(mine):
        if before["window_start"] == after["window_start"]:
            assert after["version"] > before["version"]
            assert after["previous"] == before["values"]
    ids = [event_id for _, event_id, _ in seen]
    assert len(set(ids)) == len(ids)


def test_a_subscriber_that_comes_back_resumes_with_nothing_lost_or_repeated(
    api: httpx.Client, served: Served
) -> None:
    first, second = (f"/resume-{uuid.uuid4().hex[:6]}-{i}" for i in range(2))
    path = f"/v1/jobs/{served.job}/outputs/clicks/changes"
    with subscribe(api, path) as cut:
        next(cut)
        add_views(served, [first], 2)
        before = until(cut, lambda s: views_of(s, first) == 2)
    # Gone after its last event; more changes come while it is away.
    last_id = before[-1][1]
    with subscribe(api, path) as whole:
        next(whole)
        add_views(served, [second], 4)
        reference = until(whole, lambda s: views_of(s, second) == 4)
    with subscribe(api, path, last_event_id=last_id) as resumed:
        again = until(resumed, lambda s: views_of(s, second) == 4)
    assert all(name == "change" for name, _, _ in again)
    # Exactly the changes after the id: what an uninterrupted subscriber saw of them...
    assert [d for _, _, d in again if d.get("page") == second] == [
        d for _, _, d in reference if d.get("page") == second
    ]
    # ...and none it had before.
    assert not [d for _, _, d in again if d in [b for _, _, b in before]]
    ids = [event_id for _, event_id, _ in before + again]
    assert len(set(ids)) == len(ids)


def test_resuming_from_before_the_records_the_service_keeps_reads_kafka(
    api: httpx.Client, served: Served
) -> None:
    page = f"/old-{uuid.uuid4().hex[:6]}"
    path = f"/v1/jobs/{served.job}/outputs/clicks/changes"
    with subscribe(api, path) as events:
        _, start_id, _ = next(events)
        add_views(served, [page], 2)
        live = until(events, lambda s: views_of(s, page) == 2)
    hub = api_hub(api, served, "clicks")
    with hub.lock:
        # Forget every record kept: a resume must read them from Kafka.
        hub.records.clear()
        hub.base = dict(hub.position)
    with subscribe(api, path, last_event_id=start_id) as resumed:
        again = until(resumed, lambda s: views_of(s, page) == 2)

    def in_order(events: list[Event]) -> list[dict[str, Any]]:
        mine = [d for _, _, d in events if d.get("page") == page]
        return sorted(mine, key=lambda d: (d["window_start"], d["version"]))

    assert in_order(again) == in_order(live)
    ids = [event_id for _, event_id, _ in again]
    assert len(set(ids)) == len(ids)


def api_hub(api: httpx.Client, served: Served, output: str) -> Hub:
    """The hub of the in-process service ``api`` talks to."""
    hubs = served_app(api).state.push
    hub = hubs.find(hubs.topic(served.job, output))
    assert isinstance(hub, Hub), f"no subscriber of {output} yet"
    return hub


def test_the_websocket_gives_the_same_events(api: httpx.Client, served: Served) -> None:
    page = f"/ws-{uuid.uuid4().hex[:6]}"
    url = f"{api.base_url}".replace("http://", "ws://")
    path = f"/v1/jobs/{served.job}/outputs/clicks/changes"
    with connect(f"{url}{path}/ws", open_timeout=30) as socket:
        first = json.loads(socket.recv(timeout=60))
        assert first["event"] == "snapshot" and isinstance(first["data"]["items"], list)
        add_views(served, [page], 2)
        seen: list[Event] = []
        while views_of(seen, page) != 2:
            message = json.loads(socket.recv(timeout=60))
            seen.append((message["event"], message["id"], message["data"]))
    with subscribe(api, path, last_event_id=first["id"]) as events:
        over_sse = until(events, lambda s: views_of(s, page) == 2)
    assert over_sse == seen


@pytest.mark.parametrize(
    ("path", "header", "status", "code"),
    [
        ("/v1/jobs/no-such-job/outputs/pages/changes", None, 404, "KF601"),
        ("/v1/jobs/{job}/outputs/nothing/changes", None, 404, "KF852"),
        ("/v1/jobs/{job}/outputs/last_view/changes", None, 404, "KF870"),
        ("/v1/jobs/{job}/outputs/pages/changes", "0:x", 400, "KF871"),
        ("/v1/jobs/{job}/outputs/pages/changes", "0:0,7:3", 400, "KF871"),
        ("/v1/jobs/{job}/outputs/pages/changes", "0:99999999", 400, "KF871"),
    ],
)
def test_bad_subscriptions_are_refused_with_a_code(
    api: httpx.Client, served: Served, path: str, header: str | None, status: int, code: str
) -> None:
    headers = {"Last-Event-ID": header} if header else {}
    answer = api.get(path.format(job=served.job), headers=headers)
    assert answer.status_code == status, answer.text
    assert answer.json()["code"] == code
    # The websocket says the same in its last message and close code.
    url = f"{api.base_url}".replace("http://", "ws://") + path.format(job=served.job) + "/ws"
    if header:
        url += f"?last_event_id={header}"
    with connect(url, open_timeout=30) as socket:
        message = json.loads(socket.recv(timeout=60))
        assert message["event"] == "error" and message["data"]["code"] == code
        with pytest.raises(Exception) as closed:
            socket.recv(timeout=30)
    assert getattr(closed.value, "rcvd", None) is not None
    assert closed.value.rcvd.code == 4000 + status  # type: ignore[attr-defined]


def test_a_slow_subscriber_is_dropped_and_the_others_get_everything(
    api: httpx.Client, served: Served
) -> None:
    hub = api_hub(api, served, "clicks")
    page = f"/slow-{uuid.uuid4().hex[:6]}"

    # The subscribers live on the service's event loop, as its requests' do.
    slow = asyncio.run_coroutine_threadsafe(hub.subscribe(None, 1), hub.loop).result(60)
    fast = asyncio.run_coroutine_threadsafe(hub.subscribe(None, 10_000), hub.loop).result(60)
    try:
        # Two batches of changes at least: the slow one reads nothing meanwhile.
        fast_events = fast.events()
        add_views(served, [page], 2)
        wait_for_changes(hub, fast_events, page, 2)
        add_views(served, [page + "-2"], 2)
        wait_for_changes(hub, fast_events, page + "-2", 2)
        assert slow.dropped and not fast.dropped

        async def read_slow() -> list[Any]:
            got: list[Any] = []
            with pytest.raises(SubscriberTooSlowError, match="behind"):
                async for events in slow.events():
                    got += events
            return got

        read = asyncio.run_coroutine_threadsafe(read_slow(), hub.loop).result(60)
        assert [e[0] for e in read] == ["snapshot"]
    finally:
        slow.close()
        fast.close()


def within(lines: Iterator[str], deadline: float) -> Iterator[str]:
    """``lines`` (an SSE stream's, whose keep-alives come every 15 s) until ``deadline``."""
    for line in lines:
        assert time.monotonic() < deadline, "the stream went on past its deadline"
        yield line


def test_a_dropped_subscriber_is_told_so_as_a_client_sees_it(served: Served) -> None:
    """With api.push_backlog at 1, a batch of two changes or more is more than any
    subscriber may fall behind: an SSE client's stream ends with an error event
    (KF872), a WebSocket client's last message says the same and it is closed with
    4503 and the code as its reason."""
    api = served.settings.api.model_copy(update={"push_backlog": 1})
    path = f"/v1/jobs/{served.job}/outputs/clicks/changes"
    # Twenty new pages: one batch of the job holds a change for each.
    pages = [f"/drop-{uuid.uuid4().hex[:6]}-{n}" for n in range(20)]
    with serve(served.settings.model_copy(update={"api": api})) as client:
        url = f"{client.base_url}".replace("http://", "ws://") + path + "/ws"
        with (
            client.stream("GET", path, timeout=httpx.Timeout(30, read=90)) as answer,
            connect(url, open_timeout=30) as socket,
        ):
            assert answer.status_code == 200
            events = _events(within(answer.iter_lines(), time.monotonic() + 120))
            assert next(events)[0] == "snapshot"
            assert json.loads(socket.recv(timeout=60))["event"] == "snapshot"
            add_views(served, pages, 2)
            over_sse = list(events)  # until the service ends the stream
            messages: list[dict[str, Any]] = []
            with pytest.raises(ConnectionClosed) as closed:
                while True:
                    messages.append(json.loads(socket.recv(timeout=60)))
    assert over_sse, "the stream ended without an event"
    name, event_id, data = over_sse[-1]
    assert (name, event_id, data["code"]) == ("error", "", "KF872"), over_sse[-1]
    assert "resume with the last event id" in data["error"]
    assert all(e[0] == "change" for e in over_sse[:-1])
    assert messages[-1]["event"] == "error" and messages[-1]["data"]["code"] == "KF872"
    assert all(m["event"] == "change" for m in messages[:-1])
    received = closed.value.rcvd
    assert received is not None and received.code == 4503
    assert received.reason.startswith("KF872: dropped: more than 1 changes behind")


def wait_for_changes(hub: Hub, stream: Any, page: str, views: int) -> None:
    """Reads a subscriber's events on the service's loop until ``page`` has ``views``."""

    async def read() -> None:
        seen: list[Event] = []
        async for events in stream:
            seen += [(e[0], e[1], json.loads(e[2])) for e in events if e[0] == "change"]
            if views_of(seen, page) == views:
                return

    asyncio.run_coroutine_threadsafe(asyncio.wait_for(read(), 90), hub.loop).result(100)


def test_positions_name_every_partition_in_order() -> None:
    assert encode_position({1: 5, 0: 7}) == "0:7,1:5"


def test_an_output_whose_topic_cannot_be_read_is_503(api: httpx.Client, served: Served) -> None:
    """A job whose recorded plan names a topic the broker does not have (deleted since)."""
    jobs = JobManager(served.settings)
    name = f"gone-{uuid.uuid4().hex[:6]}"
    home = jobs.job_dir(name)
    home.mkdir(parents=True)
    JobRecord(name, "served:build", {}, state=JobState.STOPPED).save(home / "job.json")
    plan = {"outputs": [{"name": "pages", "sinks": [{"kafka": f"{name}.pages"}]}]}
    (home / PLAN).write_text(json.dumps(plan))
    answer = api.get(f"/v1/jobs/{name}/outputs/pages/changes")
    assert answer.status_code == 503, answer.text
    assert answer.json()["code"] == "KF873" and f"{name}.pages" in answer.json()["error"]


def test_a_subscriber_gets_no_record_twice_that_its_snapshot_holds() -> None:
    """Records the hub applied before a subscriber joined, but handed out after: the
    snapshot has them, so the subscriber skips them (the hub alone, no Kafka)."""

    async def scenario() -> list[tuple[str, str, str]]:
        hub = Hub(KafkaSettings(), "t", asyncio.get_running_loop())
        hub.position, hub.base, hub.low = {0: 0, 1: 0}, {0: 0, 1: 0}, {0: 0, 1: 0}
        early = [Change(0, i, f"k{i}".encode(), f'{{"n": {i}}}') for i in range(3)]
        for change in early:
            hub._apply(change)
        hub.settled.set()
        subscriber = await hub.subscribe(None, backlog=100)
        later = [Change(1, 0, b"k9", '{"n": 9}')]
        hub._apply(later[0])
        hub._dispatch(early)  # applied before it joined, handed out after
        hub._dispatch(later)
        got: list[tuple[str, str, str]] = []
        events = subscriber.events()
        for _ in range(3):
            got += await anext(events)
        return got

    got = asyncio.run(scenario())
    assert got[0][0] == "snapshot" and got[0][1] == "0:3,1:0"
    assert [len(json.loads(got[0][2])["items"])] == [3]
    assert got[1:] == [("change", "0:3,1:1", '{"n": 9}')]
