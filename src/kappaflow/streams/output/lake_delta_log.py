"""A local Delta table's log read as files, for savepoints: which batches a table holds,
its columns as of a batch, and taking the batches after one back out (a restore).

Savepoints copy and restore local tables only (``jobs/savepoints.py``), so plain file
operations do. A restore truncates the log before the first commit of a later batch:
the commits after it (and their checkpoints and checksums) go first, newest first, then
the files they added. Files a later compaction removed were added before the cut and
are live again; the table reads as it did at the savepoint, and the batches after it
are committed afresh by the job (their ``txn`` marks went with the commits).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any
from urllib.parse import unquote

DELTA_LOG = "_delta_log"
_LAST_CHECKPOINT = "_last_checkpoint"


def is_delta_dir(root: Path) -> bool:
    return (root / DELTA_LOG).is_dir()


def _commits(root: Path) -> list[tuple[int, list[dict[str, Any]]]]:
    """Each commit's version and actions, oldest first."""
    found = []
    for path in (root / DELTA_LOG).glob("*.json"):
        stem = path.name.removesuffix(".json")
        if stem.isdigit():
            lines = path.read_text().splitlines()
            found.append((int(stem), [json.loads(line) for line in lines if line.strip()]))
    return sorted(found, key=lambda commit: commit[0])


def _batches(actions: list[dict[str, Any]]) -> list[int]:
    return [int(a["txn"]["version"]) for a in actions if "txn" in a]


def last_batch(root: Path) -> int | None:
    """The highest batch id the table's commits mark, or None."""
    return max((b for _, actions in _commits(root) for b in _batches(actions)), default=None)


def _cut(commits: list[tuple[int, list[dict[str, Any]]]], after: int | None) -> int | None:
    """The first version that holds a batch after ``after`` (any batch, for None)."""
    last = -1 if after is None else after
    for version, actions in commits:
        if any(b > last for b in _batches(actions)):
            return version
    return None


def schema_at(root: Path, after: int) -> dict[str, Any] | None:
    """The table's schema (Spark's JSON) as of batch ``after``: its last ``metaData``
    before the cut."""
    commits = _commits(root)
    cut = _cut(commits, after)
    schema = None
    for version, actions in commits:
        if cut is not None and version >= cut:
            break
        for action in actions:
            if "metaData" in action:
                schema = json.loads(action["metaData"]["schemaString"])
    return schema


def drop_batches_after(root: Path, after: int | None) -> None:
    """Take the batches after ``after`` (all, for None) out of the table."""
    commits = _commits(root)
    cut = _cut(commits, after)
    if cut is None:
        return
    log = root / DELTA_LOG
    (log / _LAST_CHECKPOINT).unlink(missing_ok=True)  # readers list the log without it
    (log / f".{_LAST_CHECKPOINT}.crc").unlink(missing_ok=True)
    for entry in sorted(log.iterdir(), reverse=True):
        prefix = entry.name.lstrip(".").split(".", 1)[0]
        commit = entry.name.endswith(".json") and not entry.name.startswith(".")
        if prefix.isdigit() and int(prefix) >= cut and not commit:
            # Checkpoints and checksums of dropped versions, and Hadoop's checksum files.
            _remove(entry)
    for version, actions in reversed(commits):
        if version < cut:
            break
        (log / f"{version:020d}.json").unlink(missing_ok=True)
        for action in actions:
            if "add" in action:
                added = root / unquote(action["add"]["path"])
                added.unlink(missing_ok=True)
                (added.parent / f".{added.name}.crc").unlink(missing_ok=True)
    if cut == 0:
        shutil.rmtree(log, ignore_errors=True)


def _remove(path: Path) -> None:
    if path.is_dir():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)
