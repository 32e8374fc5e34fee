"""The ``count`` pipeline: a job on the job API (job.py), started as any pipeline starts
one (``kappaflow.jobs.pipeline.start_build``), plus its real-time preview.

The main query is the API's: Kafka → parse → windows → counts → the changelog topic
``NAME.counts`` and the serving store, exactly once, with corrections, late events and
dead letters. With ``--realtime``, a second query in a driver process of its own
previews the counts within milliseconds (realtime.py).
"""

from __future__ import annotations

from collections.abc import Mapping

from pyspark.sql.streaming.query import StreamingQuery

from kappaflow.counting import realtime
from kappaflow.counting.job import OUTPUT, count_job
from kappaflow.counting.spec import REALTIME_PART, CountSpec
from kappaflow.jobs.pipeline import JobContext, Part, Pipeline, start_build
from kappaflow.kafka.topics import topic_partitions
from kappaflow.settings import Settings
from kappaflow.streams.output.writer import StepHook


def parts(params: Mapping[str, str], settings: Settings) -> list[Part]:
    """With ``--realtime``, the real-time query runs in a driver process of its own.

    Beside the micro-batch query in one JVM it stalled: a micro-batch's tasks, its
    garbage and the shared task scheduler held it up, so under load it fell seconds
    behind (benchmarks/counting.md measures both)."""
    spec = CountSpec.from_params(dict(params))
    if not spec.realtime:
        return []
    partitions = len(topic_partitions(settings.kafka, spec.source))
    return [Part(REALTIME_PART, realtime.spark_settings(settings, partitions))]


def start(ctx: JobContext, on_step: StepHook | None = None) -> list[StreamingQuery]:
    """Start the job's counting query (or, in its real-time part, the real-time query).

    ``on_step`` is called at each step of every batch's writes (streams/output/writer.py
    STEPS); the fault-injection tests pass one, kappaflow's pipeline none."""
    spec = CountSpec.from_params(dict(ctx.params))
    if ctx.part == REALTIME_PART:
        partitions = len(topic_partitions(ctx.settings.kafka, spec.source))
        return [
            realtime.start(
                ctx.spark,
                ctx.settings,
                spec,
                f"{ctx.name}.realtime",
                f"{ctx.name}.{OUTPUT}",
                str(ctx.checkpoint_dir / "realtime"),
                partitions,
            )
        ]
    return start_build(ctx, count_job(spec), available_now=spec.available_now, on_step=on_step)


#: The ``count`` pipeline (entry point ``count``).
PIPELINE = Pipeline(start=start, parts=parts)
