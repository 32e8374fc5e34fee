"""The contract between kappaflow and a job's driver: the context a job runs in, and a
pipeline of parts."""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from kappaflow.errors import MissingParameterError
from kappaflow.jobs.files import Resources, record_resources
from kappaflow.settings import SettingsOverrides

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming import DataStreamWriter, StreamingQuery

    from kappaflow.settings import Settings


@dataclass(frozen=True)
class JobContext:
    """What a pipeline gets to start its queries.

    ``part`` is None in the job's main driver; in the driver of one of the job's parts
    (see :class:`Part`) it is that part's name. ``stopping`` is set when the job is asked
    to stop: a pipeline whose start takes a while checks it and starts no more queries.
    """

    name: str
    params: Mapping[str, str]
    spark: SparkSession
    settings: Settings
    part: str | None = None
    stopping: threading.Event | None = None

    @property
    def checkpoint_dir(self) -> Path:
        """This job's own checkpoint root: offsets and state survive restarts here."""
        return (self.settings.checkpoint_root / self.name).resolve()

    def param(self, key: str, default: str | None = None) -> str:
        """The job parameter ``key`` (``-P key=value``), or ``default``."""
        value = self.params.get(key, default)
        if value is None:
            raise MissingParameterError(f"job {self.name!r} needs the parameter {key!r}")
        return value

    def kafka_stream(self, topics: str, *, starting_offsets: str = "earliest") -> DataFrame:
        """The records of ``topics`` (one, or several separated by commas) as an unbounded
        DataFrame with Kafka's columns (``key``, ``value``, ``topic``, ``partition``,
        ``offset``, ``timestamp``, ...): committed records only, and records retention
        deleted before the job read them reported in its log, not a failure."""
        from kappaflow.spark.kafka_io import read_stream

        return read_stream(self.spark, self.settings, topics, starting_offsets=starting_offsets)

    def kafka_sink(self, frame: DataFrame, topic: str | None = None) -> DataStreamWriter:
        """A Kafka sink for ``frame``, which has a ``value`` column (and may have ``key``,
        ``headers``, and ``topic`` when ``topic`` is None). At least once: Spark's Kafka
        sink is not transactional."""
        from kappaflow.spark.kafka_io import write_stream

        return write_stream(frame, self.settings, topic)

    def partitions(self, topic: str) -> int:
        """How many partitions ``topic`` has; KF404 if it does not exist."""
        from kappaflow.kafka.topics import topic_partitions

        return len(topic_partitions(self.settings.kafka, topic))

    def create_topic(
        self,
        topic: str,
        *,
        partitions: int | None = None,
        configs: Mapping[str, str] | None = None,
        owned: bool = False,
    ) -> None:
        """Create ``topic`` unless it exists (``partitions``: the platform's default).
        ``owned``: the topic is the job's own, such as its dead letters, and
        ``kappaflow jobs remove`` deletes it with the job (recorded before it is created,
        so that a crash in between leaves nothing unrecorded)."""
        from kappaflow.kafka.topics import DEFAULT_PARTITIONS, create_topic

        if owned:
            record_resources(self.settings.jobs_dir / self.name, Resources(topics=(topic,)))
        create_topic(
            self.settings.kafka,
            topic,
            partitions=partitions or DEFAULT_PARTITIONS,
            configs=dict(configs or {}),
            exist_ok=True,
        )


@dataclass(frozen=True)
class Part:
    """Queries of a job that run in a driver process of their own, beside the main one.

    The part's driver has its own JVM: its tasks share no scheduler, heap or garbage
    collector with the main queries, so a busy main query cannot stall them. The job's
    main driver starts and stops it; the pipeline starts the part's queries when called
    with ``ctx.part`` set to its name. ``settings`` apply to the part's driver over the
    job's own (such as its own master and cores).
    """

    name: str
    settings: SettingsOverrides = field(default_factory=SettingsOverrides)


def _no_parts(params: Mapping[str, str], settings: Settings) -> list[Part]:
    return []


@dataclass(frozen=True)
class Pipeline:
    """What a job computes.

    ``start`` starts the job's streaming queries (those of ``ctx.part`` in a part's
    driver) and returns them; ``parts`` names the parts a job with these parameters runs
    beside its main driver (most run none). With ``main`` False every query runs in a
    part: the main driver starts no Spark session and only starts, watches and stops the
    parts, and the job runs until it is stopped or a part fails.
    """

    start: Callable[[JobContext], list[StreamingQuery]]
    parts: Callable[[Mapping[str, str], Settings], list[Part]] = _no_parts
    main: bool = True
