"""`kappaflow produce | consume | replay` against the real broker."""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from confluent_kafka import Producer
from conftest import RunCli

from kappaflow.settings import Settings
from kappaflow.timeutil import iso, to_epoch_ms

# Record timestamps within the broker's retention (7 days): older ones are deleted as
# soon as its retention check first runs, whenever in the test session that is.
BASE = datetime.now(UTC).replace(second=0, microsecond=0) - timedelta(hours=1)


def _records(result_lines: list[str]) -> list[dict[str, Any]]:
    return [json.loads(line) for line in result_lines]


def test_produce_reports_invalid_lines_and_sends_the_rest(
    cli: RunCli, new_topic: Callable[..., str]
) -> None:
    topic = new_topic(partitions=2)
    lines = (
        "\n".join(
            [
                '{"user": "ann", "page": "/a"}',
                "{not json",
                '{"page": "/b"}',
                "",
                '{"user": "bob", "page": "/c"}',
                "[1, 2]",
            ]
        )
        + "\n"
    )
    result = cli("produce", topic, "--key-field", "user", input=lines)
    assert result.code == 1
    assert "line 2: not JSON" in result.err
    assert "line 3: missing key field 'user'" in result.err
    assert "line 6: not a JSON object" in result.err
    assert "sent 2 records" in result.err
    records = _records(cli("consume", topic, "--from-beginning").lines())
    assert sorted((r["key"], r["value"]["page"]) for r in records) == [("ann", "/a"), ("bob", "/c")]
    for record in records:
        assert record["topic"] == topic
        assert {"partition", "offset", "timestamp"} <= set(record)


def test_produce_all_valid_exits_zero(cli: RunCli, new_topic: Callable[..., str]) -> None:
    topic = new_topic()
    lines = "".join(json.dumps({"n": n}) + "\n" for n in range(1000))
    result = cli("produce", topic, input=lines)
    assert result.code == 0, result.err
    assert "sent 1000 records" in result.err
    assert len(cli("consume", topic, "--from-beginning").lines()) == 1000


def test_produce_to_missing_topic(cli: RunCli, topic_name: str) -> None:
    result = cli("produce", topic_name, input='{"a": 1}\n')
    assert result.code == 1
    assert "does not exist" in result.err


def _stamped(settings: Settings, topic: str, partitions: int = 1) -> None:
    """Ten records a minute apart from BASE, spread over partitions, key k<n%2>."""
    producer = Producer(settings.kafka.client_config())
    for n in range(10):
        producer.produce(
            topic,
            key=f"k{n % 2}".encode(),
            value=json.dumps({"n": n}).encode(),
            partition=n % partitions,
            timestamp=to_epoch_ms(BASE + timedelta(minutes=n)),
            headers=[("origin", b"test")],
        )
    assert producer.flush(30) == 0


def test_consume_positions_and_limits(
    cli: RunCli, kafka: Settings, new_topic: Callable[..., str]
) -> None:
    topic = new_topic(partitions=2)
    _stamped(kafka, topic, partitions=2)

    def ns(*args: str) -> list[int]:
        return sorted(r["value"]["n"] for r in _records(cli("consume", topic, *args).lines()))

    assert ns("--from-beginning") == list(range(10))
    assert ns("--from-beginning", "--partition", "1") == [1, 3, 5, 7, 9]
    assert ns("--offset", "3") == [6, 7, 8, 9]  # offsets 3 and 4 of both partitions
    assert len(ns("--from-beginning", "--max", "4")) == 4
    since, until = iso(BASE + timedelta(minutes=3)), iso(BASE + timedelta(minutes=6))
    assert ns("--since", since, "--until", until) == [3, 4, 5, 6]
    assert ns("--since", str(to_epoch_ms(BASE + timedelta(minutes=8)))) == [8, 9]
    assert ns("--since", iso(BASE + timedelta(days=1))) == []
    one = _records(cli("consume", topic, "--from-beginning", "--max", "1").lines())[0]
    assert one["headers"] == {"origin": "test"}
    assert one["timestamp"].endswith("Z")


def test_consume_shows_non_json_values(
    cli: RunCli, kafka: Settings, new_topic: Callable[..., str]
) -> None:
    topic = new_topic()
    producer = Producer(kafka.kafka.client_config())
    producer.produce(topic, value=b"plain text")
    producer.produce(topic, value=b"\xff\xfe\x00")
    producer.flush(30)
    records = _records(cli("consume", topic, "--from-beginning").lines())
    assert [(r["value"], r.get("value_encoding")) for r in records] == [
        ("plain text", "text"),
        ("//4A", "base64"),
    ]


def test_consume_bad_arguments(cli: RunCli, new_topic: Callable[..., str]) -> None:
    topic = new_topic()
    both = cli("consume", topic, "--from-beginning", "--offset", "1")
    assert both.code == 2 and "only one of" in both.err
    bad_time = cli("consume", topic, "--since", "yesterday")
    assert bad_time.code == 2 and "invalid time" in bad_time.err
    no_partition = cli("consume", topic, "--from-beginning", "--partition", "5")
    assert no_partition.code != 0 and "no partition 5" in no_partition.err


def test_replay_copies_a_time_range(
    cli: RunCli, kafka: Settings, new_topic: Callable[..., str], topic_name: str
) -> None:
    source = new_topic(partitions=2)
    _stamped(kafka, source, partitions=2)
    result = cli(
        "replay",
        source,
        topic_name,
        "--since",
        iso(BASE + timedelta(minutes=2)),
        "--until",
        iso(BASE + timedelta(minutes=7)),
    )
    assert result.code == 0, result.err
    assert "replayed 6 records" in result.err
    copied = _records(cli("consume", topic_name, "--from-beginning").lines())
    originals = {
        r["value"]["n"]: r for r in _records(cli("consume", source, "--from-beginning").lines())
    }
    assert sorted(r["value"]["n"] for r in copied) == [2, 3, 4, 5, 6, 7]
    for record in copied:
        original = originals[record["value"]["n"]]
        for field in ("key", "partition", "timestamp", "headers"):
            assert record[field] == original[field]

    same = cli("replay", source, source, "--since", "1h")
    assert same.code != 0 and "other than the source" in same.err
