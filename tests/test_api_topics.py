"""The service's topic browser on the real broker: the topics with their records and
rate, pages of records from an offset, a time or a cursor, and following a topic's new
records as Server-Sent Events, a slow client's included."""

from __future__ import annotations

import base64
import json
import socket
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
from prometheus_client.parser import text_string_to_metric_families
from service import serve

import kappaflow.api.topics
from kappaflow.kafka.topics import create_topic
from kappaflow.procs import free_port
from kappaflow.settings import Settings
from kappaflow.timeutil import from_epoch_ms, iso, parse_time, to_epoch_ms
from kappaflow.waiting import wait_for

#: Record timestamps of the tests that read by time: an hour ago, a second apart.
T0 = to_epoch_ms(parse_time("1h")) // 1000 * 1000


@pytest.fixture(scope="module")
def api(serving: Settings) -> Iterator[httpx.Client]:
    with serve(serving) as client:
        yield client


def without_kafka(settings: Settings) -> Settings:
    """``settings`` with Kafka at an address where nothing listens (the store answers)."""
    dead = {"bootstrap_servers": f"127.0.0.1:{free_port()}", "timeout_s": 2.0}
    return settings.model_copy(update={"kafka": settings.kafka.model_copy(update=dead)})


@pytest.fixture
def topic(kafka: Settings) -> Callable[[int], str]:
    def make(partitions: int) -> str:
        name = f"browse-{uuid.uuid4().hex[:10]}"
        create_topic(kafka.kafka, name, partitions=partitions)
        return name

    return make


def produce(kafka: Settings, topic: str, records: list[dict[str, Any]]) -> None:
    producer = Producer(kafka.kafka.client_config())
    for record in records:
        producer.produce(topic, **record)
    assert producer.flush(30) == 0


def commit(kafka: Settings, group: str, offsets: list[TopicPartition]) -> None:
    """Commit ``offsets`` for ``group``; again while the broker still creates its
    ``__consumer_offsets`` (a fresh broker answers NOT_COORDINATOR meanwhile)."""
    member = Consumer({**kafka.kafka.client_config(), "group.id": group})

    def committed() -> bool | None:
        try:
            member.commit(offsets=offsets, asynchronous=False)
        except KafkaException:
            return None
        return True

    try:
        wait_for(committed, timeout=60, interval=0.5, what=f"a commit of {group}")
    finally:
        member.close()


def ok(answer: httpx.Response) -> Any:
    assert answer.status_code == 200, answer.text
    return answer.json()


def refused(answer: httpx.Response, status: int, code: str) -> str:
    assert answer.status_code == status, answer.text
    body = answer.json()
    assert body["code"] == code, body
    message: str = body["error"]
    return message


def test_topics_with_records_and_rate(
    api: httpx.Client, kafka: Settings, topic: Callable[[int], str]
) -> None:
    name = topic(2)
    produce(kafka, name, [{"value": b"v", "partition": i % 2} for i in range(12)])
    # A committed offset makes sure the broker has its internal __consumer_offsets.
    commit(kafka, f"g-{name}", [TopicPartition(name, 0, 1)])
    listed = {t["name"]: t for t in ok(api.get("/v1/topics"))["items"]}
    on_disk = listed[name].pop("bytes_on_disk")
    assert listed[name] == {
        "name": name,
        "partitions": 2,
        "records": 12,
        "records_last_minute": 12,
        "rate_per_s": 0.2,
    }
    # The embedded broker's partition directories: the records' batches and the indexes.
    assert on_disk is None if not kafka.kafka.embedded else on_disk > 12
    assert not any(n.startswith("__") for n in listed)
    internal = {t["name"] for t in ok(api.get("/v1/topics?internal=true"))["items"]}
    assert "__consumer_offsets" in internal and set(listed) <= internal


def test_records_page_by_page(
    api: httpx.Client, kafka: Settings, topic: Callable[[int], str]
) -> None:
    name = topic(2)
    sent = [
        {"key": f"k{i}".encode(), "value": f"value {i}".encode(), "partition": i % 2}
        for i in range(11)
    ]
    sent.append(
        {"key": b"\xff\xfe", "value": b"\x00\xff", "partition": 0, "headers": [("h", b"x")]}
    )
    produce(kafka, name, sent)
    seen: list[dict[str, Any]] = []
    cursors: list[str] = []
    params: dict[str, Any] = {"limit": 5}
    while True:
        page = ok(api.get(f"/v1/topics/{name}/records", params=params))
        assert len(page["items"]) <= 5
        seen += page["items"]
        if page["next"] is None:
            break
        cursors.append(page["next"])
        params = {"limit": 5, "cursor": page["next"]}
    assert len(cursors) >= 2
    assert sorted((r["partition"], r["offset"]) for r in seen) == sorted(
        [(0, o) for o in range(7)] + [(1, o) for o in range(5)]
    )
    text = {r["key"]: r for r in seen if not r["key_base64"]}
    assert text["k3"]["value"] == "value 3" and not text["k3"]["value_base64"]
    assert text["k3"]["partition"] == 1 and text["k3"]["headers"] == []
    assert parse_time(text["k3"]["timestamp"]).tzinfo is not None
    (binary,) = [r for r in seen if r["key_base64"]]
    assert base64.b64decode(binary["key"]) == b"\xff\xfe"
    assert binary["value_base64"] and base64.b64decode(binary["value"]) == b"\x00\xff"
    assert binary["headers"] == [{"key": "h", "value": "x", "base64": False}]
    # The last cursor, read again, gives the last page again.
    again = ok(api.get(f"/v1/topics/{name}/records", params={"cursor": cursors[-1]}))
    assert again["items"] == seen[-len(again["items"]) :] and again["next"] is None


def test_records_from_an_offset_or_a_time(
    api: httpx.Client, kafka: Settings, topic: Callable[[int], str]
) -> None:
    name = topic(2)
    stamped = [
        {"value": f"{i}".encode(), "partition": 0, "timestamp": T0 + i * 1000} for i in range(5)
    ]
    produce(kafka, name, [*stamped, {"value": b"other", "partition": 1, "timestamp": T0}])
    base = f"/v1/topics/{name}/records"

    def places(**params: Any) -> list[tuple[int, int]]:
        return [(r["partition"], r["offset"]) for r in ok(api.get(base, params=params))["items"]]

    assert places(offset=3, partition=0) == [(0, 3), (0, 4)]
    assert places(offset=1) == [(0, 1), (0, 2), (0, 3), (0, 4)]
    after = iso(from_epoch_ms(T0 + 2000))
    assert places(**{"from": after}) == [(0, 2), (0, 3), (0, 4)]
    page = ok(api.get(base, params={"from": iso(from_epoch_ms(T0 + 2500)), "partition": 0}))
    assert [r["timestamp"] for r in page["items"]] == [
        iso(from_epoch_ms(T0 + 3000)),
        iso(from_epoch_ms(T0 + 4000)),
    ]
    # Past the end: no records, and nothing more to read.
    assert ok(api.get(base, params={"offset": 99}))["items"] == []
    assert ok(api.get(base, params={"from": "now"}))["next"] is None
    page = ok(api.get(base, params={"limit": 2, "partition": 0}))
    assert page["next"] == "0:2"


def test_bad_input(api: httpx.Client, topic: Callable[[int], str]) -> None:
    name = topic(2)
    missing = f"missing-{uuid.uuid4().hex[:8]}"
    assert missing in refused(api.get(f"/v1/topics/{missing}/records"), 404, "KF404")
    refused(api.get(f"/v1/topics/{missing}/follow"), 404, "KF404")
    base = f"/v1/topics/{name}/records"
    assert "no partition 7" in refused(api.get(base, params={"partition": 7}), 404, "KF505")
    refused(api.get(f"/v1/topics/{name}/follow", params={"partition": 7}), 404, "KF505")
    assert "offset" in refused(api.get(base, params={"offset": -1}), 400, "KF851")
    assert "zone" in refused(api.get(base, params={"from": "2026-01-01T00:00:00"}), 400, "KF851")
    refused(api.get(base, params={"from": "yesterday"}), 400, "KF851")
    refused(api.get(f"/v1/topics/{name}/follow", params={"from": "soon"}), 400, "KF851")
    refused(api.get(base, params={"offset": 0, "from": "1h"}), 400, "KF851")
    refused(api.get(base, params={"cursor": "zero:one"}), 400, "KF851")
    refused(api.get(base, params={"cursor": "5:0"}), 400, "KF851")
    refused(api.get(base, params={"limit": 0}), 400, "KF851")


def events(lines: Iterator[str]) -> Iterator[tuple[str, dict[str, Any]]]:
    """(event, data) of a stream of Server-Sent Events."""
    name = "message"
    for line in lines:
        if line.startswith("event: "):
            name = line.removeprefix("event: ")
        elif line.startswith("data: "):
            yield name, json.loads(line.removeprefix("data: "))


def followers(api: httpx.Client, name: str, metric: str) -> float:
    for family in text_string_to_metric_families(api.get("/metrics").text):
        for sample in family.samples:
            if sample.name == metric and sample.labels.get("topic") == name:
                return sample.value
    return 0.0


def test_follow_sees_new_records_until_the_client_leaves(
    api: httpx.Client, kafka: Settings, topic: Callable[[int], str]
) -> None:
    name = topic(2)
    produce(kafka, name, [{"value": b"before", "partition": 0}])
    with api.stream("GET", f"/v1/topics/{name}/follow") as answer:
        assert answer.headers["content-type"].startswith("text/event-stream")
        stream = events(answer.iter_lines())
        assert next(stream) == ("start", {"topic": name, "offsets": {"0": 1, "1": 0}})
        produce(kafka, name, [{"value": f"new {i}".encode(), "partition": i % 2} for i in range(4)])
        got = [next(stream) for _ in range(4)]
        assert {kind for kind, _ in got} == {"record"}
        assert sorted(r["value"] for _, r in got) == ["new 0", "new 1", "new 2", "new 3"]
        assert followers(api, name, "kappaflow_api_topic_followers") == 1
    wait_for(
        lambda: followers(api, name, "kappaflow_api_topic_followers") == 0 or None,
        timeout=30,
        what="the service to notice the client left",
    )


def test_follow_from_a_time(
    api: httpx.Client, kafka: Settings, topic: Callable[[int], str]
) -> None:
    name = topic(1)
    produce(kafka, name, [{"value": f"{i}".encode(), "timestamp": T0 + i * 1000} for i in range(3)])
    since = iso(from_epoch_ms(T0 + 1000))
    with api.stream("GET", f"/v1/topics/{name}/follow", params={"from": since}) as answer:
        stream = events(answer.iter_lines())
        assert next(stream) == ("start", {"topic": name, "offsets": {"0": 1}})
        assert [next(stream)[1]["value"] for _ in range(2)] == ["1", "2"]


def test_a_client_too_slow_is_dropped_with_the_reason(
    api: httpx.Client, kafka: Settings, topic: Callable[[int], str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(kappaflow.api.topics, "FOLLOW_QUEUE", 5)
    name = topic(1)
    port = api.base_url.port
    assert port is not None
    slow = socket.socket()
    # A small receive window: the service's writes back up soon after the client stops.
    slow.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    slow.settimeout(30)
    slow.connect(("127.0.0.1", port))
    try:
        slow.sendall(f"GET /v1/topics/{name}/follow HTTP/1.1\r\nHost: test\r\n\r\n".encode())
        head = b""
        while b"event: start" not in head:
            head += slow.recv(1024)
        big = b"x" * 100_000

        def dropped() -> bool | None:
            if followers(api, name, "kappaflow_api_topic_followers_dropped_total") >= 1:
                return True
            produce(kafka, name, [{"value": big} for _ in range(10)])
            return None

        wait_for(dropped, timeout=120, interval=0.1, what="the slow client to be dropped")
        rest = b""
        while chunk := slow.recv(65536):
            rest += chunk
            if b"event: error" in rest and rest.endswith(b"0\r\n\r\n"):
                break
    finally:
        slow.close()
    ending = rest[rest.rindex(b"event: error") :].decode()
    data = json.loads(ending.split("data: ", 1)[1].split("\n", 1)[0])
    assert data["code"] == "KF880" and "too slowly" in data["error"]


def test_a_broker_that_is_down_answers_503(serving: Settings) -> None:
    with serve(without_kafka(serving)) as client:
        refused(client.get("/v1/topics"), 503, "KF401")
