"""The contract between kappaflow and a job's driver: the context a job runs in, and a
pipeline of parts."""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from kappaflow.errors import MissingParameterError
from kappaflow.settings import SettingsOverrides

if TYPE_CHECKING:
    from pyspark.sql import SparkSession
    from pyspark.sql.streaming import StreamingQuery

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
        value = self.params.get(key, default)
        if value is None:
            raise MissingParameterError(f"job {self.name!r} needs the parameter {key!r}")
        return value


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
