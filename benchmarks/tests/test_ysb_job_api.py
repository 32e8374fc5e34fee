"""The YSB run's readers of the job API's outputs: the serving store's layout, and the
changelog in a transactional topic."""

from __future__ import annotations

import json
from collections.abc import Callable

import pyarrow as pa
import redis

from kappaflow.kafka.clients import transactional_producer
from kappaflow.serving.client import redis_client
from kappaflow.settings import Settings
from kappaflow.streams.output.backends import BatchAccount, RedisStore
from kappaflow.streams.output.writer import changelog_records
from kappaflow_bench.ysb.results import JobWindows, KafkaWindows
from kappaflow_bench.ysb.store import job_windows


def changes(rows: list[tuple[str, int, int]], version: int = 1) -> pa.Table:
    """The job API's changes of (campaign, window start, count), as its writer gets them."""
    return pa.table(
        {
            "kind": ["provisional"] * len(rows),
            "key": [json.dumps([c]) for c, _, _ in rows],
            "window_start": [w for _, w, _ in rows],
            "window_end": [w + 10_000 for _, w, _ in rows],
            "values": [json.dumps({"seen_count": n}) for _, _, n in rows],
            "previous": pa.array([None] * len(rows), pa.string()),
            "version": [version] * len(rows),
            "watermark": [0] * len(rows),
        }
    )


def test_counts_as_the_job_api_keeps_them(serving: Settings) -> None:
    client = redis_client(serving)
    store = RedisStore(client, "ysb-job")
    account = BatchAccount({"events": 0}, 0, {})
    store.apply("windows", 0, changes([("c1", 10_000, 3), ("c2", 10_000, 1)]), account)
    store.apply("windows", 1, changes([("c1", 10_000, 5), ("c1", 20_000, 2)], 2), account)
    try:
        assert job_windows(client, "ysb-job", "windows") == {
            ("c1", 10_000): 5,
            ("c2", 10_000): 1,
            ("c1", 20_000): 2,
        }
        assert job_windows(client, "ysb-job", "other") == {}
    finally:
        for key in client.scan_iter(match="kf:ysb-job:*"):
            client.delete(key)


def test_the_changelog_read_through_its_transactions(
    serving: Settings, new_topic: Callable[..., str]
) -> None:
    """Each window's last record with its broker time, read up to the topic's end, which
    a transaction's commit marker holds (an offset no record has)."""
    topic = new_topic(partitions=2)
    producer = transactional_producer(serving.kafka, f"test.{topic}")
    batches = [[("c1", 10_000, 3), ("c2", 10_000, 1)], [("c1", 10_000, 5), ("c1", 20_000, 2)]]
    for batch_id, rows in enumerate(batches):
        producer.begin_transaction()
        for _, key, value in changelog_records(topic, ("campaign_id",), changes(rows), batch_id):
            producer.produce(topic, value, key)
        producer.commit_transaction(30)
    windows = KafkaWindows(serving.kafka, topic)
    try:
        found = {(s.campaign, s.window_start): s for s in windows.read(timeout_s=20)}
        assert {w: s.seen_count for w, s in found.items()} == {
            ("c1", 10_000): 5,
            ("c2", 10_000): 1,
            ("c1", 20_000): 2,
        }
        assert all(s.time_updated > 1_700_000_000_000 for s in found.values())
        # The store holds the same counts: each window gets its changelog's time.
        client: redis.Redis = redis_client(serving)
        store = RedisStore(client, "ysb-job2")
        account = BatchAccount({"events": 0}, 0, {})
        for batch_id, rows in enumerate(batches):
            store.apply("windows", batch_id, changes(rows), account)
        try:
            merged = JobWindows(client, "ysb-job2", "windows", windows).read()
            assert [(s.campaign, s.window_start, s.seen_count) for s in merged] == [
                ("c1", 10_000, 5),
                ("c2", 10_000, 1),
                ("c1", 20_000, 2),
            ]
            assert [s.time_updated for s in merged] == [
                found[(s.campaign, s.window_start)].time_updated for s in merged
            ]
        finally:
            for key in client.scan_iter(match="kf:ysb-job2:*"):
                client.delete(key)
    finally:
        windows.close()
