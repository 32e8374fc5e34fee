"""``jobs check``: a job's plan without running it, and whether its checkpoint can take it.

An output's state in the checkpoint is laid out for what it computes: its source, window,
key columns and aggregates. When a job starts, each output's definition is recorded beside
its checkpoint (``<checkpoint>/<output>.plan.json``); a later start, or ``jobs check``,
whose definition differs while that checkpoint exists is refused with what changed, before
Spark fails on it with a state schema error (or, worse, does not, and mixes old state into
new results). Give the job another name, or delete its checkpoint, to start over.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from kappaflow.jobs.pipeline import load_build
from kappaflow.jobs.plan import verify_restart
from kappaflow.settings import Settings
from kappaflow.streams.output.lake_fs import HadoopFs

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from kappaflow.streams.job import Job


def declare_app(
    settings: Settings,
    reference: str,
    name: str,
    params: Mapping[str, str],
    spark: SparkSession,
) -> Job:
    """The job the app ``reference`` declares with ``params``, on ``spark``, reading
    Kafka; nothing is started."""
    from kappaflow.jobs.from_build import KafkaReader
    from kappaflow.streams.runtime import declare

    return declare(load_build(reference), name, params, spark, KafkaReader(settings))


def mark_topics(settings: Settings, plan: dict[str, Any], checkpoint: str) -> None:
    """Say in ``plan`` which of its sources' and tables' topics exist, and where its
    checkpoint is."""
    from kappaflow.kafka.topics import list_topics

    existing = {t["name"] for t in list_topics(settings.kafka)}
    for source in plan["sources"]:
        source["topic_exists"] = source["topic"] in existing
    for table in plan["tables"]:
        table["topic_exists"] = not table["kafka"] or table["table"] in existing
    plan["checkpoint"] = checkpoint


def check_app(
    settings: Settings, reference: str, name: str | None, params: Mapping[str, str]
) -> dict[str, Any]:
    """Declare the job on a Spark session, without starting it; its plan."""
    from kappaflow.spark.session import build_session
    from kappaflow.streams.runtime import describe, lake_paths

    job_name = name or reference.partition(":")[0].rsplit(".", 1)[-1]
    spark = build_session(settings, app_name=f"kappaflow:check:{job_name}")
    job = declare_app(settings, reference, job_name, params, spark)
    root = f"{settings.checkpoint_location.rstrip('/')}/{job_name}"
    for path in lake_paths(job, settings.lake_root):
        HadoopFs(spark, path)
    states = verify_restart(job, HadoopFs(spark, root), root)
    plan = describe(job)
    mark_topics(settings, plan, root)
    plan["restart"] = "compatible"
    plan["state"] = states  # per output: new, kept or migrated (jobs/evolution.py)
    return plan
