"""The service's /metrics: a real job's progress and accounting, the service's own
requests and subscribers, and a consumer group's lag on the real broker, read back
through the Prometheus text parser."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from confluent_kafka import Producer, TopicPartition
from conftest import run_kappaflow
from prometheus_client.parser import text_string_to_metric_families
from service import WATERMARK, Served, serve
from websockets.sync.client import connect

from kappaflow.kafka.topics import create_topic
from kappaflow.settings import Settings
from kappaflow.waiting import wait_for
from test_api_topics import commit, without_kafka
from test_docs import documented_metrics

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
    assert value(samples, "kappaflow_job_state_rows", **pages) > 0
    assert value(samples, "kappaflow_job_state_memory_bytes", **pages) > 0

    # The progress gauges are the query's last progress, as `jobs status` prints it: a
    # scrape before and one after the command that agree bracket what it read.
    progress = {
        "kappaflow_job_input_rows_per_second": "input_rows_per_s",
        "kappaflow_job_processed_rows_per_second": "processed_rows_per_s",
        "kappaflow_job_offsets_behind_latest": "lag_records",
        "kappaflow_job_state_rows": "state_rows",
        "kappaflow_job_batch_duration_seconds": "batch_duration_ms",
    }

    def bracketed() -> tuple[dict[str, float], dict[str, Any]] | None:
        gauges = {name: value(scrape(api), name, **pages) for name in progress}
        status = run_kappaflow(served.settings, "jobs", "status", job, "--json")
        assert status.code == 0, status.err
        after = {name: value(scrape(api), name, **pages) for name in progress}
        return (gauges, json.loads(status.out)["outputs"]["pages"]) if after == gauges else None

    gauges, status = wait_for(bracketed, timeout=90, interval=1, what="a quiet scrape")
    # Every view was read before the job started: nothing is left behind the latest.
    assert gauges["kappaflow_job_offsets_behind_latest"] == 0 == status["lag_records"]
    assert gauges["kappaflow_job_batch_duration_seconds"] > 0
    assert gauges["kappaflow_job_batch_duration_seconds"] * 1000 == pytest.approx(
        status["batch_duration_ms"]
    )
    for name in (
        "kappaflow_job_input_rows_per_second",
        "kappaflow_job_processed_rows_per_second",
        "kappaflow_job_state_rows",
    ):
        assert gauges[name] == pytest.approx(status[progress[name]]), name


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


def test_push_subscribers_are_a_gauge_of_each_application(
    api: httpx.Client, served: Served
) -> None:
    """Real subscriptions raise the gauge of the application they reach, and leave it
    when they disconnect."""
    path = f"/v1/jobs/{served.job}/outputs/pages/changes"
    labels = {"job": served.job, "output": "pages"}

    def subscribers(client: httpx.Client, transport: str) -> float:
        key = frozenset({**labels, "transport": transport}.items())
        return scrape(client).get(("kappaflow_api_push_subscribers", key), 0.0)

    def reaches(client: httpx.Client, transport: str, n: float) -> None:
        wait_for(
            lambda: subscribers(client, transport) == n or None,
            timeout=30,
            what=f"{n} {transport} subscribers",
        )

    assert subscribers(api, "sse") == 0 and subscribers(api, "websocket") == 0
    with api.stream("GET", path, timeout=httpx.Timeout(30, read=90)) as answer:
        assert answer.status_code == 200, answer.read()
        lines = answer.iter_lines()
        assert next(line for line in lines if line.startswith("event:")) == "event: snapshot"
        assert subscribers(api, "sse") == 1
        url = f"{api.base_url}{path}/ws".replace("http://", "ws://")
        with connect(url, open_timeout=30) as socket:
            assert json.loads(socket.recv(timeout=60))["event"] == "snapshot"
            assert subscribers(api, "websocket") == 1 and subscribers(api, "sse") == 1
            with serve(served.settings) as other:  # an application of its own
                assert subscribers(other, "sse") == 0 and subscribers(other, "websocket") == 0
        reaches(api, "websocket", 0)
        assert subscribers(api, "sse") == 1
    reaches(api, "sse", 0)


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


def test_the_documented_metrics_are_those_the_service_exports(
    api: httpx.Client, served: Served
) -> None:
    """docs/metrics-and-topics.md's tables list every metric family a scrape of the
    service holds (a family without samples included), with its type."""

    def families() -> dict[str, str] | None:
        answer = api.get("/metrics")
        assert answer.status_code == 200, answer.text
        if value(parse(answer.text), "kappaflow_kafka_up") != 1:
            return None  # the broker's metrics need a scrape that reached it
        return {
            # The parser names a counter without its ``_total``.
            family.name + ("_total" if family.type == "counter" else ""): family.type
            for family in text_string_to_metric_families(answer.text)
            # The client library's creation time of each counter's and histogram's
            # labelled series (once a request made one), read as gauges of their own:
            # part of the documented family, not a metric of its own.
            if not (family.name.endswith("_created") and family.type == "gauge")
        }

    exported = wait_for(families, timeout=60, what="a scrape that reached the broker")
    assert exported == documented_metrics()


def test_a_broker_that_is_down_costs_only_the_brokers_metrics(serving: Settings) -> None:
    with serve(without_kafka(serving)) as client:
        samples = scrape(client)
    assert value(samples, "kappaflow_kafka_up") == 0
    assert not any(name.startswith("kappaflow_kafka_consumer") for name, _ in samples)
