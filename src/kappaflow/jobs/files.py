"""A job's files: the names in its directory, atomic writes, what the job created (topics,
lake tables, store keys: ``kappaflow jobs remove`` removes them), and where a location
lies on this machine."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

#: The job's plan as its driver declared it (``streams.runtime.describe``); a part's
#: driver writes ``plan.PART.json`` beside it.
PLAN = "plan.json"


#: Present while a start from a savepoint restores the job (jobs/savepoints.py): names
#: the savepoint; the job then starts from a savepoint only.
RESTORING = "restoring.json"


def write_atomically(path: Path, text: str) -> None:
    """Write ``text`` to a scratch file, then rename it over ``path``: a reader (status,
    `jobs`, the demo) sees the old file or the new one, never half of one."""
    scratch = path.with_suffix(".tmp")
    scratch.write_text(text)
    scratch.replace(path)


def local_path(location: str) -> Path | None:
    """The path a location (a checkpoint's, a lake table's) names on this machine (a
    path, or a ``file:`` URI as Hadoop reads it: the path as written, not
    percent-decoded); None on another file system."""
    parts = urlsplit(location)
    if not parts.scheme:
        return Path(location)
    if parts.scheme == "file" and parts.netloc in ("", "localhost"):
        return Path(parts.path)
    return None


RESOURCES = "resources.json"


@dataclass(frozen=True)
class Resources:
    """Where a job writes: topics (its commit markers' included), whether it keeps keys in
    the serving store, and its lake tables."""

    topics: tuple[str, ...] = ()
    redis: bool = False
    lakes: tuple[str, ...] = ()

    def union(self, other: Resources) -> Resources:
        return Resources(
            topics=tuple(sorted({*self.topics, *other.topics})),
            redis=self.redis or other.redis,
            lakes=tuple(sorted({*self.lakes, *other.lakes})),
        )


def record_resources(home: Path, resources: Resources) -> None:
    """Add ``resources`` to what the job's home records it writes to."""
    home.mkdir(parents=True, exist_ok=True)
    held = read_resources(home).union(resources)
    body = {"topics": list(held.topics), "redis": held.redis, "lakes": list(held.lakes)}
    write_atomically(home / RESOURCES, json.dumps(body, indent=2) + "\n")


def read_resources(home: Path) -> Resources:
    """What the job's home records (nothing for a job that never started)."""
    try:
        body = json.loads((home / RESOURCES).read_text())
    except FileNotFoundError:
        return Resources()
    return Resources(
        topics=tuple(body["topics"]), redis=bool(body["redis"]), lakes=tuple(body["lakes"])
    )
