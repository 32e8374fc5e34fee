"""One YSB run: set up, start the engine, generate, drain, check, measure, clean up.

The order matters for the join: the campaigns and every generator process's ads are
written to Redis before the engine starts, because the Spark job reads the whole table
once at start-up and builds it into its plan as a map literal, looked up per event (the
original engines instead looked an unknown ad up in Redis on first sight; the table
holds the same pairs either way).
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from kappaflow.errors import CommandLineError, JobError, TopicNotFoundError
from kappaflow.kafka.clients import producer
from kappaflow.kafka.records import produce_with_retry
from kappaflow.kafka.topics import DEFAULT_PARTITIONS, create_topic, delete_topic
from kappaflow.serving.client import redis_client
from kappaflow.settings import Settings, SettingsOverrides
from kappaflow.waiting import wait_for
from kappaflow_bench.report import machine
from kappaflow_bench.ysb.check import compare, expected_counts
from kappaflow_bench.ysb.engines import (
    ApiEngine,
    AppEngine,
    Engine,
    FlinkEngine,
    QuixEngine,
    SparkEngine,
    cpu_seconds,
)
from kappaflow_bench.ysb.generator import generate, run_processes
from kappaflow_bench.ysb.job import JOINS, OUTPUT
from kappaflow_bench.ysb.results import (
    JobWindows,
    KafkaWindows,
    RunResult,
    latency_summary,
    window_latencies,
    write_outputs,
)
from kappaflow_bench.ysb.store import (
    WindowStat,
    ad_campaigns,
    connect,
    get_stats,
    new_ads,
    new_setup,
)

#: Each engine, and the Spark job's mode for the Spark ones.
ENGINES = {
    "kappaflow": "microbatch",
    "spark": "microbatch",
    "spark-rt": "realtime",
    "flink": "-",
    "quix": "-",
}
PEERS = ("flink", "quix")
SINKS = ("redis", "kafka")
#: After the generator stops, how long the engine may take to account for every view,
#: and how long its output may stay unchanged before we stop waiting for it.
DRAIN_TIMEOUT_S = 120.0
DRAIN_QUIET_S = 15.0
#: The job API's job: a micro-batch of it takes 10 s and more on a busy machine (query
#: planning alone several seconds), so 15 s without a change does not mean it is done.
DRAIN_QUIET_JOB_API_S = 60.0
#: The least warm-up: a fresh job's first batch pays 10-20 s of start-up by itself.
PRIME_MIN_EVENTS = 2_000
PRIME_TIMEOUT_S = 180.0


@dataclass(frozen=True)
class RunSpec:
    engine: str
    sink: str
    rate: int
    duration_s: float
    processes: int = 1
    #: One per core, as kappaflow's topics default to (the original used 1).
    partitions: int = DEFAULT_PARTITIONS
    warmup_s: float = 60.0
    #: Micro-batch with the Redis sink only: "batch" (stateless, the default) or "state".
    aggregate: str | None = None
    #: Real-time mode only: seconds each real-time batch runs (the pipeline's ``batch``).
    rt_batch_s: float | None = None
    #: The job API's job only (``--engine kappaflow``): how it joins ads to campaigns,
    #: ``table`` (a reference table) or ``map`` (a map literal).
    join: str | None = None

    @property
    def job_api(self) -> bool:
        """Whether the run measures the job on the job API (ysb/job.py), ``--engine
        kappaflow``; ``spark`` and ``spark-rt`` run the hand-written pipeline."""
        return self.engine == "kappaflow"

    def validate(self) -> None:
        if self.engine not in ENGINES:
            known = ", ".join(sorted(ENGINES))
            raise CommandLineError(f"unknown engine {self.engine!r} ({known})")
        if self.sink not in SINKS:
            raise CommandLineError(f"unknown sink {self.sink!r}: redis or kafka")
        if self.rate < 1:
            raise CommandLineError("--rate must be at least 1 event per second")
        if self.duration_s <= 0:
            raise CommandLineError("--duration must be positive")
        if self.processes < 1 or self.partitions < 1:
            raise CommandLineError("--processes and --partitions must be at least 1")
        if self.aggregate is not None and (self.engine, self.sink) != ("spark", "redis"):
            raise CommandLineError("--aggregate applies to --engine spark with --sink redis only")
        if self.aggregate not in (None, "batch", "state"):
            raise CommandLineError(f"unknown aggregate {self.aggregate!r}: batch or state")
        if self.rt_batch_s is not None and (self.engine != "spark-rt" or self.rt_batch_s < 1):
            raise CommandLineError("--rt-batch applies to --engine spark-rt and is at least 1 s")
        if self.join is not None and not self.job_api:
            raise CommandLineError("--join applies to --engine kappaflow")
        if self.join not in (None, *JOINS):
            raise CommandLineError(f"unknown join {self.join!r}: {' or '.join(JOINS)}")
        if not 0 <= self.warmup_s <= 60:
            raise CommandLineError("--warmup must be between 0 and 60 seconds")


def spark_overrides(settings: Settings, spec: RunSpec) -> SettingsOverrides:
    """Spark settings for the job: few shuffle partitions (100 keys), and in real-time
    mode enough local task slots for every partition of both stages at once."""
    from kappaflow.spark.session import real_time_spark  # imports PySpark: only when used

    spark = SettingsOverrides(spark_shuffle_partitions=spec.partitions)
    if spec.engine == "spark-rt":
        spark = real_time_spark(settings, 2 * spec.partitions).over(spark)
    return spark


def run(
    settings: Settings,
    spec: RunSpec,
    out_dir: Path,
    *,
    overrides: SettingsOverrides,
    say: Callable[[str], None],
) -> RunResult:
    spec.validate()
    run_id = uuid.uuid4().hex[:8]
    store = connect(settings.redis.effective_url)
    rng = random.Random()
    new_setup(store, rng)
    ads = [new_ads(store, rng) for _ in range(spec.processes)]
    topic, dest = f"ysb.ad-events.{run_id}", f"ysb.windows.{run_id}"
    create_topic(settings.kafka, topic, partitions=spec.partitions)
    topics = [topic]
    params = {"source": topic, "mode": ENGINES[spec.engine], "sink": spec.sink}
    if spec.job_api:
        params = _job_params(settings, store, topic, run_id, spec, out_dir)
        topics.append(params["ads"])
    if spec.aggregate is not None:
        params["aggregate"] = spec.aggregate
    if spec.rt_batch_s is not None:
        params["batch"] = f"{spec.rt_batch_s:g}s"
    if spec.sink == "kafka" or spec.job_api:
        # The broker stamps each output record when it appends it: latency is measured
        # on the broker's clock, as the later Databricks and Flink comparisons did.
        create_topic(
            settings.kafka,
            dest,
            partitions=spec.partitions,
            configs={"message.timestamp.type": "LogAppendTime"},
        )
        topics.append(dest)
        params["dest"] = dest
    job = f"ysb-{spec.engine}-{run_id}"
    job_overrides = spark_overrides(settings, spec).over(overrides)
    engine: Engine
    if spec.job_api:
        engine = ApiEngine(settings, job, params, job_overrides)
    elif spec.engine == "quix":
        engine = QuixEngine(settings, job, params)
    elif spec.engine == "flink":
        engine = FlinkEngine(settings, job, params, partitions=spec.partitions)
    else:
        engine = SparkEngine(settings, job, params, job_overrides)
    result = RunResult(
        engine=spec.engine,
        sink=spec.sink,
        rate_offered=spec.rate,
        duration_s=spec.duration_s,
        versions={**engine.versions(), **versions(settings, store)},
        machine=machine(),
        config={
            "partitions": spec.partitions,
            "generator_processes": spec.processes,
            "warmup_s": spec.warmup_s,
            "job_params": params,
            **({} if spec.engine in PEERS else {"spark": job_overrides.fields().get("spark")}),
        },
    )
    output: KafkaWindows | None = None
    read: Callable[[], list[WindowStat]]
    try:
        say(f"starting {job} ({spec.engine}, sink {spec.sink})")
        if isinstance(engine, AppEngine) and not engine.python.exists():
            say(f"installing {engine.label} in {engine.home / 'venv'} (once)")
        engine.start()
        if isinstance(engine, AppEngine):
            result.config["engine"] = engine.describe()

        if spec.sink == "kafka" or spec.job_api:
            output = KafkaWindows(settings.kafka, dest)
        if spec.job_api and spec.sink == "redis":
            assert output is not None
            read = JobWindows(redis_client(settings), job, OUTPUT, output).read
        elif output is not None:
            read = output.read
        else:
            read = partial(get_stats, store)

        say(f"warming up: {max(PRIME_MIN_EVENTS, int(spec.rate * spec.warmup_s)):,} events")
        _prime(settings, topic, ads[0], read, spec)
        cpu_at_start = cpu_seconds(engine.pid())
        say(f"generating {spec.rate:,} events/s for {spec.duration_s:g}s")
        gen = run_processes(
            settings.kafka.client_config(),
            topic,
            rate=spec.rate,
            duration_s=spec.duration_s,
            ads_per_process=ads,
        )
        generated_at = time.monotonic()
        result.generator = {k: v for k, v in gen.__dict__.items() if k not in ("per_process",)} | {
            "achieved_rate": gen.achieved_rate
        }
        result.rate_achieved = gen.achieved_rate
        say(f"generator: {gen.events:,} events at {gen.achieved_rate:,.0f}/s; checking")
        expected = expected_counts(settings.kafka, topic, ad_campaigns(store))
        result.events, result.views = expected.events, expected.views
        quiet = DRAIN_QUIET_JOB_API_S if spec.job_api else DRAIN_QUIET_S
        stats = _drain(read, expected.views, quiet)
        result.drain_s = round(time.monotonic() - generated_at, 1)
        cpu_at_end = cpu_seconds(engine.pid())
        if cpu_at_start is not None and cpu_at_end is not None and cpu_at_end > cpu_at_start:
            result.engine_cpu_s = round(cpu_at_end - cpu_at_start, 1)
            result.events_per_cpu_s = round(gen.events / result.engine_cpu_s)
    finally:
        if output is not None:
            output.close()
        out_dir.mkdir(parents=True, exist_ok=True)
        engine.stop(out_dir / "engine.log")
        for name in topics:
            with contextlib.suppress(TopicNotFoundError):
                delete_topic(settings.kafka, name)
    actual = {(s.campaign, s.window_start): s.seen_count for s in stats}
    mismatches = compare(expected.counts, actual)
    result.machine["load_average_at_end"] = os.getloadavg()
    result.windows = len(stats)
    result.mismatched_windows = len(mismatches)
    result.mismatches = [m.as_json() for m in mismatches[:20]]
    first = gen.first_event_ms or 0
    # Full windows of the measured schedule only: the first, partial one also holds
    # warm-up events.
    measured_from = first
    latencies = window_latencies(stats, measured_from)
    result.windows_measured = len(latencies)
    result.latency_ms = latency_summary(latencies)
    if gen.events_behind:
        result.notes.append(
            f"the generator sent {gen.events_behind:,} events over {100} ms late "
            f"(at most {gen.max_behind_ms} ms): its lag is part of the latency"
        )
    write_outputs(out_dir, result, stats, measured_from)
    return result


def _job_params(
    settings: Settings, store: Any, topic: str, run_id: str, spec: RunSpec, out_dir: Path
) -> dict[str, str]:
    """The job API job's parameters, and its ad table: the compacted topic
    ``ysb.ads.<run>`` holding every ad of the YSB database as ``{"ad_id",
    "campaign_id"}`` keyed by ad (and, for ``--join map``, the same pairs in a JSON file
    beside the run's results)."""
    table = ad_campaigns(store)
    ads = f"ysb.ads.{run_id}"
    create_topic(settings.kafka, ads, partitions=1, configs={"cleanup.policy": "compact"})
    writer = producer(settings.kafka)
    for ad, campaign in sorted(table.items()):
        value = json.dumps({"ad_id": ad, "campaign_id": campaign}).encode()
        produce_with_retry(writer, ads, value, ad.encode())
    if writer.flush(60):
        raise JobError(f"could not write the ad table to {ads!r}")
    params = {
        "source": topic,
        "ads": ads,
        "store": "yes" if spec.sink == "redis" else "no",
        "join": spec.join or "table",
    }
    if params["join"] == "map":
        out_dir.mkdir(parents=True, exist_ok=True)
        path = (out_dir / "ads.json").resolve()
        path.write_text(json.dumps(table))
        params["ads_file"] = str(path)
    return params


def _prime(
    settings: Settings,
    topic: str,
    ads: list[str],
    read: Callable[[], list[WindowStat]],
    spec: RunSpec,
) -> None:
    """Warm the engine up: ``warmup_s`` of events at the run's rate, all counted, first.

    A fresh Spark job's first batches pay for class loading and code generation (10 to
    20 s here) and its code stays slow until the JIT has compiled the hot paths;
    measured from a cold start, that would be the whole story. The warm-up events are
    ordinary YSB events, earlier than the measured ones: the check counts them, the
    latency figures leave their windows out.
    """
    events = max(PRIME_MIN_EVENTS, int(spec.rate * spec.warmup_s))
    rate = events if spec.warmup_s == 0 else spec.rate
    generate(settings.kafka.client_config(), topic, rate=rate, duration_s=events / rate, ads=ads)
    views = expected_counts(settings.kafka, topic, dict.fromkeys(ads, "-")).views
    wait_for(
        lambda: True if sum(s.seen_count for s in read()) >= views else None,
        timeout=PRIME_TIMEOUT_S,
        interval=0.5,
        what="the engine to count the warm-up events",
    )


def _drain(
    read: Callable[[], list[WindowStat]], views: int, quiet_s: float = DRAIN_QUIET_S
) -> list[WindowStat]:
    """The engine's windows once they account for every view, or once they stop changing."""
    deadline = time.monotonic() + DRAIN_TIMEOUT_S
    last_total, last_change = -1, time.monotonic()
    while True:
        stats = read()
        total = sum(s.seen_count for s in stats)
        now = time.monotonic()
        if total != last_total:
            last_total, last_change = total, now
        if total >= views or now - last_change >= quiet_s or now >= deadline:
            return stats
        time.sleep(0.5)


def versions(settings: Settings, store: Any) -> dict[str, str]:
    import confluent_kafka
    import pyspark

    info = {
        "pyspark": pyspark.__version__,
        "confluent_kafka": str(confluent_kafka.version()),
        "librdkafka": confluent_kafka.libversion()[0],
    }
    # A version is nice to have, never worth failing a run for.
    with contextlib.suppress(Exception):
        info["redis"] = str(store.info("server").get("redis_version"))
    jars = sorted((settings.jars_path).glob("**/kafka_2.13-*.jar"))
    if jars:
        info["kafka_broker"] = jars[-1].stem.removeprefix("kafka_2.13-")
    return info
