"""``GET /metrics``: the jobs, the service and the broker's consumer lag, in the
Prometheus text format (docs/metrics-and-topics.md lists every metric).

The jobs' and the broker's values are read when Prometheus scrapes, from the jobs'
status files and from Kafka: the service keeps nothing of them between scrapes. The
service's own metrics (requests, latency, subscribers) live in a registry of the
application's own, so two applications in one process count apart.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from confluent_kafka import ConsumerGroupTopicPartitions, KafkaException, TopicPartition
from fastapi import FastAPI, Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from kappaflow.api.topics import LATEST, list_offsets
from kappaflow.errors import KafkaClusterError, KappaflowError
from kappaflow.jobs.manager import JobManager, JobState
from kappaflow.kafka.clients import admin, cluster_metadata
from kappaflow.settings import KafkaSettings, Settings
from kappaflow.timeutil import parse_time, to_epoch_ms

#: How long a scrape waits for each of the broker's answers. Prometheus gives up on a
#: scrape after 10 s by default: a broker that is down costs the broker's metrics, not
#: the scrape.
KAFKA_SCRAPE_TIMEOUT_S = 3.0
#: Request latency buckets, in seconds: the service answers from Redis and local files
#: in milliseconds; a topic page reads Kafka and may take a second or more.
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


@dataclass(frozen=True)
class ServiceMetrics:
    """The service's own metrics, in its registry: what request handlers update."""

    registry: CollectorRegistry
    requests: Counter
    latency: Histogram
    #: Clients subscribed to an output's changes, by job, output and transport
    #: (``sse``, ``websocket``): the push endpoints count them up and down.
    subscribers: Gauge
    #: Clients following a topic (``GET /v1/topics/{topic}/follow``).
    topic_followers: Gauge
    #: Followers dropped for reading slower than their topic grew.
    topic_followers_dropped: Counter


def service_metrics(registry: CollectorRegistry) -> ServiceMetrics:
    return ServiceMetrics(
        registry=registry,
        requests=Counter(
            "kappaflow_api_requests",
            "HTTP requests answered, by method, route template and status.",
            ["method", "route", "status"],
            registry=registry,
        ),
        latency=Histogram(
            "kappaflow_api_request_duration_seconds",
            "Time from a request to the start of its answer (a stream's: to its headers).",
            ["method", "route"],
            buckets=LATENCY_BUCKETS,
            registry=registry,
        ),
        subscribers=Gauge(
            "kappaflow_api_push_subscribers",
            "Clients subscribed to an output's changes.",
            ["job", "output", "transport"],
            registry=registry,
        ),
        topic_followers=Gauge(
            "kappaflow_api_topic_followers",
            "Clients following a topic's new records.",
            ["topic"],
            registry=registry,
        ),
        topic_followers_dropped=Counter(
            "kappaflow_api_topic_followers_dropped",
            "Topic followers dropped for reading slower than the topic grew.",
            ["topic"],
            registry=registry,
        ),
    )


def add_metrics(app: FastAPI, settings: Settings) -> None:
    """Serve ``GET /metrics`` and count ``app``'s requests; ``app.state.metrics`` is the
    service's metrics (a ``ServiceMetrics``)."""
    registry = CollectorRegistry(auto_describe=True)
    metrics = service_metrics(registry)
    registry.register(JobCollector(settings))
    registry.register(ConsumerLagCollector(settings.kafka))
    app.state.metrics = metrics
    app.add_middleware(RequestMetrics, metrics=metrics)

    @app.get("/metrics", summary="The jobs, the service and consumer lag, for Prometheus.")
    def scrape() -> Response:
        from prometheus_client import generate_latest

        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)


class RequestMetrics:
    """ASGI middleware: each HTTP request counted by method, route template and status,
    and timed to the start of its answer. A request no route matches counts under the
    route ``unmatched``: paths people type must not make a label value each."""

    def __init__(self, app: ASGIApp, metrics: ServiceMetrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        answered = False

        def observe(status: int) -> None:
            route = getattr(scope.get("route"), "path", None) or "unmatched"
            method = str(scope["method"])
            self.metrics.requests.labels(method, route, str(status)).inc()
            self.metrics.latency.labels(method, route).observe(time.perf_counter() - started)

        async def sending(message: Message) -> None:
            nonlocal answered
            if message["type"] == "http.response.start" and not answered:
                answered = True
                observe(int(message["status"]))
            await send(message)

        try:
            await self.app(scope, receive, sending)
        finally:
            if not answered:
                # The server answers an exception no handler took with a 500.
                observe(500)


# The jobs.

#: Per output: the metric, its help, and the key of ``job_status``' output entry.
_JOB_GAUGES = [
    (
        "kappaflow_job_input_rows_per_second",
        "Rows read per second in the last batch.",
        "input_rows_per_s",
    ),
    (
        "kappaflow_job_processed_rows_per_second",
        "Rows processed per second in the last batch.",
        "processed_rows_per_s",
    ),
    ("kappaflow_job_state_rows", "Rows in the query's state stores.", "state_rows"),
    (
        "kappaflow_job_state_memory_bytes",
        "Memory the query's state stores use.",
        "state_memory_bytes",
    ),
    (
        "kappaflow_job_offsets_behind_latest",
        "Source offsets the last batch was behind the latest (largest over partitions).",
        "lag_records",
    ),
    ("kappaflow_job_last_batch", "The id of the last batch written.", "batch"),
]
#: Per output: the accounting's running totals, as counters.
_JOB_COUNTERS = [
    ("kappaflow_job_events", "Events that passed to the output.", "events"),
    ("kappaflow_job_duplicates", "Events dropped as duplicates.", "duplicates"),
    ("kappaflow_job_late_events", "Events that came after the watermark.", "late"),
    ("kappaflow_job_dead_letters", "Events sent to the dead-letter topic.", "dead_letters"),
    ("kappaflow_job_kafka_records", "Records written to Kafka topics.", "kafka_records"),
    ("kappaflow_job_lake_rows", "Rows written to lake tables.", "lake_rows"),
    ("kappaflow_job_events_read", "Source records the output's query consumed.", "events_read"),
]
_OUTPUT_LABELS = ["job", "output"]


class JobCollector(Collector):
    """Every job's state, and its outputs' progress and accounting, read at each scrape
    from the files the jobs' drivers write (``kappaflow.jobs.status``)."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings

    def describe(self) -> Iterable[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        from kappaflow.jobs.status import job_status

        states = GaugeMetricFamily(
            "kappaflow_job_state",
            "1 for the job's state, 0 for the others.",
            labels=["job", "state"],
        )
        gauges = {
            key: GaugeMetricFamily(name, text, labels=_OUTPUT_LABELS)
            for name, text, key in _JOB_GAUGES
        }
        counters = {
            key: CounterMetricFamily(name, text, labels=_OUTPUT_LABELS)
            for name, text, key in _JOB_COUNTERS
        }
        duration = GaugeMetricFamily(
            "kappaflow_job_batch_duration_seconds",
            "How long the last batch took.",
            labels=_OUTPUT_LABELS,
        )
        delay = GaugeMetricFamily(
            "kappaflow_job_watermark_delay_seconds",
            "Now minus the output's event-time watermark.",
            labels=_OUTPUT_LABELS,
        )
        now_ms = time.time() * 1000
        for record in JobManager(self.settings).records():
            for state in JobState:
                if state is not JobState.ABSENT:
                    states.add_metric([record.name, str(state)], float(record.state is state))
            try:
                status = job_status(self.settings, record.name)
            except (KappaflowError, OSError):  # removed while the scrape read it
                continue
            for output, entry in status["outputs"].items():
                labels = [record.name, output]
                for key, family in gauges.items():
                    _add(family, labels, entry.get(key))
                for key, counter in counters.items():
                    _add(counter, labels, entry.get(key))
                millis = entry.get("batch_duration_ms")
                _add(duration, labels, millis / 1000 if millis is not None else None)
                watermark = _watermark_ms(entry)
                _add(delay, labels, (now_ms - watermark) / 1000 if watermark else None)
        yield states
        yield from gauges.values()
        yield duration
        yield delay
        yield from counters.values()


def _add(family: GaugeMetricFamily | CounterMetricFamily, labels: list[str], value: Any) -> None:
    if isinstance(value, int | float) and not isinstance(value, bool):
        family.add_metric(labels, float(value))


def _watermark_ms(entry: dict[str, Any]) -> int | None:
    """The output's event-time watermark in epoch ms: its query's last progress, else
    what its writer recorded; None before the first event moved it (Spark reports the
    epoch then)."""
    given = entry.get("event_time_watermark")
    if isinstance(given, str):
        try:
            found = to_epoch_ms(parse_time(given))
        except KappaflowError:
            found = 0
        if found > 0:
            return found
    recorded = entry.get("watermark_ms")
    return recorded if isinstance(recorded, int) and recorded > 0 else None


# The broker.


class ConsumerLagCollector(Collector):
    """Each consumer group's lag per topic: the end offsets of the partitions it committed
    an offset in, minus those offsets, read from the broker at each scrape."""

    def __init__(self, kafka: KafkaSettings) -> None:
        self.kafka = kafka.model_copy(update={"timeout_s": KAFKA_SCRAPE_TIMEOUT_S})

    def describe(self) -> Iterable[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        up = GaugeMetricFamily("kappaflow_kafka_up", "1 when the broker answered this scrape.")
        lag = GaugeMetricFamily(
            "kappaflow_kafka_consumer_group_lag",
            "Records between a group's committed offsets and the end of the topic.",
            labels=["group", "topic"],
        )
        committed = GaugeMetricFamily(
            "kappaflow_kafka_consumer_group_committed_offsets",
            "A group's committed offsets in a topic, summed over partitions.",
            labels=["group", "topic"],
        )
        try:
            found = consumer_lag(self.kafka)
        except (KafkaClusterError, TimeoutError):  # down, or too slow for this scrape
            up.add_metric([], 0.0)
            yield up
            return
        up.add_metric([], 1.0)
        for (group, topic), (offsets, behind) in sorted(found.items()):
            committed.add_metric([group, topic], float(offsets))
            lag.add_metric([group, topic], float(behind))
        yield up
        yield lag
        yield committed


def consumer_lag(kafka: KafkaSettings) -> dict[tuple[str, str], tuple[int, int]]:
    """(committed offsets, lag) by (group, topic), summed over the topic's partitions the
    group committed an offset in."""
    topics = cluster_metadata(kafka).topics  # KafkaUnreachableError when the broker is down
    client = admin(kafka)
    try:
        listing = client.list_consumer_groups(request_timeout=kafka.timeout_s).result(
            timeout=kafka.timeout_s
        )
        positions: list[tuple[str, TopicPartition]] = []
        for group in sorted(g.group_id for g in listing.valid):
            request = [ConsumerGroupTopicPartitions(group)]
            future = client.list_consumer_group_offsets(request, request_timeout=kafka.timeout_s)
            answer = future[group].result(timeout=kafka.timeout_s)
            # A group keeps its offsets of a deleted topic until they expire.
            positions += [
                (group, tp)
                for tp in answer.topic_partitions or []
                if tp.offset >= 0 and tp.topic in topics
            ]
    except KafkaException as exc:
        raise KafkaClusterError(f"cannot list the consumer groups' offsets: {exc}") from None
    wanted = {(tp.topic, tp.partition) for _, tp in positions}
    ends = list_offsets(kafka, [TopicPartition(t, p) for t, p in wanted], LATEST)
    found: dict[tuple[str, str], tuple[int, int]] = {}
    for group, tp in positions:
        end = ends.get((tp.topic, tp.partition))
        if end is None:
            continue
        offsets, behind = found.get((group, tp.topic), (0, 0))
        found[(group, tp.topic)] = (offsets + tp.offset, behind + max(0, end - tp.offset))
    return found
