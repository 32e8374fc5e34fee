"""Shadow runs: a new version of a live job, on the same sources, writing outputs of its
own (jobs/shadow_names.py), to compare with the live job (jobs/diff.py) and to take over
its outputs (jobs/promote.py).

``start`` takes a savepoint of the live job (running or stopped) and, where the new
version's state can take it (the rules of ``jobs check --from-savepoint``), starts the
shadow from a copy of its checkpoint: the shadow goes on from the savepoint's offsets and
state, and its outputs hold the windows that change after it. Where the state cannot
take it (an aggregate added, keys changed), the shadow starts with fresh state from its
sources' start: a replay of the retained log, so that its windows are whole. What it was
started from is recorded in the live job's home (``shadow.json``).
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kappaflow.errors import (
    NoShadowError,
    SavepointIncompatibleError,
    ShadowExistsError,
    ShadowUnsupportedError,
)
from kappaflow.jobs.files import PLAN, write_atomically
from kappaflow.jobs.manager import JobManager, JobRecord, JobState
from kappaflow.jobs.shadow_names import SHADOW_PARAM, shadow_name
from kappaflow.timeutil import iso

if TYPE_CHECKING:
    from kappaflow.settings import Settings, SettingsOverrides

#: In the live job's home while it has a shadow: the shadow's job, app, parameters and
#: what it started from.
SHADOW = "shadow.json"


def shadow_info(settings: Settings, name: str) -> dict[str, Any]:
    """What ``shadow.json`` of job ``name`` records; KF792 when it has no shadow."""
    jobs = JobManager(settings)
    jobs.get(name)
    try:
        info: dict[str, Any] = json.loads((jobs.job_dir(name) / SHADOW).read_text())
    except FileNotFoundError:
        raise NoShadowError(
            f"job {name!r} has no shadow (start one: `kappaflow jobs shadow {name} --app ...`)"
        ) from None
    return info


def start(
    settings: Settings,
    name: str,
    reference: str,
    params: Mapping[str, str],
    *,
    replay: bool = False,
    overrides: SettingsOverrides | None = None,
    config_file: Path | None = None,
) -> dict[str, Any]:
    """Start the shadow of live job ``name`` with the app ``reference``; what it started
    from (``shadow.json``)."""
    from kappaflow.jobs.restore import check
    from kappaflow.jobs.savepoints import take

    jobs = JobManager(settings)
    live = jobs.get(name)
    home = jobs.job_dir(name)
    if not (home / PLAN).exists():
        raise ShadowUnsupportedError(
            f"job {name!r} is not a job on the job API (started with --app): shadows are "
            "of those only"
        )
    if live.real_time:
        raise ShadowUnsupportedError(
            f"job {name!r} runs in real-time mode, whose outputs are at least once: a "
            "shadow is compared and promoted window by window, which needs micro-batches"
        )
    shadow = shadow_name(name)
    if (home / SHADOW).exists() or jobs.get_state(shadow) is not JobState.ABSENT:
        raise ShadowExistsError(
            f"job {name!r} already has a shadow, {shadow!r}: diff it, promote it, or drop "
            f"it (`kappaflow jobs shadow {name} --stop`)"
        )
    started: dict[str, Any] = {"replay": True, "why": "asked (--replay)"}
    if not replay:
        label = "shadow-" + datetime.now(UTC).strftime("%Y%m%dT%H%M%S%fZ")
        savepoint = take(settings, name, label)
        try:
            _, plan = check(settings, name, reference, params, label)
            migrated = _migrated(plan)
        except SavepointIncompatibleError as exc:
            started = {"replay": True, "savepoint": label, "why": str(exc)}
        else:
            if migrated:
                # A migrated state holds some values from the savepoint on only (an
                # aggregate added): the shadow replays, so that its windows are whole.
                why = f"{migrated}: a shadow replays the log, so that its aggregates are whole"
                started = {"replay": True, "savepoint": label, "why": why}
            else:
                _copy_checkpoint(settings, savepoint.checkpoint, savepoint.manifest, shadow)
                started = {
                    "replay": False,
                    "savepoint": label,
                    "batches": {o: b["batch_id"] for o, b in savepoint.manifest["outputs"].items()},
                }
    info = {
        "job": shadow,
        "live": name,
        "app": reference,
        "params": dict(params),
        "started_at": iso(datetime.now(UTC)),
        "started_from": started,
    }
    write_atomically(home / SHADOW, json.dumps(info, indent=2) + "\n")
    try:
        jobs.start(
            shadow,
            reference,
            {**params, SHADOW_PARAM: name},
            overrides=overrides or live.overrides,
            config_file=config_file or (Path(live.config_file) if live.config_file else None),
        )
    except BaseException:
        if jobs.get_state(shadow) is JobState.ABSENT:
            (home / SHADOW).unlink(missing_ok=True)
        raise
    return info


def _migrated(plan: Mapping[str, Any]) -> str:
    """The aggregates a start from the savepoint would add to outputs' state: their
    values would start at the savepoint (jobs/evolution.py)."""
    return "; ".join(
        f"output {c['output']!r}: {c['change']}"
        for c in plan["savepoint"]["changes"]
        if c.get("state") == "migrated"
        and c["change"].startswith("aggregate ")
        and " added" in c["change"]
    )


def _copy_checkpoint(
    settings: Settings, checkpoint: Path, manifest: Mapping[str, Any], shadow: str
) -> None:
    """A savepoint's checkpoint as the shadow's own (named for its new place)."""
    from kappaflow.jobs.restore import relocate
    from kappaflow.jobs.savepoints import checkpoint_path

    root = checkpoint_path(settings, shadow)
    shutil.rmtree(root, ignore_errors=True)
    root.parent.mkdir(parents=True, exist_ok=True)
    shutil.copytree(checkpoint, root)
    relocate(root, str(manifest["checkpoint"]), str(root.absolute()))


def drop(settings: Settings, name: str) -> str:
    """Stop the shadow of job ``name`` and remove it with everything it wrote; its name."""
    from kappaflow.jobs.removal import remove_job

    info = shadow_info(settings, name)
    jobs = JobManager(settings)
    shadow = str(info["job"])
    if jobs.is_running(shadow):
        jobs.stop(shadow)
    if jobs.get_state(shadow) is not JobState.ABSENT:
        remove_job(settings, shadow)
    (jobs.job_dir(name) / SHADOW).unlink(missing_ok=True)
    return shadow


def shadow_record(settings: Settings, name: str) -> JobRecord | None:
    """The shadow's job record, None when it never started."""
    jobs = JobManager(settings)
    shadow = shadow_name(name)
    return jobs.get(shadow) if jobs.get_state(shadow) is not JobState.ABSENT else None
