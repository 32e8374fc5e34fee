"""The contract between the job runner and a pipeline."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from pyspark.sql import SparkSession
from pyspark.sql.streaming import StreamingQuery

from kappaflow.errors import JobError
from kappaflow.settings import Settings


@dataclass(frozen=True)
class JobContext:
    """What a pipeline gets: the job's name, its parameters, the session and settings."""

    name: str
    params: Mapping[str, str]
    spark: SparkSession
    settings: Settings

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


_REGISTRY: dict[str, Callable[[], Pipeline]] = {}


def register(name: str) -> Callable[[Callable[[], Pipeline]], Callable[[], Pipeline]]:
    def decorate(factory: Callable[[], Pipeline]) -> Callable[[], Pipeline]:
        _REGISTRY[name] = factory
        return factory

    return decorate


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
