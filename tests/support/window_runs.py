"""A job on the job API run over files of batches, as the window-state tests run one:
its outputs' queries to the end of what the files hold, on a checkpoint of their own,
with the session's window operator set to ``engine``. Not part of kappaflow."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from pyspark.sql import SparkSession

from kappaflow.jobs.plan import record_plan
from kappaflow.streams.ops.windowing import ENGINE_CONF
from kappaflow.streams.output.backends import MemoryPublisher, MemoryStore
from kappaflow.streams.output.lake_fs import HadoopFs
from kappaflow.streams.runtime import Backends, declare, start_outputs
from kappaflow.testing import BatchFiles


def run_job(
    spark: SparkSession,
    home: Path,
    build: Callable[..., None],
    name: str,
    topic: str,
    batches: Sequence[Sequence[Any]],
    engine: str,
    *,
    plan: bool = False,
) -> tuple[MemoryStore, set[str]]:
    """Run job ``name`` (``build``) over ``batches`` of ``topic`` (files under
    ``home/sources``) on checkpoint ``home/checkpoints``, the session's window operator
    ``engine``: the store it wrote and the state operators its queries ran. ``plan``:
    each output's plan beside its query first, as a job's driver records it
    (jobs/from_build.py)."""
    files = BatchFiles(home / "sources")
    files.write(topic, batches)
    spark.conf.set(ENGINE_CONF, engine)
    operators: set[str] = set()
    try:
        job = declare(build, name, {}, spark, files)
        store = MemoryStore()
        backends = Backends(
            publisher=MemoryPublisher(),
            store=store,
            checkpoint_root=str(home / "checkpoints"),
            lake_root=str(home / "lake"),
        )
        if plan:
            record_plan(job, HadoopFs(spark, backends.checkpoint_root))
        for query in start_outputs(job, files, backends, available_now=True):
            try:
                assert query.awaitTermination(300), f"{query.name} did not finish"
                assert query.exception() is None, query.exception()
                for progress in query.recentProgress:
                    operators |= {op.operatorName for op in progress.stateOperators}
            finally:
                query.stop()
    finally:
        spark.conf.unset(ENGINE_CONF)
    return store, operators
