"""A job's plan: each output's signature, recorded at start, and checked on a restart
against the checkpoint it resumes."""

from __future__ import annotations

import json
from typing import Any

from kappaflow.errors import StateIncompatibleError
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
