"""A user's job (``package.module:build``) as a kappaflow pipeline: Kafka in, Kafka,
Redis, the lake and PostgreSQL out."""

from __future__ import annotations

import json
from collections.abc import Mapping

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.streaming.query import StreamingQuery

from kappaflow.errors import SetupError, TopicNotFoundError
from kappaflow.jobs.contract import JobContext, Part, Pipeline
from kappaflow.jobs.files import PLAN, record_resources, write_atomically
from kappaflow.jobs.plan import record_plan, verify_restart
from kappaflow.jobs.resources import job_resources
from kappaflow.jobs.shadow_names import SHADOW_PARAM, rename_outputs
from kappaflow.kafka.topics import create_topic, list_topics, topic_partitions
from kappaflow.postgresql.server import connect
from kappaflow.serving.client import redis_client
from kappaflow.settings import Settings
from kappaflow.spark.kafka_io import read_batch, read_range, read_stream
from kappaflow.spark.session import CHECKPOINT_INTERVAL, real_time_spark
from kappaflow.streams.job import Job
from kappaflow.streams.ops.shipping import ship_user_code
from kappaflow.streams.ops.windowing import configured_engine
from kappaflow.streams.output.backends import KafkaPublisher, RedisStore, commits_topic
from kappaflow.streams.output.lake_fs import HadoopFs
from kappaflow.streams.output.writer import StepHook
from kappaflow.streams.realtime import Store, refuse_python, slots, start_real_time
from kappaflow.streams.runtime import (
    Backends,
    Build,
    declare,
    describe,
    lake_paths,
    start_outputs,
    topic_configs,
)
from kappaflow.streams.sinks import PostgresSink, RedisSink


class KafkaReader:
    """A job's sources in Kafka."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        #: Where the job's ``kf.avro`` subjects are looked up (streams/formats.py).
        self.registry_url = settings.registry.url

    def stream(self, spark: SparkSession, topic: str, start: str) -> DataFrame:
        # With headers: a replayed dead letter is marked in them (jobs/dead_letters.py).
        return read_stream(spark, self.settings, topic, starting_offsets=start, headers=True)

    def table(self, spark: SparkSession, topic: str) -> DataFrame:
        # Earliest to latest offsets, resolved each time Spark plans the read: in a
        # stream-static join, at every micro-batch.
        return read_batch(spark, self.settings, topic)

    def read_range(
        self, spark: SparkSession, topic: str, ranges: dict[int, tuple[int, int]]
    ) -> DataFrame:
        return read_range(spark, self.settings, topic, ranges)


def start_app(
    build: Build,
    ctx: JobContext,
    on_step: StepHook | None = None,
    *,
    available_now: bool = False,
    real_time: bool = False,
) -> list[StreamingQuery]:
    """Declare the job with ``build`` and start its outputs' queries (``available_now``:
    they read what the sources hold now, then stop; ``real_time``: in Spark's real-time
    mode, streams/realtime.py)."""
    settings = ctx.settings
    reader = KafkaReader(settings)
    ship_user_code(ctx.spark, build)
    job = declare(build, ctx.name, ctx.params, ctx.spark, reader)
    if SHADOW_PARAM in ctx.params:
        # A shadow of a live job (jobs/shadow_names.py): the places its sinks name outright
        # are its own, before any is created or written.
        rename_outputs(job)
    if real_time:
        # Before anything is created: a job real-time mode cannot run leaves nothing.
        refuse_python(job)
    existing = {t["name"] for t in list_topics(settings.kafka)}
    read = [s.topic for s in job.sources] + [t.name for t in job.tables if t.source is not None]
    for topic in read:
        if topic not in existing:
            raise TopicNotFoundError(
                f"job {ctx.name!r} reads topic {topic!r}, which does not exist "
                "(see `kappaflow topics list`)"
            )
    checkpoint_root = f"{settings.checkpoint_location.rstrip('/')}/{ctx.name}"
    fs = HadoopFs(ctx.spark, checkpoint_root)
    for path in lake_paths(job, settings.lake_root):
        HadoopFs(ctx.spark, path)  # a path Spark cannot write is refused before any write
    wants_redis = any(isinstance(s, RedisSink) for o in job.outputs for s in o.sinks)
    # Redis is reached now, so that a job whose store is down creates nothing.
    store = RedisStore(redis_client(settings), ctx.name) if wants_redis else None
    # PostgreSQL too: its tables are created by the first batch, on a server that answers.
    databases = {
        s.dsn or settings.postgres.effective_dsn
        for o in job.outputs
        for s in o.sinks
        if isinstance(s, PostgresSink)
    }
    for dsn in sorted(databases):
        connect(dsn).close()
    verify_restart(job, fs, checkpoint_root)
    # Before anything is created: a removal must find all of it (removal.py).
    record_resources(
        settings.jobs_dir / ctx.name, job_resources(job, settings.lake_root, wants_redis)
    )
    _create_topics(settings, job)
    record_plan(job, fs, jvm_windows=configured_engine(ctx.spark) == "jvm")
    plan_file = PLAN if ctx.part is None else f"plan.{ctx.part}.json"
    write_atomically(
        settings.jobs_dir / ctx.name / plan_file,
        json.dumps(describe(job, settings.lake_root), indent=2) + "\n",
    )
    if real_time:
        partitions = {s.topic: len(topic_partitions(settings.kafka, s.topic)) for s in job.sources}
        _enough_slots(ctx.spark, slots(job, partitions))
        address = store.address() if store is not None else None
        return start_real_time(
            job,
            checkpoint_root,
            CHECKPOINT_INTERVAL,
            KafkaPublisher.java_config(settings),
            Store(*address) if address is not None else None,
            partitions,
        )
    backends = Backends(
        publisher=KafkaPublisher(settings, ctx.name),
        store=store,
        checkpoint_root=checkpoint_root,
        lake_root=settings.lake_root,
        status_dir=settings.jobs_dir.resolve() / ctx.name / "outputs",
        trigger_ms=settings.spark.trigger_interval_ms,
        postgres_dsn=settings.postgres.effective_dsn,
    )
    return start_outputs(
        job,
        reader,
        backends,
        on_step=on_step,
        available_now=available_now,
        stopping=ctx.stopping,
    )


def _enough_slots(spark: SparkSession, needed: int) -> None:
    """Real-time mode runs every task of a query at once, for as long as it runs."""
    have = spark.sparkContext.defaultParallelism
    if have < needed:
        raise SetupError(
            f"the job's real-time queries hold {needed} task slots at once (a task per source "
            f"partition and per state partition of each output), and Spark has {have}: give "
            "the cluster more cores, or the sources fewer partitions"
        )


def _create_topics(settings: Settings, job: Job) -> None:
    kafka = settings.kafka
    for topic, configs in topic_configs(job).items():
        create_topic(kafka, topic, exist_ok=True, configs=configs)
    create_topic(
        kafka,
        commits_topic(job.name),
        partitions=1,
        exist_ok=True,
        configs={"cleanup.policy": "compact"},
    )


def app_pipeline(build: Build) -> Pipeline:
    """``build`` as a pipeline the job runner starts."""

    def start(ctx: JobContext) -> list[StreamingQuery]:
        return start_app(build, ctx)

    return Pipeline(start=start)


#: The part of a real-time job whose driver runs its queries.
REAL_TIME_PART = "realtime"
#: The task slots (threads) of a real-time job's local master: real-time mode holds a slot
#: per task for as long as the query runs (a task per source partition, and per state
#: partition of a windowed output), and fails when they are not all free at once. Threads
#: are made as tasks need them, so a generous number costs nothing where fewer are used.
REAL_TIME_SLOTS = 64


def real_time_pipeline(build: Build) -> Pipeline:
    """``build`` as a pipeline in Spark's real-time mode: its queries run in a driver of
    their own (a part) whose local master has REAL_TIME_SLOTS slots; a cluster master is
    kept."""

    def start(ctx: JobContext) -> list[StreamingQuery]:
        return start_app(build, ctx, real_time=True)

    def parts(params: Mapping[str, str], settings: Settings) -> list[Part]:
        return [Part(REAL_TIME_PART, real_time_spark(settings, REAL_TIME_SLOTS))]

    return Pipeline(start=start, parts=parts, main=False)
