"""Fault injection for the exactly-once tests: a pipeline killing its own driver at
one step of one batch.

Not part of kappaflow. A job runs it only when started with ``--pipeline
faults:COUNT_WITH_CRASH`` (the counting pipeline), ``faults:REVENUE_WITH_CRASH`` (the
revenue example, a job on the job API with Kafka, Redis and lake sinks) or
``faults:REVENUE_TABLE_WITH_CRASH`` (its PostgreSQL twin, examples/revenue_table.py) and this
directory on the driver's PYTHONPATH; ``CRASH_AT`` (``STEP:N``) names the step
(streams/output/writer.py STEPS) and the first batch id at which to crash,
in a batch that publishes something; the driver writes the step and the batch id it
crashed in to the file ``CRASH_RECORD`` names, then SIGKILLs itself.
"""

from __future__ import annotations

import itertools
import json
import os
import signal
from pathlib import Path

from pyspark.sql.streaming import StreamingQuery

from kappaflow.counting import pipeline as counting
from kappaflow.counting.spec import CountSpec
from kappaflow.jobs.contract import JobContext, Pipeline
from kappaflow.jobs.from_build import start_app
from kappaflow.streams.output.writer import STEPS

CRASH_AT = "KAPPAFLOW_FAULT_CRASH_AT"
CRASH_RECORD = "KAPPAFLOW_FAULT_RECORD"


def count_with_crash(
    source: str, window_ms: int, crash_at: str, record: Path
) -> tuple[list[str], dict[str, str]]:
    """How a test starts the counting job of ``source`` through ``COUNT_WITH_CRASH``: the
    arguments of ``jobs start JOB`` after the job's name, and the environment that puts this
    directory on the driver's PYTHONPATH and arms the crash at ``crash_at`` (``STEP:N``),
    recorded in ``record``."""
    params = CountSpec(
        source=source,
        key_field="page",
        time_field="ts",
        id_field="id",
        window_ms=window_ms,
        watermark_ms=5_000,
        allowed_lateness_ms=20_000,
    ).to_params()
    args = [
        "--pipeline",
        "faults:COUNT_WITH_CRASH",
        *itertools.chain.from_iterable(("-P", f"{k}={v}") for k, v in params.items()),
    ]
    here = str(Path(__file__).resolve().parent)
    env = {
        "PYTHONPATH": os.pathsep.join([here, os.environ.get("PYTHONPATH", "")]),
        CRASH_AT: crash_at,
        CRASH_RECORD: str(record),
    }
    return args, env


def _crash(step: str, output: str, batch_id: int, results: int) -> None:
    wanted, _, first = os.environ[CRASH_AT].partition(":")
    assert wanted in STEPS, f"unknown step {wanted!r}"
    if step == wanted and batch_id >= int(first) and results > 0:
        Path(os.environ[CRASH_RECORD]).write_text(
            json.dumps({"step": step, "batch": batch_id, "output": output})
        )
        os.kill(os.getpid(), signal.SIGKILL)


def _start(ctx: JobContext) -> list[StreamingQuery]:
    return counting.start(ctx, on_step=_crash)


COUNT_WITH_CRASH = Pipeline(start=_start, parts=counting.parts)


def _start_revenue(ctx: JobContext) -> list[StreamingQuery]:
    from revenue import build

    return start_app(build, ctx, on_step=_crash)


REVENUE_WITH_CRASH = Pipeline(start=_start_revenue)


def _start_revenue_table(ctx: JobContext) -> list[StreamingQuery]:
    from revenue_table import build

    return start_app(build, ctx, on_step=_crash)


REVENUE_TABLE_WITH_CRASH = Pipeline(start=_start_revenue_table)
