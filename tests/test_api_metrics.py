"""The service's /metrics: a real job's progress and accounting, the service's own
requests and subscribers, and a consumer group's lag on the real broker, read back
through the Prometheus text parser."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator

import httpx
import pytest
from confluent_kafka import Producer, TopicPartition
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families
from service import WATERMARK, Served, serve

from kappaflow.api.app import create_app
from kappaflow.kafka.topics import create_topic
from kappaflow.settings import Settings
from kappaflow.waiting import wait_for
from test_api_topics import commit, without_kafka

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def scrape(client: httpx.Client) -> Samples:
    answer = client.get("/metrics")
    assert answer.status_code == 200, answer.text
    assert answer.headers["content-type"].startswith("text/plain")
    return parse(answer.text)


def parse(text: str) -> Samples:
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples[(name, frozenset(labels.items()))]


@pytest.fixture(scope="module")
def api(served: Served) -> Iterator[httpx.Client]:
    with serve(served.settings) as client:
        yield client


def test_a_jobs_state_progress_and_accounting(api: httpx.Client, served: Served) -> None:
    job = served.job
    pages = {"job": job, "output": "pages"}
    wanted = ["kappaflow_job_watermark_delay_seconds", "kappaflow_job_state_rows"]

    def recorded() -> Samples | None:
        # The store shows a batch's windows before the writer records the batch's
        # accounting and watermark, and the query its progress.
        found = scrape(api)
        if found.get(("kappaflow_job_events_total", frozenset(pages.items()))) != 25:
            return None
        return found if all((n, frozenset(pages.items())) in found for n in wanted) else None

    samples = wait_for(recorded, timeout=60, interval=0.5, what="the job's accounting")
    assert value(samples, "kappaflow_job_state", job=job, state="running") == 1
    assert value(samples, "kappaflow_job_state", job=job, state="failed") == 0
    assert value(samples, "kappaflow_job_events_total", **pages) == 25
    assert value(samples, "kappaflow_job_events_read_total", **pages) == 25
    assert value(samples, "kappaflow_job_duplicates_total", **pages) == 0
    assert value(samples, "kappaflow_job_late_events_total", **pages) == 0
    assert value(samples, "kappaflow_job_dead_letters_total", **pages) == 0
    assert value(samples, "kappaflow_job_kafka_records_total", **pages) > 0
    assert value(samples, "kappaflow_job_lake_rows_total", **pages) > 0
    # The views' watermark is their latest time less 5 s; the delay is the clock's lead.
    delay = value(samples, "kappaflow_job_watermark_delay_seconds", **pages)
    assert abs(delay - (time.time() * 1000 - WATERMARK) / 1000) < 120
    for name in (
        "kappaflow_job_input_rows_per_second",
        "kappaflow_job_processed_rows_per_second",
        "kappaflow_job_batch_duration_seconds",
        "kappaflow_job_state_rows",
        "kappaflow_job_state_memory_bytes",
        "kappaflow_job_offsets_behind_latest",
    ):
        assert value(samples, name, **pages) >= 0, name
    assert value(samples, "kappaflow_job_state_rows", **pages) > 0


def test_requests_by_route_template_and_status(served: Served) -> None:
    # An application of its own: its counts start at zero.
    with serve(served.settings) as client:
        for _ in range(2):
            assert client.get(f"/v1/jobs/{served.job}").status_code == 200
        assert client.get("/v1/jobs/no-such-job").status_code == 404
        assert client.get("/v1/no/such/path").status_code == 404
        samples = scrape(client)
    route = {"method": "GET", "route": "/v1/jobs/{job}"}
    assert value(samples, "kappaflow_api_requests_total", **route, status="200") == 2
    assert value(samples, "kappaflow_api_requests_total", **route, status="404") == 1
    assert value(samples, "kappaflow_api_request_duration_seconds_count", **route) == 3
    unmatched = {"method": "GET", "route": "unmatched", "status": "404"}
    assert value(samples, "kappaflow_api_requests_total", **unmatched) == 1


def test_push_subscribers_are_a_gauge_of_each_application(serving: Settings) -> None:
    first, second = create_app(serving), create_app(serving)
    watching = {"job": "j", "output": "o", "transport": "sse"}
    first.state.metrics.subscribers.labels(**watching).inc()
    first.state.metrics.subscribers.labels(**watching).inc()
    second.state.metrics.subscribers.labels(**watching).inc()
    first.state.metrics.subscribers.labels(**watching).dec()
    # Each application's own registry: what its /metrics serves.
    exposed = parse(generate_latest(first.state.metrics.registry).decode())
    assert value(exposed, "kappaflow_api_push_subscribers", **watching) == 1


def test_a_consumer_groups_lag_per_topic(serving: Settings) -> None:
    kafka = serving
    topic, group = f"lag-{uuid.uuid4().hex[:8]}", f"group-{uuid.uuid4().hex[:8]}"
    create_topic(kafka.kafka, topic, partitions=2)
    producer = Producer(kafka.kafka.client_config())
    for i in range(10):
        producer.produce(topic, value=b"x", partition=i % 2)
    assert producer.flush(30) == 0
    # 5 records in each partition; committed: 4 and 1.
    commit(kafka, group, [TopicPartition(topic, 0, 4), TopicPartition(topic, 1, 1)])
    with serve(kafka) as client:
        # A scrape whose read of the broker times out (a loaded machine) says the broker
        # is down, and the next one reads it again.
        samples = wait_for(
            lambda: found if value(found := scrape(client), "kappaflow_kafka_up") == 1 else None,
            timeout=60,
            what="a scrape that reached the broker",
        )
    labels = {"group": group, "topic": topic}
    assert value(samples, "kappaflow_kafka_consumer_group_lag", **labels) == 1 + 4
    assert value(samples, "kappaflow_kafka_consumer_group_committed_offsets", **labels) == 5


def test_a_broker_that_is_down_costs_only_the_brokers_metrics(serving: Settings) -> None:
    with serve(without_kafka(serving)) as client:
        samples = scrape(client)
    assert value(samples, "kappaflow_kafka_up") == 0
    assert not any(name.startswith("kappaflow_kafka_consumer") for name, _ in samples)
