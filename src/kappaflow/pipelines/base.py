"""The contract between the job runner and a pipeline."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from pyspark.sql import SparkSession
from pyspark.sql.streaming import StreamingQuery

from kappaflow.errors import JobError
from kappaflow.settings import Settings


@dataclass(frozen=True)
class JobContext:
    """What a pipeline gets: the job's name, its parameters, the session and settings;
    and, in a part's driver process, the part's name (None in the job's main driver)."""

    name: str
    params: Mapping[str, str]
    spark: SparkSession
    settings: Settings
    part: str | None = None

    @property
    def checkpoint_dir(self) -> Path:
        """This job's own checkpoint root: offsets and state survive restarts here."""
        return (self.settings.checkpoint_root / self.name).resolve()

    def param(self, key: str, default: str | None = None) -> str:
        value = self.params.get(key, default)
        if value is None:
            raise JobError(f"job {self.name!r} needs the parameter {key!r}")
        return value


class Pipeline(Protocol):
    """Starts the streaming queries of one job and returns them."""

    def __call__(self, ctx: JobContext) -> list[StreamingQuery]: ...


@dataclass(frozen=True)
class Part:
    """Queries of a job that run in a driver process of their own, beside the main one.

    The part's driver has its own JVM: its tasks share no scheduler, heap or garbage
    collector with the main queries, so a busy main query cannot stall them. The job's
    main driver starts and stops it; the pipeline starts the part's queries when called
    with ``ctx.part`` set to its name. ``overrides`` adjust the part's settings (such as
    its Spark master) over the job's own.
    """

    name: str
    overrides: Mapping[str, Any] = field(default_factory=dict)


class PartsOf(Protocol):
    """The parts a job of a pipeline runs beside its main driver, given its parameters."""

    def __call__(self, params: Mapping[str, str], settings: Settings) -> list[Part]: ...


_REGISTRY: dict[str, Callable[[], Pipeline]] = {}
_PARTS: dict[str, PartsOf] = {}


def register(
    name: str, parts: PartsOf | None = None
) -> Callable[[Callable[[], Pipeline]], Callable[[], Pipeline]]:
    def decorate(factory: Callable[[], Pipeline]) -> Callable[[], Pipeline]:
        _REGISTRY[name] = factory
        if parts is not None:
            _PARTS[name] = parts
        return factory

    return decorate


def pipeline_parts(name: str, params: Mapping[str, str], settings: Settings) -> list[Part]:
    """The parts a job of pipeline ``name`` with ``params`` runs (most run none)."""
    _load_builtin()
    parts_of = _PARTS.get(name)
    return parts_of(params, settings) if parts_of is not None else []


def pipeline_names() -> list[str]:
    _load_builtin()
    return sorted(_REGISTRY)


def get_pipeline(name: str) -> Pipeline:
    _load_builtin()
    factory = _REGISTRY.get(name)
    if factory is None:
        known = ", ".join(sorted(_REGISTRY))
        raise JobError(f"unknown pipeline {name!r} (known: {known})")
    return factory()


def _load_builtin() -> None:
    # Imported lazily so that importing kappaflow does not import every pipeline.
    from kappaflow.counting import pipeline  # noqa: F401
    from kappaflow.pipelines import clean  # noqa: F401
    from kappaflow.ysb import pipeline as ysb  # noqa: F401
