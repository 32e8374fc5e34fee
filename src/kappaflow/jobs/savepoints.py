"""Savepoints: a job's checkpoint and its sinks' progress, copied together under a label,
for the job to start from later, its code changed where its state can take the change.

A savepoint of job NAME is the folder ``<state_dir>/jobs/NAME/savepoints/LABEL/``:

- ``checkpoint/``: the job's checkpoint (``<checkpoint_dir>/NAME``), whole: each query's
  metadata, offset and commit logs, sources and RocksDB state (changelogs, snapshots,
  SST files), and each output's definition (``OUTPUT.plan.json``, jobs/check.py);
- ``manifest.json``: label, job, time (UTC), app and parameters; per output its last
  committed and planned batch, the source offsets of the committed one and what its
  state holds (and a fingerprint of that); where the sinks were: each output's last
  commit marker in ``NAME.commits``, each lake table's last committed batch;
- ``store.json``: the job's serving-store keys (``kf:NAME:*``), as Redis DUMPs them;
- ``plan.json`` and ``outputs/``: the job's plan and its outputs' status files.

Consistency: no query of the job runs while it is copied. A stopped job is copied as it
is; a running job's driver, asked through a file in the job's home, stops its queries
between batches (runner.py), takes the savepoint and starts them again. The checkpoint
and the sinks are then as a stop leaves them, which a start resumes exactly once from: a
batch the offset log plans and the commit log does not hold runs again, and each sink
skips what it holds of it (streams/output/writer.py).

A start from a savepoint puts the sinks back where the savepoint found them, then the
checkpoint: the commit markers (``NAME.commits`` is made anew with the savepoint's when
they moved since: its readers take each output's highest batch), the serving store's
keys, and each lake table's manifests (later batches' go, with their files). Left ahead,
a sink that saw batch N+5 would skip the restored job's batches N+1 to N+5, which Spark
plans anew from the restored offsets (one batch may cover what five did) and, the code
changed, computes anew. Kafka topics are logs: what the job published after the
savepoint stays, and the batches after it are published again.

Whether a start from a savepoint takes the new code is decided before anything changes,
by comparing the savepoint's plan with the new code's (jobs/restore.py) as Spark's
rules for a restart after a change go: filters, projections, watermark delays and output
topics may change; what an output's state holds (source, window, keys, aggregates,
stateful function, joins) and its lake tables (a file sink's directory) may not, nor a
lake table's columns. While a restore is under way, ``manager.RESTORING`` in the job's
home names its savepoint, and the job starts from a savepoint only (KF627).
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import shutil
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from kappaflow.errors import (
    InvalidSavepointLabelError,
    JobError,
    KappaflowError,
    SavepointDamagedError,
    SavepointExistsError,
    SavepointJobMismatchError,
    SavepointNotFoundError,
    SavepointTimeoutError,
    SavepointUnsupportedError,
    TopicNotFoundError,
    WaitTimeoutError,
    catalogue,
)
from kappaflow.jobs.files import PLAN, local_path, write_atomically
from kappaflow.jobs.manager import JobManager
from kappaflow.settings import Settings
from kappaflow.spark.checkpoint import shuffle_partitions
from kappaflow.streams.output.lake_delta_log import is_delta_dir, last_batch
from kappaflow.streams.output.lake_manifest import MANIFEST_DIR, is_record
from kappaflow.timeutil import iso
from kappaflow.waiting import wait_for

SAVEPOINTS = "savepoints"
MANIFEST = "manifest.json"
CHECKPOINT = "checkpoint"
STORE = "store.json"
OUTPUTS = "outputs"
FORMAT = 1
#: The request a running job's driver answers (``savepoint_asked``, ``answer_savepoint``).
REQUEST = "savepoint.request.json"
ANSWER = "savepoint.answer.json"
#: How long `jobs savepoint` waits for a running job's driver to answer: its queries
#: stop once their batch under way is done, then the copy. The driver answers before it
#: starts the queries again.
ANSWER_TIMEOUT_S = 120.0
_LABEL = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,100}$")


def validate_label(label: str) -> str:
    if not _LABEL.match(label):
        raise InvalidSavepointLabelError(
            f"invalid savepoint label {label!r}: use letters, digits, '.', '_' and '-' "
            "(max 101), starting with a letter or digit"
        )
    return label


@dataclass(frozen=True)
class Savepoint:
    path: Path
    manifest: dict[str, Any]

    @property
    def label(self) -> str:
        return str(self.manifest["label"])

    @property
    def checkpoint(self) -> Path:
        return self.path / CHECKPOINT

    @property
    def states(self) -> dict[str, dict[str, Any]]:
        """Each output's definition of its state (outputs of the job, not the queries of
        a joined table's dead letters)."""
        outputs = self.manifest["outputs"]
        return {name: o["state"] for name, o in outputs.items() if o["state"] is not None}

    @property
    def plan(self) -> dict[str, Any]:
        try:
            plan: dict[str, Any] = json.loads((self.path / PLAN).read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise SavepointDamagedError(
                f"savepoint {self.path}: cannot read {PLAN}: {exc}"
            ) from None
        return plan

    def summary(self) -> dict[str, Any]:
        m = self.manifest
        return {
            "label": self.label,
            "taken_at": m["taken_at"],
            "taken_while": m["taken_while"],
            "batches": {name: o["batch_id"] for name, o in m["outputs"].items()},
            "plan_fingerprint": m["plan_fingerprint"],
            "path": str(self.path),
        }


# Taking one.


def take(
    settings: Settings, name: str, label: str | None = None, *, timeout: float = ANSWER_TIMEOUT_S
) -> Savepoint:
    """A savepoint of job ``name`` under ``label`` (default: the time, UTC): taken here if
    the job is stopped, by its driver if it runs."""
    jobs = JobManager(settings)
    jobs.get(name)
    folder = jobs.job_dir(name) / SAVEPOINTS
    if label is None:
        label = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
        n = 1
        while (folder / label).exists():
            n += 1
            label = f"{label.split('.')[0]}.{n}"
    _check_new(folder, name, validate_label(label))
    if jobs.is_running(name):
        return _ask_driver(settings, name, label, timeout)
    return take_here(settings, name, label)


def _check_new(folder: Path, name: str, label: str) -> None:
    if (folder / label).exists():
        raise SavepointExistsError(f"job {name!r} already has a savepoint {label!r}")


def take_here(settings: Settings, name: str, label: str, *, paused: bool = False) -> Savepoint:
    """Copy job ``name``'s checkpoint and record its sinks' progress, in this process; no
    query of the job may run (``paused``: its driver stopped them for this)."""
    from kappaflow.jobs.files import read_resources

    jobs = JobManager(settings)
    record = jobs.get(name)
    home = jobs.job_dir(name)
    if not (home / PLAN).exists():
        raise SavepointUnsupportedError(
            f"job {name!r} is not a job on the job API (started with --app), or never "
            "declared its plan: savepoints are taken of those only"
        )
    root = checkpoint_path(settings, name)
    if not any(q.planned is not None for q in _queries(root)):
        raise SavepointUnsupportedError(
            f"job {name!r} has no checkpoint yet ({root}): let it run a batch first"
        )
    resources = read_resources(home)
    lakes = {location: local_dir(location, "lake table") for location in resources.lakes}
    folder = home / SAVEPOINTS
    _check_new(folder, name, label)
    # Built under a hidden name and renamed when whole: a listed savepoint is complete.
    scratch = folder / f".{label}.partial"
    shutil.rmtree(scratch, ignore_errors=True)
    scratch.mkdir(parents=True)
    try:
        shutil.copytree(root, scratch / CHECKPOINT)
        # Described from the copy: what the manifest says is what was copied.
        outputs = {q.name: q.describe() for q in _queries(scratch / CHECKPOINT)}
        states = {n: o["state"] for n, o in outputs.items() if o["state"] is not None}
        keys = _dump_store(settings, name, scratch / STORE) if resources.redis else None
        shutil.copy2(home / PLAN, scratch / PLAN)
        if (home / OUTPUTS).is_dir():
            shutil.copytree(home / OUTPUTS, scratch / OUTPUTS)
        manifest = {
            "format": FORMAT,
            "label": label,
            "job": name,
            "taken_at": iso(datetime.now(UTC)),
            "taken_while": "running" if paused else "stopped",
            "app": record.pipeline,
            "params": record.params,
            "plan_fingerprint": _fingerprint(states),
            "outputs": outputs,
            "checkpoint": str(root.absolute()),
            "sinks": {
                "commit_markers": read_markers(settings, name),
                "lake_batches": {loc: _last_lake_batch(path) for loc, path in lakes.items()},
                "store_keys": keys,
            },
        }
        write_atomically(scratch / MANIFEST, json.dumps(manifest, indent=2) + "\n")
        scratch.rename(folder / label)
    except BaseException:
        shutil.rmtree(scratch, ignore_errors=True)
        raise
    return Savepoint(folder / label, manifest)


@dataclass(frozen=True)
class _Query:
    """One query's folder in a checkpoint, with its last planned and committed batch."""

    folder: Path

    @property
    def name(self) -> str:
        return self.folder.name

    @property
    def planned(self) -> int | None:
        return _last_batch(self.folder / "offsets")

    @property
    def committed(self) -> int | None:
        return _last_batch(self.folder / "commits")

    def describe(self) -> dict[str, Any]:
        committed = self.committed
        plan = self.folder.parent / f"{self.name}.plan.json"
        return {
            "batch_id": committed,
            "planned_batch_id": self.planned,
            "source_offsets": [] if committed is None else _source_offsets(self.folder, committed),
            "state": json.loads(plan.read_text()) if plan.exists() else None,
            # Its shuffle and state partitions (jobs rescale changes them).
            "partitions": shuffle_partitions(self.folder),
        }


def _queries(root: Path) -> list[_Query]:
    if not root.is_dir():
        return []
    return [_Query(d) for d in sorted(root.iterdir()) if (d / "offsets").is_dir()]


def _last_batch(log: Path) -> int | None:
    """The highest batch of a checkpoint's offset or commit log (its files are named by
    batch; Hadoop's checksums and temporary files are hidden)."""
    batches = [int(p.name) for p in log.iterdir() if p.name.isdigit()] if log.is_dir() else []
    return max(batches, default=None)


def _source_offsets(query: Path, batch: int) -> list[Any]:
    """The end offsets of each source of ``batch``: the offset log's lines after its
    version and metadata lines (spark/checkpoint.py)."""
    lines = (query / "offsets" / str(batch)).read_text().splitlines()
    return [json.loads(line) if line.startswith("{") else line for line in lines[2:]]


def _fingerprint(states: Mapping[str, Any]) -> str:
    return hashlib.sha256(json.dumps(states, sort_keys=True).encode()).hexdigest()


def checkpoint_path(settings: Settings, name: str) -> Path:
    return local_dir(f"{settings.checkpoint_location.rstrip('/')}/{name}", "checkpoint")


def local_dir(location: str, what: str) -> Path:
    path = local_path(location)
    if path is None:
        raise SavepointUnsupportedError(
            f"the {what} {location} is not on this machine's file system: savepoints copy "
            "local checkpoints and lake tables only"
        )
    return path


def read_markers(settings: Settings, name: str) -> dict[str, dict[str, Any]]:
    """Each output's last committed marker in ``NAME.commits``, as KafkaPublisher reads
    them (the highest batch per output, read_committed)."""
    from kappaflow.kafka.records import StartAt, read_records
    from kappaflow.streams.output.backends import commits_topic, is_task_marker

    found: dict[str, dict[str, Any]] = {}
    try:
        start = StartAt(beginning=True)
        for message in read_records(settings.kafka, commits_topic(name), start=start):
            marker = json.loads(message.value() or b"{}")
            if is_task_marker(marker):
                continue
            output = str(marker["output"])
            if marker["batch_id"] > found.get(output, {}).get("batch_id", -1):
                found[output] = marker
    except TopicNotFoundError:
        return {}
    return found


def _last_lake_batch(root: Path) -> int | None:
    """A lake table's last committed batch: the highest its Delta log marks, or (a table of
    an earlier kappaflow) its highest manifest (lake_manifest.py)."""
    if is_delta_dir(root):
        return last_batch(root)
    folder = root / MANIFEST_DIR
    names = [p.name for p in folder.iterdir() if is_record(p.name)] if folder.is_dir() else []
    return max((int(n.removesuffix(".json")) for n in names), default=None)


def _dump_store(settings: Settings, name: str, path: Path) -> int:
    """Write every key of the job in the serving store, as DUMP serializes it, with its
    time to live; how many there are."""
    from kappaflow.serving.client import redis_client

    client = redis_client(settings)
    entries = []
    for key in client.scan_iter(match=f"kf:{name}:*", count=1000):
        dumped = client.dump(key)
        if dumped is None:  # expired since the scan
            continue
        ttl = int(client.pttl(key))
        entries.append(
            {
                "key": base64.b64encode(key).decode(),
                "ttl_ms": max(ttl, 0),
                "dump": base64.b64encode(dumped).decode(),
            }
        )
    path.write_text(json.dumps(entries) + "\n")
    return len(entries)


# A running job's driver takes it.


def _ask_driver(settings: Settings, name: str, label: str, timeout: float) -> Savepoint:
    """Ask job ``name``'s driver for a savepoint and wait for its answer."""
    jobs = JobManager(settings)
    home = jobs.job_dir(name)
    ident = uuid.uuid4().hex
    write_atomically(home / REQUEST, json.dumps({"id": ident, "label": label}) + "\n")

    def answered() -> dict[str, Any] | None:
        reply = _read_json(home / ANSWER)
        if reply is not None and reply.get("id") == ident:
            return reply
        if not jobs.is_running(name):
            raise SavepointTimeoutError(
                f"job {name!r} ended before it took savepoint {label!r} "
                f"(log: {home / 'driver.log'})"
            )
        return None

    try:
        reply = wait_for(answered, timeout=timeout, interval=0.2, what=f"savepoint {label}")
    except WaitTimeoutError:
        raise SavepointTimeoutError(
            f"job {name!r} did not take savepoint {label!r} within {timeout:.0f}s "
            f"(log: {home / 'driver.log'})"
        ) from None
    finally:
        # Withdrawn if not answered: a driver must not take it later, unasked.
        if (_read_json(home / REQUEST) or {}).get("id") == ident:
            (home / REQUEST).unlink(missing_ok=True)
        if (_read_json(home / ANSWER) or {}).get("id") == ident:
            (home / ANSWER).unlink(missing_ok=True)
    if reply["error"] is not None:
        raise catalogue().get(reply["code"], JobError)(reply["error"])
    return find(settings, name, label)


def savepoint_asked(home: Path) -> bool:
    """Whether a savepoint is asked of the job whose home is ``home``."""
    return (home / REQUEST).exists()


def answer_savepoint(settings: Settings, home: Path, name: str) -> None:
    """Take the savepoint asked for in ``home`` and answer; the job's queries are stopped.
    A failure is the answer, not the job's end."""
    request = _read_json(home / REQUEST)
    if request is None:
        return
    reply: dict[str, Any] = {"id": request.get("id"), "error": None, "code": None}
    try:
        taken = take_here(settings, name, validate_label(str(request.get("label"))), paused=True)
        print(f"savepoint {taken.label} taken at {taken.path}", flush=True)
    except KappaflowError as exc:
        reply.update(error=str(exc), code=exc.code)
    except Exception as exc:  # a disk full, say: the asker hears it, the job goes on
        reply.update(error=f"{type(exc).__name__}: {exc}".splitlines()[0], code=JobError.code)
    (home / REQUEST).unlink(missing_ok=True)
    write_atomically(home / ANSWER, json.dumps(reply) + "\n")


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        found: dict[str, Any] = json.loads(path.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None
    return found


# Finding them.


def listing(settings: Settings, name: str) -> list[dict[str, Any]]:
    """A summary of each of job ``name``'s savepoints, oldest first; a damaged one's says
    what is wrong with it (``damaged``), and comes last."""
    jobs = JobManager(settings)
    jobs.get(name)
    folder = jobs.job_dir(name) / SAVEPOINTS
    found, damaged = [], []
    for path in sorted(folder.iterdir()) if folder.is_dir() else []:
        if path.is_dir() and not path.name.startswith("."):
            try:
                found.append(_load(path).summary())
            except SavepointDamagedError as exc:
                damaged.append({"label": path.name, "path": str(path), "damaged": str(exc)})
    return sorted(found, key=lambda s: (s["taken_at"], s["label"])) + damaged


def find(settings: Settings, name: str, reference: str) -> Savepoint:
    """Job ``name``'s savepoint ``reference``: a label, or a savepoint's folder (a path)."""
    jobs = JobManager(settings)
    jobs.get(name)
    folder = jobs.job_dir(name) / SAVEPOINTS
    if "/" in reference:
        path = Path(reference).expanduser().resolve()
    else:
        path = folder / validate_label(reference)
    if not path.is_dir():
        labels = sorted(p.name for p in folder.iterdir()) if folder.is_dir() else []
        shown = ", ".join(label for label in labels if not label.startswith(".")) or "none"
        raise SavepointNotFoundError(
            f"job {name!r} has no savepoint {reference!r} (it has: {shown}; "
            f"`kappaflow jobs savepoints {name}` lists them)"
        )
    savepoint = _load(path)
    if savepoint.manifest["job"] != name:
        raise SavepointJobMismatchError(
            f"savepoint {path} was taken of job {savepoint.manifest['job']!r}, not {name!r}: "
            "a checkpoint belongs with its job's topics, store keys and lake tables"
        )
    return savepoint


def _load(path: Path) -> Savepoint:
    manifest = _read_json(path / MANIFEST)
    needed = ("label", "job", "taken_at", "taken_while", "outputs", "sinks", "checkpoint")
    if (
        manifest is None
        or manifest.get("format") != FORMAT
        or any(k not in manifest for k in needed)
    ):
        raise SavepointDamagedError(f"savepoint {path}: {MANIFEST} is missing or not readable")
    if not (path / CHECKPOINT).is_dir():
        raise SavepointDamagedError(f"savepoint {path}: its copy of the checkpoint is missing")
    return Savepoint(path, manifest)
