"""A job's plan: each output's signature, recorded at start, and checked on a restart
against the checkpoint it resumes."""

from __future__ import annotations

import json
from typing import Any

from kappaflow.errors import StateIncompatibleError
from kappaflow.jobs.evolution import (
    FORMAT_KEY,
    KEPT,
    MIGRATED,
    REFUSED,
    STATE_FORMAT,
    state_changes,
)
from kappaflow.streams.job import Job, Output
from kappaflow.streams.output.lake_fs import HadoopFs


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


def verify_restart(job: Job, fs: HadoopFs, checkpoint_root: str) -> dict[str, str]:
    """Refuse a start whose outputs' state no longer fits their checkpoints (``fs`` is
    rooted at ``checkpoint_root``); what the start does to each output's state: ``new``
    (no checkpoint yet), ``kept``, or ``migrated: CHANGE; ...`` (jobs/evolution.py)."""
    found = {}
    for output in job.outputs:
        held_path = f"{output.name}.plan.json"
        found[output.name] = "new"
        if not fs.exists(output.name) or not fs.exists(held_path):
            continue
        held = json.loads(fs.read_text(held_path))
        changes = state_changes(held, signature(output), by_name=by_name(held))
        found[output.name] = (
            f"{MIGRATED}: " + "; ".join(f"{c.change} ({c.why})" for c in changes)
            if changes
            else KEPT
        )
        refused = [c for c in changes if c.state == REFUSED]
        if refused:
            what = "; ".join(f"{c.change} ({c.why})" for c in refused)
            raise StateIncompatibleError(
                f"job {job.name!r} output {output.name!r} changed what its state holds "
                f"({what}): its checkpoint cannot take it. Start it under another name, or "
                f"delete {checkpoint_root}/{output.name} to start it over"
            )
    return found


def by_name(held: dict[str, Any]) -> bool:
    """Whether an output's recorded state keeps its aggregates by name (jobs/evolution.py)."""
    return held.get(FORMAT_KEY) == STATE_FORMAT


def record_plan(job: Job, fs: HadoopFs, *, jvm_windows: bool = True) -> None:
    """Keep each output's definition beside its checkpoint, for later starts to compare.
    A window output's checkpoint made now (``jvm_windows``: by the engine's Java operator)
    keeps its aggregates by name; one made before does so only if it said so then."""
    for output in job.outputs:
        path = f"{output.name}.plan.json"
        found = signature(output)
        if output.aggregate is not None:
            if fs.exists(output.name):
                held = json.loads(fs.read_text(path)) if fs.exists(path) else {}
                keeps = by_name(held)
            else:
                keeps = jvm_windows
            if keeps:
                found[FORMAT_KEY] = STATE_FORMAT
        fs.write_atomically(path, json.dumps(found) + "\n")
