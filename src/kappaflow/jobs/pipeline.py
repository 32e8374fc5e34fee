"""The contract between the job runner and what a job computes: a pipeline.

A pipeline is found by reference, the same way for kappaflow's own and a user's: either
``package.module:attribute`` (an object importable from the driver's Python path: a
:class:`Pipeline`, or a job's ``build(job)`` function on the job API), or a
short name that an installed distribution declares in the ``kappaflow.pipelines`` entry
point group (kappaflow declares ``count`` and ``clean`` there). Nothing here imports a
pipeline's code until a job asks for it.
"""

from __future__ import annotations

import importlib
import inspect
import re
from collections.abc import Callable
from importlib.metadata import entry_points
from typing import TYPE_CHECKING, Any

from kappaflow.errors import InvalidPipelineError, PipelineNotFoundError
from kappaflow.jobs.contract import JobContext as JobContext
from kappaflow.jobs.contract import Part as Part
from kappaflow.jobs.contract import Pipeline as Pipeline

if TYPE_CHECKING:
    from pyspark.sql.streaming import StreamingQuery

    from kappaflow.streams.output.writer import StepHook

#: The entry point group in which distributions name their pipelines.
ENTRY_POINT_GROUP = "kappaflow.pipelines"
_REFERENCE = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_][\w.]*$")


def pipeline_target(reference: str) -> str:
    """The ``module:attribute`` a reference names, without importing it."""
    if ":" in reference:
        target = reference
    else:
        found = entry_points(group=ENTRY_POINT_GROUP, name=reference)
        if not found:
            known = ", ".join(sorted(ep.name for ep in entry_points(group=ENTRY_POINT_GROUP)))
            raise PipelineNotFoundError(
                f"unknown pipeline {reference!r} (known: {known}; "
                "or give one as package.module:attribute)"
            )
        if len({ep.value for ep in found}) > 1:
            where = ", ".join(sorted(ep.value for ep in found))
            raise InvalidPipelineError(f"pipeline {reference!r} is declared twice: {where}")
        target = next(iter(found)).value
    if not _REFERENCE.match(target):
        raise InvalidPipelineError(
            f"invalid pipeline reference {reference!r}: use package.module:attribute"
        )
    return target


def load_object(reference: str) -> Any:
    """The object a reference names: ``module:attribute`` or an entry point's name."""
    module_name, _, attribute = pipeline_target(reference).partition(":")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        raise PipelineNotFoundError(
            f"pipeline {reference!r}: no module named {exc.name!r}"
        ) from None
    except Exception as exc:
        # The user's module itself fails: say where, not a traceback of our loader.
        raise InvalidPipelineError(
            f"pipeline {reference!r}: importing {module_name} failed: "
            f"{type(exc).__name__}: {exc}".splitlines()[0]
        ) from None
    found_object: Any = module
    for name in attribute.split("."):
        found_object = getattr(found_object, name, None)
        if found_object is None:
            raise PipelineNotFoundError(
                f"pipeline {reference!r}: {module_name} has no {attribute!r}"
            )
    return found_object


def _is_build(found: Any) -> bool:
    """Whether ``found`` is a function that takes one positional argument: a job."""
    if not inspect.isfunction(found):
        return False
    parameters = list(inspect.signature(found).parameters.values())
    required = [p for p in parameters if p.default is inspect.Parameter.empty]
    positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    return bool(parameters) and parameters[0].kind in positional and len(required) <= 1


def load_build(reference: str) -> Callable[..., None]:
    """A job's ``build(job)`` function, by ``module:function``."""
    found = load_object(reference)
    if not _is_build(found):
        raise InvalidPipelineError(
            f"{reference!r} is a {type(found).__name__}, not a function build(job)"
        )
    build: Callable[..., None] = found
    return build


def load_pipeline(reference: str, *, real_time: bool = False) -> Pipeline:
    """The pipeline a reference names: a Pipeline, or a job's ``build`` function
    (``real_time``: run in Spark's real-time mode, for a ``build`` function only)."""
    found_object = load_object(reference)
    if isinstance(found_object, Pipeline) and not real_time:
        return found_object
    if _is_build(found_object):
        # A job written on the job API: its build(job) function.
        from kappaflow.jobs.from_build import app_pipeline, real_time_pipeline

        return real_time_pipeline(found_object) if real_time else app_pipeline(found_object)
    if real_time:
        raise InvalidPipelineError(
            f"{reference!r} is not a job's build function: --real-time runs jobs on the job API"
        )
    raise InvalidPipelineError(
        f"pipeline {reference!r} is a {type(found_object).__name__}, not a job's build "
        "function or a kappaflow Pipeline"
    )


def start_build(
    ctx: JobContext,
    build: Callable[..., None],
    *,
    available_now: bool = False,
    on_step: StepHook | None = None,
) -> list[StreamingQuery]:
    """Start the queries of the job ``build`` declares on the job API, with all its
    guarantees, from a pipeline's ``start``: for a pipeline that runs such a job beside
    queries of its own in parts, as the counting job runs its real-time preview.
    ``available_now``: the queries read what the sources hold now, then stop.
    ``on_step`` is called at each step of every batch's writes (fault-injection tests)."""
    from kappaflow.jobs.from_build import start_app

    return start_app(build, ctx, on_step, available_now=available_now)
