"""A start from a savepoint: whether the new code can take the savepoint's state
(:func:`compare_plans`, :func:`check`), and the restore that puts the sinks and then the
checkpoint back where the savepoint found them (:func:`restore`). What a savepoint holds
and how it is taken: jobs/savepoints.py.
"""

from __future__ import annotations

import base64
import json
import shutil
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kappaflow.errors import (
    ProduceError,
    SavepointDamagedError,
    SavepointIncompatibleError,
    TopicExistsError,
)
from kappaflow.jobs.evolution import KEPT, MIGRATED, REFUSED, RESET, state_changes
from kappaflow.jobs.files import RESTORING, local_path, write_atomically
from kappaflow.jobs.manager import JobManager
from kappaflow.jobs.plan import by_name
from kappaflow.jobs.savepoints import (
    OUTPUTS,
    STORE,
    Savepoint,
    checkpoint_path,
    find,
    local_dir,
    read_markers,
)
from kappaflow.settings import Settings
from kappaflow.streams.output.lake_delta_log import drop_batches_after, is_delta_dir, schema_at
from kappaflow.streams.output.lake_manifest import MANIFEST_DIR, PUBLISHING_DIR, Manifest, is_record
from kappaflow.waiting import wait_for

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from kappaflow.streams.job import Job


# What a start from one takes.


@dataclass(frozen=True)
class Change:
    """One difference between a savepoint's plan and the new code's, and whether a start
    from the savepoint takes it."""

    output: str | None
    change: str
    taken: bool
    why: str
    #: What it does to the output's state (jobs/evolution.py): migrated, reset or refused;
    #: None for a change that leaves the state as it is.
    state: str | None = None

    def to_json(self) -> dict[str, Any]:
        found = {"output": self.output, "change": self.change, "taken": self.taken}
        found["why"] = self.why
        if self.state is not None:
            found["state"] = self.state
        return found

    def __str__(self) -> str:
        where = f"output {self.output!r}: " if self.output else ""
        return f"{where}{self.change} ({self.why})"


_STATE_WHY = {
    "source": "the checkpoint's offsets and state are the old source's",
    "kind": "the checkpoint holds the state of another kind of output",
    "joins": "a join keeps its state by its keys and range",
}
RESET_WHY = (
    "--reset-state: its state starts afresh, from its source's start as an added output's "
    "does; it loses the windows (or keys) its state held and its sinks' progress (commit "
    "marker, serving-store keys) and publishes its results again"
)
_SOURCE_WHY = {
    "watermark_ms": "the watermark goes on from the savepoint's; the new delay moves it from "
    "the next batch",
    "allowed_lateness_ms": "windows the state holds are kept by the new lateness from the "
    "next batch",
    "start": "the savepoint's offsets say where the source goes on",
}


def compare_plans(
    held_states: Mapping[str, Any],
    held_plan: Mapping[str, Any],
    states: Mapping[str, Any],
    plan: Mapping[str, Any],
    reset: Collection[str] = (),
) -> list[Change]:
    """What changed from a savepoint (each output's state definition, jobs/check.py,
    and its plan, runtime.describe) to the new code, and whether Spark and the sinks take
    each change. Filters and projections before an output's state are in neither: Spark
    takes them, and so do the sinks (a lake table's columns aside: :func:`lake_columns`).
    An output in ``reset`` starts its state afresh: its state's changes are taken."""
    changes: list[Change] = []
    for name in sorted(held_states.keys() - states.keys()):
        changes.append(Change(name, "output removed", True, "its state stays unused"))
    for name in sorted(states.keys() - held_states.keys()):
        changes.append(
            Change(name, "output added", True, "it starts with no state, from its source's start")
        )
    for name in sorted(held_states.keys() & states.keys()):
        held, now = held_states[name], states[name]
        for found in state_changes(held, now, by_name=by_name(held)):
            key = found.change.partition(":")[0]
            why = _STATE_WHY.get(key, found.why)
            if name in reset:
                changes.append(Change(name, found.change, True, RESET_WHY, RESET))
            else:
                changes.append(Change(name, found.change, found.state != REFUSED, why, found.state))
        if name in reset:
            changes.append(Change(name, "state reset", True, RESET_WHY, RESET))
    held_outputs = {o["name"]: o for o in held_plan.get("outputs", [])}
    for output in plan.get("outputs", []):
        if output["name"] in held_outputs and output["name"] in held_states:
            changes += _sink_changes(output["name"], held_outputs[output["name"]], output)
    held_sources = {s["topic"]: s for s in held_plan.get("sources", [])}
    for source in plan.get("sources", []):
        before = held_sources.get(source["topic"])
        for key in sorted(before.keys() & source.keys() if before else ()):
            if before is not None and before[key] != source[key]:
                why = _SOURCE_WHY.get(key, "parsing keeps no state")
                change = f"source {source['topic']} {key}: {before[key]!r} -> {source[key]!r}"
                changes.append(Change(None, change, True, why))
    return changes


def _sink_changes(name: str, held: Mapping[str, Any], now: Mapping[str, Any]) -> list[Change]:
    def of(output: Mapping[str, Any], kind: str) -> set[str]:
        return {
            str(sink.get("location", sink[kind]) if kind == "parquet" else sink[kind])
            for sink in output["sinks"]
            if kind in sink
        }

    changes = []
    for topic in sorted(of(held, "kafka") - of(now, "kafka")):
        changes.append(Change(name, f"no longer to topic {topic}", True, "it keeps what it has"))
    for topic in sorted(of(now, "kafka") - of(held, "kafka")):
        why = "Spark takes a new output topic: it gets the batches after the savepoint"
        changes.append(Change(name, f"to topic {topic}", True, why))
    if of(held, "redis") != of(now, "redis"):
        change = "to the serving store" if of(now, "redis") else "no longer to the serving store"
        changes.append(Change(name, change, True, "the store holds what the job writes"))
    for table in sorted(of(held, "parquet") - of(now, "parquet")):
        changes.append(
            Change(name, f"no longer to lake table {table}", True, "it keeps its batches")
        )
    for table in sorted(of(now, "parquet") - of(held, "parquet")):
        why = (
            "a lake table holds its output's batches from the first, and this one would hold "
            "those after the savepoint only (Spark refuses a file sink's new directory too)"
        )
        changes.append(Change(name, f"to lake table {table}", False, why))
    return changes


def lake_columns(savepoint: Savepoint, plan: Mapping[str, Any], job: Job) -> list[Change]:
    """Refusals of a stream output whose rows changed columns while its lake table, as
    the savepoint left it, has others: the table's columns are fixed (KF721)."""
    from kappaflow.streams.model import BOOKKEEPING

    batches = savepoint.manifest["sinks"]["lake_batches"]
    outputs = {o.name: o for o in job.outputs}
    changes = []
    for described in plan["outputs"]:
        output = outputs[described["name"]]
        if output.aggregate is not None:
            continue  # its columns are its keys and aggregates: its state's definition
        columns = _column_types(output.stream.df.drop(*BOOKKEEPING).schema.jsonValue())
        for sink in described["sinks"]:
            held = _lake_schema(sink.get("location"), batches)
            if "parquet" not in sink or held is None:
                continue
            if sink.get("by_date"):
                held.pop("date", None)
            if held != columns:
                change = f"lake table {sink['location']} columns {held} -> {columns}"
                why = "a lake table's columns are fixed by its first batch"
                changes.append(Change(output.name, change, False, why))
    return changes


def _column_types(schema: dict[str, Any]) -> dict[str, str]:
    from kappaflow.streams.output.lake_manifest import column_types

    return column_types(schema)


def _lake_schema(location: str | None, batches: Mapping[str, int | None]) -> dict[str, str] | None:
    """The columns of the lake table at ``location`` as of the savepoint's last batch."""
    last = batches.get(location or "")
    path = local_path(location) if location else None
    if last is None or path is None:
        return None
    if is_delta_dir(path):
        schema = schema_at(path, last)
        return None if schema is None else _column_types(schema)
    folder = path / MANIFEST_DIR
    names = sorted(p.name for p in folder.iterdir() if is_record(p.name)) if folder.is_dir() else []
    held = [n for n in names if int(n.removesuffix(".json")) <= last]
    if not held:
        return None
    manifest = Manifest.from_json((folder / held[-1]).read_text(), str(folder / held[-1]))
    return manifest.column_types()


def check(
    settings: Settings,
    name: str,
    reference: str,
    params: Mapping[str, str],
    label: str,
    *,
    spark: SparkSession | None = None,
    reset: Collection[str] = (),
) -> tuple[Savepoint, dict[str, Any]]:
    """Declare the job with its new code and compare it with savepoint ``label``: the
    savepoint and the new plan, with the changes it takes and what each output's state
    does (kept, migrated, reset); a change it does not take is refused (KF622), and so is
    a ``reset`` of an output the job does not have or one with a lake table (KF915).
    Nothing is changed."""
    from kappaflow.jobs.check import declare_app, mark_topics
    from kappaflow.jobs.plan import signature
    from kappaflow.spark.session import build_session
    from kappaflow.streams.runtime import describe

    savepoint = find(settings, name, label)
    checkpoint_path(settings, name)
    session = spark or build_session(settings, app_name=f"kappaflow:check:{name}")
    job = declare_app(settings, reference, name, params, session)
    plan = describe(job, settings.lake_root)
    states = {output.name: signature(output) for output in job.outputs}
    _resettable(job, plan, reset)
    changes = compare_plans(savepoint.states, savepoint.plan, states, plan, reset)
    changes += lake_columns(savepoint, plan, job)
    refused = [c for c in changes if not c.taken]
    if refused:
        raise SavepointIncompatibleError(
            f"job {name!r} cannot start from savepoint {savepoint.label!r}: "
            + "; ".join(map(str, refused))
            + ". Keep those as they were, or start the job under another name"
        )
    mark_topics(settings, plan, f"{settings.checkpoint_location.rstrip('/')}/{name}")
    plan["restart"] = f"from savepoint {savepoint.label}: compatible"
    plan["savepoint"] = {
        **savepoint.summary(),
        "changes": [c.to_json() for c in changes],
        "state": output_states(savepoint.states, states, changes),
    }
    return savepoint, plan


def output_states(
    held: Mapping[str, Any], states: Mapping[str, Any], changes: Sequence[Change]
) -> dict[str, str]:
    """Per output of the new code, what a start from the savepoint does to its state:
    kept, migrated, reset, or new (an output added)."""
    found = {}
    for name in sorted(states):
        mine = {c.state for c in changes if c.output == name and c.state is not None}
        found[name] = (
            "new"
            if name not in held
            else RESET
            if RESET in mine
            else MIGRATED
            if MIGRATED in mine
            else KEPT
        )
    return found


def _resettable(job: Job, plan: Mapping[str, Any], reset: Collection[str]) -> None:
    from kappaflow.errors import StateResetError

    outputs = {o["name"]: o for o in plan["outputs"]}
    for name in sorted(reset):
        if name not in outputs:
            raise StateResetError(
                f"--reset-state {name}: job {job.name!r} has no output {name!r} "
                f"(its outputs: {', '.join(sorted(outputs))})"
            )
        if any("parquet" in sink for sink in outputs[name]["sinks"]):
            raise StateResetError(
                f"--reset-state {name}: output {name!r} writes a lake table, which holds its "
                "batches from the first by their ids; start the job under another name instead"
            )


# Starting from one.


def restore(
    settings: Settings,
    name: str,
    reference: str,
    params: Mapping[str, str],
    label: str,
    *,
    spark: SparkSession | None = None,
    reset: Collection[str] = (),
) -> Savepoint:
    """Put job ``name`` back where savepoint ``label`` found it, for a start with the app
    ``reference``: its sinks' progress, then its checkpoint. Refused, with nothing
    changed, for a job that runs, a savepoint that is missing, damaged or another job's,
    and a change the savepoint cannot take. The outputs in ``reset`` start afresh: their
    checkpoints, commit markers and serving-store keys go."""
    from pyspark.sql import SparkSession

    from kappaflow.jobs.files import read_resources
    from kappaflow.kafka.topics import list_topics
    from kappaflow.serving.client import redis_client
    from kappaflow.spark.session import build_session

    jobs = JobManager(settings)
    jobs.get(name)
    jobs.check_stopped(name)
    home = jobs.job_dir(name)
    find(settings, name, label)  # a missing savepoint is said before a session is built
    # A session this process had already is used, and left running.
    given = spark or SparkSession.getActiveSession()
    session = given or build_session(settings, app_name=f"kappaflow:restore:{name}")
    try:
        savepoint, _plan = check(
            settings, name, reference, params, label, spark=session, reset=reset
        )
    finally:
        if given is None:
            session.stop()  # the job's driver is about to start a JVM of its own
    # Everything that can fail before a change is tried first: a refusal changes nothing.
    resources = read_resources(home)
    lakes = {**savepoint.manifest["sinks"]["lake_batches"]}
    for location in resources.lakes:
        lakes.setdefault(location, None)  # a table added since: none of its batches stay
    paths = {location: local_dir(location, "lake table") for location in lakes}
    stored = _stored(savepoint)
    store = savepoint.manifest["sinks"]["store_keys"] is not None or resources.redis
    client = redis_client(settings) if store else None
    list_topics(settings.kafka)
    write_atomically(
        home / RESTORING,
        json.dumps({"savepoint": savepoint.label, "path": str(savepoint.path)}) + "\n",
    )
    markers = savepoint.manifest["sinks"]["commit_markers"]
    restore_markers(settings, name, {k: v for k, v in markers.items() if k not in reset})
    if client is not None:
        from kappaflow.serving.client import drop_job_keys

        drop_job_keys(client, name)
        for entry in stored:
            key, dumped = base64.b64decode(entry["key"]), base64.b64decode(entry["dump"])
            client.restore(key, int(entry["ttl_ms"]), dumped, replace=True)
        for output in sorted(reset):
            drop_job_keys(client, f"{name}:{output}")  # kf:NAME:OUTPUT:*
    for location, path in sorted(paths.items()):
        _drop_lake_batches(path, after=lakes[location])
    restore_checkpoint(settings, name, savepoint)
    root = checkpoint_path(settings, name)
    for output in sorted(reset):
        shutil.rmtree(root / output, ignore_errors=True)
        for plan_file in (root / f"{output}.plan.json", root / f".{output}.plan.json.crc"):
            plan_file.unlink(missing_ok=True)
    shutil.rmtree(home / OUTPUTS, ignore_errors=True)
    if (savepoint.path / OUTPUTS).is_dir():
        shutil.copytree(savepoint.path / OUTPUTS, home / OUTPUTS)
    (home / RESTORING).unlink()
    return savepoint


def _stored(savepoint: Savepoint) -> list[dict[str, Any]]:
    if savepoint.manifest["sinks"]["store_keys"] is None:
        return []
    try:
        entries: list[dict[str, Any]] = json.loads((savepoint.path / STORE).read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise SavepointDamagedError(
            f"savepoint {savepoint.path}: cannot read {STORE}: {exc}"
        ) from None
    return entries


def restore_markers(settings: Settings, name: str, wanted: Mapping[str, Any]) -> None:
    """Make ``NAME.commits`` hold ``wanted`` as each output's last marker. Its readers
    take each output's highest batch, so markers that moved past the savepoint's go with
    the topic, which is made anew with the savepoint's."""
    from kappaflow.kafka.clients import producer
    from kappaflow.kafka.topics import create_topic, delete_topic, list_topics
    from kappaflow.streams.output.backends import commits_topic

    def batches(markers: Mapping[str, Any]) -> dict[str, int]:
        return {output: int(marker["batch_id"]) for output, marker in markers.items()}

    if batches(read_markers(settings, name)) == batches(wanted):
        return
    topic = commits_topic(name)
    kafka = settings.kafka
    if any(t["name"] == topic for t in list_topics(kafka)):
        delete_topic(kafka, topic)

    def created() -> bool | None:
        if any(t["name"] == topic for t in list_topics(kafka)):
            return None  # its deletion is not through yet
        try:
            create_topic(kafka, topic, partitions=1, configs={"cleanup.policy": "compact"})
        except TopicExistsError:
            return None
        return True

    wait_for(created, timeout=60, interval=0.5, what=f"topic {topic} to be made anew")
    client = producer(kafka)
    for output, marker in sorted(wanted.items()):
        client.produce(topic, value=json.dumps(marker).encode(), key=output.encode())
    if client.flush(30):
        raise ProduceError(f"writing the savepoint's commit markers to {topic!r} failed")


def _drop_lake_batches(root: Path, after: int | None) -> None:
    """Uncommit a lake table's batches after ``after`` (all of them for None): each
    manifest goes first, which hides its files from readers, then its files; a Delta
    table's log is truncated before the first commit of a later batch (lake_delta_log)."""
    if is_delta_dir(root):
        drop_batches_after(root, after)
        return
    last = -1 if after is None else after
    for folder in (root / MANIFEST_DIR, root / PUBLISHING_DIR):
        names = (
            sorted(p.name for p in folder.iterdir() if is_record(p.name)) if folder.is_dir() else []
        )
        for name in reversed(names):
            if int(name.removesuffix(".json")) <= last:
                break
            text = (folder / name).read_text()
            files = json.loads(text)["files"]
            _unlink(folder / name)
            for file in files:
                _unlink(root / (file["path"] if isinstance(file, dict) else file))


def _unlink(path: Path) -> None:
    """A file and the checksum Hadoop's local file system may have written beside it."""
    path.unlink(missing_ok=True)
    (path.parent / f".{path.name}.crc").unlink(missing_ok=True)


def restore_checkpoint(settings: Settings, name: str, savepoint: Savepoint) -> None:
    """The savepoint's checkpoint in place of the job's: copied beside it, then swapped
    in by renames, so the job's folder is at all times one checkpoint or the other."""
    root = checkpoint_path(settings, name)
    incoming = root.parent / f".{name}.restoring"
    outgoing = root.parent / f".{name}.replaced"
    for scratch in (incoming, outgoing):
        shutil.rmtree(scratch, ignore_errors=True)
    root.parent.mkdir(parents=True, exist_ok=True)
    shutil.copytree(savepoint.checkpoint, incoming)
    relocate(incoming, str(savepoint.manifest["checkpoint"]), str(root.absolute()))
    if root.exists():
        root.rename(outgoing)
    incoming.rename(root)
    shutil.rmtree(outgoing, ignore_errors=True)


def relocate(checkpoint: Path, old: str, new: str) -> None:
    """Make a checkpoint copied from ``old`` to ``new`` name its own files. Nearly every
    path in a checkpoint is relative; Spark's operator metadata (``state/N/_metadata``)
    names a stateful operator's schema files by absolute URI, which would still point
    at ``old``. Hadoop's checksum of a file rewritten goes: a file without one is read
    unchecked."""
    if old == new:
        return
    before, after = f"{old}/".encode(), f"{new}/".encode()
    for path in checkpoint.glob("*/state/*/_metadata/**/*"):
        if path.is_file() and not path.name.startswith("."):
            content = path.read_bytes()
            if before in content:
                path.write_bytes(content.replace(before, after))
                (path.parent / f".{path.name}.crc").unlink(missing_ok=True)
