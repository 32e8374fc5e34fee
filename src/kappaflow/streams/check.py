"""``jobs check``: a job's plan without running it, and whether its checkpoint can take it.

An output's state in the checkpoint is laid out for what it computes: its source, window,
key columns and aggregates. When a job starts, each output's definition is recorded beside
its checkpoint (``<checkpoint>/<output>.plan.json``); a later start, or ``jobs check``,
whose definition differs while that checkpoint exists is refused with what changed, before
Spark fails on it with a state schema error (or, worse, does not, and mixes old state into
new results). Give the job another name, or delete its checkpoint, to start over.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from kappaflow.errors import StateIncompatibleError
from kappaflow.jobs.pipeline import load_build
from kappaflow.settings import Settings
from kappaflow.streams.job import Job, Output
from kappaflow.streams.lake_fs import HadoopFs


def signature(output: Output) -> dict[str, Any]:
    """What an output's checkpointed state depends on."""
    source = output.stream.source
    found: dict[str, Any] = {"source": source.topic, "kind": "records"}
    if output.stream.state_definition is not None:
        found.update(output.stream.state_definition)
    if source.joins:
        # A stream-stream join keeps state by its keys and range; a changed join (or a
        # table joined before a window) changes what the output's state holds.
        found["joins"] = [j.describe() for j in source.joins]
    if output.aggregate is not None:
        agg = output.aggregate
        found.update(
            kind="windowed aggregate",
            window_ms=agg.window.size_ms,
            slide_ms=agg.window.slide_ms,
            by=list(agg.keys),
            aggregates={name: repr(a) for name, a in sorted(agg.aggregates.items())},
            id=source.id is not None,
        )
        if agg.window.session:
            found["session"] = True
    return found


def verify_restart(job: Job, fs: HadoopFs, checkpoint_root: str) -> None:
    """Refuse a start whose outputs' state no longer fits their checkpoints (``fs`` is
    rooted at ``checkpoint_root``)."""
    for output in job.outputs:
        held_path = f"{output.name}.plan.json"
        if not fs.exists(output.name) or not fs.exists(held_path):
            continue
        held = json.loads(fs.read_text(held_path))
        now = signature(output)
        changed = sorted(k for k in held.keys() | now.keys() if held.get(k) != now.get(k))
        if changed:
            what = "; ".join(f"{k}: {held.get(k)!r} -> {now.get(k)!r}" for k in changed)
            raise StateIncompatibleError(
                f"job {job.name!r} output {output.name!r} changed what its state holds "
                f"({what}): its checkpoint cannot take it. Start it under another name, or "
                f"delete {checkpoint_root}/{output.name} to start it over"
            )


def record_plan(job: Job, fs: HadoopFs) -> None:
    """Keep each output's definition beside its checkpoint, for later starts to compare."""
    for output in job.outputs:
        fs.write_atomically(f"{output.name}.plan.json", json.dumps(signature(output)) + "\n")


def check_app(
    settings: Settings, reference: str, name: str | None, params: Mapping[str, str]
) -> dict[str, Any]:
    """Declare the job on a Spark session, without starting it; its plan."""
    from kappaflow.kafka.topics import list_topics
    from kappaflow.spark.session import build_session
    from kappaflow.streams.app import KafkaReader
    from kappaflow.streams.runtime import declare, describe, lake_paths

    build = load_build(reference)
    job_name = name or reference.partition(":")[0].rsplit(".", 1)[-1]
    spark = build_session(settings, app_name=f"kappaflow:check:{job_name}")
    job = declare(build, job_name, params, spark, KafkaReader(settings))
    root = f"{settings.checkpoint_location.rstrip('/')}/{job_name}"
    for path in lake_paths(job, settings.lake_root):
        HadoopFs(spark, path)
    verify_restart(job, HadoopFs(spark, root), root)
    plan = describe(job)
    existing = {t["name"] for t in list_topics(settings.kafka)}
    for source in plan["sources"]:
        source["topic_exists"] = source["topic"] in existing
    for table in plan["tables"]:
        table["topic_exists"] = not table["kafka"] or table["table"] in existing
    plan["checkpoint"] = root
    plan["restart"] = "compatible"
    return plan
